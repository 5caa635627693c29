"""`Taskset`: task rows and task-owned behaviour (system prompt, toolsets,
setups, rewards, metrics, cleanups)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sandboxes.errors import ConfigError

from ..sync_pool import SyncPool
from .config import TasksetConfig, resolve_ref
from .harness import score_states
from .state import State
from .task import Task
from .toolset import Toolset
from .user import user_of
from .usercode import call_user


def _load(source: Any) -> list[dict[str, Any]]:
    source = resolve_ref(source)
    if source is None:
        return []
    if callable(source) and not hasattr(source, "to_list"):
        source = source()
    if hasattr(source, "to_list"):
        return [dict(r) for r in source.to_list()]
    if isinstance(source, (str, bytes, Mapping)) or not isinstance(source, Iterable):
        raise ConfigError(f"a taskset source is an iterable of rows or a zero-argument loader, not {type(source).__name__}")
    return [dict(r) for r in source]


class Taskset:
    def __init__(
        self,
        source: Any = None,
        eval_source: Any = None,
        taskset_id: str | None = None,
        system_prompt: Any = None,
        user: Any = None,
        toolsets: Sequence[Toolset] = (),
        stops: Sequence[Callable[..., Any]] = (),
        setups: Sequence[Callable[..., Any]] = (),
        updates: Sequence[Callable[..., Any]] = (),
        metrics: Sequence[Callable[..., Any]] = (),
        rewards: Sequence[Callable[..., Any]] = (),
        advantages: Sequence[Callable[..., Any]] = (),
        cleanups: Sequence[Callable[..., Any]] = (),
        config: TasksetConfig | Mapping[str, object] | None = None,
    ):
        cfg = TasksetConfig.from_config(config) if config is not None else TasksetConfig()
        self.user = user_of(user if user is not None else cfg.user)  # Env hands it to the base loop
        self.source = source if source is not None else cfg.source
        self.eval_source = eval_source if eval_source is not None else cfg.eval_source
        self.taskset_id = taskset_id or cfg.taskset_id
        self.system_prompt = system_prompt if system_prompt is not None else cfg.system_prompt
        self.toolsets = list(toolsets)
        self.setups = [resolve_ref(f) for f in setups]
        self.stops = [resolve_ref(f) for f in stops]  # joined to the harness's by Env (base loop only)
        self.updates = [resolve_ref(f) for f in updates]  # likewise
        self.advantages = [resolve_ref(f) for f in advantages]  # run by Env after the group is scored
        self.metrics = [resolve_ref(f) for f in metrics]
        self.rewards = [resolve_ref(f) for f in rewards]
        self.cleanups = [resolve_ref(f) for f in cleanups]
        self._rows: list[dict[str, Any]] | None = None
        self.sync_pool: SyncPool | None = None  # where sync user code runs (Env's pool; None: the default)
        self._eval_rows: list[dict[str, Any]] | None = None

    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = _load(self.source)
        return self._rows

    def eval_rows(self) -> list[dict[str, Any]]:
        """The eval rows (the training rows when there is no eval source)."""
        if self._eval_rows is None:
            self._eval_rows = _load(self.eval_source) if self.eval_source is not None else self.rows()
        return self._eval_rows

    def task(self, row: Mapping[str, Any], index: int | None = None) -> Task:
        data = dict(row)
        if self.system_prompt is not None:
            data.setdefault("system_prompt", self.system_prompt)
        if index is not None:
            data.setdefault("example_id", index)
        return Task(data).freeze()

    def to_task(self, value: Mapping[str, Any] | Task | str) -> Task:
        if isinstance(value, Task):
            return value
        if isinstance(value, str):
            return self.task({"prompt": value})
        return self.task(value)

    def tasks(self, eval: bool = False) -> list[Task]:
        return [self.task(r, i) for i, r in enumerate(self.eval_rows() if eval else self.rows())]

    async def init_group(self, task: Task, num_rollouts: int) -> tuple[list[Task], list[State]]:
        return [task] * num_rollouts, [State.for_task(task) for _ in range(num_rollouts)]

    def get_dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list([dict(t) for t in self.tasks()])

    def get_eval_dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list([dict(t) for t in self.tasks(eval=True)])

    async def setup(self, task: Task, state: State) -> None:
        for fn in self.setups:
            await call_user(self.sync_pool, fn, task, state)

    async def score_group(self, tasks: list[Task], states: list[State]) -> list[State]:
        await score_states(self.rewards, self.metrics, tasks, states, self.sync_pool)
        return states

    async def cleanup_group(self, tasks: list[Task], states: list[State]) -> None:
        for task, state in zip(tasks, states):
            for fn in self.cleanups:
                await call_user(self.sync_pool, fn, task, state)
