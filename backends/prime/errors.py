"""Mapping of `prime-sandboxes` SDK exceptions onto vf-sandbox's error hierarchy.

Classification uses exception types and HTTP status codes found in the cause
chain (the SDK wraps `httpx.HTTPStatusError`), never message text.

    SDK                                   vf-sandbox
    SandboxOOMError                       PrimeOOMKilled (SandboxNotRunning)
    SandboxTimeoutError                   PrimeSandboxTimeout (SandboxNotRunning)
    SandboxImagePullError                 PrimeImagePullError (SandboxCreateError)
    SandboxNotRunningError, 404, 409      SandboxNotRunning
    PaymentRequiredError (402)            PrimePaymentRequired (UsageError: do not retry)
    UnauthorizedError (401), 403          ConfigError (names PRIME_API_KEY)
    400 / 422                             ConfigError
    429, 5xx, timeouts, transport         BackendUnavailable
    CommandTimeoutError                   never reaches callers: commands time out
                                          inside the agent and come back as results
"""

from __future__ import annotations

from sandboxes.errors import (
    BackendUnavailable,
    ConfigError,
    Error,
    SandboxCreateError,
    SandboxNotRunning,
    UsageError,
    iter_causes,
)


class PrimeOOMKilled(SandboxNotRunning):
    """Prime reports the sandbox was OOM-killed as a whole."""


class PrimeSandboxTimeout(SandboxNotRunning):
    """The sandbox outlived its timeout_minutes."""


class PrimeImagePullError(SandboxCreateError):
    """Prime could not pull the image."""


class PrimePaymentRequired(UsageError):
    """HTTP 402 from Prime: the account has no credit. Retrying cannot help."""


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of the first httpx.HTTPStatusError in the cause chain."""
    try:
        import httpx
    except ImportError:  # pragma: no cover
        return None
    for cur in iter_causes(exc):
        if isinstance(cur, httpx.HTTPStatusError):
            return cur.response.status_code
    return None


def map_error(exc: BaseException, what: str) -> BaseException:
    """The vf-sandbox error for an SDK exception raised while doing `what`."""
    if isinstance(exc, Error):
        return exc
    from prime_sandboxes import exceptions as pe
    from prime_sandboxes.core import client as pc

    msg = f"prime: {what}: {exc}"
    if isinstance(exc, pe.SandboxOOMError):
        return PrimeOOMKilled(msg)
    if isinstance(exc, pe.SandboxTimeoutError):
        return PrimeSandboxTimeout(msg)
    if isinstance(exc, pe.SandboxImagePullError):
        return PrimeImagePullError(msg)
    if isinstance(exc, pe.SandboxNotRunningError):
        return SandboxNotRunning(msg)
    if isinstance(exc, pc.PaymentRequiredError):
        return PrimePaymentRequired(f"{msg} (HTTP 402: add credit to the Prime account)")
    if isinstance(exc, pc.UnauthorizedError):
        return ConfigError(f"{msg} (PRIME_API_KEY was rejected)")
    if isinstance(exc, pe.CommandTimeoutError):
        return BackendUnavailable(msg)
    status = http_status(exc)
    if status in (404, 409, 410):
        return SandboxNotRunning(f"{msg} (HTTP {status})")
    if status == 403:
        return ConfigError(f"{msg} (HTTP 403: PRIME_API_KEY lacks access)")
    if status in (400, 413, 422):
        return ConfigError(f"{msg} (HTTP {status})")
    return BackendUnavailable(msg)


def is_not_found(exc: BaseException) -> bool:
    from prime_sandboxes import exceptions as pe

    return http_status(exc) == 404 or isinstance(exc, pe.SandboxFileNotFoundError)
