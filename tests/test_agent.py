"""The agent and `AgentSandbox` over a local pipe channel (no Docker needed):
exec semantics, timeouts, bounded output, streaming, background processes,
files and tar transfers, traversal refusal and agent death."""

from __future__ import annotations

import ast
import base64
import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

from conftest import ROOT
from sandboxes import AgentError, PathError, SandboxNotRunning, SandboxSpec
from sandboxes.agent import AgentSandbox, agent_source
from sandboxes.agent.channels import ProcessChannel
from sandboxes.agent.protocol import b64


@pytest.fixture
async def sb(tmp_path):
    channel = await ProcessChannel.spawn(cwd=str(tmp_path))
    sandbox = await AgentSandbox.connect(channel, id="local", name="local", spec=SandboxSpec(output_limit_bytes=64 * 1024))
    yield sandbox
    await sandbox.delete()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_agent_source_is_python37_stdlib_only():
    tree = ast.parse(agent_source(), feature_version=(3, 7))
    allowed = {"base64", "ctypes", "json", "os", "queue", "select", "signal", "subprocess", "sys", "threading", "time",
               "tarfile", "stat", "pwd", "grp"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name.split(".")[0] for a in node.names} <= allowed
        elif isinstance(node, ast.ImportFrom):
            assert node.module.split(".")[0] in allowed and node.level == 0


async def test_exec_result_and_exit_codes(sb):
    r = await sb.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.signal) == ("out\n", "err\n", 3, False, None)
    assert not r.ok and r.duration > 0
    r = await sb.exec(["printf", "%s|", "a b", "c"])
    assert r.stdout == "a b|c|" and r.ok
    r = await sb.exec(["/no/such/binary"])
    assert r.exit_code == 127 and "cannot run" in r.stderr
    r = await sb.exec("kill -TERM $$")
    assert r.exit_code is None and r.signal == 15


async def test_stdin_env_cwd(sb, tmp_path):
    r = await sb.exec("tr a-z A-Z", stdin="hello")
    assert r.stdout == "HELLO"
    big = os.urandom(300_000)
    r = await sb.exec("sha256sum", stdin=big)
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(big).hexdigest()
    r = await sb.exec("echo $FOO; pwd", env={"FOO": "bar"}, cwd="/tmp")
    assert r.stdout == "bar\n/tmp\n"
    r = await sb.exec("pwd")
    assert r.stdout.strip() == str(tmp_path)


async def test_timeout_kills_group_and_agent_survives(sb):
    t0 = time.monotonic()
    r = await sb.exec("sleep 60 & echo $!; sleep 60", timeout=0.5)
    assert r.timed_out and r.exit_code is None and r.signal == 9
    assert time.monotonic() - t0 < 3
    child = int(r.stdout.split()[0])
    for _ in range(50):
        if not pid_alive(child):
            break
        await asyncio.sleep(0.02)
    assert not pid_alive(child), "background child of a timed-out command survived"
    assert (await sb.exec("echo still")).stdout == "still\n"


async def test_background_leftover_does_not_block(sb):
    t0 = time.monotonic()
    r = await sb.exec("sleep 30 & echo started", timeout=10)
    assert r.ok and r.stdout == "started\n"
    assert time.monotonic() - t0 < 2


async def test_output_capped_head_tail(sb):
    limit = 64 * 1024
    total = 5 * 1024 * 1024
    r = await sb.exec(f"python3 -c \"import sys; sys.stdout.write('H'*1000 + 'x'*({total}-2000) + 'T'*1000)\"")
    assert r.ok and r.truncated
    assert r.stdout_dropped_bytes == total - limit
    assert r.stdout.startswith("H" * 1000) and r.stdout.endswith("T" * 1000)
    assert f"[... {total - limit} bytes dropped ...]" in r.stdout
    assert len(r.stdout.encode()) < limit + 100


async def test_binary_output_never_crashes(sb):
    r = await sb.exec("printf '\\377\\376abc\\000\\200'")
    assert r.ok and "abc" in r.stdout and "\ufffd" in r.stdout


async def test_concurrent_requests_do_not_block(sb):
    slow = asyncio.create_task(sb.exec("sleep 4; echo slow"))
    await asyncio.sleep(0.1)
    fast = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(20)))
    assert not slow.done(), "the fast commands waited for the slow one"
    assert [f.stdout for f in fast] == [f"{i}\n" for i in range(20)]
    assert (await slow).stdout == "slow\n"


async def test_exec_stream_chunks_then_result(sb):
    items = [x async for x in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2")]
    chunks, result = items[:-1], items[-1]
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"1\n2\n3\n"
    assert any(c.stream == "stderr" for c in chunks)
    assert result.ok and result.stdout == "1\n2\n3\n"


async def test_exec_stream_abandoned_kills_command(sb, tmp_path):
    marker = tmp_path / "pid"
    gen = sb.exec_stream(f"echo $$ > {marker}; while true; do echo tick; sleep 0.01; done", timeout=30)
    async for _ in gen:
        break
    await gen.aclose()
    pid = int(marker.read_text())
    for _ in range(100):
        if not pid_alive(pid):
            break
        await asyncio.sleep(0.02)
    assert not pid_alive(pid)


async def test_exec_stream_flow_control_bounded(sb):
    # 20 MiB streamed: consumer is slow at first; the agent must wait for acks, not flood
    n = 0
    async for item in sb.exec_stream("head -c 20000000 /dev/zero", timeout=60):
        if hasattr(item, "data"):
            if n == 0:
                await asyncio.sleep(0.5)
                queued = sum(w.queue.qsize() for w in sb.connection._waiters.values() if w.queue is not None)
                assert queued * 65536 <= 8 * 1024 * 1024
            n += len(item.data)
        else:
            assert item.ok
    assert n == 20_000_000


async def test_background_process(sb):
    p = await sb.start_process("echo ready; cat; echo done >&2")
    out, _ = await p.read_output(until="ready", timeout=5)
    assert out == "ready"
    assert (await p.poll()).running
    await p.write_stdin("line1 MARK tail\n")
    out, _ = await p.read_output(until="MARK", timeout=5)
    assert out == "\nline1 MARK"
    out, _ = await p.read_output(until="nothing-comes", timeout=0.3)
    assert out == " tail\n"
    await p.close_stdin()
    st = await p.wait(5)
    assert not st.running and st.exit_code == 0
    _, err = await p.read_output()
    assert err == "done\n"


async def test_background_overflow_reports_dropped_bytes_per_stream(sb):
    """A full background buffer keeps the newest bytes; each read says how many
    of the oldest it lost, per stream, and a later read that lost none says 0."""
    limit = 64 * 1024  # the fixture's output_limit_bytes
    p = await sb.start_process(
        "head -c 200000 /dev/zero | tr '\\0' a; head -c 100000 /dev/zero | tr '\\0' b >&2; echo END"
    )
    assert p.dropped_bytes == (0, 0) and p.total_dropped_bytes == (0, 0)
    assert (await p.wait(10)).exit_code == 0
    out, err = await p.read_output()
    assert len(out) == limit and out.endswith("aEND\n") and set(out[:-4]) == {"a"}
    assert len(err) == limit and set(err) == {"b"}
    assert p.dropped_bytes == (200000 + 4 - limit, 100000 - limit)
    assert p.total_dropped_bytes == p.dropped_bytes
    out, err = await p.read_output()
    assert (out, err) == ("", "") and p.dropped_bytes == (0, 0)
    assert p.total_dropped_bytes == (200000 + 4 - limit, 100000 - limit)

    q = await sb.start_process("echo small; echo tiny >&2")
    await q.wait(5)
    assert await q.read_output() == ("small\n", "tiny\n") and q.dropped_bytes == (0, 0)


async def test_background_kill_group(sb):
    p = await sb.start_process("sleep 100 & echo $!; wait")
    out, _ = await p.read_output(until="\n", timeout=5)
    child = int(out)
    await p.kill()
    st = await p.wait(5)
    assert not st.running and st.signal == 9
    for _ in range(50):
        if not pid_alive(child):
            break
        await asyncio.sleep(0.02)
    assert not pid_alive(child)
    await p.kill()  # idempotent


async def test_files_round_trip(sb, tmp_path):
    await sb.write_file(str(tmp_path / "a/b/c.bin"), b"\x00\x01" * 10, mode=0o750)
    assert await sb.read_file(str(tmp_path / "a/b/c.bin")) == b"\x00\x01" * 10
    assert oct((tmp_path / "a/b/c.bin").stat().st_mode & 0o777) == oct(0o750)
    big = os.urandom(3 * 1024 * 1024 + 5)
    await sb.write_file(str(tmp_path / "big"), big)
    assert await sb.read_file(str(tmp_path / "big")) == big
    assert await sb.read_file(str(tmp_path / "big"), max_bytes=10) == big[:10]
    with pytest.raises(PathError):
        await sb.read_file(str(tmp_path / "missing"))
    with pytest.raises(PathError):
        await sb.read_file(str(tmp_path / "a"))


def make_tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "sub/run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "sub/run.sh").chmod(0o755)
    (root / "ro.txt").write_text("read only")
    (root / "ro.txt").chmod(0o400)
    (root / "link").symlink_to("sub/run.sh")
    (root / "empty").mkdir()


async def test_directory_round_trip_keeps_modes_and_links(sb, tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    await sb.upload(src, str(tmp_path / "remote"))
    back = tmp_path / "back"
    await sb.download(str(tmp_path / "remote"), back)
    assert (back / "sub/run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert (back / "sub/run.sh").stat().st_mode & 0o777 == 0o755
    assert (back / "ro.txt").stat().st_mode & 0o777 == 0o400
    assert (back / "link").is_symlink() and os.readlink(back / "link") == "sub/run.sh"
    assert (back / "empty").is_dir()
    # single files too
    await sb.upload(src / "sub/run.sh", str(tmp_path / "one.sh"))
    assert (tmp_path / "one.sh").stat().st_mode & 0o777 == 0o755
    await sb.download(str(tmp_path / "one.sh"), tmp_path / "one-back.sh")
    assert (tmp_path / "one-back.sh").read_text() == "#!/bin/sh\necho hi\n"


async def test_download_refuses_links_out(sb, tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(PathError):
        await sb.download(str(evil), tmp_path / "out")
    (evil / "passwd").unlink()
    (evil / "up").symlink_to("../../..")
    with pytest.raises(PathError):
        await sb.download(str(evil), tmp_path / "out2")


async def test_put_tar_refuses_traversal(sb, tmp_path):
    for name, kind in (("../escape.txt", tarfile.REGTYPE), ("/abs.txt", tarfile.REGTYPE)):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))

        async def pieces(data=buf.getvalue()):
            yield data

        with pytest.raises(PathError):
            await sb._run_stream({"op": "put_tar", "dest": str(tmp_path / "dest")}, inbound=pieces())
    assert not (tmp_path / "escape.txt").exists()
    # a link to outside, then a file written through it
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        link = tarfile.TarInfo("out")
        link.type = tarfile.SYMTYPE
        link.linkname = str(tmp_path / "victim")
        tar.addfile(link)
        f = tarfile.TarInfo("out/pwned")
        f.size = 2
        tar.addfile(f, io.BytesIO(b"hi"))
    (tmp_path / "victim").mkdir()

    async def pieces2():
        yield buf.getvalue()

    with pytest.raises(PathError):
        await sb._run_stream({"op": "put_tar", "dest": str(tmp_path / "dest2")}, inbound=pieces2())
    assert not (tmp_path / "victim/pwned").exists()
    assert (await sb.exec("echo ok")).ok


async def test_agent_death_fails_pending_requests(sb):
    pending = asyncio.create_task(sb.exec("sleep 30"))
    await asyncio.sleep(0.2)
    sb.connection.channel.proc.kill()
    with pytest.raises(AgentError):
        await pending
    with pytest.raises(AgentError):
        await sb.exec("echo again")
    assert not await sb.alive()


async def test_agent_garbage_is_agent_error(tmp_path):
    channel = await ProcessChannel.spawn(["python3", "-c", "print('hello'); import time; time.sleep(5)"])
    with pytest.raises(AgentError):
        await AgentSandbox.connect(channel, id="x", name="x", spec=SandboxSpec(), hello_timeout=5)
    await channel.close()


async def test_deleted_sandbox_raises_not_running(sb):
    await sb.delete()
    await sb.delete()  # idempotent
    with pytest.raises(SandboxNotRunning):
        await sb.exec("true")


async def test_requests_are_never_resent(tmp_path):
    # a recording channel: every request id written is unique, and a failure is not retried
    channel = await ProcessChannel.spawn()
    sent: list[dict] = []
    orig = channel.send

    async def record(data: bytes):
        sent.extend(json.loads(line) for line in data.splitlines())
        await orig(data)

    channel.send = record
    sandbox = await AgentSandbox.connect(channel, id="x", name="x", spec=SandboxSpec())
    task = asyncio.create_task(sandbox.exec(f"echo started >> {tmp_path}/log; sleep 30"))
    await asyncio.sleep(0.3)
    channel.proc.kill()
    with pytest.raises(AgentError):
        await task
    execs = [m for m in sent if m.get("op") == "exec"]
    assert len(execs) == 1
    assert (tmp_path / "log").read_text() == "started\n"
    await sandbox.delete()


async def test_ping_is_fast(sb):
    times = sorted([await sb.ping() for _ in range(50)])
    assert times[25] < 0.05
    assert b64(b"x") == "eA=="


async def test_timeout_values(sb):
    import math

    from sandboxes import ConfigError

    with pytest.raises(ConfigError):
        await sb.exec("true", timeout=0)
    assert (await sb.exec("sleep 0.2; echo done", timeout=math.inf)).stdout == "done\n"


async def test_concurrent_mixed_stress(sb):
    async def one(i: int):
        kind = i % 4
        if kind == 0:
            r = await sb.exec(f"echo {i}")
            assert r.stdout == f"{i}\n"
        elif kind == 1:
            r = await sb.exec(f"(sleep 0.3; echo late) & echo {i}")
            assert r.stdout == f"{i}\n"
        elif kind == 2:
            r = await sb.exec("cat", stdin=f"in-{i}" * 1000)
            assert r.stdout == f"in-{i}" * 1000
        else:
            r = await sb.exec(f"echo {i}; sleep 5", timeout=0.3)
            assert r.timed_out and r.stdout == f"{i}\n"

    await asyncio.gather(*(one(i) for i in range(80)))
    await asyncio.sleep(0.5)  # leftovers of kind 1 finish and their pipes close
    await asyncio.gather(*(one(i) for i in range(0, 40, 2)))
    assert await sb.alive()


async def test_sigterm_to_agent_kills_its_commands(tmp_path):
    """A remote API may end the agent with SIGTERM without closing stdin: its
    commands' process groups must go down with it."""
    channel = await ProcessChannel.spawn(cwd=str(tmp_path))
    sandbox = await AgentSandbox.connect(channel, id="local", name="local", spec=SandboxSpec())
    try:
        bg = await sandbox.start_process(["sleep", "300"])
        stream = sandbox.exec_stream("echo $$; exec sleep 300", timeout=600)
        first = await stream.__anext__()
        running = asyncio.create_task(stream.__anext__())
        pids = [bg.pid, int(first.text.split()[0])]
        assert all(pid_alive(p) for p in pids)
        channel.proc.send_signal(15)
        with pytest.raises(AgentError):
            await asyncio.wait_for(running, 10)
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not any(pid_alive(p) for p in pids)
    finally:
        await sandbox.delete()


def test_sigterm_while_the_reading_thread_holds_the_process_table(tmp_path):
    """The reading thread answers a poll or a kill itself, inside `with _procs_lock`; a SIGTERM
    arriving there ran a handler that took the same lock: the agent ignored SIGTERM for good
    and its commands lived on. The handler takes no lock: the commands die, the agent exits."""
    code = textwrap.dedent("""
        import signal, subprocess, time
        from sandboxes.agent import agent_source
        ns = {"__name__": "vf_agent"}
        exec(compile(agent_source(), "vf-sandbox-agent", "exec"), ns)
        signal.signal(signal.SIGTERM, ns["_on_term"])
        command = subprocess.Popen(["sleep", "300"], start_new_session=True)
        ns["_groups"].add(command.pid)
        with ns["_procs_lock"]:
            print(command.pid, flush=True)
            time.sleep(60)
    """)
    agent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT)
    try:
        command = int(agent.stdout.readline())
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(20)
    finally:
        agent.kill()
    assert code == 128 + signal.SIGTERM, agent.stderr.read()[-2000:]
    deadline = time.monotonic() + 5
    while pid_alive(command) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(command)


# ---------------------------------------------------------------- the host agent's view of a cell
def _cells_module() -> dict:
    """The cells agent's definitions (program.py + cells_program.py), not run."""
    ns: dict = {"__name__": "vf_cells_agent"}
    exec(compile(agent_source(cells=True), "vf-sandbox-agent", "exec"), ns)
    return ns


def test_a_cells_lines_are_checked_and_tagged_by_the_channel():
    ns = _cells_module()
    cell, violation = ns["Cell"](7, None, None), ns["CellViolation"]
    cell.expect({"op": "exec", "id": 3, "shell": "true", "limit": 1024})
    cell.expect({"op": "read_file", "id": 4, "path": "/x"})
    lines = cell.lines(b'{"id":3,"ev":"result","exit_code":3}\n{"id":4,"ev":"chunk","data":"eA=="}\n{"id":4,')
    assert [json.loads(cell.check(x)) for x in lines] == [
        {"cell": 7, "id": 3, "ev": "result", "exit_code": 3}, {"cell": 7, "id": 4, "ev": "chunk", "data": "eA=="}]
    assert cell.lines(b'"ev":"result"}\n') == [b'{"id":4,"ev":"result"}']
    cell.check(b'{"id":4,"ev":"result"}')
    for bad in (b'{"cell":1,"id":3,"ev":"result"}',  # another cell's id: never routed by content
                b'{"id":0,"ev":"gone"}', b'{"id":0,"ev":"hello"}', b"\x00garbage", b"[1]", b'{"id":"3","ev":"result"}',
                b'{"id":3,"ev":"result"}'):  # request 3 was answered already
        with pytest.raises(violation):
            cell.check(bad)
    # flow control: chunks beyond the window with no ack end the cell, acked ones do not
    cell.expect({"op": "get_tar", "id": 5, "path": "/"})
    chunk = json.dumps({"id": 5, "ev": "chunk", "data": b64(b"x" * (1 << 20))}).encode()
    for _ in range(5):
        cell.check(chunk)
    cell.expect({"op": "ack", "id": 5, "bytes": 5 << 20})
    for _ in range(5):
        cell.check(chunk)
    with pytest.raises(violation, match="flow control"):
        for _ in range(3):
            cell.check(chunk)


def test_a_cells_endless_line_is_refused_in_linear_time():
    ns = _cells_module()
    cell = ns["Cell"](1, None, None)
    piece = b"x" * 65536
    t0 = time.perf_counter()
    with pytest.raises(ns["CellViolation"], match="a line over"):
        for _ in range(10_000):
            cell.lines(piece)
    assert len(cell.buf) <= ns["LINE_MIN"]  # bounded: never more than one line's limit held
    assert time.perf_counter() - t0 < 2.0
    cell.expect({"op": "exec", "id": 1, "limit": 8 << 20})  # a larger output limit allows longer lines
    assert cell.max_line >= 3 * (8 << 20)


async def test_what_a_process_wrote_is_readable_once_wait_reports_its_exit(sb):
    """`wait` returns after the agent's pumps took what the process wrote (EOF on its
    pipes): a read right after it sees all of it. Fresh-clone CI at load ~100 once read
    36 KiB of 64 (the stderr pump not yet scheduled). 24 writers at once beside 8 busy loops make the
    window wide; a leftover child holding the pipes delays `wait` by at most ~1 s, writing or not."""
    size = 60_000
    hogs = [await sb.start_process("while :; do :; done") for _ in range(8)]  # the pumps wait for a CPU
    procs = [await sb.start_process(f"head -c {size} /dev/zero | tr '\\0' o; head -c {size} /dev/zero | tr '\\0' e >&2")
             for _ in range(24)]
    for p in procs:
        assert (await p.wait(30)).exit_code == 0
    for p in procs:
        out, err = await p.read_output()
        assert (len(out), len(err)) == (size, size)
    for h in hogs:
        await h.kill()
    for cmd in ("sleep 30 & echo parent-done", "yes > /dev/stderr & echo parent-done"):
        p = await sb.start_process(cmd)
        t0 = time.monotonic()
        assert (await p.wait(30)).exit_code == 0
        assert time.monotonic() - t0 < 5, cmd
        out, _ = await p.read_output()
        assert out == "parent-done\n", cmd
        await p.kill()


def test_wait_returns_after_the_pumps_took_the_output():
    """op_wait drains: with the pump threads held back 0.3 s (as a loaded machine does),
    the buffers hold every byte once `wait` answers; a leftover child that keeps the pipe
    open costs `wait` its grace only."""
    import subprocess

    ns: dict = {"__name__": "vf_agent"}
    exec(compile(agent_source(cells=False), "vf-sandbox-agent", "exec"), ns)

    class LatePumps(ns["Background"]):
        def _pump(self, name, pipe):
            time.sleep(0.3)
            super()._pump(name, pipe)

    for cmd, want, most in (("head -c 60000 /dev/zero; head -c 5000 /dev/zero >&2", (60000, 5000), 2.0),
                            ("echo hi; sleep 30 &", (3, 0), 2.0)):
        proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        bg = LatePumps(proc, 1 << 20)
        ns["_procs"][proc.pid] = bg
        t0 = time.monotonic()
        status = ns["op_wait"]({"pid": proc.pid, "timeout": 10}, None)
        assert status["exit_code"] == 0 and time.monotonic() - t0 < most
        assert (len(bg.out["stdout"]), len(bg.out["stderr"])) == want, cmd
        try:
            os.killpg(proc.pid, 9)  # the leftover sleep
        except ProcessLookupError:
            pass


def test_a_process_whose_pumps_cannot_start_is_killed():
    """A background process that fills the pids limit before the agent starts the threads
    reading its output gets no handle: the agent kills its whole group and says why (it
    used to stay behind, running, with nothing to reach it). An exec whose stdin writer
    cannot start likewise: its group killed, a failed start (126) saying why."""
    import subprocess
    import types

    ns: dict = {"__name__": "vf_agent"}
    exec(compile(agent_source(cells=False), "vf-sandbox-agent", "exec"), ns)

    class NoThread:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            raise RuntimeError("can't start new thread")

    import threading

    ns["threading"] = types.SimpleNamespace(Thread=NoThread, Condition=threading.Condition)
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    time.sleep(0.2)  # the group holds two sleeps
    with pytest.raises(RuntimeError, match="pids limit.*it was killed"):
        ns["Background"](proc, 1 << 20)
    assert proc.poll() is not None
    group_gone(proc.pid)

    marker = f"vf-stdin-{os.getpid()}"
    res = ns["op_exec"]({"shell": f"sleep 300 & exec -a {marker} sleep 300", "stdin": "aGk="}, ns["Request"](1))
    assert res["exit_code"] == 126 and "pids limit" in base64.b64decode(res["stderr_head"]).decode(), res
    assert ns["_groups"] == set()
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the exec's processes outlived the refusal"
        time.sleep(0.05)


def group_gone(pgid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("the process group outlived the refusal")
