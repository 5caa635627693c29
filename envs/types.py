"""The data types of the env / rubric / eval stack.

Messages are plain OpenAI-format dicts (`{"role", "content", "tool_calls",
"tool_call_id"}`) or a plain string in completion mode. Everything that crosses
a boundary (model responses, tools, timings) is a pydantic model; rollout
inputs / outputs and run metadata are JSON-serialisable dicts (TypedDicts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

ChatMessage = dict[str, Any]
Messages = str | list[ChatMessage]
Info = dict[str, Any]
SamplingArgs = dict[str, Any]
MessageType = Literal["chat", "completion"]
ClientType = Literal[
    "openai_completions",
    "openai_chat_completions",
    "openai_chat_completions_token",
    "openai_responses",
    "renderer",
    "anthropic_messages",
    "nemorl_chat_completions",
]

IndividualRewardFunc = Callable[..., float | Awaitable[float]]
GroupRewardFunc = Callable[..., list[float] | Awaitable[list[float]]]
RewardFunc = IndividualRewardFunc | GroupRewardFunc


class CustomBaseModel(BaseModel):
    """A pydantic model that also reads like the dict it stands for:
    `m["name"]`, `m.get("name")`, `"name" in m`, and equality with the
    equivalent mapping (`Tool(...) == {"name": ..., ...}`), as the reference's types."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and hasattr(self, key)

    def keys(self) -> list[str]:
        return list(self.model_dump())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.model_dump() == dict(other)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


class SystemMessage(CustomBaseModel):
    """A system message; `SystemMessage.from_path(p)` loads a prompt file verbatim (UTF-8)."""

    role: Literal["system"] = "system"
    content: str | list[dict[str, Any]]

    @classmethod
    def from_path(cls, path: str | Path) -> "SystemMessage":
        return cls(content=Path(path).read_text(encoding="utf-8"))

    def to_dict(self) -> dict[str, Any]:
        return {"role": "system", "content": self.content}


# --------------------------------------------------------------------------- client configuration


DEFAULT_KEY_VAR = "PRIME_API_KEY"
DEFAULT_BASE_URL = "https://api.pinference.ai/api/v1"


def _validate_extra_headers(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("extra_headers must be a dict")
    for k, v in value.items():
        if not isinstance(k, str) or not k.strip():
            raise ValueError("extra_headers keys must be non-empty strings")
        if not isinstance(v, str):
            raise ValueError(f"extra_headers values must be strings (header {k!r})")
    return dict(value)


_NESTED_ENDPOINTS = "ClientConfig.endpoint_configs entries cannot include endpoint_configs"


class EndpointClientConfig(BaseModel):
    """One endpoint replica inside ClientConfig.endpoint_configs (a leaf: no nesting);
    also the connection fields every ClientConfig has."""

    client_idx: int = 0
    api_key_var: str = DEFAULT_KEY_VAR
    api_base_url: str = DEFAULT_BASE_URL
    timeout: float = 3600.0
    connect_timeout: float = 5.0
    max_connections: int = 28000
    max_keepalive_connections: int = 28000
    max_retries: int = 10
    extra_headers: dict[str, str] = Field(default_factory=dict)

    _check_headers = field_validator("extra_headers", mode="before")(classmethod(lambda cls, v: _validate_extra_headers(v)))


class ClientConfig(EndpointClientConfig):
    """How to build a Client: the endpoint fields plus the client's own. With
    `endpoint_configs`, requests go round-robin over the replicas (one group stays
    on one replica)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, never silently ignored

    client_type: ClientType = "openai_chat_completions"
    preserve_all_thinking: bool = False
    preserve_thinking_between_tool_calls: bool = False
    renderer_config: dict[str, Any] | None = None
    """client_type "renderer": one of `renderers.RendererConfig`'s variants as a mapping
    (e.g. {"name": "qwen3"}); None picks the renderer from the model name."""
    renderer_model_name: str | None = None
    """client_type "renderer": the tokenizer to load (a Hugging Face name or a local
    directory); None: the request's model."""
    endpoint_configs: list[EndpointClientConfig] = Field(default_factory=list)
    extra_headers_from_state: dict[str, str] = Field(default_factory=dict)

    @field_validator("endpoint_configs", mode="before")
    @classmethod
    def _leaf_endpoints(cls, value: Any) -> Any:
        """Entries may be ClientConfigs (their own fields, set ones only) or dicts, never nested."""
        if not isinstance(value, list):
            return value
        out = []
        for ep in value:
            if getattr(ep, "endpoint_configs", None) or (isinstance(ep, dict) and ep.get("endpoint_configs")):
                raise ValueError(_NESTED_ENDPOINTS)
            if isinstance(ep, ClientConfig):
                ep = ep.model_dump(exclude={"endpoint_configs"}, exclude_unset=True)
                ep = {k: v for k, v in ep.items() if k in EndpointClientConfig.model_fields}
            out.append(ep)
        return out

    def replicas(self) -> list["ClientConfig"]:
        """One single-endpoint ClientConfig per replica (or [self])."""
        if not self.endpoint_configs:
            return [self]
        out = []
        for i, ep in enumerate(self.endpoint_configs):
            data = self.model_dump(exclude={"endpoint_configs"})
            data.update(ep.model_dump())
            data["client_idx"] = i
            data["extra_headers"] = {**self.extra_headers, **ep.extra_headers}
            out.append(ClientConfig(**data))
        return out

    def base_urls(self) -> str:
        return ",".join(r.api_base_url for r in self.replicas())


# --------------------------------------------------------------------------- timing


class TimeSpan(CustomBaseModel):
    """A timed span (unix seconds). duration = end - start."""

    start: float = 0.0
    end: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start) if self.end else 0.0


class TimeSpans(CustomBaseModel):
    """A list of spans with their summed duration."""

    spans: list[TimeSpan] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> float:
        return sum(s.duration for s in self.spans)


class RolloutTiming(CustomBaseModel):
    """Rollout-level timing, in seconds."""

    start_time: float = 0.0
    setup: TimeSpan = Field(default_factory=TimeSpan)
    generation: TimeSpan = Field(default_factory=TimeSpan)
    scoring: TimeSpan = Field(default_factory=TimeSpan)
    model: TimeSpans = Field(default_factory=TimeSpans)
    env: TimeSpans = Field(default_factory=TimeSpans)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> float:
        end = self.scoring.end or self.generation.end
        return max(0.0, end - self.generation.start) if end and self.generation.start else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def overhead(self) -> float:
        return max(
            0.0,
            self.total - self.setup.duration - self.model.duration - self.env.duration - self.scoring.duration,
        )


# --------------------------------------------------------------------------- model responses


class TokenUsage(TypedDict, total=False):
    input_tokens: float
    output_tokens: float
    final_input_tokens: float
    final_output_tokens: float


class Usage(CustomBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0


def add_usage(state: dict[str, Any], usage: Usage) -> None:
    """Add one model call's token usage to `state["usage"]` (totals and the last call's)."""
    total = state.setdefault("usage", {})
    total["input_tokens"] = total.get("input_tokens", 0) + usage.prompt_tokens
    total["output_tokens"] = total.get("output_tokens", 0) + usage.completion_tokens
    total["final_input_tokens"] = usage.prompt_tokens
    total["final_output_tokens"] = usage.completion_tokens


class ToolCall(CustomBaseModel):
    """One tool call the model made; `arguments` is the raw JSON string."""

    id: str
    name: str
    arguments: str


class ResponseTokens(CustomBaseModel):
    prompt_ids: list[int] = Field(default_factory=list)
    prompt_mask: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    completion_mask: list[int] = Field(default_factory=list)
    completion_logprobs: list[float] = Field(default_factory=list)


class ResponseMessage(CustomBaseModel):
    content: str | None = None
    reasoning_content: str | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    is_truncated: bool | None = None
    tokens: ResponseTokens | None = None
    tool_calls: list[ToolCall] | None = None


class Response(CustomBaseModel):
    """Provider-neutral model response returned by every Client."""

    id: str = ""
    created: int = 0
    model: str = ""
    usage: Usage | None = None
    message: ResponseMessage = Field(default_factory=ResponseMessage)


class Tool(CustomBaseModel):
    """Provider-neutral tool definition (JSON-schema parameters)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


# --------------------------------------------------------------------------- rollouts


class RolloutInput(TypedDict, total=False):
    prompt: Messages
    example_id: int
    answer: str
    info: Info
    task: str


class TrajectoryStepTokens(TypedDict, total=False):
    prompt_ids: list[int]
    prompt_mask: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    overlong_prompt: bool
    is_truncated: bool


class TrajectoryStep(TypedDict):
    prompt: Messages
    completion: Messages
    response: Response
    tokens: TrajectoryStepTokens | None
    reward: float | None
    advantage: float | None
    is_truncated: bool
    trajectory_id: str
    extras: dict[str, Any]


class RolloutOutput(dict):
    """Serialised rollout (one line of results.jsonl). Known keys: example_id,
    prompt, completion, answer, info, reward, metrics, timing, is_completed,
    is_truncated, stop_condition, error ("Type: message" or None, as the
    reference documents it), error_info (`{"type", "message", "kind", "chain",
    "traceback"}` or None), error_type, error_kind ("infra" | "model" |
    "task"), attempts, token_usage, trajectory (list of TrajectoryStep dicts,
    bounded: see envs.outputs.TRAJECTORY_MAX_CHARS; trajectory_dropped_steps
    when the oldest were dropped), tool_defs, plus state columns."""


class RolloutScore(TypedDict):
    reward: float
    metrics: dict[str, float]


class RolloutScores(TypedDict):
    reward: list[float]
    metrics: dict[str, list[float]]


class VersionInfo(TypedDict):
    vf_version: str
    vf_commit: str | None
    env_version: str | None
    env_commit: str | None


class GenerateMetadata(TypedDict):
    env_id: str
    name: NotRequired[str]
    env_args: dict
    model: str
    base_url: str
    num_examples: int
    rollouts_per_example: int
    sampling_args: SamplingArgs
    date: str
    time_ms: float
    avg_reward: float
    avg_metrics: dict[str, float]
    avg_error: float
    scored_rollouts: NotRequired[int]  # rows in the averages (infra-error rows are not)
    infra_errors: NotRequired[int]  # rows that ended in an infrastructure error: not scored, rerun by --resume
    pass_at_k: dict[str, float]
    pass_all_k: dict[str, float]
    pass_threshold: float
    usage: TokenUsage | None
    version_info: VersionInfo
    state_columns: list[str]
    path_to_save: Path | str
    tools: list[dict] | None


class GenerateOutputs(TypedDict):
    outputs: list[RolloutOutput]
    metadata: GenerateMetadata


# --------------------------------------------------------------------------- state


class State(dict):
    """Per-rollout mutable state. Reading a key of INPUT_FIELDS that was not set
    directly forwards to `state["input"]`."""

    INPUT_FIELDS = ("prompt", "answer", "info", "example_id", "task")

    def __getitem__(self, key: str) -> Any:
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            if key in State.INPUT_FIELDS:
                inp = dict.get(self, "input")
                if inp is not None and key in inp:
                    return inp[key]
            raise

    def get(self, key: str, default: Any = None) -> Any:
        # no exception on a miss: `get` is on the hot path of every rollout
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if key in State.INPUT_FIELDS:
            inp = dict.get(self, "input")
            if inp is not None and key in inp:
                return inp[key]
        return default

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if key in State.INPUT_FIELDS:
            inp = dict.get(self, "input")
            return inp is not None and key in inp
        return False
