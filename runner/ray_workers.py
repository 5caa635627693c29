"""`--hosted`: the run's groups on Ray actors spread over the cluster's nodes.

The same model as `-w N` (`runner.workers`), with Ray actors in place of
worker processes: the runner (the Ray job's entrypoint, on the head node)
keeps the run definition, the one writer and the registry entry; each
`GroupWorker` actor builds its own environment and model clients from the
definition (`runner.setup`), on its node, with that node's sandbox
backend (Docker there, or Kubernetes / Prime as the definition says), and
returns the finished rows of each group it is handed. The hand-out, hold
and requeue rules are `runner.dispatch.GroupDispatcher`'s: an actor that
dies (its process, or its whole node) gives its unfinished groups back to
the others, and no group is written twice.

Placement: `max(-w, number of alive nodes)` actors, placed round-robin on
the alive nodes (hard node affinity, 0 CPUs reserved: an actor is mostly
waiting on the model and the sandboxes), each with its share of `-c`.

Start-up: an actor takes seconds to start (a worker process, then the
environment). Until every actor is ready the job's own process runs groups
on the runner's environment (a stand-in worker with the whole `-c`); then it
takes no more and the actors take its share of the concurrency as its
groups finish (the dispatcher's `limit`), so the run never holds more
groups than its actors would; once its last group is in, the sandboxes of
its environment (its warm pool on the head node) are deleted. Actors that
are not ready when the run ends
are killed without waiting for them. The actors are started with the
groups, not earlier: on the head node their start-up takes the CPU the job's
process needs to get its first rows out.

Stopping (the job gets SIGTERM from `ray job stop` / `vf-sandbox runs stop`,
or the run times out): every live actor cancels its rollouts and tears its
environment down (deleting its sandboxes on its node) before it is killed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from runner.config import EvalConfig, with_running_settings
from runner.dispatch import GroupDispatcher, WorkerFailed, per_worker_concurrency
from runner.group_runner import GroupRunner, run_settings
from sandboxes import settings

log = logging.getLogger("envs.runner.ray_workers")

GroupSink = Callable[[list[dict[str, Any]]], Awaitable[None]]
SHUTDOWN_SECONDS = 60.0


class GroupWorker:
    """One worker of a hosted run (a Ray actor; see `_actor_class`): a `GroupRunner`
    on its node."""

    def __init__(self, cfg_json: str, workers: int):
        """The actor's entry: the definition's settings (its registry credentials from the
        job's environment, `run_settings`) are the scope of every call (each runs in a
        context of its own: the scope is entered per call)."""
        import socket

        import ray

        cfg = EvalConfig.model_validate_json(cfg_json)
        self.settings = run_settings(cfg, settings.ProcessSettings.from_env())  # its credentials only
        with settings.use(self.settings):
            self.runner = GroupRunner.build(cfg, workers)
        self.where = f"{socket.gethostname()} (node {ray.get_runtime_context().get_node_id()[:12]})"

    def ready(self) -> str:
        """Where this worker runs (once its environment is loaded)."""
        return self.where

    async def run_group(self, gid: int, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with settings.use(self.settings):
            return await self.runner.run(gid, inputs)

    async def shutdown(self) -> None:
        """Cancel the rollouts in flight and delete this worker's sandboxes."""
        with settings.use(self.settings):
            await self.runner.close()


def _actor_class() -> Any:
    import ray

    # max_restarts=0: a dead actor's groups are re-queued by the dispatcher, not re-run by Ray
    return ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=100_000)(GroupWorker)


def alive_nodes() -> list[str]:
    import ray

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def start_actors(cfg: EvalConfig) -> list[Any]:
    """`max(-w, alive nodes)` worker actors, round-robin over the alive nodes (they load
    the environment in the background; `ready()` answers once they have)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(log_to_driver=True)
    nodes = alive_nodes()
    n = max(cfg.num_workers, len(nodes))
    Actor = _actor_class()
    cfg_json = cfg.model_dump_json()  # the settings travel in the definition
    # hard affinity: Ray 2.60 places soft-affinity 0-CPU actors on any node; an actor whose node is gone
    # before it is placed fails like a dead one (its groups go to the others)
    return [Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)], soft=False))
            .remote(cfg_json, n) for i in range(n)]


LOCAL = "local"  # the job's own process, standing in for the actors until they are ready


async def generate_on_ray(cfg: EvalConfig, inputs: list[dict[str, Any]], on_group: GroupSink,
                          local: GroupRunner | None = None) -> None:
    """Run `inputs` (grouped by example_id) on Ray actors over the cluster's nodes,
    awaiting `on_group(rows)` here for every finished group; `local` (the runner's
    environment) runs groups in this process until every actor is ready. The actors run
    with the definition's label and settings (the running ones where it names none)."""
    cfg = with_running_settings(cfg)
    started = start_actors(cfg)  # they start in the background, while `local` runs groups
    share = per_worker_concurrency(cfg, len(started))
    run = _RayRun(started, GroupDispatcher(inputs, share), share, local)
    if not run.groups.remaining:
        await _shut_down([], started)
        return
    run.start()
    try:
        run.feed()
        while run.groups.remaining:
            if not run.pending:
                raise WorkerFailed("no worker actor left to run the remaining groups")
            done, _ = await asyncio.wait(list(run.pending), return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                await run.settle(fut, on_group)
            run.feed()
            run.release_stand_in()
    finally:
        await run.close()


class _RayRun:
    """The state of one `generate_on_ray`: the actors (and which are not ready yet), the
    groups' dispatcher, the calls in flight, and the stand-in (`local`, the job's own
    process) that runs groups until every actor is ready."""

    def __init__(self, started: list[Any], groups: GroupDispatcher, share: int, local: GroupRunner | None):
        self.groups, self.share, self.local = groups, share, local
        self.n = len(started)
        groups.limit = self.n * groups.depth  # what the actors hold together; the stand-in never adds to it
        self.actors: dict[int, Any] = dict(enumerate(started))
        self.unready = set(self.actors)
        self.pending: dict[asyncio.Future[Any], tuple[Any, int | None]] = {}  # -> (worker, group id; None = ready)
        self.standing_in = local is not None
        self.released: list[asyncio.Future[None]] = []

    def start(self) -> None:
        """Ask every actor whether it is ready; the stand-in takes groups at once."""
        groups = self.groups
        for i in self.actors:
            groups.add(i)
            self.pending[asyncio.ensure_future(_awaitable(self.actors[i].ready.remote()))] = (i, None)
        log.info("%d worker actor(s) over %d node(s), %s concurrent rollouts each", self.n, len(alive_nodes()),
                 self.share if self.share > 0 else "unlimited")
        if self.local is not None:
            groups.add(LOCAL, depth=groups.limit)
            groups.ready(LOCAL)
            log.info("running groups in the job's process until the worker actors are ready")

    def feed(self) -> None:
        """Hand every live worker the groups it may take now."""
        for i in self.groups.alive:
            for gid, group in self.groups.take(i):
                run = self.local.run(gid, group) if i == LOCAL and self.local is not None else \
                    _awaitable(self.actors[i].run_group.remote(gid, group))
                self.pending[asyncio.ensure_future(run)] = (i, gid)

    def _settled(self, i: Any) -> None:  # actor i is ready or dead
        self.unready.discard(i)
        if not self.unready and self.standing_in:
            self.standing_in = False
            self.groups.retire(LOCAL)
            log.info("the worker actors are ready: the job's process runs no more groups")

    async def settle(self, fut: asyncio.Future[Any], on_group: GroupSink) -> None:
        """One finished call: an actor ready, a group's rows (written once), or an actor dead
        (its groups go to the others; WorkerFailed when none is left)."""
        from ray.exceptions import (ActorDiedError, ActorUnavailableError, ActorUnschedulableError, RayActorError,
                                    RuntimeEnvSetupError)

        i, gid = self.pending.pop(fut)
        exc = fut.exception()
        if i != LOCAL and isinstance(exc, (ActorDiedError, ActorUnavailableError, ActorUnschedulableError,
                                           RayActorError, RuntimeEnvSetupError)):
            self._settled(i)
            if i not in self.groups.held:
                return
            lost = self.groups.lost(i)
            self.actors.pop(i, None)
            log.warning("worker actor %d died (%s); %d unfinished group(s) go to the other workers",
                        i, type(exc).__name__, len(lost))
            if not [x for x in self.groups.alive if x != LOCAL]:
                raise WorkerFailed(f"every worker actor died; last: actor {i}: {exc}")
        elif exc is not None:
            raise exc
        elif gid is None:
            log.info("worker actor %d ready on %s", i, fut.result())
            self.groups.ready(i)
            self._settled(i)
        elif self.groups.finished(i, gid):
            await on_group(fut.result())

    def release_stand_in(self) -> None:
        """Once the stand-in's last group is in, its sandboxes (its warm pool on the head) go, meanwhile."""
        if self.local is not None and not self.standing_in and not self.groups.held.get(LOCAL) and not self.released:
            self.released.append(asyncio.ensure_future(self.local.release()))

    async def close(self) -> None:
        for fut in self.pending:
            fut.cancel()
        if self.local is not None:
            await self.local.close()
            await asyncio.gather(*(asyncio.shield(r) for r in self.released), return_exceptions=True)
        await _shut_down([a for i, a in self.actors.items() if i not in self.unready],
                         [a for i, a in self.actors.items() if i in self.unready])


def _awaitable(ref: Any) -> Awaitable[Any]:
    async def get() -> Any:
        return await ref

    return get()


async def _shut_down(actors: list[Any], unready: list[Any] | None = None) -> None:
    """Every ready actor tears down its environment (its sandboxes), then is killed;
    an actor still starting (it was never handed a group) is killed at once."""
    import ray

    try:
        if actors:
            async with asyncio.timeout(SHUTDOWN_SECONDS):
                await asyncio.shield(asyncio.gather(*(_awaitable(a.shutdown.remote()) for a in actors),
                                                    return_exceptions=True))
    except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
        log.warning("worker actors did not finish their teardown %s (the reaper removes what they left)",
                    f"in {SHUTDOWN_SECONDS:.0f}s" if isinstance(exc, asyncio.TimeoutError) else "(stopped)")
        if isinstance(exc, asyncio.CancelledError):
            raise
    finally:
        for a in [*actors, *(unready or [])]:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead
                pass
