"""The registry through real `vf-swe-debug` runs (Docker, the example SWE
dataset): a completed run with its per-instance rows, and a hanging run
stopped with `vf-sandbox runs stop` that leaves no sandbox behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import one_at_a_time
from runs import registry, results

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[1]
VF = shutil.which("vf-sandbox", path=str(Path(sys.executable).parent)) or "vf-sandbox"
SWE = [sys.executable, "-m", "swe_debug.cli"]
IDNA, BAD_GOLD = "kjd__idna-3.4", "kjd__idna-3.4-bad-gold"


@pytest.fixture(scope="module")
def examples() -> Path:
    import asyncio

    from swe_debug.examples.builder import build_dataset, build_images

    with one_at_a_time("swe-examples"):  # shared with test_swe_docker's fixture, on any worker: one at a time
        path = build_dataset()
        asyncio.run(build_images(path))
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = tmp_path / "runs.db"
    monkeypatch.setenv("VF_RUNS_DB", str(db))
    return tmp_path, dict(os.environ, VF_RUNS_DB=str(db), PYTHONPATH=str(ROOT))


def containers_of(run_id_label: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=vf-sandbox.run-id={run_id_label}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_completed_swe_debug_run(env, examples):
    tmp, e = env
    p = subprocess.run([*SWE, str(examples), "-i", f"{IDNA},{BAD_GOLD}", "-o", str(tmp / "out"),
                        "--name", "swe-e2e", "-q"], env=e, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    [r] = registry.list_runs()
    assert (r.kind, r.name, r.status, r.completed, r.total) == ("swe-debug", "swe-e2e", "completed", 2, 2)
    s = results.summarize_run(r)
    assert s["n"] == 2 and s["valid"] == 1 and s["reasons"] == {"pass": 1, "gold_apply_failed": 1}
    assert "tests_s" in s["phase_timings"]
    # the run log tells each instance's story, one line per phase (issue 16)
    log = Path(r.log_path).read_text()
    for iid in (IDNA, BAD_GOLD):
        assert f"{iid}: image " in log and f"{iid}: sandbox " in log and f"{iid}: setup ok" in log, log[-3000:]
    assert f"{IDNA}: debug step gold_patch: applied" in log and f"{IDNA}: tests: exit" in log
    assert f"{IDNA}: verdict valid (pass)" in log
    assert f"{BAD_GOLD}: debug step gold_patch: did not apply" in log
    assert f"{BAD_GOLD}: verdict invalid (gold_apply_failed)" in log
    assert f"{BAD_GOLD}: tests:" not in log  # it stopped at the debug step
    inst = {i["instance_id"]: i for i in results.swe_instances(results.read_rows(r))}
    assert inst[IDNA]["valid"] is True and inst[IDNA]["timings"]["total_s"] > 0
    assert inst[BAD_GOLD]["reason"] == "gold_apply_failed" and inst[BAD_GOLD]["detail"]
    out = json.loads(subprocess.run([VF, "runs", "list", "--json", "--kind", "swe-debug"], env=e,
                                    capture_output=True, text=True).stdout)
    assert [x["id"] for x in out] == [r.id]


def test_stop_hanging_swe_debug_run_leaves_no_sandbox(env, examples):
    tmp, e = env
    p = subprocess.Popen([*SWE, str(examples), "-i", IDNA, "--debug-step", "script", "--debug-script-path",
                          str(ROOT / "swe_debug" / "examples" / "hang.sh"), "--debug-timeout", "120",
                          "-o", str(tmp / "hang"), "-q"], env=e, cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        r = None
        while time.time() < deadline:
            runs = registry.list_runs(status="running")
            if runs and containers_of(runs[0].sandbox_run_id):
                r = runs[0]
                break
            time.sleep(0.3)
        assert r is not None, "the swe-debug run never started a sandbox"
        out = subprocess.run([VF, "runs", "stop", r.id, "--timeout", "60"], env=e, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        p.wait(30)
        assert registry.get_run(r.id).status == "stopped"
        assert containers_of(r.sandbox_run_id) == [], (out.stdout, registry.get_run(r.id))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
