"""SWE debugging end to end on real Docker with the example taskset built from
PyPI sdists (idna, python-dateutil, more-itertools and the broken variants):
valid, invalid and broken instances, timeouts, retries on infra errors,
flakiness, the CLI's exit code and JUnit report, resume after SIGKILL, and
SIGINT / SIGTERM at -c 8 (no sandbox left, finished rows kept, run `stopped`).

The dataset and images are built once per session into the shared cache
(`.cache/swe-examples/`, `vf-swe/*` images), so a warm run only runs tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import one_at_a_time, require_docker

pytestmark = pytest.mark.docker

IDNA, DATEUTIL, MORE = "kjd__idna-3.4", "dateutil__dateutil-2.8.2", "more-itertools__more-itertools-10.2.0"
PASSES_BEFORE, BAD_GOLD = "kjd__idna-3.4-passes-before", "kjd__idna-3.4-bad-gold"
ROOT = Path(__file__).resolve().parent.parent
VF_SWE_DEBUG = [sys.executable, "-m", "swe_debug.cli"]


@pytest.fixture(scope="session")
def examples() -> Path:
    """The example dataset, its sdists fetched and its images built (cached across runs)."""
    require_docker()
    import asyncio

    from swe_debug.examples.builder import build_dataset, build_images

    with one_at_a_time("swe-examples"):  # every xdist worker's session builds it: one at a time
        path = build_dataset()
        asyncio.run(build_images(path))
    return path


@pytest.fixture(scope="session")
def instances(examples):
    from swe_debug.instances import load_instances

    rep = load_instances(examples)
    assert not rep.errors
    return {i.instance_id: i for i in rep.instances}


def _taskset(instances, ids):
    from swe_debug.taskset import SWETaskSet

    return SWETaskSet([instances[i] for i in ids])


async def _run(instances, ids, opts=None, backend=None, taskset=None, concurrency=4, max_retries=2, **env_kw):
    """Rollouts of SWEDebugEnv (as an eval runs them); the verdict of each instance, with
    the row's attempts and error, by instance id."""
    from swe_debug.env import SWEDebugEnv

    env = SWEDebugEnv(taskset or _taskset(instances, ids), **env_kw)
    if opts is not None:
        env.options = opts
    env.set_backend(backend or "docker")
    env.retry_policy = env.retry_policy.model_copy(update={"initial_delay": 0.1})
    try:
        out = await env.generate(env.get_eval_inputs(), client=None, model="none", max_concurrent=concurrency,
                                 max_retries=max_retries)
    finally:
        await env.teardown()
    return {r["info"]["instance_id"]: {**r["info"]["verdict"], "attempts": r["attempts"], "error": r["error"],
                                       "error_type": _error_type(r)} for r in out["outputs"]}


def _error_type(row):
    info = row.get("error_info") if isinstance(row.get("error_info"), dict) else row.get("error")
    return info.get("type") if isinstance(info, dict) else row.get("error_type")


def _results(out: Path) -> Path:
    """The results.jsonl of the one run under the output dir `out` (vf-swe-debug -o out)."""
    found = list(out.glob("evals/swe-debug--none/*/results.jsonl"))
    assert len(found) == 1, found
    return found[0]


def _iid(line: str) -> str:
    return json.loads(line)["info"]["instance_id"]


async def test_gold_run_with_fails_before_check(instances):
    rows = await _run(instances, [IDNA, DATEUTIL, MORE, PASSES_BEFORE, BAD_GOLD], check_fails_before=True, concurrency=2)
    for iid in (IDNA, DATEUTIL, MORE):
        r = rows[iid]
        assert r["valid"] and r["reason"] == "pass", (iid, r["reason"], r["detail"], r["stdout_tail"][-800:])
        assert r["test_exit_code"] == (1 if iid == DATEUTIL else 0) and r["apply_method"] == "git apply"
        assert r["fails_before"]["ok"] and r["fails_before"]["test_exit_code"] != 0
        assert r["fail_to_pass"]["passed"] == len(instances[iid].FAIL_TO_PASS) > 0
        assert r["pass_to_pass"]["passed"] == len(instances[iid].PASS_TO_PASS)
        t = r["timings"]
        assert t["tests_s"] > 0 and t["create_s"] > 0 and t["total_s"] >= t["tests_s"]
    assert rows[DATEUTIL]["pass_to_pass"]["passed"] > 1000  # the whole suite collected (needs pytest-cov)
    # the tests pass without the patch: a gold run alone would call it valid
    pb = rows[PASSES_BEFORE]
    assert not pb["valid"] and pb["reason"] == "test_failed"
    assert pb["fails_before"]["passing_before"] == instances[PASSES_BEFORE].FAIL_TO_PASS
    bg = rows[BAD_GOLD]
    assert not bg["valid"] and bg["reason"] == "gold_apply_failed" and bg["test_exit_code"] is None
    assert "patch --batch --forward --fuzz=5" in bg["stdout_tail"]  # every rung was tried
    assert all(r["error"] is None and r["attempts"] == 1 for r in rows.values())


async def test_a_reversed_or_already_applied_gold_patch_fails_to_apply(instances):
    """The reversed gold patch applies only in reverse (which would leave exactly the fixed
    tree): every rung must refuse it, not grade the instance valid."""
    from swe_debug.published import reverse_patch
    from swe_debug.taskset import SWETaskSet

    rev = instances[IDNA].model_copy(update={"instance_id": "reversed-gold", "patch": reverse_patch(instances[IDNA].patch)})
    assert rev.patch != instances[IDNA].patch
    rows = await _run(instances, [], taskset=SWETaskSet([rev]))
    r = rows["reversed-gold"]
    assert not r["valid"] and r["reason"] == "gold_apply_failed" and r["test_exit_code"] is None, r
    assert "Reversed (or previously applied) patch detected" in r["stdout_tail"]


async def test_passes_before_instance_is_valid_without_the_check(instances):
    rows = await _run(instances, [PASSES_BEFORE])
    assert rows[PASSES_BEFORE]["valid"]  # which is exactly why --check-fails-before exists


async def test_noop_and_command_steps(instances):
    from swe_debug.debug import DebugOptions

    rows = await _run(instances, [IDNA], DebugOptions(debug_step="none"))
    r = rows[IDNA]
    assert r["reason"] == "test_failed" and r["test_exit_code"] == 1
    assert r["fail_to_pass"]["failing"] == instances[IDNA].FAIL_TO_PASS

    rows = await _run(instances, [IDNA], DebugOptions(debug_step="command", debug_command="echo to-stderr >&2; exit 3"))
    r = rows[IDNA]
    assert r["reason"] == "debug_command_failed" and r["debug_exit_code"] == 3 and "to-stderr" in r["stderr_tail"]
    assert r["test_exit_code"] is None  # tests are skipped after a failed debug step

    # a command can be the fix: apply the upstream change by hand, then the tests pass
    fix = ("python3 - <<'EOF'\nimport re, pathlib\np = pathlib.Path('idna/core.py')\ns = p.read_text()\n"
           "s = s.replace(\"        s = s.decode('ascii')\", \"        try:\\n            s = s.decode('ascii')\\n"
           "        except UnicodeDecodeError:\\n            raise IDNAError('bytes')\", 1)\np.write_text(s)\nEOF")
    rows = await _run(instances, [IDNA], DebugOptions(debug_step="command", debug_command=fix))
    assert rows[IDNA]["reason"] == "pass", rows[IDNA]["detail"]


async def test_hanging_debug_script_times_out_and_leaves_nothing(instances):
    from sandboxes import get_backend
    from swe_debug.debug import DebugOptions
    from swe_debug.examples.builder import HANG_SCRIPT

    label = f"t-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    rows = await _run(instances, [IDNA], DebugOptions(debug_step="script", debug_script_path=str(HANG_SCRIPT),
                                                      debug_timeout=3, labels={"swe-test": label}))
    r = rows[IDNA]
    assert r["reason"] == "timeout" and not r["valid"] and "exceeded 3s" in r["detail"]
    assert "hangs" in r["stdout_tail"]
    assert time.perf_counter() - t0 < 20
    be = get_backend("docker")
    try:
        assert await be.list({"swe-test": label}) == []
    finally:
        await be.close()


async def test_whole_rollout_timeout(instances):
    from swe_debug.debug import DebugOptions

    rows = await _run(instances, [IDNA], DebugOptions(debug_step="command", debug_command="sleep 60", timeout_seconds=2))
    assert rows[IDNA]["reason"] == "timeout" and "timeout_seconds" in rows[IDNA]["detail"]


class FlakyCreate:
    """The real Docker backend, except that the first `fail` creates raise an InfraError."""

    def __init__(self, fail: int):
        from sandboxes import get_backend

        self.inner, self.fail, self.calls = get_backend("docker"), fail, 0
        self.name = "flaky-docker"

    async def create(self, spec, **kw):
        from sandboxes import SandboxCreateError

        self.calls += 1
        if self.calls <= self.fail:
            raise SandboxCreateError("injected: the daemon refused the container")
        return await self.inner.create(spec, **kw)

    def __getattr__(self, item):
        return getattr(self.inner, item)


async def test_sandbox_error_is_retried_then_reported(instances):
    rows = await _run(instances, [IDNA], backend=FlakyCreate(fail=1), max_retries=2)
    assert rows[IDNA]["reason"] == "pass" and rows[IDNA]["attempts"] == 2
    rows = await _run(instances, [IDNA], backend=FlakyCreate(fail=10), max_retries=1)
    r = rows[IDNA]
    assert r["reason"] == "sandbox_error" and r["error_type"] == "SandboxCreateError" and r["attempts"] == 2
    assert r["error"]  # no verdict: the row carries the infra error (an eval --resume runs it again)


async def test_repeat_reports_flaky(instances):
    from swe_debug.taskset import SWETaskSet

    class EverySecondRunFails(SWETaskSet):
        """Real runs; the second test run's log is graded as if a P2P test had not run."""

        runs = 0

        def grade(self, inst, parse, exit_code):
            type(self).runs += 1
            if self.runs == 2:
                parse = parse.model_copy(update={"statuses": {}})
            return super().grade(inst, parse, exit_code)

    ts = EverySecondRunFails([instances[IDNA]])
    rows = await _run(instances, [IDNA], taskset=ts, repeat=3)
    r = rows[IDNA]
    assert r["reason"] == "flaky" and not r["valid"] and "2/3" in r["detail"]
    assert [x["valid"] for x in r["repeats"]] == [True, False, True]


async def test_prebuilt_image_and_missing_image(instances, tmp_path):
    from swe_debug.images import ImageBuilder
    from swe_debug.instances import SWEInstance

    tag = (await ImageBuilder().ensure(instances[IDNA])).tag
    data = instances[IDNA].model_dump(exclude={"source", "environment"})
    pre = SWEInstance.model_validate({**data, "instance_id": "prebuilt", "image_name": tag})
    gone = SWEInstance.model_validate({**data, "instance_id": "gone", "image_name": "vf-swe/does-not-exist:1"})
    # an image that is not this instance's repo: setup refuses it instead of testing the wrong code
    other = SWEInstance.model_validate({**data, "instance_id": "other", "image_name": tag, "base_commit": "f" * 40})
    norepo = SWEInstance.model_validate({**data, "instance_id": "norepo", "image_name": "vf-sandbox/base:bookworm",
                                         "workdir": "/tmp"})
    from swe_debug.taskset import SWETaskSet

    ts = SWETaskSet([pre, gone, other, norepo])
    rows = await _run(instances, [], taskset=ts)
    assert rows["prebuilt"]["reason"] == "pass" and rows["prebuilt"]["image"] == tag
    # an image that cannot be pulled is the row's infrastructure error (retried, resumable), never a verdict
    assert rows["gone"]["error_type"] == "ImagePullFailed" and "cannot be pulled" in rows["gone"]["error"]
    assert rows["gone"]["attempts"] == 3 and not rows["gone"].get("valid")
    assert rows["other"]["reason"] == "setup_failed" and "not in this repository" in rows["other"]["detail"]
    assert rows["norepo"]["reason"] == "setup_failed" and "no git work tree" in rows["norepo"]["detail"]


def test_cli_exit_code_and_junit(examples, tmp_path):
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    env = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    ok = subprocess.run([*VF_SWE_DEBUG, str(examples), "--instance-ids", IDNA, "-o", str(out), "-q"],
                        capture_output=True, text=True, cwd=ROOT, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([*VF_SWE_DEBUG, str(examples), "-i", f"{IDNA},{BAD_GOLD}", "-o", str(out),
                          "--junit-xml", str(junit)], capture_output=True, text=True, cwd=ROOT, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "gold_apply_failed" in bad.stdout  # the summary table
    assert "1 valid 1 invalid 0 errors" in bad.stderr  # the progress line with its counts
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases[IDNA].find("failure") is None
    fail = cases[BAD_GOLD].find("failure")
    assert fail.get("message").startswith("gold_apply_failed") and "Hunk #1 FAILED" in fail.text
    # the suite's time is the run's wall time (image, set-up and queueing included), not a sum of parts
    (meta_path,) = [p for p in out.glob("evals/swe-debug--*/*/metadata.json")
                    if json.loads(p.read_text()).get("completed_rollouts") == 2]
    wall = json.loads(meta_path.read_text())["time_ms"] / 1000
    assert float(suite.get("time")) == pytest.approx(wall, abs=0.002)
    assert all(float(c.get("time")) <= wall + 0.002 for c in cases.values())
    unknown = subprocess.run([*VF_SWE_DEBUG, str(examples), "-i", "nope", "-o", str(out), "-q"],
                             capture_output=True, text=True, cwd=ROOT, env=env)
    assert unknown.returncode == 2 and "nope" in unknown.stderr


def test_resume_after_sigkill(examples, tmp_path):
    out = tmp_path / "out"
    run_id = uuid.uuid4().hex[:12]
    env = {**os.environ, "VF_SANDBOX_RUN_ID": run_id, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    ids = f"{IDNA},{BAD_GOLD},{DATEUTIL},{MORE}"
    proc = subprocess.Popen([*VF_SWE_DEBUG, str(examples), "-i", ids, "-c", "1", "-o", str(out), "-q"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            found = list(out.glob("evals/*/*/results.jsonl"))
            if found and found[0].read_text().count("\n") >= 2:  # two whole rows
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        # the killed run's sandboxes: ours by run id (the backend's lifetime cap would get them too)
        leftover = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=vf-sandbox.run-id={run_id}"],
                                  capture_output=True, text=True).stdout.split()
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)
    results = _results(out)
    text = results.read_text()
    whole = text[: text.rfind("\n") + 1]  # a kill mid-write may leave a torn last line: --resume drops it
    before = whole.splitlines()
    assert 2 <= len(before) < 4, [_iid(x) for x in before]  # every whole line is valid JSON

    res = subprocess.run([*VF_SWE_DEBUG, str(examples), "-i", ids, "-c", "2", "-o", str(out), "--resume", "-q"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # the bad-gold instance is invalid
    assert _results(out) == results  # the same run, continued
    after = results.read_text().splitlines()
    assert after[: len(before)] == before  # the finished rows were kept as they were...
    assert sorted(map(_iid, after)) == sorted(ids.split(","))  # ...and nothing ran twice
    reasons = {_iid(x): json.loads(x)["info"]["verdict"]["reason"] for x in after}
    assert reasons == {IDNA: "pass", BAD_GOLD: "gold_apply_failed", DATEUTIL: "pass", MORE: "pass"}


async def test_swe_debug_env_rewards_valid_and_retries_infra_errors(examples):
    from swe_debug.env import load_environment

    env = load_environment(dataset=str(examples), instance_ids=[IDNA, PASSES_BEFORE, BAD_GOLD], check_fails_before=True)
    try:
        out = await env.generate(env.get_eval_inputs(), client=None, model="none")
    finally:
        await env.teardown()
    rows = {r["info"]["instance_id"]: r for r in out["outputs"]}
    assert {k: r["reward"] for k, r in rows.items()} == {IDNA: 1.0, PASSES_BEFORE: 0.0, BAD_GOLD: 0.0}
    assert rows[BAD_GOLD]["info"]["verdict"]["reason"] == "gold_apply_failed"
    assert rows[IDNA]["metrics"]["tests_s"] > 0 and rows[IDNA]["completion"] == []  # no model turn

    env = load_environment(dataset=str(examples), instance_ids=IDNA)
    env.set_backend(FlakyCreate(fail=1))  # the first sandbox creation fails with an InfraError
    env.retry_policy = env.retry_policy.model_copy(update={"initial_delay": 0.1})
    try:
        out = await env.generate(env.get_eval_inputs(), client=None, model="none", max_retries=2)
    finally:
        await env.teardown()
    (row,) = out["outputs"]
    assert row["reward"] == 1.0 and row["attempts"] == 2 and row["error"] is None


@pytest.fixture(scope="session")
def hang_dataset(examples, instances, tmp_path_factory) -> Path:
    """Two instances that finish at once, then eight copies of idna whose debug command hangs
    (with `--debug-step command --debug-command HANG --no-tests`)."""
    rows = {json.loads(x)["instance_id"]: json.loads(x) for x in examples.read_text().splitlines()}
    for r in rows.values():  # paths relative to the examples dir → absolute
        r["source"]["archive"] = str((examples.parent / r["source"]["archive"]).resolve())
    out = [rows[MORE], rows[DATEUTIL]] + [{**rows[IDNA], "instance_id": f"hang-{i}"} for i in range(8)]
    path = tmp_path_factory.mktemp("hang") / "hang.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


HANG = "[ -d idna ] && exec sleep 600 || true"  # idna copies hang; the others finish


def _containers(run_id: str) -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", "label=vf-sandbox.managed=true",
                           "--filter", f"label=vf-sandbox.run-id={run_id}"], capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_run_at_c8_stops_cleanly(hang_dataset, tmp_path, monkeypatch, sig):
    from runs import registry

    out = tmp_path / "out"
    run_id = uuid.uuid4().hex[:12]
    env = {**os.environ, "VF_SANDBOX_RUN_ID": run_id, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    proc = subprocess.Popen([*VF_SWE_DEBUG, str(hang_dataset), "--debug-step", "command", "--debug-command", HANG,
                             "--no-tests", "-c", "8", "-o", str(out), "--name", "sig", "-q"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:  # two rows saved and eight sandboxes hanging
            found = list(out.glob("evals/*/*/results.jsonl"))
            if found and found[0].read_text().count("\n") == 2 and len(_containers(run_id)) == 8:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        else:
            pytest.fail(f"never reached 2 rows + 8 sandboxes: {_containers(run_id)}")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        leftover = _containers(run_id)
        if leftover:
            subprocess.run(["docker", "rm", "-f", *leftover], capture_output=True)
    assert leftover == [], err[-3000:]  # every sandbox deleted before the process ended
    assert proc.returncode == 128 + sig, err[-3000:]
    assert sorted(map(_iid, found[0].read_text().splitlines())) == sorted([MORE, DATEUTIL])  # finished rows kept
    meta = json.loads((found[0].parent / "metadata.json").read_text())
    assert meta["status"] == "stopped" and meta["completed_rollouts"] == 2
    monkeypatch.setenv("VF_RUNS_DB", str(tmp_path / "runs.db"))
    [r] = registry.list_runs()
    assert (r.kind, r.name, r.status, r.completed) == ("swe-debug", "sig", "stopped", 2)
    assert "use --resume" in err


async def test_image_keys_follow_content_and_a_wrong_base_commit_fails_the_build(instances):
    from swe_debug.images import ImageBuilder

    b = ImageBuilder()
    idna = instances[IDNA]
    ref = await b.ensure(idna)
    assert ref.built == [] and ref.seconds < 2  # warm: cache hits only
    env_id = await b.image_id(ref.env_tag)
    key = b.instance_key(idna, env_id)
    assert b.instance_key(idna.model_copy(update={"install": ["true"]}), env_id) != key
    assert ImageBuilder(salt="x").instance_key(idna, env_id) != key
    env2 = idna.environment.model_copy(update={"packages": ["pytest==7.4.3"]})
    base_id = await b.image_id(b.base_image)
    assert b.environment_key(env2, base_id) != b.environment_key(idna.environment, base_id)

    # a Python the base image does not have is refused, clearly, before any download or build
    py39 = idna.model_copy(update={"instance_id": "py39", "environment": idna.environment.model_copy(
        update={"python_version": "3.9"})})
    rows = await _run(instances, [], taskset=_taskset({"py39": py39}, ["py39"]))
    assert rows["py39"]["reason"] == "setup_failed" and "python_version 3.9 is not available" in rows["py39"]["detail"]

    # the snapshot's commit must be the instance's base_commit: a wrong one is a broken instance
    wrong = idna.model_copy(update={"instance_id": "wrong-base", "base_commit": "f" * 40})
    rows = await _run(instances, [], taskset=_taskset({"wrong-base": wrong}, ["wrong-base"]))
    r = rows["wrong-base"]
    assert r["reason"] == "setup_failed" and "base_commit" in r["detail"]


def test_cli_reports_malformed_rows(examples, tmp_path):
    ds = tmp_path / "mixed.jsonl"
    good = next(x for x in examples.read_text().splitlines() if json.loads(x)["instance_id"] == IDNA)
    good_row = json.loads(good)
    good_row["source"]["archive"] = str((examples.parent / good_row["source"]["archive"]).resolve())
    ds.write_text(json.dumps(good_row) + "\n" + json.dumps({"instance_id": "broken", "FAIL_TO_PASS": "[oops"}) + "\n")
    junit = tmp_path / "j.xml"
    env = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    res = subprocess.run([*VF_SWE_DEBUG, str(ds), "-o", str(tmp_path / "out"), "--junit-xml", str(junit), "-q"],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert res.returncode == 1, res.stdout + res.stderr  # the valid instance passed, the bad row still fails CI
    assert "row 1 (broken): FAIL_TO_PASS" in res.stderr
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases[IDNA].find("failure") is None
    assert cases["row 1 (broken)"].find("failure").get("type") == "malformed_row"
