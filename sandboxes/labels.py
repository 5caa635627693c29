"""Lifecycle labels every sandbox carries, so that any process can tell whose
sandbox it is, which run made it, and when it must be gone.

A backend merges `lifecycle_labels(spec)` into the user's labels at creation;
the reaper and `vf-sandbox sandboxes ls` read them back. Snapshots carry the
same owner / run labels (`snapshot_labels`) and no deadline: a snapshot lives
as long as its run (or, with `keep`, until deleted explicitly).
"""

from __future__ import annotations

import os
import socket
import time

from . import settings
from .spec import SandboxSpec

PREFIX = "vf-sandbox"
MANAGED = f"{PREFIX}.managed"  # "true" on every sandbox we create: the one filter for ls / reap
OWNER_PID = f"{PREFIX}.owner-pid"
OWNER_HOST = f"{PREFIX}.owner-host"
OWNER_START = f"{PREFIX}.owner-start"  # owner's process start time: tells a reused pid apart
RUN_ID = f"{PREFIX}.run-id"
CREATED_AT = f"{PREFIX}.created-at"
EXPIRES_AT = f"{PREFIX}.expires-at"
SNAPSHOT_ID = f"{PREFIX}.snapshot-id"  # on a snapshot (and inherited by the sandboxes made of it)
SNAPSHOT_OF = f"{PREFIX}.snapshot-of"  # the id of the sandbox it was taken from
SNAPSHOT_KIND = f"{PREFIX}.snapshot-kind"  # "image" | "layer"
SNAPSHOT_KEEP = f"{PREFIX}.snapshot-keep"  # "true": outlives its run, never reaped
SNAPSHOT_SPEC = f"{PREFIX}.snapshot-spec"  # the source's SandboxSpec as JSON (forks are made with it)

def run_id() -> str:
    """The run label this code's sandboxes carry: the running settings scope's
    (`sandboxes.settings.use`, entered by a run with its definition's `sandbox_run_id`);
    outside any scope `$VF_SANDBOX_RUN_ID`, else one fresh id per process."""
    label = settings.current().sandbox_run_id
    assert label  # current() always names one
    return label


def process_start_time(pid: int) -> str:
    """Start time of `pid` in clock ticks since boot (Linux), '' when unknown, gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat.rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]  # a zombie is dead, only not yet collected
    except (OSError, IndexError):
        return ""


def pid_exists(pid: int) -> bool:
    """Signal-0 probe: True while `pid` exists (a zombie included) or belongs to another user."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lifecycle_labels(spec: SandboxSpec) -> dict[str, str]:
    """Labels naming the owner process, run, creation and expiry time."""
    now = time.time()
    pid = os.getpid()
    return {
        MANAGED: "true",
        OWNER_PID: str(pid),
        OWNER_HOST: socket.gethostname(),
        OWNER_START: process_start_time(pid),
        RUN_ID: run_id(),
        CREATED_AT: f"{now:.3f}",
        EXPIRES_AT: f"{now + spec.timeout_minutes * 60:.3f}",
    }


def snapshot_labels(spec: SandboxSpec, *, snapshot_id: str, source_id: str, kind: str,
                    keep: bool) -> dict[str, str]:
    """A snapshot's labels: the source's user labels, this process's owner / run labels
    (no deadline), and what the snapshot is (SNAPSHOT_*; the spec itself is not here)."""
    life = {k: v for k, v in lifecycle_labels(spec).items() if k != EXPIRES_AT}
    return {**{k: str(v) for k, v in spec.labels.items()}, **life, SNAPSHOT_ID: snapshot_id,
            SNAPSHOT_OF: source_id, SNAPSHOT_KIND: kind, SNAPSHOT_KEEP: "true" if keep else "false"}


def owner_alive(labels: dict[str, str]) -> bool:
    """False when the owning process (on this host) is dead or its pid was reused.
    Sandboxes owned by another host are reported alive (we cannot tell)."""
    if labels.get(OWNER_HOST) != socket.gethostname():
        return True
    try:
        pid = int(labels.get(OWNER_PID, ""))
    except ValueError:
        return False
    start = process_start_time(pid)
    if not start:
        return False
    recorded = labels.get(OWNER_START)
    return not recorded or recorded == start


def expired(labels: dict[str, str], now: float | None = None) -> bool:
    try:
        return float(labels[EXPIRES_AT]) < (now or time.time())
    except (KeyError, ValueError):
        return False
