"""Cancelling tasks without losing a cancellation: the one way this project stops
a task it started (a pool's filler, a reader, a pipelined write, a rollout).

`task.cancel()` then `with suppress(BaseException): await task` also swallows the
*caller's* own cancellation when it lands meanwhile (a stopped run then carries
on); `asyncio.wait` never raises for the task's outcome, only for the caller's
cancel. A task that ignores its cancellation (a library bug, e.g. Python 3.11's
`asyncio.wait_for`, gh-86296) is cancelled again every few seconds rather than
waited on for as long as its next call takes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger("sandboxes")

RECANCEL_SECONDS = 5.0


async def cancel_and_settle(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel `tasks` and wait until every one has ended; their outcomes are retrieved
    (no "exception was never retrieved") and dropped. Raises only CancelledError,
    when the caller itself is cancelled."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
        if pending:
            log.warning("%d task(s) ignored a cancellation; cancelling again", len(pending))
    for t in tasks:
        if not t.cancelled():
            t.exception()
