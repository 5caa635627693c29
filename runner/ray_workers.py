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

from runner.config import EvalConfig
from runner.dispatch import GroupDispatcher, WorkerFailed, per_worker_concurrency
from runner.group_runner import GroupRunner

log = logging.getLogger("envs.runner.ray_workers")

GroupSink = Callable[[list[dict[str, Any]]], Awaitable[None]]
SHUTDOWN_SECONDS = 60.0


class GroupWorker:
    """One worker of a hosted run (a Ray actor; see `_actor_class`): a `GroupRunner`
    on its node."""

    def __init__(self, cfg_json: str, workers: int):
        import socket

        import ray

        self.runner = GroupRunner.build(EvalConfig.model_validate_json(cfg_json), workers)
        self.where = f"{socket.gethostname()} (node {ray.get_runtime_context().get_node_id()[:12]})"

    def ready(self) -> str:
        """Where this worker runs (once its environment is loaded)."""
        return self.where

    async def run_group(self, gid: int, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return await self.runner.run(gid, inputs)

    async def shutdown(self) -> None:
        """Cancel the rollouts in flight and delete this worker's sandboxes."""
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
    cfg_json = cfg.model_dump_json()
    # hard affinity: Ray 2.60 places soft-affinity 0-CPU actors on any node; an actor whose node is gone
    # before it is placed fails like a dead one (its groups go to the others)
    return [Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)], soft=False))
            .remote(cfg_json, n) for i in range(n)]


LOCAL = "local"  # the job's own process, standing in for the actors until they are ready


async def generate_on_ray(cfg: EvalConfig, inputs: list[dict[str, Any]], on_group: GroupSink,
                          local: GroupRunner | None = None) -> None:
    """Run `inputs` (grouped by example_id) on Ray actors over the cluster's nodes,
    awaiting `on_group(rows)` here for every finished group; `local` (the runner's
    environment) runs groups in this process until every actor is ready."""
    from ray.exceptions import (ActorDiedError, ActorUnavailableError, ActorUnschedulableError, RayActorError,
                                RuntimeEnvSetupError)

    started = start_actors(cfg)  # they start in the background, while `local` runs groups
    n = len(started)
    share = per_worker_concurrency(cfg, n)
    groups = GroupDispatcher(inputs, share)
    groups.limit = n * groups.depth  # what the actors hold together; the stand-in never adds to it
    actors: dict[int, Any] = dict(enumerate(started))
    unready = set(actors)
    pending: dict[asyncio.Future[Any], tuple[Any, int | None]] = {}  # future -> (worker, group id or None = ready)
    if not groups.remaining:
        await _shut_down([], started)
        return
    for i in actors:
        groups.add(i)
        pending[asyncio.ensure_future(_awaitable(actors[i].ready.remote()))] = (i, None)
    log.info("%d worker actor(s) over %d node(s), %s concurrent rollouts each", n, len(alive_nodes()),
             share if share > 0 else "unlimited")
    if local is not None:
        groups.add(LOCAL, depth=groups.limit)
        groups.ready(LOCAL)
        log.info("running groups in the job's process until the worker actors are ready")

    def feed() -> None:
        for i in groups.alive:
            for gid, group in groups.take(i):
                run = local.run(gid, group) if i == LOCAL and local is not None else \
                    _awaitable(actors[i].run_group.remote(gid, group))
                pending[asyncio.ensure_future(run)] = (i, gid)

    standing_in = [local is not None]
    released: list[asyncio.Future[None]] = []

    def settled(i: Any) -> None:  # actor i is ready or dead
        unready.discard(i)
        if not unready and standing_in[0]:
            standing_in[0] = False
            groups.retire(LOCAL)
            log.info("the worker actors are ready: the job's process runs no more groups")

    try:
        feed()
        while groups.remaining:
            if not pending:
                raise WorkerFailed("no worker actor left to run the remaining groups")
            done, _ = await asyncio.wait(list(pending), return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i, gid = pending.pop(fut)
                exc = fut.exception()
                if i != LOCAL and isinstance(exc, (ActorDiedError, ActorUnavailableError, ActorUnschedulableError,
                                                   RayActorError, RuntimeEnvSetupError)):
                    settled(i)
                    if i not in groups.held:
                        continue
                    lost = groups.lost(i)
                    actors.pop(i, None)
                    log.warning("worker actor %d died (%s); %d unfinished group(s) go to the other workers",
                                i, type(exc).__name__, len(lost))
                    if not [x for x in groups.alive if x != LOCAL]:
                        raise WorkerFailed(f"every worker actor died; last: actor {i}: {exc}")
                elif exc is not None:
                    raise exc
                elif gid is None:
                    log.info("worker actor %d ready on %s", i, fut.result())
                    groups.ready(i)
                    settled(i)
                elif groups.finished(i, gid):
                    await on_group(fut.result())
            feed()
            if local is not None and not standing_in[0] and not groups.held.get(LOCAL) and not released:
                # its last group is in: the stand-in's sandboxes (its warm pool on the head) go, meanwhile
                released.append(asyncio.ensure_future(local.release()))
    finally:
        for fut in pending:
            fut.cancel()
        if local is not None:
            await local.close()
            await asyncio.gather(*(asyncio.shield(r) for r in released), return_exceptions=True)
        await _shut_down([a for i, a in actors.items() if i not in unready], [a for i, a in actors.items() if i in unready])


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
