"""Run registry states through the real `vf-sandbox eval` against the local
model server (testmodel/model_server.py): completed, failed, SIGKILL,
stopped with `runs stop` then `--resume`d, `logs --follow`, `--timeout-minutes`;
and the dashboard showing a real eval run in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runs import registry
from testmodel.model_server import ModelServer, compute, stall

ROOT = Path(__file__).resolve().parents[1]
VF = shutil.which("vf-sandbox", path=str(Path(sys.executable).parent)) or "vf-sandbox"

BROKEN_ENV = textwrap.dedent('''
    """An environment whose generate() raises: the run itself fails (not a rollout)."""
    import envs as vf
    from math_single import load_environment as base


    class Broken(vf.SingleTurnEnv):
        async def generate(self, *a, **kw):
            raise RuntimeError("env exploded while generating")


    def load_environment(**kw):
        env = base(**kw)
        env.__class__ = Broken
        return env
''')


@pytest.fixture(scope="module")
def fast_server():
    with ModelServer(compute(wrong_every=3)).run_in_thread() as srv:
        yield srv


@pytest.fixture(scope="module")
def slow_server():
    with ModelServer(stall(0.25, then=compute(wrong_every=3))).run_in_thread() as srv:
        yield srv


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = tmp_path / "runs.db"
    monkeypatch.setenv("VF_RUNS_DB", str(db))
    envdir = tmp_path / "environments" / "broken_env"
    envdir.mkdir(parents=True)
    (envdir / "broken_env.py").write_text(BROKEN_ENV)
    e = dict(os.environ, VF_RUNS_DB=str(db), FAKE_KEY="x", PYTHONPATH=f"{ROOT}:{ROOT / 'environments' / 'math_single'}")
    return tmp_path, e


def eval_argv(tmp, server, *extra, env_id="math-single"):
    return [VF, "eval", env_id, "-m", "toy", "-b", server.base_url, "-k", "FAKE_KEY", "-d", "-s",
            "-o", str(tmp / "out"), "-p", str(tmp / "environments"), *extra]


def run_eval(env, server, *extra, env_id="math-single", timeout=120):
    tmp, e = env
    return subprocess.run(eval_argv(tmp, server, *extra, env_id=env_id), env=e, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def start_eval(env, server, *extra):
    tmp, e = env
    return subprocess.Popen(eval_argv(tmp, server, *extra), env=e, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_run(pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = registry.list_runs()
        if runs and pred(runs[0]):
            return runs[0]
        time.sleep(0.1)
    raise AssertionError(f"condition not reached; runs: {registry.list_runs()}")


def vf(env, *args, timeout=60):
    return subprocess.run([VF, *args], env=env[1], capture_output=True, text=True, timeout=timeout)


def test_completed_eval_is_recorded_with_metrics(env, fast_server):
    p = run_eval(env, fast_server, "-n", "4", "-r", "3", "--eval-name", "e2e-ok")
    assert p.returncode == 0, p.stderr[-2000:]
    [r] = registry.list_runs()
    assert (r.status, r.name, r.env_id, r.model) == ("completed", "e2e-ok", "math-single", "toy")
    assert (r.completed, r.total) == (12, 12) and not r.vanished and r.ended_at
    assert (Path(r.output_dir) / "results.jsonl").exists()
    s = json.loads(vf(env, "runs", "show", r.id, "--json").stdout)["summary"]
    assert s["n_rollouts"] == 12 and s["n_examples"] == 4
    assert 0 < s["reward"]["mean"] < 1  # the server answers every 3rd request wrongly
    assert s["pass_at_k"]["1"] == pytest.approx(s["reward"]["mean"])
    assert "total" in s["timing"]
    log = Path(r.log_path).read_text()
    assert f"run {r.id} completed" in log and "HTTP Request" not in log  # chatty libraries filtered


def test_eval_failing_before_it_starts_is_recorded(env):
    """An unreachable endpoint fails the run before any rollout: it is still in the registry."""
    tmp, e = env

    class Down:  # a port nothing listens on
        base_url = "http://127.0.0.1:9/v1"

    p = run_eval(env, Down, "-n", "2", "-r", "1")
    assert p.returncode != 0
    [r] = registry.list_runs()
    assert r.status == "failed" and "not reachable" in r.error
    assert r.env_id == "math-single"


def test_failed_eval_records_the_error(env, fast_server):
    p = run_eval(env, fast_server, "-n", "2", "-r", "1", env_id="broken-env")
    assert p.returncode != 0
    [r] = registry.list_runs()
    assert r.status == "failed" and not r.vanished
    assert "RuntimeError: env exploded while generating" in r.error
    out = vf(env, "runs", "list", "--status", "failed")
    assert r.id in out.stdout


def test_sigkilled_eval_shows_vanished(env, slow_server):
    p = start_eval(env, slow_server, "-n", "30", "-r", "2", "-c", "2")
    try:
        r = wait_run(lambda r: r.completed >= 2)
        assert registry.get_run(r.id).status == "running"
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        r = registry.get_run(r.id)
        assert r.status == "incomplete" and r.vanished and "vanished" in r.error
        assert "running" not in vf(env, "runs", "list").stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_logs_follow_ends_with_the_eval(env, slow_server):
    p = start_eval(env, slow_server, "-n", "6", "-r", "2", "-c", "4")
    try:
        r = wait_run(lambda r: True)
        f = vf(env, "runs", "logs", r.id, "--follow", timeout=90)
        assert f.returncode == 0
        assert p.wait(30) == 0
        assert f"run {r.id} started" in f.stdout and f"run {r.id} completed" in f.stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_stop_then_resume_continues_the_run(env, slow_server):
    n, rr = 16, 2
    p = start_eval(env, slow_server, "-n", str(n), "-r", str(rr), "-c", "2")
    try:
        r = wait_run(lambda r: r.completed >= 4)
        out = vf(env, "runs", "stop", r.id, "--timeout", "60")
        assert out.returncode == 0, out.stdout + out.stderr
        assert p.wait(30) is not None
        r = registry.get_run(r.id)
        assert r.status == "stopped" and not r.vanished
        results = Path(r.output_dir) / "results.jsonl"
        saved = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        assert 4 <= len(saved) < n * rr
        # SIGTERM saved whole groups only
        by_ex: dict = {}
        for row in saved:
            by_ex.setdefault(row["example_id"], []).append(row)
        assert all(len(v) == rr for v in by_ex.values())
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    done = run_eval(env, slow_server, "-n", str(n), "-r", str(rr), "-c", "8", "--resume", r.output_dir, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = registry.list_runs()
    assert [x.id for x in runs] == [r.id]  # the same registry row continued
    r2 = runs[0]
    assert r2.status == "completed" and r2.attempts == 2 and r2.completed == n * rr
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    assert len(rows) == n * rr
    assert len({row["example_id"] for row in rows}) == n  # no example lost or duplicated
    assert "resumed" in Path(r2.log_path).read_text()


def test_timeout_minutes_stops_cleanly(env, slow_server):
    p = run_eval(env, slow_server, "-n", "40", "-r", "2", "-c", "1", "--timeout-minutes", "0.05", timeout=120)
    [r] = registry.list_runs()
    assert r.status == "stopped", (r, p.stderr[-2000:])
    assert "timeout" in (r.error or "")
    assert 0 < r.completed < 80


def _goto_when_up(page, url: str) -> None:
    """Open `url` once the dashboard started by the test answers (100 tries, 0.1 s apart)."""
    for _ in range(100):
        try:
            page.goto(url)
            break
        except Exception:
            time.sleep(0.1)


@pytest.mark.browser
def test_dashboard_shows_real_eval_runs(env, fast_server):
    from test_dashboard_browser import ARTIFACTS, CHROMIUM, FLAGS, _free_port, _need_browser

    _need_browser()
    assert run_eval(env, fast_server, "-n", "4", "-r", "3", "--eval-name", "real-eval").returncode == 0
    run_eval(env, fast_server, "-n", "2", "-r", "1", env_id="broken-env")
    ok = registry.list_runs(status="completed")[0]
    bad = registry.list_runs(status="failed")[0]
    port = _free_port()
    dash = subprocess.Popen([VF, "dashboard", "--port", str(port), "--no-launch"], env=env[1],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from playwright.sync_api import sync_playwright
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            _goto_when_up(page, f"http://127.0.0.1:{port}/")
            row = page.locator(f'tr[data-run-id="{ok.id}"]')
            row.wait_for(timeout=10_000)
            assert row.locator(".badge").inner_text() == "completed"
            assert "real-eval" in row.inner_text() and "12/12" in row.inner_text()
            page.screenshot(path=str(ARTIFACTS / "e2e-runs-list.png"), full_page=True)
            page.goto(f"http://127.0.0.1:{port}/#/run/{ok.id}/samples")
            page.locator("tbody.group").first.wait_for(timeout=10_000)
            assert page.locator("tbody.group").count() == 4
            for i in range(4):
                g = page.locator("tbody.group").nth(i)
                assert g.locator("tr.sample").count() == 3
                assert "What is" in g.inner_text()
            # the completion is in the sample's own view (the table stays compact); search finds it too
            page.locator("tr.sample a.sample-link").first.click()
            page.locator(".sample-detail").wait_for(timeout=10_000)
            assert "boxed" in page.locator(".sample-detail").inner_text()
            page.fill("#sample-search", "boxed")
            assert page.locator("tr.sample").count() == 12
            page.screenshot(path=str(ARTIFACTS / "e2e-samples.png"), full_page=True)
            page.goto(f"http://127.0.0.1:{port}/#/run/{bad.id}")
            page.locator("#error-box").wait_for(timeout=10_000)
            assert "env exploded while generating" in page.locator("#error-box").inner_text()
            page.wait_for_function("() => document.querySelector('pre#log')?.textContent.includes('failed')")
            page.screenshot(path=str(ARTIFACTS / "e2e-failed-run.png"), full_page=True)
            browser.close()
            assert not errors, errors
    finally:
        dash.terminate()
        dash.wait(10)


@pytest.mark.browser
def test_start_a_run_from_the_dashboard(env, fast_server):
    from test_dashboard_browser import ARTIFACTS, CHROMIUM, FLAGS, _free_port, _need_browser

    _need_browser()
    tmp, e = env
    eps = tmp / "endpoints.toml"
    eps.write_text(f'[[endpoint]]\nendpoint_id = "local-toy"\nmodel = "toy"\nurl = "{fast_server.base_url}"\n'
                   'key = "FAKE_KEY"\n')
    port = _free_port()
    dash = subprocess.Popen([VF, "dashboard", "--port", str(port), "--endpoints-path", str(eps)], env=e, cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from playwright.sync_api import sync_playwright
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _goto_when_up(page, f"http://127.0.0.1:{port}/")
            page.locator("#launch-slot summary").click()
            page.fill('#launch input[name="env"]', "math-single")
            page.select_option('#launch select[name="endpoint"]', "local-toy")
            page.fill('#launch input[name="n"]', "3")
            page.fill('#launch input[name="r"]', "2")
            page.fill('#launch input[name="env_args"]', '{"seed": 7}')
            page.fill('#launch input[name="name"]', "from-the-page")
            page.click('#launch button[type="submit"]')
            page.wait_for_url("**/#/run/*", timeout=30_000)
            page.wait_for_function(
                "() => { const b = document.querySelector('#run-head .badge'); return b && b.dataset.status === 'completed'; }",
                timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "e2e-launched-run.png"), full_page=True)
            browser.close()
        [r] = registry.list_runs()
        assert (r.name, r.status, r.model, r.completed) == ("from-the-page", "completed", "toy", 6)
        assert r.args.get("env_args") == {"seed": 7}
    finally:
        dash.terminate()
        dash.wait(10)
