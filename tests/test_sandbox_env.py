"""SandboxEnv on real Docker: whole rollouts driven by the local model server
with scripted tool calls. Persistence of the shell, timeouts, output cap,
a container killed mid-rollout (retried on a fresh sandbox), and no sandbox
left behind after a normal run, an exception, SIGINT or SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

import envs as vf
from testmodel.model_server import ModelServer, PolicyRequest, tool_script

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- helpers (also used by test_python_env)


def unique_labels() -> dict[str, str]:
    """Test labels plus a per-test run label to find exactly this test's containers."""
    return {"vf-sandbox.test": "1", "vf-test-case": uuid.uuid4().hex[:12]}


def containers_with(labels: dict[str, str]) -> list[str]:
    """Names of ALL containers (running or not) carrying `labels` (docker ps -a by label)."""
    import docker

    client = docker.from_env()
    try:
        # the low-level list: the high-level one inspects each container afterwards and
        # raises NotFound when one is auto-removed in between
        found = client.api.containers(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
        return [c["Names"][0].lstrip("/") for c in found]
    finally:
        client.close()


def wait_gone(labels: dict[str, str], timeout: float = 20.0) -> list[str]:
    """Containers still there after `timeout` (AutoRemove may lag a moment after a kill)."""
    deadline = time.monotonic() + timeout
    left = containers_with(labels)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = containers_with(labels)
    return left


def tool_messages(row: dict[str, Any]) -> list[str]:
    return [m["content"] for m in row["completion"] if m.get("role") == "tool"]


async def run_env(env: vf.Environment, policy, n: int = 1, max_retries: int = 0, concurrency: int = -1) -> list[dict]:
    """Evaluate `env` on `n` examples against a local model server playing `policy`; tears down."""
    async with ModelServer(policy) as srv:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))
        try:
            out = await env.evaluate(client, "test-model", num_examples=n, rollouts_per_example=1,
                                     max_retries=max_retries, max_concurrent=concurrency)
        finally:
            await env.teardown()
    return list(out["outputs"])


def dataset(n: int = 1) -> list[dict[str, str]]:
    return [{"question": f"task {i}", "answer": str(i)} for i in range(n)]


def bash_env(labels: dict[str, str], **kw: Any) -> vf.SandboxEnv:
    kw.setdefault("timeout_per_command_seconds", 10)
    return vf.SandboxEnv(dataset=dataset(kw.pop("n", 1)), labels=labels, max_turns=kw.pop("max_turns", 12), **kw)


# --------------------------------------------------------------------------- tool surface


def test_model_sees_one_strict_bash_tool_without_sandbox_args():
    env = vf.SandboxEnv(dataset=dataset())
    assert [t.name for t in env.tool_defs] == ["bash"]
    tool = env.tool_defs[0]
    assert tool.strict is True
    assert tool.parameters["properties"].keys() == {"command"}
    assert tool.parameters["required"] == ["command"]
    assert tool.parameters["additionalProperties"] is False
    assert "sandbox" not in json.dumps(tool.parameters)
    # reference defaults kept
    assert env.sandbox_spec.image == "python:3.11-slim" and env.sandbox_spec.timeout_per_command_seconds == 30


# --------------------------------------------------------------------------- behaviour in a rollout


async def test_shell_state_persists_across_tool_calls():
    labels = unique_labels()
    policy = tool_script([
        ("bash", {"command": "mkdir -p /tmp/work && cd /tmp/work && export GREETING=hello && greet() { echo \"$GREETING $1\"; }"}),
        ("bash", {"command": "pwd; greet world; echo $GREETING > file.txt"}),
        ("bash", {"command": "cat /tmp/work/file.txt; false"}),
    ])
    rows = await run_env(bash_env(labels), policy)
    row = rows[0]
    assert row["error"] is None, row["error"]
    outs = tool_messages(row)
    assert outs[0] == "(no output)"
    assert outs[1] == "/tmp/work\nhello world"
    assert outs[2] == "hello\n[exit code 1]"
    m = row["metrics"]
    assert m["sandbox_command_count"] == 3 and m["bash_calls"] == 3
    assert m["sandbox_ready_wait_time"] > 0 and m["sandbox_command_execution_time"] > 0
    assert m["sandbox_timeout"] == 0 and m["sandbox_oom"] == 0
    assert wait_gone(labels) == []


async def test_timeout_returns_partial_output_and_shell_stays_usable():
    labels = unique_labels()
    policy = tool_script([
        ("bash", {"command": "cd /tmp && X=kept"}),
        ("bash", {"command": "echo started; sleep 60; echo never"}),
        ("bash", {"command": "echo after $X; pwd"}),
    ])
    t0 = time.monotonic()
    rows = await run_env(bash_env(labels, timeout_per_command_seconds=2), policy)
    assert time.monotonic() - t0 < 40
    outs = tool_messages(rows[0])
    assert outs[1].startswith("started\n") and "never" not in outs[1]
    assert "timed out after 2s" in outs[1] and "still usable" in outs[1]
    assert outs[2] == "after kept\n/tmp"
    assert rows[0]["metrics"]["sandbox_timeout"] == 1.0


async def test_output_is_capped_with_head_tail_and_marker():
    labels = unique_labels()
    policy = tool_script([("bash", {"command": "echo FIRST; seq 1 200000; echo LAST"})])
    rows = await run_env(bash_env(labels, output_limit_bytes=2000), policy)
    out = tool_messages(rows[0])[0]
    assert out.startswith("FIRST\n1\n2\n") and out.endswith("199999\n200000\nLAST")
    assert "bytes cut ...]" in out and len(out) < 2200
    cut = int(out.split("[... ")[1].split(" bytes")[0])
    assert cut > 1_000_000


async def test_non_persistent_shell_opt_out():
    labels = unique_labels()
    policy = tool_script([("bash", {"command": "cd /tmp && export A=1"}), ("bash", {"command": "pwd; echo ${A:-unset}"})])
    rows = await run_env(bash_env(labels, persistent_shell=False, workdir="/"), policy)
    assert tool_messages(rows[0])[1] == "/\nunset"


async def test_exception_in_rollout_leaves_no_sandbox():
    labels = unique_labels()

    class Broken(vf.SandboxEnv):
        async def post_sandbox_setup(self, state):
            await self.get_sandbox(state).exec("true")
            raise ValueError("setup hook exploded")

    env = Broken(dataset=dataset(2), labels=labels)
    rows = await run_env(env, tool_script([("bash", {"command": "echo hi"})]), n=2)
    assert all(r["error"] is not None and "setup hook exploded" in json.dumps(r["error"]) for r in rows)
    assert all(r["attempts"] == 1 for r in rows)  # not an infra error: not retried
    assert wait_gone(labels) == []
    assert env.active_sandboxes == set()


def container_of(sandbox_id: str) -> str:
    """The container a sandbox runs in (a cell's is its host's)."""
    from sandboxes.cells import CELL_MARK

    return sandbox_id.split(CELL_MARK)[0]


@pytest.mark.parametrize("mode", ["container", "auto"])
async def test_container_killed_mid_rollout_is_retried_on_fresh_sandbox(mode):
    """The model's second call hits a dead container (with cells: the cell host, and so
    the cell): InfraError out of the tool call, the rollout re-runs on a new sandbox, the
    result is recorded once with attempts=2."""
    import docker

    labels = unique_labels()
    env = bash_env(labels, timeout_per_command_seconds=10, rollout_isolation=mode)
    killed: list[str] = []
    seen_ids: list[str] = []

    def second_call(req: PolicyRequest) -> dict:
        seen_ids.extend(i for i in env.active_sandboxes if i not in seen_ids)
        if not killed:
            client = docker.from_env()
            for cid in list(env.active_sandboxes):
                client.containers.get(container_of(cid)).kill()
                killed.append(cid)
            client.close()
        return {"command": "cat /tmp/marker"}

    policy = tool_script([("bash", {"command": "echo attempt > /tmp/marker && echo written"}), ("bash", second_call)])
    rows = await run_env(env, policy, max_retries=2)
    assert len(rows) == 1
    row = rows[0]
    assert row["error"] is None, row["error"]
    assert row["attempts"] == 2
    assert tool_messages(row) == ["written", "attempt"]  # the second attempt's transcript only
    assert len(killed) == 1 and len(seen_ids) == 2 and seen_ids[0] == killed[0]
    assert wait_gone(labels) == []


@pytest.mark.parametrize("mode", ["container", "auto"])
async def test_killed_container_without_retries_records_infra_error(mode):
    import docker

    labels = unique_labels()
    env = bash_env(labels, rollout_isolation=mode)

    def kill_then(req: PolicyRequest) -> dict:
        client = docker.from_env()
        for cid in list(env.active_sandboxes):
            client.containers.get(container_of(cid)).kill()
        client.close()
        return {"command": "echo unreachable"}

    rows = await run_env(env, tool_script([("bash", {"command": "true"}), ("bash", kill_then)]))
    err = rows[0]["error"]
    assert err is not None and rows[0]["error_kind"] == "infra", err
    assert rows[0]["attempts"] == 1
    assert wait_gone(labels) == []


async def test_warm_pool_serves_rollouts_and_leaves_nothing():
    labels = unique_labels()
    env = bash_env(labels, n=4, pool_size=2)
    rows = await run_env(env, tool_script([("bash", {"command": "cd /tmp; echo $((6*7))"})]), n=4, concurrency=2)
    assert [tool_messages(r)[0] for r in rows] == ["42"] * 4
    assert all(r["error"] is None for r in rows)
    assert wait_gone(labels) == []


# --------------------------------------------------------------------------- signals: no sandbox left


SIGNAL_ENV = '''
import envs as vf

def load_environment(label: str = "", rollout_isolation: str = "auto"):
    return vf.SandboxEnv(dataset=[{"question": f"q{i}", "answer": "a"} for i in range(4)],
                         labels={"vf-sandbox.test": "1", "vf-test-case": label}, max_turns=5,
                         rollout_isolation=rollout_isolation)
'''


def processes_in(labels: dict[str, str], command: str) -> int:
    """Processes running exactly `command` in the containers carrying `labels` (a cell's
    processes are its host container's)."""
    import docker

    client = docker.from_env()
    try:
        n = 0
        for c in client.api.containers(filters={"label": [f"{k}={v}" for k, v in labels.items()]}):
            try:
                top = client.api.top(c["Id"], ps_args="-eo pid,args")
            except docker.errors.APIError:  # gone meanwhile
                continue
            n += sum(1 for p in top.get("Processes") or [] if p and p[-1] == command)
        return n
    finally:
        client.close()


@pytest.mark.parametrize("sig,mode", [(signal.SIGINT, "auto"), (signal.SIGTERM, "auto"), (signal.SIGTERM, "container")])
def test_no_sandbox_left_after_signal(tmp_path, sig, mode):
    """`vf-sandbox eval` interrupted while rollouts run commands in their sandboxes (cells,
    the default here, or containers): all of them are removed."""
    label = uuid.uuid4().hex[:12]
    labels = {"vf-test-case": label}
    pkg = tmp_path / "environments" / "sig_env"
    pkg.mkdir(parents=True)
    (pkg / "sig_env.py").write_text(SIGNAL_ENV)
    (tmp_path / "no-endpoints.toml").write_text("")
    # first turn: a long command, so every rollout sits in its sandbox when the signal comes
    policy = tool_script([("bash", {"command": "sleep 25"})])
    with ModelServer(policy).run_in_thread() as srv:
        cmd = [sys.executable, "-m", "vfcli.app", "eval", "sig-env", "-p", str(tmp_path / "environments"),
               "-e", str(tmp_path / "no-endpoints.toml"), "-k", "VF_SIG_KEY", "-m", "test-model", "-b", srv.base_url,
               "-n", "4", "-r", "1", "-c", "4", "-d", "-a", json.dumps({"label": label, "rollout_isolation": mode})]
        env = {**os.environ, "VF_SIG_KEY": "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 90
            while processes_in(labels, "sleep 25") < 4 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.3)
            # 4 rollouts run their command (plus the warm pool's spares, which must go too)
            assert processes_in(labels, "sleep 25") >= 4, "rollouts never ran their commands"
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode != 0 or "stopp" in out.lower(), out[-2000:]
    assert wait_gone(labels) == [], out[-2000:]


async def test_oom_killed_command_sets_the_oom_flag():
    labels = unique_labels()
    hog = "python3 -c 'x = bytearray(700 * 1024 * 1024); x[::4096] = b\"x\" * len(x[::4096])'; echo rc=$?"
    policy = tool_script([("bash", {"command": "echo fine"}), ("bash", {"command": hog}), ("bash", {"command": "echo alive"})])
    rows = await run_env(bash_env(labels, memory_gb=0.25), policy)
    outs = tool_messages(rows[0])
    assert "Killed" in outs[1] and "rc=137" in outs[1]
    assert outs[2] == "alive"  # the shell survived its child's OOM kill
    assert rows[0]["metrics"]["sandbox_oom"] == 1.0 and rows[0]["error"] is None
    assert wait_gone(labels) == []


async def test_keep_sandbox_for_scoring_lets_rewards_read_the_sandbox():
    labels = unique_labels()
    holder: dict[str, Any] = {}

    async def file_written(state) -> float:
        env = holder["env"]
        data = await env.get_sandbox(state).read_file("/tmp/result.txt")
        return 1.0 if data.strip() == b"42" else 0.0

    env = vf.SandboxEnv(dataset=dataset(2), labels=labels, keep_sandbox_for_scoring=True,
                        rubric=vf.Rubric(funcs=[file_written]), max_turns=4)
    holder["env"] = env
    rows = await run_env(env, tool_script([("bash", {"command": "echo $((6 * 7)) > /tmp/result.txt"})]), n=2)
    assert [r["reward"] for r in rows] == [1.0, 1.0], [r["error"] for r in rows]
    assert env.active_sandboxes == set()
    assert wait_gone(labels) == []
