"""Rollout isolation "namespace": sandboxes that are *cells* of a pooled cell host.

`SandboxSpec.rollout_isolation = "namespace"` asks a backend for a sandbox as
fresh and isolated from other rollouts as a new container, made in
milliseconds: the backend keeps a few *cell hosts* (ordinary sandboxes of the
same image whose agent runs with `--cells` and holds the privilege to build
namespaces) and `CellHosts.create` opens a cell in one of them. The cell is a
private overlay of the image, its own PID / IPC / UTS / network namespaces,
cgroup limits (the spec's pids, memory, cpu), environment and user; nothing
in it holds a capability (see `agent/cells_program.py`). A `CellSandbox` is a
full `Sandbox` (its agent is a copy of the usual one, reached through the
host's channel); deleting it kills every process of the cell and frees its
files.

Hosts are created on demand (one per distinct host-shaping spec, up to
`cells_per_host` cells each; a full host whose cells are being closed takes the
next cell once one is gone, ROOM_WAIT_SECONDS at most, rather than a new host
starting for a moment's overflow), admit cells for `admit_seconds(spec)` (the
spec's lifetime, at most ADMIT_SECONDS_MAX) and live that long plus one cell
lifetime plus HOST_SLACK_SECONDS (so every cell gets its full lifetime), are
deleted once drained, and are ordinary labelled sandboxes: the reaper and
`vf-sandbox` cleanup see them like any other. A host found dead (its agent's
channel closed: the container was killed) is forgotten at once: no cell is
opened in it again, its open cells are dropped from the listing, and the next
cell comes from a new host. A host whose client went away (even SIGKILLed)
ends itself: the backend runs its agent so that the container ends with it.

Snapshots of cells (kind "layer", issue 28): `CellSandbox.snapshot()` has the host
agent freeze the cell's writable layer into a read-only layer of the host (one copy,
no image build); `CellHosts.create_from_snapshot` opens a cell of the same host that
stacks it over the image (O(1) per fork: an overlay mount); `CellSandbox.fork(n)`
does both, the n cells opened concurrently. A fork carries the filesystem and the
snapshot's spec (environment, workdir, user, limits), never processes; forks and the
source never see each other's later writes. A layer lives in its host: it is gone
with the host (at the latest when the host's admission window ends and its last cell
is closed), and `delete_snapshot` frees it once no cell stacks it any more.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .agent.client import AgentConnection, AgentSandbox
from .agent.protocol import CellOpenRequest
from .errors import (AgentError, ConfigError, ImageNotFound, InfraError, SandboxCreateError, SandboxNotRunning,
                     SnapshotUnsupported)
from .interface import Sandbox, create_from_snapshot_many
from .labels import SNAPSHOT_ID, lifecycle_labels, snapshot_labels
from .results import SandboxInfo
from .snapshots import Snapshot
from .spec import SandboxSpec

log = logging.getLogger(__name__)

CELL_MARK = ".cell"  # a cell's id is "<host sandbox id>.cell<N>"
SHM_BYTES = 64 * 1024**2  # /dev/shm of a cell (Docker's default for a container)
# spec fields that shape the host sandbox; cells of specs equal on these share hosts
HOST_FIELDS = frozenset({"image", "start_command", "cpu_cores", "memory_gb", "disk_size_gb", "gpu_count",
                         "timeout_minutes", "labels", "network", "isolation", "pids_limit"})


def is_cell_id(sandbox_id: str) -> bool:
    return CELL_MARK in sandbox_id


class CellConnection(AgentConnection):
    """The connection to one cell's agent: requests go through the host agent's
    channel tagged with the cell; replies are routed here by the host connection."""

    def __init__(self, host: AgentConnection, cell_id: int, hello: dict[str, Any]):
        super().__init__(host.channel)
        self.host = host
        self.cell_id = cell_id
        self.hello = hello
        self._hello.set_result(hello)

    async def start(self, timeout: float = 30.0) -> dict[str, Any]:
        return self.hello

    async def _send(self, msg: dict[str, Any]) -> None:
        if self._dead is not None:
            raise self._dead
        await self.host._send({**msg, "cell": self.cell_id})

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.host.cells.pop(self.cell_id, None)
        self._fail(SandboxNotRunning("the cell was closed (sandbox deleted)"))


class _SharedConnection:
    """Another handle's view of a cell's connection: `close()` drops only this view."""

    def __init__(self, conn: AgentConnection):
        self._conn = conn
        self._closed: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    @property
    def dead(self) -> BaseException | None:
        return self._closed or self._conn.dead

    async def call(self, *args: Any, **kwargs: Any) -> dict:
        if self._closed is not None:
            raise self._closed
        return await self._conn.call(*args, **kwargs)

    async def close(self) -> None:
        self._closed = SandboxNotRunning("this handle on the cell was closed")


class CellSandbox(AgentSandbox):
    """One rollout's cell: every operation reaches the cell's own agent."""

    def __init__(self, connection: CellConnection, *, host: "CellHost", **kwargs: Any):
        super().__init__(connection, **kwargs)
        self.host = host
        self.cell_id = connection.cell_id
        self.init_pid: int | None = None
        self.created_at = time.time()
        self.labels = {**{k: str(v) for k, v in self.spec.labels.items()}, **lifecycle_labels(self.spec)}

    def another_handle(self) -> "CellSandbox":
        """A second handle on this cell (`backend.get`): closing its connection drops only it."""
        return CellSandbox(_SharedConnection(self._conn), host=self.host, id=self.id, name=self.name,
                           spec=self.spec, backend_name=self.backend_name)

    async def gone(self) -> bool:
        return self._conn.dead is not None or await self.host.sandbox.gone()

    async def snapshot(self, *, keep: bool = False) -> Snapshot:
        """Freeze this cell's filesystem (its writable layer, over the layers it stacks) into a
        read-only layer of its host: a "layer" snapshot, forks of which are cells of the same
        host (`CellHosts.create_from_snapshot`). One copy of what the cell wrote, made now: the
        cell keeps running and its later writes are not in it. It lives at most as long as the
        host (`keep` cannot make it outlive the host). TransferTooLarge past the cell's disk
        limit; SandboxNotRunning when the cell is gone."""
        if self._conn.dead is not None:
            raise self._conn.dead
        reply = await self.host.sandbox._call({"op": "cell_snapshot", "cell_id": self.cell_id},
                                              timeout=SNAPSHOT_TIMEOUT)
        layer = str(reply["layer"])
        snap = Snapshot(id=layer, backend=self.backend_name, kind="layer", source_id=self.id, image=None,
                        spec=self.spec, created_at=time.time(), keep=keep,
                        labels=snapshot_labels(self.spec, snapshot_id=layer, source_id=self.id, kind="layer",
                                               keep=keep))
        self.host.snapshots[layer] = snap
        return snap

    async def fork(self, n: int) -> list[Sandbox]:
        """`n` cells of this cell's host, each stacking a snapshot of this cell taken now:
        `Sandbox.fork` without the backend in between (the snapshot and the n cells are
        requests to the host this cell lives in); all of them or none."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"fork(n) needs an integer n >= 1, got {n!r}")
        if self.host.owner is None:
            return await super().fork(n)
        snap = await self.snapshot()
        try:
            forks = await create_from_snapshot_many(self.host.owner, snap, n)
        finally:
            await asyncio.shield(self.host.owner.delete_snapshot(snap.id))
        for fork in forks:
            fork.snapshot_backend = self.snapshot_backend
        return forks

    async def _destroy(self) -> None:
        await self.host.close_cell(self.cell_id)
        if self.host.owner is not None:
            self.host.owner.released(self)


def refuse_in_cells(spec: SandboxSpec) -> None:
    """A cell has only loopback networking and a fresh /dev without devices: refuse a
    spec asking for a network or GPUs rather than run without them."""
    if spec.network:
        raise ConfigError("network=True is not available with rollout_isolation='namespace' (a cell has only "
                          "loopback); use rollout_isolation='container'")
    if spec.gpu_count:
        raise ConfigError("gpu_count is not available with rollout_isolation='namespace' (a cell has no "
                          "devices); use rollout_isolation='container'")


def cell_conf(spec: SandboxSpec, name: str) -> dict[str, Any]:
    """What the host agent needs to build one cell of `spec`."""
    return {
        "hostname": name[:63],
        "env": {str(k): str(v) for k, v in spec.environment_vars.items()},
        "user": spec.user,
        "workdir": spec.workdir,
        "pids_limit": spec.pids_limit,
        "memory_bytes": spec.memory_bytes,
        "cpu_cores": spec.cpu_cores,
        "disk_bytes": int(spec.disk_size_gb * 1024**3),
        "shm_bytes": SHM_BYTES,
        "lifetime": max(1, int(spec.timeout_minutes * 60)),
    }


ADMIT_SECONDS_MAX = 600.0  # a host admits cells for at most 10 min (then a new one is made)
HOST_SLACK_SECONDS = 60.0  # a host outlives its last cell's lifetime by at most this (opening a cell)


AUTO_HARDENING = 1
"""The one switch of `rollout_isolation="auto"`: it picks cells only from a cell host whose
agent reports at least this hardening level in its hello (`HARDENING` in
agent/cells_program.py: the level at which the hostile-rollout suite's attacks are all
refused, issue 24), and a container per rollout otherwise. "namespace" asked outright
is not affected."""


def auto_refusal(cell: "CellSandbox") -> str | None:
    """Why `rollout_isolation="auto"` must not pick cells like `cell` (its host's agent
    lacks the hardening AUTO_HARDENING requires), or None."""
    level = cell.host.sandbox.connection.hello.get("hardening") or 0
    if not isinstance(level, int) or level < AUTO_HARDENING:
        return f"the cell host's agent reports hardening level {level!r}, 'auto' requires {AUTO_HARDENING}"
    return None


def admit_seconds(spec: SandboxSpec) -> float:
    """How long a host of `spec`'s cells admits new ones (from before it is created)."""
    return min(spec.timeout_minutes * 60, ADMIT_SECONDS_MAX)


def host_spec(spec: SandboxSpec, cells_per_host: int) -> SandboxSpec:
    """The cell host for cells of `spec`: room for `cells_per_host` of them (each cell
    is held to the spec's own limits by its cgroup), a lifetime of its admission window
    plus one cell lifetime plus a small slack (a cell admitted last still lives its
    whole lifetime; an orphaned host ends soon after its cells would have), root."""
    return spec.model_copy(update={
        "name": f"{spec.name}-cells",
        "memory_gb": spec.memory_gb * cells_per_host,
        "pids_limit": spec.pids_limit * cells_per_host + 64,
        "cpu_cores": spec.cpu_cores * cells_per_host,
        "disk_size_gb": spec.disk_size_gb * cells_per_host,
        "timeout_minutes": (admit_seconds(spec) + spec.timeout_minutes * 60 + HOST_SLACK_SECONDS) / 60,
        "environment_vars": {},
        "user": None,
        "workdir": "/",
        "rollout_isolation": "container",
    })


class CellHost:
    """One cell host sandbox and the cells open in it."""

    def __init__(self, sandbox: AgentSandbox, capacity: int, admit_until: float, owner: "CellHosts | None" = None):
        self.sandbox = sandbox
        self.owner = owner
        self.capacity = capacity
        self.admit_until = admit_until  # time.monotonic() after which no cell is opened here
        self.open = 0
        self.closing = 0  # of `open`: cells whose close was asked and has not finished
        self._ids = itertools.count(1)
        self.snapshots: dict[str, Snapshot] = {}  # layers frozen here and not deleted (by snapshot id)

    @property
    def usable(self) -> bool:
        return self.sandbox.connection.dead is None and time.monotonic() < self.admit_until

    @property
    def admits(self) -> bool:
        return self.open < self.capacity and self.usable

    @property
    def admits_after_closes(self) -> bool:
        """Full now, but has room once the cells being closed are gone."""
        return self.usable and self.open - self.closing < self.capacity

    async def open_cell(self, spec: SandboxSpec, hello_timeout: float = 30.0, layer: str | None = None) -> CellSandbox:
        """A new cell of `spec`; with `layer` (a snapshot of this host), its root stacks that layer."""
        n = next(self._ids)
        self.open += 1  # before the first await: capacity checks see it at once
        name = f"{spec.name}-c{n}"
        req: CellOpenRequest = {"op": "cell_open", "cell_id": n, "conf": cell_conf(spec, name),
                                "hello_timeout": hello_timeout}
        if layer is not None:
            req["layer"] = layer
        try:
            reply = await self.sandbox._call(req, timeout=hello_timeout + 30)
        except BaseException:
            self.open -= 1
            raise
        host_conn = self.sandbox.connection
        conn = CellConnection(host_conn, n, reply.get("hello") or {})
        host_conn.cells[n] = conn
        cell = CellSandbox(conn, host=self, id=f"{self.sandbox.id}{CELL_MARK}{n}", name=name, spec=spec,
                           backend_name=self.sandbox.backend_name)
        cell.init_pid = reply.get("pid")  # the cell's PID 1 (its agent) as the host sandbox sees it
        return cell

    async def close_cell(self, cell_id: int) -> None:
        conn = self.sandbox.connection.cells.get(cell_id)
        self.closing += 1
        try:
            if self.sandbox.connection.dead is None:
                await self.sandbox._call({"op": "cell_close", "cell_id": cell_id}, timeout=60)
        except InfraError as exc:  # the host is gone: so is the cell
            log.debug("closing cell %s: %s", cell_id, exc)
        finally:
            self.closing -= 1
            self.open -= 1
            if self.owner is not None:
                self.owner.room_made()
            if conn is not None:
                await conn.close()


SNAPSHOT_TIMEOUT = 660.0  # a freeze copies at most the cell's disk limit (the host kills it after 600 s)


RUNC_CELLS_PER_HOST = 64
GVISOR_CELLS_PER_HOST = 16
ROOM_WAIT_SECONDS = 5.0
"""How long a new cell waits for a full host's closing cells (~10 ms each, longer on a loaded
machine) before a new host is started for it (~0.2 s of the engine and ~0.3 s of CPU unloaded,
seconds on a loaded machine)."""


class CellHosts:
    """Hands out cells from cell hosts made by `create_host` (a backend's own create
    of a host sandbox: an agent started with `--cells`, the capabilities to build
    namespaces)."""

    def __init__(self, create_host: Callable[[SandboxSpec], Awaitable[AgentSandbox]], cells_per_host: int | None = None):
        if cells_per_host is not None and cells_per_host < 1:
            raise ValueError("cells_per_host must be >= 1")
        self.create_host = create_host
        self.cells_per_host = cells_per_host
        self._hosts: dict[str, list[CellHost]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._cells: dict[str, CellSandbox] = {}
        self._tasks: set[asyncio.Task] = set()
        self._room: set[asyncio.Event] = set()  # one per cell waiting for a closing cell (`_await_room`)
        self.stats = {"hosts": 0, "cells": 0}

    @staticmethod
    def key(spec: SandboxSpec) -> str:
        return spec.model_dump_json(include=set(HOST_FIELDS))

    def per_host(self, spec: SandboxSpec) -> int:
        """Cells one host admits: the backend option, else 64 under runc (each cell's own
        cgroup enforces its limits; fewer host starts: 48 vs 44 rollouts/s cold, 61 vs 55
        warm at -c 16) and 16 under gVisor (whose memory cgroup does not enforce a cell's
        limit: a memory hog can take down every cell of its host)."""
        if self.cells_per_host is not None:
            return self.cells_per_host
        return GVISOR_CELLS_PER_HOST if spec.isolation == "gvisor" else RUNC_CELLS_PER_HOST

    def _admitting(self, key: str) -> CellHost | None:
        return next((h for h in self._hosts.get(key, []) if h.admits), None)

    async def _await_room(self, key: str) -> CellHost | None:
        """A host of `key` admitting a cell, waiting (at most ROOM_WAIT_SECONDS) while a full
        one has cells being closed: a warm pool's refill and the cells of finished rollouts
        it replaces overlap, which would otherwise start a host for a moment's overflow.
        None when no host will have room (then a new host is started)."""
        deadline = time.monotonic() + ROOM_WAIT_SECONDS
        while True:
            host = self._admitting(key)
            left = deadline - time.monotonic()
            if host is not None or left <= 0 or not any(h.admits_after_closes for h in self._hosts.get(key, [])):
                return host
            event = asyncio.Event()
            self._room.add(event)
            try:
                async with asyncio.timeout(left):  # not wait_for: it can swallow a cancel (tests/test_cancellation.py)
                    await event.wait()
            except TimeoutError:
                pass
            finally:
                self._room.discard(event)

    def room_made(self) -> None:
        """A cell of a host closed: wake the cells waiting for room (`_await_room`)."""
        for event in self._room:
            event.set()

    async def create(self, spec: SandboxSpec) -> CellSandbox:
        """A new cell of `spec` (a new host first when none has room). ConfigError for what
        a cell cannot give (never accepted and silently dropped)."""
        refuse_in_cells(spec)
        key = self.key(spec)
        self._forget_dead()
        host = await self._await_room(key)
        if host is None:
            async with self._locks.setdefault(key, asyncio.Lock()):
                host = self._admitting(key)
                if host is None:
                    n = self.per_host(spec)
                    admit_until = time.monotonic() + admit_seconds(spec)  # the host's clock starts after this
                    sandbox = await self.create_host(host_spec(spec, n))
                    host = CellHost(sandbox, n, admit_until, self)
                    self._hosts.setdefault(key, []).append(host)
                    self.stats["hosts"] += 1
        try:
            cell = await host.open_cell(spec)
        except AgentError:
            if host.sandbox.connection.dead is not None:
                self._forget(key, host)
            raise
        self.stats["cells"] += 1
        self._cells[cell.id] = cell
        return cell

    def _forget(self, key: str, host: CellHost) -> None:
        hosts = self._hosts.get(key, [])
        if host in hosts:
            hosts.remove(host)
        host.snapshots.clear()  # its layers end with it
        self._spawn(host.sandbox.delete())

    # ------------------------------------------------------------ snapshots ("layer")
    def _snapshot_host(self, snapshot_id: str) -> CellHost | None:
        return next((h for hs in self._hosts.values() for h in hs if snapshot_id in h.snapshots), None)

    async def create_from_snapshot(self, snapshot: Snapshot) -> CellSandbox:
        """A new cell of `snapshot` (a "layer" snapshot of a cell of these hosts): a cell of
        the source's host, created with `snapshot.spec`, whose root stacks the frozen layer
        over the image. ImageNotFound when the snapshot was deleted or its host is gone or
        no longer admits cells (its admission window ended: take a new snapshot);
        SandboxCreateError when the host is full (its cells_per_host are open)."""
        if snapshot.kind != "layer":
            raise SnapshotUnsupported(f"cells are created from 'layer' snapshots, not {snapshot.kind!r} ones")
        self._forget_dead()
        host = self._snapshot_host(snapshot.id)
        if host is None:
            raise ImageNotFound(f"snapshot {snapshot.id} is gone (deleted, or its cell host ended)")
        if not host.usable:
            raise ImageNotFound(f"snapshot {snapshot.id}: its cell host {host.sandbox.name} no longer admits cells "
                                "(its admission window ended); take a new snapshot")
        if not host.admits:
            raise SandboxCreateError(f"snapshot {snapshot.id}: its cell host {host.sandbox.name} is full "
                                     f"({host.capacity} cells open); forks are cells of the source's host")
        spec = snapshot.spec.model_copy(update={"rollout_isolation": "namespace"})
        try:
            cell = await host.open_cell(spec, layer=snapshot.id)
        except AgentError:
            if host.sandbox.connection.dead is not None:
                self._forget(self.key(spec), host)
            raise
        except ConfigError as exc:  # the host no longer has the layer (deleted meanwhile)
            raise ImageNotFound(f"snapshot {snapshot.id}: {exc}") from exc
        cell.labels[SNAPSHOT_ID] = snapshot.id
        self.stats["cells"] += 1
        self._cells[cell.id] = cell
        return cell

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a layer snapshot of these hosts (idempotent): no cell is made of it again,
        and its host frees the layer once no cell stacks it. False for an id not known here."""
        host = self._snapshot_host(snapshot_id)
        if host is None:
            return False
        host.snapshots.pop(snapshot_id, None)
        if host.sandbox.connection.dead is None:
            try:
                await host.sandbox._call({"op": "cell_layer_drop", "layer": snapshot_id}, timeout=SNAPSHOT_TIMEOUT)
            except InfraError as exc:  # the host is gone: so is the layer
                log.debug("deleting snapshot %s: %s", snapshot_id, exc)
        return True

    def list_snapshots(self, labels: dict[str, str] | None = None) -> list[Snapshot]:
        """The layer snapshots of live hosts carrying all `labels`."""
        self._forget_dead()
        return [snap for hs in self._hosts.values() for h in hs for snap in h.snapshots.values()
                if all(snap.labels.get(k) == v for k, v in (labels or {}).items())]

    def _forget_dead(self) -> None:
        """Forget every host whose agent's channel closed (the container was killed or
        died): no cell is opened there again, its cells leave the listing (each handle
        already fails with the host's error) and its container is deleted."""
        for key, hosts in self._hosts.items():
            for host in [h for h in hosts if h.sandbox.connection.dead is not None]:
                log.warning("cell host %s is gone (%s): forgetting it and its cells", host.sandbox.name,
                            host.sandbox.connection.dead)
                for cid in [i for i, c in self._cells.items() if c.host is host]:
                    del self._cells[cid]
                self._forget(key, host)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cell(self, sandbox_id: str) -> CellSandbox | None:
        return self._cells.get(sandbox_id)

    async def delete(self, sandbox_id: str) -> None:
        """Delete a cell by id (idempotent; unknown ids are ignored)."""
        cell = self._cells.pop(sandbox_id, None)
        if cell is not None:
            await cell.delete()
            self._retire_drained()

    def released(self, cell: CellSandbox) -> None:
        """A cell was deleted through its own handle."""
        self._cells.pop(cell.id, None)
        self._retire_drained()

    def _retire_drained(self) -> None:
        """Delete hosts that no longer admit cells and hold none."""
        for key, hosts in self._hosts.items():
            for host in [h for h in hosts if h.open == 0 and not h.usable]:
                self._forget(key, host)

    async def delete_many(self, ids: Sequence[str], labels: dict[str, str] | None = None) -> int:
        """Delete the open cells among `ids` that carry all `labels`; returns how many."""
        known = [i for i in ids if i in self._cells
                 and all(self._cells[i].labels.get(k) == v for k, v in (labels or {}).items())]
        results = await asyncio.gather(*(self.delete(i) for i in known), return_exceptions=True)
        for cid, result in zip(known, results):
            if isinstance(result, BaseException):  # logged, not raised: the backend's containers are deleted next
                log.warning("cell %s was not deleted (%s: %s)", cid, type(result).__name__, result)
        return sum(1 for r in results if not isinstance(r, BaseException))

    def infos(self, labels: dict[str, str]) -> list[SandboxInfo]:
        """The open cells carrying all `labels` (with the lifecycle labels of their spec)."""
        self._forget_dead()
        out = []
        for cell in list(self._cells.values()):
            if all(cell.labels.get(k) == v for k, v in labels.items()):
                out.append(SandboxInfo(id=cell.id, name=cell.name, backend=cell.backend_name, status="running",
                                       image=cell.spec.image, labels=dict(cell.labels), created_at=cell.created_at))
        return out

    def host_ids(self) -> list[str]:
        return [h.sandbox.id for hosts in self._hosts.values() for h in hosts]

    async def close(self) -> None:
        """Delete every host (and so every cell)."""
        hosts = [h for hs in self._hosts.values() for h in hs]
        self._hosts.clear()
        self._cells.clear()
        results = await asyncio.gather(*(h.sandbox.delete() for h in hosts), return_exceptions=True)
        for host, result in zip(hosts, results):
            if isinstance(result, BaseException):  # labelled: the reaper removes it; say so
                log.warning("cell host %s was not deleted (%s: %s); `vf-sandbox sandboxes reap` removes it",
                            host.sandbox.id, type(result).__name__, result)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
