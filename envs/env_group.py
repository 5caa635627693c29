"""`EnvGroup`: several environments behind one, routed by `info["env_id"]`."""

from __future__ import annotations

from typing import Any

from .clients.base import Client
from .environment import Environment
from .rubrics.rubric import Rubric
from .types import RolloutInput, SamplingArgs, State


def _route(state: State | RolloutInput) -> str | None:
    """The env name a row or state belongs to: `info["env_id"]` (else its `task`)."""
    source = state.get("input") if isinstance(state.get("input"), dict) else state
    info = source.get("info") or state.get("info") or {}
    return info.get("env_id") or source.get("task")


class EnvGroupRubric(Rubric):
    """Scores each rollout with the rubric of the env it was routed to
    (`info["env_id"]`); every metric name of every env's rubric is present
    (0.0 where the env has no such function). A rollout of an unknown env scores 0.
    Each env tears its own rubric down."""

    def __init__(self, env_map: dict[str, Environment]):
        super().__init__()
        self.env_map = env_map
        names: list[str] = []
        for env in env_map.values():
            names.extend(n for n in env.rubric.get_reward_func_names() if n not in names)
        self.all_reward_names = names

    async def score_group(self, states: list[State]) -> None:
        by_env: dict[str | None, list[State]] = {}
        for s in states:
            by_env.setdefault(_route(s), []).append(s)
        for name, group in by_env.items():
            env = self.env_map.get(name) if name else None
            if env is None:
                for s in group:
                    s["reward"] = 0.0
                    s["metrics"] = {**(s.get("metrics") or {}), **{n: 0.0 for n in self.all_reward_names}}
                continue
            await env._score_group(group)
            for s in group:
                s["metrics"] = {**{n: 0.0 for n in self.all_reward_names}, **(s.get("metrics") or {})}

    async def cleanup(self, state: State) -> None:
        env = self.env_map.get(_route(state) or "")
        if env is not None:
            await env.rubric.cleanup(state)


class EnvGroup(Environment):
    def __init__(self, envs: list[Environment], env_names: list[str] | None = None, **kwargs: Any):
        if not envs:
            raise ValueError("EnvGroup requires at least one environment")
        names = list(env_names) if env_names else [e.env_id or f"env_{i}" for i, e in enumerate(envs)]
        if len(names) != len(envs):
            raise ValueError("Number of env_names must match number of envs")
        if len(set(names)) != len(names):
            raise ValueError("EnvGroup: env_names must be unique")
        self.envs = list(envs)
        self.env_names = names
        self.env_map = dict(zip(names, envs))
        train, evals = [], []
        for name, env in self.env_map.items():
            for rows, src in ((train, env._train_rows()), (evals, env._eval_rows_all())):
                for row in src:
                    row = dict(row)
                    row["info"] = {**(row.get("info") or {}), "env_id": name}
                    row["task"] = name
                    rows.append(row)
        for i, row in enumerate(train):
            row["example_id"] = i
        for i, row in enumerate(evals):
            row["example_id"] = i
        super().__init__(dataset=train or None, eval_dataset=evals or None, rubric=EnvGroupRubric(self.env_map), **kwargs)

    def get_env_for_name(self, name: str) -> Environment:
        env = self.env_map.get(name)
        if env is None:
            raise ValueError(f"No environment found with name {name!r} (have {self.env_names})")
        return env

    def get_env_for_input(self, input: RolloutInput | State) -> Environment:
        name = _route(input)
        env = self.env_map.get(name) if name else None
        if env is None:
            raise KeyError(f"EnvGroup: no environment named {name!r} (have {self.env_names})")
        return env

    async def rollout(self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None = None) -> State:
        return await self.get_env_for_input(input).rollout(input, client, model, sampling_args)

    async def _score_group(self, states: list[State]) -> None:
        await self.rubric.score_group(states)

    def set_concurrency(self, concurrency: int) -> None:
        super().set_concurrency(concurrency)
        for env in self.envs:
            env.set_concurrency(concurrency)

    def set_backend(self, backend: str | None, options: dict[str, Any] | None = None) -> None:
        super().set_backend(backend, options)
        for env in self.envs:
            env.set_backend(backend, options)

    def set_isolation(self, isolation: str) -> None:
        super().set_isolation(isolation)
        for env in self.envs:
            env.set_isolation(isolation)

    def isolation_in_use(self) -> str | None:
        used = sorted({i for i in (env.isolation_in_use() for env in self.envs) if i})
        return ",".join(used) or None

    def rollout_isolation_in_use(self) -> str | None:
        used = sorted({i for i in (env.rollout_isolation_in_use() for env in self.envs) if i})
        return ",".join(used) or None

    def set_retry_policy(self, policy: Any) -> None:
        super().set_retry_policy(policy)
        for env in self.envs:
            env.set_retry_policy(policy)

    async def teardown(self) -> None:
        for env in self.envs:
            await env.teardown()
        await super().teardown()
