"""The agent keeps answering while its sandbox is at its pids limit.

A fork bomb (or any flood of processes) fills the pids cgroup the agent shares with
the sandbox's code, so the agent cannot start a thread for the next request. It keeps
spare request threads and answers requests that cannot block (kill, poll, ping) on its
reading thread; any other request waits for a free worker instead of failing. Found by
fresh-clone CI: run alone, a bomb filled the limit before the agent started the next
request's thread, and the rollout became an infrastructure error instead of a scored
failure. Real Docker engine, a container and a cell (runc).
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.docker

# sleeps until no pid is left: a steady flood (a bomb that stops at the limit); it starts after a
# moment, once the agent's pumps for it run (a process that fills the limit before its pumps start
# is killed and refused: test_agent.py::test_a_process_whose_pumps_cannot_start_is_killed)
FILL = "sleep 0.5; while true; do sleep 600 & done 2>/dev/null"


async def pids_full(sb) -> bool:
    """The sandbox's pids cgroup is at its limit (read through the agent: no process needed)."""
    for d in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids"):
        try:
            cur = int((await sb.read_file(f"{d}/pids.current")).split()[0])
            top = int((await sb.read_file(f"{d}/pids.max")).split()[0])
        except Exception:  # noqa: BLE001 - not this cgroup layout
            continue
        return cur >= top - 1
    raise AssertionError("no pids cgroup visible in the sandbox")


@pytest.mark.parametrize("isolation", ["container", "namespace"])
async def test_requests_are_answered_at_the_pids_limit(docker_backend, docker_spec, isolation):
    spec = docker_spec.model_copy(update={"rollout_isolation": isolation, "memory_gb": 0.5, "pids_limit": 48})
    sb = await docker_backend.create(spec)
    try:
        await sb.write_file("/tmp/probe.txt", "here\n")
        flood = await sb.start_process(["bash", "-c", FILL])
        for _ in range(100):
            if await pids_full(sb):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the flood never filled the pids limit")
        # more requests at once than the agent has spare threads: none may fail, each waits its turn
        reads = await asyncio.wait_for(asyncio.gather(*(sb.read_file("/tmp/probe.txt") for _ in range(6))), 30)
        assert reads == [b"here\n"] * 6
        assert await asyncio.wait_for(sb.ping(), 30) >= 0
        # the flood still holds every pid: a new command cannot start (a task error, not a dead agent)
        assert await pids_full(sb)
        await asyncio.wait_for(flood.kill(group=True), 30)
        for _ in range(50):  # the group is SIGKILLed; its sleeps go as the kernel reaps them
            if not await pids_full(sb):
                break
            await asyncio.sleep(0.1)
        r = await asyncio.wait_for(sb.exec("echo still-here"), 30)
        assert r.ok and r.stdout.strip() == "still-here", r
    finally:
        await sb.delete()

