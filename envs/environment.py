"""`Environment`: datasets, the rollout driver (concurrency, rollout-level
retry on InfraError, cleanup / teardown handlers, group scoring) and the
`generate` / `evaluate` entry points. Subclasses implement `rollout`.

Hooks a subclass (e.g. a sandbox-backed env) can rely on:
- `@vf.cleanup` methods run after every rollout (also one that raised), in
  priority order; `@vf.teardown` methods run once via `await env.teardown()`
  (the eval CLI calls it at the end, also after Ctrl-C / SIGTERM).
- A rollout whose error has an `InfraError` anywhere in its cause chain, or
  a transient model-API error (connection error, 429, 5xx: the clients raise
  `TransientModelError`), is re-run on a fresh state up to `max_retries`
  times (extra tries after the first) with exponential backoff that waits at
  least the server's Retry-After; the output row's `attempts` says how many
  tries it took, and its error kind stays "infra" / "model" / "task".
  `max_retries` comes from `set_max_retries` (or `set_retry_policy`) unless a
  `generate(max_retries=N)` call overrides it; `generate`'s default (None)
  means the env's own policy.
- Per-rollout metrics: put numbers in `state["metrics"]` (or call
  `self.record_metric(state, name, value)`) during the rollout; they appear in
  the row's `metrics` and in `avg_metrics` next to the rubric's.
- Sync user code (reward functions, tools) runs in `self.sync_pool`, one
  thread pool per env sized by `set_concurrency(n)` (initially `max_workers`)
  and shut down by `teardown()`; a callable measured fast (under 1 ms, 8 times
  in a row) skips the thread hop; see envs/sync_pool.py.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import logging
import random
import time
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandboxes.cancel import cancel_and_settle
from sandboxes.retry import RetryPolicy, is_retryable

if TYPE_CHECKING:
    from sandboxes.rollouts import RolloutSandboxes

from .clients.base import Client, ModelAuthError
from .decorators import call_with_named_args, discover
from .errors import Error, ModelError, OverlongPromptError, SandboxError, ScoringError
from .outputs import aggregate, state_to_output
from .parsers import Parser
from .rubrics.group import RubricGroup
from .rubrics.rubric import Rubric
from .sync_pool import SyncPool
from .types import (
    GenerateOutputs,
    Messages,
    Response,
    RolloutInput,
    RolloutOutput,
    RolloutTiming,
    SamplingArgs,
    State,
    Tool,
    add_usage,
)

log = logging.getLogger("envs")

GroupCallback = Callable[[list[RolloutOutput]], "Awaitable[None] | None"]


class RolloutNotStarted(Exception):
    """A rollout refused by the env's `start_gate` (the run stops starting new ones, e.g. its
    model endpoint is down): its group is not run (no row; a resume runs it)."""


class RolloutModelTimeout(ModelError):
    """The rollout's time (`rollout_timeout`, --rollout-timeout) ran out while it waited on the model."""


_ROLLOUT_STATES: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("vf_rollout_states", default=None)
_GROUP_STARTED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar("vf_group_started", default=None)


class _RetryRollout(Exception):
    """Raised internally (from the state's error) to make tenacity retry a rollout
    whose state holds a retryable error (InfraError or transient model error)."""


async def gather_or_cancel(coros: Iterable[Awaitable[Any]]) -> list[Any]:
    """Like asyncio.gather, but the first exception cancels the other tasks (then propagates)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        await cancel_and_settle(tasks)
        raise
    if pending:
        await cancel_and_settle(pending)
    first: BaseException | None = None
    for t in tasks:
        if t.done() and not t.cancelled():
            exc = t.exception()  # retrieve every exception (no "never retrieved" warnings)
            if exc is not None and first is None:
                first = exc
    if first is not None:
        raise first
    return [t.result() for t in tasks]


def _rows_of(dataset: Any) -> list[dict[str, Any]]:
    if dataset is None:
        return []
    if callable(dataset) and not hasattr(dataset, "to_list"):
        dataset = dataset()
    if hasattr(dataset, "to_list"):
        return list(dataset.to_list())
    return [dict(r) for r in dataset]


class EnvSettings(BaseModel):
    """The settings every environment takes through `set_kwargs` (`-x key=value`,
    `extra_env_kwargs`). Only the keys given are applied."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    concurrency: int = Field(1, ge=1, description="Rollouts at once; sizes the sync-code thread pool.")
    max_seq_len: int | None = Field(None, ge=1, description="Maximum sequence length (None: no limit).")
    score_rollouts: bool = Field(True, description="Score rollouts (False: reward 0, no rubric call).")
    max_retries: int = Field(0, ge=0, description="Extra tries of a rollout after a retryable error.")
    retry_policy: RetryPolicy | None = Field(None, description="The whole rollout retry policy.")
    isolation: str = Field("runc", description='Sandbox kernel boundary: "runc" or "gvisor".')
    message_type: Literal["chat", "completion"] = Field("chat", description="Chat messages or a completion prompt.")


# what a rollout ended by --rollout-timeout becomes, by what it was doing (`_phase_at_timeout`)
_TIMEOUT_PHASE_NOTES = {"model": "waiting on the model: a model error", "setup": "in setup: a sandbox error",
                        "unknown": "an env error", "task": "in a tool call / the sandbox: scored, sandbox_timeout"}


class Environment(ABC):
    """Abstract base of every environment."""

    retry_if: Callable[..., bool] | None = None
    """The run's retry rules (`runner.config.retry_predicate`: `retry_if(error, attempt)`);
    None: retry what `is_retryable` accepts (infrastructure, transient model errors)."""
    rollout_timeout: float | None = None
    """Seconds a rollout may run (--rollout-timeout; None: no bound): past it the rollout ends,
    its sandbox is deleted, and it is a `model` error when it waited on the model, a `sandbox`
    error when still in setup, else the rollout's result (scored, `sandbox_timeout` 1, stop
    `rollout_timeout`). Its scoring is bounded by as much again (then an `env` error)."""
    requires_model: bool = True
    """False for an env that never sends anything to a model (e.g. SWE debugging): it needs
    no client, model, key or live endpoint."""
    sandboxes: RolloutSandboxes | None = None
    """The env's sandbox lifecycle where its rollouts get sandboxes (SandboxEnv / PythonEnv,
    OpenEnvEnv, SWEDebugEnv set it): `generate` tells it how many rollouts are coming
    (`RolloutSandboxes.expect`) and starts its warm pool. None: an env without sandboxes."""
    start_gate: Callable[[], bool] | None = None
    """The run's say on starting a rollout (None: always): called when a rollout got its
    concurrency slot; False refuses it unless a rollout of its group already started (a
    group runs whole or not at all). Rollouts in flight are never stopped by it."""

    def __init__(
        self, dataset: Any = None, eval_dataset: Any = None, system_prompt: str | None = None,
        few_shot: list[dict[str, Any]] | None = None, parser: Parser | None = None, rubric: Rubric | None = None,
        sampling_args: SamplingArgs | None = None, message_type: str = "chat", max_workers: int = 512,
        env_id: str | None = None, env_args: dict | None = None, max_seq_len: int | None = None,
        score_rollouts: bool = True, pass_threshold: float = 0.5,
        tool_defs: list[Tool] | list[dict[str, Any]] | None = None, client: Any = None, model: str | None = None,
        **kwargs: Any,
    ):
        """`tool_defs`: provider-agnostic tool definitions (vf.Tool or its dicts), as
        the reference. `client` / `model`: what `generate` / `evaluate` use when a
        call gives none (the reference stores them from its `**kwargs`).
        Any other keyword argument is an error (the reference stores it as an
        attribute nobody reads; `oai_tools` is refused as the reference does)."""
        self._refuse_unknown_kwargs(kwargs)
        self.logger = logging.getLogger(f"envs.{type(self).__name__}")  # under the package logger
        self.message_type = message_type
        if hasattr(system_prompt, "content") and not isinstance(system_prompt, str):  # vf.SystemMessage
            system_prompt = system_prompt.content  # type: ignore[union-attr]
        self.system_prompt = system_prompt
        self.few_shot = few_shot
        self._adopt_parser_and_rubric(parser, rubric)
        self.sampling_args = dict(sampling_args or {})
        self.max_workers = max_workers
        self.concurrency = max_workers
        self.sync_pool = SyncPool(max_workers)
        self.env_id = env_id or ""
        self.env_args = dict(env_args or {})
        self.max_seq_len = max_seq_len
        self.score_rollouts = score_rollouts
        self.pass_threshold = pass_threshold
        self.retry_policy = RetryPolicy(attempts=1, initial_delay=0.5, max_delay=30.0, jitter=0.25)
        self.tool_defs: list[Tool] | None = (
            self._normalize_tool_defs(tool_defs) if tool_defs is not None else getattr(self, "tool_defs", None)
        )
        self.client = client
        self.model = model
        self._init_bookkeeping(dataset, eval_dataset)

    def _refuse_unknown_kwargs(self, kwargs: dict[str, Any]) -> None:
        """A keyword argument the constructor does not take is an error naming what to do
        instead (`oai_tools`: `tool_defs`; a setting: `set_kwargs`)."""
        if "oai_tools" in kwargs:
            raise ValueError(
                "`oai_tools` is no longer supported. Use `tool_defs` with provider-agnostic "
                "tool definitions: [{'name': ..., 'description': ..., 'parameters': {...}}]."
            )
        if kwargs:
            raise TypeError(
                f"{type(self).__name__}() got unexpected keyword argument(s) {', '.join(map(repr, sorted(kwargs)))}; "
                f"settings after construction go through set_kwargs (settable: {', '.join(self.settable_kwargs())})"
            )

    def _adopt_parser_and_rubric(self, parser: Parser | None, rubric: Rubric | None) -> None:
        """The env's parser and rubric (defaults: a plain Parser, a Rubric using it); a rubric
        given without a parser lends its own; a rubric parser of another type is warned about."""
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        if rubric is not None and parser is None and getattr(rubric, "parser", None) is not None:
            self.parser = rubric.parser
        rubric_parser = getattr(self.rubric, "parser", None)
        if rubric_parser is not None and type(rubric_parser) is not type(self.parser):
            self.logger.warning("The parser and rubric parser are different. This may cause unexpected behavior.")

    def _init_bookkeeping(self, dataset: Any, eval_dataset: Any) -> None:
        """The env's private bookkeeping: the dataset sources (rows formatted on first use),
        teardown and atexit flags, the cleanup handlers and stop conditions (found on first use)."""
        self._dataset_src = dataset
        self._eval_dataset_src = eval_dataset
        self._dataset_rows: list[dict[str, Any]] | None = None
        self._eval_rows: list[dict[str, Any]] | None = None
        self._torn_down = False
        self._atexit_registered = False
        self._cleanup_handlers: list[Callable[..., Any]] | None = None
        self._stop_conditions: list[Callable[..., Any]] | None = None

    @staticmethod
    def _normalize_tool_defs(tools: Iterable[Any] | None) -> list[Tool] | None:
        """vf.Tool objects from vf.Tool or its dicts; the OpenAI `{"type": "function"}`
        form is refused (as the reference)."""
        if tools is None:
            return None
        out: list[Tool] = []
        for tool in tools:
            if isinstance(tool, Tool):
                out.append(tool)
            elif isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict):
                raise ValueError(
                    "Legacy OpenAI tool schema is no longer supported. Use `tool_defs` entries in vf.Tool "
                    "format: {'name': ..., 'description': ..., 'parameters': {...}}."
                )
            elif isinstance(tool, dict):
                out.append(Tool.model_validate(tool))
            else:
                raise TypeError(f"a tool definition is a vf.Tool or a dict, not {type(tool).__name__}")
        return out

    @property
    def requires_group_rollouts(self) -> bool:
        """True when a reward function of the rubric scores a whole group."""
        from .rubrics.rubric import is_group_func

        def funcs(rubric: Any) -> Iterable[Callable[..., Any]]:
            for sub in getattr(rubric, "rubrics", None) or []:
                yield from funcs(sub)
            yield from getattr(rubric, "funcs", None) or []

        return any(is_group_func(f) for f in funcs(self.rubric))

    @property
    def provides_advantages(self) -> bool:
        """True when the rubric computes its own advantages (the classic rubrics do not)."""
        return bool(getattr(self.rubric, "has_advantages", False))

    # ------------------------------------------------------------------ datasets
    def _format_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for i, row in enumerate(rows):
            row = dict(row)
            if "prompt" not in row:
                question = row.get("question", "")
                if self.message_type == "completion":
                    row["prompt"] = (self.system_prompt + "\n\n" if self.system_prompt else "") + str(question)
                else:
                    msgs: list[dict[str, Any]] = []
                    if self.system_prompt:
                        msgs.append({"role": "system", "content": self.system_prompt})
                    msgs.extend(self.few_shot or [])
                    msgs.append({"role": "user", "content": question})
                    row["prompt"] = msgs
            elif self.system_prompt and isinstance(row["prompt"], list) and not any(
                m.get("role") == "system" for m in row["prompt"]
            ):
                row["prompt"] = [{"role": "system", "content": self.system_prompt}, *row["prompt"]]
            if row.get("example_id") is None:
                row["example_id"] = i
            row.setdefault("answer", "")
            if row.get("info") is None:
                row["info"] = {}
            row.setdefault("task", "default")
            out.append(row)
        return out

    def _train_rows(self) -> list[dict[str, Any]]:
        if self._dataset_rows is None:
            self._dataset_rows = self._format_rows(_rows_of(self._dataset_src))
        return self._dataset_rows

    def _eval_rows_all(self) -> list[dict[str, Any]]:
        if self._eval_rows is None:
            src = self._eval_dataset_src if self._eval_dataset_src is not None else None
            self._eval_rows = self._format_rows(_rows_of(src)) if src is not None else self._train_rows()
        return self._eval_rows

    @staticmethod
    def _select(rows: list[dict[str, Any]], n: int, seed: int | None) -> list[dict[str, Any]]:
        if seed is not None:
            rows = list(rows)
            random.Random(seed).shuffle(rows)
        return rows[:n] if n is not None and n >= 0 else list(rows)

    @staticmethod
    def _as_dataset(rows: list[dict[str, Any]]) -> Any:
        """`rows` as a `datasets.Dataset` (the reference's return type). Rows Arrow
        cannot hold in one table (a column mixing types) stay a list, with a warning."""
        from datasets import Dataset

        try:
            return Dataset.from_list(rows) if rows else Dataset.from_dict({})
        except Exception as exc:  # pyarrow.ArrowInvalid / ArrowTypeError, ...
            log.warning("dataset rows do not fit one Arrow table (%s); returned as a list", exc)
            return rows

    def get_dataset(self, n: int = -1, seed: int | None = None) -> Any:
        """The training dataset (formatted) as a Dataset, optionally shuffled with `seed`, first `n` rows."""
        return self._as_dataset(self._select(self._train_rows(), n, seed))

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> Any:
        """The evaluation dataset as a Dataset (falls back to the training one)."""
        return self._as_dataset(self._select(self._eval_rows_all(), n, seed))

    @property
    def dataset(self) -> Any:
        """The formatted training dataset (a Dataset), None when the env has none."""
        return self.get_dataset() if self._train_rows() else None

    @dataset.setter
    def dataset(self, value: Any) -> None:
        self._dataset_src, self._dataset_rows = value, None

    @property
    def eval_dataset(self) -> Any:
        """The formatted evaluation dataset (a Dataset), None when the env has no own eval set."""
        return self._as_dataset(self._eval_rows_all()) if self._eval_dataset_src is not None else None

    @eval_dataset.setter
    def eval_dataset(self, value: Any) -> None:
        self._eval_dataset_src, self._eval_rows = value, None

    @staticmethod
    def make_dataset(inputs: Iterable[dict[str, Any]]) -> Any:
        from datasets import Dataset

        return Dataset.from_list(list(inputs))

    def get_eval_inputs(
        self, num_examples: int = -1, rollouts_per_example: int = 1, shuffle: bool = False, shuffle_seed: int | None = None
    ) -> list[RolloutInput]:
        """Eval rows repeated `rollouts_per_example` times (grouped by example)."""
        seed = (shuffle_seed if shuffle_seed is not None else 0) if shuffle else None
        rows = self._select(self._eval_rows_all(), num_examples, seed)
        inputs: list[RolloutInput] = []
        for row in rows:
            for _ in range(max(1, rollouts_per_example)):
                inputs.append(self._to_input(row))
        return inputs

    @staticmethod
    def _to_input(row: dict[str, Any]) -> RolloutInput:
        inp: dict[str, Any] = {
            "prompt": row["prompt"],
            "example_id": row["example_id"],
            "answer": row.get("answer", ""),
            "info": row.get("info") or {},
            "task": row.get("task", "default"),
        }
        return inp  # type: ignore[return-value]

    # ------------------------------------------------------------------ configuration
    Settings: type[EnvSettings] = EnvSettings
    """The keys `set_kwargs` accepts (pydantic fields: validated before any is applied).
    A subclass with settings of its own extends it and handles them in `apply_settings`."""

    def set_kwargs(self, **kwargs: Any) -> None:
        """Apply `-x` / `extra_env_kwargs`: the keys this env declares in its `Settings`
        model, validated together; an undeclared key is refused with a ConfigError
        listing the valid ones, and nothing is applied when any key or value is refused."""
        from pydantic import ValidationError

        from sandboxes.errors import ConfigError

        name = type(self).__name__
        if "max_workers" in kwargs:  # not a setting: say what to use instead
            self.set_max_workers(kwargs["max_workers"])
        unknown = sorted(set(kwargs) - set(self.Settings.model_fields))
        if unknown:
            raise ConfigError(
                f"{name} has no setting {', '.join(map(repr, unknown))} "
                f"(extra_env_kwargs / -x); settable: {', '.join(self.settable_kwargs())}"
            )
        try:
            values = self.Settings.model_validate(kwargs)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"invalid setting(s) for {name} (extra_env_kwargs / -x): {problems}") from None
        self.apply_settings({key: getattr(values, key) for key in kwargs})

    def apply_settings(self, values: dict[str, Any]) -> None:
        """Apply validated settings (keys of `Settings`), each through its setter."""
        setters: dict[str, Callable[[Any], None]] = {
            "concurrency": self.set_concurrency,
            "max_seq_len": self.set_max_seq_len,
            "score_rollouts": self.set_score_rollouts,
            "max_retries": self.set_max_retries,
            "retry_policy": self.set_retry_policy,
            "isolation": self.set_isolation,
            "message_type": self.set_message_type,
        }
        for key, value in values.items():
            setters[key](value)

    @classmethod
    def settable_kwargs(cls) -> list[str]:
        """The keys `set_kwargs` accepts."""
        return sorted(cls.Settings.model_fields)

    def set_backend(self, backend: str | None, options: dict[str, Any] | None = None) -> None:
        """The run's sandbox backend (name + constructor options). Envs without
        sandboxes only remember it; sandbox-backed envs override to use it."""
        self.sandbox_backend = backend
        self.sandbox_backend_options = dict(options or {})

    def set_isolation(self, isolation: str) -> None:
        """The run's sandbox isolation ("runc" or "gvisor"). Envs without sandboxes only
        remember it; sandbox-backed envs override to put it on their sandbox spec."""
        from sandboxes.errors import ConfigError
        from sandboxes.spec import ISOLATIONS

        if isolation not in ISOLATIONS:
            raise ConfigError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        self.sandbox_isolation = isolation

    def isolation_in_use(self) -> str | None:
        """The isolation this env's sandboxes run under (recorded in metadata.json);
        None for an env without sandboxes that was never given one."""
        return getattr(self, "sandbox_isolation", None)

    def rollout_isolation_in_use(self) -> str | None:
        """What one rollout's sandbox is ("container", "namespace"; recorded in
        metadata.json); None for an env without sandboxes."""
        return None

    def set_max_workers(self, max_workers: int) -> None:
        """Refused: `max_workers` only sizes the thread pool before a run; the run's
        concurrency (-c, `set_concurrency`) sizes it from then on, so it would be ignored."""
        from sandboxes.errors import ConfigError

        raise ConfigError(f"max_workers is a constructor argument (the initial thread pool size); a run sizes the "
                          f"pool from its concurrency: use -c {max_workers} instead of -x max_workers")

    def set_concurrency(self, concurrency: int) -> None:
        """Set the concurrency and size the sync-code thread pool to match."""
        self.concurrency = max(1, int(concurrency))
        self.sync_pool.resize(self.concurrency)

    def add_rubric(self, rubric: Rubric) -> None:
        if self.rubric is None:
            self.rubric = rubric
        elif isinstance(self.rubric, RubricGroup):
            self.rubric.rubrics.append(rubric)
        else:
            self.rubric = RubricGroup(rubrics=[self.rubric, rubric])

    def set_message_type(self, message_type: str) -> None:
        """"chat" or "completion"; the datasets are formatted anew for it."""
        self.message_type = message_type
        self._dataset_rows = self._eval_rows = None

    def set_max_seq_len(self, max_seq_len: int | None) -> None:
        self.max_seq_len = max_seq_len

    def set_score_rollouts(self, score_rollouts: bool) -> None:
        self.score_rollouts = bool(score_rollouts)

    def set_max_retries(self, max_retries: int) -> None:
        """Extra tries of a rollout after the first (0 = none) on a retryable error."""
        self.retry_policy = self.retry_policy.model_copy(update={"attempts": max(0, int(max_retries)) + 1})

    def set_retry_policy(self, policy: RetryPolicy | dict[str, Any]) -> None:
        """The whole rollout retry policy (attempts = max_retries + 1, backoff, Retry-After cap)."""
        self.retry_policy = policy if isinstance(policy, RetryPolicy) else RetryPolicy(**policy)

    @staticmethod
    def record_metric(state: State, name: str, value: float) -> None:
        """Record a per-rollout metric; it appears in the row's metrics and avg_metrics."""
        metrics = state.get("metrics")
        if not isinstance(metrics, dict):
            metrics = state["metrics"] = {}
        metrics[name] = float(value)

    # ------------------------------------------------------------------ rollout pieces
    async def init_state(
        self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None = None
    ) -> State:
        now = time.time()
        info = input.get("info")
        if isinstance(info, dict) and "oai_tools" in info:
            raise ValueError(
                "info['oai_tools'] is no longer supported. Use info['tool_defs'] with provider-agnostic "
                "tool definitions: [{'name': ..., 'description': ..., 'parameters': {...}}]."
            )
        # a row's own tools (info["tool_defs"]) win over the env's
        tool_defs = self._normalize_tool_defs(info["tool_defs"]) if isinstance(info, dict) and "tool_defs" in info \
            else self.tool_defs
        state = State(
            input=input,
            client=client,
            model=model,
            sampling_args={**self.sampling_args, **(sampling_args or {})},
            is_completed=False,
            is_truncated=False,
            tool_defs=list(tool_defs) if tool_defs else None,
            trajectory=[],
            trajectory_id=uuid.uuid4().hex,
            timing=RolloutTiming(start_time=now),
            completion=None,
            reward=None,
            advantage=None,
            metrics={},
            stop_condition=None,
            error=None,
            usage={},
        )
        tracked = _ROLLOUT_STATES.get()
        if tracked is not None:  # the rollout timeout's view of this rollout
            tracked.append(state)
        return state

    def _request_headers(self, state: State, client: Client) -> dict[str, str] | None:
        cfg = getattr(client, "config", None)
        mapping = getattr(cfg, "extra_headers_from_state", None) or getattr(self, "extra_headers_from_state", None)
        if not mapping:
            return None
        headers = {}
        for header, key in mapping.items():
            value = state.get(key)
            if value is not None:
                headers[header] = str(value)
        return headers or None

    async def get_model_response(
        self,
        state: State,
        prompt: Messages,
        client: Client | None = None,
        model: str | None = None,
        tool_defs: list[Tool] | None = None,
        sampling_args: SamplingArgs | None = None,
    ) -> Response:
        """Ask the model; records token usage into state["usage"]."""
        client = client or state["client"]
        model = model or state["model"]
        tools = tool_defs if tool_defs is not None else state.get("tool_defs")
        args = dict(sampling_args if sampling_args is not None else state.get("sampling_args") or {})
        headers = self._request_headers(state, client)
        extra: dict[str, Any] = {"extra_headers": headers} if headers else {}
        if getattr(client, "wants_state", False):  # the token client stitches onto the trajectory's tokens
            extra["state"] = state
        waits = self.__dict__.setdefault("_model_waits", {})
        waits[id(state)] = (state.get("example_id"), time.monotonic())
        try:
            response = await client.get_response(prompt, model, args, tools, **extra)
        finally:
            waits.pop(id(state), None)
        if response.usage is not None:
            add_usage(state, response.usage)
        if self.max_seq_len and response.usage is not None:
            if response.usage.prompt_tokens + response.usage.completion_tokens > self.max_seq_len:
                state["is_truncated"] = True
        return response

    def model_waits(self) -> list[tuple[Any, float]]:
        """(example_id, seconds) of every rollout waiting on the model right now, longest first."""
        now = time.monotonic()
        waits = list(self.__dict__.get("_model_waits", {}).values())
        return sorted(((ex, now - t0) for ex, t0 in waits), key=lambda x: -x[1])

    def stop_conditions(self) -> list[Callable[..., Any]]:
        if self._stop_conditions is None:
            self._stop_conditions = discover(self, "stop")
        return self._stop_conditions

    async def is_completed(self, state: State, **kwargs: Any) -> bool:
        """True when a stop condition fires (sets is_completed / stop_condition)."""
        if state.get("is_completed"):
            return True
        for cond in self.stop_conditions():
            result = cond(state)
            if hasattr(result, "__await__"):
                result = await result
            if result:
                state["is_completed"] = True
                state["stop_condition"] = cond.__name__
                if cond.__name__ in ("prompt_too_long", "max_turns_reached", "max_total_completion_tokens_reached"):
                    state["is_truncated"] = state.get("is_truncated") or cond.__name__ != "max_turns_reached"
                return True
        return False

    async def cleanup(self, state: State) -> None:
        """Run every @cleanup handler (priority order); one failing does not skip the others."""
        if self._cleanup_handlers is None:
            self._cleanup_handlers = discover(self, "cleanup")
        for handler in self._cleanup_handlers:
            try:
                await call_with_named_args(handler, state=state)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cleanup %s failed: %s: %s", handler.__name__, type(exc).__name__, exc)

    async def teardown(self) -> None:
        """Run the rubric's and then the env's @teardown handlers, once; then stop
        the sync-code thread pool."""
        if self._torn_down:
            return
        self._torn_down = True
        try:
            await self.rubric.teardown()
        except Exception as exc:
            log.warning("rubric teardown failed: %s", exc)
        for handler in discover(self, "teardown"):
            try:
                await call_with_named_args(handler)
            except Exception as exc:
                log.warning("teardown %s failed: %s: %s", handler.__name__, type(exc).__name__, exc)
        self.sync_pool.shutdown()

    _teardown = teardown  # name used by verifiers

    def _register_atexit(self) -> None:
        if self._atexit_registered:
            return
        self._atexit_registered = True
        ref = weakref.ref(self)

        def _at_exit() -> None:
            env = ref()
            if env is None or env._torn_down or not discover(env, "teardown"):
                return
            try:
                asyncio.run(env.teardown())
            except Exception as exc:  # interpreter shutting down
                log.warning("teardown at exit failed: %s", exc)

        atexit.register(_at_exit)

    @abstractmethod
    async def rollout(
        self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None = None
    ) -> State:
        """Run one rollout and return its state (errors recorded in state["error"])."""

    # ------------------------------------------------------------------ driving
    async def _rollout_once(self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None) -> State:
        if self.rollout_timeout:
            return await self._rollout_bounded(input, client, model, sampling_args, float(self.rollout_timeout))
        try:
            return await self.rollout(input, client, model, sampling_args)
        except ModelAuthError:
            raise
        except Exception as exc:  # an env that let an error escape: record it, keep the run going
            return self._escaped(input, model, exc)

    @staticmethod
    def _escaped(input: RolloutInput, model: str, exc: BaseException) -> State:
        state = State(input=input, model=model, timing=RolloutTiming(start_time=time.time()), trajectory=[], metrics={})
        state["error"] = exc
        state["completion"] = None
        return state

    async def _rollout_bounded(self, input: RolloutInput, client: Client, model: str,
                               sampling_args: SamplingArgs | None, timeout: float) -> State:
        """The rollout, ended after `timeout` seconds: what it was doing then is decided
        before it is cancelled (so its cleanup, which deletes the sandbox, records it)."""
        states: list[State] = []
        token = _ROLLOUT_STATES.set(states)
        task = asyncio.current_task()
        inside = [True]
        phase: list[str] = []

        def expire() -> None:
            if not inside[0] or task is None:
                return
            phase.append(self._phase_at_timeout(states))
            task.cancel()

        handle = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            return await self.rollout(input, client, model, sampling_args)
        except asyncio.CancelledError:
            if not phase or task is None or task.uncancel() > 0:  # not ours, or Ctrl-C as well
                raise
            return self._timed_out_state(input, model, states, phase[0], timeout)
        except ModelAuthError:
            raise
        except Exception as exc:  # an env that let an error escape: record it, keep the run going
            return self._escaped(input, model, exc)
        finally:
            inside[0] = False
            handle.cancel()
            _ROLLOUT_STATES.reset(token)

    def _phase_at_timeout(self, states: list[State]) -> str:
        """What a rollout reaching its --rollout-timeout was doing (its newest state in `states`):
        "model" (waiting on it), "setup", "task" (a tool call, the sandbox's command or the env's
        own code: the task ran out of time, its state is marked so here) or "unknown" (an env
        that builds its state without init_state cannot say)."""
        st = states[-1] if states else None
        if st is None:
            return "unknown"
        if id(st) in self.__dict__.get("_model_waits", {}):
            return "model"
        if not st["timing"].setup.end:
            return "setup"
        st["sandbox_timeout"] = True
        st["timed_out"] = True
        return "task"

    def _timed_out_state(self, input: RolloutInput, model: str, states: list[State], phase: str,
                         timeout: float) -> State:
        """The state of a rollout cancelled by its --rollout-timeout in `phase` (`_phase_at_timeout`):
        a model, sandbox or env error, or in the task the rollout's result (scored, stop
        `rollout_timeout`, `sandbox_timeout` 1); logged."""
        state = states[-1] if states else self._escaped(input, model, Exception())
        state["timed_out"] = True
        if phase == "model":
            state["error"] = RolloutModelTimeout(
                f"model request timed out after {timeout:g}s (--rollout-timeout): no answer within the rollout's time")
        elif phase == "setup":
            state["error"] = SandboxError(f"rollout setup timed out after {timeout:g}s (--rollout-timeout)")
        elif phase == "unknown":
            state["error"] = Error(f"rollout timed out after {timeout:g}s (--rollout-timeout; this environment "
                                   "does not say whether it waited on the model or the sandbox)")
        else:
            state["error"] = None
            state["is_completed"] = True
            state["stop_condition"] = "rollout_timeout"
            self.record_metric(state, "sandbox_timeout", 1.0)
        log.warning("rollout example_id=%s: --rollout-timeout %gs reached (%s)", input.get("example_id"), timeout,
                    _TIMEOUT_PHASE_NOTES[phase])
        return state

    async def run_rollout(
        self,
        sem: asyncio.Semaphore | None,
        input: RolloutInput,
        client: Client,
        model: str,
        sampling_args: SamplingArgs | None = None,
        max_retries: int | None = None,
    ) -> State:
        """One rollout under `sem`, re-run on a retryable error up to `max_retries` extra
        times (None: the env's own policy, `set_max_retries`)."""
        attempts_allowed = (self.retry_policy if max_retries is None else RetryPolicy.from_max_retries(max_retries)).attempts
        if sem is None:
            self._admit()
            return await self._run_with_retry(input, client, model, sampling_args, attempts_allowed)
        async with sem:
            self._admit()
            return await self._run_with_retry(input, client, model, sampling_args, attempts_allowed)

    def _admit(self) -> None:
        """Let a rollout start, or raise RolloutNotStarted (`start_gate` said no and no
        rollout of its group started yet)."""
        group = _GROUP_STARTED.get()
        if self.start_gate is not None and not (group and group[0]) and not self.start_gate():
            raise RolloutNotStarted()
        if group is not None:
            group[0] = True

    async def _run_with_retry(
        self, input: RolloutInput, client: Client, model: str, sampling_args: SamplingArgs | None, attempts_allowed: int
    ) -> State:
        if attempts_allowed <= 1:
            state = await self._rollout_once(input, client, model, sampling_args)
            state["attempts"] = 1
            return state
        policy = self.retry_policy.model_copy(update={"attempts": attempts_allowed})
        state: State | None = None
        attempt = 0

        def on_retry(rs: Any) -> None:
            err = state.get("error") if state is not None else None
            log.warning(
                "rollout example_id=%s attempt %d/%d failed with retryable error %s: %s; retrying",
                input.get("example_id"), rs.attempt_number, attempts_allowed, type(err).__name__, err,
            )

        async for ctx in policy.retrying(on_retry, retry_if=lambda e: isinstance(e, _RetryRollout)):
            with ctx:
                attempt = ctx.retry_state.attempt_number
                state = await self._rollout_once(input, client, model, sampling_args)
                err = state.get("error")
                if err is not None and attempt < attempts_allowed and (
                        is_retryable(err) if self.retry_if is None else self.retry_if(err, attempt)):
                    try:
                        await self.discard_attempt(state)
                    except Exception as exc:  # releasing the dropped attempt must not end the run
                        log.warning("releasing a retried attempt failed: %s: %s", type(exc).__name__, exc)
                    raise _RetryRollout(str(err)) from err  # the cause carries any Retry-After
        assert state is not None
        state["attempts"] = attempt
        return state

    async def discard_attempt(self, state: State) -> None:
        """Hook: `state` is an attempt about to be re-run (a retryable error) and will
        never be scored or cleaned up with its group: release what it still holds.
        Classic envs clean up inside `rollout` (@cleanup handlers), so nothing is left;
        envs that defer cleanup to the group (v1 `Env`) override it."""

    async def _score_group(self, states: list[State]) -> None:
        self.rubric.set_sync_pool(self.sync_pool)
        await self.rubric.score_group(states)

    async def _finish_states(self, states: list[State], scoring_sem: asyncio.Semaphore | None = None) -> None:
        if scoring_sem is not None:
            async with scoring_sem:
                return await self._finish_states(states)
        if self.score_rollouts:
            t0 = time.time()
            try:
                if self.rollout_timeout:
                    try:
                        async with asyncio.timeout(float(self.rollout_timeout)):
                            await self._score_group(states)
                    except TimeoutError:
                        raise ScoringError(f"scoring timed out after {float(self.rollout_timeout):g}s "
                                           "(--rollout-timeout)") from None
                else:
                    await self._score_group(states)
                t1 = time.time()
                for s in states:  # the scoring span is the env's (rubrics do not touch timing)
                    timing = s.get("timing")
                    if timing is not None:
                        timing.scoring.start = timing.scoring.start or t0
                        timing.scoring.end = t1
            except Exception as exc:  # scoring itself failed (e.g. InfraError in a test run)
                for s in states:
                    if s.get("error") is None:
                        s["error"] = exc
                    s["reward"] = 0.0
        else:
            for s in states:
                s["reward"] = s.get("reward") or 0.0
        for s in states:
            try:
                await self.rubric.cleanup(s)
            except Exception as exc:
                log.warning("rubric cleanup failed: %s", exc)

    async def run_group(
        self,
        group_inputs: list[RolloutInput],
        client: Client,
        model: str,
        sampling_args: SamplingArgs | None = None,
        sem: asyncio.Semaphore | None = None,
        max_retries: int | None = None,
        independent_scoring: bool = False,
        score: bool = True,
        scoring_sem: asyncio.Semaphore | None = None,
    ) -> list[State]:
        """Run a group of rollouts (one example) concurrently, then score it
        (unless `score=False`: the caller scores later with `_finish_states`)."""
        _GROUP_STARTED.set([False])  # this task's context: its rollouts' tasks share the flag
        async with self.group_setup(group_inputs, client, model, sampling_args, sem):
            if independent_scoring:

                async def one(inp: RolloutInput) -> State:
                    st = await self.run_rollout(sem, inp, client, model, sampling_args, max_retries)
                    if score:
                        await self._finish_states([st], scoring_sem)
                    return st

                return await gather_or_cancel(one(i) for i in group_inputs)
            states = await gather_or_cancel(self.run_rollout(sem, i, client, model, sampling_args, max_retries)
                                            for i in group_inputs)
            if score:
                await self._finish_states(states, scoring_sem)
            return states

    def group_setup(self, group_inputs: list[RolloutInput], client: Client, model: str,
                    sampling_args: SamplingArgs | None, sem: asyncio.Semaphore | None) -> Any:
        """Hook: an async context manager around one group's rollouts (entered in the group's
        task before they start, left after they end; its context variables reach them), for
        what the group shares: SandboxEnv's `setup_scope="group"` prepares one sandbox
        there (under one `sem` slot) and gives each rollout a fork. Default: nothing."""
        return contextlib.nullcontext()

    async def generate(
        self, inputs: Any, client: Any = None, model: str | None = None, sampling_args: SamplingArgs | None = None,
        max_concurrent: int = -1, results_path: Any = None, state_columns: list[str] | None = None,
        save_results: bool = False, push_to_hf_hub: bool = False, hf_hub_dataset_name: str | None = None,
        independent_scoring: bool = False, max_retries: int | None = None, shuffle: bool = False,
        shuffle_seed: int | None = None, on_start: Callable[..., Any] | None = None,
        on_progress: Callable[..., Any] | list[Callable[..., Any]] | None = None,
        on_log: Callable[..., Any] | None = None, on_group: GroupCallback | None = None,
        interleave_scoring: bool = True, max_concurrent_scoring: int = -1,
    ) -> GenerateOutputs:
        """Run rollouts for `inputs` (rows repeated per rollout; grouped by example_id).

        `client` is a Client, a ClientConfig or a list of Clients (replicas are used round-robin
        per group) or a raw AsyncOpenAI / AsyncAnthropic. `on_group(rows)` is awaited after each
        completed group (results writing hooks in here); `on_progress(done_rows, total)` likewise.
        `max_retries` (extra tries of a rollout after the first) overrides the env's own policy for
        this call; None keeps it (`set_max_retries`). `client` / `model` default to the constructor's.
        `shuffle` / `shuffle_seed` say how `inputs` were drawn (recorded in the metadata; `evaluate`
        does the shuffling). `on_log(message)` gets the saving messages (default: the env's logger).
        `push_to_hf_hub` (with `save_results`) pushes the rows to the Hub dataset `hf_hub_dataset_name`."""
        client = client if client is not None else self.client
        model = model if model is not None else self.model
        self._check_generate_args(client, model, push_to_hf_hub, hf_hub_dataset_name)
        log_message = on_log or self.logger.info
        self._register_atexit()
        rows = self._rollout_inputs(inputs)
        clients, owned_clients = _clients_of(client)
        groups = _groups_by_example(rows)
        writer = _open_results_file(results_path, log_message) if save_results and results_path is not None else None
        if on_start is not None:
            on_start(len(rows))
        await self._expect_sandboxes(len(rows))
        run = _GroupsRun(self, clients, model, sampling_args, writer=writer, total=len(rows), n_groups=len(groups),
                         max_concurrent=max_concurrent, max_concurrent_scoring=max_concurrent_scoring,
                         max_retries=max_retries, independent_scoring=independent_scoring,
                         interleave_scoring=interleave_scoring, state_columns=state_columns, on_group=on_group,
                         on_progress=on_progress)
        seconds = await run.run_all(list(groups.values()), owned_clients)
        metadata = self.build_metadata(
            run.outputs, model=model, base_url=",".join(c.base_url for c in clients), num_examples=len(groups),
            rollouts_per_example=(len(rows) // len(groups)) if groups else 0, sampling_args=sampling_args or {},
            time_ms=seconds * 1000, state_columns=state_columns or [], path_to_save=str(results_path or ""),
            shuffle=shuffle, shuffle_seed=((0 if shuffle_seed is None else shuffle_seed) if shuffle else None),
        )
        self._save_outputs(run.outputs, metadata, writer, results_path, log_message,
                           hf_hub_dataset_name if push_to_hf_hub and save_results else None)
        return {"outputs": run.outputs, "metadata": metadata}  # type: ignore[typeddict-item]

    async def _expect_sandboxes(self, rollouts: int) -> None:
        """Before a `generate` call's first rollout: the env's sandbox lifecycle (when it has
        one) expects one acquisition per rollout, so its warm pool opens no more sandboxes than
        the call still needs (a retry past that gets one made for it), and its pool starts
        filling. Group setup with forks has no default pool (rollouts take forks); with an
        explicit `pool_size` the rollouts are an upper bound of its acquisitions."""
        if self.sandboxes is not None:
            self.sandboxes.expect(rollouts)
            await self.sandboxes.start_pool()

    def _save_outputs(self, outputs: list[RolloutOutput], metadata: dict[str, Any], writer: Any, results_path: Any,
                      log_message: Callable[[str], Any], hub_dataset: str | None) -> None:
        """After the run: the metadata into the results file (when one is written) and the rows
        to the Hugging Face Hub dataset `hub_dataset` (when one is named)."""
        if writer is not None:
            writer.write_metadata(metadata)
            log_message(f"Saved final results to {results_path}")
        if hub_dataset is not None:
            self._push_to_hf_hub(outputs, hub_dataset)
            log_message(f"Pushed {len(outputs)} rows to the Hugging Face Hub dataset {hub_dataset}")

    def _check_generate_args(self, client: Any, model: str | None, push_to_hf_hub: bool,
                             hf_hub_dataset_name: str | None) -> None:
        """`generate`'s arguments that cannot run: no client or model for an env that needs
        one (TypeError), a Hub push without a dataset name (ValueError)."""
        if self.requires_model and (client is None or model is None):
            raise TypeError(f"{type(self).__name__}.generate() needs a client and a model "
                            "(none given here or to the constructor)")
        if push_to_hf_hub and not hf_hub_dataset_name:
            raise ValueError("push_to_hf_hub needs hf_hub_dataset_name (the Hub dataset to push to)")

    def _rollout_inputs(self, inputs: Any) -> list[RolloutInput]:
        """`generate`'s inputs as rollout inputs: rows already formatted (a prompt and an
        example_id) as they are, dataset rows formatted first."""
        rows = [self._to_input(r) if "prompt" in r and "example_id" in r else r for r in _rows_of(inputs)]
        if rows and any("example_id" not in r for r in rows):
            rows = [self._to_input(r) for r in self._format_rows(rows)]
        return rows  # type: ignore[return-value]

    @staticmethod
    def _push_to_hf_hub(outputs: list[RolloutOutput], dataset_name: str) -> None:
        """The rows as a Hugging Face Hub dataset (`outputs.make_dataset`, as the reference)."""
        from .outputs import make_dataset

        make_dataset({"outputs": outputs}).push_to_hub(dataset_name)

    def build_metadata(self, outputs: list[RolloutOutput], **fields: Any) -> dict[str, Any]:
        from datetime import datetime, timezone

        from .version import version_info

        meta: dict[str, Any] = {
            "env_id": self.env_id,
            "env_args": self.env_args,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "pass_threshold": self.pass_threshold,
            "tools": [t.model_dump() for t in self.tool_defs] if self.tool_defs else None,
            "version_info": version_info(self.env_id),
        }
        meta.update(fields)
        meta.update(aggregate(outputs, self.pass_threshold))
        return meta

    def generate_sync(self, inputs: Any, client: Any = None, model: str | None = None, **kwargs: Any) -> GenerateOutputs:
        return asyncio.run(self.generate(inputs, client, model, **kwargs))

    async def evaluate(
        self, client: Any = None, model: str | None = None, sampling_args: SamplingArgs | None = None,
        num_examples: int = -1, rollouts_per_example: int = 1, max_concurrent: int = -1, results_path: Any = None,
        state_columns: list[str] | None = None, save_results: bool = False, push_to_hf_hub: bool = False,
        hf_hub_dataset_name: str | None = None, independent_scoring: bool = False, max_retries: int | None = None,
        shuffle: bool = False, shuffle_seed: int | None = None, on_start: Callable[..., Any] | None = None,
        on_progress: Callable[..., Any] | list[Callable[..., Any]] | None = None,
        on_log: Callable[..., Any] | None = None, on_group: GroupCallback | None = None,
        interleave_scoring: bool = True, max_concurrent_scoring: int = -1,
    ) -> GenerateOutputs:
        """Evaluate on the eval dataset: `num_examples` x `rollouts_per_example` rollouts
        (shuffled with `shuffle_seed`, default 0, when `shuffle`); the rest as `generate`."""
        inputs = self.get_eval_inputs(num_examples, rollouts_per_example, shuffle, shuffle_seed)
        return await self.generate(
            inputs, client, model, sampling_args=sampling_args, max_concurrent=max_concurrent,
            results_path=results_path, state_columns=state_columns, save_results=save_results,
            independent_scoring=independent_scoring, max_retries=max_retries, push_to_hf_hub=push_to_hf_hub,
            hf_hub_dataset_name=hf_hub_dataset_name, shuffle=shuffle, shuffle_seed=shuffle_seed, on_start=on_start,
            on_progress=on_progress, on_log=on_log, on_group=on_group, interleave_scoring=interleave_scoring,
            max_concurrent_scoring=max_concurrent_scoring,
        )

    def evaluate_sync(self, client: Any = None, model: str | None = None, **kwargs: Any) -> GenerateOutputs:
        return asyncio.run(self.evaluate(client, model, **kwargs))


def _clients_of(client: Any) -> tuple[list[Client], list[Client]]:
    """(the clients `generate` uses, those it made and must close): a ClientConfig's
    replicas (made here), a list of replicas (round-robin per group) or one client."""
    from .clients import ClientConfig, make_client

    if isinstance(client, ClientConfig):
        clients = [make_client(c) for c in client.replicas()]
        return clients, clients
    if isinstance(client, (list, tuple)):
        return [make_client(c) for c in client], []
    return [make_client(client)], []


async def _close_quietly(clients: list[Client]) -> None:
    for c in clients:
        try:
            await c.close()
        except Exception:
            pass


def _groups_by_example(rows: list[RolloutInput]) -> dict[Any, list[RolloutInput]]:
    """The rollout inputs grouped by example_id, in order of first appearance."""
    groups: dict[Any, list[RolloutInput]] = {}
    for r in rows:
        groups.setdefault(r["example_id"], []).append(r)  # type: ignore[index]
    return groups


def _open_results_file(results_path: Any, log_message: Callable[[str], Any]) -> Any:
    from .results_file import ResultsWriter

    writer = ResultsWriter(results_path)
    writer.open()
    log_message(f"Saving results to {results_path}")
    return writer


class _GroupsRun:
    """The groups of one `generate` call: each group runs (`Environment.run_group`, under
    the call's concurrency limits), is scored (with its rollouts, or once every group has
    generated when scoring is not interleaved) and its rows are delivered: appended to the
    results file, then `on_group(rows)`, then `on_progress(all rows so far, total)`."""

    def __init__(self, env: "Environment", clients: list[Client], model: str | None,
                 sampling_args: SamplingArgs | None, *, writer: Any, total: int, n_groups: int, max_concurrent: int,
                 max_concurrent_scoring: int, max_retries: int | None, independent_scoring: bool,
                 interleave_scoring: bool, state_columns: list[str] | None, on_group: GroupCallback | None,
                 on_progress: Callable[..., Any] | list[Callable[..., Any]] | None):
        self.env, self.clients, self.model, self.sampling_args = env, clients, model, sampling_args
        self.writer, self.total, self.remaining = writer, total, n_groups
        self.max_retries, self.independent_scoring = max_retries, independent_scoring
        self.interleave_scoring, self.state_columns, self.on_group = interleave_scoring, state_columns, on_group
        limit = max_concurrent if max_concurrent and max_concurrent > 0 else 0
        self.sem = asyncio.Semaphore(limit) if limit else None
        self.scoring_sem = (asyncio.Semaphore(max_concurrent_scoring)
                            if max_concurrent_scoring and max_concurrent_scoring > 0 else None)
        self.generation_done = asyncio.Event()
        if interleave_scoring:
            self.generation_done.set()
        self.progress_cbs = on_progress if isinstance(on_progress, list) else ([on_progress] if on_progress else [])
        self.outputs: list[RolloutOutput] = []

    async def run_all(self, groups: list[list[RolloutInput]], owned_clients: list[Client]) -> float:
        """Run every group (group `i` on client `i` round-robin); the results file and the
        clients made for this call are closed however it ends. Returns the seconds it took."""
        t0 = time.time()
        try:
            await gather_or_cancel(self.group(i, g) for i, g in enumerate(groups))
        finally:
            if self.writer is not None:
                self.writer.close()
            await _close_quietly(owned_clients)
        return time.time() - t0

    async def group(self, i: int, group: list[RolloutInput]) -> None:
        """Run, score and deliver group number `i` (on client `i` round-robin)."""
        c = self.clients[i % len(self.clients)]
        try:
            states = await self.env.run_group(
                group, c, self.model, self.sampling_args, sem=self.sem, max_retries=self.max_retries,
                independent_scoring=self.independent_scoring, score=self.interleave_scoring,
                scoring_sem=self.scoring_sem,
            )
        except RolloutNotStarted:  # the run stopped starting rollouts: this group is not run
            self._generated()
            return
        if not self.interleave_scoring:
            self._generated()
            await self.generation_done.wait()
            await self.env._finish_states(states, self.scoring_sem)
        await self._deliver([state_to_output(s, self.state_columns) for s in states])

    def _generated(self) -> None:
        """One group less to generate (scoring after generation starts once none is left)."""
        if not self.interleave_scoring:
            self.remaining -= 1
            if self.remaining == 0:
                self.generation_done.set()

    async def _deliver(self, rows_out: list[RolloutOutput]) -> None:
        self.outputs.extend(rows_out)
        if self.writer is not None:
            self.writer.append(rows_out)
        if self.on_group is not None:
            res = self.on_group(rows_out)
            if hasattr(res, "__await__"):
                await res
        for cb in self.progress_cbs:
            res = cb(self.outputs, self.total)
            if hasattr(res, "__await__"):
                await res


def overlong(exc: BaseException) -> bool:
    return isinstance(exc, OverlongPromptError)


__all__ = ["Environment", "Error"]
