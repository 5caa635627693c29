"""`OpenEnvEnv`: run an OpenEnv project (gym or MCP contract) in a sandbox.

Per rollout: create a sandbox from the project's image (`.build.json`), start
its server with the manifest's start command, start the relay
(`forwarder.py`) and reach the server at 127.0.0.1:PORT through the
sandbox's command channel — no sandbox network needed, the same on every
backend. Wait for `/health`, read `/schema`, check the contract, open a
`/ws` session, `reset(seed)`.

* gym: each assistant turn is parsed into an action (`actions.parse_action`)
  and sent as one `step`; the step's reward goes to the turn's trajectory
  entry; the rollout stops when the env says done.
* mcp: the env's tools (`list_tools`) are the model's tools; each tool call is
  one `call_tool` step; a turn's rewards are summed; the rollout stops when
  the env says done or the model answers without tool calls.

The default rubric is the sum of step rewards. Server starts are admitted a
few at a time (`max_concurrent_starts`, default one per CPU core; the
`startup_timeout` counts from admission, see `server.py`). A server that
never gets healthy is a `ServerStartError` (InfraError) with the server's
log tail, retried on a fresh sandbox (`start_attempts`, default 3) before
the rollout fails with it; a contract mismatch is a `ContractMismatch`
(ConfigError). The sandbox is deleted in `@cleanup` whatever happened, and
`@teardown` deletes any left registered.

The image is built locally (`vf-sandbox openenv build`, or automatically
with `auto_build=True`); for a backend that pulls from a registry
(Kubernetes, Prime) push it there yourself and pass `image=` with the
pushed name.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandboxes.errors import ConfigError, InfraError, ServerStartError
from sandboxes.interface import Sandbox, SandboxBackend
from sandboxes.rollouts import RolloutSandboxes
from sandboxes.retry import RetryPolicy, retry_infra
from sandboxes.spec import SandboxSpec

from ..decorators import cleanup, stop, teardown
from ..multi_turn import MultiTurnEnv
from ..rubrics.rubric import Rubric
from ..types import Messages, State
from .actions import ActionParseError, parse_action, tool_defs, tool_result_text
from .contract import check_contract
from .forwarder import DirectTransport, Forwarder, ForwardError, Transport
from .manifest import BuildManifest, read_manifest
from .server import ServerHandle, StartGate, start_server
from .session import ActionRejected, OpenEnvSession

log = logging.getLogger(__name__)



def sum_step_rewards(state: State) -> float:
    """The default reward: the sum of every step's reward."""
    return float(sum(step.get("reward") or 0.0 for step in state.get("trajectory") or []))


def _as_messages(rendered: Messages | str | None) -> list[dict[str, Any]]:
    if rendered is None:
        return []
    if isinstance(rendered, str):
        return [{"role": "user", "content": rendered}]
    return list(rendered)


def _require_project_and_renderer(openenv_project: str | Path | None,
                                  prompt_renderer: Callable[..., Messages] | None) -> None:
    """Both are required: a ConfigError saying what each one is when it is missing."""
    if openenv_project is None:
        raise ConfigError("OpenEnvEnv needs openenv_project= (a directory with openenv.yaml)")
    if prompt_renderer is None:
        raise ConfigError("OpenEnvEnv needs prompt_renderer= (turns observations into chat messages)")


def _load_manifest(project: Path, auto_build: bool) -> BuildManifest:
    """The project's build manifest, building the image first when `auto_build` (and it is stale)."""
    if auto_build:
        from .build import ensure_built

        return ensure_built(project)
    return read_manifest(project)


def _seed_rows(env_id: str, seed: int, num_train: int,
               num_eval: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows): one empty-prompt row per reset seed, the eval seeds after the train ones."""
    train = [{"prompt": [], "info": {"seed": seed + i}, "task": env_id} for i in range(num_train)]
    evals = [{"prompt": [], "info": {"seed": seed + num_train + i}, "task": env_id} for i in range(num_eval)]
    return train, evals


class OpenEnvEnv(MultiTurnEnv):
    """An OpenEnv project as a multi-turn environment (see the module docstring)."""

    def __init__(
        self,
        openenv_project: str | Path | None = None,
        num_train_examples: int = 100, num_eval_examples: int = 50, seed: int = 0,
        prompt_renderer: Callable[..., Messages] | None = None,
        max_turns: int = -1,
        rubric: Rubric | None = None,
        *,
        backend: str | SandboxBackend | None = None, backend_options: dict[str, Any] | None = None,
        auto_build: bool = True, publish_port: bool = False,
        cpu_cores: float = 2, memory_gb: float = 4, timeout_minutes: float = 60,
        startup_timeout: float = 120.0, max_concurrent_starts: int | None = None, start_attempts: int = 3,
        step_timeout: float = 60.0,
        labels: dict[str, str] | list[str] | None = None, image: str | None = None, python: str = "python3",
        **kwargs: Any,
    ):
        """Read (or build, `auto_build`) the project's image manifest, describe the server's sandbox
        and make the datasets: one row per seed (`seed` + i), train rows first, then eval rows."""
        _require_project_and_renderer(openenv_project, prompt_renderer)
        self.openenv_project = Path(openenv_project)  # type: ignore[arg-type]
        self.manifest: BuildManifest = _load_manifest(self.openenv_project, auto_build)
        self.seed = seed
        self.prompt_renderer = prompt_renderer
        self.backend_spec = backend
        self.backend_options = dict(backend_options or {})
        self.publish_port = publish_port
        self.startup_timeout = startup_timeout
        self.server_gate = StartGate(max_concurrent_starts)  # None: one start per CPU core at once
        self.start_retry = RetryPolicy(attempts=max(1, int(start_attempts)), initial_delay=1.0)
        self.step_timeout = step_timeout
        self.python = python
        spec = self._server_sandbox_spec(image, cpu_cores, memory_gb, timeout_minutes, labels)
        # the run's sandboxes come from the one lifecycle: a fresh container per server start, no warm
        # pool (a server's start is the rollout's), deleted at cleanup, what is left at teardown
        self.sandboxes = RolloutSandboxes(spec, backend, self.backend_options, pool_size=0)
        train, evals = _seed_rows(self.manifest.environment_id, seed, num_train_examples, num_eval_examples)
        super().__init__(
            dataset=kwargs.pop("dataset", train),
            eval_dataset=kwargs.pop("eval_dataset", evals),
            rubric=rubric or Rubric(funcs=[sum_step_rewards]),
            max_turns=max_turns,
            **kwargs,
        )
        self._register_atexit()

    def _server_sandbox_spec(self, image: str | None, cpu_cores: float, memory_gb: float, timeout_minutes: float,
                             labels: dict[str, str] | list[str] | None) -> SandboxSpec:
        """The server's sandbox: the manifest's image (unless `image` names another), the web
        interface off, labelled with the environment id, network only to publish the port."""
        return SandboxSpec(
            image=image or self.manifest.image,
            name=f"openenv-{self.manifest.environment_id}"[:40],
            cpu_cores=cpu_cores,
            memory_gb=memory_gb,
            timeout_minutes=timeout_minutes,
            environment_vars={"ENABLE_WEB_INTERFACE": "false"},
            labels={**SandboxSpec(labels=labels or {}).labels, "vf-sandbox.openenv": self.manifest.environment_id},
            network=self.publish_port,
        )

    def set_backend(self, backend: str | None, options: dict[str, Any] | None = None) -> None:
        """Use the run's backend: applies before the first sandbox, refused with a different one
        after (`RolloutSandboxes.set_backend`); an instance given to the constructor is kept."""
        self.sandboxes.set_backend(backend, options)
        super().set_backend(backend, options)
        if not self.sandboxes.backend_given:
            self.backend_spec, self.backend_options = backend, dict(options or {})

    @property
    def sandbox_spec(self) -> SandboxSpec:
        """The OpenEnv server's sandbox (the lifecycle's spec)."""
        return self.sandboxes.spec

    @sandbox_spec.setter
    def sandbox_spec(self, spec: SandboxSpec) -> None:
        self.sandboxes.set_spec(spec)

    def set_isolation(self, isolation: str) -> None:
        """Run the OpenEnv servers' sandboxes under `isolation` ("runc" or "gvisor")."""
        super().set_isolation(isolation)
        self.sandbox_spec = self.sandbox_spec.model_copy(update={"isolation": isolation})

    def isolation_in_use(self) -> str | None:
        return self.sandbox_spec.isolation

    # ------------------------------------------------------------------ plumbing
    def _get_backend(self) -> SandboxBackend:
        return self.sandboxes.backend

    def _render(self, observation: dict[str, Any], context: str, state: State, **extra: Any) -> list[dict[str, Any]]:
        """Call prompt_renderer(observation, context=..., <whichever of state/info/tools/... it names>)."""
        available = {"context": context, "state": state, "info": state.get("info") or {},
                     "action_schema": state.get("openenv_action_schema"), **extra}
        params = inspect.signature(self.prompt_renderer).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = available
        else:
            kwargs = {k: v for k, v in available.items() if k in params}
        return _as_messages(self.prompt_renderer(observation, **kwargs))

    async def _transport(self, state: State, sandbox: Sandbox) -> Transport:
        port = self.manifest.port
        if self.publish_port:
            url_of = getattr(sandbox, "published_url", None)
            if url_of is None:
                raise ConfigError(
                    f"publish_port=True but the {sandbox.backend_name!r} backend offers no published ports; "
                    "leave it off to reach the server through the command channel"
                )
            return DirectTransport(await url_of(port))
        return await Forwarder.start_in_sandbox(sandbox, port, python=self.python)

    async def _start_server(self, state: State) -> ServerHandle:
        """A fresh sandbox with the server started in it and healthy. The start is
        admitted through the env's StartGate (its timeout counts from admission); a
        start that fails is a ServerStartError, retried on a fresh sandbox
        (`start_attempts` tries in all) before the rollout gives up."""
        what = f"OpenEnv server {self.manifest.environment_id!r} ({self.manifest.image})"

        async def attempt() -> ServerHandle:
            sandbox = await self.sandboxes.acquire()
            try:
                handle = await self.server_gate.run(lambda: start_server(
                    sandbox, self.manifest.start_command, lambda: self._transport(state, sandbox),
                    startup_timeout=self.startup_timeout, step_timeout=self.step_timeout, what=what))
            except BaseException:
                await self.sandboxes.release(sandbox)
                raise
            state["sandbox_id"] = sandbox.id
            state["openenv_sandbox"] = sandbox
            return handle

        def on_retry(rs: Any) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            log.warning("%s: start attempt %d failed, retrying on a fresh sandbox: %s", what, rs.attempt_number,
                        str(exc).splitlines()[0] if exc else "")

        handle, _ = await retry_infra(attempt, self.start_retry, on_retry,
                                      retry_if=lambda e: isinstance(e, ServerStartError))
        state["openenv_server_pid"] = handle.process.pid
        state["openenv_transport"] = handle.transport
        return handle

    # ------------------------------------------------------------------ rollout
    async def setup_state(self, state: State) -> State:
        session = (await self._start_server(state)).session
        state["openenv_session"] = session
        schema = await session.schema()
        check_contract(self.manifest.contract, schema, where=self.manifest.environment_id)
        state["openenv_action_schema"] = schema.get("action") or {}
        seed = (state.get("info") or {}).get("seed", self.seed)
        first = await session.reset(seed=seed)
        state["openenv_done"] = bool(first.get("done"))
        state["openenv_rewards"] = []
        extra: dict[str, Any] = {"reward": first.get("reward"), "done": first.get("done", False)}
        if self.manifest.contract == "mcp":
            tools = await session.list_tools()
            state["tool_defs"] = tool_defs(tools)
            extra["tools"] = tools
        prompt = self._render(first.get("observation") or {}, "reset", state, **extra)
        if self.system_prompt and not any(m.get("role") == "system" for m in prompt):
            prompt = [{"role": "system", "content": self.system_prompt}, *prompt]
        state["prompt"] = prompt
        return state

    def _record_reward(self, state: State, reward: float) -> None:
        if state["trajectory"]:
            state["trajectory"][-1]["reward"] = reward
        state["openenv_rewards"].append(reward)

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        session: OpenEnvSession = state["openenv_session"]
        last = messages[-1] if isinstance(messages, list) and messages else {}
        if self.manifest.contract == "mcp":
            return await self._mcp_response(session, last, state)
        try:
            action = parse_action(last.get("content") if isinstance(last, dict) else str(last),
                                  state["openenv_action_schema"])
            payload = await session.step(action)
        except (ActionParseError, ActionRejected) as exc:
            self._record_reward(state, 0.0)
            state["openenv_invalid_actions"] = state.get("openenv_invalid_actions", 0) + 1
            return [{"role": "user", "content": f"Invalid action: {exc}"}]
        reward = float(payload.get("reward") or 0.0)
        self._record_reward(state, reward)
        done = bool(payload.get("done"))
        reply = self._render(payload.get("observation") or {}, "step", state, reward=payload.get("reward"), done=done)
        if done:
            state["openenv_done"] = True
            state["final_env_response"] = reply
        return reply

    async def _mcp_response(self, session: OpenEnvSession, last: dict[str, Any], state: State) -> Messages:
        out: list[dict[str, Any]] = []
        total = 0.0
        done = False
        for call in last.get("tool_calls") or []:
            fn = call.get("function") or {}
            call_id = call.get("id", "")
            try:
                args = json.loads(fn.get("arguments") or "{}")
                if not isinstance(args, dict):
                    raise ValueError("tool arguments must be a JSON object")
            except ValueError as exc:
                out.append({"role": "tool", "tool_call_id": call_id, "content": f"error: bad arguments: {exc}"})
                continue
            try:
                payload = await session.call_tool(fn.get("name", ""), args)
            except ActionRejected as exc:
                out.append({"role": "tool", "tool_call_id": call_id, "content": f"error: {exc}"})
                continue
            total += float(payload.get("reward") or 0.0)
            done = done or bool(payload.get("done"))
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": tool_result_text(payload.get("observation") or {})})
            if done:
                break
        self._record_reward(state, total)
        if done:
            state["openenv_done"] = True
            state["final_env_response"] = out
        return out

    # ------------------------------------------------------------------ stop / cleanup
    @stop(priority=10)
    async def openenv_done(self, state: State) -> bool:
        return bool(state.get("openenv_done"))

    @stop
    async def no_tools_called(self, state: State) -> bool:
        """mcp: the model answered without calling a tool."""
        if self.manifest.contract != "mcp" or not state.get("trajectory"):
            return False
        completion = state["trajectory"][-1]["completion"]
        return isinstance(completion, list) and bool(completion) and not completion[-1].get("tool_calls")

    @cleanup
    async def delete_sandbox(self, state: State) -> None:
        """Close the session and relay, delete the sandbox (always, whatever happened)."""
        session = state.pop("openenv_session", None)
        transport = state.pop("openenv_transport", None)
        sandbox: Sandbox | None = state.pop("openenv_sandbox", None)
        try:
            if session is not None:
                await session.close()
            if transport is not None:
                await transport.close()
        except (ForwardError, InfraError) as exc:
            log.debug("closing the OpenEnv session failed: %s", exc)
        finally:
            if sandbox is not None:
                await self.sandboxes.release(sandbox)

    @teardown
    async def delete_all_sandboxes(self) -> None:
        """Delete sandboxes still held (rollouts cut short) and close the backend
        (`RolloutSandboxes.close`)."""
        await self.sandboxes.close()
