"""`SandboxChoice`: what a framework's config says about the sandbox it wants —
backend, image, kernel boundary, rollout isolation, limits, network — with the
defaults of `SandboxSpec` (read from it, so the two never drift apart).
The inspect_ai and mini-swe-agent configs both extend it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandboxes import SandboxSpec
from sandboxes.registry import DEFAULT_BACKEND

_SPEC = SandboxSpec.model_fields
FRAMEWORK_LABEL = "vf-sandbox.framework"  # which framework made a sandbox (cleanup by framework)


def _default(name: str) -> Any:
    return Field(_SPEC[name].default, description=_SPEC[name].description)


class SandboxChoice(BaseModel):
    """The sandbox of each sample / run. Every field but `backend`, `backend_options`
    and `rollout_isolation` is the `SandboxSpec` field of the same name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = Field(DEFAULT_BACKEND, description="Backend name (docker, kubernetes, prime, local).")
    backend_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the backend.")
    image: str = _default("image")
    isolation: Literal["runc", "gvisor"] = _default("isolation")
    rollout_isolation: Literal["container", "cell"] = Field(
        "container", description='"container": a container (pod) per sample; "cell": a cell of a pooled host '
        "container (private overlay, namespaces, cgroup limits; made in milliseconds; docker backend).")
    cpu_cores: float = _default("cpu_cores")
    memory_gb: float = _default("memory_gb")
    disk_size_gb: float = _default("disk_size_gb")
    pids_limit: int = _default("pids_limit")
    timeout_minutes: float = _default("timeout_minutes")
    network: bool = _default("network")
    workdir: str = _default("workdir")
    user: str | None = _default("user")
    user_switch: bool = _default("user_switch")
    environment_vars: dict[str, str] = Field(default_factory=dict, description=_SPEC["environment_vars"].description)
    labels: dict[str, str] = Field(default_factory=dict, description=_SPEC["labels"].description)

    def spec(self, labels: dict[str, str] | None = None, **overrides: Any) -> SandboxSpec:
        """The `SandboxSpec` of one sandbox (ConfigError for what the spec refuses)."""
        own = set(SandboxChoice.model_fields) - {"backend", "backend_options", "rollout_isolation", "labels"}
        fields = self.model_dump(include=own)  # a subclass's own fields are not the spec's
        return SandboxSpec(**fields, labels={**self.labels, **(labels or {})},
                           rollout_isolation="namespace" if self.rollout_isolation == "cell" else "container",
                           **overrides)

    def backend_key(self) -> tuple[int, str]:
        """Which backend instance serves this choice: one per event loop and backend
        (name + options), so the samples / trials of one run share it (and its cell hosts)."""
        choice = json.dumps([self.backend, self.backend_options], sort_keys=True, default=str)
        return id(asyncio.get_running_loop()), choice
