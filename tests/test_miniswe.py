"""mini-swe-agent on vf-sandbox (integrations/miniswe.py): its real CLI (`mini`, a
subprocess) runs a task in `VfEnvironment`, loaded by import path from its config,
against the local scripted model server (offline, through litellm's OpenAI route).
Hermetic: mini-swe-agent's global config dir points into tmp, its banner and
first-run set-up are off, litellm reads its bundled cost map.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

import minisweagent  # noqa: F401  (the frameworks extra must be installed: an ImportError fails, never skips)

from conftest import TEST_LABELS, leftover_containers

pytestmark = pytest.mark.docker


def _policy(req):
    """Step 1: compute in the sandbox into a file (and show who runs it); step 2: submit
    the file; mini-swe-agent's bash tool each time."""
    from testmodel.model_server import Reply, ToolCallSpec

    if not req.tool_results():
        return Reply(content="Computing.", tool_calls=[ToolCallSpec(
            "bash", {"command": "echo $((6 * 7)) > /tmp/answer.txt && id -un && echo to-stderr >&2"})])
    return Reply(content="Submitting.", tool_calls=[ToolCallSpec(
        "bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat /tmp/answer.txt"})])


def _hermetic_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea-config"), "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_CONFIGURED": "1", "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "NO_COLOR": "1"}


def test_mini_cli_runs_in_a_vf_sandbox(tmp_path, python_image):
    from testmodel.model_server import ModelServer

    run_label = {"vf-miniswe-test": uuid.uuid4().hex[:12]}
    trajectory = tmp_path / "run.traj.json"
    with ModelServer(_policy).run_in_thread() as srv:
        config = tmp_path / "vf.yaml"
        config.write_text(yaml.safe_dump({
            "model": {"model_kwargs": {"api_base": srv.base_url, "api_key": "unused"}},
            "environment": {"environment_class": "integrations.miniswe.VfEnvironment", "image": python_image,
                            "labels": {**TEST_LABELS, **run_label}, "timeout_minutes": 10, "timeout": 60},
        }))
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("mini")), "-m", "openai/local-model", "-c", "mini.yaml", "-c",
             str(config), "-t", "Compute 6 * 7 and submit the result.", "--yolo", "--exit-immediately",
             "-o", str(trajectory)],
            cwd=tmp_path, env=_hermetic_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    traj = json.loads(trajectory.read_text())
    assert traj["info"]["exit_status"] == "Submitted", traj["info"]
    assert traj["info"]["submission"].strip() == "42"
    assert traj["info"]["config"]["environment_type"] == "integrations.miniswe.VfEnvironment"
    observations = [m for m in traj["messages"] if m.get("role") == "tool"]
    assert observations and "root" in json.dumps(observations[0]) and "to-stderr" in json.dumps(observations[0])
    assert (tmp_path / "mswea-config").is_dir()  # its global config dir was the test's, not ~/.config
    assert leftover_containers(run_label) == []


def test_environment_protocol_in_process(python_image, tmp_path):
    """The protocol by hand (what the agent calls): output with stderr in order, return codes,
    a timeout as returncode -1 that leaves the sandbox usable, the submit marker, cleanup."""
    code = f"""
import json, sys
from minisweagent.exceptions import Submitted
from integrations.miniswe import VfEnvironment
env = VfEnvironment(image={python_image!r}, labels={dict(TEST_LABELS)!r}, timeout_minutes=5, timeout=5,
                    env={{"GREETING": "hi"}})
out = {{}}
out["order"] = env.execute({{"command": "echo one; echo two >&2; echo three"}})
out["code"] = env.execute({{"command": "exit 3"}})
out["env_cwd"] = env.execute({{"command": "echo $GREETING; pwd"}}, cwd="/tmp")
out["timeout"] = env.execute({{"command": "sleep 30"}}, timeout=1)
out["after"] = env.execute({{"command": "echo alive"}})
try:
    env.execute({{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done"}})
except Submitted as exc:
    out["submitted"] = exc.messages[0]["extra"]["submission"]
out["vars"] = sorted(env.get_template_vars())[:3]
sandbox_id = env.sandbox.id
env.cleanup()
out["id"] = sandbox_id
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=_hermetic_env(tmp_path), capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["order"] == {"output": "one\ntwo\nthree\n", "returncode": 0, "exception_info": ""}
    assert out["code"]["returncode"] == 3
    assert out["env_cwd"]["output"] == "hi\n/tmp\n"
    assert out["timeout"]["returncode"] == -1 and "timed out" in out["timeout"]["exception_info"]
    assert out["after"]["output"] == "alive\n"
    assert out["submitted"] == "done\n"
    ps = subprocess.run(["docker", "ps", "-aq", "--filter", f"id={out['id']}"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""
