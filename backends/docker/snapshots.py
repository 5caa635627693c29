"""Snapshots of Docker containers: the container's filesystem committed as a local
image (`vf-sandbox/snapshot:<id>`, the engine's POST /commit, the container paused
for the commit so the copy is consistent), forks created as containers of it.

The image carries the snapshot's labels (`sandboxes.labels.snapshot_labels`: owner
process, run, source, kind, keep) and the source's spec as JSON, so any process can
list it and create from it; containers made of it inherit those labels (their own
lifecycle labels replace the owner / run / deadline ones).

When it goes:

* `delete_snapshot` removes every tag of it now, unless containers made of it by this
  backend still exist: then the last one's deletion removes it (a commit's image
  cannot be removed under its containers). `fork(n)` releases its snapshot this way,
  so the image lives exactly as long as the forks.
* The backend's `close()` removes the snapshots it made (not kept) and those released
  while forks ran; what containers still use stays for the reaper.
* `lifecycle.cleanup_all` (SIGINT / SIGTERM / exit) removes this process's snapshots
  after its containers, waiting a moment for a commit the engine is still completing.
* The reaper (`lifecycle.reap`) removes the snapshots of a dead owner; `keep=True`
  snapshots are never reaped (remove them with `delete_snapshot`).

Processes, memory and open files are not part of an image: a fork starts with its
start command only. Under gVisor the commit is the same (runsc writes the container's
files through to the engine's layer), except for /tmp: gVisor mounts its own tmpfs
there, inside the sandbox, which no commit sees. So under gVisor /tmp is carried by
hand: tarred into the container's layer (CARRIED_TMP_TAR) for the commit (then
removed from the source) and unpacked in each fork before it is handed out. /dev/shm
(a tmpfs under runc and gVisor alike) is never carried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.parse
from functools import partial
from typing import TYPE_CHECKING, Any

import aiodocker

from sandboxes import lifecycle
from sandboxes.errors import ImageNotFound, SandboxNotRunning, SnapshotUnsupported
from sandboxes.images import RegistryAuth
from sandboxes.labels import CREATED_AT, MANAGED, SNAPSHOT_ID, SNAPSHOT_KEEP, SNAPSHOT_OF, SNAPSHOT_SPEC, snapshot_labels
from sandboxes.snapshots import (
    CARRIED_TMP_TAR,
    CARRIES_TMP,
    LOCAL_REPOSITORY,
    Snapshot,
    image_spec,
    new_snapshot_id,
    restore_tmp,
)
from sandboxes.spec import SandboxSpec

from .engine import _sync_conn

if TYPE_CHECKING:
    from sandboxes.interface import Sandbox

    from .backend import DockerBackend

log = logging.getLogger(__name__)

REPOSITORY = LOCAL_REPOSITORY
PUSHED_DIGEST = "vf-sandbox.snapshot-digest"
REMOVE_WAIT = 10.0  # seconds the sync remover waits for a commit in flight / containers going away


def local_image(snapshot_id: str) -> str:
    """The local image name of snapshot `snapshot_id`."""
    return f"{REPOSITORY}:{snapshot_id}"


def registry_host(reference: str) -> str:
    """The registry part of an image reference ("" for Docker Hub's short names)."""
    first, _, rest = reference.partition("/")
    return first if rest and ("." in first or ":" in first or first == "localhost") else ""


def snapshot_of_image(backend: str, image: dict[str, Any]) -> Snapshot | None:
    """The Snapshot an engine image listing row (GET /images/json) stands for, None when it
    is not one of ours or its spec label cannot be read."""
    labels = image.get("Labels") or {}
    sid = labels.get(SNAPSHOT_ID)
    if not sid or labels.get(MANAGED) != "true":
        return None
    try:
        spec = SandboxSpec.model_validate_json(labels.get(SNAPSHOT_SPEC, ""))
    except ValueError:
        log.warning("snapshot image %s has an unreadable spec label", sid)
        return None
    tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
    name = local_image(sid) if local_image(sid) in tags else (tags[0] if tags else image.get("Id"))
    return Snapshot(id=sid, backend=backend, kind="image", source_id=labels.get(SNAPSHOT_OF, ""), image=name,
                    spec=spec, labels={k: v for k, v in labels.items() if k != SNAPSHOT_SPEC},
                    created_at=float(labels.get(CREATED_AT) or image.get("Created") or 0),
                    keep=labels.get(SNAPSHOT_KEEP) == "true")


def _request(url: str, method: str, path: str, timeout: float = 15.0) -> tuple[int, bytes]:
    conn = _sync_conn(url, timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def remove_snapshot_sync(url: str, snapshot_id: str, settled: threading.Event | None = None,
                         wait: float = REMOVE_WAIT) -> None:
    """Remove every tag of snapshot `snapshot_id` with blocking HTTP calls (signal handlers,
    atexit; run after this process's containers were removed). Until `settled` is set (the
    commit's answer reached us) the image may still appear: it waits for it, as it waits for
    containers of it that are still being removed (409), up to `wait` seconds."""
    flt = urllib.parse.quote(json.dumps({"label": [f"{SNAPSHOT_ID}={snapshot_id}"]}))
    deadline = time.monotonic() + wait
    removed = False
    while True:
        status, body = _request(url, "GET", f"/images/json?filters={flt}")
        images = json.loads(body) if status == 200 else []
        busy = False
        for image in images:
            for tag in image.get("RepoTags") or [image["Id"]]:
                code, _ = _request(url, "DELETE", f"/images/{urllib.parse.quote(tag, safe='/:')}")
                removed |= code == 200
                busy |= code == 409
        pending = settled is not None and not settled.is_set() and not removed
        if not (busy or pending or images) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


async def _quiet_exec(sandbox: "Sandbox", argv: list[str]) -> None:
    try:
        await sandbox.exec(argv, timeout=60)
    except Exception as exc:  # noqa: BLE001 - the source's own clean-up: never fails the snapshot
        log.debug("%s in %s: %s", argv, sandbox.id[:12], exc)


class DockerSnapshots:
    """The snapshots of one DockerBackend: commit, create from, release, list, push."""

    def __init__(self, backend: "DockerBackend"):
        self.backend = backend
        self._made: dict[str, Snapshot] = {}  # made by this backend, not released yet
        self._users: dict[str, set[str]] = {}  # snapshot id -> containers made of it by this backend
        self._released: dict[str, Snapshot] = {}  # released while containers of it exist
        self._auth: dict[str, RegistryAuth] = {}  # registry host -> the credentials a push there used

    # ------------------------------------------------------------ take
    async def take(self, sandbox: "Sandbox", *, keep: bool = False) -> Snapshot:
        """Commit `sandbox`'s container (paused meanwhile) to a new snapshot image."""
        backend = self.backend
        sid = new_snapshot_id()
        spec = sandbox.spec
        labels = snapshot_labels(spec, snapshot_id=sid, source_id=sandbox.id, kind="image", keep=keep)
        if spec.isolation == "gvisor":
            await self._save_tmp(sandbox)
            labels[CARRIES_TMP] = "1"
        body = {"Labels": {**labels, SNAPSHOT_SPEC: spec.model_dump_json()}}
        settled = threading.Event()
        if not keep:  # tracked before the commit starts: a signal mid-commit still removes it
            lifecycle.track(sid, lambda: remove_snapshot_sync(backend.url, sid, settled),
                            backend=backend.name, kind="snapshot")
        docker = await backend._client()
        params = {"container": sandbox.id, "repo": REPOSITORY, "tag": sid, "pause": "1",
                  "comment": f"vf-sandbox snapshot of {sandbox.id[:12]}"}
        task = asyncio.ensure_future(docker._query_json("commit", method="POST", params=params, data=json.dumps(body),
                                                        timeout=None))
        try:
            async with backend._api("commit container"):
                await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(partial(self._discard_commit, sid, settled))
            raise
        except aiodocker.DockerError as exc:
            settled.set()
            lifecycle.untrack(sid, "snapshot")
            if exc.status == 404:
                raise SandboxNotRunning(f"cannot snapshot {sandbox.id[:12]}: the container is gone") from exc
            raise SandboxNotRunning(f"cannot snapshot {sandbox.id[:12]}: {exc.message}") from exc
        except BaseException:
            settled.set()
            raise
        finally:
            if CARRIES_TMP in labels:
                await _quiet_exec(sandbox, ["rm", "-f", CARRIED_TMP_TAR])
        settled.set()
        snap = Snapshot(id=sid, backend=backend.name, kind="image", source_id=sandbox.id, image=local_image(sid),
                        spec=spec, labels=labels, created_at=float(labels[CREATED_AT]), keep=keep)
        if not keep:
            self._made[sid] = snap
        return snap

    def _discard_commit(self, sid: str, settled: threading.Event, task: asyncio.Future) -> None:
        """The caller was cancelled during the commit: remove the image once the engine made it."""
        settled.set()
        if task.cancelled() or task.exception() is not None:
            return

        async def remove() -> None:
            try:
                await self._remove(sid)
            except Exception as exc:  # noqa: BLE001 - best effort: close / cleanup_all / the reaper get it
                log.warning("could not remove snapshot %s of a cancelled snapshot(): %s", sid, exc)

        asyncio.ensure_future(remove())

    # ------------------------------------------------------------ create
    async def create_from(self, snap: Snapshot) -> "Sandbox":
        """A container of `snap`'s image with its spec (pulled first when only a registry has it)."""
        if snap.kind != "image":
            raise SnapshotUnsupported(f"the docker backend creates containers from 'image' snapshots, not {snap.kind!r}")
        image = snap.image or local_image(snap.id)
        if await self.backend.image_id(image) is None:
            if image == local_image(snap.id):
                raise ImageNotFound(f"snapshot {snap.id} is gone (no image {image}): it was deleted, or its run ended")
            # a pushed snapshot: pulled with the credentials this backend pushed it with, else
            # the running settings' (VF_REGISTRY_USERNAME / _PASSWORD), else anonymously; ImageNotFound when it cannot be
            auth = self._auth.get(registry_host(image)) or RegistryAuth.from_settings()
            await self.backend.pull_image(image, auth)
        sandbox = await self.backend._create(image_spec(snap, image), None)
        self._users.setdefault(snap.id, set()).add(sandbox.id)
        return await restore_tmp(sandbox, snap)

    @staticmethod
    async def _save_tmp(sandbox: "Sandbox") -> None:
        """gVisor: /tmp (the sandbox kernel's own tmpfs) into the container's layer, for the commit."""
        r = await sandbox.exec(["tar", "-C", "/tmp", "-cf", CARRIED_TMP_TAR, "."], timeout=300)
        if not r.ok:
            raise SandboxNotRunning(f"cannot snapshot {sandbox.id[:12]}: saving /tmp (gVisor keeps it outside the "
                                    f"container's layer) failed: {r.stderr.strip()[-500:]}")


    async def sandbox_deleted(self, container_id: str) -> None:
        """A container of ours is gone: remove the released snapshot it was the last user of."""
        for sid, users in list(self._users.items()):
            if container_id in users:
                users.discard(container_id)
                if not users:
                    del self._users[sid]
                    if sid in self._released:
                        await self._remove(sid)

    # ------------------------------------------------------------ release / list / push
    async def release(self, snap: Snapshot | str) -> None:
        """`delete_snapshot`: remove it now, or once the containers made of it here are gone."""
        sid = snap if isinstance(snap, str) else snap.id
        known = self._made.get(sid) or (snap if isinstance(snap, Snapshot) else None)
        if self._users.get(sid):
            if known is not None:
                self._released[sid] = known
            else:
                self._released[sid] = Snapshot(id=sid, backend=self.backend.name, kind="image", source_id="",
                                               spec=SandboxSpec(), created_at=time.time())
            return
        await self._remove(sid)

    async def _remove(self, sid: str) -> bool:
        """Remove every tag of snapshot `sid`; False when containers still use it (left
        released: the reaper or a later release removes it)."""
        docker = await self.backend._client()
        async with self.backend._api("list images"):
            images = await docker.images.list(filters={"label": [f"{SNAPSHOT_ID}={sid}"]})
        in_use = False
        for image in images:
            for tag in image.get("RepoTags") or [image["Id"]]:
                try:
                    async with self.backend._api("remove image"):
                        await docker.images.delete(tag, noprune=False)
                except aiodocker.DockerError as exc:
                    if exc.status == 409:
                        in_use = True
                        log.debug("snapshot %s still in use: %s", sid, exc.message)
                    elif exc.status != 404:
                        raise
        self._made.pop(sid, None)
        if in_use:
            self._released.setdefault(sid, Snapshot(id=sid, backend=self.backend.name, kind="image", source_id="",
                                                    spec=SandboxSpec(), created_at=time.time()))
            return False
        self._released.pop(sid, None)
        lifecycle.untrack(sid, "snapshot")
        return True

    async def list(self, labels: dict[str, str] | None = None) -> list[Snapshot]:
        """Our snapshot images carrying all `labels`."""
        docker = await self.backend._client()
        wanted = {MANAGED: "true", **(labels or {})}
        flt = {"label": [SNAPSHOT_ID] + [f"{k}={v}" for k, v in wanted.items()]}
        async with self.backend._api("list images"):
            images = await docker.images.list(filters=flt)
        out: dict[str, Snapshot] = {}
        for image in images:
            snap = snapshot_of_image(self.backend.name, image)
            if snap is not None:
                out.setdefault(snap.id, snap)
        return list(out.values())

    async def push(self, snap: Snapshot, target: str, auth: RegistryAuth | None = None) -> Snapshot:
        """Push `snap`'s image as `target`; the snapshot with `image` = `target`."""
        if snap.kind != "image":
            raise SnapshotUnsupported(
                f"a {snap.kind!r} snapshot lives inside its cell host and cannot be pushed to a registry; snapshot a "
                "container (rollout_isolation='container') to push")
        digest = await self.backend.push_image(snap.image or local_image(snap.id), target, auth)
        if auth is not None:
            self._auth[registry_host(target)] = auth
        labels = {**snap.labels, PUSHED_DIGEST: digest} if digest else dict(snap.labels)
        return snap.model_copy(update={"image": target, "labels": labels})

    async def remove_labelled(self, labels: dict[str, str] | None) -> None:
        """Remove (or release) every snapshot not kept carrying `labels` (`delete_many` by labels)."""
        for snap in await self.list(labels):
            if not snap.keep:
                await self.release(snap)

    async def close(self) -> None:
        """Remove what this backend made or released (not kept); containers still using one leave it
        to the reaper and to `lifecycle.cleanup_all`."""
        for sid in list({**self._made, **self._released}):
            try:
                await self._remove(sid)
            except Exception as exc:  # noqa: BLE001 - best effort: the reaper removes the rest
                log.warning("could not remove snapshot %s: %s", sid, exc)
