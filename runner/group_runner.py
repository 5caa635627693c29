"""One worker's share of a run, whatever carries its groups: the environment
and model clients built from the run definition (`runner.setup`), its
slice of the run's concurrency, `run(gid, inputs)` -> the finished rows of
one group, and `close()` (cancel what is in flight, delete this worker's
sandboxes, close its clients).

Served over a pipe by `-w` worker processes (`runner.workers`), as a Ray
actor by hosted runs (`runner.ray_workers`), and by a hosted job's own
process on the runner's environment until its actors are ready (`owned=False`:
the runner closes those clients itself; `release()` deletes that environment's
sandboxes, its warm pool on the head node, once the actors have taken over).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from runner.config import EvalConfig
from runner.dispatch import per_worker_concurrency
from sandboxes import settings


def run_settings(cfg: EvalConfig, own: settings.ProcessSettings) -> settings.ProcessSettings:
    """A worker's settings (a `-w` process or a Ray actor): the definition's, with the
    registry credentials of `own`, what the worker's entry read from its environment
    (credentials never travel in a definition)."""
    if cfg.settings is None:
        raise ValueError("a worker's run definition carries no process settings (filled in when the run starts)")
    return cfg.process_settings().with_credentials(own)


class GroupRunner:
    def __init__(self, cfg: EvalConfig, env: Any, clients: list[Any], workers: int, owned: bool = True):
        self.cfg, self.env, self.clients, self.owned = cfg, env, clients, owned
        self.share = per_worker_concurrency(cfg, workers)
        scoring = cfg.max_concurrent_scoring or cfg.max_concurrent
        self.scoring_share = max(1, math.ceil(scoring / workers)) if scoring > 0 else -1
        self._sems: tuple[asyncio.Semaphore | None, asyncio.Semaphore | None] | None = None
        self._tasks: set[asyncio.Future[Any]] = set()

    @classmethod
    def build(cls, cfg: EvalConfig, workers: int) -> "GroupRunner":
        """A worker's own environment and clients, made from the run definition, in the run's
        settings scope (`sandboxes.settings.use(cfg.process_settings())`, entered by the
        worker's entry): its sandboxes carry the run's label, `cfg.sandbox_run_id`, and its
        settings are the definition's, never this process's environment."""
        from runner.setup import load_run_env, make_run_clients

        if not cfg.sandbox_run_id or cfg.settings is None:
            raise ValueError("a worker's run definition names no sandbox label or process settings "
                             "(sandbox_run_id, settings: filled in when the run starts)")
        if settings.current().sandbox_run_id != cfg.sandbox_run_id:
            raise RuntimeError("GroupRunner.build outside its run's settings scope (sandboxes.settings.use)")
        share = per_worker_concurrency(cfg, workers)
        env = load_run_env(cfg, concurrency=share if share > 0 else None)
        clients = make_run_clients(cfg, env, check=False)  # the runner checked the endpoints once
        return cls(cfg, env, clients, workers)

    async def run(self, gid: int, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run one group (scored) and return its rows."""
        from envs.outputs import state_to_output

        if self._sems is None:  # made on the loop that runs the groups
            self._sems = (asyncio.Semaphore(self.share) if self.share > 0 else None,
                          asyncio.Semaphore(self.scoring_share) if self.scoring_share > 0 else None)
        sem, scoring_sem = self._sems
        cfg = self.cfg
        task = asyncio.ensure_future(self.env.run_group(
            inputs, self.clients[gid % len(self.clients)], cfg.model, cfg.sampling_args, sem=sem,
            max_retries=cfg.rollout_retries(), independent_scoring=cfg.independent_scoring, score=True,
            scoring_sem=scoring_sem))
        self._tasks.add(task)
        try:
            states = await task
        finally:
            self._tasks.discard(task)
        return [state_to_output(s, cfg.state_columns) for s in states]

    async def release(self) -> None:
        """This worker runs no more groups: its environment's sandboxes (a warm pool
        included) are deleted now, even when it is not `owned` (teardown is once-only:
        the owner's own call later does nothing)."""
        await asyncio.shield(self.env.teardown())

    async def close(self) -> None:
        """Cancel the groups in flight; an owned environment deletes its sandboxes
        (before its clients close)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.owned:
            return
        await asyncio.shield(self.env.teardown())
        for c in self.clients:
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass
