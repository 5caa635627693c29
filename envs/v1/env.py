"""`Env(taskset, harness)`: a v1 taskset / harness pair as a classic
`Environment`, so `vf-sandbox eval` (results, resume, workers, registry)
runs it exactly like any other env. Each rollout is `harness.run(task)`;
scoring is the taskset's then the harness's rewards and metrics, then both
clean up (sandboxes of the harness are deleted there)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import Field, create_model

from sandboxes.errors import ConfigError, UsageError

from ..clients.base import ModelAuthError
from ..environment import EnvSettings, Environment
from ..rubrics.rubric import Rubric
from ..types import RolloutInput, SamplingArgs
from ..types import State as ClassicState
from .config import SandboxConfig
from .harness import Harness
from .state import State
from .task import Task
from .taskset import Taskset
from .usercode import call_user

log = logging.getLogger(__name__)

_COPIED = ("prompt", "completion", "answer", "info", "example_id", "trajectory", "trajectory_id", "timing", "usage",
           "metrics", "reward", "tool_defs", "is_completed", "is_truncated", "stop_condition", "error")


EnvV1Settings = create_model(
    "EnvV1Settings",
    __base__=EnvSettings,
    __doc__="The v1 Env's `-x` keys: every env's, and the fields of the harness's SandboxConfig "
            "(validated by SandboxConfig when applied; a harness without a sandbox refuses them).",
    **{name: (Any, Field(None, description=info.description)) for name, info in SandboxConfig.model_fields.items()
       if name != "backend" and name not in EnvSettings.model_fields},
)


class Env(Environment):
    Settings = EnvV1Settings

    def __init__(self, taskset: Taskset, harness: Harness | None = None, **kwargs: Any):
        self.taskset = taskset
        self.harness = harness or Harness()
        self.harness.toolsets = [*taskset.toolsets, *self.harness.toolsets]
        self.harness.setups = [*taskset.setups, *self.harness.setups]
        self.harness.stops = [*taskset.stops, *self.harness.stops]
        self.harness.updates = [*taskset.updates, *self.harness.updates]
        if taskset.user is not None:
            if self.harness.user is not None:
                raise ConfigError("both the taskset and the harness have a simulated user: keep one")
            self.harness.user = taskset.user
        self.harness.check_stops()
        self.sandboxes = self.harness.sandboxes  # generate expects one per rollout and starts its pool
        kwargs.setdefault("env_id", taskset.taskset_id)
        super().__init__(
            dataset=lambda: [self._row(t) for t in taskset.tasks()],
            eval_dataset=(lambda: [self._row(t) for t in taskset.tasks(eval=True)]) if taskset.eval_source is not None else None,
            rubric=Rubric(),
            **kwargs,
        )
        # sync user code of both halves runs in this env's thread pool (sized by the run's concurrency)
        self.taskset.sync_pool = self.sync_pool
        self.harness.set_sync_pool(self.sync_pool)

    @staticmethod
    def _row(task: Task) -> dict[str, Any]:
        return {"prompt": task["prompt"], "answer": task.get("answer", ""), "info": task.get("info") or {},
                "example_id": task.get("example_id"), "v1_task": dict(task)}

    @staticmethod
    def _to_input(row: dict[str, Any]) -> RolloutInput:
        inp = dict(Environment._to_input(row))
        inp["v1_task"] = row.get("v1_task") or {k: row[k] for k in ("prompt", "answer", "info", "example_id") if k in row}
        return inp  # type: ignore[return-value]

    def set_backend(self, backend: str | None, options: dict[str, Any] | None = None) -> None:
        super().set_backend(backend, options)
        self.harness.set_backend(backend, options)

    def set_concurrency(self, concurrency: int) -> None:
        """The run's concurrency also sizes the harness's default warm pool."""
        super().set_concurrency(concurrency)
        self.harness.set_concurrency(concurrency)

    async def generate(self, inputs: Any, client: Any, model: str, sampling_args: Any = None,
                       max_concurrent: int = -1, **kwargs: Any) -> Any:
        """As `Environment.generate` (which starts the harness's warm pool once it expects the
        rollouts); the pool is sized by `max_concurrent` when the run's concurrency was not set."""
        if max_concurrent and max_concurrent > 0 and self.harness.concurrency is None:
            self.harness.set_concurrency(max_concurrent)
        return await super().generate(inputs, client, model, sampling_args=sampling_args,
                                      max_concurrent=max_concurrent, **kwargs)

    def set_isolation(self, isolation: str) -> None:
        """The run's isolation reaches the harness's sandboxes (-x isolation=gvisor)."""
        previous = getattr(self, "sandbox_isolation", None)
        super().set_isolation(isolation)
        try:
            self.harness.set_isolation(isolation)
        except ConfigError:  # refused (the warm pool started): the env keeps the one in use
            self.sandbox_isolation = previous
            raise

    def isolation_in_use(self) -> str | None:
        """The isolation of the harness's sandboxes (recorded in metadata.json)."""
        if self.harness.sandbox is not None:
            return self.harness.sandbox_spec({}).isolation
        return super().isolation_in_use()

    def set_sandbox_settings(self, **settings: Any) -> None:
        """Fields of the harness's SandboxConfig from the run (`-x image=... -x pool_size=0`)."""
        self.harness.set_sandbox_settings(**settings)

    def apply_settings(self, values: dict[str, Any]) -> None:
        """The harness's sandbox settings given together are applied as one change."""
        values = dict(values)
        sandbox = {k: values.pop(k) for k in list(values) if k not in EnvSettings.model_fields}
        if sandbox:
            self.set_sandbox_settings(**sandbox)
        super().apply_settings(values)

    @staticmethod
    def _task_of(input: RolloutInput) -> Task:
        data = input.get("v1_task") or {k: input[k] for k in ("prompt", "answer", "info", "example_id") if k in input}
        return Task(data).freeze()

    @contextlib.asynccontextmanager
    async def group_setup(self, group_inputs: list[RolloutInput], client: Any, model: str,
                          sampling_args: SamplingArgs | None, sem: Any) -> AsyncIterator[None]:
        """The harness's sandbox with `setup_scope="group"` (`-x setup_scope=group`): its setups
        run once per group under one concurrency slot (`Harness.group_setup`), each rollout a fork."""
        config = self.harness.sandbox
        if config is None or config.setup_scope != "group" or len(group_inputs) < 2:
            yield
            return
        async with contextlib.AsyncExitStack() as stack:
            async with (sem if sem is not None else contextlib.nullcontext()):
                self._admit()
                await stack.enter_async_context(self.harness.group_setup(self._task_of(group_inputs[0])))
            yield

    async def rollout(self, input: RolloutInput, client: Any, model: str,
                      sampling_args: SamplingArgs | None = None) -> ClassicState:
        from ..clients import make_client

        task = self._task_of(input)
        state = State.for_task(task)
        state.runtime.update(client=make_client(client), model=model,
                             sampling_args={**self.sampling_args, **(sampling_args or {})})
        await self.harness.run(task, state)
        if isinstance(state.get("error"), ModelAuthError):  # fatal for the run, as in the classic stack
            await self._cleanup_pairs([(task, state)])
            raise state["error"]
        classic = ClassicState({k: state.get(k) for k in _COPIED})
        classic.update({k: v for k, v in state.items() if k not in classic})
        classic["input"] = input
        classic["v1"] = (task, state)
        return classic

    async def _score_group(self, states: list[ClassicState]) -> None:
        pairs = [s.get("v1") for s in states]
        live = [(i, p) for i, p in enumerate(pairs) if p is not None]
        tasks = [p[0] for _, p in live]
        v1_states = [p[1] for _, p in live]
        for st in v1_states:
            st["reward"] = 0.0
        await self.taskset.score_group(tasks, v1_states)
        await self.harness.score_group(tasks, v1_states)
        for i, (_, st) in live:
            if st.get("error") is not None and states[i].get("error") is None:  # a scoring function raised
                states[i]["error"] = st["error"]
            states[i]["reward"] = st["reward"]
            states[i]["metrics"] = {**(states[i].get("metrics") or {}), **(st.get("metrics") or {})}
        if states:
            mean = sum(s.get("reward") or 0.0 for s in states) / len(states)
            for s in states:
                s["advantage"] = (s.get("reward") or 0.0) - mean
        for fn in [*self.taskset.advantages, *self.harness.advantages]:  # each may replace the default
            values = await call_user(self.sync_pool, fn, tasks, v1_states)
            if values is None:
                continue
            values = [float(v) for v in values]
            if len(values) != len(v1_states):
                raise UsageError(f"advantage function {getattr(fn, '__name__', fn)} returned {len(values)} values "
                                 f"for a group of {len(v1_states)} rollouts")
            for (i, (_, st)), v in zip(live, values):
                st["advantage"] = states[i]["advantage"] = v

    async def _finish_states(self, states: list[ClassicState], scoring_sem: Any = None) -> None:
        try:
            await super()._finish_states(states, scoring_sem)
        finally:
            await self._cleanup_pairs([p for p in (s.pop("v1", None) for s in states) if p is not None])

    async def _cleanup_pairs(self, pairs: list[tuple[Task, State]]) -> None:
        """The taskset's then the harness's cleanups (the harness deletes its sandboxes)."""
        if not pairs:
            return
        tasks, states = [p[0] for p in pairs], [p[1] for p in pairs]
        try:
            await self.taskset.cleanup_group(tasks, states)
        except Exception as exc:
            log.warning("v1 taskset cleanup failed: %s: %s", type(exc).__name__, exc)
        await self.harness.cleanup_group(tasks, states)

    async def discard_attempt(self, state: ClassicState) -> None:
        """An attempt about to be retried: clean it up now (its sandbox is deleted), as it
        never reaches its group's scoring and cleanup."""
        pair = state.pop("v1", None)
        if pair is not None:
            await self._cleanup_pairs([pair])

    async def teardown(self) -> None:
        try:
            await self.harness.teardown()
        finally:
            await super().teardown()
