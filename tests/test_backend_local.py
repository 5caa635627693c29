"""Local backend specifics: the bubblewrap confinement (root dir as `/`,
network and pid namespaces), the unconfined fallback and its warning, the
sandbox directory lifecycle, attaching from a second backend instance, and
the reaper."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from backends.local import LocalBackend
from backends.local import isolation
from sandboxes import SandboxNotRunning, SandboxSpec, get_backend

IFACES = "python3 -c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'"


@pytest.fixture
async def backend(tmp_path):
    be = LocalBackend(base_dir=str(tmp_path / "sandboxes"))
    yield be
    await be.delete_many()


@pytest.fixture
def need_bwrap(backend):
    if backend.bwrap is None:
        pytest.skip("bubblewrap is not usable on this machine (scripts/setup.sh installs it)")


async def test_registry_builds_the_local_backend(tmp_path):
    assert isinstance(get_backend("local", base_dir=str(tmp_path)), LocalBackend)


async def test_bwrap_root_is_the_sandbox_directory(backend, need_bwrap):
    async with await backend.create(SandboxSpec()) as sb:
        root = backend.base / sb.id / "root"
        assert (await sb.exec("echo hi > /marker && echo $HOME && hostname")).stdout == "/root\nsandbox\n"
        assert (root / "marker").read_text() == "hi\n"
        assert not os.path.exists("/marker")
        assert (await sb.exec("touch /usr/forbidden")).exit_code != 0  # system dirs are read-only
        assert (await sb.exec(IFACES)).stdout.strip() == "['lo']"  # network off by default
        n = int((await sb.exec("ls /proc | grep -c '^[0-9]'")).stdout)
        assert n < 20  # own pid namespace: only the agent's processes are visible
    assert not (backend.base / sb.id).exists()


async def test_bwrap_network_on_and_workdir(backend, need_bwrap):
    async with await backend.create(SandboxSpec(network=True, workdir="/work/dir")) as sb:
        assert (await sb.exec(IFACES)).stdout.strip() != "['lo']"
        assert (await sb.exec("pwd")).stdout == "/work/dir\n"


async def test_unconfined_fallback_warns_once_and_stays_in_its_directory(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(isolation, "_warned", False)
    be = LocalBackend(base_dir=str(tmp_path / "plain"), use_bwrap=False)
    with caplog.at_level(logging.WARNING, logger="backends.local.isolation"):
        a = await be.create(SandboxSpec())
        b = await be.create(SandboxSpec())
    warnings = [r for r in caplog.records if "NOT a security boundary" in r.getMessage()]
    assert len(warnings) == 1
    root = be.base / a.id / "root"
    r = await a.exec("pwd; echo $TMPDIR; mktemp -d")
    pwd, tmpdir, made = r.stdout.split()
    assert pwd == str(root) and tmpdir == str(root / "tmp") and made.startswith(str(root / "tmp"))
    await a.delete()
    await b.delete()
    assert not (be.base / a.id).exists()


async def test_second_backend_instance_attaches_by_id(backend, tmp_path):
    sb = await backend.create(SandboxSpec(labels={"who": "first"}))
    d = (await sb.exec("mktemp -d")).stdout.strip()
    await sb.write_file(f"{d}/f", "shared")
    other = LocalBackend(base_dir=str(backend.base), use_bwrap=backend.bwrap is not None)
    [info] = await other.list({"who": "first"})
    assert info.id == sb.id and info.status == "running"
    again = await other.get(sb.id)
    assert await again.read_file(f"{d}/f") == b"shared"
    await again.delete()  # deleting through either handle removes the sandbox
    with pytest.raises(SandboxNotRunning):
        await backend.get(sb.id)
    assert not await sb.alive()


async def test_reaper_removes_expired_and_orphaned_sandboxes(backend):
    short = await backend.create(SandboxSpec(timeout_minutes=0.001))
    keep = await backend.create(SandboxSpec())
    await asyncio.sleep(0.1)
    assert await backend.reap() == [short.id]
    assert [i.id for i in await backend.list()] == [keep.id]
    meta = (backend.base / keep.id / "meta.json")
    meta.write_text(meta.read_text().replace(f'"vf-sandbox.owner-pid":"{os.getpid()}"', '"vf-sandbox.owner-pid":"999999999"'))
    assert await backend.reap() == [keep.id]
    assert await backend.list() == []


async def test_bad_ids_are_not_paths(backend):
    for bad in ("", "..", "a/b"):
        with pytest.raises(SandboxNotRunning):
            await backend.get(bad)


async def test_lifecycle_cleanup_removes_tracked_sandboxes(backend):
    from sandboxes import lifecycle

    sb = await backend.create(SandboxSpec())
    assert sb.id in lifecycle.live()
    assert lifecycle.cleanup_all() >= 1
    assert not (backend.base / sb.id).exists()
    other = await backend.create(SandboxSpec())
    await other.delete()
    assert other.id not in lifecycle.live()
