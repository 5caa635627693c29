"""`SandboxEnv`: a tool environment where the model runs shell commands in a
sandbox of its own, one sandbox per rollout, on any backend.

Lifecycle of one rollout:

    setup_state        take a sandbox from the warm pool (or create one), start the
                       persistent shell, `post_sandbox_setup(state)`
    bash(command)      one round trip to the in-sandbox shell (state persists)
    @cleanup           `post_rollout(state)`, then delete the sandbox (or, with
                       `keep_sandbox_for_scoring`, after the rubric scored it)
    @teardown          bulk-delete whatever is still alive, close the pool

Differences from the reference (its known weaknesses, fixed):

* the shell is persistent (`cd`, exports, functions survive), opt out with
  `persistent_shell=False`; bash is driven directly (no interpreter started
  per rollout): the agent keeps each command's head and newest output and
  bash reports the cgroup's OOM-kill counter with each command;
* output is capped (head and tail kept, a marker counts the bytes cut);
* a command timeout interrupts the command, returns its partial output with a
  clear note, and the shell stays usable;
* a sandbox that dies mid-rollout raises an `InfraError` out of the tool call
  (cause chain kept), so `--max-retries` re-runs the rollout on a fresh sandbox.

A cell per rollout by default: `rollout_isolation="auto"` gives each rollout a
cell (`"namespace"`: private overlay, PID/IPC/UTS/network namespaces and
cgroup limits inside a pooled host container, made in milliseconds, no
capability left to the rollout; see `sandboxes.cells`) where the backend
offers cells for the env's spec (Docker under runc, no network, no GPUs,
python3 in the image), else a container per rollout; `"container"` or
`"namespace"` choose one. Specs a subclass returns per example
(`get_sandbox_spec`) are containers under "auto".

Warm pool by default: `pool_size=None` (the default) keeps
`min(concurrency, max_default_pool_size)` ready sandboxes of the env's spec
(two per running rollout for cells: they are cheap) once the
concurrency is known (`set_concurrency`, which the eval runner
calls, or `generate(max_concurrent=N)`), so creation is off the rollout's
path; a released sandbox is deleted, never reused. `generate` tells the pool
how many rollouts are coming: it opens no more sandboxes than the call still
needs (a run's -w workers / Ray actors run groups handed out one at a time
through `run_group`, whose count is not known there: no expectation, the
pool keeps its size). `pool_size=0` opts out
(one creation per rollout), `pool_size=N` fixes the size. Examples whose
spec differs from the env's (`get_sandbox_spec` overrides) are created per
rollout. The pool is drained and its sandboxes deleted at teardown.

Retries: the reference's `max_retries`, `base_delay`, `backoff_factor`,
`max_backoff_seconds` and `jitter` set the retry policy of the sandbox
operations (create with an idempotency key, delete, list) of a backend the
env creates by name: `max_retries` extra tries after the first, as
everywhere in vf-sandbox. Rollout retries are `set_max_retries`.

Setup once per group: `setup_scope="group"` (`-x setup_scope=group`; default "rollout")
runs the sandbox setup (`post_sandbox_setup`, PythonEnv's boot-time pip install) once per
example in one sandbox, freezes that sandbox's filesystem and gives every rollout of the
example's group (`rollouts_per_example` of them) its own fork of it (`sandboxes.
group_setup`; a cell per fork under "auto" where cells are available, else a container).
The group's preparation holds one concurrency slot before its rollouts start, in the
group's own task: the same in-process, under `-w N` and in hosted runs (a group never
spans processes). What a fork carries: files, environment, working directory, limits;
not processes (the shell, a PythonEnv REPL, a server the setup started: started per
rollout; a `cd` in the setup shell is not kept). `post_sandbox_setup` then sees a state
of the group's first example (`state["sandbox_id"]`: the prepared sandbox); what it
writes to that state is copied into each rollout's state. A retried rollout gets a new
fork. A group of one rollout, or one whose preparation failed (logged), sets up per
rollout. Where the backend has no snapshots (Kubernetes, Prime, local) the run falls
back to a setup per rollout, warned once (an optimisation never fails a run); each row
says what happened with the `sandbox_forked` metric (1: a fork of the group's setup).

Per-rollout metrics: `sandbox_ready_wait_time`, `sandbox_command_count`,
`sandbox_command_execution_time` (seconds, total), `sandbox_oom`,
`sandbox_timeout`, `sandbox_pids_limit`.

What the sandbox's own code does is the rollout's result, never an
infrastructure error: a command killed for memory flags `sandbox_oom`; a
memory bomb that takes the whole sandbox down (gVisor: the host's OOM killer
hits the sandbox's kernel) flags it too, the tool call says so and the
rollout ends (`sandbox_killed_by_oom` stop condition), scored and not retried;
a command that returns but leaves processes filling the pids limit (a fork
bomb) is reported as exit 137, its processes killed (`sandbox_pids_limit`).

No backend, pool or isolation mode is held here: the run's sandboxes come from the
one lifecycle, `sandboxes.rollouts.RolloutSandboxes` (`env.sandboxes`), which makes
the backend by name (`sandboxes.get_backend`), decides "auto", keeps the warm pool
and deletes what is left at teardown. `set_backend` applies before the first
sandbox and is refused with a different backend after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, create_model

from sandboxes import (
    ConfigError,
    RetryPolicy,
    InfraError,
    Sandbox,
    SandboxBackend,
    SandboxNotRunning,
    SandboxSpec,
    is_infra_error,
)
from sandboxes.group_setup import PreparedGroup
from sandboxes.rollouts import ROLLOUT_ISOLATION_CHOICES, RolloutSandboxes, check_rollout_isolation
from sandboxes.spec import spec_field

from .decorators import cleanup, stop, teardown
from .rubrics.rubric import Rubric
from .sandbox_tools.common import DEFAULT_OUTPUT_LIMIT, render_exec
from .sandbox_tools.shell_session import ShellSession
from .tool_env import StatefulToolEnv
from .multi_turn import MultiTurnSettings
from .types import Messages, RolloutInput, SamplingArgs, State

log = logging.getLogger("envs.sandbox")

SANDBOX_OOM_TEXT = ("[the sandbox ran out of memory and was killed with everything in it (exit 137, out of memory): "
                    "no further commands can run]")

ROLLOUT_ISOLATIONS = ROLLOUT_ISOLATION_CHOICES
"""SandboxEnv's `rollout_isolation`: "auto" (the default) = a cell per rollout where the
backend offers cells for the env's spec (`SupportsCells`), else a container per rollout."""


# constructor name -> SandboxSpec field: the sandbox settings `-x` reaches (`set_<name>` each)
SPEC_SETTINGS = {
    "docker_image": "image", "sandbox_name": "name", "start_command": "start_command", "cpu_cores": "cpu_cores",
    "memory_gb": "memory_gb", "disk_size_gb": "disk_size_gb", "gpu_count": "gpu_count",
    "timeout_minutes": "timeout_minutes", "timeout_per_command_seconds": "timeout_per_command_seconds",
    "environment_vars": "environment_vars", "network": "network", "workdir": "workdir", "labels": "labels",
    "isolation": "isolation",
}


SandboxEnvSettings = create_model(
    "SandboxEnvSettings",
    __base__=MultiTurnSettings,
    __doc__="SandboxEnv's `-x` keys: the sandbox spec's (by their constructor names, typed and constrained "
            "as SandboxSpec), the rollout isolation and the warm pool size, beside every env's.",
    rollout_isolation=(Literal["auto", "container", "namespace"], Field("auto", description="What one rollout's sandbox is.")),
    pool_size=(int | None, Field(None, ge=0, description="Warm pool size (None: from the concurrency; 0: none).")),
    setup_scope=(Literal["rollout", "group"], Field("rollout", description=(
        "Where the sandbox setup runs: per rollout, or once per example's group, each rollout then "
        "getting a fork of the prepared sandbox (falls back to per rollout without snapshots)."))),
    labels=(list[str] | dict[str, str], Field(default_factory=dict, description="User labels (a list: name=true).")),
    **{name: spec_field(field) for name, field in SPEC_SETTINGS.items() if name not in ("isolation", "labels")},
)


_check_rollout_isolation = check_rollout_isolation

SETUP_SCOPES = ("rollout", "group")


def check_setup_scope(scope: str) -> str:
    if scope not in SETUP_SCOPES:
        raise ConfigError(f"setup_scope must be one of {', '.join(SETUP_SCOPES)}, got {scope!r}")
    return scope


class GroupShare:
    """One group's prepared sandbox (`PreparedGroup`, None when the preparation failed)
    and what the setup wrote to its state (copied into each rollout's)."""

    def __init__(self) -> None:
        self.group: PreparedGroup | None = None
        self.spec: SandboxSpec | None = None
        self.updates: dict[str, Any] = {}


_GROUP_SHARE: contextvars.ContextVar[GroupShare | None] = contextvars.ContextVar("vf_sandbox_group", default=None)
# state keys that are the prepared sandbox's own, never copied to the rollouts of its group
_OWN_KEYS = frozenset({"sandbox_id", "sandbox_ready_wait_time", "sandbox_command_count",
                       "sandbox_command_execution_time", "sandbox_oom", "sandbox_timeout", "sandbox_pids_limit",
                       "metrics", "timing", "trajectory", "trajectory_id", "error"})


# knobs of the reference's HTTP sandbox client; accepted for compatibility, unused here
_REFERENCE_ONLY = (
    "sandbox_client_max_workers", "sandbox_client_max_connections",
    "sandbox_client_max_keepalive_connections",
)
# the reference's per-operation retry knobs -> fields of the backend's RetryPolicy
_RETRY_KNOBS = {"base_delay": "initial_delay", "backoff_factor": "exp_base",
                "max_backoff_seconds": "max_delay", "jitter": "jitter"}


def _pop_reference_knobs(kwargs: dict[str, Any]) -> RetryPolicy | None:
    """Drop the reference's HTTP-client knobs from kwargs and pop its retry knobs into a policy (None: none given)."""
    for name in _REFERENCE_ONLY:
        kwargs.pop(name, None)
    return _operation_retry(kwargs)


def _refuse_advanced_configs(advanced_configs: Any | None) -> None:
    """`advanced_configs` is a Prime SDK setting: refused with a ConfigError naming what to use instead."""
    if advanced_configs is not None:
        raise ConfigError("SandboxEnv(advanced_configs=...) is a Prime SDK setting vf-sandbox does not support; "
                          "use the sandbox spec arguments (cpu_cores, memory_gb, ...) or backend options")


def _with_operation_retry(backend: str | SandboxBackend | None, backend_options: dict[str, Any] | None,
                          operation_retry: RetryPolicy | None) -> dict[str, Any]:
    """A copy of the backend options with the reference knobs' retry policy as `retry` (unless one is set);
    a backend instance passed in keeps its own policy (warned)."""
    backend_options = dict(backend_options or {})
    if operation_retry is not None:
        if backend is not None and not isinstance(backend, str):
            log.warning("max_retries/base_delay/... apply to backends the env creates; the backend "
                        "instance passed in keeps its own retry policy")
        backend_options.setdefault("retry", operation_retry)
    return backend_options


def _operation_retry(kwargs: dict[str, Any]) -> RetryPolicy | None:
    """The sandbox-operation retry policy from the reference's knobs (popped from kwargs), if any was given."""
    max_retries = kwargs.pop("max_retries", None)
    fields: dict[str, Any] = {}
    for knob, field in _RETRY_KNOBS.items():
        value = kwargs.pop(knob, None)
        if value is not None:
            fields[field] = value
    if max_retries is None and not fields:
        return None
    try:
        return RetryPolicy(**fields) if max_retries is None else RetryPolicy.from_max_retries(max_retries, **fields)
    except ValidationError as exc:
        raise ConfigError(f"invalid sandbox retry settings: {exc}") from exc


_SPEC = SandboxSpec()
"""SandboxEnv's sandbox arguments are a view onto SandboxSpec: its defaults (the reference
names: `docker_image` = `image`, ...); the env's own differ only in `sandbox_name`
("sandbox-env", also the default label) and `rollout_isolation` ("auto": a cell per
rollout where the backend offers cells)."""


_MISSING = object()


class SandboxRollout:
    """Live per-rollout resources (kept out of `state`, which must stay JSON-able)."""

    def __init__(self, sandbox: Sandbox, pooled: bool):
        self.sandbox = sandbox
        self.pooled = pooled
        self.shell: ShellSession | None = None
        self.extra: dict[str, Any] = {}  # subclasses' sessions (PythonEnv's worker)
        self.oom_baseline: int | None = None


class SandboxEnv(StatefulToolEnv):
    """One sandbox per rollout and a `bash(command)` tool running in it."""

    sandbox_metric_names: tuple[str, ...] = (
        "sandbox_ready_wait_time", "sandbox_command_count", "sandbox_command_execution_time",
    )

    def __init__(
        self,
        sandbox_name: str = "sandbox-env",
        docker_image: str = _SPEC.image,
        start_command: str = _SPEC.start_command,
        cpu_cores: float = _SPEC.cpu_cores, memory_gb: float = _SPEC.memory_gb,
        disk_size_gb: float = _SPEC.disk_size_gb, gpu_count: int = _SPEC.gpu_count,
        timeout_minutes: float = _SPEC.timeout_minutes,
        timeout_per_command_seconds: float = _SPEC.timeout_per_command_seconds,
        environment_vars: dict[str, str] | None = None, team_id: str | None = None, advanced_configs: Any | None = None,
        labels: list[str] | dict[str, str] | None = None,
        *,
        backend: str | SandboxBackend | None = None, backend_options: dict[str, Any] | None = None,
        pool_size: int | None = None, persistent_shell: bool = True, output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
        workdir: str | None = None, network: bool = _SPEC.network, isolation: str = _SPEC.isolation,
        rollout_isolation: str = "auto", setup_scope: str = "rollout", keep_sandbox_for_scoring: bool = False,
        stop_errors: list[type[Exception]] | None = None,
        **kwargs: Any,
    ):
        """Check the settings, build the env's sandbox spec and hand it to the run's one lifecycle. The positional
        arguments are the reference's (`team_id`: the prime backend's option; `advanced_configs`: refused)."""
        operation_retry = _pop_reference_knobs(kwargs)
        _check_rollout_isolation(rollout_isolation)
        self.setup_scope = check_setup_scope(setup_scope)
        super().__init__(tools=[], stop_errors=stop_errors, **kwargs)
        spec = self._sandbox_spec(dict(
            name=sandbox_name, image=docker_image, start_command=start_command, cpu_cores=cpu_cores,
            memory_gb=memory_gb, disk_size_gb=disk_size_gb, gpu_count=gpu_count, timeout_minutes=timeout_minutes,
            timeout_per_command_seconds=timeout_per_command_seconds, environment_vars=dict(environment_vars or {}),
            labels=labels if labels is not None else {sandbox_name: "true"}, network=network, isolation=isolation,
            rollout_isolation="container" if rollout_isolation == "auto" else rollout_isolation,
        ), workdir)
        _refuse_advanced_configs(advanced_configs)
        self.team_id = team_id  # the Prime team: becomes the prime backend's team_id option
        self.advanced_configs = None
        self.timeout_per_command_seconds = float(timeout_per_command_seconds)
        self.persistent_shell = persistent_shell
        self.output_limit_bytes = int(output_limit_bytes)
        backend_options = _with_operation_retry(backend, backend_options, operation_retry)
        self.sandboxes = self._rollout_sandboxes(spec, backend, backend_options, rollout_isolation, pool_size)
        self._rollouts: dict[str, SandboxRollout] = {}  # sandbox id -> live resources
        self.active_sandboxes: set[str] = set()
        self.keep_sandbox_for_scoring = keep_sandbox_for_scoring
        if keep_sandbox_for_scoring:
            self.add_rubric(_ReleaseAfterScoring(self))
        self.add_tool(self.bash, args_to_skip=["sandbox_id"])
        self._register_atexit()

    def _rollout_sandboxes(self, spec: SandboxSpec, backend: str | SandboxBackend | None,
                           backend_options: dict[str, Any], rollout_isolation: str,
                           pool_size: int | None) -> RolloutSandboxes:
        """The run's sandboxes: backend, rollout isolation and warm pool live in the one lifecycle
        (forks of a group's prepared sandbox under `setup_scope="group"`)."""
        sandboxes = RolloutSandboxes(spec, backend, backend_options,
                                     rollout_isolation=rollout_isolation, pool_size=pool_size,
                                     resolve=self.resolve_spec, backend_options_for=self._with_team)
        sandboxes.set_forks_per_group(self.setup_scope == "group")
        return sandboxes

    def _sandbox_spec(self, fields: dict[str, Any], workdir: str | None) -> SandboxSpec:
        """The env's SandboxSpec from the constructor's sandbox arguments (`workdir` only when given);
        invalid values are a ConfigError naming the env class."""
        if workdir:
            fields["workdir"] = workdir
        try:
            return SandboxSpec(**fields)
        except ValidationError as exc:
            raise ConfigError(f"invalid sandbox settings for {type(self).__name__}: {exc}") from exc

    # ------------------------------------------------------------------ tools
    def add_tool(self, tool: Any, args_to_skip: list[str] | None = None) -> None:
        """As ToolEnv.add_tool; sandbox tools get strict schemas (no extra properties)."""
        super().add_tool(tool, args_to_skip=args_to_skip)
        if args_to_skip and "sandbox_id" in args_to_skip:
            for i, t in enumerate(self.tool_defs):
                if t.name == getattr(tool, "__name__", None):
                    params = {**t.parameters, "additionalProperties": False}
                    params["required"] = list(params.get("properties", {}))
                    self.tool_defs[i] = t.model_copy(update={"parameters": params, "strict": True})

    async def bash(self, command: str, sandbox_id: str) -> str:
        """Execute `command` inside persistent sandbox container.

        Args:
            command: A bash command. The shell persists between calls: the working
                directory, exported variables and functions are kept.
        """
        live = self._live(sandbox_id)
        state = live.extra.get("state")
        if live.extra.get("killed_by_oom"):
            return SANDBOX_OOM_TEXT
        t0 = time.monotonic()
        pids_full = False
        try:  # an InfraError (sandbox or agent gone) propagates: the rollout is retried...
            oom: int | None = None
            if live.shell is not None:
                res = await live.shell.run(command, self.timeout_per_command_seconds)
                text, timed_out, code, oom = res.render(), res.timed_out, res.exit_code, res.oom_kills
                pids_full = res.pids_limit
            else:
                text, timed_out, code = await self._exec_once(live, command, state)
        except InfraError:
            # ...unless the sandbox's own code killed it: its memory bomb took the whole sandbox
            # down (gVisor): the rollout's result (sandbox_oom), never an infrastructure error
            if await self._killed_by_oom(live, state):
                return SANDBOX_OOM_TEXT
            raise
        finally:
            self._count_command(state, t0)
        if state is not None:
            if pids_full:
                state["sandbox_pids_limit"] = True
            if timed_out:
                state["sandbox_timeout"] = True
            if oom is not None:
                self._note_oom(live, state, oom)
            elif code in (137, -9, None) and not timed_out:
                await self._check_oom(live, state)
        return text

    async def _killed_by_oom(self, live: SandboxRollout, state: State | None) -> bool:
        """The rollout's sandbox died of its own OOM (the backend's `died_of_oom`, where it can
        tell): flag it (`sandbox_oom`) and end the rollout (`sandbox_killed_by_oom` stop)."""
        died = getattr(live.sandbox, "died_of_oom", None)
        if died is None or not await died():
            return False
        live.extra["killed_by_oom"] = True
        if state is not None:
            state["sandbox_oom"] = True
            state["sandbox_killed_by_oom"] = True
        log.info("sandbox %s was OOM-killed by its own commands: a task failure (sandbox_oom), not retried",
                 live.sandbox.id)
        return True

    @stop
    async def sandbox_killed_by_oom(self, state: State) -> bool:
        """The sandbox's own code ran it out of memory and it is gone: the rollout ends (scored)."""
        return bool(state.get("sandbox_killed_by_oom"))

    @staticmethod
    def _count_command(state: State | None, started: float) -> None:
        """Per-rollout command metrics: one more command, its time added (also when it raised)."""
        if state is not None:
            state["sandbox_command_count"] = state.get("sandbox_command_count", 0) + 1
            state["sandbox_command_execution_time"] = (
                state.get("sandbox_command_execution_time", 0.0) + time.monotonic() - started
            )

    def _live(self, sandbox_id: str) -> SandboxRollout:
        live = self._rollouts.get(sandbox_id)
        if live is None:
            raise SandboxNotRunning(f"sandbox {sandbox_id} is not active in this environment")
        return live

    async def _exec_once(self, live: SandboxRollout, command: str, state: State | None) -> tuple[str, bool, int | None]:
        """`persistent_shell=False`: one exec per command (fresh shell each time)."""
        r = await live.sandbox.exec(["bash", "-c", command], timeout=self.timeout_per_command_seconds)
        if r.oom_killed and state is not None:
            state["sandbox_oom"] = True
        return render_exec(r, self.output_limit_bytes, self.timeout_per_command_seconds), r.timed_out, r.exit_code

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State, **kwargs: Any
    ) -> dict[str, Any]:
        """Inject the rollout's sandbox id into sandbox tools (never visible to the model)."""
        if tool_name in self.skipped_args and "sandbox_id" in self.skipped_args[tool_name]:
            return {**tool_args, "sandbox_id": state["sandbox_id"]}
        return tool_args

    # ------------------------------------------------------------------ run settings (-x, the run's backend)
    Settings = SandboxEnvSettings
    _SPEC_SETTINGS = {**SPEC_SETTINGS, "rollout_isolation": "rollout_isolation"}

    def apply_settings(self, values: dict[str, Any]) -> None:
        """The sandbox settings given together are applied (and validated) as one change."""
        values = dict(values)
        sandbox = {k: values.pop(k) for k in list(values)
                   if k in self._SPEC_SETTINGS and k not in ("isolation", "timeout_per_command_seconds")}
        if sandbox:
            self.set_sandbox_settings(**sandbox)
        if "pool_size" in values:
            self.set_pool_size(values.pop("pool_size"))
        if "setup_scope" in values:
            self.set_setup_scope(values.pop("setup_scope"))
        if "timeout_per_command_seconds" in values:
            self.set_timeout_per_command_seconds(values.pop("timeout_per_command_seconds"))
        super().apply_settings(values)

    def set_setup_scope(self, setup_scope: str) -> None:
        """"rollout" (setup in every rollout's sandbox) or "group" (once per example, forks;
        the default warm pool is then off: rollouts take forks, not pooled sandboxes)."""
        self.sandboxes.set_forks_per_group(check_setup_scope(setup_scope) == "group")
        self.setup_scope = setup_scope

    def setup_scope_in_use(self) -> str:
        """What the group setup did: "rollout", "group" (forks), or "rollout (...)" when
        "group" fell back for want of snapshots (in this process)."""
        note = self.sandboxes.group_setup_note
        if self.setup_scope == "group" and note is not None:
            return f"rollout (setup_scope=group fell back: {note})"
        return self.setup_scope

    def set_pool_size(self, pool_size: int | None) -> None:
        """Ready sandboxes kept (None: sized from the concurrency; 0: none), before the pool starts."""
        self.sandboxes.set_pool_size(pool_size)

    # the run's sandbox settings are the lifecycle's (one copy)
    @property
    def sandbox_spec(self) -> SandboxSpec:
        """The env's own sandbox spec (with "auto", `rollout_isolation` is decided per run)."""
        return self.sandboxes.spec

    @sandbox_spec.setter
    def sandbox_spec(self, spec: SandboxSpec) -> None:
        self.sandboxes.set_spec(spec)

    @property
    def pool_size(self) -> int | None:
        return self.sandboxes.pool_size

    @property
    def rollout_isolation(self) -> str:
        return self.sandboxes.rollout_isolation

    @property
    def _pool(self) -> Any:
        return self.sandboxes.pool

    def set_docker_image(self, docker_image: str) -> None:
        self.set_sandbox_settings(docker_image=docker_image)

    def set_sandbox_name(self, sandbox_name: str) -> None:
        self.set_sandbox_settings(sandbox_name=sandbox_name)

    def set_start_command(self, start_command: str) -> None:
        self.set_sandbox_settings(start_command=start_command)

    def set_cpu_cores(self, cpu_cores: float) -> None:
        self.set_sandbox_settings(cpu_cores=cpu_cores)

    def set_memory_gb(self, memory_gb: float) -> None:
        self.set_sandbox_settings(memory_gb=memory_gb)

    def set_disk_size_gb(self, disk_size_gb: float) -> None:
        self.set_sandbox_settings(disk_size_gb=disk_size_gb)

    def set_gpu_count(self, gpu_count: int) -> None:
        self.set_sandbox_settings(gpu_count=gpu_count)

    def set_timeout_minutes(self, timeout_minutes: float) -> None:
        self.set_sandbox_settings(timeout_minutes=timeout_minutes)

    def set_environment_vars(self, environment_vars: dict[str, str]) -> None:
        self.set_sandbox_settings(environment_vars=environment_vars)

    def set_network(self, network: bool) -> None:
        self.set_sandbox_settings(network=network)

    def set_workdir(self, workdir: str) -> None:
        self.set_sandbox_settings(workdir=workdir)

    def set_labels(self, labels: list[str] | dict[str, str]) -> None:
        self.set_sandbox_settings(labels=labels)

    def set_rollout_isolation(self, rollout_isolation: str) -> None:
        self.set_sandbox_settings(rollout_isolation=rollout_isolation)

    def set_sandbox_settings(self, **settings: Any) -> None:
        """Change sandbox settings by their constructor names (validated like the constructor)."""
        mode = _check_rollout_isolation(settings.get("rollout_isolation", self.rollout_isolation))
        if mode == "auto" and "rollout_isolation" in settings:
            settings = {**settings, "rollout_isolation": "container"}  # the spec's until "auto" is decided
        fields = {self._SPEC_SETTINGS[k]: v for k, v in settings.items()}
        try:
            spec = SandboxSpec(**{**self.sandbox_spec.model_dump(), **fields})
        except ValidationError as exc:
            raise ConfigError(f"invalid sandbox settings {settings} for {type(self).__name__}: {exc}") from exc
        try:
            self.sandboxes.set_spec(spec, mode)
        except ConfigError as exc:
            raise ConfigError(f"{exc} ({sorted(settings)})") from None

    def set_isolation(self, isolation: str) -> None:
        """Run this env's sandboxes under `isolation` ("runc" or "gvisor"): -x isolation=gvisor,
        TOML `isolation`, the run definition."""
        super().set_isolation(isolation)
        self.set_sandbox_settings(isolation=isolation)

    def isolation_in_use(self) -> str | None:
        return self.sandbox_spec.isolation

    def rollout_isolation_in_use(self) -> str | None:
        """What one rollout's sandbox is ("container" or "namespace"; "auto" until the
        first sandbox decided it), recorded in metadata.json."""
        return self.sandboxes.rollout_isolation_in_use()

    def set_timeout_per_command_seconds(self, seconds: float) -> None:
        try:
            spec = SandboxSpec(**{**self.sandbox_spec.model_dump(), "timeout_per_command_seconds": seconds})
        except ValidationError as exc:
            raise ConfigError(f"invalid timeout_per_command_seconds {seconds!r}: {exc}") from exc
        self.sandbox_spec = spec
        self.timeout_per_command_seconds = float(seconds)

    def set_backend(self, backend: str | None, options: dict[str, Any] | None = None) -> None:
        """Use the run's backend: applies before the first sandbox, refused (ConfigError) with a
        different one after (`RolloutSandboxes.set_backend`); an instance given to the
        constructor is kept."""
        own = self.sandboxes.backend_options
        run_options = dict(options or {})
        if "retry" in own:  # the env's own operation-retry settings stay
            run_options.setdefault("retry", own["retry"])
        self.sandboxes.set_backend(backend, run_options)
        super().set_backend(backend, options)

    def _with_team(self, backend: str | None, options: dict[str, Any]) -> dict[str, Any]:
        """The backend's options with the env's Prime team (`team_id`, prime only)."""
        if self.team_id is not None:
            if backend != "prime":
                raise ConfigError(f"SandboxEnv(team_id=...) applies to the prime backend only, not "
                                  f"{backend or 'docker'!r}")
            options.setdefault("team_id", self.team_id)
        return options

    @property
    def backend(self) -> SandboxBackend:
        return self.sandboxes.backend

    def get_sandbox_spec(self, state: State) -> SandboxSpec:
        """The spec of this rollout's sandbox (override for per-example images or limits)."""
        return self.sandbox_spec

    # reference name
    def get_sandbox_request(self, state: State) -> SandboxSpec:
        return self.get_sandbox_spec(state)

    async def resolve_spec(self, spec: SandboxSpec) -> SandboxSpec:
        """Hook to rewrite a spec before creation (PythonEnv swaps in its derived image)."""
        return spec

    # ------------------------------------------------------------------ warm pool (the lifecycle's)
    @property
    def max_default_pool_size(self) -> int:
        """Cap of the pool sized from concurrency (an explicit `pool_size` is not capped)."""
        return self.sandboxes.max_default_pool_size

    def set_concurrency(self, concurrency: int) -> None:
        """Rollouts run at once; also sizes the default warm pool."""
        super().set_concurrency(concurrency)
        self.sandboxes.set_concurrency(self.concurrency)

    @property
    def effective_pool_size(self) -> int:
        """Ready sandboxes kept (`RolloutSandboxes.effective_pool_size`)."""
        return self.sandboxes.effective_pool_size

    async def warm_up(self, concurrency: int | None = None, timeout: float | None = 300.0) -> int:
        """Fill the warm pool before the first rollout asks (an RL trainer's first step,
        a benchmark's clock) and return how many sandboxes are ready; with
        `rollout_isolation="namespace"` that also starts the cell host. 0 without a pool."""
        if concurrency and self.sandboxes.concurrency is None:
            self.set_concurrency(concurrency)
        return await self.sandboxes.warm_up(timeout)

    async def generate(self, inputs: Any, client: Any, model: str, sampling_args: Any = None,
                       max_concurrent: int = -1, **kwargs: Any) -> Any:
        """As `Environment.generate`; a `max_concurrent` sizes the default warm pool
        when `set_concurrency` was not called. `Environment.generate` then tells the pool how
        many rollouts are coming (it opens no more sandboxes than they need) and starts it."""
        if max_concurrent and max_concurrent > 0 and self.sandboxes.concurrency is None:
            self.set_concurrency(max_concurrent)
        return await super().generate(inputs, client, model, sampling_args=sampling_args,
                                      max_concurrent=max_concurrent, **kwargs)

    async def _get_pool(self, spec: SandboxSpec | None = None) -> Any:
        """The started warm pool (None without one)."""
        return await self.sandboxes.start_pool()

    # ------------------------------------------------------------------ rollout lifecycle
    async def setup_state(self, state: State) -> State:
        state = await super().setup_state(state) or state
        spec = self.get_sandbox_spec(state)
        share = _GROUP_SHARE.get() if self.setup_scope == "group" else None
        group = share.group if share is not None and share.spec == spec else None
        pooled = group is None and self.sandboxes.pooled(spec)
        t0 = time.monotonic()
        if group is not None:
            sandbox, prepared = await group.acquire(key=f"{state.get('trajectory_id', '')}")
        else:
            sandbox, prepared = await self.sandboxes.acquire(spec, key=f"{state.get('trajectory_id', '')}"), False
        state["sandbox_ready_wait_time"] = time.monotonic() - t0
        await self._open_sandbox(sandbox, state, spec, pooled)
        if self.setup_scope == "group":
            self.record_metric(state, "sandbox_forked", float(prepared and group is not None and group.mode == "fork"))
        if prepared:
            assert share is not None
            state.update(share.updates)
        else:
            await self.prepare_sandbox(state)
        return state

    async def _open_sandbox(self, sandbox: Sandbox, state: State, spec: SandboxSpec, pooled: bool) -> SandboxRollout:
        """Make `sandbox` the state's: registered here, its persistent shell started, the OOM
        counter's baseline read."""
        state["sandbox_id"] = sandbox.id
        live = SandboxRollout(sandbox, pooled)
        live.extra["state"] = state
        self._rollouts[sandbox.id] = live
        self.active_sandboxes.add(sandbox.id)
        state.setdefault("sandbox_command_count", 0)
        state.setdefault("sandbox_command_execution_time", 0.0)
        state["sandbox_oom"] = False
        state["sandbox_timeout"] = False
        state["sandbox_pids_limit"] = False
        if self.persistent_shell and "bash" in self.tool_map:
            # bash driven directly: the agent's buffer keeps each command's head and newest
            # bytes, so no shell-host interpreter is started per rollout (~20 ms of CPU)
            shell = ShellSession(
                lambda argv, env: sandbox.start_process(list(argv), env=env, output_limit=self.output_limit_bytes,
                                                        keep="head_tail"),
                output_limit=self.output_limit_bytes,
                cwd=spec.workdir if spec.workdir != "/" else None,
            )
            try:
                await shell.start()
                live.shell = shell
            except ConfigError as exc:  # no bash in the image: one exec per command
                log.warning("persistent shell unavailable (%s); running one exec per command", exc)
        live.oom_baseline = await self._oom_count(sandbox)
        return live

    async def prepare_sandbox(self, state: State) -> None:
        """The sandbox setup that a group setup runs once (`setup_scope="group"`) and
        forks carry: `post_sandbox_setup` here (PythonEnv adds its boot-time pip install).
        Processes it starts are not carried by forks."""
        await self.post_sandbox_setup(state)

    # ------------------------------------------------------------------ group setup
    @contextlib.asynccontextmanager
    async def group_setup(self, group_inputs: list[RolloutInput], client: Any, model: str,
                          sampling_args: SamplingArgs | None, sem: asyncio.Semaphore | None) -> AsyncIterator[None]:
        """With `setup_scope="group"` and more than one rollout: one sandbox of the group's
        example prepared (`prepare_sandbox`) under one concurrency slot, then each rollout
        of the group gets a fork of it (`setup_state`); the snapshot is released after."""
        if self.setup_scope != "group" or len(group_inputs) < 2:
            yield
            return
        share = GroupShare()
        async with (sem if sem is not None else contextlib.nullcontext()):
            self._admit()  # the run's start gate: a refused group is not prepared (RolloutNotStarted)
            state = await self.init_state(group_inputs[0], client, model, sampling_args)
            share.spec = self.get_sandbox_spec(state)
            try:
                async with asyncio.timeout(float(self.rollout_timeout) if self.rollout_timeout else None):
                    share.group = await self.sandboxes.prepare_group(
                        lambda sb: self._prepare_source(sb, state, share), share.spec)
            except Exception as exc:  # each rollout sets up its own sandbox (and records its own error)
                log.warning("group setup of example %s failed (%s: %s); its rollouts set up their own sandboxes",
                            group_inputs[0].get("example_id"), type(exc).__name__, exc)
        token = _GROUP_SHARE.set(share)
        try:
            yield
        finally:
            _GROUP_SHARE.reset(token)
            if share.group is not None:
                await asyncio.shield(share.group.close())

    async def _prepare_source(self, sandbox: Sandbox, state: State, share: GroupShare) -> None:
        """The group's setup in its one sandbox: `prepare_sandbox` with the first example's
        state; what it wrote to that state is kept for the rollouts. Its processes (the
        shell) are stopped before the snapshot."""
        assert share.spec is not None
        before = dict(state)
        live = await self._open_sandbox(sandbox, state, share.spec, pooled=False)
        try:
            await self.prepare_sandbox(state)
        finally:
            self._rollouts.pop(sandbox.id, None)
            self.active_sandboxes.discard(sandbox.id)
            live.extra.clear()
            if live.shell is not None:
                with contextlib.suppress(Exception):
                    await live.shell.close()
        share.updates = {k: v for k, v in state.items() if k not in _OWN_KEYS and before.get(k, _MISSING) is not v}

    async def post_sandbox_setup(self, state: State) -> None:
        """Hook run once the sandbox is ready (upload files, start services...)."""

    async def post_rollout(self, state: State) -> None:
        """Hook run after the rollout, before the sandbox is deleted (collect files for scoring...)."""

    def get_sandbox(self, state: State) -> Sandbox:
        """This rollout's sandbox handle (for hooks and subclasses)."""
        return self._live(state["sandbox_id"]).sandbox

    @cleanup
    async def destroy_sandbox(self, state: State) -> None:
        """Run `post_rollout`, record the sandbox metrics, delete the sandbox (with
        `keep_sandbox_for_scoring`, a rollout without error keeps it until scored)."""
        sandbox_id = state.get("sandbox_id")
        live = self._rollouts.get(sandbox_id) if sandbox_id else None
        if live is None:
            return
        task = asyncio.current_task()
        cancelling = bool(task is not None and task.cancelling())  # Ctrl-C / run stopped: just delete
        try:
            if state.get("error") is None and not cancelling and not state.get("sandbox_killed_by_oom"):
                await self.post_rollout(state)
        except Exception as exc:
            if is_infra_error(exc) and state.get("error") is None:
                state["error"] = exc  # the sandbox died while collecting: retry the rollout
            else:
                log.warning("post_rollout failed: %s: %s", type(exc).__name__, exc)
        finally:
            for name in self.sandbox_metric_names:
                self.record_metric(state, name, float(state.get(name) or 0.0))
            self.record_metric(state, "sandbox_oom", float(bool(state.get("sandbox_oom"))))
            self.record_metric(state, "sandbox_timeout", float(bool(state.get("sandbox_timeout"))))
            self.record_metric(state, "sandbox_pids_limit", float(bool(state.get("sandbox_pids_limit"))))
            if cancelling or not (self.keep_sandbox_for_scoring and state.get("error") is None):
                await asyncio.shield(self._delete(live))

    async def release_sandbox(self, state: State) -> None:
        """Delete this rollout's sandbox if it is still alive (idempotent)."""
        live = self._rollouts.get(state.get("sandbox_id") or "")
        if live is not None:
            await asyncio.shield(self._delete(live))

    async def _delete(self, live: SandboxRollout) -> None:
        sid = live.sandbox.id
        self._rollouts.pop(sid, None)
        live.extra.pop("state", None)
        try:
            await self.sandboxes.release(live.sandbox)
        except Exception as exc:
            log.warning("deleting sandbox %s failed (teardown retries): %s", sid, exc)
            return
        self.active_sandboxes.discard(sid)

    async def bulk_delete_sandboxes(self, global_ids: list[str]) -> None:
        """Delete these sandboxes at once (reference name); forgets them here."""
        for sid in global_ids:
            self._rollouts.pop(sid, None)
        await self.sandboxes.delete_many(list(global_ids))
        self.active_sandboxes.difference_update(global_ids)

    @teardown
    async def teardown_sandboxes(self) -> None:
        """Delete every sandbox still alive (also after Ctrl-C), then the pool and backend
        (`RolloutSandboxes.close`)."""
        self._rollouts.clear()
        self.active_sandboxes.clear()
        await self.sandboxes.close()

    # ------------------------------------------------------------------ OOM detection
    _OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")

    async def _oom_count(self, sandbox: Sandbox) -> int | None:
        """The sandbox cgroup's oom_kill counter (None where the kernel does not expose it)."""
        for path in self._OOM_FILES:
            try:
                text = (await sandbox.read_file(path, max_bytes=4096)).decode("ascii", "replace")
            except InfraError:
                raise
            except Exception:
                continue
            for line in text.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "oom_kill":
                    return int(parts[1])
        return None

    @staticmethod
    def _note_oom(live: SandboxRollout, state: State, count: int) -> None:
        """Flag the rollout when the cgroup's OOM-kill counter (reported by the in-sandbox tool) rose."""
        if live.oom_baseline is not None and count > live.oom_baseline:
            state["sandbox_oom"] = True

    async def _check_oom(self, live: SandboxRollout, state: State) -> None:
        if live.oom_baseline is None:
            return
        count = await self._oom_count(live.sandbox)
        if count is not None and count > live.oom_baseline:
            state["sandbox_oom"] = True


class _ReleaseAfterScoring(Rubric):
    """Scores nothing; deletes the rollout's sandbox once the rubrics have scored it
    (`keep_sandbox_for_scoring=True`: reward functions may still use `env.get_sandbox(state)`)."""

    def __init__(self, env: SandboxEnv):
        super().__init__()
        self._env = env

    @cleanup
    async def release_sandbox(self, state: State) -> None:
        await self._env.release_sandbox(state)
