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

A thread hop costs ~0.2 ms of CPU (futures, a loop wake-up, GIL hand-overs):
more than a trivial reward function itself. So the pool measures: a sync
callable whose last `inline_after` (8) runs in the pool each took under
`fast_s` (1 ms) of wall time runs on the loop from then on (with a copied
context, as in the pool), and is sent back to the pool for good the first
time an inline run takes over `slow_s` (5 ms). A function that blocks (a
`time.sleep`, a subprocess, a network call) is never run on the loop; one
that is fast at first and slow later stalls the loop once. `adaptive=False`
keeps every sync call in the pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("envs.sync_pool")


def is_async_callable(fn: Any) -> bool:
    """True for coroutine functions (also bound, partial-wrapped, or an async `__call__`)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


class _Record:
    """What the pool has seen of one callable."""

    __slots__ = ("fast_runs", "demoted")

    def __init__(self) -> None:
        self.fast_runs = 0  # consecutive pool runs under fast_s
        self.demoted = False  # ran slow on the loop once: the pool from now on


class SyncPool:
    """A resizable, lazily created thread pool for sync user callables."""

    inline_after = 8  # fast pool runs in a row before a callable runs on the loop
    fast_s = 0.001  # a pool run this short counts as fast
    slow_s = 0.005  # an inline run this long sends the callable back to the pool for good

    def __init__(self, size: int, name: str = "vf-sync", adaptive: bool = True):
        self._size = max(1, int(size))
        self._name = name
        self.adaptive = adaptive
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._records: dict[Any, _Record] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (an env sent to a worker process): only the settings travel."""
        return {"_size": self._size, "_name": self._name, "adaptive": self.adaptive}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_size"], state["_name"], state.get("adaptive", True))  # type: ignore[misc]

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
        ctx = contextvars.copy_context()
        rec = self._record(fn)
        if rec is not None and not rec.demoted and rec.fast_runs >= self.inline_after:
            t0 = time.perf_counter()
            try:
                result = ctx.run(fn, *args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                if took > self.slow_s:
                    rec.demoted = True
                    log.info("%s took %.0f ms on the event loop; it runs in the thread pool from now on",
                             getattr(fn, "__qualname__", fn), took * 1000)
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._get(), functools.partial(_timed, rec, self.fast_s, ctx.run, fn,
                                                                               *args, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result

    def _record(self, fn: Callable[..., Any]) -> _Record | None:
        """The record of `fn` (None: not adaptive, or a callable that cannot be a key)."""
        if not self.adaptive:
            return None
        try:
            rec = self._records.get(fn)
        except TypeError:  # unhashable callable object
            return None
        if rec is None:
            if len(self._records) >= 4096:  # fresh callables per call (lambdas, partials): stop learning
                return None
            rec = self._records[fn] = _Record()
        return rec

    def shutdown(self) -> None:
        """Stop the threads (queued calls are cancelled; running ones finish in the
        background). The pool stays usable: the next call starts a new executor."""
        with self._lock:
            old, self._executor = self._executor, None
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)


def _timed(rec: _Record | None, fast_s: float, run: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run in a pool thread and count whether it was fast (wall time: a sleep is slow)."""
    t0 = time.perf_counter()
    try:
        return run(*args, **kwargs)
    finally:
        if rec is not None:
            rec.fast_runs = rec.fast_runs + 1 if time.perf_counter() - t0 < fast_s else 0
