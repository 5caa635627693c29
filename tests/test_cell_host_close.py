"""Closing a backend whose cell host cannot be deleted says so (real Docker, runc).

`CellHosts.close` deletes every host at once; a failure used to vanish
(`gather(..., return_exceptions=True)` with the results dropped). Now each failure
is logged with the host's id and how to remove it, and the other hosts are still
deleted; the failed one is labelled, so the reaper (or a second delete) removes it.
"""

from __future__ import annotations

import logging

import pytest

from sandboxes import InfraError

pytestmark = pytest.mark.docker


async def test_a_host_that_cannot_be_deleted_is_named_in_the_log(docker_backend, docker_spec, caplog):
    be = docker_backend
    spec = docker_spec.model_copy(update={"rollout_isolation": "namespace", "memory_gb": 0.5, "pids_limit": 64})
    cell = await be.create(spec)
    host = cell.host.sandbox
    real_delete = host.delete

    async def failing_delete() -> None:
        raise InfraError("engine unreachable (injected)")

    host.delete = failing_delete
    try:
        with caplog.at_level(logging.WARNING, logger="sandboxes.cells"):
            await be.cells.close()
        text = caplog.text
        assert host.id in text and "engine unreachable (injected)" in text and "sandboxes reap" in text, text
        assert (await host.exec("echo alive")).stdout == "alive\n"  # really not deleted: the log was right
    finally:
        host.delete = real_delete
        await host.delete()
