"""`RubricGroup`: several rubrics scored together (rewards summed, metrics merged)."""

from __future__ import annotations

from typing import Any

from ..types import State
from .rubric import Rubric


class RubricGroup(Rubric):
    def __init__(self, rubrics: list[Rubric], **kwargs: Any):
        if not rubrics:
            raise ValueError("RubricGroup needs at least one rubric")
        kwargs.setdefault("parser", rubrics[0].parser)
        super().__init__(**kwargs)
        self.rubrics = list(rubrics)

    def get_reward_func_names(self) -> list[str]:
        return [n for r in self.rubrics for n in r.get_reward_func_names()]

    def add_reward_func(self, func: Any, weight: float = 1.0) -> None:
        if not hasattr(self, "rubrics"):
            return super().add_reward_func(func, weight)
        self.rubrics[0].add_reward_func(func, weight)

    def set_sync_pool(self, pool: Any) -> None:
        super().set_sync_pool(pool)
        for r in getattr(self, "rubrics", []):
            r.set_sync_pool(pool)

    def add_class_object(self, name: str, obj: Any) -> None:
        super().add_class_object(name, obj)
        for r in getattr(self, "rubrics", []):
            r.add_class_object(name, obj)

    async def score_group(self, states: list[State]) -> None:
        base_metrics = [dict(s.get("metrics") or {}) for s in states]
        totals = [0.0] * len(states)
        merged = [dict(m) for m in base_metrics]
        for rubric in self.rubrics:
            for s, m in zip(states, base_metrics):
                s["metrics"] = dict(m)
            await rubric.score_group(states)
            for i, s in enumerate(states):
                totals[i] += s["reward"]
                merged[i].update(s["metrics"])
        for i, s in enumerate(states):
            s["reward"] = totals[i]
            s["metrics"] = merged[i]
        if states:
            mean = sum(totals) / len(totals)
            for s in states:
                s["advantage"] = s["reward"] - mean

    async def cleanup(self, state: State) -> None:
        for r in self.rubrics:
            await r.cleanup(state)
        await super().cleanup(state)

    async def teardown(self) -> None:
        for r in self.rubrics:
            await r.teardown()
        await super().teardown()
