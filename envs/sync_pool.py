"""`SyncPool`: where sync user code runs, so it never blocks the event loop.

Reward functions and tools may be plain `def`s that take seconds (a
`subprocess.run`, a sympy check, `time.sleep`). Called on the loop they stall
every other rollout; `SyncPool.call(fn, ...)` runs a sync callable in a
bounded thread pool instead (contextvars copied, like `asyncio.to_thread`)
and awaits its result; an `async def` (or an object with an async
`__call__`) is awaited on the loop as before. A sync callable that returns
an awaitable has it awaited on the loop.

Each `Environment` owns one pool (`env.sync_pool`), sized by
`env.set_concurrency(n)` (the eval runner calls it with the run's
concurrency), shared by its rubric and tools, and shut down by
`env.teardown()`. The executor is created on first use and again after a
shutdown, so a pool can be resized or reused at any time; resizing swaps in
a new executor and lets work already handed to the old one finish.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def is_async_callable(fn: Any) -> bool:
    """True for coroutine functions (also bound, partial-wrapped, or an async `__call__`)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


class SyncPool:
    """A resizable, lazily created thread pool for sync user callables."""

    def __init__(self, size: int, name: str = "vf-sync"):
        self._size = max(1, int(size))
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (an env sent to a worker process): only the size and name travel."""
        return {"_size": self._size, "_name": self._name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_size"], state["_name"])  # type: ignore[misc]

    @property
    def size(self) -> int:
        """Maximum number of sync callables running at once."""
        return self._size

    def resize(self, size: int) -> None:
        size = max(1, int(size))
        with self._lock:
            if size == self._size:
                return
            self._size = size
            old, self._executor = self._executor, None
        if old is not None:
            old.shutdown(wait=False)  # work already submitted still runs to completion

    def _get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self._size, thread_name_prefix=self._name)
            return self._executor

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`: async callables on the loop, sync ones in the pool."""
        if is_async_callable(fn):
            return await fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        result = await loop.run_in_executor(self._get(), functools.partial(ctx.run, fn, *args, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result

    def shutdown(self) -> None:
        """Stop the threads (queued calls are cancelled; running ones finish in the
        background). The pool stays usable: the next call starts a new executor."""
        with self._lock:
            old, self._executor = self._executor, None
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)
