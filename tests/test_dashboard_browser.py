"""The dashboard in a real headless browser (Debian's Chromium driven by
playwright), against the real `vf-sandbox dashboard` server and runs made by
real processes. Screenshots go to test-artifacts/.

Needs /usr/bin/chromium (scripts/install-browser.sh). Skips without it,
FAILS without it when VF_REQUIRE_BROWSER=1 (CI)."""

from __future__ import annotations

import json
import os
import shutil
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runs import registry

# One worker runs the module (`make test`: pytest-xdist, --dist loadgroup): its module fixture
# `world` (real runs, a dashboard, Chromium) is set up once, not once per worker.
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("dashboard-browser")]

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
    p, ids["nosave"] = drive("nosave", "nosave", 3)
    assert p.wait(30) == 0
    p, ids["deleted"] = drive("complete", "deleted", 2, 2)
    assert p.wait(30) == 0
    shutil.rmtree(tmp / "deleted")
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
    dash = subprocess.Popen([sys.executable, "-m", "vfcli.app", "dashboard", "--port", str(port),
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
    # the registry's scored / errored counts (schema 3) in their own columns
    assert row.locator("td.scored").inner_text() == "4" and row.locator("td.errored").inner_text() == "0"
    assert page.locator(f'tr[data-run-id="{ids["failed"]}"] .badge').inner_text() == "failed"
    # SIGKILLed run: shown as vanished, never "running"
    assert page.locator(f'tr[data-run-id="{ids["killed"]}"] .badge').inner_text() == "incomplete (vanished)"
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
    page.select_option("#f-status", "failed")  # the SIGKILLed run is incomplete (resumable), not failed
    page.wait_for_function("() => document.querySelectorAll('#runs-body tr[data-run-id]').length === 1")
    assert page.locator(f'tr[data-run-id="{ids["completed"]}"]').count() == 0


def test_metrics_view(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["completed"]}/metrics')
    page.locator("#avg-reward").wait_for(timeout=10_000)
    # driver: reward 1 unless (example + rollout) % 3 == 0; row (2, 1) is a sandbox error,
    # left out of the average -> 8 of 11 scored
    assert page.locator("#avg-reward").inner_text() == "0.727"
    assert page.locator("#histogram > div").count() == 10
    assert "SandboxCreateError" in page.locator("#errors-by-type").inner_text()
    assert "num_turns" in page.inner_text("#tab")
    passk = page.locator("#passk").inner_text()
    assert "pass@k" in passk and "1.000" in passk
    assert "total" in page.locator("#timing").inner_text()
    page.screenshot(path=str(ARTIFACTS / "dashboard-metrics.png"), full_page=True)


def _rewards(page, example):
    return [page.locator(f'tr.sample[data-example-id="{example}"][data-rollout="{j}"] .sample-reward').inner_text()
            for j in range(3)]


def test_samples_table_groups_own_rewards_sort_filter_search(world, page):
    rid = world["ids"]["completed"]
    page.goto(f'{world["base"]}/#/run/{rid}/samples')
    page.locator("#samples-table tbody.group").first.wait_for(timeout=10_000)
    groups = page.locator("#samples-table tbody.group")
    # groups in example order, each with its 3 rollouts, the prompt shown
    assert [groups.nth(i).get_attribute("data-example-id") for i in range(groups.count())] == ["0", "1", "2", "3"]
    for i in range(4):
        g = page.locator(f'tbody.group[data-example-id="{i}"]')
        assert g.locator("tr.sample").count() == 3 and f"What is {i} + {i}?" in g.inner_text()
    # mixed rewards inside a group (driver: reward 0 when (example + rollout) % 3 == 0): each row shows
    # ITS OWN reward, the head the group's mean
    assert _rewards(page, 0) == ["0.000", "1.000", "1.000"]
    assert _rewards(page, 1) == ["1.000", "1.000", "0.000"]
    g0 = page.locator('tbody.group[data-example-id="0"]')
    assert g0.locator(".group-mean").inner_text() == "0.667" and "± 0.471" in g0.inner_text()
    # compact columns: error, turns (2 model calls), tokens, duration
    err_row = page.locator('tr.sample[data-example-id="2"][data-rollout="1"]')
    assert "SandboxCreateError: container died" in err_row.locator(".sample-error").inner_text()
    first = page.locator('tr.sample[data-example-id="0"][data-rollout="0"]').locator("td")
    assert [first.nth(k).inner_text() for k in (5, 6, 7)] == ["2", "15", "0.70"]
    assert page.locator("#total-tokens").inner_text() == "210"  # 12 rows: sum of (10+i) + (5+j)
    page.screenshot(path=str(ARTIFACTS / "dashboard-samples.png"), full_page=True)
    # collapse one group, then expand
    g0.locator("tr.group-head").click()
    assert page.locator('tbody.group[data-example-id="0"] tr.sample').first.is_hidden()
    page.locator('tbody.group[data-example-id="0"] tr.group-head').click()
    assert page.locator('tbody.group[data-example-id="0"] tr.sample').first.is_visible()
    # filter: errors only
    page.select_option("#sample-show", "errors")
    assert page.locator("tr.sample").count() == 1
    page.select_option("#sample-show", "zero")
    assert page.locator("tr.sample").count() == 4 and all(
        t == "0.000" for t in page.locator("tr.sample .sample-reward").all_inner_texts())
    page.select_option("#sample-show", "all")
    # search: by prompt text
    page.fill("#sample-search", "What is 3 + 3")
    assert page.locator("tr.sample").count() == 3
    assert set(page.locator("tr.sample").evaluate_all("rs => rs.map(r => r.dataset.exampleId)")) == {"3"}
    page.fill("#sample-search", "")
    # sort by reward (descending, flat): every 1.000 before every 0.000
    page.locator('#samples-table th[data-sort="reward"]').click()
    rewards = page.locator("tr.sample .sample-reward").all_inner_texts()
    assert len(rewards) == 12 and rewards == sorted(rewards, reverse=True) and rewards[0] == "1.000"
    page.locator('#samples-table th[data-sort="reward"]').click()
    assert page.locator("tr.sample .sample-reward").first.inner_text() == "0.000"
    page.locator('#samples-table th[data-sort="example"]').click()  # back to groups


def test_sample_link_raw_json_turn_timing_traceback(world, page):
    rid = world["ids"]["completed"]
    page.goto(f'{world["base"]}/#/run/{rid}/samples')
    row = page.locator('tr.sample[data-example-id="2"][data-rollout="1"]')
    row.wait_for(timeout=10_000)
    href = row.locator("a.sample-link").get_attribute("href")
    assert href == f"#/run/{rid}/samples/7"  # rows 0-2 example 0, 3-5 example 1, 6-8 example 2
    page.goto(f'{world["base"]}/{href}')  # the link opens the sample on its own
    page.locator(".sample-detail").wait_for(timeout=10_000)
    assert page.locator("#detail-reward").inner_text() == "0.000"  # its own reward, not its group's 0.667
    assert "SandboxCreateError: container died" in page.locator("#detail-error").inner_text()
    assert "await backend.create(spec)" in page.locator("#detail-traceback").inner_text()
    tt = page.locator("#turn-timing tbody tr")
    assert tt.count() == 2 and tt.nth(0).locator("td").nth(1).inner_text() == "0.250"
    assert tt.nth(0).locator("td").nth(2).inner_text() == "0.050"
    page.locator("#raw-json summary").click()
    raw = json.loads(page.locator("#raw-json pre").inner_text())
    assert raw["example_id"] == 2 and raw["reward"] == 0.0 and raw["token_usage"] == {"input_tokens": 12, "output_tokens": 6}
    page.screenshot(path=str(ARTIFACTS / "dashboard-sample-detail.png"), full_page=True)


def test_runs_list_avg_reward_pass_at_k_sort_and_compare(world, page):
    ids = world["ids"]
    page.goto(world["base"] + "/")
    row = page.locator(f'tr[data-run-id="{ids["completed"]}"]')
    row.wait_for(timeout=10_000)
    assert row.locator(".avg-reward").inner_text() == "0.727"  # 8 of 11 scored rows
    # pass@1 over the examples without an errored rollout (0, 1, 3): 6/9; pass@2 (the largest k the summary reports for r=3): 1.0
    assert row.locator(".pass1").inner_text() == "0.667" and row.locator(".passk").inner_text().startswith("1.000")
    assert "@2" in row.locator(".passk").inner_text()
    assert "results not saved" in page.locator(f'tr[data-run-id="{ids["nosave"]}"]').inner_text()
    assert "outputs deleted" in page.locator(f'tr[data-run-id="{ids["deleted"]}"]').inner_text()
    assert "environment code error" in page.locator(f'tr[data-run-id="{ids["failed"]}"] .failure-category').inner_text()
    # sort by avg reward, both ways (runs without results last)
    page.locator('#runs-table th[data-sort="avg_reward"]').click()
    vals = [v for v in page.locator("#runs-body .avg-reward").all_inner_texts() if v != "–"]
    assert vals == sorted(vals, reverse=True) and len(vals) >= 3
    page.locator('#runs-table th[data-sort="avg_reward"]').click()
    vals = [v for v in page.locator("#runs-body .avg-reward").all_inner_texts() if v != "–"]
    assert vals == sorted(vals)
    # filter by model
    page.fill("#f-model", "no-such-model")
    page.wait_for_function("() => document.querySelectorAll('#runs-body tr[data-run-id]').length === 0")
    page.fill("#f-model", "toy")
    row.wait_for()
    # filter by env: the swe-debug run's env only
    page.fill("#f-model", "")
    page.fill("#f-env", "swe-mini")
    page.wait_for_function("() => document.querySelectorAll('#runs-body tr[data-run-id]').length === 1")
    page.fill("#f-env", "")
    page.fill("#f-model", "toy")
    row.wait_for()
    # compare two runs
    assert page.locator("#compare-btn").is_disabled()
    page.locator(f'tr[data-run-id="{ids["completed"]}"] input.pick').click()
    page.locator(f'tr[data-run-id="{ids["failed"]}"] input.pick').click()
    page.locator("#compare-btn").click()
    page.locator("#compare-table").wait_for(timeout=10_000)
    heads = page.locator("#compare-table thead th[data-run-id]")
    assert heads.count() == 2
    avgs = page.locator("#compare-table .cmp-avg").all_inner_texts()
    assert avgs[0] == "0.727" and len(avgs) == 2
    # overlaid histograms: bars of both runs on one chart
    bars = page.locator("#compare-hist rect.hist-bar")
    assert bars.evaluate_all("bs => new Set(bs.map(b => b.dataset.run)).size") == 2
    page.screenshot(path=str(ARTIFACTS / "dashboard-compare.png"), full_page=True)


def test_metrics_parameters_and_unsaved_run(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["completed"]}/metrics')
    page.locator("#params").wait_for(timeout=10_000)
    t = page.locator("#params").inner_text()
    assert "toy-model" in t and '{"temperature":0.7}' in t and '{"level":2}' in t
    assert re.search(r"n \(examples\)\s+4", t) and re.search(r"r \(rollouts per example\)\s+3", t)
    page.goto(f'{world["base"]}/#/run/{world["ids"]["nosave"]}/metrics')
    page.locator("#no-results").wait_for(timeout=10_000)
    assert page.locator("#no-results").inner_text() == "completed, results not saved (the eval ran without -s)"
    page.goto(f'{world["base"]}/#/run/{world["ids"]["deleted"]}/samples')
    # a hash change re-renders in place: wait for the new run's text, not the previous #no-results
    page.wait_for_function("() => (document.querySelector('#no-results') || {}).textContent"
                           "?.startsWith('completed, outputs deleted')", timeout=10_000)


def test_failed_run_shows_error_and_log(world, page):
    page.goto(f'{world["base"]}/#/run/{world["ids"]["failed"]}')
    page.locator("#error-box").wait_for(timeout=10_000)
    assert "ValueError: boom at example 1" in page.locator("#error-box").inner_text()
    assert page.locator("#diagnosis .category").inner_text() == "environment code error"
    assert "runs logs" in page.locator("#diagnosis .hint").inner_text()
    log = page.locator("pre#log")
    page.wait_for_function("() => document.querySelector('pre#log')?.textContent.includes('scoring example 1')")
    assert "finished example 0" in log.inner_text()
    # the full traceback, not only its last line
    text = log.inner_text()
    assert "Traceback (most recent call last)" in text and 'float("boom at example 1")' in text
    assert "ValueError: could not convert string to float" in text
    overflow = page.evaluate("getComputedStyle(document.querySelector('pre#log')).overflowY")
    assert overflow == "auto"
    # search: only the matching lines, highlighted
    page.fill("#log-search", "finished example")
    lines = log.inner_text().splitlines()
    assert lines == [x for x in lines if "finished example" in x] and len(lines) == 1
    assert page.locator("pre#log mark").count() == 1 and "1 matching" in page.locator("#log-note").inner_text()
    page.fill("#log-search", "")
    assert "scoring example 1" in log.inner_text()
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
    # the log follows the live run's tail: new lines arrive without a reload
    # null-safe predicates: the log tab renders after the run's head (a throwing predicate is not retried)
    page.wait_for_function("() => document.querySelector('pre#log')?.textContent.includes('finished example')",
                           timeout=15_000)
    n0 = page.locator("pre#log").inner_text().count("finished example")
    page.wait_for_function("n => (document.querySelector('pre#log')?.textContent ?? '').split('finished example').length - 1 > n",
                           arg=n0, timeout=15_000)
    assert page.locator("#log-follow").is_checked()
    assert page.evaluate("() => { const p = document.querySelector('pre#log'); "
                         "return p.scrollTop + p.clientHeight >= p.scrollHeight - 20; }")
    page.locator("#stop-btn").click()
    page.wait_for_function("() => document.querySelector('#run-head .badge')?.dataset.status === 'stopped'",
                           timeout=30_000)
    assert world["running_proc"].wait(10) == 0
    assert registry.get_run(rid).status == "stopped"
    page.wait_for_function("() => document.querySelector('pre#log')?.textContent.includes('stopped')")
    page.screenshot(path=str(ARTIFACTS / "dashboard-stopped.png"), full_page=True)
