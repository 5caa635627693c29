"""`vf-sandbox runs list|show|logs|stop` through the real console script,
against runs made by real processes (tests/runs_driver.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runs import registry, results

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "runs_driver.py"
VF = shutil.which("vf-sandbox", path=str(Path(sys.executable).parent)) or "vf-sandbox"


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = tmp_path / "runs.db"
    monkeypatch.setenv("VF_RUNS_DB", str(db))
    return tmp_path, dict(os.environ, VF_RUNS_DB=str(db), PYTHONPATH=str(ROOT))


def spawn(env, mode, n=5, out="out"):
    tmp, e = env
    p = subprocess.Popen([sys.executable, str(DRIVER), mode, str(tmp / out), str(n)],
                         env=e, stdout=subprocess.PIPE, text=True)
    rid = p.stdout.readline().strip()
    assert rid
    return p, rid


def vf(env, *args, timeout=60):
    return subprocess.run([VF, *args], env=env[1], capture_output=True, text=True, timeout=timeout)


def test_list_table_json_and_filters(env):
    p1, ok = spawn(env, "complete", out="a")
    p2, bad = spawn(env, "fail", out="b")
    p1.wait(30), p2.wait(30)
    out = vf(env, "runs", "list")
    assert out.returncode == 0, out.stderr
    assert ok in out.stdout and bad in out.stdout and "completed" in out.stdout and "failed" in out.stdout
    js = json.loads(vf(env, "runs", "list", "--json").stdout)
    assert {r["id"]: r["status"] for r in js} == {ok: "completed", bad: "failed"}
    js = json.loads(vf(env, "runs", "list", "--json", "--status", "failed").stdout)
    assert [r["id"] for r in js] == [bad]
    assert json.loads(vf(env, "runs", "list", "--json", "--env", "nope").stdout) == []
    assert len(json.loads(vf(env, "runs", "list", "--json", "--model", "toy").stdout)) == 2


def test_show_reports_metrics_passk_errors_timing(env):
    p, rid = spawn(env, "complete", n=4)
    p.wait(30)
    out = vf(env, "runs", "show", rid[:6])
    assert out.returncode == 0, out.stderr
    for needle in ("completed", "toy-env", "reward", "pass@k", "SandboxCreateError", "total", "num_turns"):
        assert needle in out.stdout, needle
    js = json.loads(vf(env, "runs", "show", rid, "--json").stdout)
    s = js["summary"]
    assert s["n_rollouts"] == 12 and s["n_examples"] == 4
    # driver: reward = 1 unless (i + j) % 3 == 0 -> 8 of 12 pass; row (2, 1) (a failing one) ended in a
    # sandbox error: not scored, so the mean is over the 11 scored rows
    assert s["reward"]["mean"] == pytest.approx(8 / 11)
    # pass@k leaves out example 2 (it has an errored rollout); each other example: n=3, c=2 -> pass@2 = 1 - C(1,2)/C(3,2) = 1, pass^2 = C(2,2)/C(3,2) = 1/3; k stops at 2
    assert s["pass_at_k"] == pytest.approx({"1": 2 / 3, "2": 1.0}) and s["pass_all_k"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})
    assert s["errors_by_type"] == {"SandboxCreateError": 1}
    assert s["timing"]["total"]["max"] == pytest.approx(0.9)


def test_show_failed_run_shows_error_and_unknown_id_fails(env):
    p, rid = spawn(env, "fail")
    p.wait(30)
    out = vf(env, "runs", "show", rid)
    assert "ValueError: boom at example 1" in out.stdout
    assert vf(env, "runs", "show", "doesnotexist").returncode == 2


def test_logs_follow_streams_and_ends_with_the_run(env):
    p, rid = spawn(env, "slow", n=6)
    t0 = time.monotonic()
    out = vf(env, "runs", "logs", rid, "--follow", timeout=60)
    assert p.wait(10) == 0
    assert out.returncode == 0, out.stderr
    # every example's line was streamed and the follow ended with the run
    for i in range(6):
        assert f"finished example {i}" in out.stdout
    assert f"run {rid} completed" in out.stdout
    assert time.monotonic() - t0 < 30


def test_logs_follow_ends_when_run_is_killed(env):
    p, rid = spawn(env, "slow", n=100)
    f = subprocess.Popen([VF, "runs", "logs", rid, "--follow"], env=env[1], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    p.kill()
    p.wait()
    out, _ = f.communicate(timeout=20)
    assert f.returncode == 0
    assert "finished example 0" in out and "vanished" in out


def test_stop_via_cli(env):
    p, rid = spawn(env, "slow", n=100)
    deadline = time.time() + 20
    while registry.get_run(rid).completed < 1 and time.time() < deadline:
        time.sleep(0.05)
    out = vf(env, "runs", "stop", rid)
    assert out.returncode == 0, out.stderr
    assert "stopped" in out.stdout
    assert p.wait(10) == 0
    r = registry.get_run(rid)
    assert r.status == "stopped" and not r.vanished
    assert "SIGTERM: saved" in Path(r.log_path).read_text()
    # stopping an ended run is a no-op that reports its state
    assert "stopped" in vf(env, "runs", "stop", rid).stdout


def test_stop_of_process_ignoring_sigterm_needs_force(env, tmp_path):
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(
        "import signal, time\nfrom runs.registry import RunRecorder\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"rec = RunRecorder.start(kind='eval', env_id='x', output_dir={str(tmp_path / 'o')!r})\n"
        "print(rec.id, flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, str(stubborn)], env=env[1], stdout=subprocess.PIPE, text=True)
    rid = p.stdout.readline().strip()
    try:
        out = vf(env, "runs", "stop", rid, "--timeout", "1")
        assert out.returncode == 1 and "--force" in out.stderr
        out = vf(env, "runs", "stop", rid, "--timeout", "1", "--force")
        assert out.returncode == 0, out.stderr
        p.wait(10)
        assert registry.get_run(rid).status == "stopped"
    finally:
        p.kill()
        p.wait()


def test_summaries_are_defensive():
    rows = [{"example_id": 0, "reward": None, "error": "TimeoutError: slow"},
            {"example_id": 0, "reward": 1, "timing": {"total": 2.0}, "metrics": {"x": "nan?"}},
            {"reward": 0.5}]
    s = results.summarize_eval(rows)
    assert s["n_rollouts"] == 3 and s["errors_by_type"] == {"TimeoutError": 1}
    assert s["timing"]["total"]["p50"] == 2.0
    swe = results.summarize_swe([
        {"instance_id": "a", "reason": "pass", "valid": True, "timings": {"setup": 1.5, "tests": 3}},
        {"instance_id": "b", "reason": "timeout", "valid": False},
        {"weird": 1}])
    assert swe["n"] == 3 and swe["valid"] == 1 and swe["reasons"]["timeout"] == 1
    assert swe["phase_timings"]["tests"]["max"] == 3
