"""`RubricGroup`: several rubrics scored together (rewards summed, same-named metrics summed)."""

from __future__ import annotations

from typing import Any

from ..types import State
from .rubric import Rubric, set_advantages


class RubricGroup(Rubric):
    def __init__(self, rubrics: list[Rubric], **kwargs: Any):
        if not rubrics:
            raise ValueError("RubricGroup must have at least one rubric")
        kwargs.setdefault("parser", rubrics[0].parser)
        super().__init__(**kwargs)
        self.rubrics = list(rubrics)

    def get_reward_func_names(self) -> list[str]:
        return [n for r in self.rubrics for n in r.get_reward_func_names()]

    def _get_reward_funcs(self) -> list[Any]:
        return [f for r in self.rubrics for f in r._get_reward_funcs()]

    def _get_reward_weights(self) -> list[float]:
        return [w for r in self.rubrics for w in r._get_reward_weights()]

    def add_reward_func(self, func: Any, weight: float = 1.0) -> None:
        """Added to the first rubric of the group (as the reference)."""
        if not hasattr(self, "rubrics"):
            return super().add_reward_func(func, weight)
        assert self.rubrics, "RubricGroup must have at least one rubric"
        self.rubrics[0].add_reward_func(func, weight)

    def add_metric(self, func: Any, weight: float = 0.0) -> None:
        assert self.rubrics, "RubricGroup must have at least one rubric"
        self.rubrics[0].add_metric(func, weight)

    def set_sync_pool(self, pool: Any) -> None:
        super().set_sync_pool(pool)
        for r in getattr(self, "rubrics", []):
            r.set_sync_pool(pool)

    def add_class_object(self, name: str, obj: Any) -> None:
        super().add_class_object(name, obj)
        for r in getattr(self, "rubrics", []):
            r.add_class_object(name, obj)

    async def score_group(self, states: list[State]) -> None:
        """Each rubric scores the group on its own; rewards are summed, and so are
        metrics of the same name (two rubrics with a `correct` func give their sum,
        as the reference). Metrics recorded before scoring are kept."""
        base_metrics = [dict(s.get("metrics") or {}) for s in states]
        totals = [0.0] * len(states)
        summed: list[dict[str, float]] = [{} for _ in states]
        for rubric in self.rubrics:
            for s in states:
                s["metrics"] = {}
            await rubric.score_group(states)
            for i, s in enumerate(states):
                totals[i] += s["reward"]
                for name, value in (s.get("metrics") or {}).items():
                    summed[i][name] = summed[i].get(name, 0.0) + value
        for i, s in enumerate(states):
            s["reward"] = totals[i] if s.get("error") is None else 0.0
            s["metrics"] = {**base_metrics[i], **summed[i]}
        set_advantages(states)

    async def cleanup(self, state: State) -> None:
        for r in self.rubrics:
            await r.cleanup(state)
        await super().cleanup(state)

    async def teardown(self) -> None:
        for r in self.rubrics:
            await r.teardown()
        await super().teardown()
