"""`Rubric`: weighted reward functions (weight 0 = metric only), group reward
functions, and signature-based argument passing.

A reward function gets, by name, whichever of these it declares (or all of
them with **kwargs): prompt, completion, answer, state, info, task,
example_id, parser, plus every object added with `add_class_object`. A
function whose parameters include a plural name (completions, states,
answers, prompts, infos, tasks) is a *group* function: it gets the lists of
a whole group and returns one score per rollout. Sync and async both work:
a sync function runs in the owning environment's thread pool (`sync_pool`,
attached by the env before scoring, sized by `env.set_concurrency`), so a
slow one does not block the event loop (one measured fast moves onto the
loop: see envs/sync_pool.py); async ones run on the loop. A rubric
used on its own (no pool attached) calls sync functions inline. Functions
run one after another for a rollout, each for all rollouts of a group at
once.

A reward function that raises is the environment's own error, never a
silent 0: the rollout gets a `ScoringError` (the function's exception as its
cause, traceback kept), its verdict is `env` (left out of the averages, the
run is `incomplete`, `--resume` reruns it); an InfraError there makes it a
`sandbox` error (retried). A rubric may opt in to the old behaviour
explicitly (`exceptions_score_zero = True`, or `set_exceptions_score_zero()`):
the function then scores 0 and the row says so (`scoring_errors`).
Group-relative numbers (`advantage`) are only computed for a group whose
every rollout was scored (else they are None).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..decorators import call_with_named_args, discover, named_params
from ..errors import ScoringError, is_infra_error
from ..parsers import Parser
from ..sync_pool import SyncPool, is_async_callable
from ..types import State

log = logging.getLogger(__name__)

GROUP_PARAMS = frozenset({"completions", "prompts", "answers", "states", "infos", "tasks", "example_ids"})


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", type(func).__name__)


def is_group_func(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return any(p in GROUP_PARAMS for p in params)


class Rubric:
    """Combines reward functions with weights (default 1.0)."""

    sync_pool: SyncPool | None = None  # where sync reward functions run (set by the env)
    exceptions_score_zero: bool = False  # opt-in: a raising reward function scores 0 (the row says so)

    def __init__(
        self,
        funcs: list[Callable[..., Any]] | None = None,
        weights: list[float] | None = None,
        parser: Parser | None = None,
    ):
        """Unknown keyword arguments are a TypeError, as the reference (use
        `add_class_object` to make objects available to reward functions)."""
        self.logger = logging.getLogger(f"{__name__}.{type(self).__name__}")
        self.funcs: list[Callable[..., Any]] = []
        self.weights: list[float] = []
        self.parser = parser or Parser()
        self.class_objects: dict[str, Any] = {"parser": self.parser}
        funcs = list(funcs or [])
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"Rubric: {len(funcs)} funcs but {len(weights)} weights")
        for f, w in zip(funcs, weights):
            self.add_reward_func(f, w)
        self._group_flags: dict[int, bool] = {}

    # ---- building
    def add_reward_func(self, func: Callable[..., Any], weight: float = 1.0) -> None:
        self.funcs.append(func)
        self.weights.append(float(weight))

    def add_metric(self, func: Callable[..., Any], weight: float = 0.0) -> None:
        self.add_reward_func(func, weight)

    def remove_reward_func(self, name: str) -> None:
        keep = [(f, w) for f, w in zip(self.funcs, self.weights) if _name(f) != name]
        self.funcs = [f for f, _ in keep]
        self.weights = [w for _, w in keep]

    def add_class_object(self, name: str, obj: Any) -> None:
        self.class_objects[name] = obj
        if name == "parser":
            self.parser = obj

    def get_reward_func_names(self) -> list[str]:
        return [_name(f) for f in self.funcs]

    # the reference's (private but tested) accessors
    def _get_reward_func_names(self) -> list[str]:
        return self.get_reward_func_names()

    def _get_reward_funcs(self) -> list[Callable[..., Any]]:
        return list(self.funcs)

    def _get_reward_weights(self) -> list[float]:
        return list(self.weights)

    def set_exceptions_score_zero(self, value: bool = True) -> None:
        """Opt in (or out) of "a reward function that raises scores 0" (the row's
        `scoring_errors` lists each such failure); default: the rollout is an `env` error."""
        self.exceptions_score_zero = bool(value)

    def set_sync_pool(self, pool: SyncPool | None) -> None:
        """Run sync reward functions in `pool` (None: inline on the caller's thread)."""
        self.sync_pool = pool

    def _is_group(self, func: Callable[..., Any]) -> bool:
        key = id(func)
        flag = self._group_flags.get(key)
        if flag is None:
            flag = self._group_flags[key] = is_group_func(func)
        return flag

    # ---- scoring
    def _args(self, state: State) -> dict[str, Any]:
        return {
            "prompt": state.get("prompt"),
            "completion": state.get("completion"),
            "answer": state.get("answer", ""),
            "state": state,
            "info": state.get("info") or {},
            "task": state.get("task", "default"),
            "example_id": state.get("example_id"),
            **self.class_objects,
        }

    async def _call(self, func: Callable[..., Any], args: dict[str, Any], name: str) -> Any:
        """The function's value, or a `_Failed` (its exception; an InfraError propagates)."""
        try:
            return await call_with_named_args(func, self.sync_pool, **args)
        except Exception as exc:
            if is_infra_error(exc):
                raise
            return _Failed(name, exc)

    def _note_failure(self, state: State, failed: "_Failed") -> None:
        """A reward function raised for this rollout: an `env` error (ScoringError with
        the exception as cause), or -- opted in -- a 0 recorded in `scoring_errors`."""
        exc = failed.exc
        text = f"reward function {failed.name} raised {type(exc).__name__}: {exc}"
        if self.exceptions_score_zero:
            log.warning("%s (scored 0: the rubric's exceptions_score_zero)", text)
            state.setdefault("scoring_errors", []).append(
                {"function": failed.name, "error": f"{type(exc).__name__}: {exc}", "scored": 0.0})
            return
        if state.get("error") is None:
            err = ScoringError(text)
            err.__cause__ = exc
            state["error"] = err

    async def score_rollout(self, state: State) -> None:
        """Score one rollout in place (state["reward"], state["metrics"]).
        Group functions are called with a group of one."""
        await self.score_group([state])

    def _all_plain_sync(self) -> bool:
        """Every reward function is a per-rollout sync function (the common case)."""
        return bool(self.funcs) and not any(self._is_group(f) or is_async_callable(f) for f in self.funcs)

    def _score_in_thread(self, args: dict[str, Any], names: list[str]) -> list[Any]:
        """One rollout's sync reward functions, in order, in one pool thread (one hop
        per rollout instead of one per function). Errors as in `_call`."""
        values: list[Any] = []
        for func, name in zip(self.funcs, names):
            params = named_params(func)
            try:
                values.append(_num(func(**(args if params is None else {k: v for k, v in args.items() if k in params}))))
            except Exception as exc:
                if is_infra_error(exc):
                    raise
                values.append(_Failed(name, exc))
        return values

    async def score_group(self, states: list[State]) -> None:
        """Score a group in place; also sets state["advantage"] (reward - group mean)."""
        live = [s for s in states if s.get("error") is None]
        names = self.get_reward_func_names()
        per_func: list[list[float]] = [[0.0] * len(states) for _ in names]
        index = {id(s): i for i, s in enumerate(states)}
        funcs = list(self.funcs)
        if self.sync_pool is not None and live and self._all_plain_sync():
            await self._score_in_pool(self.sync_pool, live, names, per_func, index)
            funcs = []
        for j, (func, name) in enumerate(zip(funcs, names)):
            for s, v in await self._func_scores(func, name, live):
                per_func[j][index[id(s)]] = v
        for i, s in enumerate(states):
            reward = sum(w * per_func[j][i] for j, w in enumerate(self.weights)) if s.get("error") is None else 0.0
            metrics = dict(s.get("metrics") or {})
            metrics.update({n: per_func[j][i] for j, n in enumerate(names)})
            s["reward"] = float(reward)
            s["metrics"] = metrics
        set_advantages(states)

    async def _score_in_pool(self, pool: SyncPool, live: list[State], names: list[str],
                             per_func: list[list[float]], index: dict[int, int]) -> None:
        """Every function on every live state, one sync-pool call per state (all functions plain sync);
        fills `per_func[function][index of the state]`, a failed function scoring 0 (noted on the state)."""
        rows = await asyncio.gather(*(pool.call(self._score_in_thread, self._args(s), names) for s in live))
        for s, values in zip(live, rows):
            for j, v in enumerate(values):
                if isinstance(v, _Failed):
                    self._note_failure(s, v)
                    v = 0.0
                per_func[j][index[id(s)]] = v

    async def _func_scores(self, func: Callable[..., Any], name: str, live: list[State]) -> list[tuple[State, float]]:
        """(state, score) of one reward function over the live states: one call for a group function (which
        failing scores nobody), else one per state, concurrently (a failed call scores 0). Failures are noted
        on their states; an infrastructure error is raised."""
        if self._is_group(func):
            if not live:
                return []
            values = await self._call(func, self._group_args(live), name)
            if isinstance(values, _Failed):
                for s in live:
                    self._note_failure(s, values)
                return []
            return [(s, _num(v)) for s, v in zip(live, list(values))]
        if len(live) == 1:
            v = await self._call(func, self._args(live[0]), name)
            if isinstance(v, _Failed):
                self._note_failure(live[0], v)
                v = 0.0
            return [(live[0], _num(v))]
        scores = []
        results = await asyncio.gather(*(self._call(func, self._args(s), name) for s in live), return_exceptions=True)
        for s, v in zip(live, results):
            if isinstance(v, BaseException):
                raise v  # an InfraError (other failures are _Failed)
            if isinstance(v, _Failed):
                self._note_failure(s, v)
                v = 0.0
            scores.append((s, _num(v)))
        return scores

    def _group_args(self, states: list[State]) -> dict[str, Any]:
        singles = [self._args(s) for s in states]
        args = {
            "prompts": [a["prompt"] for a in singles],
            "completions": [a["completion"] for a in singles],
            "answers": [a["answer"] for a in singles],
            "states": states,
            "infos": [a["info"] for a in singles],
            "tasks": [a["task"] for a in singles],
            "example_ids": [a["example_id"] for a in singles],
        }
        args.update(self.class_objects)
        return args

    # ---- lifecycle
    async def cleanup(self, state: State) -> None:
        for handler in discover(self, "cleanup"):
            try:
                await call_with_named_args(handler, state=state)
            except Exception as exc:
                log.warning("rubric cleanup %s failed: %s", handler.__name__, exc)

    async def teardown(self) -> None:
        for handler in discover(self, "teardown"):
            try:
                await call_with_named_args(handler)
            except Exception as exc:
                log.warning("rubric teardown %s failed: %s", handler.__name__, exc)


class _Failed:
    """A reward function's exception, for the rollout it was called for."""

    __slots__ = ("name", "exc")

    def __init__(self, name: str, exc: BaseException):
        self.name, self.exc = name, exc


def set_advantages(states: list[State]) -> None:
    """Each state's `advantage`: its reward minus the group's mean, when every rollout of the
    group was scored; None for all of them otherwise (no group-relative numbers from a group
    with an errored rollout)."""
    from ..outputs import error_verdict

    if states and all(s.get("error") is None or error_verdict(s["error"]) == "scored" for s in states):
        mean = sum(s["reward"] for s in states) / len(states)
        for s in states:
            s["advantage"] = s["reward"] - mean
    else:
        for s in states:
            s["advantage"] = None


def _num(value: Any) -> float:
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
