"""`task.toml` of a Harbor task, read as Harbor reads it (harbor.models.task.config,
schema 1.x): the same sections, fields, defaults and cross-field checks, for the
fields this stack acts on. Unknown keys are ignored, as pydantic (and so Harbor)
ignores them; fields we cannot honour are accepted here and refused by
`harbor_tasks.task.unsupported` with a reason.

Harbor's defaults kept on purpose: `[environment].network_mode` is "public",
`[verifier].timeout_sec` 600, `[agent].timeout_sec` none, users none (the image's
default user, normally root), `build_timeout_sec` 600.
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from enum import Enum
from ipaddress import ip_address, ip_network
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


class NetworkMode(str, Enum):
    NO_NETWORK = "no-network"
    PUBLIC = "public"
    ALLOWLIST = "allowlist"


def _normalize_hosts(hosts: list[str] | None) -> list[str] | None:
    """Harbor's allowed_hosts validation: hostnames, `*.` wildcards, IP literals or CIDRs;
    lower-cased, trailing dot dropped; URLs, ports and paths refused."""
    if hosts is None:
        return None
    out: list[str] = []
    bad = "allowed_hosts entries must be hostnames, IP addresses, or IP CIDR ranges, not URLs, ports, or paths."
    for raw in hosts:
        host = str(raw).strip().lower().rstrip(".")
        if not host:
            raise ValueError("allowed_hosts entries must be non-empty hostnames.")
        if "/" in host:
            try:
                out.append(ip_network(host, strict=True).compressed)
            except ValueError:
                raise ValueError(bad) from None
            continue
        if ":" in host:
            try:
                addr = ip_address(host)
            except ValueError:
                raise ValueError(bad) from None
            if addr.version != 6:
                raise ValueError(bad)
            out.append(addr.compressed)
            continue
        name = host[2:] if host.startswith("*.") else host
        if "*" in name or not name or not all(_HOST_LABEL.match(label) for label in name.split(".")):
            raise ValueError(f"allowed_hosts entry {raw!r} is not a hostname, IP address or leading '*.' pattern.")
        out.append(host)
    return out


def _check_policy(mode: NetworkMode | None, hosts: list[str] | None) -> None:
    if mode != NetworkMode.ALLOWLIST and hosts:
        raise ValueError("allowed_hosts is only valid when network_mode='allowlist'.")
    if mode is None and hosts is not None:
        raise ValueError("allowed_hosts is only valid when network_mode='allowlist'.")


class NetworkPolicy(BaseModel):
    """The resolved policy of one phase (agent or verifier)."""

    network_mode: NetworkMode = NetworkMode.PUBLIC
    allowed_hosts: list[str] = Field(default_factory=list)


class _PhasePolicy(BaseModel):
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    _hosts = field_validator("allowed_hosts")(classmethod(lambda cls, v: _normalize_hosts(v)))

    @model_validator(mode="after")
    def _policy(self) -> "_PhasePolicy":
        _check_policy(self.network_mode, self.allowed_hosts)
        return self


class AgentConfig(_PhasePolicy):
    timeout_sec: float | None = None
    user: str | int | None = None


class HealthcheckConfig(BaseModel):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class EnvironmentConfig(BaseModel):
    network_mode: NetworkMode = NetworkMode.PUBLIC
    allowed_hosts: list[str] | None = None
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: str = "linux"
    cpus: int | float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    skills_dir: str | None = None
    healthcheck: HealthcheckConfig | None = None
    workdir: str | None = None
    allow_internet: bool | None = Field(None, exclude=True)

    _hosts = field_validator("allowed_hosts")(classmethod(lambda cls, v: _normalize_hosts(v)))

    @field_validator("os", mode="before")
    @classmethod
    def _os(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, v: int | float | None) -> int | float | None:
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"cpus must be a finite number; got {v}.")
            if v.is_integer():
                return int(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """Harbor's deprecated `memory` / `storage` ("2G", "512M") → *_mb."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if old in data:
                warnings.warn(f"The '{old}' field is deprecated. Use '{new}' instead.", DeprecationWarning, stacklevel=2)
                value = data.pop(old)
                if isinstance(value, str):
                    mb = _size_mb(value)
                    if new in data and data[new] != mb:
                        raise ValueError(f"Conflicting '{old}' and '{new}' values: {old}={value!r} != {new}={data[new]!r}.")
                    data.setdefault(new, mb)
        return data

    @model_validator(mode="after")
    def _policy(self) -> "EnvironmentConfig":
        _check_policy(self.network_mode, self.allowed_hosts)
        if self.allow_internet is not None and "network_mode" not in self.model_fields_set and self.allowed_hosts is None:
            self.network_mode = NetworkMode.PUBLIC if self.allow_internet else NetworkMode.NO_NETWORK
        self.allow_internet = None
        return self


def _size_mb(text: str) -> int:
    s = text.strip().upper()
    for suffix, factor in (("G", 1024.0), ("M", 1.0), ("K", 1 / 1024)):
        if s.endswith(suffix):
            return int(float(s[:-1]) * factor)
    raise ValueError(f"Invalid size format: {s}. Expected format like '1G', '512M', etc.")


class VerifierConfig(_PhasePolicy):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    environment_mode: str | None = None
    environment: EnvironmentConfig | None = None


class SolutionConfig(BaseModel):
    env: dict[str, str] = Field(default_factory=dict)


class PackageInfo(BaseModel):
    name: str
    version: str | None = None
    description: str = ""
    keywords: list[str] = Field(default_factory=list)


class TaskConfig(BaseModel):
    """A task.toml. `TaskConfig.from_toml(text)`; ValueError (pydantic's ValidationError
    or TOMLDecodeError, both ValueErrors) when Harbor would refuse it too."""

    schema_version: str = "1.4"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None
    steps: list[dict[str, Any]] | None = None
    artifacts: list[Any] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", data.pop("version"))
        return data

    @classmethod
    def from_toml(cls, text: str) -> "TaskConfig":
        return cls.model_validate(tomllib.loads(text))

    def policy(self, phase: str) -> NetworkPolicy:
        """The network policy of "agent" or "verifier": the phase's explicit override, else
        the environment's baseline (Harbor's resolution for a single-step task)."""
        own: _PhasePolicy = self.agent if phase == "agent" else self.verifier
        if own.network_mode is not None:
            return NetworkPolicy(network_mode=own.network_mode, allowed_hosts=list(own.allowed_hosts or []))
        env = self.environment
        return NetworkPolicy(network_mode=env.network_mode, allowed_hosts=list(env.allowed_hosts or []))
