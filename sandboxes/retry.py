"""The one retry policy of vf-sandbox: exponential backoff with jitter, applied
only to `InfraError` (found anywhere in the cause chain).

It is used in exactly two places: idempotent backend operations (create with
an idempotency key, delete, status) and whole rollouts. A command that may
have started is never passed through it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel, Field
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from .errors import is_infra_error

T = TypeVar("T")
# tenacity >= 9 names the first wait `multiplier` (`initial` is deprecated); older ones only know `initial`
_FIRST_WAIT = "multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter.__init__).parameters else "initial"
log = logging.getLogger(__name__)


class RetryPolicy(BaseModel):
    """How often and how patiently to retry an InfraError."""

    attempts: int = Field(3, ge=1, description="Total tries, the first included.")
    initial_delay: float = Field(0.5, ge=0, description="Seconds before the first retry.")
    max_delay: float = Field(30.0, ge=0, description="Cap of one wait.")
    exp_base: float = Field(2.0, ge=1, description="Growth factor of the wait.")
    jitter: float = Field(0.5, ge=0, description="Up to this many seconds of random jitter added.")

    def retrying(self, on_retry: Callable[[RetryCallState], None] | None = None) -> AsyncRetrying:
        """A tenacity controller implementing this policy."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential_jitter(
                max=self.max_delay, exp_base=self.exp_base, jitter=self.jitter, **{_FIRST_WAIT: self.initial_delay}
            ),
            retry=retry_if_exception(is_infra_error),
            reraise=True,
            before_sleep=on_retry or _log_retry,
        )


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("infra error (attempt %d), retrying: %s", state.attempt_number, exc)


async def retry_infra(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy | None = None,
    on_retry: Callable[[RetryCallState], None] | None = None,
) -> tuple[T, int]:
    """Run `fn()` under `policy`; return (result, attempts used). Non-infra errors propagate at once."""
    policy = policy or RetryPolicy()
    attempt = 0
    async for attempt_ctx in policy.retrying(on_retry):
        with attempt_ctx:
            attempt = attempt_ctx.retry_state.attempt_number
            result = await fn()
    return result, attempt
