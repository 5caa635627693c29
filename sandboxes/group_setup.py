"""`PreparedGroup`: the sandboxes of one rollout group, made from one prepared sandbox.

In RL and pass@k runs the rollouts of a group (one example, `rollouts_per_example` of
them) share their setup. The run's lifecycle (`RolloutSandboxes.prepare_group`) takes
one sandbox, runs the setup in it once, freezes its filesystem (`Sandbox.snapshot()`)
and deletes it; each rollout of the group then gets its own fork of that state:

    group = await sandboxes.prepare_group(setup, spec)   # setup(sandbox) runs once
    sandbox, prepared = await group.acquire()            # per rollout: a fork (prepared=True)
    await sandboxes.release(sandbox)                     # as any rollout's sandbox
    await group.close()                                  # the snapshot goes (after its forks)

A fork carries the prepared filesystem, environment, working directory and limits; no
process (a shell, a server started by the setup) runs in it: start those per rollout.

Two modes, said by `mode` (and by the `forked` flag of each acquire):

* "fork": the prepared filesystem is a snapshot; every `acquire()` creates a fork of it
  when the rollout asks (so a retried rollout gets a fresh fork as well), tracked by the
  lifecycle like any acquired sandbox (`release` deletes it, `close` whatever is left).
  A fork that cannot be made any more (a cell fork needs room in the source's cell host
  and its admission window; the snapshot gone) gives that rollout a fresh sandbox
  (prepared=False) instead of an error;
* "rollout": the backend (or this kind of sandbox on it) has no snapshots
  (`SnapshotUnsupported`: Kubernetes, Prime, local processes). The prepared sandbox goes
  to the first `acquire()` (prepared=True); every other one is a fresh sandbox of the
  spec (prepared=False) in which the caller runs its setup itself: the run works, the
  setup is paid per rollout. The lifecycle logs this once per run and keeps the reason
  (`RolloutSandboxes.group_setup_note`); rows say it with the `sandbox_forked` metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Literal

from .errors import ImageNotFound, SandboxCreateError
from .interface import Sandbox
from .snapshots import Snapshot
from .spec import SandboxSpec

if TYPE_CHECKING:
    from .rollouts import RolloutSandboxes

log = logging.getLogger(__name__)

GroupMode = Literal["fork", "rollout"]


class PreparedGroup:
    """One group's share of a prepared sandbox (see the module docstring)."""

    def __init__(self, lifecycle: "RolloutSandboxes", spec: SandboxSpec | None, mode: GroupMode, *,
                 snapshot: Snapshot | None = None, source: Sandbox | None = None, reason: str = ""):
        self.lifecycle = lifecycle
        self.spec = spec
        self.mode: GroupMode = mode
        self.snapshot = snapshot
        self.reason = reason
        """Why the group is in "rollout" mode ("" in "fork" mode)."""
        self.forks = 0
        """Forks made so far (retries included)."""
        self.fork_failures = 0
        """Rollouts that asked for a fork and got a fresh sandbox instead (see `acquire`)."""
        self._source = source
        self._closed = False

    async def acquire(self, *, key: str | None = None) -> tuple[Sandbox, bool]:
        """A rollout's sandbox and whether it holds the group's prepared state (True: the
        caller skips its setup). "fork": a new fork of the snapshot; "rollout": the prepared
        sandbox once, then fresh sandboxes of the spec (prepared False). Raises what the
        creation raised (InfraError: retry the rollout)."""
        if self._closed:
            raise RuntimeError("PreparedGroup.acquire() after close()")
        if self.mode == "fork":
            assert self.snapshot is not None
            try:
                sandbox = await self.lifecycle.acquire_fork(self.snapshot)
            except (ImageNotFound, SandboxCreateError) as exc:
                # no fork to be had any more (a cell host full, or past its admission window;
                # the snapshot gone): this rollout gets a fresh sandbox and sets itself up
                self.fork_failures += 1
                log.info("fork of snapshot %s failed (%s: %s); this rollout sets up its own sandbox",
                         self.snapshot.id, type(exc).__name__, exc)
                return await self.lifecycle.acquire(self.spec, key=key), False
            self.forks += 1
            return sandbox, True
        if self._source is not None:
            sandbox, self._source = self._source, None
            return sandbox, True
        return await self.lifecycle.acquire(self.spec, key=key), False

    async def close(self) -> None:
        """The group is done: a prepared sandbox nobody took is deleted, the snapshot is
        released (a Docker image goes once its last fork is deleted). Forks handed out
        stay until released (e.g. kept for scoring); the lifecycle's close removes any left."""
        if self._closed:
            return
        self._closed = True
        source, self._source = self._source, None
        if source is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.lifecycle.release(source))
        if self.snapshot is not None:
            await asyncio.shield(self.lifecycle.release_snapshot(self.snapshot))
