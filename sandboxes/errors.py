"""The error hierarchy shared by every layer of vf-sandbox.

Errors are named by what the caller can do about them:

    Error                          anything vf-sandbox raises on purpose
    ├── InfraError                 the infrastructure failed: RETRY on a fresh sandbox
    │   ├── BackendUnavailable     daemon / API server does not answer
    │   └── SandboxError           one sandbox failed (the reference's `vf.SandboxError`)
    │       ├── SandboxCreateError creation failed (image pull, scheduling, quota)
    │       ├── SandboxNotRunning  the sandbox vanished, was killed, OOM-killed as a whole
    │       ├── AgentError         the in-sandbox agent died or spoke garbage
    │       └── ServerStartError   a service inside the sandbox never became healthy
    ├── UsageError                 the caller asked for something wrong: do NOT retry
    │   ├── ConfigError            malformed config / spec / arguments
    │   ├── ImageNotFound          no such image and no recipe to build it
    │   ├── PathError              path traversal, missing file, not a directory
    │   │   ├── FileNotFound       no such file (builtin: FileNotFoundError)
    │   │   ├── IsADirectory       a file operation on a directory (IsADirectoryError)
    │   │   └── PermissionDenied   the sandbox's user may not (PermissionError)
    │   ├── UnknownUser            exec as a user the sandbox does not have (ConfigError)
    │   ├── UnsupportedError       this backend cannot do that (the message names the backend)
    │   │   ├── UserSwitchUnsupported  exec as another user where the sandbox cannot switch
    │   │   └── SnapshotUnsupported    snapshot / fork where the backend has no snapshots
    │   ├── TransferTooLarge       a read_file / upload / download past its size limit
    │   └── BackendNotFound        unknown backend name
    └── ModelError                 the model endpoint failed (after its own retries)

What a *task* does inside a sandbox (non-zero exit, a command timeout, an
OOM-killed command) is a result (`ExecResult`), never an exception.

`is_infra_error(exc)` walks the cause/context chain, so an `InfraError`
wrapped by a tool, a parser or a user's code is still recognised.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every error vf-sandbox raises on purpose."""

    retryable: bool = False


class InfraError(Error):
    """The sandbox or its infrastructure failed; the work may be retried on a fresh sandbox."""

    retryable = True


class BackendUnavailable(InfraError):
    """The backend's daemon or API does not answer (socket, URL named in the message)."""


class SandboxError(InfraError):
    """One sandbox failed (as opposed to the whole backend); retry on a fresh sandbox."""


class SandboxCreateError(SandboxError):
    """A sandbox could not be created or never became ready."""


class SandboxNotRunning(SandboxError):
    """The sandbox is gone or stopped (deleted, killed, evicted, timed out as a whole)."""


class AgentError(SandboxError):
    """The in-sandbox agent died, closed its channel or broke the protocol."""


class ServerStartError(SandboxError):
    """A server started inside the sandbox never became healthy (message carries its log tail)."""


class UsageError(Error, ValueError):
    """The request itself is wrong; retrying cannot help."""


class ConfigError(UsageError):
    """A malformed config, spec or argument."""


class ImageNotFound(UsageError):
    """The image does not exist locally and no recipe can build it."""


class ImagePushFailed(UsageError):
    """The registry refused a push (bad credentials, no such registry): the message says why."""


class PathError(UsageError):
    """A bad path: traversal outside the destination, missing file, wrong type."""


class FileNotFound(PathError):
    """No such file or directory (the builtin a caller maps it to: FileNotFoundError).
    `path` is the path as the caller gave it."""

    builtin = FileNotFoundError

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class IsADirectory(PathError):
    """A file operation (read_file, write_file) on a directory (builtin: IsADirectoryError)."""

    builtin = IsADirectoryError

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class PermissionDenied(PathError):
    """The sandbox's user may not read / write / run that path (builtin: PermissionError)."""

    builtin = PermissionError

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class UnknownUser(ConfigError):
    """`exec(user=...)` names a user (or uid) the sandbox's /etc/passwd does not have."""


class UnsupportedError(UsageError):
    """This backend (or this kind of sandbox) cannot do what was asked; the message names
    the backend. Retrying cannot help: another backend or option might."""


class SnapshotUnsupported(UnsupportedError):
    """`Sandbox.snapshot()` / `fork()` / `create_from_snapshot` where the backend (or this
    kind of sandbox on it) has no snapshots: Kubernetes, Prime, local processes."""


class UserSwitchUnsupported(UnsupportedError):
    """`exec(user=...)` asks for another user than the sandbox runs commands as, and the
    sandbox cannot switch users (its agent lacks CAP_SETUID / CAP_SETGID: every capability
    is dropped by default, a cell's processes hold none, a non-root sandbox user)."""


class TransferTooLarge(UsageError):
    """A file read or transfer is larger than its limit (`SandboxSpec.read_limit_bytes` /
    `transfer_limit_bytes`); nothing past the limit was kept or written."""


class BackendNotFound(UsageError):
    """No backend is registered under that name."""


class ModelError(Error):
    """The model endpoint failed after the client's own retries."""


def iter_causes(exc: BaseException | None):
    """Yield `exc` and every exception in its __cause__/__context__ chain (cycle-safe)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        cur = stack.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        stack.append(cur.__context__)
        stack.append(cur.__cause__)
        if isinstance(cur, BaseExceptionGroup):
            stack.extend(cur.exceptions)


def find_infra_error(exc: BaseException | None) -> InfraError | None:
    """The first InfraError in `exc`'s cause chain, or None."""
    for cur in iter_causes(exc):
        if isinstance(cur, InfraError):
            return cur
    return None


def is_infra_error(exc: BaseException | None) -> bool:
    """True when an InfraError appears anywhere in `exc`'s cause chain."""
    return find_infra_error(exc) is not None
