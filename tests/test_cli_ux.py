"""Issue 16, the CLI side, as a newcomer meets it: every check runs the real
`vf-sandbox` / `vf-swe-debug` as a subprocess (the model server runs in this
process on real sockets; env packages come from test_eval_cli's temp dir)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

from testmodel.model_server import ModelServer, compute, fail, stall
from test_eval_cli import ENV_SOURCES, cli_env, eval_cmd, read_rows, run_cli, run_dirs, workdir  # noqa: F401

_ = ENV_SOURCES


def vf(workdir: Path, *args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "vfcli.app", *args], cwd=cwd or workdir,
                          env=env or cli_env(workdir), capture_output=True, text=True, timeout=timeout)


def show_json(workdir: Path, run_id: str, env: dict | None = None) -> dict:
    res = vf(workdir, "runs", "show", run_id, "--json", env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def run_id_of(res: subprocess.CompletedProcess) -> str:
    line = next(x for x in res.stdout.splitlines() if x.startswith("run ") and "runs show" in x)
    return line.split()[1].rstrip(":")


# ------------------------------------------------------------ failures that explain themselves


def test_model_server_dies_mid_run_fails_with_classified_cause(workdir):
    """The server answers the endpoint check, then dies while the first request waits:
    every rollout fails with "connection refused" (not a timeout), each client retry is
    logged, the run ends failed with exit 3 (model errors) and a one-line cause, within seconds."""
    with ModelServer(stall(60)).run_in_thread() as srv:
        proc = subprocess.Popen(eval_cmd(workdir, "e2e-basic", "-n", "3", "-r", "1", "-c", "1", "-d", "-s",
                                         "--client-max-retries", "1", base_url=srv.base_url),
                                cwd=workdir, env=cli_env(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 60
        while srv.count < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert time.monotonic() - t0 < 30  # no minute of silent retries
    # the client's own retry count is shown, and each of its retries is a log line
    assert "client retries per request: 1" in err
    assert err.count("model API client retry") == 3  # one per request (1 retry each), printed once
    last = err.strip().splitlines()[-1]
    assert last.startswith("e2e-basic: failed: all 3 rollouts failed (model API errors)")
    assert "connection refused" in last and srv.base_url.rsplit("/v1", 1)[0] in last and "APITimeoutError" not in last
    rows = read_rows(run_dirs(workdir, "e2e-basic")[0])
    assert all(r["error_kind"] == "model" and "connection refused" in r["error"] for r in rows)
    info = show_json(workdir, run_id_of(type("R", (), {"stdout": out})))
    assert info["run"]["status"] == "failed" and info["diagnosis"]["category"] == "model API"
    assert "model server is up" in info["diagnosis"]["hint"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_rollout_retries_follow_the_run_policy_with_a_line_each(workdir, workers):
    """A 503 on every call, no SDK retries: each rollout is tried 1 + --max-retries times
    under the run's policy, one log line per retry (also from worker processes, -w 2),
    and the run fails on the 5xx cause."""
    with ModelServer(fail(503)).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "2", "-r", "1", "-d", "-s", "--max-retries", "2",
                      "--client-max-retries", "0", "-w", workers, base_url=srv.base_url)
        calls = srv.count
    assert res.returncode == 3 and calls == 6
    retry_lines = [x for x in res.stderr.splitlines() if "failed with retryable error" in x]
    assert len(retry_lines) == 4 and all("server error (5xx)" in x for x in retry_lines)
    assert res.stderr.count("model API client retry") == 0
    assert "all 2 rollouts failed (model API errors)" in res.stderr.strip().splitlines()[-1]
    assert all(r["attempts"] == 3 for r in read_rows(run_dirs(workdir, "e2e-basic")[0]))
    # the run log has them too (with -w 2 they happen in the worker processes)
    log = vf(workdir, "runs", "logs", run_id_of(res)).stdout
    assert sum("failed with retryable error" in x for x in log.splitlines()) == 4, log


def test_env_exception_keeps_its_traceback_in_run_log_and_row(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "3", "-r", "1", "-s", "-d", "-a", '{"fail_every": 3}',
                      base_url=srv.base_url)
    assert res.returncode == 3, res.stderr  # the env's own error: that rollout is not scored, run incomplete
    assert "Traceback" not in res.stderr  # the console keeps one line per failed rollout
    (row,) = [r for r in read_rows(run_dirs(workdir, "e2e-basic")[0]) if r["error"]]
    tb = row["error_info"]["traceback"]
    assert tb.startswith("Traceback") and "in setup_state" in tb and "ValueError: broken example 0" in tb
    logs = vf(workdir, "runs", "logs", run_id_of(res))
    assert "Traceback (most recent call last)" in logs.stdout and "in setup_state" in logs.stdout
    assert 'raise ValueError(f"broken example' in logs.stdout


def test_failed_load_gets_environment_code_category_and_traceback(workdir):
    pkg = workdir / "environments" / "e2e_broken"
    pkg.mkdir()
    (pkg / "e2e_broken.py").write_text("def load_environment():\n    return helper()\n\ndef helper():\n    raise KeyError('dataset_path')\n")
    (pkg / "pyproject.toml").write_text('[project]\nname = "e2e-broken"\nversion = "0.1.0"\n')
    res = run_cli(workdir, "e2e-broken", "-n", "1", "-d", base_url="http://127.0.0.1:9/v1")
    assert res.returncode == 3 and res.stderr.count("KeyError: 'dataset_path'") == 1
    info = show_json(workdir, run_id_of(res))
    assert info["diagnosis"]["category"] == "environment code error"
    text = vf(workdir, "runs", "show", run_id_of(res)).stdout
    assert "environment code error" in text and "vf-sandbox runs logs" in text
    log = vf(workdir, "runs", "logs", run_id_of(res)).stdout
    assert "Traceback" in log and "in helper" in log


@pytest.mark.parametrize("case", ["missing key", "key refused", "permission", "infra", "timeout"])
def test_failure_category_and_hint(workdir, case):
    """Each cause a newcomer meets gets its category and the next thing to try,
    in `runs show` (text and JSON); every run here really fails (or times out)."""
    policy = {"key refused": fail(401), "permission": fail(403), "timeout": stall(60)}.get(case, compute())
    with ModelServer(policy).run_in_thread() as srv:
        if case == "infra":  # the sandbox tool fails on every call and nothing retries it
            res = run_cli(workdir, "e2e-flaky", "-n", "2", "-r", "1", "-d", base_url=srv.base_url)
        elif case == "timeout":
            res = run_cli(workdir, "e2e-basic", "-n", "1", "-r", "1", "-d", "--timeout-minutes", "0.02",
                          base_url=srv.base_url)
        else:
            res = run_cli(workdir, "e2e-basic", "-n", "1", "-r", "1", "-d", base_url=srv.base_url,
                          key="VF_UX_UNSET_KEY" if case == "missing key" else "VF_E2E_KEY")
    # 2: a usage error (issue 18; a refused key too); 3: incomplete: sandbox errors or stopped (issue 26)
    assert res.returncode == (2 if case in ("missing key", "key refused", "permission") else 3), res.stderr
    category, hint_words, status = {
        "missing key": ("missing secret / API key", "export NAME", "failed"),
        "key refused": ("missing secret / API key", "-k", "failed"),
        "permission": ("missing permission", "permission", "failed"),
        "infra": ("sandbox infrastructure", "--max-retries", "failed"),
        "timeout": ("timeout", "--timeout-minutes", "stopped"),
    }[case]
    rid = run_id_of(res)
    info = show_json(workdir, rid)
    assert info["run"]["status"] == status, info["run"]
    assert info["diagnosis"]["category"] == category, (info["run"]["error"], info["diagnosis"])
    assert hint_words in info["diagnosis"]["hint"]
    text = vf(workdir, "runs", "show", rid).stdout
    assert category in text and info["diagnosis"]["hint"][:40] in " ".join(text.split())


def test_n_larger_than_dataset_is_said_and_reported(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "50", "-r", "1", "-s", "-d", "-a", '{"n": 4}', base_url=srv.base_url)
    assert res.returncode == 0, res.stderr
    assert "-n 50 asked for more examples than the dataset has: running all 4 example(s)" in res.stderr
    meta = json.loads((run_dirs(workdir, "e2e-basic")[0] / "metadata.json").read_text())
    assert meta["num_examples"] == 4 and meta["num_examples_requested"] == 50
    assert "4 x 1 (asked -n 50; the dataset has 4)" in res.stdout


def test_misspelled_env_suggests_the_closest_once(workdir):
    res = run_cli(workdir, "e2e-basci", "-n", "1", base_url="http://127.0.0.1:9/v1")
    assert res.returncode == 2  # a usage error
    both = res.stdout + res.stderr
    assert both.count("unknown environment 'e2e-basci'") == 1
    assert "Did you mean 'e2e-basic'?" in both
    listed = both.split("Available: ", 1)[1].split(". Install", 1)[0].split(", ")
    assert "e2e-basic" in listed and "envs" not in listed  # only real environments
    rid = run_id_of(res)
    assert show_json(workdir, rid)["diagnosis"]["category"] == "configuration"


def test_default_model_without_key_or_network_names_variable_and_url(workdir, tmp_path):
    env = cli_env(workdir)
    env.pop("PRIME_API_KEY", None)
    env["HOME"] = str(tmp_path / "home")  # no ~/.prime/config.json
    res = subprocess.run([sys.executable, "-m", "vfcli.app", "eval", "e2e-basic", "-n", "1", "-d",
                          "-p", str(workdir / "environments"), "-e", str(workdir / "no-endpoints.toml")],
                         cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2  # a usage error: the key variable is missing
    assert "PRIME_API_KEY" in res.stderr and "https://api.pinference.ai/api/v1" in res.stderr, res.stderr


def test_dashboard_busy_port_one_line_exit_2(workdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = vf(workdir, "dashboard", "--port", str(port), "--no-launch")
    assert res.returncode == 2
    assert res.stdout == "" and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and f"127.0.0.1:{port}" in res.stderr


def test_runs_stop_finished_and_list_unknown_status(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "1", "-r", "1", "-d", base_url=srv.base_url)
    rid = run_id_of(res)
    stop = vf(workdir, "runs", "stop", rid)
    assert stop.returncode == 0 and f"run {rid} already finished: completed" in stop.stdout
    bad = vf(workdir, "runs", "list", "-s", "bogus")
    assert bad.returncode == 2 and "unknown value 'bogus'" in bad.stderr and "completed" in bad.stderr
    assert vf(workdir, "runs", "list", "-s", "completed").returncode == 0


def test_h_is_help_and_every_option_has_help(workdir):
    for args in ([], ["eval"], ["runs", "list"], ["dashboard"]):
        h, long = vf(workdir, *args, "-h"), vf(workdir, *args, "--help")
        assert h.returncode == 0 and h.stdout == long.stdout and "Usage" in h.stdout
    swe_h = subprocess.run([sys.executable, "-m", "swe_debug.cli", "-h"], capture_output=True, text=True, cwd=workdir)
    assert swe_h.returncode == 0 and "--eval-name" in swe_h.stdout

    from vfcli.app import app
    from swe_debug.cli import app as swe_app

    def missing(cmd, path=()):
        out = [(path, p.opts) for p in cmd.params
               if getattr(p, "param_type_name", "") == "option" and p.name != "help" and not (p.help or "").strip()]
        for name, sub in getattr(cmd, "commands", {}).items():
            out += missing(sub, (*path, name))
        return out

    for a in (app, swe_app):
        assert missing(typer.main.get_command(a)) == []


# ----------------------------------------------------------------------- runs you can find


def test_registry_per_user_found_from_any_cwd_with_outputs_state(workdir, tmp_path):
    env = cli_env(workdir)
    env.pop("VF_RUNS_DB")
    env["VF_STATE_DIR"] = str(tmp_path / "state")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with ModelServer(compute()).run_in_thread() as srv:
        saved = subprocess.run(eval_cmd(workdir, "e2e-basic", "-n", "2", "-r", "1", "-d", "-s", "-o",
                                        str(tmp_path / "out"), base_url=srv.base_url),
                               cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        unsaved = subprocess.run(eval_cmd(workdir, "e2e-basic", "-n", "1", "-r", "1", "-d", base_url=srv.base_url),
                                 cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert saved.returncode == 0 and unsaved.returncode == 0, saved.stderr + unsaved.stderr
    assert (tmp_path / "state" / "runs.db").exists() and not (workdir / "outputs" / "runs.db").exists()
    assert "results not saved (add -s to save them)" in unsaved.stdout
    s_id, u_id = run_id_of(saved), run_id_of(unsaved)
    # from another directory, with no flag: both runs are there
    listed = json.loads(vf(workdir, "runs", "list", "--json", env=env, cwd=elsewhere).stdout)
    states = {r["id"]: r["outputs"] for r in listed}
    assert states == {s_id: "saved", u_id: "not saved"}
    show_u = vf(workdir, "runs", "show", u_id, env=env, cwd=elsewhere).stdout
    assert "completed, results not saved" in show_u and "no results yet" not in show_u
    # outputs deleted: shown as such
    shutil.rmtree(tmp_path / "out")
    table = vf(workdir, "runs", "list", env=env, cwd=elsewhere).stdout
    assert "completed (outputs deleted)" in table and "completed (results not saved)" in table
    assert "outputs deleted" in vf(workdir, "runs", "show", s_id, env=env, cwd=elsewhere).stdout
    # the state dir follows XDG_STATE_HOME without VF_STATE_DIR; --db names another file
    env2 = {k: v for k, v in env.items() if k != "VF_STATE_DIR"}
    env2["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    r = subprocess.run([sys.executable, "-c", "from runs.registry import db_path; print(db_path())"],
                       env=env2, capture_output=True, text=True)
    assert r.stdout.strip() == str(tmp_path / "xdg" / "vf-sandbox" / "runs.db")
    other = json.loads(vf(workdir, "runs", "list", "--json", "--db", str(tmp_path / "none.db"), env=env).stdout)
    assert other == []


def test_swe_runs_get_a_name():
    from swe_debug.cli import Step, eval_config, run_name

    assert run_name("data/tasks.jsonl", "gold_patch") == "tasks gold_patch"
    assert run_name("princeton-nlp/SWE-bench_Lite", "none") == "SWE-bench_Lite none"
    a = {"dataset": "x/tasks.jsonl", "split": "test", "instance_ids": None, "debug_step": Step.gold_patch,
         "debug_command": None, "debug_script_path": None, "debug_timeout": None, "test_timeout": 900,
         "timeout_seconds": 1800, "check_fails_before": False, "repeat": 1, "no_setup": False, "no_tests": False,
         "output_tail_chars": 2000, "cpu_cores": None, "memory_gb": None, "concurrency": 1, "max_retries": 0,
         "output_dir": None, "resume": False, "name": None, "junit_xml": None, "backend": "docker",
         "timeout_minutes": 10, "namespace": None, "push_to": None, "keep_images": None, "isolation": None}
    assert eval_config(a).name == "tasks gold_patch"
    assert eval_config({**a, "name": "mine"}).name == "mine"
