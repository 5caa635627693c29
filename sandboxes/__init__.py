"""vf-sandbox's backend-neutral core: the `Sandbox` / `SandboxBackend` contract,
the spec, typed results, the error hierarchy, the retry policy, lifecycle and
the warm pool. No backend is imported here; ask for one with `get_backend`."""

from .errors import (
    AgentError,
    BackendNotFound,
    BackendUnavailable,
    ConfigError,
    FileNotFound,
    IsADirectory,
    Error,
    ImageNotFound,
    InfraError,
    ModelError,
    PathError,
    PermissionDenied,
    SandboxCreateError,
    SandboxNotRunning,
    ServerStartError,
    SnapshotUnsupported,
    TransferTooLarge,
    UnknownUser,
    UnsupportedError,
    UsageError,
    UserSwitchUnsupported,
    find_infra_error,
    is_infra_error,
)
from .interface import BackgroundProcess, Command, Sandbox, SandboxBackend, SupportsCells, SupportsSnapshots
from .pool import SandboxPool
from .registry import backend_names, get_backend, register_backend
from .results import ExecResult, OutputChunk, ProcessStatus, SandboxInfo
from .retry import RetryPolicy, retry_infra
from .snapshots import Snapshot
from .spec import SandboxSpec

__all__ = [name for name in dir() if not name.startswith("_")]
