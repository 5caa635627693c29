"""SandboxEnv takes its sandboxes from a warm pool by default, sized from the
concurrency, and deletes every one of them at teardown (real Docker);
`pool_size=0` opts out. The reference's per-operation retry knobs
(`max_retries`, `base_delay`...) become the backend's retry policy, with
`max_retries` = extra tries after the first."""

from __future__ import annotations

import pytest

import envs as vf
from testmodel.model_server import ModelServer, tool_script
from sandboxes import ConfigError, RetryPolicy
from test_sandbox_env import bash_env, containers_with, tool_messages, unique_labels, wait_gone

pytestmark = pytest.mark.docker

POLICY = tool_script([("bash", {"command": "cd /tmp; echo $((6*7))"})])


async def evaluate_keeping_pool(env, n: int, concurrency: int):
    """Evaluate, look at the pool before teardown, then tear down."""
    from openai import AsyncOpenAI

    async with ModelServer(POLICY) as srv:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))
        try:
            out = await env.evaluate(client, "m", num_examples=n, rollouts_per_example=1, max_concurrent=concurrency)
            pool = env._pool
            stats = dict(pool.stats) if pool is not None else None
            size = pool.size if pool is not None else 0
        finally:
            await env.teardown()
    return list(out["outputs"]), stats, size


async def test_default_env_uses_a_pool_sized_from_concurrency_and_leaves_nothing():
    labels = unique_labels()
    env = bash_env(labels, n=6, rollout_isolation="container")  # cells: tests/test_rollout_isolation_auto.py
    assert env.pool_size is None and env.effective_pool_size == 0  # concurrency not known yet
    rows, stats, size = await evaluate_keeping_pool(env, n=6, concurrency=2)
    assert [tool_messages(r)[0] for r in rows] == ["42"] * 6 and all(r["error"] is None for r in rows)
    assert env.effective_pool_size == 2 and stats["acquired"] == 6 and stats["created"] >= 6, stats
    assert size == 0  # its refill target once the run's 6 rollouts had theirs (tests/test_pool_demand.py)
    assert env._pool is None
    assert wait_gone(labels) == []  # pooled spares deleted at teardown, nothing leaks


async def test_set_concurrency_sizes_the_pool_and_is_capped():
    env = bash_env(unique_labels())
    env.set_concurrency(3)
    assert env.effective_pool_size == 3
    env.set_concurrency(1000)
    assert env.effective_pool_size == env.max_default_pool_size
    fixed = bash_env(unique_labels(), pool_size=5)
    fixed.set_concurrency(1000)
    assert fixed.effective_pool_size == 5
    cells = bash_env(unique_labels(), rollout_isolation="namespace")  # cells are cheap: two per rollout
    cells.set_concurrency(16)
    assert cells.effective_pool_size == 32  # with the 16 running: room in one host of 64 for cells being closed
    cells.set_concurrency(1000)
    assert cells.effective_pool_size == 2 * cells.max_default_pool_size
    with pytest.raises(ConfigError):
        bash_env(unique_labels(), pool_size=-1)


async def test_pool_size_zero_opts_out():
    labels = unique_labels()
    env = bash_env(labels, n=3, pool_size=0)
    rows, stats, _ = await evaluate_keeping_pool(env, n=3, concurrency=3)
    assert stats is None and all(r["error"] is None for r in rows)
    assert containers_with(labels) == [] or wait_gone(labels) == []


def test_reference_retry_knobs_set_the_backend_policy():
    env = vf.SandboxEnv(max_retries=0, base_delay=0.1, backoff_factor=3, max_backoff_seconds=2, jitter=0)
    assert env.backend.retry == RetryPolicy(attempts=1, initial_delay=0.1, exp_base=3, max_delay=2, jitter=0)
    env = vf.SandboxEnv(max_retries=4)
    assert env.backend.retry.attempts == 5 and env.backend.retry.max_retries == 4
    assert vf.SandboxEnv().backend.retry == RetryPolicy()  # no knob: the backend's default
    with pytest.raises(ConfigError):
        vf.SandboxEnv(base_delay=-1)


async def test_warm_up_fills_the_pool_before_the_first_rollout():
    """`warm_up` (an RL trainer before its first step, a benchmark before its clock): the
    pool is full when it returns, the rollouts then take warm sandboxes; no pool: 0."""
    labels = unique_labels()
    env = bash_env(labels, n=3, rollout_isolation="container")
    try:
        assert await env.warm_up(3) == 3
        assert len(containers_with(labels)) == 3 and env._pool.stats["acquired"] == 0
        rows, stats, _ = await evaluate_keeping_pool(env, n=3, concurrency=3)
        assert [tool_messages(r)[0] for r in rows] == ["42"] * 3 and stats["warm"] == 3, stats
    finally:
        await env.teardown()
    assert wait_gone(labels) == []
    assert await bash_env(unique_labels(), pool_size=0).warm_up(4) == 0
