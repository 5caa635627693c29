"""Lifecycle of sandboxes: this process's live sandboxes, their removal on
exception / SIGINT / SIGTERM / exit, and the reaper for sandboxes whose owner
died (SIGKILL) or whose lifetime expired, and for those the backend itself lost
(`SupportsOrphanReap`: e.g. containers a SIGKILLed dockerd no longer lists).

Backends call `track(id, remove)` when a sandbox exists and `untrack(id)`
once it is deleted; `remove` is a synchronous, idempotent, best-effort
callable (it runs from a signal handler or `atexit`, with no event loop).
Two more kinds of entries: "pending" (a creation the engine may still be
completing: its remover waits a moment for it) and "snapshot" (a snapshot of
this run: removed after every sandbox, since sandboxes may be made of it).
`live()` lists sandboxes only; `live_snapshots()` the snapshots.

Nothing is installed behind the caller's back: a program opts in with

    with sandboxes.lifecycle.cleanup_on_exit():   # or install_cleanup_handlers()
        asyncio.run(main())

CLIs also call `reap_sync()` at start-up to clear what killed runs left.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from .interface import SupportsOrphanReap, SupportsSnapshots
from .labels import MANAGED, SNAPSHOT_KEEP, expired, owner_alive
from .results import SandboxInfo

log = logging.getLogger(__name__)


TrackedKind = Literal["sandbox", "pending", "snapshot"]


@dataclass
class _Tracked:
    id: str
    remove: Callable[[], None]
    backend: str = ""
    since: float = field(default_factory=time.time)
    kind: TrackedKind = "sandbox"


_live: dict[str, _Tracked] = {}
_lock = threading.RLock()  # re-entrant: the signal handler may interrupt track() on the main thread


def track(sandbox_id: str, remove: Callable[[], None], *, backend: str = "", kind: TrackedKind = "sandbox") -> None:
    """Record a live sandbox (or a pending creation, a snapshot: `kind`) of this process
    with a sync, idempotent remover. Snapshot ids are kept apart from sandbox ids."""
    with _lock:
        _live[_key(sandbox_id, kind)] = _Tracked(sandbox_id, remove, backend, kind=kind)


def untrack(sandbox_id: str, kind: TrackedKind = "sandbox") -> None:
    with _lock:
        _live.pop(_key(sandbox_id, kind), None)


def _key(ident: str, kind: TrackedKind) -> str:
    return ident if kind == "sandbox" else f"{kind}:{ident}"


def live() -> list[str]:
    """Ids of this process's sandboxes not deleted yet."""
    with _lock:
        return [e.id for e in _live.values() if e.kind == "sandbox"]


def live_snapshots() -> list[str]:
    """Ids of this process's snapshots not deleted yet (kept ones are not tracked)."""
    with _lock:
        return [e.id for e in _live.values() if e.kind == "snapshot"]


def cleanup_all(timeout: float = 30.0) -> int:
    """Remove every tracked sandbox now (in parallel, synchronously), then every tracked
    snapshot (sandboxes may run of them); returns how many entries were removed."""
    with _lock:
        entries = list(_live.values())
        _live.clear()
    if not entries:
        return 0
    deadline = time.monotonic() + timeout
    first = [e for e in entries if e.kind != "snapshot"]
    then = [e for e in entries if e.kind == "snapshot"]
    if first:
        _remove_all(first, deadline)
    if then:
        _remove_all(then, max(deadline, time.monotonic() + 10.0))
    return len(entries)


REMOVERS = 16  # removals run at once


def _remove_all(entries: list[_Tracked], deadline: float) -> None:
    """Run the removers of `entries`, REMOVERS at a time, until done or `deadline` (monotonic).

    Signal-safe: this runs in a signal handler, which may have interrupted the main thread
    anywhere, also while it held a lock of the standard library (a thread pool's global
    lock in `ThreadPoolExecutor.submit`, threading's own in `Thread.start`). Waiting on such
    a lock here would wait forever (the process ignored SIGTERM), so: no thread pool and no
    `threading.Thread`, but low-level threads, locks of its own, and only waits with a
    deadline (a remover that blocks on a lock the main thread holds is given up on)."""
    queue = list(entries)
    left = [len(queue)]  # entries not removed yet (or given up on by their remover)
    guard = _thread.allocate_lock()  # over queue and left
    finished = _thread.allocate_lock()
    finished.acquire()  # released once left is 0

    def take() -> _Tracked | None:
        with guard:
            return queue.pop() if queue else None

    def remove_until_empty() -> None:
        while (entry := take()) is not None:
            try:
                _remove(entry)
            finally:
                with guard:
                    left[0] -= 1
                    if left[0] == 0:
                        finished.release()

    for _ in range(min(REMOVERS, len(queue))):
        try:
            _thread.start_new_thread(remove_until_empty, ())
        except RuntimeError:  # the interpreter is shutting down (atexit): the rest here, one by one
            remove_until_empty()
            break
    finished.acquire(timeout=max(0.0, deadline - time.monotonic()))


def _remove(entry: _Tracked) -> None:
    try:
        entry.remove()
    except Exception as exc:  # best effort: the reaper gets the rest
        log.warning("could not remove sandbox %s: %s", entry.id, exc)


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


def snapshot_reapable(labels: dict[str, str]) -> str | None:
    """Why a snapshot with these labels should be reaped ("owner-dead") or None: ours,
    not kept, and its owner process is dead. Snapshots have no deadline of their own."""
    if labels.get(MANAGED) != "true" or labels.get(SNAPSHOT_KEEP) == "true":
        return None
    return None if owner_alive(labels) else "owner-dead"


async def delete_run_sandboxes(backend: str | None, options: dict | None, run_id: str,
                               only: Callable[[SandboxInfo], bool] | None = None) -> int:
    """Delete the sandboxes of run `run_id` (its run-id label) on the backend named
    `backend` (made with `options`, closed after); `only` filters them. Returns how many.
    Without `only`, the run's snapshots go too (kept ones stay)."""
    from .labels import RUN_ID
    from .registry import get_backend

    be = get_backend(backend, **(options or {}))
    try:
        infos = await be.list({MANAGED: "true", RUN_ID: run_id})
        ids = [i.id for i in infos if only is None or only(i)]
        if ids:
            await be.delete_many(ids=ids)
        if only is None and isinstance(be, SupportsSnapshots):
            snaps = await be.list_snapshots({MANAGED: "true", RUN_ID: run_id})
            for snap in snaps:
                if not snap.keep:
                    await be.delete_snapshot(snap)
        return len(ids)
    finally:
        await be.close()


async def reap(backend=None, *, dry_run: bool = False, include_expired: bool = True) -> list[tuple[SandboxInfo, str]]:
    """Remove managed sandboxes whose owner process is dead or that expired, and those
    the backend lost ("engine-lost", backends with `reap_orphans`), then the snapshots
    (not kept) whose owner process is dead ("owner-dead", status "snapshot").
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
        if isinstance(be, SupportsSnapshots):
            for snap in await be.list_snapshots({MANAGED: "true"}):
                why = snapshot_reapable(snap.labels)
                if why is None:
                    continue
                if not dry_run:
                    await be.delete_snapshot(snap)
                doomed.append((snapshot_info(snap), why))
        return doomed
    finally:
        if own:
            await be.close()


def snapshot_info(snap) -> SandboxInfo:
    """A snapshot shown in a sandbox listing (status "snapshot", name: what it was taken from)."""
    return SandboxInfo(id=snap.id, name=f"snapshot of {snap.source_id[:12]}", backend=snap.backend,
                       status="snapshot", image=snap.image or "", labels=snap.labels, created_at=snap.created_at)


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
