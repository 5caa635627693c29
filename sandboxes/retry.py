"""The one retry policy of vf-sandbox: exponential backoff with jitter that
also honours a server's Retry-After, applied only to errors that say they are
worth another try.

It is used in exactly two places, each with its own predicate:

* idempotent backend operations (create with an idempotency key, delete,
  status/list): `retry_op` / the `@idempotent` method decorator, under the
  backend's `retry` option, for `is_transient` errors (an InfraError that a
  second identical call may not hit: not "the sandbox is gone", and for an
  HTTP error only 408/429/5xx);
* whole rollouts (`envs.environment`), for `is_retryable` errors: an
  InfraError anywhere in the cause chain (run it again on a fresh sandbox)
  or a transient model-API error (connection, 429, 5xx).

A command that may have started is never passed through it.

`RetryPolicy.attempts` counts every try, the first included:
`attempts = max_retries + 1`, and `max_retries` everywhere in vf-sandbox
means the number of extra tries after the first (0 = no retry).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, Field
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from .errors import Error, SandboxNotRunning, find_infra_error, is_infra_error, iter_causes

T = TypeVar("T")
# tenacity >= 9 names the first wait `multiplier` (`initial` is deprecated); older ones only know `initial`
_FIRST_WAIT = "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter.__init__).parameters else "initial"
log = logging.getLogger(__name__)


def retry_after_of(exc: BaseException | None) -> float | None:
    """Seconds the server asked us to wait (a `retry_after` attribute anywhere in the cause chain), or None."""
    for cur in iter_causes(exc):
        value = getattr(cur, "retry_after", None)
        if isinstance(value, (int, float)) and value >= 0:
            return float(value)
    return None


def is_retryable(exc: BaseException | None) -> bool:
    """Worth re-running the whole unit of work (a rollout): some error in the cause
    chain is `retryable` (every InfraError; a transient model-API error)."""
    return any(isinstance(cur, Error) and cur.retryable for cur in iter_causes(exc))


def is_transient(exc: BaseException | None) -> bool:
    """Worth repeating the same idempotent backend call: an InfraError in the cause
    chain that is not SandboxNotRunning (asking again cannot bring a sandbox back)
    and, when it carries an HTTP `status`, one of 408, 429 or 5xx."""
    err = find_infra_error(exc)
    if err is None or isinstance(err, SandboxNotRunning):
        return False
    status = getattr(err, "status", None)
    return not isinstance(status, int) or status in (408, 429) or status >= 500


class RetryPolicy(BaseModel):
    """How often and how patiently to retry."""

    attempts: int = Field(3, ge=1, description="Total tries, the first included (= max_retries + 1).")
    initial_delay: float = Field(0.5, ge=0, description="Seconds before the first retry.")
    max_delay: float = Field(30.0, ge=0, description="Cap of one backoff wait.")
    exp_base: float = Field(2.0, ge=1, description="Growth factor of the wait.")
    jitter: float = Field(0.5, ge=0, description="Up to this many seconds of random jitter added.")
    max_retry_after: float = Field(
        120.0, ge=0, description="Longest server-requested wait (Retry-After) honoured; longer requests are capped here.")

    @classmethod
    def from_max_retries(cls, max_retries: int, **fields: Any) -> "RetryPolicy":
        """The policy with `max_retries` extra tries after the first."""
        return cls(attempts=max(0, int(max_retries)) + 1, **fields)

    @property
    def max_retries(self) -> int:
        return self.attempts - 1

    def wait_seconds(self, state: RetryCallState) -> float:
        """Exponential backoff with jitter, but at least what the server asked for (capped)."""
        backoff = wait_exponential_jitter(
            max=self.max_delay, exp_base=self.exp_base, jitter=self.jitter, **{_FIRST_WAIT: self.initial_delay}
        )(state)
        asked = retry_after_of(state.outcome.exception() if state.outcome else None)
        return backoff if asked is None else max(backoff, min(asked, self.max_retry_after))

    def retrying(
        self,
        on_retry: Callable[[RetryCallState], None] | None = None,
        retry_if: Callable[[BaseException], bool] = is_infra_error,
    ) -> AsyncRetrying:
        """A tenacity controller implementing this policy for errors `retry_if` accepts."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=self.wait_seconds,
            retry=retry_if_exception(retry_if),
            reraise=True,
            before_sleep=on_retry or _log_retry,
        )


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("retryable error (attempt %d), retrying: %s: %s", state.attempt_number, type(exc).__name__, exc)


async def retry_infra(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy | None = None,
    on_retry: Callable[[RetryCallState], None] | None = None,
    retry_if: Callable[[BaseException], bool] = is_infra_error,
) -> tuple[T, int]:
    """Run `fn()` under `policy`; return (result, attempts used). Errors `retry_if`
    rejects (by default: anything but an InfraError) propagate at once."""
    policy = policy or RetryPolicy()
    attempt = 0
    async for attempt_ctx in policy.retrying(on_retry, retry_if):
        with attempt_ctx:
            attempt = attempt_ctx.retry_state.attempt_number
            result = await fn()
    return result, attempt


async def retry_op(fn: Callable[[], Awaitable[T]], policy: RetryPolicy | None, what: str = "backend operation") -> T:
    """One idempotent backend operation under `policy`, repeated on `is_transient` errors only."""

    def on_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s failed (attempt %d), retrying: %s", what, state.attempt_number, exc)

    result, _ = await retry_infra(fn, policy, on_retry, retry_if=is_transient)
    return result


def idempotent(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Decorator for an idempotent async method of a backend: run under the
    backend's own policy (`self.retry`) with `retry_op`."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        return await retry_op(lambda: method(self, *args, **kwargs), getattr(self, "retry", None),
                              f"{getattr(self, 'name', type(self).__name__)}.{method.__name__}")

    return wrapper


__all__ = ["RetryPolicy", "idempotent", "is_retryable", "is_transient", "retry_after_of", "retry_infra", "retry_op"]
