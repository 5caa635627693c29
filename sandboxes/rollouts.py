"""`RolloutSandboxes`: the one sandbox lifecycle of a run, owned by the framework.

Every env that gives rollouts sandboxes (SandboxEnv / PythonEnv, the v1 harness,
OpenEnvEnv, SWEDebugEnv) asks one of these for them and gives them back; no env
holds a backend, warm pool or rollout isolation of its own (the way inspect_ai's
framework owns its sandboxes and its tasks never do).

    sandboxes = RolloutSandboxes(spec, "docker", rollout_isolation="auto", pool_size=None)
    sandboxes.set_concurrency(16)              # sizes the default warm pool
    sandboxes.expect(64)                       # 64 more acquisitions coming: the pool opens no more
    await sandboxes.warm_up()                  # optional: pool (and cell host) ready first
    sb = await sandboxes.acquire()             # the run's spec: from the pool when warm
    sb2 = await sandboxes.acquire(other_spec)  # another spec: created for this rollout
    await sandboxes.release(sb)                # deleted (never reused); the pool refills
    group = await sandboxes.prepare_group(setup)  # a rollout group's sandboxes: setup once, then forks
    sb3, prepared = await group.acquire()      # a fork of the prepared sandbox (sandboxes.group_setup)
    await sandboxes.close()                    # whatever is still held, the pool, snapshots, the backend

What it decides, once, in one place:

* the backend: made lazily from a registered name + options (or an instance given,
  which is the caller's to close and is never replaced). `set_backend` with a
  different backend is refused (ConfigError) once a sandbox was made; before that
  it applies. An instance given at construction is kept (`set_backend` is a no-op).
* rollout isolation: "container", "namespace" (a cell of a pooled host container,
  `sandboxes.cells`) or "auto": a cell per rollout when the backend offers cells
  for the run's spec (`SupportsCells.cells_available`, which applies
  `sandboxes.cells.AUTO_HARDENING`), else a container; decided at the first
  sandbox and kept. Specs other than the run's are containers under "auto".
* the warm pool (`SandboxPool`) of the run's spec: `pool_size` when given (0: none),
  else sized from the concurrency once known: one per running rollout (at most
  `max_default_pool_size`), two per running rollout for cells (they are cheap).
  The spec cannot change once the pool started (its sandboxes have the old one).
  Demand (`expect(n)`: n more acquisitions are coming; `Environment.generate` says how
  many rollouts it runs): the pool keeps at most the acquisitions still to come ready
  or being made (plus those waiting for one), so a run ends with no sandbox opened for
  nothing; an acquisition past the expectation gets a fresh one made for it. No
  expectation given (a library user): the pool keeps its size until closed.

* group setup (`prepare_group`, `sandboxes.group_setup.PreparedGroup`): one sandbox of
  the run's spec (pool / cell as above), a setup run in it once, its filesystem frozen
  (`Sandbox.snapshot()`) and the sandbox deleted; each rollout of the group then gets a
  fork (`acquire_fork`), tracked like any acquired sandbox. Where the backend has no
  snapshots (`SnapshotUnsupported`) the run falls back to a setup per rollout: logged
  once (a warning), the reason kept in `group_setup_note`, never an error.

Cleanup: sandboxes are tracked by their backend in `sandboxes.lifecycle` (removed on
SIGINT / SIGTERM / exit where a program opted in, reaped when the owner died);
`close()` deletes what is still held here, the snapshots made here, drains the pool and
closes a backend it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from .errors import ConfigError, SnapshotUnsupported
from .group_setup import PreparedGroup
from .interface import Sandbox, SandboxBackend, SupportsCells, SupportsSnapshots, create_from_snapshot_many
from .pool import SandboxPool
from .registry import get_backend
from .snapshots import Snapshot
from .spec import SandboxSpec

log = logging.getLogger(__name__)

RolloutIsolationChoice = Literal["auto", "container", "namespace"]
ROLLOUT_ISOLATION_CHOICES: tuple[str, ...] = ("auto", "container", "namespace")

SpecHook = Callable[[SandboxSpec], Awaitable[SandboxSpec]]
OptionsHook = Callable[[str | None, dict[str, Any]], dict[str, Any]]
PrepareHook = Callable[[Sandbox], Awaitable[None]]


async def _same(spec: SandboxSpec) -> SandboxSpec:
    return spec


class RolloutSandboxes:
    """Sandboxes for a run's rollouts: one backend, one rollout isolation, one warm pool."""

    max_default_pool_size: int = 32
    """Cap of the pool sized from concurrency (an explicit `pool_size` is not capped)."""
    cells_per_rollout: int = 2
    """Ready cells kept per running rollout: a cell costs ~15 ms of the host's CPU to open and
    close and a few MB idle. Two: at -c 16 a host of 64 cells holds the 16 running, the 32
    ready and the cells being closed; with three (48 ready) the first refill after the first
    wave overflowed it and started a second cell host in every run (~0.4 s of CPU on 2 cores,
    plus 16 more idle cells opened and closed). Rollout time spent waiting for a cell at
    -c 16 (create share), cold and warm: 0 % on a lightly loaded machine with two as with
    three; under heavy load from other work both left rollouts waiting at times (up to 16 %
    with two, 20 % with three, in this session's runs)."""

    cell_opens_in_flight: int = 8
    """Cells the warm pool opens at once. A cell host's zygote takes opens one at a time, so
    more only queue there while their cells build side by side on the CPU the running
    rollouts (and the first wave, cold) need; the pool also ends a fast run with fewer idle
    cells opened for nothing. Measured cold, 64 x 3 rollouts at -c 16 on 2 cores loaded by
    other work (load 9-17): mean wall 2.01 s over 9 runs with 8, 2.36 s over 6 with all 32 at
    once; 75-94 cells opened instead of 96; rollout time waiting for a cell 0-24 % (mean 8 %)
    with 8, 0-20 % (mean 6 %) with 32."""

    def __init__(self, spec: SandboxSpec, backend: str | SandboxBackend | None = None,
                 backend_options: dict[str, Any] | None = None, *,
                 rollout_isolation: str = "container", pool_size: int | None = None,
                 resolve: SpecHook | None = None, backend_options_for: OptionsHook | None = None):
        """`spec`: the run's sandbox (with "auto", its `rollout_isolation` is decided here);
        `resolve`: rewrites a spec before creation (PythonEnv's derived image);
        `backend_options_for(name, options)`: the options the backend is made with (checked
        when it is made, e.g. a Prime team id)."""
        self.spec = spec
        self.rollout_isolation = check_rollout_isolation(rollout_isolation)
        self.pool_size = check_pool_size(pool_size)
        self.concurrency: int | None = None
        self._resolve = resolve or _same
        self._options_for = backend_options_for
        self._backend_arg = backend
        self._backend_options = dict(backend_options or {})
        self._backend: SandboxBackend | None = None
        self._cells_auto: bool | None = None  # "auto" decided (for the run's spec)
        self._pool: SandboxPool | None = None
        self._lock: asyncio.Lock | None = None
        self._held: dict[str, tuple[Sandbox, bool]] = {}  # id -> (sandbox, from the pool)
        self._snapshots: dict[str, tuple[Snapshot, SupportsSnapshots]] = {}  # made here, not released yet
        self.forks_per_group = False
        """The rollouts' sandboxes are forks of a group's prepared one (`set_forks_per_group`):
        no default warm pool."""
        self.group_setup_note: str | None = None
        """Set when a group setup fell back to a setup per rollout: why (no snapshots here)."""
        self.expected: int | None = None
        """Acquisitions still expected (`expect`); None: no expectation (the pool keeps its size)."""
        self._waiting = 0  # acquisitions waiting in the pool for a sandbox
        self._made_here = 0  # sandboxes `acquire` created itself (not the pool's)

    # ---------------------------------------------------------------- configuration
    @property
    def backend_given(self) -> bool:
        """A backend instance was given (kept, never replaced, never closed here)."""
        return self._backend_arg is not None and not isinstance(self._backend_arg, str)

    @property
    def started(self) -> bool:
        """A backend was made (a sandbox exists or did) or the pool started."""
        return self._backend is not None or self._pool is not None

    def set_backend(self, backend: str | SandboxBackend | None, options: dict[str, Any] | None = None) -> None:
        """Use this backend for the rollouts. Applies before the first sandbox; a different
        one afterwards is refused (ConfigError): sandboxes never move between backends
        mid-run. An instance given at construction is kept (this is then a no-op)."""
        if self.backend_given:
            return
        options = dict(options or {})
        if (backend, options) == (self._backend_arg, self._backend_options):
            return
        if self.started:
            raise ConfigError("set_backend() after the first sandbox was created: the run's sandboxes "
                              f"are on {self.backend_name!r}; set the backend before the first rollout")
        self._backend_arg, self._backend_options = backend, options

    @property
    def backend_name(self) -> str | None:
        if self._backend is not None:
            return getattr(self._backend, "name", None)
        return self._backend_arg if isinstance(self._backend_arg, str) or self._backend_arg is None else \
            getattr(self._backend_arg, "name", None)

    @property
    def backend_options(self) -> dict[str, Any]:
        return dict(self._backend_options)

    @property
    def backend(self) -> SandboxBackend:
        """The run's backend (made on first use)."""
        if self._backend is None:
            options = dict(self._backend_options)
            if self._options_for is not None and not self.backend_given:
                options = self._options_for(self._backend_arg if isinstance(self._backend_arg, str) else None, options)
            self._backend = get_backend(self._backend_arg, **options)
        return self._backend

    def set_spec(self, spec: SandboxSpec, rollout_isolation: str | None = None) -> None:
        """Change the run's spec (and isolation choice) before the pool started; refused after."""
        mode = check_rollout_isolation(rollout_isolation or self.rollout_isolation)
        if mode != self.rollout_isolation and self._cells_auto is not None:
            raise ConfigError("cannot change rollout_isolation after the first sandbox was made")
        if spec != self.spec and self._pool is not None:  # its sandboxes were made from the old spec
            raise ConfigError("cannot change sandbox settings after the warm pool was started")
        self.spec, self.rollout_isolation = spec, mode

    def set_pool_size(self, pool_size: int | None) -> None:
        """Ready sandboxes kept (None: sized from the concurrency; 0: none), before the pool starts."""
        pool_size = check_pool_size(pool_size)
        if pool_size != self.pool_size and self._pool is not None:
            raise ConfigError("cannot change pool_size after the warm pool was started")
        self.pool_size = pool_size

    def set_forks_per_group(self, forks: bool) -> None:
        """The run's rollouts get forks of their group's prepared sandbox (`prepare_group`):
        the default warm pool is off (a rollout never takes from it; idle pooled cells would
        take the room a cell's forks need in its host). An explicit `pool_size` still applies."""
        if bool(forks) != self.forks_per_group and self._pool is not None and self.pool_size is None:
            raise ConfigError("cannot change the setup scope after the warm pool was started")
        self.forks_per_group = bool(forks)

    def set_concurrency(self, concurrency: int | None) -> None:
        """Rollouts run at once: sizes the default warm pool."""
        self.concurrency = None if concurrency is None else max(1, int(concurrency))

    def rollout_isolation_in_use(self) -> str:
        """What one rollout's sandbox is: "container" or "namespace" ("auto" until decided)."""
        if self.rollout_isolation != "auto":
            return self.spec.rollout_isolation
        if self._cells_auto is None:
            return "auto"
        return "namespace" if self._cells_auto else "container"

    @property
    def effective_pool_size(self) -> int:
        """Ready sandboxes kept: `pool_size` when given, else sized from the concurrency once
        known (0 before: one creation per rollout)."""
        if self.pool_size is not None:
            return self.pool_size
        if not self.concurrency or self.forks_per_group:
            return 0
        if self.rollout_isolation_in_use() == "namespace":
            return min(self.cells_per_rollout * self.concurrency, self.cells_per_rollout * self.max_default_pool_size)
        return min(self.concurrency, self.max_default_pool_size)

    def expect(self, acquisitions: int) -> None:
        """`acquisitions` more `acquire` calls are coming (a run's rollouts): the warm pool then
        keeps at most the acquisitions still to come ready or being made (plus those waiting
        for one), never more than its size. Adds to what is still expected (overlapping
        runs); an acquisition past it gets a sandbox made for it, as a pool-less one would."""
        if isinstance(acquisitions, bool) or not isinstance(acquisitions, int) or acquisitions < 0:
            raise ConfigError(f"expect(n) needs an integer n >= 0, got {acquisitions!r}")
        self.expected = (self.expected or 0) + acquisitions
        self._fit_pool()

    def _pool_target(self) -> int:
        """Sandboxes the pool keeps ready or being made: its size, capped by the demand left
        (the acquisitions still expected plus those waiting for a sandbox now)."""
        size = self.effective_pool_size
        return size if self.expected is None else min(size, self.expected + self._waiting)

    def _fit_pool(self) -> None:
        """The started pool's refill target follows the demand left (`_pool_target`). A raise
        is seen by the acquisition that caused it (it wakes the pool's filler)."""
        if self._pool is not None:
            self._pool.size = self._pool_target()

    @property
    def opened(self) -> int:
        """Sandboxes of the run's rollouts made so far: by the warm pool (while it is open)
        and by `acquire` itself (forks and group sources made from snapshots not counted)."""
        return self._made_here + (self._pool.stats["created"] if self._pool is not None else 0)

    # ---------------------------------------------------------------- isolation and pool
    async def rollout_spec(self, spec: SandboxSpec) -> SandboxSpec:
        """The run's spec (resolved) with "auto" decided: cells where the backend offers them
        for it, else a container per rollout. Decided once."""
        if self.rollout_isolation != "auto":
            return spec
        if self._cells_auto is None:
            async with self._guard():
                if self._cells_auto is None:
                    backend = self.backend
                    self._cells_auto = isinstance(backend, SupportsCells) and await backend.cells_available(spec)
                    log.info("rollout_isolation='auto': %s", "a cell per rollout (namespace)" if self._cells_auto
                             else "a container per rollout")
        return spec.model_copy(update={"rollout_isolation": "namespace"}) if self._cells_auto else spec

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @property
    def pool(self) -> SandboxPool | None:
        """The warm pool once started (None before and without one)."""
        return self._pool

    async def start_pool(self) -> SandboxPool | None:
        """Start the warm pool of the run's spec (None when its size is 0). Cells cost
        milliseconds: the cell host and the first wave's cells are made before this
        returns, so none is on a rollout's path; containers fill behind the rollouts."""
        if self._pool is None and self.effective_pool_size > 0:
            resolved = await self.rollout_spec(await self._resolve(self.spec))
            async with self._guard():
                if self._pool is None:
                    size, target = self.effective_pool_size, self._pool_target()
                    cells = resolved.rollout_isolation == "namespace"
                    pool = SandboxPool(resolved, target, backend=self.backend,
                                       create_concurrency=min(size, self.cell_opens_in_flight) if cells else max(4, size))
                    self._pool = pool
                    first_wave = min(target, self.concurrency or size) if cells else 0
                    await pool.start(wait=first_wave > 0, ready=first_wave, timeout=300.0)
        return self._pool

    async def warm_up(self, timeout: float | None = 300.0) -> int:
        """Fill the warm pool before the first rollout asks and return how many sandboxes are
        ready (0 without a pool); with cells that also starts the cell host."""
        pool = await self.start_pool()
        if pool is None:
            return 0
        await pool.start(wait=True, timeout=timeout)  # its target: capped by an expectation
        return pool.ready

    def pooled(self, spec: SandboxSpec | None) -> bool:
        """Would `acquire(spec)` come from the warm pool?"""
        return self.effective_pool_size > 0 and (spec is None or spec == self.spec)

    # ---------------------------------------------------------------- sandboxes
    async def acquire(self, spec: SandboxSpec | None = None, *, key: str | None = None,
                      hold: bool = True, warm: bool = True) -> Sandbox:
        """A sandbox for one rollout: of the run's spec (`spec` None or equal) from the warm
        pool when there is one (`warm=False`: always created), else created (`key`: the
        creation's idempotency key). With `hold=False` the caller deletes it itself
        (close() does not). A held one counts as one of the acquisitions `expect`ed (a
        rollout's sandbox; `hold=False` ones are a program's extras)."""
        if self.expected and hold:
            self.expected -= 1
        if warm and self.pooled(spec):
            pool = await self.start_pool()
            assert pool is not None
            sandbox, pooled = await self._from_pool(pool), True
        else:
            own = spec is None or spec == self.spec
            resolved = await self._resolve(self.spec if spec is None else spec)
            if own:
                resolved = await self.rollout_spec(resolved)
            sandbox, pooled = await self.backend.create(resolved, idempotency_key=key or None), False
            self._made_here += 1
        if hold:
            self._held[sandbox.id] = (sandbox, pooled)
        return sandbox

    async def _from_pool(self, pool: SandboxPool) -> Sandbox:
        """A ready sandbox of the pool, counted as waiting while it waits (the pool's target
        then covers it: past the expectation the pool makes one for it)."""
        self._waiting += 1
        self._fit_pool()
        try:
            return await pool.acquire()
        finally:
            self._waiting -= 1
            self._fit_pool()

    async def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back: deleted (in the background when it came from the pool), never
        reused. Raises what the deletion raised; the sandbox is then still held (close()
        tries again)."""
        _, pooled = self._held.get(sandbox.id, (sandbox, False))
        if pooled and self._pool is not None:
            await self._pool.release(sandbox)
        else:
            await sandbox.delete()
        self._held.pop(sandbox.id, None)

    @contextlib.asynccontextmanager
    async def sandbox(self, spec: SandboxSpec | None = None, *, key: str | None = None) -> AsyncIterator[Sandbox]:
        """One rollout's sandbox for the block: released however it ends."""
        sb = await self.acquire(spec, key=key)
        try:
            yield sb
        finally:
            await asyncio.shield(self.release(sb))

    # ---------------------------------------------------------------- group setup (forks)
    async def prepare_group(self, prepare: PrepareHook, spec: SandboxSpec | None = None) -> PreparedGroup:
        """A rollout group's sandboxes from one prepared sandbox: acquire one of `spec` (the
        run's by default: pool / cell as `acquire`), run `prepare(sandbox)` in it once,
        snapshot it and delete it; `group.acquire()` then gives each rollout a fork.
        Where the backend has no snapshots the group is in "rollout" mode (the prepared
        sandbox goes to its first rollout, the others get fresh ones and set up
        themselves): warned once per lifecycle, `group_setup_note` says why; once seen,
        later groups skip the preparation. Raises what `prepare` or the creation raised
        (the sandbox made is deleted first)."""
        if self.group_setup_note is not None:
            return PreparedGroup(self, spec, "rollout", reason=self.group_setup_note)
        source = await self.acquire(spec)
        try:
            await prepare(source)
            snap = await source.snapshot()
        except SnapshotUnsupported as exc:
            self._note_no_snapshots(str(exc))
            return PreparedGroup(self, spec, "rollout", source=source, reason=str(exc))
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release(source))
            raise
        backend = source.snapshot_backend
        if backend is None:  # a snapshot with nobody to create from: the contract says this cannot be
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release(source))
            raise SnapshotUnsupported(f"the {source.backend_name} sandbox made a snapshot but has no backend to "
                                      "create forks from (snapshot_backend is None)")
        self._snapshots[snap.id] = (snap, backend)
        try:
            await asyncio.shield(self.release(source))  # the forks need only the snapshot
        except Exception as exc:
            log.warning("deleting the group's prepared sandbox %s failed (close retries): %s", source.id, exc)
        return PreparedGroup(self, spec, "fork", snapshot=snap)

    def _note_no_snapshots(self, reason: str) -> None:
        if self.group_setup_note is None:
            log.warning("setup per group asked for, but %s: every rollout sets up its own sandbox instead "
                        "(the run goes on; rows have sandbox_forked = 0)", reason)
        self.group_setup_note = reason

    async def acquire_fork(self, snapshot: Snapshot) -> Sandbox:
        """A new sandbox of a snapshot made by `prepare_group` (held: `release` deletes it)."""
        made = self._snapshots.get(snapshot.id)
        if made is None:
            raise ConfigError(f"snapshot {snapshot.id} was not made by this run's lifecycle (or was released)")
        sandbox = await made[1].create_from_snapshot(snapshot)
        self._held[sandbox.id] = (sandbox, False)
        return sandbox

    async def acquire_group(self, n: int, prepare: PrepareHook, spec: SandboxSpec | None = None) -> list[Sandbox]:
        """`n` sandboxes at once, each holding the state `prepare` left in one sandbox
        (`prepare_group`, then `n` forks made concurrently, all or none); without
        snapshots, the prepared sandbox and `n - 1` fresh ones each prepared here.
        Each is held (`release` deletes it). The snapshot is released before returning."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"acquire_group(n) needs an integer n >= 1, got {n!r}")
        group = await self.prepare_group(prepare, spec)
        try:
            if group.mode == "fork":
                assert group.snapshot is not None
                forks = await create_from_snapshot_many(self._snapshots[group.snapshot.id][1], group.snapshot, n)
                for sb in forks:
                    self._held[sb.id] = (sb, False)
                return forks
            made: list[Sandbox] = []
            try:
                for _ in range(n):
                    sb, prepared = await group.acquire()
                    made.append(sb)
                    if not prepared:
                        await prepare(sb)
            except BaseException:
                await asyncio.shield(asyncio.gather(*(self.release(sb) for sb in made), return_exceptions=True))
                raise
            return made
        finally:
            await asyncio.shield(group.close())

    async def release_snapshot(self, snapshot: Snapshot) -> None:
        """Release a snapshot made here (its forks keep running; see `delete_snapshot`)."""
        made = self._snapshots.pop(snapshot.id, None)
        if made is not None:
            try:
                await made[1].delete_snapshot(snapshot)
            except Exception as exc:
                log.warning("releasing snapshot %s failed (the run's end removes it): %s", snapshot.id, exc)

    @property
    def snapshots(self) -> list[str]:
        """Ids of snapshots made here and not released yet."""
        return list(self._snapshots)

    @property
    def held(self) -> list[str]:
        """Ids of sandboxes handed out and not released yet."""
        return list(self._held)

    async def delete_many(self, ids: list[str]) -> None:
        """Delete these sandboxes at once (forgotten here)."""
        for sid in ids:
            self._held.pop(sid, None)
        await self.backend.delete_many(ids=list(ids))

    async def close(self) -> None:
        """Delete every sandbox still held (also after Ctrl-C), drain the pool, close a backend
        made here. The object can be used again afterwards (a new backend is made)."""
        ids = list(self._held)
        self._held.clear()
        if ids:
            try:
                await self.backend.delete_many(ids=ids)
            except Exception as exc:
                # e.g. at interpreter exit the backend's connections belong to a closed loop:
                # try once more with a fresh backend of the same name
                log.warning("bulk delete of %d sandboxes failed (%s); retrying with a new backend", len(ids), exc)
                if not self.backend_given:
                    fresh = get_backend(self._backend_arg, **self._backend_options)
                    try:
                        await fresh.delete_many(ids=ids)
                    except Exception as exc2:
                        log.warning("sandboxes %s may be left behind: %s", ids, exc2)
                    finally:
                        with contextlib.suppress(Exception):
                            await fresh.close()
        snapshots = list(self._snapshots.values())
        self._snapshots.clear()
        for snap, backend in snapshots:  # after their forks: a Docker image goes once unused
            try:
                await backend.delete_snapshot(snap)
            except Exception as exc:
                log.warning("snapshot %s may be left behind (the reaper removes it): %s", snap.id, exc)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with contextlib.suppress(Exception):
                await pool.close()
        if self._backend is not None and not self.backend_given:
            backend, self._backend = self._backend, None
            with contextlib.suppress(Exception):
                await backend.close()
        self._lock = None
        self.expected = None  # a run that goes on expects again


def check_rollout_isolation(mode: str) -> str:
    if mode not in ROLLOUT_ISOLATION_CHOICES:
        raise ConfigError(f"rollout_isolation must be one of {', '.join(ROLLOUT_ISOLATION_CHOICES)}, got {mode!r}")
    return mode


def check_pool_size(pool_size: int | None) -> int | None:
    if pool_size is not None and int(pool_size) < 0:
        raise ConfigError(f"pool_size must be >= 0 (0 = no warm pool), got {pool_size}")
    return None if pool_size is None else int(pool_size)
