"""`Harness`: runs one task (`state = await harness.run(task)`), scores and
cleans up groups of rollouts.

Its program is one of the forms in `programs.py`. A harness with a `sandbox`
runs its command program, or its callable / `fn` Python program
(`sandbox_python.py`), in a sandbox of our backend layer
(from the run's one sandbox lifecycle, `sandboxes.rollouts.RolloutSandboxes`:
the run's backend unless the sandbox config names one, its warm pool); a child state that borrowed `"sandbox"` reuses the
parent's. With the sandbox config's `setup_scope="group"`, the `setups` run once per
example in one sandbox (`group_setup`, which the v1 Env enters around each group) and
each rollout of the group gets a fork of it, skipping them. Rewards and metrics are `(task, state) -> float` functions; sync
user code runs in a thread pool (`usercode.py`). A model call that failed and
was never followed by a successful one is the rollout's error whatever the
program did with it (`rollout_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from sandboxes.errors import ConfigError, UsageError
from sandboxes.group_setup import PreparedGroup
from sandboxes.rollouts import RolloutSandboxes
from sandboxes.spec import SandboxSpec

from ..errors import Error, ModelError, ScoringError, is_infra_error
from ..types import ClientConfig
from ..sandbox_tools.common import render_exec
from ..sync_pool import SyncPool
from ..tool_schema import convert_func_to_tool_def
from .config import HarnessConfig, SandboxConfig, resolve_ref
from .interception import InterceptionServer, Registration
from .programs import base_loop, call_program, program_kind, run_local_command, run_sandboxed_command
from .sandbox_python import PythonProgram, python_program, run_sandboxed_python
from .state import State
from .task import Task
from .toolset import Toolset
from .user import user_of
from .usercode import call_user

log = logging.getLogger(__name__)

# the group being run (setup_scope="group"): its prepared sandbox and what its setups wrote to the state
_GROUP: contextvars.ContextVar[tuple[PreparedGroup, SandboxSpec, dict[str, Any]] | None] = \
    contextvars.ContextVar("vf_v1_group", default=None)


_MISSING = object()


def fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


async def _score_one(pool: SyncPool | None, fn: Callable[..., Any], task: Mapping[str, Any], state: State) -> float:
    """`fn(task, state)` as a float; an exception scores 0 and becomes the rollout's
    error (a ScoringError caused by it) unless the rollout already has one."""
    try:
        return float(await call_user(pool, fn, task, state))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("v1 scoring function %s raised %s: %s (rollout scored 0)", fn_name(fn), type(exc).__name__, exc)
        if state.get("error") is None:
            err = ScoringError(f"scoring function {fn_name(fn)} raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            state._set("error", err)
        return 0.0


async def score_states(rewards: Sequence[Callable[..., Any]], metrics: Sequence[Callable[..., Any]],
                       tasks: Sequence[Mapping[str, Any]], states: Sequence[State],
                       pool: SyncPool | None = None) -> None:
    """metrics[name] for every function; reward = sum of the rewards (0 for errored
    rollouts). Sync functions run in `pool` (off the event loop), the rollouts of a
    group concurrently; a function that raises scores that rollout 0 and records the
    error on it (see `_score_one`), the others are scored as usual."""

    async def one(task: Mapping[str, Any], state: State) -> None:
        values = state.get("metrics") or {}
        total = 0.0
        for fn in rewards:
            v = 0.0 if state.get("error") is not None else await _score_one(pool, fn, task, state)
            values[fn_name(fn)] = v
            total += v
        for fn in metrics:
            values[fn_name(fn)] = await _score_one(pool, fn, task, state)
        state["metrics"] = values
        state["reward"] = 0.0 if state.get("error") is not None else (state.get("reward") or 0.0) + total

    await asyncio.gather(*(one(t, s) for t, s in zip(tasks, states)))


def system_messages(system_prompt: Any) -> list[dict[str, Any]]:
    if system_prompt is None:
        return []
    if isinstance(system_prompt, str):
        return [{"role": "system", "content": system_prompt}]
    if hasattr(system_prompt, "content"):
        return [{"role": "system", "content": system_prompt.content}]
    return [dict(m) for m in system_prompt]


def program_sandbox(config: SandboxConfig) -> SandboxConfig:
    """`config` as a harness's program sandbox: one per rollout (`scope` is a sandboxed
    toolset's setting; another value is refused, never ignored)."""
    if config.scope != "rollout":
        raise ConfigError(f"a harness's sandbox lives per rollout; scope={config.scope!r} is for a "
                          "sandboxed toolset's own sandbox")
    return config


def sandbox_bash(sandbox: Any, config: SandboxConfig) -> Callable[..., Any]:
    """The base loop's `bash` tool in the harness's sandbox: one exec per call, output
    capped at `config.output_limit_bytes` (head and tail) and rendered as SandboxEnv does."""
    timeout = config.timeout_per_command_seconds

    async def bash(command: str) -> str:
        """Run a shell command in the sandbox; returns its output and exit code.

        Args:
            command: The shell command.
        """
        return render_exec(await sandbox.exec(["/bin/sh", "-c", command], timeout=timeout),
                           config.output_limit_bytes, timeout)

    return bash


def rollout_error(state: State, exc: BaseException) -> BaseException:
    """The error a rollout records when its program raised `exc`. A model call that
    failed and was never followed by a successful one (`runtime["model_error"]`,
    set by the interception endpoint) is the real cause whatever the program made of
    it (an SDK status error, any exception of the program's, in process or in its
    sandbox): the model error is recorded, so the row says "model" (transient ones
    are retried), in every program form. An infrastructure error or a ModelError the
    program raised itself is kept as raised."""
    pending = state.runtime.get("model_error")
    if pending is None or is_infra_error(exc) or isinstance(exc, ModelError):
        return exc
    return pending


class Harness:
    def __init__(
        self,
        program: Any = None,
        system_prompt: Any = None,
        user: Any = None,
        sandbox: SandboxConfig | Mapping[str, Any] | None = None,
        client: Any = None,
        model: str | None = None,
        sampling_args: dict[str, Any] | None = None,
        max_turns: int | None = None,
        toolsets: Sequence[Toolset] | None = None,
        stops: Sequence[Callable[..., Any]] | None = None, setups: Sequence[Callable[..., Any]] | None = None,
        updates: Sequence[Callable[..., Any]] | None = None, metrics: Sequence[Callable[..., Any]] | None = None,
        rewards: Sequence[Callable[..., Any]] | None = None, advantages: Sequence[Callable[..., Any]] | None = None,
        cleanups: Sequence[Callable[..., Any]] | None = None,
        config: HarnessConfig | Mapping[str, object] | None = None,
    ):
        """The harness from its arguments, each defaulting to the `config`'s (a HarnessConfig or
        its mapping); the handler lists' references resolved, stops checked against the program form."""
        cfg = HarnessConfig.from_config(config) if config is not None else HarnessConfig()
        self._init_program(program if program is not None else cfg.program,
                           sandbox if sandbox is not None else cfg.sandbox)
        self.system_prompt = system_prompt if system_prompt is not None else cfg.system_prompt
        self.client = client
        self._client: Any = None  # the vf Client made from `client` once (closed at teardown when from a config)
        self.model = model or cfg.model
        self.sampling_args = {**cfg.sampling_args, **(sampling_args or {})}
        self.max_turns = max_turns if max_turns is not None else cfg.max_turns
        self.toolsets = list(toolsets or [])
        self.stops = [resolve_ref(f) for f in stops or []]
        self.user = user_of(user)
        self.updates = [resolve_ref(f) for f in updates or []]  # (task, state) after each base-loop turn
        self.advantages = [resolve_ref(f) for f in advantages or []]  # (tasks, states) -> list[float], per group
        self.check_stops()
        self.setups = [resolve_ref(f) for f in setups or []]
        self.metrics = [resolve_ref(f) for f in metrics or []]
        self.rewards = [resolve_ref(f) for f in rewards or []]
        self.cleanups = [resolve_ref(f) for f in cleanups or []]
        self.endpoint = InterceptionServer()
        self._init_lifecycle()
        self.concurrency: int | None = None  # the run's (set_concurrency); sizes the default warm pool
        self.sync_pool: SyncPool | None = None  # None: the process-wide default (usercode.default_pool)

    def _init_program(self, program: Any, sandbox: SandboxConfig | Mapping[str, Any] | None) -> None:
        """The program (a reference resolved), its form, its sandbox config (None: it runs on the
        host) and, for a callable / fn program in a sandbox, what runs there."""
        self.program = resolve_ref(program)
        self.kind = program_kind(self.program)
        self.sandbox = program_sandbox(SandboxConfig.from_config(sandbox)) if sandbox is not None else None
        self.python: PythonProgram | None = None  # a callable / fn program run in the sandbox
        if self.sandbox is not None and self.kind in ("callable", "fn"):
            self.python = python_program(self.program)

    def _init_lifecycle(self) -> None:
        """The run's sandboxes (backend, warm pool of the program's spec, forks per group with
        `setup_scope="group"`) live in the one lifecycle; the run's backend and isolation come later."""
        self.backend_name: str | None = None
        self.isolation: str | None = None  # the run's isolation (set_isolation); None: the sandbox config's own
        self.backend_options: dict[str, Any] = {}
        self._owned_sandboxes: dict[str, Any] = {}  # trajectory_id -> a sandbox this harness created
        self.sandboxes = RolloutSandboxes(self._lifecycle_spec(), self._backend_choice(None),
                                          pool_size=self.sandbox.pool_size if self.sandbox is not None else 0)
        self.sandboxes.set_forks_per_group(self.sandbox is not None and self.sandbox.setup_scope == "group")

    def set_sync_pool(self, pool: SyncPool | None) -> None:
        """Where sync user code (rewards, metrics, tools, handlers) runs; Env passes its own pool."""
        self.sync_pool = pool
        for ts in self.toolsets:
            ts.sync_pool = pool

    def check_stops(self) -> None:
        """Stop conditions (the harness's, its toolsets') and a simulated user are the
        base loop's: refused for any other program form."""
        if self.kind != "base" and (self.stops or any(ts.stops for ts in self.toolsets)):
            raise ConfigError(f"stops apply to the base tool loop only, not to a {self.kind} program "
                              "(a program ends the rollout itself: state.stop(...))")
        if self.kind != "base" and (self.updates or any(ts.updates for ts in self.toolsets)):
            raise ConfigError(f"updates run after each turn of the base tool loop only, not in a {self.kind} program")
        if self.kind != "base" and self.user is not None:
            raise ConfigError(f"a simulated user talks to the base tool loop only, not to a {self.kind} program")

    def all_stops(self) -> list[Callable[..., Any]]:
        return [*self.stops, *(s for ts in self.toolsets for s in ts.stops)]

    def all_updates(self) -> list[Callable[..., Any]]:
        return [*self.updates, *(u for ts in self.toolsets for u in ts.updates)]

    def _own_client(self) -> Any:
        if self._client is None:
            from ..clients import make_client

            self._client = make_client(self.client)
        return self._client

    # ---- configuration from the run
    def set_backend(self, backend: str | None, options: dict[str, Any] | None = None) -> None:
        """The run's backend (the sandbox config's `backend` wins): applies before the first
        sandbox, refused with a different one after (`RolloutSandboxes.set_backend`)."""
        self.sandboxes.set_backend(self._backend_choice(backend), options)
        self.backend_name, self.backend_options = backend, dict(options or {})

    def _backend_choice(self, run_backend: Any) -> Any:
        return (self.sandbox.backend if self.sandbox is not None and self.sandbox.backend else None) or run_backend

    def _lifecycle_spec(self) -> SandboxSpec:
        """The warm pool's spec: the program sandbox's for a task without overrides."""
        return self.sandbox_spec({}) if self.sandbox is not None else SandboxSpec(name="vf-v1")

    @property
    def backend(self) -> Any:
        return self.sandboxes.backend

    @property
    def _pool(self) -> Any:
        return self.sandboxes.pool

    def sandbox_spec(self, task: Mapping[str, Any], config: SandboxConfig | None = None) -> SandboxSpec:
        """The spec of the program's sandbox for `task` (its `sandbox` overrides applied), or
        of a sandboxed toolset's own sandbox (`config`); the run's isolation either way."""
        config = config if config is not None else self.sandbox
        assert config is not None
        data = config.model_dump(exclude={"backend", "output_limit_bytes", "pool_size", "scope", "setup_scope"})
        if config is self.sandbox:
            data.update(dict(task.get("sandbox") or {}))
        if self.isolation is not None:
            data["isolation"] = self.isolation
        data["name"] = "vf-v1"
        try:
            return SandboxSpec(**data)
        except ValueError as exc:
            raise ConfigError(f"invalid sandbox settings: {exc}") from exc

    def set_sandbox_settings(self, **settings: Any) -> None:
        """Change fields of the sandbox config (the run's `-x image=...`), validated; refused
        once the warm pool started when they change the spec (its sandboxes have the old one)."""
        if self.sandbox is None:
            raise ConfigError(f"sandbox settings {sorted(settings)} given, but this harness has no sandbox")
        try:
            new = SandboxConfig.from_config({**self.sandbox.model_dump(), **settings})
        except ValueError as exc:
            raise ConfigError(f"invalid sandbox settings {settings}: {exc}") from exc
        self._refuse_if_pooled(lambda: self.sandbox_spec({}, new), sorted(settings))
        if new.pool_size != self.sandbox.pool_size:
            self.sandboxes.set_pool_size(new.pool_size)
        self.sandboxes.set_forks_per_group(new.setup_scope == "group")
        self.sandbox = program_sandbox(new)
        self.sandboxes.set_spec(self._lifecycle_spec())
        self.sandboxes.set_backend(self._backend_choice(self.backend_name), self.backend_options)

    def set_isolation(self, isolation: str) -> None:
        old = self.isolation
        self.isolation = isolation
        if self.sandbox is not None:
            try:
                self._refuse_if_pooled(lambda: self.sandbox_spec({}), ["isolation"])
            except ConfigError:
                self.isolation = old
                raise
            self.sandboxes.set_spec(self._lifecycle_spec())

    def _refuse_if_pooled(self, new_spec: Callable[[], SandboxSpec], names: list[str]) -> None:
        if self._pool is not None and new_spec() != self.sandboxes.spec:
            raise ConfigError(f"cannot change sandbox settings {names} after the warm pool was started")

    # ---- warm pool (the lifecycle's, as SandboxEnv's)
    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency = max(1, int(concurrency))
        self.sandboxes.set_concurrency(self.concurrency)

    @property
    def effective_pool_size(self) -> int:
        return self.sandboxes.effective_pool_size

    async def start_pool(self) -> None:
        """Start filling the warm pool (Env does before the first rollout)."""
        await self.sandboxes.start_pool()

    # ---- running
    async def run(self, task: Task | Mapping[str, Any], state: State | None = None) -> State:
        """Run one rollout of `task` (in `state`, a fresh one by default): bind the model and the
        interception endpoint, take the group's fork if there is one, resolve the tools, run the
        setups and the program. A crash of any of them is the rollout's error and the run goes
        on; a failed model call the program never recovered from is too. Returns the final state."""
        task = task if isinstance(task, Task) else Task(task)
        state = state if state is not None else State.for_task(task)
        key = await self._bind_model(task, state)
        self._offer_sandboxes(task, state)
        state["timing"].generation.start = state["timing"].generation.start or time.time()
        try:
            skip_setups = await self._take_group_fork(task, state)
            await self._resolve_tools(task, state)
            for fn in (() if skip_setups else self.setups):
                await call_user(self.sync_pool, fn, task, state)
            for ts in self.toolsets:
                await ts.setup(task, state)
            await self._run_program(task, state)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the program crashed: the rollout's error, the run goes on
            if not isinstance(exc, Error):
                log.debug("v1 program failed", exc_info=True)
            state._set("error", rollout_error(state, exc))
        else:
            pending = state.runtime.get("model_error")
            if pending is not None:  # the program survived a failed model call it never recovered from
                state._set("error", pending)
        finally:
            self.endpoint.unregister(key)
            await state.close_clients()
        if not state.get("is_completed"):
            state.stop("has_error" if state.get("error") is not None else "program_done")
        return state.finalize()

    async def _bind_model(self, task: Task, state: State) -> str:
        """Put the task, model, client and sampling args in the state's runtime and register the
        rollout with the interception endpoint (`rt["endpoint"]`); returns its key."""
        rt = state.runtime
        rt["task"] = task
        rt.setdefault("model", self.model)
        if self.client is not None and "client" not in rt:
            rt["client"] = self._own_client()
        if not rt.get("client") or not rt.get("model"):
            raise UsageError("Harness.run needs a client and a model (Harness(client=, model=) or an Env run)")
        rt["sampling_args"] = {**self.sampling_args, **(rt.get("sampling_args") or {})}
        base_url = await self.endpoint.start()
        key = self.endpoint.register(Registration(state=state, client=rt["client"], model=rt["model"],
                                                  sampling_args=rt["sampling_args"]))
        rt["endpoint"] = {"base_url": base_url, "api_key": key}
        return key

    def _offer_sandboxes(self, task: Task, state: State) -> None:
        """The sandboxes toolsets may ask for: the program's (`rt["sandbox_for"]`, made on first use)
        and a sandboxed toolset's own (`rt["new_sandbox"]`)."""
        rt = state.runtime

        async def sandbox_for() -> Any:  # a toolset with sandbox="program" runs its tools here
            if rt.get("sandbox") is not None:
                return rt["sandbox"]
            if self.sandbox is None:
                raise ConfigError('a toolset with sandbox="program" needs a harness with a sandbox')
            return await self._sandbox_for(state, task)

        rt["sandbox_for"] = sandbox_for
        # a sandboxed toolset's own sandbox: created (never from the pool), deleted by the toolset
        rt["new_sandbox"] = lambda config: self.sandboxes.acquire(self.sandbox_spec(task, config), hold=False,
                                                                  warm=False)

    async def _take_group_fork(self, task: Task, state: State) -> bool:
        """In a group with `setup_scope="group"` whose spec is this task's, take the rollout's
        sandbox from the prepared group (`sandbox_forked` metric); True when it is a fork of the
        sandbox the group's setups ran in (their state updates copied: the setups are skipped)."""
        rt = state.runtime
        group = _GROUP.get() if self.sandbox is not None and rt.get("sandbox") is None else None
        if group is None or group[1] != self.sandbox_spec(task):
            return False
        sandbox, prepared = await group[0].acquire(key=state["trajectory_id"])
        rt["sandbox"] = sandbox
        self._owned_sandboxes[state["trajectory_id"]] = sandbox
        metrics = state.get("metrics")
        if not isinstance(metrics, dict):
            metrics = state["metrics"] = {}
        metrics["sandbox_forked"] = float(prepared and group[0].mode == "fork")
        if prepared:  # the group's setups ran in the sandbox this one is a fork of
            state.update(group[2])
        return bool(prepared)

    async def _resolve_tools(self, task: Task, state: State) -> None:
        """The rollout's tools and their definitions (`rt["tools"]`, `rt["tool_defs"]`,
        `state["tool_defs"]`): borrowed ones, each toolset's, and a bash tool in the sandbox
        for the base loop with a sandbox."""
        rt = state.runtime
        tools = dict(rt.get("tools") or {}) if "tools" in rt.get("borrowed", []) else {}
        defs = list(rt.get("tool_defs") or []) if tools else []
        for ts in self.toolsets:
            callables, tdefs = await ts.resolve(task, state)
            tools.update(callables)
            defs.extend(tdefs)
        if self.kind == "base" and self.sandbox is not None:  # the base loop with a sandbox: a bash tool in it
            bash = sandbox_bash(await self._sandbox_for(state, task), self.sandbox)
            tools["bash"] = bash
            defs.append(convert_func_to_tool_def(bash))
        rt["tools"], rt["tool_defs"] = tools, defs
        state["tool_defs"] = [d.model_dump() for d in defs] or None

    async def _run_program(self, task: Task, state: State) -> None:
        if self.kind == "base":
            program = self.program or {}
            await base_loop(task, state, system_messages(task.get("system_prompt") or self.system_prompt),
                            state.get_max_turns(program.get("max_turns", self.max_turns)
                                                if isinstance(program, Mapping) else self.max_turns), self.all_stops(),
                            self.sync_pool, self.user, self.all_updates())
        elif self.python is not None:
            assert self.sandbox is not None
            await run_sandboxed_python(self.python, task, state, self.program if isinstance(self.program, Mapping) else {},
                                       await self._sandbox_for(state, task), self.sandbox.timeout_per_command_seconds,
                                       self.sandbox.output_limit_bytes)
        elif self.kind == "callable":
            await call_program(self.program, task, state, self.sync_pool)
        elif self.kind == "fn":
            await call_program(self.program["fn"], task, state, self.sync_pool)
        elif self.sandbox is None:
            await run_local_command(task, state, self.program)
        else:
            await run_sandboxed_command(task, state, self.program, await self._sandbox_for(state, task),
                                        self.sandbox.timeout_per_command_seconds, self.sandbox.output_limit_bytes)

    async def _sandbox_for(self, state: State, task: Task) -> Any:
        sandbox = state.runtime.get("sandbox")
        if sandbox is not None:
            return sandbox
        sandbox = await self.sandboxes.acquire(self.sandbox_spec(task), key=state["trajectory_id"])
        state.runtime["sandbox"] = sandbox
        self._owned_sandboxes[state["trajectory_id"]] = sandbox
        return sandbox

    @contextlib.asynccontextmanager
    async def group_setup(self, task: Task) -> AsyncIterator[None]:
        """Around one group's rollouts with `setup_scope="group"`: the `setups` run once for
        `task` in one program sandbox (its state: `State.for_task(task)`, the sandbox in
        `state.runtime["sandbox"]`), then each rollout run in this block gets a fork. A
        failed preparation is logged and the rollouts run their setups themselves."""
        if self.sandbox is None or self.sandbox.setup_scope != "group":
            yield
            return
        spec = self.sandbox_spec(task)
        updates: dict[str, Any] = {}

        async def prepare(sandbox: Any) -> None:
            state = State.for_task(task)
            before = dict(state)
            state.runtime.update(task=task, sandbox=sandbox)

            async def sandbox_for() -> Any:
                return sandbox

            state.runtime["sandbox_for"] = sandbox_for
            for fn in self.setups:
                await call_user(self.sync_pool, fn, task, state)
            updates.update({k: v for k, v in state.items() if before.get(k, _MISSING) is not v
                            and k not in ("trajectory_id", "timing", "trajectory", "metrics")})

        group: PreparedGroup | None = None
        try:
            group = await self.sandboxes.prepare_group(prepare, spec)
        except Exception as exc:
            log.warning("v1 group setup failed (%s: %s); each rollout runs its setups", type(exc).__name__, exc)
        token = _GROUP.set((group, spec, updates) if group is not None else None)
        try:
            yield
        finally:
            _GROUP.reset(token)
            if group is not None:
                await asyncio.shield(group.close())

    async def score_group(self, tasks: list[Task], states: list[State]) -> list[State]:
        await score_states(self.rewards, self.metrics, tasks, states, self.sync_pool)
        return states

    async def cleanup_group(self, tasks: list[Task], states: list[State]) -> None:
        for task, state in zip(tasks, states):
            try:
                for fn in self.cleanups:
                    await call_user(self.sync_pool, fn, task, state)
                for ts in self.toolsets:
                    await ts.cleanup(task, state)
            finally:
                sandbox = self._owned_sandboxes.pop(state["trajectory_id"], None)
                if sandbox is not None:
                    await self._release(sandbox)

    async def _release(self, sandbox: Any) -> None:
        """Give back a sandbox this harness owns (deleted, never reused)."""
        try:
            await self.sandboxes.release(sandbox)
        except Exception as exc:  # the sandbox is gone already: nothing leaks
            log.warning("deleting v1 sandbox %s failed: %s", getattr(sandbox, "id", "?"), exc)

    async def teardown(self) -> None:
        self._owned_sandboxes.clear()
        for ts in self.toolsets:
            await ts.teardown()
        await self.endpoint.close()
        client, self._client = self._client, None
        if client is not None and isinstance(self.client, ClientConfig):  # a client instance given stays the caller's
            try:
                await client.close()
            except Exception as exc:
                log.warning("closing the harness's model client failed: %s", exc)
        # the sandboxes still held, the warm pool, a backend made here (a given instance stays the caller's)
        await self.sandboxes.close()
