"""The examples under gVisor, end to end with the same results as under runc:
`vf-sandbox eval bash-files|python-math -x isolation=gvisor` (the scripted policies
solve every task; every sandbox the run made ran on the engine's runsc runtime;
metadata.json records the isolation) and one SWE example instance with
`vf-swe-debug --isolation gvisor` (the same verdict and tests as under runc)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid

import pytest

from conftest import require_gvisor
from test_sandbox_env_e2e import bash_files_policy, eval_four_solved, python_math_policy
from test_sandbox_env import wait_gone
from test_swe_docker import IDNA, ROOT, VF_SWE_DEBUG, examples  # noqa: F401 (the fixture)

pytestmark = pytest.mark.docker


class RuntimeWatch:
    """Records the OCI runtime of every container carrying `label` while it runs."""

    def __init__(self, label: str):
        self.label, self.seen, self._stop = label, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label={self.label}"], capture_output=True,
                                 text=True).stdout.split()
            for cid in set(ids) - set(self.seen):
                out = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.Runtime}}", cid], capture_output=True,
                                     text=True).stdout.strip()
                if out:
                    self.seen[cid] = out

    def __enter__(self) -> "RuntimeWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("env_id,policy", [("bash-files", bash_files_policy), ("python-math", python_math_policy)])
def test_example_env_under_gvisor_same_results(tmp_path, env_id, policy):
    require_gvisor()
    label = uuid.uuid4().hex[:12]
    # this run's sandboxes only: other tests (other xdist workers, other suites) run beside it under runc
    with RuntimeWatch(f"vf-test-case={label}") as watch:
        rows, meta, label = eval_four_solved(tmp_path, env_id, policy(), "-x", "isolation=gvisor", label=label)
    assert meta["isolation"] == "gvisor" and meta["eval_config"]["isolation"] == "gvisor"
    assert watch.seen and set(watch.seen.values()) == {"runsc"}, watch.seen
    if env_id == "python-math":
        assert all(r["metrics"]["python_calls"] == 2 for r in rows)
    else:
        assert all(r["metrics"]["boxed_answer"] == 1.0 and r["metrics"]["bash_calls"] == 2 for r in rows)
    assert wait_gone({"vf-test-case": label}) == []


def _swe_row(out) -> dict:
    (results,) = list(out.glob("evals/swe-debug--none/*/results.jsonl"))
    (row,) = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    meta = json.loads((results.parent / "metadata.json").read_text())
    return {"verdict": row["info"]["verdict"], "isolation": meta["isolation"]}


def test_swe_example_instance_under_gvisor_same_verdict(examples, tmp_path):  # noqa: F811
    require_gvisor()
    env = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    verdicts = {}
    for isolation in ("runc", "gvisor"):
        out = tmp_path / isolation
        res = subprocess.run([*VF_SWE_DEBUG, str(examples), "-i", IDNA, "-o", str(out), "-q", "--isolation", isolation],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        verdicts[isolation] = _swe_row(out)
    runc, gvisor = verdicts["runc"], verdicts["gvisor"]
    assert (runc["isolation"], gvisor["isolation"]) == ("runc", "gvisor")
    keys = ("valid", "reason", "apply_method", "test_exit_code", "counts", "fail_to_pass", "pass_to_pass")
    assert {k: gvisor["verdict"].get(k) for k in keys} == {k: runc["verdict"].get(k) for k in keys}
    assert gvisor["verdict"]["valid"] is True and gvisor["verdict"]["counts"], gvisor
