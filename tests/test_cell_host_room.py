"""A full cell host whose cells are being closed takes the next cell once one is gone,
instead of a new host being started for a moment's overflow (a warm pool's refill racing
the close of the cell it replaces); a full host with nothing closing still gets a new host
at once. On the real Docker engine (runc)."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import DEFAULT_TEST_IMAGE, leftover_containers, require_docker
from sandboxes import SandboxSpec
from sandboxes.cells import ROOM_WAIT_SECONDS
from test_sandbox_env import unique_labels

pytestmark = pytest.mark.docker


@pytest.fixture
async def two_cell_hosts():
    """A Docker backend whose cell hosts hold two cells each, and the labels of its sandboxes."""
    require_docker()
    from backends.docker import DockerBackend
    from backends.docker.images import ensure_image

    await asyncio.to_thread(ensure_image, DEFAULT_TEST_IMAGE)
    labels = unique_labels()
    be = DockerBackend(cells_per_host=2)
    try:
        yield be, labels
    finally:
        await be.close()
        assert await asyncio.to_thread(leftover_containers, {"vf-test-case": labels["vf-test-case"]}) == []


def spec(labels: dict[str, str]) -> SandboxSpec:
    return SandboxSpec(image=DEFAULT_TEST_IMAGE, labels=labels, rollout_isolation="namespace", memory_gb=0.5,
                       timeout_minutes=5)


async def test_a_cell_waits_for_a_closing_cell_rather_than_a_new_host(two_cell_hosts):
    be, labels = two_cell_hosts
    a, b = await asyncio.gather(be.create(spec(labels)), be.create(spec(labels)))
    host = a.host
    assert b.host is host and not host.admits
    closing = asyncio.ensure_future(a.delete())
    while host.closing == 0:  # the close is asked (the host still counts the cell as open)
        assert not closing.done()
        await asyncio.sleep(0)
    assert not host.admits and host.admits_after_closes
    c = await be.create(spec(labels))
    await closing
    assert c.host is host, "a new host was started while a cell of the full one was closing"
    assert be.cells.stats["hosts"] == 1
    assert (await c.exec("echo ok")).stdout == "ok\n"
    # full, nothing closing: a new host at once (no wait for room that will not come)
    t0 = time.monotonic()
    d = await be.create(spec(labels))
    assert d.host is not host and be.cells.stats["hosts"] == 2
    assert time.monotonic() - t0 < ROOM_WAIT_SECONDS
    assert (await d.exec("echo ok")).stdout == "ok\n"
    await asyncio.gather(b.delete(), c.delete(), d.delete())
