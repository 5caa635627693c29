"""`-w N`: worker processes sharing one run, through the real `vf-sandbox eval`
(a subprocess) against the local model server: every rollout written exactly
once by the one writer, a worker that dies mid-run losing nothing, and the
same results as in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from runs import registry
from testmodel.model_server import ModelServer, compute

ROOT = Path(__file__).resolve().parents[1]

# An env whose rollout of example 3 kills its worker process the first time (a marker file
# makes the second try succeed): the group must be finished by another worker, once.
DYING_ENV = textwrap.dedent('''
    import os
    from pathlib import Path

    import envs as vf
    from math_single import load_environment as base


    class DiesOnce(vf.SingleTurnEnv):
        async def rollout(self, input, client, model, sampling_args=None):
            marker = Path(os.environ["VF_TEST_MARKER"])
            if input["example_id"] == 3 and (os.environ.get("VF_TEST_DIE_ALWAYS") or not marker.exists()):
                marker.write_text(str(os.getpid()))
                os._exit(17)  # the whole worker process dies, mid-group
            return await super().rollout(input, client, model, sampling_args)


    def load_environment(**kw):
        env = base(**kw)
        env.__class__ = DiesOnce
        return env
''')


def wrong_on_every_third_example():
    """Right answers, except for examples 0, 3, 6, ... (by the example id the eval sends in
    X-Session-ID): the same rewards whatever order the requests arrive in."""
    right = compute()

    def policy(req):
        reply = right(req)
        if int(req.headers.get("X-Session-ID", "0")) % 3 == 0:
            reply.content = reply.content.replace("}", "1}")
        return reply

    return policy


@pytest.fixture(scope="module")
def server():
    with ModelServer(wrong_on_every_third_example()).run_in_thread() as srv:
        yield srv


def run(tmp_path: Path, server, env_id: str, *extra: str, marker: Path | None = None,
        **more_env: str) -> subprocess.CompletedProcess:
    envdir = tmp_path / "environments" / "dying_env"
    envdir.mkdir(parents=True, exist_ok=True)
    (envdir / "dying_env.py").write_text(DYING_ENV)
    env = dict(os.environ, VF_RUNS_DB=str(tmp_path / "runs.db"), FAKE_KEY="x",
               PYTHONPATH=f"{ROOT}:{ROOT / 'environments' / 'math_single'}:{envdir}",
               VF_TEST_MARKER=str(marker or tmp_path / "marker"), **more_env)
    argv = [sys.executable, "-m", "vfcli.app", "eval", env_id, "-m", "toy", "-b", server.base_url, "-k", "FAKE_KEY",
            "-d", "-s", "-o", str(tmp_path / "out"), "-p", str(tmp_path / "environments"), *extra]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def saved(tmp_path: Path) -> tuple[list[dict], dict]:
    (d,) = list((tmp_path / "out" / "evals").glob("*/*"))
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    return rows, json.loads((d / "metadata.json").read_text())


def test_two_workers_write_every_rollout_once_with_the_same_results(tmp_path, server):
    one = run(tmp_path / "one", server, "math-single", "-n", "20", "-r", "3", "-c", "16")
    two = run(tmp_path / "two", server, "math-single", "-n", "20", "-r", "3", "-c", "16", "-w", "2")
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-3000:]
    rows1, _ = saved(tmp_path / "one")
    rows2, meta2 = saved(tmp_path / "two")
    assert Counter(r["example_id"] for r in rows2) == {i: 3 for i in range(20)}  # each rollout once
    assert {r["example_id"] for r in rows2 if r["reward"] == 0} == set(range(0, 20, 3))
    assert sorted((r["example_id"], r["reward"]) for r in rows2) == sorted((r["example_id"], r["reward"]) for r in rows1)
    assert meta2["status"] == "completed" and meta2["eval_config"]["num_workers"] == 2
    assert meta2["avg_reward"] == pytest.approx(sum(r["reward"] for r in rows1) / len(rows1))
    (rec,) = registry.list_runs(path=tmp_path / "two" / "runs.db")
    assert rec.status == "completed" and rec.completed == 60


def test_a_worker_dying_mid_run_loses_nothing(tmp_path, server):
    marker = tmp_path / "marker"
    res = run(tmp_path, server, "dying-env", "-n", "12", "-r", "2", "-c", "8", "-w", "2", marker=marker)
    assert marker.exists(), "the test env never killed its worker"
    assert res.returncode == 0, res.stderr[-3000:]
    assert "exited (code 17)" in res.stderr and "go to the other workers" in res.stderr
    rows, meta = saved(tmp_path)
    assert Counter(r["example_id"] for r in rows) == {i: 2 for i in range(12)}  # example 3 redone, nothing twice
    assert not any(r.get("error") for r in rows)
    assert meta["status"] == "completed"


def test_every_worker_dying_fails_the_run_with_the_cause(tmp_path, server):
    # example 3 kills every worker that picks it up
    res = run(tmp_path, server, "dying-env", "-n", "6", "-r", "1", "-c", "4", "-w", "2", VF_TEST_DIE_ALWAYS="1")
    assert res.returncode == 3
    assert "every worker died" in res.stderr
    rows, meta = saved(tmp_path)
    assert meta["status"] == "failed"
    assert 3 not in {r["example_id"] for r in rows}  # what finished is kept; resume runs the rest


def test_workers_refuse_no_interleave_scoring(tmp_path, server):
    res = run(tmp_path, server, "math-single", "-n", "2", "-w", "2", "-N")
    assert res.returncode == 2 and "cannot be combined with -w" in res.stderr


def test_eval_writes_a_junit_report_for_ci(tmp_path, server):
    """`--junit-xml` (also with -w): a test case per rollout, failures where the reward is
    below the pass threshold (the server gets every third example wrong)."""
    import xml.etree.ElementTree as ET

    report = tmp_path / "junit.xml"
    res = run(tmp_path, server, "math-single", "-n", "6", "-r", "1", "-w", "2", "--junit-xml", str(report))
    assert res.returncode == 0, res.stderr[-3000:]
    rows, meta = saved(tmp_path)
    cases = ET.parse(report).getroot().iter("testcase")
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    expect = {f"example {r['example_id']}" for r in rows if r["reward"] < meta["pass_threshold"]}
    assert failed == expect == {"example 0", "example 3"}


def test_dispatcher_stand_in_hands_over_to_the_workers_within_the_limit():
    """A hosted job's own process stands in for its actors (runner.ray_workers): it may
    hold every group the actors would, a ready actor gets only what the stand-in leaves of
    that limit, and once retired the stand-in gets nothing while its groups still count."""
    from runner.dispatch import GroupDispatcher

    inputs = [{"example_id": e, "rollout": r} for e in range(10) for r in range(2)]
    d = GroupDispatcher(inputs, share=2)  # 2 rollouts per worker: 2 groups of 2 held each
    assert d.depth == 2
    d.limit = 2 * d.depth  # two actors
    d.add("a"), d.add("b"), d.add("local", depth=d.limit)
    d.ready("local")
    assert [g for g, _ in d.take("local")] == [0, 1, 2, 3] and d.take("a") == []  # a not ready
    d.ready("a")
    assert d.take("a") == []  # the stand-in holds the whole limit
    d.retire("local")
    assert d.finished("local", 1) and [g for g, _ in d.take("a")] == [4]  # a gets what local frees
    assert d.take("local") == []  # retired: nothing more
    assert d.finished("local", 0) and [g for g, _ in d.take("a")] == [5]
    assert d.finished("local", 2) and d.take("a") == []  # a holds its depth; b is not ready
    d.ready("b")
    assert [g for g, _ in d.take("b")] == [6]
    assert d.lost("a") == [4, 5] and [g for g, _ in d.take("b")] == [4]  # a's groups go back first
    assert not d.finished("a", 4)  # never written twice
    assert d.finished("local", 3) and d.finished("b", 6) and d.finished("b", 4)
    assert d.remaining == 10 - 6 and [g for g, _ in d.take("b")] == [5, 7]


def _ignores_sigterm(conn) -> None:
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.send_bytes(b"{}")
    time.sleep(600)


@pytest.mark.docker
async def test_a_worker_that_does_not_stop_is_killed_and_the_runner_deletes_its_sandboxes():
    """A worker stuck past the stop deadline is killed (never left running), and the
    sandboxes it could not delete are deleted by the runner through the run's label."""
    import asyncio
    import multiprocessing
    import types
    import uuid

    from conftest import DEFAULT_TEST_IMAGE, require_docker
    from runner.dispatch import GroupDispatcher
    from runner.workers import _delete_left_behind, _shut_down, _Worker
    from sandboxes import SandboxSpec, labels
    from sandboxes.registry import get_backend

    require_docker()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_ignores_sigterm, args=(child,), daemon=True)
    proc.start()
    assert parent.poll(60) and parent.recv_bytes() == b"{}"  # it runs, ignoring SIGTERM
    worker = _Worker(0, proc, parent)
    groups = GroupDispatcher([{"example_id": 0}], 1)
    groups.add(worker)
    from sandboxes import settings

    rid = "w-" + uuid.uuid4().hex[:10]
    be = get_backend("docker")
    try:
        with settings.use(settings.ProcessSettings(sandbox_run_id=rid)):  # a worker's scope: the run's label
            sb = await be.create(SandboxSpec(image=DEFAULT_TEST_IMAGE, labels={"vf-sandbox.test": "1"}))
        assert (await be.list({labels.RUN_ID: rid}))[0].id == sb.id
        killed = await _shut_down([worker], groups, asyncio.Queue(), None, stopping=True, stop_seconds=1)
        assert killed and not proc.is_alive()
        await _delete_left_behind(types.SimpleNamespace(backend="docker", backend_options={}, sandbox_run_id=rid))
        assert await be.list({labels.RUN_ID: rid}) == []
    finally:
        await be.delete_many(labels={labels.RUN_ID: rid})
        await be.close()
        if proc.is_alive():
            proc.kill()
