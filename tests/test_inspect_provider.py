"""inspect_ai's sandbox provider "vf" (integrations/inspect_vf.py), checked by code
nobody here wrote:

* inspect_ai's own conformance suite, `inspect_ai.util._sandbox.self_check` (pulled into
  collection as its docstring says), against one sandbox per mode: a Docker container,
  a Docker cell and a gVisor container. A check our sandboxes cannot pass is an xfail
  (strict: one that starts passing fails) naming the reason, in XFAIL below.
* a real `inspect eval` (the CLI, a subprocess) of a task whose model calls the bash and
  python tools, against the local scripted model server, offline; the samples must be
  scored correct and no sandbox may be left behind; interrupted (SIGINT) it leaves none
  either, and the sandbox of a SIGKILLed process is removed by our reaper.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from inspect_ai.util._sandbox.self_check import *  # noqa: E402,F403  (the checks, collected here)

from conftest import TEST_LABELS, require_gvisor  # noqa: E402
from integrations.inspect_vf import VfSandboxConfig, VfSandboxEnvironment  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

MODES = {
    "container": {},
    "cell": {"rollout_isolation": "cell"},
    "gvisor": {"isolation": "gvisor"},
}

_NO_CAPS = ("SandboxSpec drops every capability (the secure default): root in the sandbox cannot chown, so "
            "adduser fails, and the agent cannot switch users (exec(user=) raises UserSwitchUnsupported); "
            "user_switch=True lets exec(user=) switch (test_exec_as_another_user) but keeps root's commands "
            "capability-free, so the check's adduser still cannot write /etc/gshadow")
XFAIL: dict[str, dict[str, str]] = {
    "test_exec_as_user": {
        "container": _NO_CAPS,
        "gvisor": _NO_CAPS,
        "cell": "a cell's processes hold no capability at all (sandboxes/agent/CELLS_THREAT_MODEL.md): "
                "adduser cannot chown and the cell cannot switch users",
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=list(MODES))
async def vf_env(request, python_image):
    """One sample's sandbox per mode, shared by the checks (each cleans up after itself)."""
    if request.param == "gvisor":
        require_gvisor()
    cfg = VfSandboxConfig(image=python_image, labels=dict(TEST_LABELS), timeout_minutes=15, **MODES[request.param])
    task = f"self-check-{request.param}"
    await VfSandboxEnvironment.task_init(task, cfg)
    envs = await VfSandboxEnvironment.sample_init(task, cfg, {})
    try:
        yield request.param, envs["default"]
    finally:
        await VfSandboxEnvironment.sample_cleanup(task, cfg, envs, False)
        await VfSandboxEnvironment.task_cleanup(task, cfg, True)


@pytest.fixture
def sandbox_env(vf_env, request):
    mode, env = vf_env
    reason = XFAIL.get(request.node.originalname, {}).get(mode)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return env


# ------------------------------------------------------------------ registration


async def test_exec_as_another_user(python_image):
    """user_switch=True in the config: inspect's exec(user=) runs as that user, and the
    command holds no capability (the default config refuses: see XFAIL)."""
    cfg = VfSandboxConfig(image=python_image, labels=dict(TEST_LABELS), timeout_minutes=15, user_switch=True)
    task = "exec-as-user"
    await VfSandboxEnvironment.task_init(task, cfg)
    envs = await VfSandboxEnvironment.sample_init(task, cfg, {})
    try:
        env = envs["default"]
        r = await env.exec(["sh", "-c", "id -un; grep CapEff /proc/self/status"], user="nobody")
        assert r.success and r.stdout.split() == ["nobody", "CapEff:", "0000000000000000"], r
        assert (await env.exec(["whoami"], user="root")).stdout.strip() == "root"
    finally:
        await VfSandboxEnvironment.sample_cleanup(task, cfg, envs, False)
        await VfSandboxEnvironment.task_cleanup(task, cfg, True)


async def test_config_defaults_are_the_spec_defaults():
    from sandboxes import SandboxSpec

    assert VfSandboxConfig().spec().model_dump(exclude={"labels"}) == SandboxSpec().model_dump(exclude={"labels"})
    cell = VfSandboxConfig(rollout_isolation="cell", isolation="gvisor").spec()
    assert (cell.rollout_isolation, cell.isolation) == ("namespace", "gvisor")


# ------------------------------------------------------------------ a real inspect eval

TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python


@task
def arithmetic():
    return Task(
        dataset=[Sample(input="What is 6 * 7? Use a tool.", target="42"),
                 Sample(input="What is 40 + 2? Use a tool.", target="42")],
        solver=[use_tools(bash(timeout=60), python(timeout=60)), generate()],
        scorer=includes(),
        sandbox=("vf", {config!r}),
    )
'''


def _policy(req):
    """First turn: the sample's arithmetic through a sandboxed tool (bash for one sample,
    python for the other); then answer with what the tool printed."""
    from testmodel.model_server import Reply, ToolCallSpec

    results = req.tool_results()
    if results:
        return Reply(content=f"The answer is {results[-1].strip()}.")
    if "6 * 7" in req.last_user_text():
        return Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo $((6 * 7)) && whoami >&2"})])
    return Reply(tool_calls=[ToolCallSpec("python", {"code": "print(40 + 2)"})])


def _leftovers(label: str, wait: float = 0.0) -> list[str]:
    """Containers of inspect task `label` still there after up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=vf-sandbox.inspect-task={label}"],
                             capture_output=True, text=True, timeout=60).stdout.split()
        if not out or time.monotonic() >= deadline:
            return out
        time.sleep(0.5)


async def test_inspect_eval_with_a_sandboxed_tool(tmp_path, python_image):
    """`inspect eval` (the real CLI) runs a two-sample task on the vf provider, found by its
    entry point (the task file imports nothing of ours: `pip install` is enough), against the local scripted model (offline); both samples are scored
    correct from tool output computed in the sandbox, and no sandbox is left behind."""
    from testmodel.model_server import ModelServer
    from inspect_ai.log import read_eval_log

    config = tmp_path / "vf.json"
    config.write_text(json.dumps({"image": python_image, "labels": dict(TEST_LABELS), "timeout_minutes": 10}))
    task_file = tmp_path / f"vf_task_{uuid.uuid4().hex[:8]}.py"
    task_file.write_text(TASK.format(config=str(config)))
    logs = tmp_path / "logs"
    with ModelServer(_policy).run_in_thread() as srv:
        env = {**os.environ, "LOCAL_BASE_URL": srv.base_url, "LOCAL_API_KEY": "unused",
               "INSPECT_LOG_DIR": str(logs), "INSPECT_DISPLAY": "plain", "NO_COLOR": "1"}
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("inspect")), "eval", task_file.name, "--model",
             "openai-api/local/local-model", "--log-dir", str(logs), "--max-connections", "2",
             "--no-log-realtime"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [log_file] = list(logs.glob("*.eval"))
    log = read_eval_log(str(log_file))
    assert log.status == "success", log.error
    assert [s.scores["includes"].value for s in log.samples] == ["C", "C"]
    tool_messages = [m for s in log.samples for m in s.messages if m.role == "tool"]
    assert any("42" in m.text and "root" in m.text for m in tool_messages), tool_messages  # bash: stdout + stderr
    assert _leftovers("arithmetic") == []


def _wait_for_sandbox(label: str, proc: subprocess.Popen, within: float = 120.0) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        if ids := _leftovers(label):
            return ids
        time.sleep(0.3)
    raise AssertionError(f"no sandbox appeared (inspect exited {proc.poll()}): {proc.stdout.read()[-3000:]}")


async def test_interrupted_inspect_leaves_no_sandbox(tmp_path, python_image):
    """Ctrl-C (SIGINT) to `inspect eval` during a sample: inspect's interrupt path
    (sample_cleanup with interrupted=True, task_cleanup) removes the sandbox."""
    from testmodel.model_server import ModelServer, stall

    config = tmp_path / "vf.json"
    config.write_text(json.dumps({"image": python_image, "labels": dict(TEST_LABELS), "timeout_minutes": 10}))
    (tmp_path / "stalled.py").write_text(TASK.replace("def arithmetic", "def stalled").format(config=str(config)))
    with ModelServer(stall(300)).run_in_thread() as srv:
        env = {**os.environ, "LOCAL_BASE_URL": srv.base_url, "LOCAL_API_KEY": "unused", "INSPECT_DISPLAY": "plain"}
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("inspect")), "eval", "stalled.py", "--model",
             "openai-api/local/local-model", "--log-dir", str(tmp_path / "logs"), "--limit", "1"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for_sandbox("stalled", proc)
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert _leftovers("stalled", wait=30) == [], "the interrupted sample's sandbox is still there"


@pytest.mark.serial  # the killed owner's sandbox must outlive it until OUR reap: a CLI starting on a
# parallel worker would reap it first
async def test_killed_process_sandbox_is_reaped(python_image):
    """SIGKILL of the process holding a sample's sandbox: nothing of ours runs, the sandbox
    stays with its dead owner in its labels, and our reaper (which the next task_init
    starts) removes it."""
    from sandboxes import lifecycle

    code = (f"import asyncio, time\n"
            f"from integrations.inspect_vf import VfSandboxConfig, VfSandboxEnvironment as E\n"
            f"cfg = VfSandboxConfig(image={python_image!r}, labels={dict(TEST_LABELS)!r}, timeout_minutes=10)\n"
            f"async def main():\n"
            f"    await E.task_init('killed', cfg)\n"
            f"    await E.sample_init('killed', cfg, {{}})\n"
            f"    print('ready', flush=True)\n"
            f"    await asyncio.sleep(300)\n"
            f"asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        assert proc.stdout.readline().strip() == "ready"
        ids = _leftovers("killed")
        assert ids
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _leftovers("killed") == ids  # nothing of ours ran: the sandbox is still there...
    reaped = await lifecycle.reap("docker")
    assert {i.id[:12] for i, why in reaped if why == "owner-dead"} >= set(ids)  # ...until the reaper
    assert _leftovers("killed", wait=30) == []
