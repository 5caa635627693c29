"""Lifecycle: no container outlives its process after an exception, SIGINT or
SIGTERM (real child processes), SIGKILL leaves them for the reaper, which
removes them (and only them); the CLIs list and reap."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT
from sandboxes import SandboxInfo, lifecycle
from sandboxes import labels as L

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from sandboxes import SandboxSpec, get_backend, lifecycle

    mode, image = sys.argv[1], sys.argv[2]

    async def main():
        be = get_backend("docker")
        spec = SandboxSpec(image=image, labels={"vf-sandbox.test": "1"}, timeout_minutes=10)
        sbs = await asyncio.gather(be.create(spec), be.create(spec))
        print(" ".join(s.id for s in sbs), flush=True)
        if mode == "raise":
            raise RuntimeError("boom")
        await asyncio.sleep(120)

    if mode == "bare":
        asyncio.run(main())
    else:
        with lifecycle.cleanup_on_exit():
            asyncio.run(main())
    """
)


def container_exists(cid: str) -> bool:
    from backends.docker.backend import _sync_conn, resolve_url

    conn = _sync_conn(resolve_url(), 10)
    try:
        conn.request("GET", f"/containers/{cid}/json")
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    finally:
        conn.close()


def run_child(mode: str, image: str, tmp_path) -> tuple[subprocess.Popen, list[str]]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), mode, image], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        pytest.fail(f"child produced no ids: {proc.stderr.read()[-2000:]}")
    return proc, line.split()


@pytest.mark.docker
@pytest.mark.parametrize("how", ["raise", "sigint", "sigterm"])
def test_no_leak_after_exception_or_signal(how, python_image, tmp_path):
    proc, ids = run_child("raise" if how == "raise" else "sleep", python_image, tmp_path)
    try:
        assert len(ids) == 2 and all(container_exists(i) for i in ids)
        if how != "raise":
            proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        code = proc.wait(30)
        assert code != 0
        if how == "sigterm":
            assert code == -signal.SIGTERM  # died of the signal after cleaning up
        if how == "sigint":
            assert "KeyboardInterrupt" in proc.stderr.read()
        assert [i for i in ids if container_exists(i)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
        from backends.docker import remove_container_sync, resolve_url

        for i in ids:
            remove_container_sync(resolve_url(), i)


@pytest.mark.docker
async def test_sigkill_then_reap(python_image, tmp_path, docker_backend, docker_spec):
    mine = await docker_backend.create(docker_spec)  # owned by this (live) process: must survive the reaper
    proc, ids = run_child("bare", python_image, tmp_path)
    proc.kill()
    proc.wait(10)
    try:
        assert all(container_exists(i) for i in ids), "SIGKILL leaves containers: the reaper's job"
        reaped = await lifecycle.reap(docker_backend)
        reaped_ids = {info.id for info, _ in reaped}
        assert set(ids) <= reaped_ids and all(why == "owner-dead" for _, why in reaped if _.id in ids)
        assert mine.id not in reaped_ids
        assert [i for i in ids if container_exists(i)] == []
        assert (await mine.exec("echo alive")).ok
    finally:
        await mine.delete()


@pytest.mark.docker
async def test_cli_ls_and_reap(docker_backend, docker_spec):
    from typer.testing import CliRunner

    from sandboxes.cli import app

    sb = await docker_backend.create(docker_spec)
    try:
        runner = CliRunner()
        out = await asyncio.to_thread(runner.invoke, app, ["ls"])
        assert out.exit_code == 0, out.output
        line = next(ln for ln in out.output.splitlines() if ln.startswith(sb.id[:12]))
        assert "running" in line and f"{os.getpid()}@" in line and " yes " in line
        out = await asyncio.to_thread(runner.invoke, app, ["reap", "--dry-run"])
        assert out.exit_code == 0 and sb.id[:12] not in out.output
    finally:
        await sb.delete()


def test_cli_reports_daemon_down(monkeypatch):
    from typer.testing import CliRunner

    from sandboxes.cli import app

    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/vf-no-daemon-here.sock")
    out = CliRunner().invoke(app, ["ls"])
    assert out.exit_code == 1 and "/tmp/vf-no-daemon-here.sock" in out.output


def test_cleanup_all_runs_every_remover_once(monkeypatch):
    monkeypatch.setattr(lifecycle, "_live", {})  # this process's earlier tests may still track sandboxes
    removed = []
    lifecycle.track("a", lambda: removed.append("a"))
    lifecycle.track("b", lambda: removed.append("b"))
    lifecycle.track("c", lambda: (_ for _ in ()).throw(OSError("daemon gone")))  # a failing remover
    lifecycle.untrack("b")
    assert lifecycle.cleanup_all() == 2
    assert removed == ["a"] and lifecycle.live() == []
    assert lifecycle.cleanup_all() == 0


def test_cleanup_all_from_atexit_after_threading_shut_down(tmp_path):
    """atexit runs after threading's shutdown, when executors refuse new work: cleanup_all
    (registered with atexit by install_cleanup_handlers and the framework integrations)
    still runs every remover."""
    out = tmp_path / "removed"
    code = textwrap.dedent(f"""
        import atexit, concurrent.futures
        from sandboxes import lifecycle
        for name in ("a", "b"):
            lifecycle.track(name, lambda name=name: open({str(out)!r}, "a").write(name))
        atexit.register(lifecycle.cleanup_all)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert sorted(out.read_text()) == ["a", "b"]


@pytest.mark.parametrize("held", ["thread-pool", "threading"])
def test_signal_while_the_main_thread_holds_a_stdlib_lock(held, tmp_path):
    """SIGTERM can interrupt the main thread inside `ThreadPoolExecutor.submit` (asyncio's
    `to_thread`, holding the pools' global lock) or `Thread.start` (threading's own lock):
    seen as a child that ignored SIGTERM for good, mid-fork under load. The handler's clean-up
    takes neither lock: every remover runs and the process dies of the signal."""
    out = tmp_path / "removed"
    code = textwrap.dedent(f"""
        import concurrent.futures.thread, sys, threading, time
        from sandboxes import lifecycle
        lock = {{"thread-pool": concurrent.futures.thread._global_shutdown_lock,
                "threading": threading._active_limbo_lock}}[{held!r}]
        with lifecycle.cleanup_on_exit():
            for name in "abc":
                lifecycle.track(name, lambda name=name: open({str(out)!r}, "a").write(name))
            with lock:
                print("ready", flush=True)
                time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        proc.kill()
    assert code == -signal.SIGTERM, proc.stderr.read()[-2000:]
    assert sorted(out.read_text()) == ["a", "b", "c"]


def test_cleanup_on_exit_scope_and_handlers_restored():
    before = signal.getsignal(signal.SIGTERM)
    removed = []
    with pytest.raises(RuntimeError):
        with lifecycle.cleanup_on_exit():
            assert signal.getsignal(signal.SIGTERM) is not before
            lifecycle.track("x", lambda: removed.append("x"))
            raise RuntimeError("boom")
    assert removed == ["x"]
    assert signal.getsignal(signal.SIGTERM) is before


def _info(**labels) -> SandboxInfo:
    return SandboxInfo(id="i", name="n", backend="docker", status="running", labels=labels)


def test_reapable_rules():
    me = {L.MANAGED: "true", L.OWNER_PID: str(os.getpid()), L.OWNER_HOST: os.uname().nodename,
          L.OWNER_START: L.process_start_time(os.getpid()), L.EXPIRES_AT: str(time.time() + 60)}
    assert lifecycle.reapable(_info(**me)) is None
    assert lifecycle.reapable(_info(**{**me, L.EXPIRES_AT: str(time.time() - 1)})) == "expired"
    assert lifecycle.reapable(_info(**{**me, L.EXPIRES_AT: str(time.time() - 1)}), include_expired=False) is None
    assert lifecycle.reapable(_info(**{**me, L.OWNER_START: "1"})) == "owner-dead"  # pid reused
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert lifecycle.reapable(_info(**{**me, L.OWNER_PID: str(dead.pid), L.OWNER_START: ""})) == "owner-dead"
    assert lifecycle.reapable(_info(**{**me, L.OWNER_HOST: "elsewhere"})) is None
    assert lifecycle.reapable(_info(**{**me, L.MANAGED: "false", L.OWNER_START: "1"})) is None
