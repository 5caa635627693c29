"""Faults of a cell host (the container that holds a run's cells), real Docker:

- the host killed under a running SandboxEnv eval with the default warm pool:
  the dead host is forgotten at once (its pooled cells dropped), the rollouts'
  retries get cells of a NEW host and the run completes;
- `vf-sandbox eval` with cells sent SIGINT three times in quick succession:
  no container of the run is left, the exit is 130 and no teardown error has an
  empty reason;
- the client SIGKILLed: its cell host ends by itself (the host agent sees its
  channel close) within the cells' lifetime plus a small slack, not at the
  host container's own lifetime; and that lifetime is bounded too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from testmodel.model_server import ModelServer, PolicyRequest, tool_script
from sandboxes.cells import host_spec
from sandboxes import SandboxSpec
from test_sandbox_env import (
    REPO,
    SIGNAL_ENV,
    bash_env,
    container_of,
    containers_with,
    processes_in,
    run_env,
    tool_messages,
    unique_labels,
    wait_gone,
)

pytestmark = pytest.mark.docker


async def test_killed_cell_host_retries_land_on_a_new_host_and_the_run_completes():
    """`docker kill` of the cell host while two rollouts run in it, with the default warm
    pool of cells (two per running rollout, all on that host) and 2 retries: every
    rollout ends solved after at most one retry, no rollout is handed a cell already
    known dead, and the retries run on cells of another host."""
    import docker

    labels = unique_labels()
    env = bash_env(labels, n=4)  # rollout_isolation="auto": cells on Docker, default warm pool
    killed: list[str] = []
    acquired: list[tuple[str, bool]] = []  # (sandbox id, known gone when handed out)
    kill_at: list[int] = []
    acquire = env.sandboxes.acquire  # the run's one sandbox lifecycle

    async def recording_acquire(*args, **kwargs):
        sb = await acquire(*args, **kwargs)
        acquired.append((sb.id, sb.known_gone()))
        return sb

    env.sandboxes.acquire = recording_acquire

    def second_call(req: PolicyRequest) -> dict:
        if not killed:
            host = container_of(sorted(env.active_sandboxes)[0])
            client = docker.from_env()
            client.containers.get(host).kill()
            client.close()
            killed.append(host)
            kill_at.append(len(acquired))
        return {"command": "echo after"}

    policy = tool_script([("bash", {"command": "echo before"}), ("bash", second_call)])
    rows = await run_env(env, policy, n=4, max_retries=2, concurrency=2)
    assert env.rollout_isolation_in_use() == "namespace"
    assert len(killed) == 1
    assert [r["error"] for r in rows] == [None] * 4, [r["error"] for r in rows]
    assert all(tool_messages(r) == ["before", "after"] for r in rows)
    assert any(r["attempts"] == 2 for r in rows)  # the rollouts in the killed host ran again...
    assert all(r["attempts"] <= 2 for r in rows), [r["attempts"] for r in rows]  # ...once: never on its cells again
    assert not [i for i, gone in acquired if gone], acquired  # no rollout was handed a dead cell
    hosts_after = [container_of(i) for i, _ in acquired[kill_at[0]:]]
    assert [h for h in hosts_after if h != killed[0]], (killed, hosts_after)  # a new host served the retries
    assert wait_gone(labels) == []


# --------------------------------------------------------------------------- three quick Ctrl-C


def test_three_quick_sigints_leave_no_cell_host(tmp_path):
    """Ctrl-C pressed three times within a second while four rollouts run commands in
    their cells (and the warm pool holds spares): the run stops with 130 and removes its
    cell host itself (within seconds, not at the host's lifetime); a teardown error, if
    any, says what it was."""
    label = uuid.uuid4().hex[:12]
    labels = {"vf-test-case": label}
    pkg = tmp_path / "environments" / "sig_env"
    pkg.mkdir(parents=True)
    (pkg / "sig_env.py").write_text(SIGNAL_ENV)
    (tmp_path / "no-endpoints.toml").write_text("")
    policy = tool_script([("bash", {"command": "sleep 25"})])
    with ModelServer(policy).run_in_thread() as srv:
        cmd = [sys.executable, "-m", "vfcli.app", "eval", "sig-env", "-p", str(tmp_path / "environments"),
               "-e", str(tmp_path / "no-endpoints.toml"), "-k", "VF_SIG_KEY", "-m", "test-model", "-b", srv.base_url,
               "-n", "4", "-r", "1", "-c", "4", "-d", "-a", json.dumps({"label": label, "rollout_isolation": "auto"})]
        env = {**os.environ, "VF_SIG_KEY": "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 90
            while processes_in(labels, "sleep 25") < 4 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.3)
            assert processes_in(labels, "sleep 25") >= 4, "rollouts never ran their commands"
            assert len(containers_with(labels)) == 1  # the run's one cell host
            for _ in range(3):
                proc.send_signal(signal.SIGINT)
                time.sleep(0.15)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, f"{proc.returncode}\n{out[-3000:]}"
    assert "teardown failed: \n" not in out and not out.rstrip().endswith("teardown failed:"), out[-3000:]
    assert wait_gone(labels, timeout=15) == [], out[-3000:]


# --------------------------------------------------------------------------- client SIGKILLed

LIFETIME_S = 10  # the cells' lifetime in these tests
SLACK_S = 15

CLIENT = textwrap.dedent('''
    import asyncio, sys, json
    from backends.docker import DockerBackend
    from sandboxes import SandboxSpec

    async def main():
        backend = DockerBackend()
        spec = SandboxSpec(image="vf-sandbox/python:3.11", memory_gb=1, timeout_minutes=%r,
                           labels=json.loads(sys.argv[1]), rollout_isolation="namespace")
        cells = [await backend.create(spec) for _ in range(2)]
        await cells[0].start_process(["sleep", "600"])
        print(cells[0].id, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
''' % (LIFETIME_S / 60))


def test_sigkilled_client_leaves_no_cell_host_past_the_cells_lifetime():
    labels = unique_labels()
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(labels)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip(), proc.stderr.read()[-3000:] if proc.poll() is not None else "no cell id"
        (host,) = containers_with(labels)
        cmd = subprocess.run(["docker", "inspect", "-f", "{{json .Config.Cmd}}", host], capture_output=True,
                             text=True).stdout
        assert json.loads(cmd)[:3] == ["timeout", "-s", "KILL"]
        assert int(json.loads(cmd)[3].rstrip("s")) <= 2 * LIFETIME_S + 60  # its own lifetime, the backstop
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        killed_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = wait_gone(labels, timeout=LIFETIME_S + SLACK_S)
    assert left == [], f"cell host still there {time.monotonic() - killed_at:.0f} s after its client was SIGKILLed"


def test_cell_host_lifetime_is_bounded_by_its_cells_lifetime():
    """The backstop when nothing closes the host's channel: the host container's own
    lifetime is the time it admits cells plus one cell lifetime plus a small slack (was
    twice the cells' lifetime + 5 min), and every cell admitted still gets its whole lifetime."""
    from sandboxes.cells import ADMIT_SECONDS_MAX, HOST_SLACK_SECONDS, admit_seconds

    for minutes in (0.5, 10, 60, 24 * 60):
        spec = SandboxSpec(image="i", timeout_minutes=minutes)
        lifetime = minutes * 60
        admit = admit_seconds(spec)
        assert 0 < admit <= min(lifetime, ADMIT_SECONDS_MAX)
        host = host_spec(spec, 4)
        assert host.timeout_minutes * 60 == pytest.approx(admit + lifetime + HOST_SLACK_SECONDS)
        assert HOST_SLACK_SECONDS <= 60


# --------------------------------------------------------------------------- auto's one switch


async def test_auto_picks_cells_only_from_a_host_with_the_required_hardening(monkeypatch):
    """`sandboxes.cells.AUTO_HARDENING` is the one switch: a cell host whose agent reports
    less hardening than it requires gets the env a container per rollout under "auto"."""
    import sandboxes.cells as cells

    monkeypatch.setattr(cells, "AUTO_HARDENING", cells.AUTO_HARDENING + 1)
    labels = unique_labels()
    env = bash_env(labels, n=2)
    rows = await run_env(env, tool_script([("bash", {"command": "echo ok"})]), n=2, concurrency=2)
    assert [r["error"] for r in rows] == [None, None]
    assert [tool_messages(r)[0].strip() for r in rows] == ["ok", "ok"]
    assert env.rollout_isolation_in_use() == "container"
    assert wait_gone(labels) == []
