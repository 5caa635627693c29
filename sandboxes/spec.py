"""`SandboxSpec`: what a sandbox is made of, independent of any backend.

Defaults follow the reference `SandboxEnv` (python:3.11-slim, 1 core, 2 GB,
5 GB disk, 60 min lifetime, 30 s per command) and are secure by default:
networking off, every capability dropped, no-new-privileges, a pids limit.

`user_switch` (off by default) lets `exec(user=...)` run a command as another
user: the sandbox keeps exactly CAP_SETUID, CAP_SETGID and CAP_SETPCAP for its
agent alone (no-new-privileges stays on); every command the agent starts loses
them before it runs (a switched user by the kernel's uid change plus a dropped
bounding set, a root command by dropping them from all its capability sets),
so the sandboxed code itself never holds a capability. Docker containers only;
other backends and cells refuse it with a ConfigError.

`isolation` picks the kernel boundary: "runc" (namespaces + cgroups on the
host kernel) or "gvisor" (a user-space kernel between the sandbox and the
host: Docker's `runsc` runtime, Kubernetes' gVisor RuntimeClass). Backends
that cannot give gVisor refuse it with a ConfigError rather than run weaker.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import ConfigError

DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_OUTPUT_LIMIT = 1024 * 1024  # bytes kept per output stream
DEFAULT_READ_LIMIT = 64 * 1024**2  # bytes read_file returns at most (held in memory)
DEFAULT_TRANSFER_LIMIT = 1024**3  # bytes of one upload / download (streamed through a temp file)
Isolation = Literal["runc", "gvisor"]
ISOLATIONS: tuple[str, ...] = get_args(Isolation)
RolloutIsolation = Literal["container", "namespace"]


class SandboxSpec(BaseModel):
    """Everything a backend needs to create one sandbox."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(DEFAULT_IMAGE, description="Image name:tag; built from images/ if a recipe maps to it.")
    start_command: str = Field("tail -f /dev/null", description="PID-1 command of the sandbox.")
    name: str = Field("sandbox", description="Name prefix; backends add a unique suffix.")
    cpu_cores: float = Field(1, gt=0, description="CPU limit in cores.")
    memory_gb: float = Field(2, gt=0, description="Memory limit in GiB (swap disabled).")
    disk_size_gb: float = Field(5, gt=0, description="Writable disk in GiB (where the backend can enforce it).")
    read_limit_bytes: int = Field(DEFAULT_READ_LIMIT, gt=0, description="read_file without max_bytes refuses larger files (TransferTooLarge).")
    transfer_limit_bytes: int = Field(DEFAULT_TRANSFER_LIMIT, gt=0, description="upload / download refuse trees or files larger than this (TransferTooLarge).")
    gpu_count: int = Field(0, ge=0, description="GPUs to attach.")
    timeout_minutes: float = Field(60, gt=0, description="Hard lifetime; the sandbox is removed after it even if its owner dies.")
    timeout_per_command_seconds: float = Field(30, gt=0, description="Default timeout of one exec.")
    environment_vars: dict[str, str] = Field(default_factory=dict, description="Environment of every command.")
    labels: dict[str, str] = Field(default_factory=dict, description="User labels; lifecycle labels are added by the backend.")
    workdir: str = Field("/", description="Default working directory of commands.")
    user: str | None = Field(None, description="User (name or uid[:gid]) commands run as; None = image default.")
    network: bool = Field(False, description="Networking on? Off by default.")
    isolation: Isolation = Field("runc", description='Kernel boundary: "runc" (host kernel) or "gvisor" (user-space kernel).')
    rollout_isolation: RolloutIsolation = Field(
        "container", description='What each sandbox is: "container" (a new container / pod) or "namespace" (a cell '
        'of a pooled host container: private overlay, PID/IPC/UTS/network namespaces, cgroup limits; made in '
        'milliseconds; see sandboxes/cells.py).')
    user_switch: bool = Field(
        False, description="Let exec(user=...) switch users: the agent (never the commands) keeps CAP_SETUID/"
        "CAP_SETGID/CAP_SETPCAP. Off by default (every capability dropped); Docker containers only.")
    pids_limit: int = Field(1024, gt=0, description="Max processes inside the sandbox.")
    output_limit_bytes: int = Field(DEFAULT_OUTPUT_LIMIT, gt=0, description="Bytes kept per output stream of one exec.")

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_from_list(cls, v):
        """Accept the reference's list-of-strings labels (`["a", "b"]` → `{"a": "true", ...}`)."""
        if isinstance(v, (list, tuple)):
            return {str(x): "true" for x in v}
        return v

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1024**3)


def refuse_namespace(spec: SandboxSpec, backend: str) -> None:
    """Raise ConfigError when `spec` asks for cells from a backend that has none."""
    if spec.rollout_isolation == "namespace":
        raise ConfigError(f"rollout_isolation='namespace' is not available on the {backend} backend; "
                          "use the docker backend, or rollout_isolation='container'")


def refuse_gvisor(spec: SandboxSpec, backend: str, instead: str) -> None:
    """Raise ConfigError when `spec` asks for gVisor from a backend that cannot give it
    (never silently run weaker); `instead` says which backend can."""
    if spec.isolation == "gvisor":
        raise ConfigError(f"isolation='gvisor' is not available on the {backend} backend; {instead}")


def refuse_user_switch(spec: SandboxSpec, backend: str) -> None:
    """Raise ConfigError when `spec` asks for user switching from a backend that cannot give it."""
    if spec.user_switch:
        raise ConfigError(f"user_switch=True is not available on the {backend} backend: only the docker backend's "
                          "containers (rollout_isolation='container') can switch users")


def spec_field(field: str) -> Any:
    """SandboxSpec's `field` as a `(type, FieldInfo)` pair for a settings model built with
    `pydantic.create_model`: its type, constraints, default and description, so a view onto
    the spec (SandboxEnv's `-x` keys, SWE debug options) cannot drift from it."""
    info = SandboxSpec.model_fields[field]
    return (Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation,
            Field(info.get_default(call_default_factory=True), description=info.description))
