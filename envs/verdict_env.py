"""`VerdictEnv`: the rollout of a no-model env whose row is one verdict.

SWE verification (`swe_debug.SWEDebugEnv`) and the Harbor oracle gate
(`harbor_tasks.HarborGateEnv`) call no model: a rollout looks its item up by the
row's `info["instance_id"]`, asks the subclass for a verdict (`verify`), and
writes it to `info["verdict"]` with its timings as metrics. An error that is
not a verdict (an `InfraError`, retried by the runner, or a bug of ours) becomes
the `sandbox_error` verdict and stays on the state as its error, so the row is
never a silent pass or a silent 0.
"""

from __future__ import annotations

import time
from typing import Any

from sandboxes import UsageError, find_infra_error

from .environment import Environment
from .rubrics.rubric import Rubric
from .types import RolloutInput, SamplingArgs, State

VERDICT = "verdict"  # the key of a row's `info` holding the verdict


def verdict_of_state(state: State) -> dict[str, Any]:
    """The verdict a rollout's state holds ({} before `rollout` wrote one)."""
    return (state.get("info") or {}).get(VERDICT) or {}


class VerdictRubric(Rubric):
    """Reward 1 for a valid verdict, else 0."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)

        def valid(state: State) -> float:
            return 1.0 if verdict_of_state(state).get("valid") else 0.0

        self.add_reward_func(valid, weight=1.0)


class VerdictEnv(Environment):
    """An env whose rollout is `verify(item)` of the row's item (see the module docstring).

    Subclasses set `self.items` (id -> item) and implement `verify`; `item_kind` names
    an item in the error for an id that is not in the run."""

    requires_model = False  # for runners: no model endpoint is needed (nothing is ever sent to one)
    item_kind = "instance"
    items: dict[str, Any]

    async def verify(self, item: Any) -> dict[str, Any]:
        """The verdict on one item (a dict with at least `valid` and `reason`). Raises
        InfraError only for sandbox trouble."""
        raise NotImplementedError

    async def rollout(self, input: RolloutInput, client: Any, model: str,
                      sampling_args: SamplingArgs | None = None) -> State:
        state = await self.init_state(input, client, model, sampling_args)
        timing = state["timing"]
        timing.generation.start = timing.setup.start = timing.setup.end = time.time()
        info = dict(state.get("info") or {})  # the input's dict is shared by retries: copy before writing
        state["info"] = info
        t0 = time.perf_counter()
        item_id = info.get("instance_id")
        try:
            if item_id not in self.items:
                raise UsageError(f"{self.item_kind} {item_id!r} is not in this run's {self.item_kind}s")
            verdict = await self.verify(self.items[item_id])
        except Exception as exc:  # an InfraError left by the sandbox (retried by the runner) or a bug of ours
            state["error"] = exc
            infra = find_infra_error(exc)
            detail = str(infra) if infra else f"internal error: {type(exc).__name__}: {exc}"
            verdict = {"instance_id": item_id, "valid": False, "reason": "sandbox_error", "detail": detail[:2000],
                       "timings": {"total_s": round(time.perf_counter() - t0, 4)}}
        info[VERDICT] = verdict
        for k, v in (verdict.get("timings") or {}).items():
            self.record_metric(state, k, v)
        state["completion"] = []
        state["is_completed"] = True
        state["stop_condition"] = "verdict"
        timing.generation.end = time.time()
        await self.cleanup(state)
        return state
