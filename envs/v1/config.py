"""v1 config models (pydantic): `Config` and the typed configs of each v1 part.

`Config(source, /, **overrides)` accepts a positional source (a mapping or
another config) plus keyword overrides; unknown fields fail validation with
the field named (`extra="forbid"`). `from_toml(path, section)` reads one
section (`"env.harness"` or `["env", "harness"]`). Annotation-only fields
typed as a Config subclass default to an instance of that class, so
`class MyEnvConfig(EnvConfig): harness: MyHarnessConfig` needs no default.
`resolve_ref("pkg.module:object")` turns a TOML reference into the object.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from pydantic_core import PydanticUndefined

from sandboxes.errors import ConfigError
from sandboxes.spec import SandboxSpec

from ..sandbox_tools.common import DEFAULT_OUTPUT_LIMIT

_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_ref(value: Any) -> bool:
    return isinstance(value, str) and bool(_REF.match(value))


def resolve_ref(value: Any) -> Any:
    """`"pkg.module:attr.sub"` -> the object; anything else is returned as is."""
    if not is_ref(value):
        return value
    module, _, attr = value.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module!r} for reference {value!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"reference {value!r}: {module!r} has no attribute {attr!r}") from None
    return obj


class Config(BaseModel):
    """Base of every v1 config: positional source + keyword overrides, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, config: object | None = None, /, **data: object) -> None:
        super().__init__(**{**_as_mapping(config), **data})

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        changed = False
        for name, field in cls.model_fields.items():
            ann = field.annotation
            if (field.default is PydanticUndefined and field.default_factory is None
                    and isinstance(ann, type) and issubclass(ann, Config)):
                field.default_factory = ann
                changed = True
        if changed:
            cls.model_rebuild(force=True)

    @classmethod
    def from_config(cls, config: object | None = None, /, **data: object):
        if isinstance(config, cls) and not data:
            return config
        return cls(config, **data)

    @classmethod
    def from_toml(cls, path: str | Path, section: str | Iterable[str] | None = None):
        with open(path, "rb") as f:
            data: Any = tomllib.load(f)
        keys = section.split(".") if isinstance(section, str) else list(section or [])
        for key in keys:
            if not isinstance(data, dict) or key not in data:
                raise ConfigError(f"{path}: no section [{'.'.join(keys)}]")
            data = data[key]
        return cls(data)


def _as_mapping(config: object | None) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, BaseModel):
        return {k: getattr(config, k) for k in config.model_fields_set | set(type(config).model_fields)}
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"a config source must be a mapping or a Config, got {type(config).__name__}")


def _spec_default(name: str) -> Any:
    return SandboxSpec.model_fields[name].get_default(call_default_factory=True)


V1_SANDBOX_DEFAULTS: dict[str, Any] = {"image": "vf-sandbox/python:3.11", "timeout_per_command_seconds": 600,
                                       "workdir": "/tmp"}
"""Where a v1 program sandbox differs from `SandboxSpec`'s defaults, in this one place: an
image with python (sandboxed Python programs), a program's command may run for minutes,
and it runs in /tmp. Every other default is SandboxSpec's."""


class SandboxConfig(Config):
    """Where a sandboxed program / toolset runs: a view onto `sandboxes.SandboxSpec` (its
    fields, its defaults except `V1_SANDBOX_DEFAULTS`), plus the run's backend choice, the
    warm pool size, the bash output limit and a toolset sandbox's scope."""

    image: str = V1_SANDBOX_DEFAULTS["image"]
    cpu_cores: float = _spec_default("cpu_cores")
    memory_gb: float = _spec_default("memory_gb")
    disk_size_gb: float = _spec_default("disk_size_gb")
    timeout_minutes: float = _spec_default("timeout_minutes")
    timeout_per_command_seconds: float = V1_SANDBOX_DEFAULTS["timeout_per_command_seconds"]
    environment_vars: dict[str, str] = Field(default_factory=dict)
    workdir: str = V1_SANDBOX_DEFAULTS["workdir"]
    labels: dict[str, str] = Field(default_factory=dict)
    backend: str | None = None  # None: the run's backend (`vf-sandbox eval --backend`)
    pool_size: int | None = Field(None, ge=0)
    """Ready sandboxes kept warm (SandboxEnv's `pool_size`): None sizes the pool from the
    run's concurrency (at most 32), 0 creates one per rollout. Tasks whose own `sandbox`
    settings change the spec are created per rollout."""
    output_limit_bytes: int = Field(DEFAULT_OUTPUT_LIMIT, gt=0)
    """Bytes of a `bash` tool call's output the model sees (head and tail kept), as
    SandboxEnv's `output_limit_bytes`; also what `program_result` keeps of a command's output."""
    setup_scope: Literal["rollout", "group"] = "rollout"
    """Where the harness's `setups` (the taskset's and its own) run: in every rollout, or
    ("group") once per example in one program sandbox, each rollout of the example's group
    then getting a fork of it (`sandboxes.group_setup`: files, environment, workdir carried,
    no process); what those setups write to the state is copied into each rollout's.
    Without snapshots on the backend: per rollout (warned once)."""
    scope: Literal["rollout", "group", "global"] = "rollout"
    """How long a sandboxed toolset's own sandbox lives, as the reference's
    `SandboxConfig.scope`: one per rollout (deleted with it), per example (group) or one
    for the run (both deleted at teardown). A harness's program sandbox is always per
    rollout (another scope is refused there)."""


class UserConfig(Config):
    """A simulated user: `fn` ("module:object" or callable) answers the model when it stops without tools."""

    fn: object | None = None
    max_turns: int = 1


class MCPToolConfig(Config):
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None


class ToolsetConfig(Config):
    tools: list[object] = Field(default_factory=list)
    show: list[str] | None = None
    hide: list[str] | None = None
    write: StrictBool = False
    scope: Literal["rollout", "group", "global"] | None = None
    mcp: list[MCPToolConfig] = Field(default_factory=list)


class TasksetConfig(Config):
    taskset_id: str | None = None
    system_prompt: object | None = None
    source: object | None = None
    eval_source: object | None = None
    user: object | None = None


class HarnessConfig(Config):
    program: object | None = None
    system_prompt: object | None = None
    sandbox: SandboxConfig | None = None
    model: str | None = None
    sampling_args: dict[str, object] = Field(default_factory=dict)
    max_turns: int = 10


class EnvConfig(Config):
    """The v1 loader envelope: eval TOML `[env.taskset]` / `[env.harness]` fill these."""

    taskset: TasksetConfig
    harness: HarnessConfig
