"""rollout_isolation="namespace" end to end, as a user runs it: the example envs
(`vf-sandbox eval ... -x rollout_isolation=namespace`) solve every task as with a
container per rollout, while the engine made ONE cell-host container for the
whole run; and a SWE example instance (`vf-swe-debug --rollout-isolation
namespace`) gets the same verdict as in its own container. Also under gVisor."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import require_gvisor
from test_gvisor_e2e import RuntimeWatch, _swe_row
from test_sandbox_env import wait_gone
from test_sandbox_env_e2e import bash_files_policy, eval_four_solved, python_math_policy
from test_swe_docker import IDNA, ROOT, VF_SWE_DEBUG, examples  # noqa: F401 (the fixture)

pytestmark = pytest.mark.docker


class CaseWatch(RuntimeWatch):
    """Records each running test container's `vf-test-case` label (other tests may run beside)."""

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label={self.label}"], capture_output=True,
                                 text=True).stdout.split()
            for cid in set(ids) - set(self.seen):
                out = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "vf-test-case"}} {{.Name}} {{.HostConfig.CapAdd}}', cid],
                                     capture_output=True, text=True).stdout.strip()
                if out:
                    self.seen[cid] = out


@pytest.mark.serial  # its watcher polls `docker ps` every 0.2 s: beside 4 workers a short run's host went unseen
@pytest.mark.parametrize("isolation", ["runc", "gvisor"])
@pytest.mark.parametrize("env_id,policy", [("bash-files", bash_files_policy), ("python-math", python_math_policy)])
def test_example_env_in_cells_same_results_one_container(tmp_path, env_id, policy, isolation):
    if isolation == "gvisor":
        require_gvisor()
    with CaseWatch("vf-sandbox.test=1") as watch:
        rows, meta, label = eval_four_solved(tmp_path, env_id, policy(), "-x", "rollout_isolation=namespace",
                                             "-x", f"isolation={isolation}")
    ours = [cid for cid, case in watch.seen.items() if case.split()[0] == label]
    assert len(ours) == 1, watch.seen  # four rollouts, one cell host
    if env_id == "python-math":
        assert all(r["metrics"]["python_calls"] == 2 for r in rows)
    else:
        assert all(r["metrics"]["boxed_answer"] == 1.0 and r["metrics"]["bash_calls"] == 2 for r in rows)
    assert wait_gone({"vf-test-case": label}) == []


def test_swe_example_instance_in_a_cell_same_verdict(examples, tmp_path):  # noqa: F811
    env = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    verdicts = {}
    for mode in ("container", "namespace"):
        out = tmp_path / mode
        res = subprocess.run([*VF_SWE_DEBUG, str(examples), "-i", IDNA, "-o", str(out), "-q",
                              "--rollout-isolation", mode], capture_output=True, text=True, cwd=ROOT, env=env,
                             timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        verdicts[mode] = _swe_row(out)
    keys = ("valid", "reason", "apply_method", "test_exit_code", "counts", "fail_to_pass", "pass_to_pass")
    container, cell = verdicts["container"], verdicts["namespace"]
    assert {k: cell["verdict"].get(k) for k in keys} == {k: container["verdict"].get(k) for k in keys}
    assert cell["verdict"]["valid"] is True and cell["verdict"]["counts"], cell
