"""`SandboxPool`: keeps `size` ready sandboxes of one spec so that acquiring
one costs a queue pop (milliseconds) instead of a creation.

A released sandbox is deleted (never handed out again dirty) and the pool
refills in the background. Sandboxes idle longer than `max_idle_seconds`
(default: half their lifetime) are replaced rather than handed out, and so
are those already known gone (`Sandbox.known_gone()`: a killed container, a
cell whose host died): one found at acquire drops every other one gone with it.

    async with SandboxPool(spec, size=8, backend="docker") as pool:
        async with pool.sandbox() as sb:
            await sb.exec("pytest -q")
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from .cancel import cancel_and_settle
from .interface import Sandbox, SandboxBackend
from .registry import get_backend
from .spec import SandboxSpec

log = logging.getLogger(__name__)


class SandboxPool:
    """A warm pool of identical sandboxes."""

    def __init__(self, spec: SandboxSpec, size: int, backend: str | SandboxBackend | None = None, *,
                 max_idle_seconds: float | None = None, create_concurrency: int = 4, error_backoff: float = 1.0):
        if size < 0:
            raise ValueError("size must be >= 0")
        self.spec = spec
        self.size = size
        self._own_backend = backend is None or isinstance(backend, str)
        self.backend = get_backend(backend)
        self.max_idle = max_idle_seconds if max_idle_seconds is not None else spec.timeout_minutes * 30
        self.create_concurrency = max(1, create_concurrency)
        self.error_backoff = error_backoff
        self._ready: asyncio.Queue[tuple[float, Sandbox]] = asyncio.Queue()
        self._inflight = 0
        self._tasks: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._filler: asyncio.Task | None = None
        self._closed = False
        self._last_error: BaseException | None = None
        self.stats = {"created": 0, "acquired": 0, "warm": 0, "cold": 0, "errors": 0, "released": 0, "dropped": 0}

    # ---------------------------------------------------------- lifecycle
    async def start(self, wait: bool = False, timeout: float | None = None, ready: int | None = None) -> "SandboxPool":
        """Begin filling; with `wait`, return once `ready` (default: `size`) sandboxes are
        ready; the creation error itself when the first ones all fail."""
        if self._filler is None:
            self._filler = asyncio.create_task(self._fill_loop())
        if wait:
            async with asyncio.timeout(timeout):
                await self._wait_ready(self.size if ready is None else min(ready, self.size))
        return self

    async def _wait_ready(self, n: int) -> None:
        while self._ready.qsize() < n:
            if self._last_error is not None and self.stats["created"] == 0 and self.stats["errors"] >= 3:
                raise self._last_error
            await asyncio.sleep(0.01)

    async def __aenter__(self) -> "SandboxPool":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def ready(self) -> int:
        return self._ready.qsize()

    # ---------------------------------------------------------- filling
    async def _fill_loop(self) -> None:
        while not self._closed:
            deficit = self.size - self._ready.qsize() - self._inflight
            room = self.create_concurrency - self._inflight
            for _ in range(max(0, min(deficit, room))):
                self._inflight += 1
                self._spawn(self._create_one())
            self._wake.clear()
            await self._wake.wait()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _create_one(self) -> None:
        try:
            sb = await self.backend.create(self.spec)
        except Exception as exc:
            self.stats["errors"] += 1
            self._last_error = exc
            log.warning("pool: creating a sandbox failed: %s", exc)
            await asyncio.sleep(self.error_backoff)
            return
        finally:
            self._inflight -= 1
            self._wake.set()
        if self._closed:
            await self._delete(sb)
            return
        self.stats["created"] += 1
        self._ready.put_nowait((time.monotonic(), sb))
        self._wake.set()

    # ---------------------------------------------------------- acquire / release
    async def acquire(self, timeout: float | None = None) -> Sandbox:
        """A ready sandbox (a queue pop when warm); waits for one being created otherwise."""
        if self._closed:
            raise RuntimeError("pool is closed")
        if self._filler is None:
            await self.start()
        cold = self._ready.empty()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ready.empty() and self.size == 0:
                sb = await self.backend.create(self.spec)
                break
            if self._ready.empty():
                cold = True
                self._wake.set()
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                async with asyncio.timeout(left):
                    born, sb = await self._ready.get()
            else:
                born, sb = self._ready.get_nowait()
            if sb.known_gone():  # e.g. its container was killed, or the cell host of a cell
                self._drop_gone(sb)
                cold = True
                continue
            if time.monotonic() - born <= self.max_idle:
                break
            self._spawn(self._delete(sb))  # too old to hand out
            cold = True
        self._wake.set()  # refill
        self.stats["acquired"] += 1
        self.stats["cold" if cold else "warm"] += 1
        return sb

    def _drop_gone(self, sb: Sandbox) -> None:
        """`sb` died while it waited: drop it and every other ready sandbox known gone
        (a dead cell host takes all its pooled cells with it), so no later acquire is
        handed one; the pool refills with new ones."""
        ready = []
        while not self._ready.empty():
            ready.append(self._ready.get_nowait())
        gone = [sb] + [s for _, s in ready if s.known_gone()]
        for item in ready:
            if not item[1].known_gone():
                self._ready.put_nowait(item)
        self.stats["dropped"] += len(gone)
        log.warning("pool: %d ready sandbox(es) of %s were gone (e.g. their host died): dropped, refilling",
                    len(gone), self.spec.image)
        for dead in gone:
            self._spawn(self._delete(dead))
        self._wake.set()

    async def release(self, sb: Sandbox) -> None:
        """Give a sandbox back: it is deleted in the background, never reused."""
        self.stats["released"] += 1
        self._spawn(self._delete(sb))

    @contextlib.asynccontextmanager
    async def sandbox(self, timeout: float | None = None) -> AsyncIterator[Sandbox]:
        sb = await self.acquire(timeout)
        try:
            yield sb
        finally:
            await self.release(sb)

    async def _delete(self, sb: Sandbox) -> None:
        try:
            await sb.delete()
        except Exception as exc:
            log.warning("pool: deleting %s failed: %s", sb.name, exc)

    async def close(self) -> None:
        """Stop refilling and delete every sandbox the pool holds."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._filler is not None:
            await cancel_and_settle([self._filler])
        doomed = []
        while not self._ready.empty():
            doomed.append(self._ready.get_nowait()[1])
        await asyncio.gather(*(self._delete(sb) for sb in doomed))
        if self._tasks:  # creations finish (and delete what they made), deletions finish
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._own_backend:
            await self.backend.close()
