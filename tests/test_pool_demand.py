"""The warm pool never opens more sandboxes than the run still needs (real Docker).

`Environment.generate` tells the env's lifecycle how many rollouts are coming
(`RolloutSandboxes.expect`): a SandboxEnv eval of N rollouts then opens at most N
sandboxes, cells or containers, and every rollout still gets one. Without an
expectation the pool keeps its size and refills (a library user's pool); an
expectation below the real demand still serves every acquisition (those past it
get a sandbox made for them)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sandboxes import ConfigError, Sandbox, SandboxBackend, SandboxSpec, get_backend
from sandboxes.rollouts import RolloutSandboxes
from test_sandbox_env import bash_env, tool_messages, unique_labels, wait_gone
from test_sandbox_env_pool import POLICY
from testmodel.model_server import ModelServer

pytestmark = pytest.mark.docker


def counting_docker() -> SandboxBackend:
    """The real Docker backend, counting the sandboxes it is asked to create (cells too)."""
    base = type(get_backend("docker"))

    class Counting(base):  # type: ignore[valid-type, misc]
        creations = 0

        async def create(self, spec: SandboxSpec, **kw: Any) -> Sandbox:
            self.creations += 1
            return await super().create(spec, **kw)

    return Counting()


async def evaluate(env, n: int, concurrency: int):
    """Evaluate, the pool's refill target read before teardown."""
    from openai import AsyncOpenAI

    import envs as vf

    async with ModelServer(POLICY) as srv:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))
        try:
            out = await env.evaluate(client, "m", num_examples=n, rollouts_per_example=1, max_concurrent=concurrency)
            pool = env.sandboxes.pool
            assert pool is not None
            return list(out["outputs"]), dict(pool.stats), pool.size
        finally:
            await env.teardown()


@pytest.mark.parametrize("mode, n, concurrency", [("container", 6, 2), ("namespace", 12, 4)])
async def test_an_eval_opens_at_most_one_sandbox_per_rollout(mode, n, concurrency):
    labels = unique_labels()
    backend = counting_docker()
    env = bash_env(labels, n=n, rollout_isolation=mode, backend=backend)
    try:
        rows, stats, size = await evaluate(env, n=n, concurrency=concurrency)
        await asyncio.sleep(1.0)  # a refill started at the end would have asked by now
    finally:
        await backend.close()
    assert [tool_messages(r)[0] for r in rows] == ["42"] * n and all(r["error"] is None for r in rows)
    assert env.rollout_isolation_in_use() == mode
    assert stats["acquired"] == n, stats
    assert backend.creations == n, stats  # without the cap: n + up to the pool's size (c containers, 2c cells)
    assert size == 0  # nothing left to expect: no refill target
    assert wait_gone(labels) == []


def lifecycle(labels: dict[str, str], mode: str = "container") -> RolloutSandboxes:
    lc = RolloutSandboxes(SandboxSpec(labels=labels, timeout_minutes=5), "docker", rollout_isolation=mode)
    lc.set_concurrency(2)
    return lc


async def serve(lc: RolloutSandboxes, n: int, concurrency: int) -> list[str]:
    """`n` acquisitions, `concurrency` at once, each running a command in its sandbox."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with sem, lc.sandbox() as sb:
            return (await sb.exec(f"echo {i}")).stdout.strip()

    return await asyncio.gather(*(one(i) for i in range(n)))


async def wait_ready(lc: RolloutSandboxes, n: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while lc.pool is not None and lc.pool.ready < n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return lc.pool.ready if lc.pool is not None else 0


async def test_without_an_expectation_the_pool_keeps_its_size_and_refills():
    labels = unique_labels()
    lc = lifecycle(labels)
    try:
        assert lc.expected is None
        assert await serve(lc, 3, 2) == ["0", "1", "2"]
        assert lc.pool is not None and lc.pool.size == lc.effective_pool_size == 2
        assert await wait_ready(lc, 2) == 2  # refilled past the three acquisitions
        assert lc.opened == 5
    finally:
        await lc.close()
    assert wait_gone(labels) == []


@pytest.mark.parametrize("mode", ["container", "namespace"])
async def test_an_expectation_caps_the_pool_and_a_smaller_one_still_serves_everyone(mode):
    labels = unique_labels()
    lc = lifecycle(labels, mode)
    try:
        lc.expect(3)
        assert await serve(lc, 3, 2) == ["0", "1", "2"]
        assert lc.expected == 0 and lc.pool is not None and lc.pool.size == 0
        await asyncio.sleep(0.5)  # a refill would have started by now
        assert lc.opened == 3 and lc.pool.ready == 0
        lc.expect(2)  # less than the five coming: the three past it get sandboxes made for them
        assert await asyncio.wait_for(serve(lc, 5, 2), 120) == [str(i) for i in range(5)]
        assert lc.opened == 8 and lc.pool.size == 0 and lc.held == []
    finally:
        await lc.close()
    assert wait_gone(labels) == []


def test_expect_takes_a_count():
    lc = RolloutSandboxes(SandboxSpec(), "local")
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError):
            lc.expect(bad)  # type: ignore[arg-type]
    lc.expect(2)
    lc.expect(3)
    assert lc.expected == 5  # overlapping runs add up
