"""One run id everywhere, resume from the run registry, errors that name their cause,
and faults of the results files (issue 26, items 6 and 9): the real `vf-sandbox eval`
as a subprocess against the scripted model server (real sockets), env packages of
tests/test_eval_cli.py, the real Docker engine for the image case, a real tmpfs
for the full disk and a real SIGKILL."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from testmodel.model_server import ModelServer, Reply, compute
from test_eval_cli import (  # noqa: F401 - workdir is a fixture
    cli_env,
    eval_cmd,
    read_rows,
    registry_rows,
    run_cli,
    run_dirs,
    slow_compute,
    wait_rows,
    workdir,
)

ROOT = Path(__file__).resolve().parents[1]


def odd_examples_fail():
    """HTTP 500 for the odd examples of e2e-basic ("What is {i} + 1?"), answers the rest."""
    inner = compute()

    def policy(req):
        m = re.search(r"What is (\d+) \+ 1", req.last_user_text())
        if m and int(m.group(1)) % 2:
            return Reply(error_status=500, error_message="scripted outage")
        return inner(req)

    return policy


def eval_alone(workdir: Path, *args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`vf-sandbox eval ARGS` with nothing added (e.g. `--resume ID`, `--from-run ID`)."""
    return subprocess.run([sys.executable, "-m", "vfcli.app", "eval", *args, "-d"], cwd=cwd or workdir,
                          env=cli_env(workdir), capture_output=True, text=True, timeout=timeout)


def vf(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vfcli.app", *args], cwd=workdir, env=cli_env(workdir),
                          capture_output=True, text=True, timeout=60)


def newest_run(workdir: Path):
    return registry_rows(workdir)[0]


def examples(rows: list[dict]) -> Counter:
    return Counter(r["example_id"] for r in rows)


def get(workdir: Path, rid: str):
    from runs.registry import get_run

    return get_run(rid, path=workdir / "runs.db")


# ------------------------------------------------------------------ one run id


def test_the_run_id_names_the_results_dir_and_every_verb_takes_id_or_path(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "2", "-r", "1", "-s", "-d", base_url=srv.base_url)
        assert res.returncode == 0, res.stderr
        (run_dir,) = run_dirs(workdir, "e2e-basic")
        rid = newest_run(workdir).id
        assert run_dir.name == rid and len(rid) == 12  # one id: the registry's and the directory's
        assert f"run {rid}:" in res.stdout and f"#/run/{rid}" in res.stdout  # the dashboard URL
        for ref in (rid, str(run_dir), str(run_dir / "results.jsonl")):
            shown = json.loads(vf(workdir, "runs", "show", ref, "--json").stdout)
            assert shown["run"]["id"] == rid and shown["summary"]["n_rollouts"] == 2
        assert f"run {rid} started" in vf(workdir, "runs", "logs", str(run_dir)).stdout
        missing = vf(workdir, "runs", "show", str(workdir / "nowhere"))
        assert missing.returncode == 2 and "no run" in missing.stderr

        # --from-run (id or path): a NEW run with the same definition, and it says so
        for ref in (rid, str(run_dir)):
            again = eval_alone(workdir, "--from-run", ref)
            assert again.returncode == 0, again.stderr
            assert f"--from-run {ref}: a new run with the definition of {ref}" in again.stderr
            assert f"vf-sandbox eval --resume {ref}" in again.stderr
            new = newest_run(workdir)
            assert new.id != rid and Path(new.output_dir).name == new.id
    assert len(run_dirs(workdir, "e2e-basic")) == 3
    assert len(read_rows(run_dir)) == 2  # the recorded run is untouched


# ------------------------------------------------------------------ --resume from the registry


def test_bare_resume_continues_the_newest_incomplete_run_of_the_definition_from_the_registry(workdir):
    args = ("e2e-basic", "-n", "4", "-r", "2", "-s", "-d", "--client-max-retries", "0")
    with ModelServer(odd_examples_fail()).run_in_thread() as srv:
        res = run_cli(workdir, *args, "-o", str(workdir / "out-a"), base_url=srv.base_url)
        assert res.returncode not in (0, 2), res.stderr  # 4 of 8 rollouts not scored: incomplete
        broken = newest_run(workdir)
        assert broken.status == "incomplete" and Path(broken.output_dir).name == broken.id
        meta0 = json.loads((Path(broken.output_dir) / "metadata.json").read_text())
        srv.policy = compute()
        done = run_cli(workdir, *args, "-o", str(workdir / "out-b"), base_url=srv.base_url)
        assert done.returncode == 0, done.stderr
        completed = newest_run(workdir)
        assert completed.status == "completed" and completed.id != broken.id

        # elsewhere (another cwd, another -o): the registry, not -o/cwd, finds the run
        elsewhere = workdir / "elsewhere"
        elsewhere.mkdir()
        count0 = srv.count
        res = subprocess.run(eval_cmd(workdir, *args, "-o", str(elsewhere / "out"), "--resume",
                                      base_url=srv.base_url),
                             cwd=elsewhere, env=cli_env(workdir), capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert srv.count - count0 == 4  # exactly the errored rollouts (the odd examples, twice each)
    assert not (elsewhere / "out").exists()
    rows = read_rows(Path(broken.output_dir))
    assert len(rows) == 8 and examples(rows) == {i: 2 for i in range(4)}
    assert all(r.get("verdict", "scored") == "scored" and not r["error"] for r in rows)
    after = get(workdir, broken.id)
    assert (after.status, after.attempts, after.completed) == ("completed", 2, 8)
    assert after.started_at == broken.started_at  # a resume does not reset the start time
    meta = json.loads((Path(broken.output_dir) / "metadata.json").read_text())
    assert meta["date"] == meta0["date"] and meta["status"] == "completed"
    assert len(read_rows(Path(completed.output_dir))) == 8  # the completed run was not touched
    assert get(workdir, completed.id).attempts == 1


def test_resume_never_extends_a_completed_run_unless_asked(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        assert run_cli(workdir, "e2e-basic", "-n", "2", "-r", "1", "-s", "-d", base_url=srv.base_url).returncode == 0
        rec = newest_run(workdir)
        refused = eval_alone(workdir, "--resume", rec.id, "-n", "3")
        assert refused.returncode == 2, refused.stderr
        assert f"run {rec.id} is completed" in refused.stderr and "--extend" in refused.stderr
        assert "Traceback" not in refused.stderr
        same = get(workdir, rec.id)
        assert (same.status, same.attempts, same.ended_at) == ("completed", 1, rec.ended_at)

        # nothing missing: --resume of the completed run runs nothing and keeps it completed
        count0 = srv.count
        assert eval_alone(workdir, "--resume", rec.id).returncode == 0
        assert srv.count == count0

        # a bare --resume finds no incomplete run of the definition: a new run, said so
        res = run_cli(workdir, "e2e-basic", "-n", "2", "-r", "1", "-s", "-d", "--resume", base_url=srv.base_url)
        assert res.returncode == 0 and "no incomplete run of this definition" in res.stderr
        assert len(run_dirs(workdir, "e2e-basic")) == 2

        count0 = srv.count
        ext = eval_alone(workdir, "--resume", rec.id, "-n", "3", "--extend")
        assert ext.returncode == 0, ext.stderr
        assert srv.count - count0 == 1
    assert examples(read_rows(Path(rec.output_dir))) == {0: 1, 1: 1, 2: 1}


def test_a_refused_resume_leaves_the_run_as_it_was(workdir):
    with ModelServer(odd_examples_fail()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "4", "-r", "1", "-s", "-d", "--client-max-retries", "0",
                      base_url=srv.base_url)
        assert res.returncode not in (0, 2), res.stderr
    before = newest_run(workdir)
    assert before.status == "incomplete"
    res = eval_alone(workdir, "--resume", before.id)  # the model server is gone now
    assert res.returncode == 2 and "not reachable" in res.stderr, res.stderr
    after = get(workdir, before.id)
    for key in ("status", "completed", "total", "errors", "attempts", "ended_at", "started_at", "error"):
        assert getattr(after, key) == getattr(before, key), key
    assert len(registry_rows(workdir)) == 1


# ------------------------------------------------------------------ results-file faults


def test_resume_of_a_corrupt_results_file_reports_each_bad_line_and_reruns_its_rollout(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        assert run_cli(workdir, "e2e-basic", "-n", "5", "-r", "1", "-s", "-d", base_url=srv.base_url).returncode == 0
        rec = newest_run(workdir)
        results = Path(rec.output_dir) / "results.jsonl"
        lines = results.read_bytes().split(b"\n")
        lines[1] = b'{"example_id": 1, "reward": 1.0, garbage'
        lines[2] = b"\x00\xff\xfe\x9c binary junk \x80"
        results.write_bytes(b"\n".join(lines))
        count0 = srv.count
        res = eval_alone(workdir, "--resume", rec.id)
        assert res.returncode == 0, res.stderr
        assert f"{results}:2: not a JSON row" in res.stderr
        assert f"{results}:3: not UTF-8 text" in res.stderr
        assert "UnicodeDecodeError" not in res.stderr and "Traceback" not in res.stderr
        assert srv.count - count0 == 2  # the two rollouts whose lines were unusable
    rows = [json.loads(x) for x in results.read_bytes().decode().splitlines()]  # every line valid again
    assert examples(rows) == {i: 1 for i in range(5)}

    (Path(rec.output_dir) / "metadata.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    res = eval_alone(workdir, "--resume", rec.id)
    assert res.returncode == 2 and str(Path(rec.output_dir) / "metadata.json") in res.stderr
    assert "Traceback" not in res.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (we are root in the test machine)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_output_disk_names_the_path_ends_the_run_and_resume_finishes_it(workdir, small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (256 - 40) * 1024)  # ~40 KiB left: room for a few groups
    args = ("e2e-basic", "-n", "20", "-r", "2", "-c", "2", "-s", "-d", "-o", str(small_disk))
    with ModelServer(slow_compute(0.02)).run_in_thread() as srv:
        res = run_cli(workdir, *args, base_url=srv.base_url)
        assert res.returncode not in (0, 2), res.stdout + res.stderr
        rec = newest_run(workdir)
        results = Path(rec.output_dir) / "results.jsonl"
        assert f"cannot write {results}: No space left on device" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
        assert rec.status in ("failed", "incomplete") and str(results) in rec.error and "--resume" in rec.error
        meta = json.loads((Path(rec.output_dir) / "metadata.json").read_text())
        assert meta["status"] == rec.status  # not left at `running`
        kept = results.read_text()
        assert kept.endswith("\n") or not kept  # whole groups only: the refused group was cut
        before = [json.loads(x) for x in kept.splitlines()]
        assert 0 < len(before) < 40 and all(n == 2 for n in examples(before).values())

        filler.unlink()  # space again
        count0 = srv.count
        done = eval_alone(workdir, "--resume", rec.id)
        assert done.returncode == 0, done.stderr
        assert srv.count - count0 == 40 - len(before)
    rows = read_rows(Path(rec.output_dir))
    assert rows[: len(before)] == before and examples(rows) == {i: 2 for i in range(20)}
    assert get(workdir, rec.id).status == "completed"


def test_sigkilled_eval_is_not_running_and_resume_scores_every_rollout_once(workdir):
    with ModelServer(slow_compute(0.5)).run_in_thread() as srv:
        proc = subprocess.Popen(eval_cmd(workdir, "e2e-basic", "-n", "12", "-r", "2", "-c", "2", "-s", "-d",
                                         base_url=srv.base_url),
                                cwd=workdir, env=cli_env(workdir), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            run_dir = wait_rows(workdir / "outputs" / "evals" / "e2e-basic--test-model", 4)
            running = eval_alone(workdir, "--resume", run_dir.name)  # alive: never two writers of one run
            assert proc.poll() is None and running.returncode == 2, running.stderr
            assert f"run {run_dir.name} is still running" in running.stderr
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        rec = get(workdir, run_dir.name)  # the directory's name is the run id
        assert rec.status == "incomplete" and rec.vanished
        assert f"vf-sandbox eval --resume {rec.id}" in rec.error
        assert json.loads((run_dir / "metadata.json").read_text())["status"] == "incomplete"
        shown = vf(workdir, "runs", "show", rec.id).stdout
        assert "process vanished" in shown and f"--resume {rec.id}" in shown
        before = read_rows(run_dir)
        srv.policy = compute()
        count0 = srv.count
        res = eval_alone(workdir, "--resume", rec.id)
        assert res.returncode == 0, res.stderr
        assert srv.count - count0 == 24 - len(before)
    rows = read_rows(run_dir)
    assert rows[: len(before)] == before and examples(rows) == {i: 2 for i in range(12)}
    after = get(workdir, rec.id)
    assert (after.status, after.attempts, after.vanished) == ("completed", 2, False)


# ------------------------------------------------------------------ errors name the cause


def test_unknown_endpoint_alias_names_the_registry_and_the_closest_alias(workdir):
    eps = workdir / "endpoints.toml"
    eps.write_text('[[endpoint]]\nendpoint_id = "local"\nmodel = "m"\nurl = "http://127.0.0.1:9/v1"\nkey = "K"\n')
    cmd = [sys.executable, "-m", "vfcli.app", "eval", "e2e-basic", "-p", str(workdir / "environments"), "-d"]
    res = subprocess.run([*cmd, "-m", "lcoal", "-e", str(eps)], cwd=workdir, env=cli_env(workdir),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert f"no endpoint 'lcoal' in {eps} (looked in: {eps}); did you mean 'local'?" in res.stderr
    # outside any checkout, with no -e: every registry looked in is named; never the default hosted endpoint
    res = subprocess.run([*cmd, "-m", "my-alias"], cwd=workdir, env=cli_env(workdir), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "no endpoint 'my-alias' in configs/endpoints.toml" in res.stderr
    assert f"{workdir / 'configs' / 'endpoints.toml'} (absent)" in res.stderr
    assert "missing" not in res.stderr.lower() and not registry_rows(workdir)  # nothing ran, nothing recorded


def test_an_alias_resolves_outside_the_repo_root(tmp_path, monkeypatch):
    from runner.config import configs_from_cli

    monkeypatch.chdir(tmp_path)
    (cfg,) = configs_from_cli(["e2e-basic"], {"model": "local", "env_dir_path": str(tmp_path)})
    assert cfg.endpoint_id == "local" and cfg.client_config.api_base_url == "http://127.0.0.1:8765/v1"


def test_zero_examples_is_a_usage_error(workdir):
    res = run_cli(workdir, "e2e-basic", "-n", "0", "-d", base_url="http://127.0.0.1:9/v1")
    assert res.returncode == 2 and "num_examples (-n) must be a positive number" in res.stderr
    assert not registry_rows(workdir)


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the Docker engine")
def test_an_image_that_does_not_exist_is_a_usage_error(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        cmd = [sys.executable, "-m", "vfcli.app", "eval", "bash-files", "-p", str(ROOT / "environments"),
               "-e", str(workdir / "none.toml"), "-m", "m", "-b", srv.base_url, "-k", "VF_E2E_KEY",
               "-x", "docker_image=nosuch/image:1", "-n", "1", "-r", "1", "-d"]
        res = subprocess.run(cmd, cwd=workdir, env=cli_env(workdir), capture_output=True, text=True, timeout=180)
    assert res.returncode == 2, res.stderr
    assert "nosuch/image:1" in res.stderr and "Traceback" not in res.stderr
    rec = newest_run(workdir)
    assert rec.status == "failed" and rec.error_kind == "usage"
    shown = json.loads(vf(workdir, "runs", "show", rec.id, "--json").stdout)
    assert shown["diagnosis"]["category"] == "configuration"  # not "environment code error"


def test_vf_swe_debug_prints_its_run_id_and_resumes_by_it(tmp_path):
    rows = tmp_path / "swe.jsonl"  # no gold patch: refused as malformed before any sandbox starts
    rows.write_text(json.dumps({"instance_id": "a", "image_name": "vf-sandbox/python:3.11",
                                "FAIL_TO_PASS": ["t"]}) + "\n")
    env = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    swe = [sys.executable, "-m", "swe_debug.cli", str(rows), "-o", str(tmp_path / "out"), "-q", "--no-tests",
           "--debug-step", "none"]
    res = subprocess.run(swe, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    from runs.registry import list_runs

    (rec,) = list_runs(path=tmp_path / "runs.db")
    assert f"run {rec.id}: vf-sandbox runs show {rec.id}" in res.stdout + res.stderr
    assert Path(rec.output_dir).name == rec.id
    again = subprocess.run([*swe, "--resume", rec.id], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert f"run {rec.id}:" in again.stdout + again.stderr, again.stdout + again.stderr
    assert [r.id for r in list_runs(path=tmp_path / "runs.db")] == [rec.id]  # the same run, continued
    assert list_runs(path=tmp_path / "runs.db")[0].attempts == 2
