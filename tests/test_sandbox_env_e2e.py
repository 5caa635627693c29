"""The two REPL tool environments (`environments/python_math`,
`environments/bash_files`) evaluated end to end with `vf-sandbox eval` (a
subprocess) against the local model server playing a scripted policy that
solves the task through the tool. Real Docker sandboxes, real results files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from testmodel.model_server import PolicyRequest, Reply, ToolCallSpec, ModelServer
from test_sandbox_env import wait_gone

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / "environments"


def run_eval(tmp_path: Path, env_id: str, base_url: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    (tmp_path / "no-endpoints.toml").write_text("")
    cmd = [sys.executable, "-m", "vfcli.app", "eval", env_id, "-p", str(ENVS), "-e", str(tmp_path / "no-endpoints.toml"),
           "-k", "VF_E2E_SANDBOX_KEY", "-m", "test-model", "-b", base_url, "-s", "-d", *args]
    env = {**os.environ, "VF_E2E_SANDBOX_KEY": "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
    env.pop("VF_RUN_ID", None)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def results(tmp_path: Path, env_id: str) -> tuple[list[dict], dict]:
    base = tmp_path / "outputs" / "evals" / f"{env_id}--test-model"
    (run,) = list(base.iterdir())
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]
    return rows, json.loads((run / "metadata.json").read_text())


def python_math_policy():
    sys.path.insert(0, str(ENVS / "python_math"))
    import python_math

    return python_math.scripted_policy()


def bash_files_policy():
    sys.path.insert(0, str(ENVS / "bash_files"))
    import bash_files

    return bash_files.scripted_policy()


def eval_four_solved(tmp_path: Path, env_id: str, policy, *extra: str,
                     label: str | None = None) -> tuple[list[dict], dict, str]:
    """`vf-sandbox eval ENV -n 4 -r 1 -c 4` against the scripted `policy`, in sandboxes
    labelled for this test (`label`, default a fresh one): it exits 0 and all 4 rollouts
    score 1. Returns (rows, metadata, the sandboxes' `vf-test-case` label)."""
    label = label or uuid.uuid4().hex[:12]
    with ModelServer(policy).run_in_thread() as srv:
        res = run_eval(tmp_path, env_id, srv.base_url, "-n", "4", "-r", "1", "-c", "4",
                       "-a", json.dumps({"labels": {"vf-sandbox.test": "1", "vf-test-case": label}}), *extra)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows, meta = results(tmp_path, env_id)
    assert len(rows) == 4
    assert [r["reward"] for r in rows] == [1.0] * 4, [r.get("error") or r["completion"][-1] for r in rows]
    return rows, meta, label


def test_python_math_end_to_end(tmp_path):
    rows, meta, label = eval_four_solved(tmp_path, "python-math", python_math_policy())
    assert all(r["metrics"]["python_calls"] == 2 for r in rows)
    assert meta["avg_reward"] == 1.0 and "python_ready_wait_time" in meta["avg_metrics"]
    assert wait_gone({"vf-test-case": label}) == []


def test_bash_files_end_to_end(tmp_path):
    rows, meta, label = eval_four_solved(tmp_path, "bash-files", bash_files_policy())
    assert all(r["metrics"]["boxed_answer"] == 1.0 and r["metrics"]["bash_calls"] == 2 for r in rows)
    assert meta["avg_metrics"]["sandbox_command_count"] == 2.0
    assert wait_gone({"vf-test-case": label}) == []


def test_bash_files_wrong_answer_scores_zero(tmp_path):
    """The reward reads the sandbox's file, not the chat: a wrong file scores 0 even with a boxed guess."""
    label = uuid.uuid4().hex[:12]

    def lazy(req: PolicyRequest) -> Reply:
        if req.n_tool_turns() == 0:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo 0 > /task/answer.txt"})])
        return Reply(content="\\boxed{0}")

    with ModelServer(lazy).run_in_thread() as srv:
        res = run_eval(tmp_path, "bash-files", srv.base_url, "-n", "2", "-r", "1",
                       "-a", json.dumps({"labels": {"vf-sandbox.test": "1", "vf-test-case": label}}))
    assert res.returncode == 0, res.stderr[-3000:]
    rows, _ = results(tmp_path, "bash-files")
    assert [r["reward"] for r in rows] == [0.0, 0.0]
    assert wait_gone({"vf-test-case": label}) == []


def test_same_env_unchanged_on_the_local_backend(tmp_path):
    """`--backend` moves a sandbox env to another backend without touching the env:
    bash-files solved through the persistent shell of local (bubblewrap) sandboxes."""
    with ModelServer(bash_files_policy()).run_in_thread() as srv:
        res = run_eval(tmp_path, "bash-files", srv.base_url, "-n", "2", "-r", "1", "--backend", "local", "-C", "sandbox_id")
    assert res.returncode == 0, res.stderr[-3000:]
    rows, _ = results(tmp_path, "bash-files")
    assert [r["reward"] for r in rows] == [1.0, 1.0]
    for r in rows:  # local ids are "<name>-<hex10>", Docker's are 64-hex container ids
        assert r["sandbox_id"].startswith("bash-files-") and len(r["sandbox_id"]) < 64, r["sandbox_id"]


def test_unknown_backend_is_a_clear_error(tmp_path):
    res = run_eval(tmp_path, "bash-files", "http://127.0.0.1:9/v1", "--backend", "nope")
    assert res.returncode != 0
    assert "unknown sandbox backend 'nope'" in res.stderr and "docker" in res.stderr
