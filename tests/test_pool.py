"""SandboxPool on the real engine: warm acquire is a queue pop, released
sandboxes are deleted (never reused), the pool refills, close deletes all."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from sandboxes import BackendUnavailable, RetryPolicy
from sandboxes.pool import SandboxPool

pytestmark = pytest.mark.docker


async def wait_until(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await pred():
            return True
        await asyncio.sleep(0.05)
    return False


def tagged(spec):
    """The spec with a label unique to this test (other suites share vf-sandbox.test=1)."""
    tag = uuid.uuid4().hex[:8]
    return spec.model_copy(update={"labels": {**spec.labels, "case": tag}}), {"case": tag}


async def test_acquire_warm_release_refill_no_reuse(docker_backend, docker_spec):
    docker_spec, case = tagged(docker_spec)
    async with SandboxPool(docker_spec, size=2, backend=docker_backend) as pool:
        await pool.start(wait=True, timeout=60)
        assert pool.ready == 2
        t0 = time.perf_counter()
        a = await pool.acquire()
        assert time.perf_counter() - t0 < 0.05
        assert pool.stats["warm"] == 1
        await a.write_file("/tmp/dirty", "from a")
        assert (await a.exec("cat /tmp/dirty")).stdout == "from a"
        await pool.release(a)
        assert await wait_until(lambda: _gone(docker_backend, a.id)), "released sandbox not deleted"
        assert await wait_until(lambda: _async(pool.ready == 2)), "pool did not refill"
        b = await pool.acquire()
        assert b.id != a.id
        assert (await b.exec("cat /tmp/dirty")).exit_code != 0  # a fresh sandbox
        async with pool.sandbox() as c:
            assert c.id not in (a.id, b.id) and (await c.exec("echo ok")).ok
        held = [b.id, c.id]
        await pool.release(b)
    # closed: everything the pool held is gone
    for sid in held:
        assert await wait_until(lambda sid=sid: _gone(docker_backend, sid))
    assert await docker_backend.list(case) == []


async def test_cold_acquire_and_stale_replaced(docker_backend, docker_spec):
    pool = SandboxPool(docker_spec, size=1, backend=docker_backend, max_idle_seconds=1.5)
    try:
        sb = await pool.acquire(timeout=60)  # empty pool: waits for the creation in flight
        assert pool.stats["cold"] == 1 and (await sb.exec("true")).ok
        await pool.release(sb)
        assert await wait_until(lambda: _async(pool.ready == 1))
        stale_id = pool._ready._queue[0][1].id
        await asyncio.sleep(1.6)
        fresh = await pool.acquire(timeout=60)  # the idle one is too old: replaced, not handed out
        assert fresh.id != stale_id and pool.stats["cold"] == 2
        assert await wait_until(lambda: _gone(docker_backend, stale_id))
        await pool.release(fresh)
    finally:
        await pool.close()


async def test_close_deletes_ready_and_inflight(docker_backend, docker_spec):
    docker_spec, case = tagged(docker_spec)
    pool = SandboxPool(docker_spec, size=3, backend=docker_backend)
    await pool.start()
    await asyncio.sleep(0.3)  # some creations still in flight
    await pool.close()
    assert await docker_backend.list(case) == []
    with pytest.raises(RuntimeError):
        await pool.acquire()


async def test_pool_reports_backend_down(tmp_path, docker_spec):
    from backends.docker import DockerBackend

    be = DockerBackend(url=f"unix://{tmp_path}/none.sock", retry=RetryPolicy(attempts=1))
    pool = SandboxPool(docker_spec, size=1, backend=be, error_backoff=0.01)
    with pytest.raises(BackendUnavailable):
        await pool.start(wait=True, timeout=10)
    await pool.close()
    await be.close()


async def _async(value):
    return value


async def _gone(backend, sid):
    return not await backend._running(sid) and sid not in {i.id for i in await backend.list()}
