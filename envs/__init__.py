"""vf-sandbox's env / rubric / eval stack, API-compatible with `verifiers`.

Environments written for the reference library port by changing
`import verifiers as vf` to `import envs as vf`. Sandbox-backed envs
(`SandboxEnv`, `PythonEnv`, `OpenEnvEnv`) and the model clients load lazily,
so `import envs` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .clients.base import Client, ModelAuthError
from .clients.config import ClientConfig, EndpointClientConfig
from .decorators import cleanup, stop, teardown
from .env_group import EnvGroup
from .environment import Environment
from .errors import (
    EmptyModelResponseError,
    Error,
    InfraError,
    InvalidModelResponseError,
    MissingKeyError,
    ModelError,
    OverlongPromptError,
    SandboxError,
    ToolCallError,
    ToolError,
    ToolParseError,
    is_infra_error,
)
from .logging_utils import log_level, print_prompt_completions_sample, quiet_verifiers, setup_logging
from .multi_turn import MultiTurnEnv, SingleTurnEnv
from .parsers import MaybeThinkParser, Parser, ThinkParser, XMLParser
from .rubrics import JudgeRubric, MathRubric, Rubric, RubricGroup
from .tool_env import StatefulToolEnv, ToolEnv
from .tool_schema import convert_func_to_tool_def
from .types import (
    ChatMessage,
    GenerateMetadata,
    GenerateOutputs,
    Info,
    GroupRewardFunc,
    IndividualRewardFunc,
    Messages,
    Response,
    ResponseMessage,
    RolloutInput,
    RolloutOutput,
    RolloutScore,
    RolloutScores,
    RewardFunc,
    RolloutTiming,
    SamplingArgs,
    State,
    SystemMessage,
    TimeSpan,
    TimeSpans,
    TokenUsage,
    Tool,
    ToolCall,
    TrajectoryStep,
    Usage,
)
from .utils import ensure_keys, extract_boxed_answer, extract_hash_answer

if TYPE_CHECKING:
    from .clients.anthropic_client import AnthropicMessagesClient
    from .clients.openai_clients import OpenAIChatCompletionsClient, OpenAICompletionsClient

__version__ = "0.1.0"

# name -> module; resolved on first attribute access (modules may be written by others)
_LAZY: dict[str, str] = {
    "SandboxEnv": "envs.sandbox_env",
    "PythonEnv": "envs.python_env",
    "OpenEnvEnv": "envs.openenv.env",
    "OpenAIChatCompletionsClient": "envs.clients.openai_clients",
    "OpenAICompletionsClient": "envs.clients.openai_clients",
    "AnthropicMessagesClient": "envs.clients.anthropic_client",
    "OpenAIResponsesClient": "envs.clients.openai_responses",
    "OpenAIChatCompletionsTokenClient": "envs.clients.openai_token_client",
    "NeMoRLChatCompletionsClient": "envs.clients.nemorl_client",
    "RendererClient": "envs.clients.renderer_client",
}


def __getattr__(name: str) -> Any:
    if name == "v1":  # the v1 API (Taskset / Harness / Env), `vf.v1`
        return importlib.import_module("envs.v1")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def load_environment(env_id: str, **kwargs: Any) -> Environment:
    """Load an environment by id (`my-env` -> module `my_env`, its load_environment(**kwargs))."""
    from .loader import load_environment as _load

    return _load(env_id, **kwargs)


def load_example_dataset(name: str, split: str | None = None, n: int | None = None) -> Any:
    """A few built-in example datasets (HF hub access needed for most)."""
    from datasets import load_dataset

    mapping = {"gsm8k": ("openai/gsm8k", "main"), "math": ("hendrycks/competition_math", None)}
    repo, config = mapping.get(name, (name, None))
    ds = load_dataset(repo, config, split=split or "train")
    return ds.select(range(n)) if n else ds


__all__ = sorted(
    [n for n in dir() if not n.startswith("_") and n not in {"annotations", "importlib", "TYPE_CHECKING", "Any"}]
    + list(_LAZY)
)
