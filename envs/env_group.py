"""`EnvGroup`: several environments behind one, routed by `info["env_id"]`."""

from __future__ import annotations

from typing import Any

from .clients.base import Client
from .environment import Environment
from .rubrics.rubric import Rubric
from .types import RolloutInput, SamplingArgs, State


class EnvGroup(Environment):
    def __init__(self, envs: list[Environment], env_names: list[str] | None = None, **kwargs: Any):
        if not envs:
            raise ValueError("EnvGroup needs at least one environment")
        names = list(env_names) if env_names else [e.env_id or f"env_{i}" for i, e in enumerate(envs)]
        if len(names) != len(envs) or len(set(names)) != len(names):
            raise ValueError("EnvGroup: env_names must be unique and one per env")
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
        super().__init__(dataset=train or None, eval_dataset=evals or None, rubric=Rubric(), **kwargs)

    def get_env_for_input(self, input: RolloutInput | State) -> Environment:
        info = input.get("info") or {}
        name = info.get("env_id") or input.get("task")
        env = self.env_map.get(name) if name else None
        if env is None:
            raise KeyError(f"EnvGroup: no environment named {name!r} (have {self.env_names})")
        return env

    async def rollout(self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None = None) -> State:
        return await self.get_env_for_input(input).rollout(input, client, model, sampling_args)

    async def _score_group(self, states: list[State]) -> None:
        if states:
            await self.get_env_for_input(states[0]["input"] if "input" in states[0] else states[0])._score_group(states)

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
