"""Lifecycle of sandboxes: this process's live sandboxes, their removal on
exception / SIGINT / SIGTERM / exit, and the reaper for sandboxes whose owner
died (SIGKILL) or whose lifetime expired, and for those the backend itself lost
(`SupportsOrphanReap`: e.g. containers a SIGKILLed dockerd no longer lists).

Backends call `track(id, remove)` when a sandbox exists and `untrack(id)`
once it is deleted; `remove` is a synchronous, idempotent, best-effort
callable (it runs from a signal handler or `atexit`, with no event loop).

Nothing is installed behind the caller's back: a program opts in with

    with sandboxes.lifecycle.cleanup_on_exit():   # or install_cleanup_handlers()
        asyncio.run(main())

CLIs also call `reap_sync()` at start-up to clear what killed runs left.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .interface import SupportsOrphanReap
from .labels import MANAGED, expired, owner_alive
from .results import SandboxInfo

log = logging.getLogger(__name__)


@dataclass
class _Tracked:
    id: str
    remove: Callable[[], None]
    backend: str = ""
    since: float = field(default_factory=time.time)


_live: dict[str, _Tracked] = {}
_lock = threading.RLock()  # re-entrant: the signal handler may interrupt track() on the main thread


def track(sandbox_id: str, remove: Callable[[], None], *, backend: str = "") -> None:
    """Record a live sandbox of this process with a sync, idempotent remover."""
    with _lock:
        _live[sandbox_id] = _Tracked(sandbox_id, remove, backend)


def untrack(sandbox_id: str) -> None:
    with _lock:
        _live.pop(sandbox_id, None)


def live() -> list[str]:
    """Ids of this process's sandboxes not deleted yet."""
    with _lock:
        return list(_live)


def cleanup_all(timeout: float = 30.0) -> int:
    """Remove every tracked sandbox now (in parallel, synchronously); returns how many."""
    with _lock:
        entries = list(_live.values())
        _live.clear()
    if not entries:
        return 0

    def _remove(entry: _Tracked) -> None:
        try:
            entry.remove()
        except Exception as exc:  # best effort: the reaper gets the rest
            log.warning("could not remove sandbox %s: %s", entry.id, exc)

    pool = ThreadPoolExecutor(max_workers=min(16, len(entries)), thread_name_prefix="vf-cleanup")
    try:
        futures = [pool.submit(_remove, entries[0])]
    except RuntimeError:  # from atexit: executors refuse work once threading has shut down; one by one
        for entry in entries:
            _remove(entry)
        return len(entries)
    futures += [pool.submit(_remove, e) for e in entries[1:]]
    deadline = time.monotonic() + timeout
    for fut in futures:
        with contextlib.suppress(Exception):
            fut.result(timeout=max(0.0, deadline - time.monotonic()))
    pool.shutdown(wait=False)
    return len(entries)


class CleanupHandlers:
    """Installed signal handlers + atexit hook; `uninstall()` restores what was there."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM), at_exit: bool = True):
        self._previous: dict[int, object] = {}
        self._at_exit = at_exit
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        if at_exit:
            atexit.register(cleanup_all)

    def _on_signal(self, signum: int, frame) -> None:
        n = cleanup_all()
        log.warning("signal %d: removed %d sandbox(es)", signum, n)
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
            return
        if signum == signal.SIGINT and previous in (signal.default_int_handler, None):
            raise KeyboardInterrupt
        # default disposition: die of the signal, like we never caught it
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            with contextlib.suppress(Exception):
                signal.signal(sig, prev)  # type: ignore[arg-type]
        self._previous.clear()
        if self._at_exit:
            atexit.unregister(cleanup_all)


def install_cleanup_handlers(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM), at_exit: bool = True) -> CleanupHandlers:
    """Remove all sandboxes of this process on SIGINT/SIGTERM (then behave as the
    previous handler would) and at interpreter exit. Call once, from the main thread."""
    return CleanupHandlers(signals, at_exit)


@contextlib.contextmanager
def cleanup_on_exit(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[CleanupHandlers]:
    """Scope in which every sandbox created is removed when the block ends (normally,
    by exception, SIGINT or SIGTERM)."""
    handlers = install_cleanup_handlers(signals, at_exit=True)
    try:
        yield handlers
    finally:
        try:
            cleanup_all()
        finally:
            handlers.uninstall()


# ---------------------------------------------------------------- reaper


def reapable(info: SandboxInfo, now: float | None = None, include_expired: bool = True) -> str | None:
    """Why `info` should be reaped ("owner-dead", "expired") or None."""
    if info.labels.get(MANAGED) != "true":
        return None
    if not owner_alive(info.labels):
        return "owner-dead"
    if include_expired and expired(info.labels, now):
        return "expired"
    return None


def reap_due(info: SandboxInfo, now: float, max_age_seconds: float | None = None) -> bool:
    """A backend's own `reap(max_age_seconds=...)` test: the sandbox expired, its owner
    died, or it is older than `max_age_seconds`."""
    return (expired(info.labels, now) or not owner_alive(info.labels)
            or (max_age_seconds is not None and info.created_at is not None and now - info.created_at > max_age_seconds))


async def delete_run_sandboxes(backend: str | None, options: dict | None, run_id: str,
                               only: Callable[[SandboxInfo], bool] | None = None) -> int:
    """Delete the sandboxes of run `run_id` (its run-id label) on the backend named
    `backend` (made with `options`, closed after); `only` filters them. Returns how many."""
    from .labels import RUN_ID
    from .registry import get_backend

    be = get_backend(backend, **(options or {}))
    try:
        infos = await be.list({MANAGED: "true", RUN_ID: run_id})
        ids = [i.id for i in infos if only is None or only(i)]
        if ids:
            await be.delete_many(ids=ids)
        return len(ids)
    finally:
        await be.close()


async def reap(backend=None, *, dry_run: bool = False, include_expired: bool = True) -> list[tuple[SandboxInfo, str]]:
    """Remove managed sandboxes whose owner process is dead or that expired, and those
    the backend lost ("engine-lost", backends with `reap_orphans`).
    Returns (sandbox, reason) for each one removed (or that would be, with dry_run)."""
    from .registry import get_backend

    own = backend is None or isinstance(backend, str)
    be = get_backend(backend)
    try:
        infos = await be.list({MANAGED: "true"})
        now = time.time()
        doomed = [(i, r) for i in infos if (r := reapable(i, now, include_expired))]
        if doomed and not dry_run:
            await be.delete_many(ids=[i.id for i, _ in doomed])
        if isinstance(be, SupportsOrphanReap):
            lost = await be.reap_orphans(dry_run=dry_run)
            doomed += [(SandboxInfo(id=i, name="", backend=be.name, status="lost"), "engine-lost") for i in lost]
        return doomed
    finally:
        if own:
            await be.close()


def reap_sync(backend: str | None = None, *, quiet: bool = True, **kw) -> list[tuple[SandboxInfo, str]]:
    """`reap` for CLIs at start-up: never raises (a down daemon is reported by the real work)."""
    import asyncio

    try:
        return asyncio.run(reap(backend, **kw))
    except Exception as exc:
        if not quiet:
            raise
        log.debug("reaper skipped: %s", exc)
        return []


def reap_in_background(backend: str | None = None) -> threading.Thread:
    """Start `reap_sync` on a daemon thread: CLIs clear what killed runs left behind
    without delaying their own start (a run never waits for it)."""
    thread = threading.Thread(target=reap_sync, args=(backend,), name="vf-reaper", daemon=True)
    thread.start()
    return thread
