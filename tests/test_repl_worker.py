"""The persistent Python worker (`envs.sandbox_tools.repl_worker`) and its
driver (`ReplSession`) on host subprocesses: one namespace across cells,
captured output, Out[n], tracebacks, interrupts, restarts, framing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from envs.sandbox_tools.common import start_local
from envs.sandbox_tools.repl_session import ReplSession, worker_source


@pytest.fixture
async def repl():
    s = ReplSession(start_local, interrupt_grace=1.0)
    yield s
    await s.close()


async def test_namespace_persists_and_trailing_expression(repl):
    r = await repl.run("import math\nx = 41", 5)
    assert r.status == "ok" and r.result is None and r.render() == "(no output)"
    r = await repl.run("def f(v):\n    return v + 1\nf(x)", 5)
    assert r.result == "42" and r.render() == "Out[2]: 42"
    r = await repl.run("math.sqrt(16)", 5)
    assert r.render() == "Out[3]: 4.0"
    assert (await repl.run("_", 5)).result == "4.0"


async def test_stdout_stderr_and_subprocess_output_captured(repl):
    r = await repl.run(
        "import os, sys\nprint('out')\nprint('err', file=sys.stderr)\nos.system('echo from-child')\n'done'", 5
    )
    assert r.stdout == "out\nfrom-child\n"
    assert r.stderr == "err\n"
    assert r.render() == "out\nfrom-child\nstderr:\nerr\nOut[1]: 'done'"


async def test_traceback_shows_only_user_frames(repl):
    r = await repl.run("def g():\n    return 1/0\ng()", 5)
    assert r.status == "error"
    assert r.traceback.startswith("Traceback (most recent call last):")
    assert 'File "<cell-1>", line 2, in g' in r.traceback and "return 1/0" in r.traceback
    assert r.traceback.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "repl_worker" not in r.traceback and "<string>" not in r.traceback
    r = await repl.run("def broken(:", 5)
    assert r.status == "error" and "SyntaxError" in r.traceback


async def test_sys_exit_and_input_do_not_kill_the_worker(repl):
    await repl.run("keep = 1", 5)
    r = await repl.run("import sys; sys.exit(3)", 5)
    assert r.status == "error" and "SystemExit: 3" in r.traceback
    r = await repl.run("input()", 5)
    assert "EOFError" in r.traceback  # stdin is /dev/null, not the protocol channel
    assert (await repl.run("keep", 5)).result == "1"
    assert repl.restarts == 0


async def test_timeout_interrupts_cell_and_namespace_survives(repl):
    await repl.run("data = [1, 2, 3]", 5)
    r = await repl.run("import time\nprint('before')\ntime.sleep(60)", 1)
    assert r.timed_out and r.status == "interrupted" and not r.restarted
    assert r.stdout == "before\n" and "KeyboardInterrupt" in r.traceback
    assert "variables are kept" in r.render()
    assert (await repl.run("sum(data)", 5)).result == "6"


async def test_uninterruptible_cell_restarts_worker(repl):
    await repl.run("gone = True", 5)
    r = await repl.run("import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    time.sleep(60)", 1)
    assert r.timed_out and r.restarted and r.status == "lost"
    assert "variables and imports were lost" in r.render()
    r = await repl.run("gone", 5)
    assert "NameError" in r.traceback
    assert repl.restarts == 1


async def test_dead_worker_restarted_and_model_told(repl):
    await repl.run("v = 1", 5)
    r = await repl.run("import os; os._exit(9)", 5)
    assert r.restarted and not r.timed_out and "died (exit code 9)" in r.render()
    assert "NameError" in (await repl.run("v", 5)).traceback
    assert (await repl.run("2 * 21", 5)).result == "42"


async def test_output_is_capped_head_and_tail():
    s = ReplSession(start_local, output_limit=200)
    try:
        r = await s.run("print('HEAD'); print('x' * 100000); print('TAIL')", 5)
        assert r.stdout.startswith("HEAD\n") and r.stdout.endswith("TAIL\n")
        assert "bytes cut" in r.stdout and r.dropped_bytes > 99000
        r = await s.run("list(range(100000))", 5)
        assert "bytes cut" in r.result and len(r.result) < 400
    finally:
        await s.close()


async def test_late_frame_never_pairs_with_next_request(repl):
    """A frame for request N arriving after N was given up on is discarded, not paired with N+1."""
    # a cell that finishes right around its timeout: either answer is fine, but the
    # next cell must get its own answer
    for i in range(5):
        await repl.run("import time; time.sleep(0.2)", 0.2)
        r = await repl.run(f"{i} * 10", 5)
        assert r.result == str(i * 10), r


def test_worker_protocol_frames_raw():
    """The wire format itself: one JSON line + \\x1e + id per response, id 0 = ready."""
    reqs = "\n".join(
        json.dumps(r) for r in [{"id": 7, "code": "a = 2\na * 3"}, {"id": 8, "code": "print(a)"}, {"id": 9, "shutdown": True}]
    )
    out = subprocess.run(
        [sys.executable, "-c", worker_source()], input=reqs + "\n", capture_output=True, text=True, timeout=30
    ).stdout
    frames = [line.rpartition("\x1e") for line in out.split("\n") if line]
    assert [tag for _, _, tag in frames] == ["0", "7", "8", "9"]
    bodies = [json.loads(body) for body, _, _ in frames]
    assert bodies[0]["ready"] is True
    assert bodies[1]["result"] == "6" and bodies[1]["execution_count"] == 1
    assert bodies[2]["stdout"] == "2\n"


async def test_cell_replacing_sys_stdout_does_not_break_later_cells(repl):
    r = await repl.run("import io, sys\nsys.stdout = io.StringIO()\nprint('swallowed')", 5)
    assert r.status == "ok" and r.stdout == ""
    r = await repl.run("import sys\nsys.stdout.close()", 5)
    r = await repl.run("print('visible again')", 5)
    assert r.stdout == "visible again\n", r
