"""The dashboard in a real headless browser (Debian's Chromium driven by
playwright), against the real `vf-sandbox dashboard` server and runs made by
real processes. Screenshots go to test-artifacts/.

Needs /usr/bin/chromium (scripts/install-browser.sh). Skips without it,
FAILS without it when VF_REQUIRE_BROWSER=1 (CI)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.runs import registry

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "runs_driver.py"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("VF_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _need_browser():
    problem = None
    if not os.path.exists(CHROMIUM):
        problem = f"{CHROMIUM} missing (run scripts/install-browser.sh)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "python playwright not installed"
    if problem:
        if os.environ.get("VF_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser required (VF_REQUIRE_BROWSER=1): {problem}")
        pytest.skip(problem)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A registry with real runs (completed, failed, running, SIGKILLed, swe-debug) and a dashboard."""
    _need_browser()
    tmp = tmp_path_factory.mktemp("dash")
    db = tmp / "runs.db"
    env = dict(os.environ, VF_RUNS_DB=str(db), PYTHONPATH=str(ROOT))
    old = os.environ.get("VF_RUNS_DB")
    os.environ["VF_RUNS_DB"] = str(db)

    def drive(mode, out, n, r=3):
        p = subprocess.Popen([sys.executable, str(DRIVER), mode, str(tmp / out), str(n), str(r)],
                             env=env, stdout=subprocess.PIPE, text=True)
        return p, p.stdout.readline().strip()

    ids = {}
    p, ids["completed"] = drive("complete", "ok", 4, 3)
    assert p.wait(30) == 0
    p, ids["failed"] = drive("fail", "bad", 4)
    assert p.wait(30) == 1
    p, ids["killed"] = drive("slow", "killed", 100)
    time.sleep(0.8)
    p.kill()
    p.wait()
    # a swe-debug run, as vf-swe-debug records it: one JSONL row per instance
    swe_out = tmp / "swe.jsonl"
    rec = registry.RunRecorder.start(kind="swe-debug", name="gold-check", env_id="swe-mini",
                                     args={"mode": "gold_patch"}, output_dir=swe_out, capture_logging=False)
    with open(swe_out, "w") as f:
        f.write(json.dumps({"instance_id": "toolz__toolz-1", "reason": "pass", "valid": True,
                            "timings": {"create": 0.8, "setup": 2.5, "apply": 0.1, "tests": 4.2},
                            "stdout_tail": "===== 12 passed in 3.1s ====="}) + "\n")
        f.write(json.dumps({"instance_id": "attrs__attrs-2", "reason": "gold_apply_failed", "valid": False,
                            "detail": "gold patch does not apply", "step": "apply",
                            "timings": {"create": 0.9, "setup": 2.1, "apply": 0.2},
                            "stderr_tail": "error: patch failed: src/attr/_make.py:12"}) + "\n")
    rec.progress(completed=2, total=2, errors=1)
    rec.finish("completed")
    ids["swe"] = rec.id
    running, ids["running"] = drive("slow", "live", 400)

    port = _free_port()
    dash = subprocess.Popen([sys.executable, "-m", "envs.cli.app", "dashboard", "--port", str(port),
                             "--no-launch"], env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        dash.kill()
        pytest.fail("dashboard did not start: " + dash.stdout.read().decode())

    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        yield {"base": base, "ids": ids, "browser": browser, "running_proc": running}
    finally:
        browser.close()
        pw.stop()
        for p in (running, dash):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if old is None:
            os.environ.pop("VF_RUNS_DB", None)
        else:
            os.environ["VF_RUNS_DB"] = old


@pytest.fixture
def page(world):
    pg = world["browser"].new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    assert not errors, f"javascript errors: {errors}"


def test_runs_list_shows_real_runs_with_live_progress(world, page):
    ids = world["ids"]
    page.goto(world["base"] + "/")
    row = page.locator(f'tr[data-run-id="{ids["completed"]}"]')
    row.wait_for(timeout=10_000)
    assert row.locator(".badge").inner_text() == "completed"
    assert "toy-env" in row.inner_text() and "4/4" in row.inner_text()
    assert page.locator(f'tr[data-run-id="{ids["failed"]}"] .badge').inner_text() == "failed"
    # SIGKILLed run: shown as vanished, never "running"
    assert page.locator(f'tr[data-run-id="{ids["killed"]}"] .badge').inner_text() == "failed (vanished)"
    # the running run's progress moves without a reload
    live = page.locator(f'tr[data-run-id="{ids["running"]}"]')
    assert live.locator(".badge").inner_text() == "running"
    first = int(re.search(r"(\d+)/400", live.inner_text()).group(1))
    page.wait_for_function(
        """([id, n]) => { const r = document.querySelector(`tr[data-run-id="${id}"]`);
             const m = r && r.innerText.match(/(\\d+)\\/400/); return m && Number(m[1]) > n; }""",
        arg=[ids["running"], first], timeout=15_000)
    page.screenshot(path=str(ARTIFACTS / "dashboard-runs-list.png"), full_page=True)
    # filters
    page.select_option("#f-status", "failed")
    page.wait_for_function("() => document.querySelectorAll('#runs-body tr[data-run-id]').length === 2")
    assert page.locator(f'tr[data-run-id="{ids["completed"]}"]').count() == 0


def test_metrics_view(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["completed"]}/metrics')
    page.locator("#avg-reward").wait_for(timeout=10_000)
    # driver: reward 1 unless (example + rollout) % 3 == 0 -> 8 of 12
    assert page.locator("#avg-reward").inner_text() == "0.667"
    assert page.locator("#histogram > div").count() == 10
    assert "SandboxCreateError" in page.locator("#errors-by-type").inner_text()
    assert "num_turns" in page.inner_text("#tab")
    passk = page.locator("#passk").inner_text()
    assert "pass@k" in passk and "1.000" in passk
    assert "total" in page.locator("#timing").inner_text()
    page.screenshot(path=str(ARTIFACTS / "dashboard-metrics.png"), full_page=True)


def test_samples_view_groups_rollouts_of_an_example(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["completed"]}/samples')
    page.locator(".group").first.wait_for(timeout=10_000)
    groups = page.locator(".group")
    assert groups.count() == 4
    for i in range(4):
        g = page.locator(f'.group[data-example-id="{i}"]')
        assert g.locator(".rollout").count() == 3
        assert f"What is {i} + {i}?" in g.inner_text()
    g0 = page.locator('.group[data-example-id="0"]')
    # example 0: rewards 0,1,1 -> mean .667, spread shown
    assert "0.667" in g0.locator(".group-head").inner_text() and "± 0.471" in g0.inner_text()
    assert g0.locator(".rollout .tool").first.inner_text() == "python"
    # the errored rollout of example 2 shows its error
    assert "SandboxCreateError: container died" in page.locator('.group[data-example-id="2"] .rollout-error').inner_text()
    page.screenshot(path=str(ARTIFACTS / "dashboard-samples.png"), full_page=True)


def test_failed_run_shows_error_and_log(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["failed"]}')
    page.locator("#error-box").wait_for(timeout=10_000)
    assert "ValueError: boom at example 1" in page.locator("#error-box").inner_text()
    log = page.locator("pre#log")
    page.wait_for_function("() => document.querySelector('pre#log').textContent.includes('scoring example 1')")
    assert "finished example 0" in log.inner_text()
    overflow = page.evaluate("getComputedStyle(document.querySelector('pre#log')).overflowY")
    assert overflow == "auto"
    page.screenshot(path=str(ARTIFACTS / "dashboard-failed-run.png"), full_page=True)


def test_swe_debug_view(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["swe"]}')
    page.locator("#instances").wait_for(timeout=10_000)
    t = page.locator("#instances").inner_text()
    assert "toolz__toolz-1" in t and "gold_apply_failed" in t and "4.20" in t
    page.locator('details[data-iid="attrs__attrs-2"] summary').click()
    assert "patch failed" in page.locator('details[data-iid="attrs__attrs-2"] pre').inner_text()
    assert "gold patch does not apply" in page.locator('tr[data-instance-id="attrs__attrs-2"]').inner_text()
    page.screenshot(path=str(ARTIFACTS / "dashboard-swe-debug.png"), full_page=True)


def test_stop_button_stops_a_running_run(world, page):
    rid = world["ids"]["running"]
    page.goto(f'{world["base"]}/#/run/{rid}/log')
    page.locator("#stop-btn").click()
    page.wait_for_function("() => document.querySelector('#run-head .badge').dataset.status === 'stopped'",
                           timeout=30_000)
    assert world["running_proc"].wait(10) == 0
    assert registry.get_run(rid).status == "stopped"
    page.wait_for_function("() => document.querySelector('pre#log').textContent.includes('stopped')")
    page.screenshot(path=str(ARTIFACTS / "dashboard-stopped.png"), full_page=True)
