"""Honest results (issue 26): every fault gives each rollout a verdict kind, the run a
true status and exit code, the dashboard the same counts, and `--resume` (once the
fault is gone) finishes with every rollout scored once.

Each test runs `vf-sandbox eval` as a subprocess against a real model server (its own
process where the test kills it) and, for sandbox faults, the real Docker engine
(gVisor where the engine has runsc). Helpers and the leak check come from
tests/test_faults.py (`case`, `eval_cmd`, `cli_env`, `saved_rows`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import types
from collections import Counter
from pathlib import Path

import pytest

from test_faults import ENVS, case, cli_env, eval_cmd, killing_policy, saved_rows  # noqa: F401  (case: fixture)

pytestmark = [pytest.mark.faults]

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER = """
import asyncio, sys
from testmodel.model_server import ModelServer, compute
async def slow(req):
    await asyncio.sleep({delay})
    return compute()(req)
async def main():
    srv = ModelServer(slow, port={port})
    await srv.start()
    print("up", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

GARBAGE = """
from aiohttp import web
async def chat(request):
    return web.Response(text="<html>502 upstream garbage{{", content_type="application/json")
async def models(request):
    return web.json_response({{"data": []}})
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/v1/models", models)
web.run_app(app, host="127.0.0.1", port={port}, print=lambda *a: print("up", flush=True))
"""


class ServerProcess:
    """A model server in its own process (killable with SIGKILL)."""

    def __init__(self, code: str, port: int | None = None):
        self.port = port or free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", code.format(port=self.port, delay=0.05)], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "up"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def run_id_of(out: str) -> str:
    line = next(x for x in out.splitlines() if x.startswith("run ") and "runs show" in x)
    return line.split()[1].rstrip(":")


def dashboard_view(tmp_path: Path, run_id: str) -> dict:
    """What the dashboard API serves for the run (GET /api/runs/{id})."""
    from aiohttp.test_utils import TestClient, TestServer

    from dashboard import server as dashboard

    async def go() -> dict:
        app = dashboard.make_app(endpoints_path=str(tmp_path / "none.toml"), allow_launch=False)
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            resp = await c.get(f"/api/runs/{run_id}")
            assert resp.status == 200, await resp.text()
            return await resp.json()

    old = os.environ.get("VF_RUNS_DB")
    os.environ["VF_RUNS_DB"] = str(tmp_path / "runs.db")
    try:
        return asyncio.run(go())
    finally:
        if old is None:
            os.environ.pop("VF_RUNS_DB", None)
        else:
            os.environ["VF_RUNS_DB"] = old


def registry_record(tmp_path: Path, run_id: str):
    """The run's row in the test's run registry (VF_RUNS_DB of cli_env)."""
    from runs import registry

    return registry.get_run(run_id, path=tmp_path / "runs.db")


def dashboard_list(tmp_path: Path) -> list[dict]:
    """The dashboard API's runs list (GET /api/runs), whose rows the runs table shows."""
    from aiohttp.test_utils import TestClient, TestServer

    from dashboard import server as dashboard

    async def go() -> list[dict]:
        app = dashboard.make_app(endpoints_path=str(tmp_path / "none.toml"), allow_launch=False)
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            resp = await c.get("/api/runs")
            assert resp.status == 200, await resp.text()
            body = await resp.json()
            return body["runs"] if isinstance(body, dict) else body

    old = os.environ.get("VF_RUNS_DB")
    os.environ["VF_RUNS_DB"] = str(tmp_path / "runs.db")
    try:
        return asyncio.run(go())
    finally:
        if old is None:
            os.environ.pop("VF_RUNS_DB", None)
        else:
            os.environ["VF_RUNS_DB"] = old


def run(cmd: list[str], tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=timeout)


def check_incomplete(tmp_path: Path, res: subprocess.CompletedProcess, kinds: dict[str, int], status: str = "incomplete"):
    """Exit 3, status, verdict counts in rows, metadata and the dashboard, the resume command printed."""
    assert res.returncode == 3, res.stderr[-3000:]
    rows, meta, run_dir = saved_rows(tmp_path)
    counts = Counter(r["verdict"] for r in rows)
    errored = sum(kinds.values())
    assert {k: v for k, v in counts.items() if k != "scored"} == kinds, counts
    assert meta["status"] == status and meta["errored_rollouts"] == errored
    assert meta["errors_by_kind"] == kinds and meta["scored_rollouts"] == counts["scored"]
    scored = [r for r in rows if r["verdict"] == "scored"]
    if scored:  # the average is over scored rows only
        assert meta["avg_reward"] == pytest.approx(sum(r["reward"] for r in scored) / len(scored))
    rid = run_id_of(res.stdout)
    assert f"vf-sandbox eval --resume {rid}" in res.stderr
    view = dashboard_view(tmp_path, rid)
    assert view["run"]["status"] == status, view["run"]
    assert view["run"]["verdicts"]["scored"] == counts["scored"] and view["run"]["verdicts"]["errored"] == errored
    assert view["run"]["verdicts"]["by_kind"] == kinds
    assert view["summary"]["scored_rollouts"] == counts["scored"] and view["summary"]["errored_rollouts"] == errored
    if scored:  # the run page's reward figures are over the scored rows too
        assert view["summary"]["reward"]["mean"] == pytest.approx(meta["avg_reward"])
    rec = registry_record(tmp_path, rid)  # the registry counts the same (errors: errored rollouts only)
    assert (rec.scored_rollouts, rec.errored_rollouts, rec.errors, rec.errors_by_kind) == (
        counts["scored"], errored, errored, kinds)
    return rows, meta, run_dir, rid


def check_resumed(tmp_path: Path, res: subprocess.CompletedProcess, n: int, r: int, rid: str) -> list[dict]:
    """The resumed run: exit 0, completed, every rollout scored exactly once."""
    assert res.returncode == 0, res.stderr[-3000:]
    rows, meta, _ = saved_rows(tmp_path)
    assert Counter(x["example_id"] for x in rows) == {i: r for i in range(n)}  # none lost, none twice
    assert all(x["verdict"] == "scored" for x in rows)
    assert meta["status"] == "completed" and meta["scored_rollouts"] == n * r and meta["errored_rollouts"] == 0
    view = dashboard_view(tmp_path, rid)
    assert view["run"]["status"] == "completed" and view["run"]["verdicts"]["errored"] == 0
    rec = registry_record(tmp_path, rid)
    assert (rec.scored_rollouts, rec.errored_rollouts, rec.errors_by_kind) == (n * r, 0, {})
    return rows


# --------------------------------------------------------------------------- model faults


def test_model_server_killed_mid_run_some_rows_then_resume(tmp_path, record_property):
    """The model server process is SIGKILLed after some rows: the rest are `model` errors
    (connection refused), the run is `incomplete` (exit 3), the average is over the scored
    rows only; the endpoint-down rule stops the run early; `--resume` after a restart
    finishes with every rollout scored once."""
    srv = ServerProcess(SERVER)
    cmd = eval_cmd(tmp_path, srv.base_url, "math-single", "-n", "30", "-r", "2", "-c", "2", "-s",
                   "--client-max-retries", "0")
    try:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            saved = list((tmp_path / "outputs").glob("evals/*/*/results.jsonl"))
            if saved and len(saved[0].read_text().splitlines()) >= 6:
                break
            time.sleep(0.05)
        srv.kill()
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=120)
    finally:
        srv.kill()
    res = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    rows, meta, run_dir, rid = check_incomplete(tmp_path, res, {"model": Counter(r["verdict"] for r in saved_rows(
        tmp_path)[0])["model"]})
    model_rows = [r for r in rows if r["verdict"] == "model"]
    assert model_rows and all("model endpoint unreachable" in r["error"] for r in model_rows)
    assert any("connection refused" in r["error"] for r in model_rows)
    assert len(rows) < 60  # the endpoint-down rule stopped it: it did not burn through the dataset
    assert "is down since" in err and time.monotonic() - t0 < 60
    record_property("figure", f"{len(rows) - len(model_rows)} scored, {len(model_rows)} model errors, "
                              f"{60 - len(rows)} not run")
    with ServerProcess(SERVER) as again:
        res2 = run(eval_cmd(tmp_path, again.base_url, "math-single", "-n", "30", "-r", "2", "-c", "2", "-s",
                            "--resume", str(run_dir)), tmp_path)
    check_resumed(tmp_path, res2, 30, 2, rid)


def test_model_server_killed_before_any_row_all_rows_fail(tmp_path):
    """The server dies right after the endpoint check: no rollout is scored: the run
    `failed` (nothing evaluated) with exit 3, stopped early, and `--resume` completes it."""
    srv = ServerProcess(SERVER.replace("await asyncio.sleep({delay})", "await asyncio.sleep(30)"))
    cmd = eval_cmd(tmp_path, srv.base_url, "math-single", "-n", "20", "-r", "1", "-c", "2", "-s",
                   "--client-max-retries", "0")
    try:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "outputs").glob("evals/*/*/metadata.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the first requests are in flight
        srv.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        srv.kill()
    res = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert res.returncode == 3, err[-3000:]
    rows, meta, run_dir = saved_rows(tmp_path)
    assert rows and all(r["verdict"] == "model" for r in rows) and len(rows) < 20
    assert meta["status"] == "incomplete" and meta["scored_rollouts"] == 0 and "is down since" in err
    rid = run_id_of(out)
    assert dashboard_view(tmp_path, rid)["run"]["status"] == "incomplete"
    with ServerProcess(SERVER) as again:
        res2 = run(eval_cmd(tmp_path, again.base_url, "math-single", "-n", "20", "-r", "1", "-c", "2", "-s",
                            "--resume", str(run_dir)), tmp_path)
    check_resumed(tmp_path, res2, 20, 1, rid)


@pytest.mark.parametrize("fault", ["500", "garbage", "hang"])
def test_model_faults_are_model_errors_then_resume(tmp_path, fault):
    """Answering 500s, answering garbage, hanging past --rollout-timeout: each rollout is a
    `model` error (with the HTTP status where there is one), nothing is averaged, exit 3;
    `--resume` against a healthy server scores every rollout once."""
    from testmodel.model_server import ModelServer, fail, stall

    base = ["math-single", "-n", "3", "-r", "2", "-c", "6", "-s", "--client-max-retries", "0"]
    t0 = time.monotonic()
    if fault == "garbage":
        with ServerProcess(GARBAGE) as srv:
            res = run(eval_cmd(tmp_path, srv.base_url, *base), tmp_path)
    else:
        policy = fail(500) if fault == "500" else stall(120)
        extra = ["--rollout-timeout", "2"] if fault == "hang" else []
        with ModelServer(policy).run_in_thread() as srv:
            res = run(eval_cmd(tmp_path, srv.base_url, *base, *extra), tmp_path)
    elapsed = time.monotonic() - t0
    rows, meta, run_dir, rid = check_incomplete(tmp_path, res, {"model": 6}, status="failed")
    if fault == "500":
        assert all(r["error_info"]["status"] == 500 and "answered 500" in r["error"] for r in rows)
    if fault == "hang":
        assert all("timed out after 2s" in r["error"] for r in rows) and elapsed < 60  # not 3600 s x 3
    assert "all 6 rollouts failed (model API errors)" in res.stderr
    from testmodel.model_server import compute

    with ModelServer(compute()).run_in_thread() as good:
        res2 = run(eval_cmd(tmp_path, good.base_url, *base, "--resume", str(run_dir)), tmp_path)
    check_resumed(tmp_path, res2, 3, 2, rid)


# --------------------------------------------------------------------------- env faults

REWARD_ENV = '''
import os
import envs as vf

def load_environment(marker: str = ""):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct(completion, answer, parser, example_id) -> float:
        if example_id % 2 and not os.path.exists(marker):
            return {}["missing"]  # a bug in the reward function: KeyError
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[correct], parser=parser), parser=parser)
'''


def with_envs_dir(cmd: list[str], where: Path) -> list[str]:
    i = cmd.index("-p")
    return cmd[: i + 1] + [str(where)] + cmd[i + 2:]


def test_reward_function_raising_is_an_env_error_then_resume(tmp_path):
    """A reward function raising KeyError on half the rows: those are `env` errors with
    the traceback in the row and the run log, never a silent 0; average over the scored
    half, exit 3; fixed, `--resume` scores them."""
    from testmodel.model_server import ModelServer, compute

    pkg = tmp_path / "envs_here" / "honest_reward"
    pkg.mkdir(parents=True)
    (pkg / "honest_reward.py").write_text(REWARD_ENV)
    (pkg / "pyproject.toml").write_text('[project]\nname = "honest-reward"\nversion = "0.1.0"\n')
    marker = tmp_path / "fixed"
    args = ["honest-reward", "-n", "6", "-r", "1", "-s", "-a", json.dumps({"marker": str(marker)})]
    with ModelServer(compute()).run_in_thread() as srv:
        res = run(with_envs_dir(eval_cmd(tmp_path, srv.base_url, *args), tmp_path / "envs_here"), tmp_path)
        rows, meta, run_dir, rid = check_incomplete(tmp_path, res, {"env": 3})
        bad = [r for r in rows if r["verdict"] == "env"]
        assert sorted(r["example_id"] for r in bad) == [1, 3, 5]
        assert all(r["error_type"] == "ScoringError" and "KeyError" in r["error_info"]["traceback"] for r in bad)
        assert meta["avg_reward"] == 1.0  # the 3 scored rows; the raising ones are not a 0
        log = subprocess.run([sys.executable, "-m", "vfcli.app", "runs", "logs", rid], cwd=tmp_path,
                             env=cli_env(tmp_path), capture_output=True, text=True, timeout=60).stdout
        assert "Traceback" in log and "KeyError: 'missing'" in log
        runs_cli = [sys.executable, "-m", "vfcli.app", "runs"]
        listed = subprocess.run([*runs_cli, "list"], cwd=tmp_path, env={**cli_env(tmp_path), "COLUMNS": "250"},
                                capture_output=True, text=True, timeout=60).stdout
        assert "SCORED" in listed and "ERRORED" in listed and "3 (env 3)" in listed, listed
        shown = subprocess.run([*runs_cli, "show", rid], cwd=tmp_path, env={**cli_env(tmp_path), "COLUMNS": "250"},
                               capture_output=True, text=True, timeout=60).stdout
        assert "3 scored, 3 (env 3) errored" in shown, shown
        (item,) = [x for x in dashboard_list(tmp_path) if x["id"] == rid]  # the dashboard's runs list
        assert (item["scored_rollouts"], item["errored_rollouts"], item["errors_by_kind"]) == (3, 3, {"env": 3})
        marker.write_text("fixed")
        res2 = run(with_envs_dir(eval_cmd(tmp_path, srv.base_url, *args, "--resume", str(run_dir)),
                                 tmp_path / "envs_here"), tmp_path)
    check_resumed(tmp_path, res2, 6, 1, rid)


def test_max_error_rate_accepts_errors_explicitly(tmp_path):
    """--max-error-rate 0.5 accepts the 3 of 6 env errors: completed, exit 0, counts still shown."""
    from testmodel.model_server import ModelServer, compute

    pkg = tmp_path / "envs_here" / "honest_reward"
    pkg.mkdir(parents=True)
    (pkg / "honest_reward.py").write_text(REWARD_ENV)
    (pkg / "pyproject.toml").write_text('[project]\nname = "honest-reward"\nversion = "0.1.0"\n')
    with ModelServer(compute()).run_in_thread() as srv:
        res = run(with_envs_dir(eval_cmd(tmp_path, srv.base_url, "honest-reward", "-n", "6", "-r", "1", "-s",
                                         "--max-error-rate", "0.5"), tmp_path / "envs_here"), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    rows, meta, _ = saved_rows(tmp_path)
    assert meta["status"] == "completed" and meta["errored_rollouts"] == 3 and meta["scored_rollouts"] == 3
    assert "6: 3 scored, 3 errored" in res.stdout and "accepted by --max-error-rate" in res.stderr


# --------------------------------------------------------------------------- sandbox faults

BOMB_MEM = "python3 -c 'x = bytearray(3 << 30)'; echo status=$?"
FORK_BOMB = "bomb() { bomb | bomb & }; bomb"


def bomb_policy(first: str, seen: list[str]):
    """bash-files solver that runs `first` as its first command, then checks the shell
    still works, then gives a (wrong) answer."""
    from testmodel.model_server import Reply, ToolCallSpec

    def policy(req):
        turn = req.n_tool_turns()
        if turn == 0:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": first})])
        seen.append(req.tool_results()[-1])
        if turn == 1:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo still-here"})])
        return Reply(content="\\boxed{-1}")

    return policy


def gvisor_available() -> bool:
    out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True,
                         timeout=60)
    return "runsc" in out.stdout


@pytest.mark.docker
@pytest.mark.serial  # the engine's oom event and the sandbox's death race more under a loaded machine
@pytest.mark.parametrize("isolation", ["runc", "gvisor"])
def test_memory_bomb_is_a_scored_task_failure(tmp_path, case, isolation):
    """A model's memory bomb: under runc the command is OOM-killed, under gVisor the whole
    sandbox dies; either way the rollout is scored (reward 0, `sandbox_oom` 1, attempts 1:
    never retried, never an infra error), the run `completed`, exit 0."""
    if isolation == "gvisor" and not gvisor_available():
        pytest.skip("the engine has no runsc runtime")
    case.row(f"memory bomb under {isolation}", "scored: reward 0, sandbox_oom=1, not retried; run completed, exit 0")
    from testmodel.model_server import ModelServer

    seen: list[str] = []
    with ModelServer(bomb_policy(BOMB_MEM, seen)).run_in_thread() as srv:
        res = run(eval_cmd(tmp_path, srv.base_url, "bash-files", "-n", "1", "-r", "1", "-s", "--max-retries", "2",
                           "-a", json.dumps({"labels": case.labels, "pool_size": 0, "rollout_isolation": "container"}),
                           "-x", f"isolation={isolation},memory_gb=1"), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,), meta, _ = saved_rows(tmp_path)
    assert row["verdict"] == "scored" and not row["error"] and row["attempts"] == 1, row
    assert row["metrics"]["sandbox_oom"] == 1.0 and row["reward"] == 0.0
    assert meta["status"] == "completed" and meta["scored_rollouts"] == 1 and meta["errored_rollouts"] == 0
    if isolation == "gvisor":  # the sandbox is gone: the rollout ended there, the model was told
        assert row["stop_condition"] == "sandbox_killed_by_oom" and "ran out of memory" in seen[0]
    else:
        assert "status=137" in seen[0] and seen[1].strip() == "still-here"
    case.figure(f"{isolation}: reward 0, sandbox_oom 1, attempts 1, stop {row['stop_condition']}")


@pytest.mark.docker
# Once racy (both fixed, 2026-11-28): alone on the machine the bomb filled the pids limit before the agent started
# the next request's thread (an infra error: tests/test_agent_at_pids_limit.py); at load ~100 its count could stand
# still below 90 % of the limit as the command returned (the flood check now also reads pids.events).
def test_fork_bomb_is_not_exit_0(tmp_path, case):
    """A bash fork bomb returns at once while its children hold the pids limit: the tool
    result says so (exit 137, processes killed), `sandbox_pids_limit` 1, the next command
    works, the rollout is scored and the run completed."""
    case.row("bash fork bomb (returns at once, children hold the pids limit)",
             "tool result exit 137 + note, processes killed, next command works; scored, completed")
    from testmodel.model_server import ModelServer

    seen: list[str] = []
    with ModelServer(bomb_policy(FORK_BOMB, seen)).run_in_thread() as srv:
        res = run(eval_cmd(tmp_path, srv.base_url, "bash-files", "-n", "1", "-r", "1", "-s",
                           "-a", json.dumps({"labels": case.labels, "pool_size": 0, "rollout_isolation": "container"})),
                  tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,), meta, _ = saved_rows(tmp_path)
    assert "process limit" in seen[0] and "exit 137" in seen[0], seen
    assert seen[1].strip() == "still-here", seen
    assert row["verdict"] == "scored" and row["metrics"]["sandbox_pids_limit"] == 1.0 and row["attempts"] == 1
    assert meta["status"] == "completed"
    case.figure(f"first tool result: {seen[0][:80]!r}")


@pytest.mark.docker
def test_sandbox_killed_mid_rollout_is_a_sandbox_error_then_resume(tmp_path, case):
    """`docker kill` of a rollout's sandbox with no retries: a `sandbox` error, out of the
    average, incomplete (exit 3), on the dashboard; `--resume` scores it."""
    case.row("sandbox killed mid-rollout, no retries", "verdict sandbox; incomplete, exit 3; --resume scores it")
    from testmodel.model_server import ModelServer

    kills: list[str] = []
    with ModelServer(killing_policy(False, kills)).run_in_thread() as srv:
        cmd = eval_cmd(tmp_path, srv.base_url, "bash-files", "-n", "2", "-r", "1", "-c", "1", "-s", "--max-retries",
                       "0", "-a", json.dumps({"labels": case.labels, "pool_size": 0, "rollout_isolation": "container"}))
        res = run(cmd, tmp_path)
        rows, meta, run_dir, rid = check_incomplete(tmp_path, res, {"sandbox": 1})
        assert meta["avg_reward"] == 1.0
        res2 = run(cmd + ["--resume", str(run_dir)], tmp_path)
    check_resumed(tmp_path, res2, 2, 1, rid)


# --------------------------------------------------------------------------- exit codes


def test_eval_and_swe_debug_agree_on_exit_codes(tmp_path):
    """One table for both CLIs: documented in both --help texts, and the same statuses map to
    the same codes (swe-debug adds 1 for an invalid instance)."""
    from runner import exit_codes

    for argv in (["-m", "vfcli.app", "eval", "--help"], ["-m", "swe_debug.cli", "--help"]):
        out = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "COLUMNS": "300"})
        text = " ".join(out.stdout.split())
        for needle in ("Exit codes", "0 every", "2 usage error", "3 incomplete", "130 / 143 interrupted"):
            assert needle in text, (argv, needle)
    for status, usage in [("completed", False), ("incomplete", False), ("failed", False), ("stopped", False),
                          ("failed", True)]:
        assert exit_codes.for_swe(status, usage, True) == exit_codes.for_statuses([(status, usage)])
    assert exit_codes.for_swe("completed", False, False) == 1
    assert exit_codes.for_signal([2]) == 130 and exit_codes.for_signal([15]) == 143


@pytest.mark.docker
def test_docker_down_exits_3_for_both_clis(tmp_path):
    """The sandbox backend unreachable is a sandbox (infrastructure) error: exit 3 from both."""
    from testmodel.model_server import ModelServer, compute

    env = {**cli_env(tmp_path), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    with ModelServer(compute()).run_in_thread() as srv:
        res = subprocess.run(eval_cmd(tmp_path, srv.base_url, "bash-files", "-n", "1", "-r", "1"), cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]
    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"instance_id": "x__y-1", "repo": "x/y", "base_commit": "0" * 40, "patch": "",
                              "test_patch": "", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]",
                              "image": "vf-sandbox/python:3.11"}) + "\n")
    swe = subprocess.run([sys.executable, "-m", "swe_debug.cli", str(ds), "-o", str(tmp_path / "swe"), "-q",
                          "--debug-step", "none"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert swe.returncode == res.returncode == 3, swe.stdout[-2000:] + swe.stderr[-2000:]


# --------------------------------------------------------------------------- retry rules


def test_retry_rules_by_http_status_with_backoff_and_cap(tmp_path):
    """[[retry_rules]] in the run definition: 503s are retried (backoff, up to 3 times,
    attempts in the row), a 429 is not (no rule for it): a `model` error with its status."""
    from testmodel.model_server import ModelServer, compute, fail, fail_first

    toml = tmp_path / "run.toml"

    def write(url: str) -> None:
        toml.write_text(textwrap.dedent(f'''
            model = "test-model"
            api_base_url = "{url}"
            api_key_var = "VF_FAULTS_TEST_KEY"
            endpoints_path = "{tmp_path / 'none.toml'}"
            env_dir_path = "{ENVS}"
            client_max_retries = 0
            retry_initial_delay = 0.05
            retry_max_delay = 0.2
            max_concurrent = 1

            [[retry_rules]]
            statuses = ["5xx"]
            max_retries = 3

            [[eval]]
            env_id = "math-single"
            num_examples = 2
            rollouts_per_example = 1
        '''))
    (tmp_path / "none.toml").write_text("")
    cmd = [sys.executable, "-m", "vfcli.app", "eval", str(toml), "-o", str(tmp_path / "outputs"), "-d"]
    with ModelServer(fail_first(3, 503, then=compute())).run_in_thread() as srv:
        write(srv.base_url)
        res = run(cmd, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    rows, meta, _ = saved_rows(tmp_path)
    assert sorted(r["attempts"] for r in rows) == [1, 4], rows  # 3 retries of the first, backoff 0.05 s doubling
    assert all(r["verdict"] == "scored" for r in rows) and meta["status"] == "completed"
    assert meta["eval_config"]["retry_rules"][0]["statuses"] == ["5xx"]
    for p in (tmp_path / "outputs").glob("evals/*/*"):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    with ModelServer(fail(429)).run_in_thread() as srv:
        write(srv.base_url)
        res = run(cmd, tmp_path)
        calls = srv.count
    assert res.returncode == 3, res.stderr[-3000:]
    rows, meta, _ = saved_rows(tmp_path)
    assert calls == 2 and all(r["attempts"] == 1 and r["error_info"]["status"] == 429 for r in rows)


# --------------------------------------------------------------------------- late signals

LATE_SIGNAL = """
import asyncio, os, signal, sys
import runner.runner as runner
real = runner.run_evals
async def run_evals(*a, **k):
    out = await real(*a, **k)  # the run is over, its teardown done, the runner's handlers removed
    os.kill(os.getpid(), signal.{sig})
    await asyncio.sleep(10)
    return out
runner.run_evals = run_evals
sys.argv = ["prog"] + sys.argv[1:]
from {module} import main
main()
"""


@pytest.mark.parametrize("cli,sig", [("eval", "SIGINT"), ("eval", "SIGTERM"), ("swe", "SIGINT"), ("swe", "SIGTERM")])
def test_signal_after_teardown_exits_130_or_143(tmp_path, cli, sig):
    """A Ctrl-C (or SIGTERM) that arrives after the runner removed its handlers (the run's
    teardown done) exits 130 (143), not -2 (-15) or a KeyboardInterrupt traceback; the same
    for vf-sandbox eval and vf-swe-debug."""
    from testmodel.model_server import ModelServer, compute

    want = 130 if sig == "SIGINT" else 143
    if cli == "eval":
        code = LATE_SIGNAL.format(sig=sig, module="vfcli.app")
        with ModelServer(compute()).run_in_thread() as srv:
            cmd = eval_cmd(tmp_path, srv.base_url, "math-single", "-n", "1", "-r", "1", "-s")
            res = run([sys.executable, "-c", code, *cmd[3:]], tmp_path, timeout=120)
        assert saved_rows(tmp_path)[1]["status"] == "completed"  # recorded before the signal
    else:  # Docker unreachable: the run ends at once (exit 3 without the signal)
        ds = tmp_path / "ds.jsonl"
        ds.write_text(json.dumps({"instance_id": "x__y-1", "repo": "x/y", "base_commit": "0" * 40, "patch": "",
                                  "test_patch": "", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]",
                                  "image": "vf-sandbox/python:3.11"}) + "\n")
        code = LATE_SIGNAL.format(sig=sig, module="swe_debug.cli")
        env = {**cli_env(tmp_path), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
        res = subprocess.run([sys.executable, "-c", code, str(ds), "-o", str(tmp_path / "swe"), "-q",
                              "--debug-step", "none"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert res.returncode == want, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]


# --------------------------------------------------------------------------- endpoint down: in-flight rollouts finish

SLOW_TOOL_SERVER = """
import asyncio, sys
from testmodel.model_server import ModelServer, Reply, ToolCallSpec
COUNT = {count!r}
def policy(req):
    turn = req.n_tool_turns()
    slow = req.headers.get("X-Session-ID") in ("0", "1")
    print(f"req {{req.headers.get('X-Session-ID')}} {{turn}}", flush=True)
    if turn == 0:
        return Reply(tool_calls=[ToolCallSpec("bash", {{"command": "sleep 25; echo slept" if slow else "sleep 3"}})])
    if turn == 1:
        return Reply(tool_calls=[ToolCallSpec("bash", {{"command": COUNT}})])
    return Reply(content="\\\\boxed{{" + req.tool_results()[-1].strip() + "}}")
async def main():
    srv = ModelServer(policy, port={port})
    await srv.start()
    print("up", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@pytest.mark.docker
@pytest.mark.parametrize("workers", [1, 2])
def test_endpoint_down_in_flight_rollouts_finish_nothing_new_starts(tmp_path, case, workers):
    """The model server is killed while two rollouts sit in a slow tool call (sleep 25) and two
    in a short one (sleep 3): the short ones fail to connect (`model` errors) and the endpoint is down
    (endpoint_down_after = 2): nothing new starts, the two slow rollouts run on; the server is
    back before their tool call ends, so they finish scored (reward 1). The run ends
    `incomplete` (exit 3) saying since when the endpoint is down and the command that
    continues it; `--resume` then scores the rest. With -w 2 no group is sent to a worker any
    more (a worker's one queued group may still start there)."""
    case.row(f"endpoint down while rollouts are in a slow tool call (-w {workers})",
             "in-flight rollouts finish with their real verdicts, nothing new starts; incomplete, exit 3; resume")
    from test_faults import COUNT

    code = SLOW_TOOL_SERVER.replace("{count!r}", repr(COUNT).replace("{", "{{").replace("}", "}}"))
    port = free_port()
    labels = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in case.labels.items())
    toml = tmp_path / "run.toml"
    toml.write_text(textwrap.dedent(f'''
        model = "test-model"
        api_base_url = "http://127.0.0.1:{port}/v1"
        api_key_var = "VF_FAULTS_TEST_KEY"
        endpoints_path = "{tmp_path / 'none.toml'}"
        env_dir_path = "{ENVS}"
        client_max_retries = 0
        max_concurrent = 4
        num_workers = {workers}
        endpoint_down_after = 2
        save_results = true

        [[eval]]
        env_id = "bash-files"
        num_examples = 10
        rollouts_per_example = 1
        env_args = {{ pool_size = 0, rollout_isolation = "container", labels = {{ {labels} }} }}
    '''))
    (tmp_path / "none.toml").write_text("")
    cmd = [sys.executable, "-m", "vfcli.app", "eval", str(toml), "-o", str(tmp_path / "outputs"), "-d"]
    srv = ServerProcess(code, port=port)
    again = None
    try:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        seen: set[str] = set()
        deadline = time.monotonic() + 180
        while len(seen) < 4 and time.monotonic() < deadline:  # 4 rollouts (0 and 1 among them) got a tool call
            line = srv.proc.stdout.readline()
            if line.startswith("req ") and line.split()[2] == "0":
                seen.add(line.split()[1])
        assert len(seen) == 4 and {"0", "1"} <= seen, seen
        time.sleep(0.5)  # the replies are sent (the policy prints before it answers)
        srv.kill()
        t_kill = time.monotonic()
        while time.monotonic() - t_kill < 20:  # the short ones fail to connect: the endpoint is down
            saved = list((tmp_path / "outputs").glob("evals/*/*/results.jsonl"))
            if saved and len(saved[0].read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert time.monotonic() - t_kill < 15, "the short rollouts did not fail"
        again = ServerProcess(code, port=port)  # back while the slow ones still sleep
        out, err = proc.communicate(timeout=180)
    finally:
        srv.kill()
    try:
        res = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        rows, meta, run_dir, rid = check_incomplete(
            tmp_path, res, {"model": Counter(r["verdict"] for r in saved_rows(tmp_path)[0])["model"]})
        by_id = {r["example_id"]: r for r in rows}
        for i in (0, 1):  # in flight when the endpoint went down: finished, scored
            assert by_id[i]["verdict"] == "scored" and by_id[i]["reward"] == 1.0, by_id.get(i)
        model_rows = [r for r in rows if r["verdict"] == "model"]
        assert len(model_rows) >= 2 and all("connection refused" in r["error"] for r in model_rows), model_rows
        # nothing new started once the endpoint was down: the rest of the dataset was not run (a slot freed
        # by a failed rollout may be taken before its row is recorded: a few more than the streak ran)
        assert len(rows) <= 8 and max(by_id) < 9, sorted(by_id)
        assert "is down since" in err and "those in flight finished" in err, err[-2000:]
        case.figure(f"{len(rows)} rows: 2 in flight scored, {len(model_rows)} model errors, {10 - len(rows)} not run")
        res2 = run(cmd + ["--resume", rid], tmp_path)
    finally:
        if again is not None:
            again.kill()
    check_resumed(tmp_path, res2, 10, 1, rid)


# --------------------------------------------------------------------------- the rollout timeout


@pytest.mark.docker
def test_rollout_timeout_in_the_sandbox_is_the_rollouts_result(tmp_path, case):
    """--rollout-timeout bounds the whole rollout: one stuck in its sandbox's command (sleep 600,
    under a 300 s command timeout) ends at the rollout timeout as the rollout's result: scored
    (reward 0), `sandbox_timeout` 1, stop `rollout_timeout`, attempts 1, its sandbox deleted
    (the case's leak check); the run completed, exit 0, in seconds, not minutes."""
    case.row("rollout stuck in a sandbox command past --rollout-timeout",
             "scored: reward 0, sandbox_timeout 1, stop rollout_timeout; sandbox deleted; completed, exit 0")
    from testmodel.model_server import ModelServer

    seen: list[str] = []
    t0 = time.monotonic()
    with ModelServer(bomb_policy("sleep 600", seen)).run_in_thread() as srv:
        res = run(eval_cmd(tmp_path, srv.base_url, "bash-files", "-n", "1", "-r", "1", "-s", "--rollout-timeout", "8",
                           "-a", json.dumps({"labels": case.labels, "pool_size": 0, "rollout_isolation": "container",
                                             "timeout_per_command_seconds": 300})), tmp_path)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    (row,), meta, _ = saved_rows(tmp_path)
    assert row["verdict"] == "scored" and not row["error"] and row["attempts"] == 1, row
    assert row["stop_condition"] == "rollout_timeout" and row["metrics"]["sandbox_timeout"] == 1.0
    assert row["reward"] == 0.0 and seen == []  # the model never got the tool's result
    assert meta["status"] == "completed" and elapsed < 90, elapsed
    assert "--rollout-timeout 8s reached (in a tool call / the sandbox" in res.stderr
    case.figure(f"ended after {elapsed:.0f}s (rollout timeout 8 s, command timeout 300 s)")


def test_model_wait_is_visible_and_default_request_timeout(tmp_path):
    """No --rollout-timeout and a model that does not answer for 25 s: the log names the rollout
    waiting on the model and for how long, and the request limit (600 s by default, not the
    clients' 3600 s); an endpoint's own `timeout` is kept."""
    from runner.config import configs_from_cli
    from runner.setup import DEFAULT_MODEL_REQUEST_TIMEOUT, make_run_clients
    from testmodel.model_server import ModelServer, compute, sequence, stall

    (cfg,) = configs_from_cli(["math-single"], {"model": "m", "api_base_url": "http://127.0.0.1:1/v1",
                                                "api_key_var": "EMPTY", "env_dir_path": str(ENVS)})
    env = types.SimpleNamespace(requires_model=True)  # what make_run_clients asks of the env
    (client,) = make_run_clients(cfg, env, check=False)
    assert client.config.timeout == DEFAULT_MODEL_REQUEST_TIMEOUT == 600.0
    cfg2 = cfg.model_copy(update={"client_config": cfg.client_config.model_copy(update={"timeout": 42.0})})
    assert make_run_clients(cfg2, env, check=False)[0].config.timeout == 42.0

    with ModelServer(sequence(stall(25, then=compute()), compute())).run_in_thread() as srv:
        res = run(eval_cmd(tmp_path, srv.base_url, "math-single", "-n", "1", "-r", "1", "-s"), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next((x for x in res.stderr.splitlines() if "waiting on the model" in x), "")
    assert "1 rollout(s) waiting on the model" in line and "example 0: " in line, res.stderr[-3000:]
    assert "a request gives up after 600s" in line


def test_rollout_timeout_verdict_by_phase_in_process():
    """The rollout timeout's verdict comes from what the rollout was doing: its env's own code
    (env_response stuck) -> scored, sandbox_timeout 1, stop rollout_timeout; an env that builds
    its state without init_state -> an env error saying it cannot tell; no timeout set -> the
    rollout runs to its end."""
    import envs as vf
    from envs.environment import Environment
    from envs.outputs import error_verdict
    from testmodel.model_server import ModelServer, Reply

    class Stuck(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kw):
            await asyncio.sleep(60)

    class NoInit(Environment):
        async def rollout(self, input, client, model, sampling_args=None):
            await asyncio.sleep(60)

    rows = [{"question": "q", "answer": "a"}]
    with ModelServer(lambda req: Reply(content="hi")).run_in_thread() as srv:
        from envs.clients import ClientConfig

        cc = ClientConfig(api_base_url=srv.base_url, api_key_var="EMPTY")
        env = Stuck(dataset=rows, max_turns=3, rubric=vf.Rubric(funcs=[lambda completion: 0.5]))
        env.rollout_timeout = 1.0
        t0 = time.monotonic()
        (row,) = asyncio.run(env.generate(env.get_eval_inputs(1, 1), cc, "m"))["outputs"]
        assert time.monotonic() - t0 < 40  # not the 60 s env_response (2 shared cores: client start-up is slow)
        assert row["stop_condition"] == "rollout_timeout" and row["metrics"]["sandbox_timeout"] == 1.0
        assert not row["error"] and row["reward"] == 0.5
        other = NoInit(dataset=rows)
        other.rollout_timeout = 0.5
        (row,) = asyncio.run(other.generate(other.get_eval_inputs(1, 1), cc, "m"))["outputs"]
        assert "rollout timed out after 0.5s" in row["error"] and row["verdict"] == "env", row
