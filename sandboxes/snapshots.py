"""`Snapshot`: a sandbox's filesystem frozen at one moment, from which any number of
independent sandboxes (forks) are created.

How to use it (every backend; see `Sandbox.snapshot` / `Sandbox.fork` and the
`SupportsSnapshots` backend capability in `sandboxes.interface`):

    forks = await sandbox.fork(8)             # 8 independent copies, made concurrently
    snap = await sandbox.snapshot()           # or keep the frozen state to create from later
    copy = await backend.create_from_snapshot(snap)
    await backend.delete_snapshot(snap)       # or let the run's end remove it

What a fork carries: the source's filesystem as it was when the snapshot was
taken, its environment variables, working directory, user, limits (memory, CPU,
pids, disk), kernel boundary (`isolation`), `rollout_isolation`, network policy
and start command (`spec`). What it does NOT carry: processes (nothing that ran
in the source runs in a fork: it starts with a fresh start command), memory
state, open files, sockets. A fork and its source never see each other's writes
after the snapshot; the source keeps running.

Two kinds:

* "image": the filesystem committed as an engine image (Docker containers); forks are
  containers of it. `push_snapshot` puts it in a registry; `image` is then the registry
  reference, which other hosts and backends can run.
* "layer": a cell's writable layer frozen inside its cell host (`rollout_isolation=
  "namespace"`); forks are cells of the same host stacking it over the image.

Snapshots carry lifecycle labels like sandboxes (`sandboxes.labels.snapshot_labels`):
a run's snapshots go away with the run (backend close, `lifecycle.cleanup_all` on
SIGINT / SIGTERM / exit, `delete_many` by labels, the reaper once the owner process
is dead) unless made with `keep=True`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import SandboxCreateError
from .spec import SandboxSpec

if TYPE_CHECKING:
    from .interface import Sandbox

SnapshotKind = Literal["image", "layer"]
LOCAL_REPOSITORY = "vf-sandbox/snapshot"
"""Where an engine keeps its local snapshot images (`vf-sandbox/snapshot:<id>`): not in any registry."""


def new_snapshot_id() -> str:
    """A fresh snapshot id (backend-scoped; 16 hex digits)."""
    return uuid.uuid4().hex[:16]


class Snapshot(BaseModel):
    """One snapshot, as its backend describes it (also what `list_snapshots` returns)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The snapshot's id, unique within its backend.")
    backend: str = Field(description="Name of the backend that made it (and can create from it).")
    kind: SnapshotKind = Field(description='"image": the filesystem committed as an engine image; "layer": a '
                               "cell's writable layer frozen inside its cell host.")
    source_id: str = Field(description="Id of the sandbox it was taken from (which may be gone since).")
    image: str | None = Field(None, description="Image kind: the image forks are created from (after "
                              "push_snapshot: the registry reference). None for layers.")
    spec: SandboxSpec = Field(description="The source's spec (limits, isolation, rollout_isolation, environment, "
                              "workdir, user, network, start command); forks are created with it.")
    labels: dict[str, str] = Field(default_factory=dict, description="Lifecycle and user labels of the snapshot.")
    created_at: float = Field(description="Unix time it was taken.")
    keep: bool = Field(False, description="True: outlives its run (removed only by delete_snapshot).")


def in_registry(snapshot: Snapshot) -> bool:
    """True for an "image" snapshot whose image is a registry reference (pushed), which any
    host or backend able to pull images can run."""
    return snapshot.kind == "image" and bool(snapshot.image) and not snapshot.image.startswith(LOCAL_REPOSITORY + ":")


# gVisor keeps /tmp in a tmpfs of its own kernel, which no engine commit sees: a snapshot of a
# gVisor container tars it into the committed layer and labels the snapshot CARRIES_TMP; every
# backend creating a sandbox of such an image unpacks it there with `restore_tmp`.
CARRIED_TMP_TAR = "/var/tmp/.vf-snapshot-tmp.tar"
CARRIES_TMP = "vf-sandbox.snapshot-tmp"


def image_spec(snapshot: Snapshot, image: str) -> SandboxSpec:
    """The spec of a container (pod) of an "image" snapshot: the source's, running `image`."""
    return snapshot.spec.model_copy(update={"image": image, "rollout_isolation": "container"})


async def restore_tmp(sandbox: "Sandbox", snapshot: Snapshot) -> "Sandbox":
    """`sandbox` (just made of `snapshot`) with the /tmp the snapshot carries (label
    CARRIES_TMP) unpacked; as it is for other snapshots. When that fails (or the caller is
    cancelled meanwhile) the sandbox is deleted: SandboxCreateError."""
    if snapshot.labels.get(CARRIES_TMP) != "1":
        return sandbox
    try:
        r = await sandbox.exec(["/bin/sh", "-c", f"tar -C /tmp -xf {CARRIED_TMP_TAR} && rm -f {CARRIED_TMP_TAR}"],
                               timeout=300)
        if not r.ok:
            raise SandboxCreateError(f"sandbox {sandbox.id[:12]} of snapshot {snapshot.id}: restoring /tmp failed: "
                                     f"{r.stderr.strip()[-500:]}")
    except BaseException:
        await asyncio.shield(sandbox.delete())
        raise
    return sandbox
