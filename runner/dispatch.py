"""Handing a run's groups out to workers, whatever carries them (worker
processes over pipes for `-w N`, Ray actors for `--hosted`).

A group is one example's rollouts. Groups go out a few at a time (`depth`
per worker), so a fast worker takes more. A group is *held* by the worker it
was sent to until its rows come back; only then is it finished, and only the
first return of a group counts, so no rollout is ever written twice. A
worker that is lost gives its held groups back to the front of the queue
for the others; when no worker is left the run fails (`WorkerFailed`).

A stand-in worker (a hosted job's own process, running groups until its
actors are ready) is added with a depth of its own and `retire`d when they
are: it gets no more groups and finishes those it holds. `limit` caps the
groups held by all workers together, so the actors take over the stand-in's
share of the run's concurrency only as its groups finish.

The transport calls: `add(worker)`, `ready(worker)`, `take(worker)` (what to
send it now), `finished(worker, gid)` (write the rows?), `lost(worker)`,
`retire(worker)`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from typing import Any

from runner.config import EvalConfig

Group = tuple[int, list[dict[str, Any]]]


class WorkerFailed(RuntimeError):
    """Every worker of the run died (the last cause is in the message)."""


def per_worker_concurrency(cfg: EvalConfig, workers: int | None = None) -> int:
    """Each worker's share of `max_concurrent` rollouts (-1: unlimited)."""
    if cfg.max_concurrent <= 0:
        return -1
    return max(1, math.ceil(cfg.max_concurrent / (workers or cfg.num_workers)))


class GroupDispatcher:
    """The queue of groups and what each worker holds."""

    def __init__(self, inputs: list[dict[str, Any]], share: int):
        groups: dict[Any, list[dict[str, Any]]] = {}
        for inp in inputs:
            groups.setdefault(inp["example_id"], []).append(inp)
        self.queue: deque[Group] = deque(enumerate(groups.values()))
        self.remaining = len(self.queue)
        group_size = max((len(g) for g in groups.values()), default=1)
        self.depth = max(1, (share if share > 0 else len(inputs)) // group_size + 1)  # groups in flight per worker
        self.limit: int | None = None  # groups held by all workers together (None: only `depth` per worker)
        self.held: dict[Hashable, dict[int, list[dict[str, Any]]]] = {}
        self._ready: set[Hashable] = set()
        self._depths: dict[Hashable, int] = {}

    def add(self, worker: Hashable, depth: int | None = None) -> None:
        self.held[worker] = {}
        if depth is not None:
            self._depths[worker] = depth

    def ready(self, worker: Hashable) -> None:
        self._ready.add(worker)

    def retire(self, worker: Hashable) -> None:
        """`worker` takes no more groups; it still finishes (or loses) those it holds."""
        self._ready.discard(worker)

    @property
    def holding(self) -> int:
        return sum(len(h) for h in self.held.values())

    @property
    def alive(self) -> list[Hashable]:
        return list(self.held)

    def take(self, worker: Hashable) -> list[Group]:
        """The groups to send `worker` now (it is marked as holding them)."""
        held = self.held.get(worker)
        out: list[Group] = []
        if held is None or worker not in self._ready:
            return out
        depth = self._depths.get(worker, self.depth)
        room = self.limit - self.holding if self.limit is not None else len(self.queue)
        while self.queue and len(held) < depth and room > 0:
            room -= 1
            gid, group = self.queue.popleft()
            held[gid] = group
            out.append((gid, group))
        return out

    def finished(self, worker: Hashable, gid: int) -> bool:
        """The rows of group `gid` came back from `worker`: True when they are to be
        written (False: the group was already handed to another worker)."""
        held = self.held.get(worker)
        if held is None or held.pop(gid, None) is None:
            return False
        self.remaining -= 1
        return True

    def lost(self, worker: Hashable) -> list[int]:
        """`worker` is gone: its unfinished groups go back to the front of the queue."""
        held = self.held.pop(worker, None) or {}
        self._ready.discard(worker)
        lost = sorted(held)
        self.queue.extendleft(reversed([(gid, held[gid]) for gid in lost]))
        return lost
