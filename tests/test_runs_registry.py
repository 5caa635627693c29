"""Run registry states through real processes: a driver script uses
`RunRecorder` exactly as `vf-sandbox eval` does; we read the registry back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runs import registry

DRIVER = Path(__file__).with_name("runs_driver.py")


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = tmp_path / "runs.db"
    monkeypatch.setenv("VF_RUNS_DB", str(db))
    drv = DRIVER
    e = dict(os.environ, VF_RUNS_DB=str(db), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return tmp_path, drv, e


def spawn(env, mode, n=5, out="out"):
    tmp, drv, e = env
    p = subprocess.Popen([sys.executable, str(drv), mode, str(tmp / out), str(n)],
                         env=e, stdout=subprocess.PIPE, text=True)
    rid = p.stdout.readline().strip()
    assert rid, "driver did not start"
    return p, rid


def wait_progress(rid, at_least, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = registry.get_run(rid)
        if r and r.completed >= at_least:
            return r
        time.sleep(0.05)
    raise AssertionError(f"run {rid} never reached {at_least}")


def test_completed(env):
    p, rid = spawn(env, "complete")
    assert p.wait(30) == 0
    r = registry.get_run(rid)
    assert r.status == "completed" and not r.vanished
    assert (r.completed, r.total) == (5, 5)
    assert r.env_id == "toy-env" and r.args["num_examples"] == 5 and r.name == "drv-complete"
    assert r.ended_at and r.ended_at >= r.started_at
    text = Path(r.log_path).read_text()
    assert "finished example 4" in text and "completed" in text


def test_failed_records_error(env):
    p, rid = spawn(env, "fail")
    assert p.wait(30) == 1
    r = registry.get_run(rid)
    assert r.status == "failed" and r.error == "ValueError: boom at example 1"
    assert registry.list_runs(status="failed")[0].id == rid


def test_sigkill_is_shown_vanished_not_running(env):
    p, rid = spawn(env, "slow", n=50)
    wait_progress(rid, 1)
    assert registry.get_run(rid).status == "running"
    p.kill()
    p.wait()
    r = registry.get_run(rid)
    assert r.status == "incomplete" and r.vanished  # its rows are kept: a resume continues it
    assert "vanished" in r.error and f"--resume {rid}" in r.error
    assert registry.list_runs(status="running") == []


def test_reused_pid_is_not_alive(env):
    # Same pid, different start time: a recycled pid must not keep a run "running".
    p, rid = spawn(env, "slow", n=50)
    try:
        wait_progress(rid, 1)
        with registry.connect() as conn:
            conn.execute("UPDATE runs SET pid_start='1' WHERE id=?", (rid,))
        assert registry.get_run(rid).status == "incomplete"
    finally:
        p.kill()
        p.wait()


def test_stop_then_resume_continues_same_run(env):
    from dashboard.stop import stop_run
    p, rid = spawn(env, "slow", n=12)
    wait_progress(rid, 2)
    r = stop_run(rid, timeout=20)
    assert r.status == "stopped" and not r.vanished
    assert p.wait(10) == 0
    saved = {json.loads(x)["example_id"] for x in open(env[0] / "out" / "results.jsonl")}
    assert 2 <= len(saved) < 12
    # resume: same output dir -> same registry row, attempts 2
    p2, rid2 = spawn(env, "complete", n=12)
    assert p2.wait(30) == 0
    assert rid2 == rid
    r = registry.get_run(rid)
    assert r.status == "completed" and r.attempts == 2 and r.completed == 12
    assert sum(1 for _ in open(env[0] / "out" / "results.jsonl")) == 12 * 3


def test_concurrent_runs_do_not_lose_updates(env):
    procs = [spawn(env, "complete", n=20, out=f"out{i}") for i in range(4)]
    for p, _ in procs:
        assert p.wait(60) == 0
    runs = {r.id: r for r in registry.list_runs()}
    assert len(runs) == 4
    for _, rid in procs:
        assert runs[rid].status == "completed" and runs[rid].completed == 20


def test_context_manager_marks_failed_on_exception(env, tmp_path):
    with pytest.raises(RuntimeError):
        with registry.RunRecorder.start(kind="swe-debug", env_id="swe", output_dir=tmp_path / "o",
                                        capture_logging=False) as rec:
            raise RuntimeError("kaput")
    r = registry.get_run(rec.id)
    assert r.status == "failed" and r.error == "RuntimeError: kaput"
    assert "Traceback" in Path(r.log_path).read_text()


def test_filters(env, tmp_path):
    a = registry.RunRecorder.start(kind="eval", env_id="alpha", model="m1", output_dir=tmp_path / "a")
    b = registry.RunRecorder.start(kind="eval", env_id="beta", model="m2", output_dir=tmp_path / "b")
    b.finish("completed")
    assert [r.id for r in registry.list_runs(env_id="alp")] == [a.id]
    assert [r.id for r in registry.list_runs(model="m2")] == [b.id]
    assert [r.id for r in registry.list_runs(status="running")] == [a.id]
    a.finish("completed")


def test_sigkill_during_writes_never_corrupts_the_registry(env, tmp_path):
    """Writers SIGKILLed mid-transaction: the file stays consistent, every run readable."""
    storm = tmp_path / "storm.py"
    storm.write_text(
        "import sys\nfrom runs.registry import RunRecorder\n"
        "rec = RunRecorder.start(kind='eval', env_id='storm', output_dir=sys.argv[1], capture_logging=False)\n"
        "print(rec.id, flush=True)\n"
        "i = 0\nwhile True:\n    i += 1\n    rec.progress(completed=i, total=i)  # completed==total: never throttled\n")
    e = env[2]
    procs = []
    for k in range(3):
        p = subprocess.Popen([sys.executable, str(storm), str(tmp_path / f"s{k}")], env=e,
                             stdout=subprocess.PIPE, text=True)
        procs.append((p, p.stdout.readline().strip()))
    # every writer is mid-storm (three processes contend for the write lock: one can wait
    # its turn for a while on a loaded machine), then all are killed
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all((registry.get_run(rid).completed or 0) > 10 for _, rid in procs):
        time.sleep(0.1)
    time.sleep(0.3)
    for p, _ in procs:
        p.kill()
        p.wait()
    with registry.connect() as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    for _, rid in procs:
        r = registry.get_run(rid)
        assert r.status == "incomplete" and r.vanished and r.completed > 10


async def test_concurrent_runs_in_one_process_get_their_own_log_lines(env, tmp_path):
    """Like an eval TOML with two [[eval]]s: one task per run, one log per run."""
    import asyncio
    import logging

    lg = logging.getLogger("multi-eval")
    lg.info("before any run")  # outside every run's context

    async def one(name):
        rec = registry.RunRecorder.start(kind="eval", env_id=name, output_dir=tmp_path / name)
        for i in range(3):
            lg.info("%s step %d", name, i)
            await asyncio.to_thread(lg.info, "%s in a thread %d", name, i)
            await asyncio.sleep(0.01)
        rec.finish("completed")
        return rec

    a, b = await asyncio.gather(asyncio.create_task(one("alpha")), asyncio.create_task(one("beta")))
    ta, tb = Path(a.log_path).read_text(), Path(b.log_path).read_text()
    assert "alpha step 2" in ta and "alpha in a thread 2" in ta and "beta" not in ta.replace("env=beta", "")
    assert "beta step 2" in tb and "beta in a thread 2" in tb and "alpha step" not in tb


def _open_fresh(path, barrier, results):
    from runs import registry as reg

    barrier.wait()
    try:
        reg.connect(path).close()
        results.put(None)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(repr(exc))


def test_processes_opening_a_fresh_registry_at_once_never_see_it_locked(tmp_path):
    """SQLite's busy handler does not cover the switch to WAL: 8 processes opening a new
    registry at the same moment got "database is locked" in ~1 of 5 trials before the
    initialisation was serialised."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    errors = []
    for trial in range(40):
        path = tmp_path / f"t{trial}" / "runs.db"
        path.parent.mkdir()
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_open_fresh, args=(path, barrier, results)) for _ in range(8)]
        for p in procs:
            p.start()
        errors += [r for r in (results.get(timeout=60) for _ in procs) if r]
        for p in procs:
            p.join(10)
    assert not errors, errors[:3]


def test_schema_3_migration_adds_scored_and_errored_counts(tmp_path, monkeypatch):
    """A registry written before schema 3 (no scored / errored columns) is migrated in place
    when opened: its runs read with 0 / {} and new progress records scored, errored and the
    kinds (errors = the errored count, never scored task failures)."""
    import sqlite3

    db = tmp_path / "old.db"
    v2 = registry._SCHEMA
    for col in ("scored_rollouts", "errored_rollouts", "errors_by_kind"):
        v2 = "\n".join(line for line in v2.splitlines() if not line.strip().startswith(col + " "))
    conn = sqlite3.connect(db)
    conn.executescript(v2)
    conn.execute("INSERT INTO runs (id, kind, env_id, output_dir, log_path, host, pid, status, errors, started_at, "
                 "first_started_at, updated_at) VALUES ('old1', 'eval', 'e', '/x', '/x.log', 'h', 1, 'completed', 4, "
                 "1, 1, 1)")
    conn.execute("PRAGMA user_version=2")
    conn.commit()
    conn.close()
    monkeypatch.setenv("VF_RUNS_DB", str(db))
    old = registry.get_run("old1")
    assert (old.errors, old.scored_rollouts, old.errored_rollouts, old.errors_by_kind) == (4, 0, 0, {})
    with closing_conn(db) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == registry.SCHEMA_VERSION == 3
    rec = registry.RunRecorder.start(kind="eval", env_id="e", output_dir=str(tmp_path / "out"), capture_logging=False)
    rec.progress(completed=7, total=10, scored=4, errors_by_kind={"model": 2, "env": 1})
    rec.finish("incomplete")
    new = registry.get_run(rec.id)
    assert (new.completed, new.scored_rollouts, new.errored_rollouts, new.errors) == (7, 4, 3, 3)
    assert new.errors_by_kind == {"env": 1, "model": 2}
    registry.set_progress(rec.id, 10, 10, scored=10, errors_by_kind={})  # a hosted run's pulled results
    new = registry.get_run(rec.id)
    assert (new.scored_rollouts, new.errored_rollouts, new.errors_by_kind) == (10, 0, {})


def closing_conn(db):
    import sqlite3
    from contextlib import closing

    return closing(sqlite3.connect(db))
