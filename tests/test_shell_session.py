"""The persistent bash driver (`envs.sandbox_tools.shell_session`) on host
subprocesses: the same program and protocol it runs inside a sandbox."""

from __future__ import annotations

import pytest

from envs.sandbox_tools.common import cap_text, start_local
from envs.sandbox_tools.local_process import LocalProcess
from envs.sandbox_tools.shell_session import ShellSession, ansi_c_quote


def head_tail_starter(limit: int):
    """Bash as SandboxEnv starts it: the process buffer keeps each command's head and tail."""
    return lambda argv, env: LocalProcess.start(argv, env=env, buffer_limit=limit, keep="head_tail")


@pytest.fixture
async def shell():
    s = ShellSession(head_tail_starter(16384), interrupt_grace=1.0)
    yield s
    await s.close()


async def test_state_persists_across_calls(shell):
    r = await shell.run("cd /usr && export FOO=bar && greet() { echo hello $1; } && declare -A m=([k]=v)", 5)
    assert r.exit_code == 0, r
    r = await shell.run("pwd; echo $FOO; greet you; echo ${m[k]}", 5)
    assert r.output == "/usr\nbar\nhello you\nv\n"


async def test_exit_status_and_stderr_merged(shell):
    r = await shell.run("echo out; echo err >&2; false", 5)
    assert r.exit_code == 1
    assert r.output == "out\nerr\n"
    assert "[exit code 1]" in r.render()
    assert (await shell.run("exit_code_probe() { return 7; }; exit_code_probe", 5)).exit_code == 7


@pytest.mark.parametrize(
    "cmd, expected",
    [
        ("echo 'it''s' \"q\\\"uote\" $'tab\\there'", "its q\"uote tab\there\n"),
        ("cat <<'EOF'\nline1\n  $NOT_EXPANDED\nEOF", "line1\n  $NOT_EXPANDED\n"),
        ("printf 'no newline'", "no newline"),
        ("echo ünïcødé ✓", "ünïcødé ✓\n"),
        ("cat", ""),  # stdin is /dev/null: never hangs, never eats the protocol
    ],
)
async def test_quoting_and_stdin(shell, cmd, expected):
    r = await shell.run(cmd, 5)
    assert r.output == expected and r.exit_code == 0, r


async def test_unterminated_quote_cannot_swallow_the_frame(shell):
    r = await shell.run("echo 'never closed", 5)
    assert r.exit_code == 2 and not r.timed_out
    assert "unexpected EOF" in r.output and "/dev/stdin" not in r.output
    assert (await shell.run("echo fine", 5)).output == "fine\n"


async def test_timeout_interrupts_foreground_job_and_keeps_state(shell):
    await shell.run("cd /tmp; X=kept", 5)
    r = await shell.run("echo partial; sleep 60; echo never", 1)
    assert r.timed_out and r.interrupted and not r.restarted
    assert r.exit_code == 130
    assert "partial" in r.output and "never" not in r.output
    assert "timed out after 1s" in r.render()
    r = await shell.run("pwd; echo $X", 5)
    assert r.output == "/tmp\nkept\n" and shell.restarts == 0


async def test_busy_builtin_loop_is_stopped(shell):
    await shell.run("X=kept", 5)
    r = await shell.run("while :; do :; done", 1)
    assert r.timed_out and (r.interrupted or r.restarted), r
    expected = "unset\n" if r.restarted else "kept\n"
    assert (await shell.run("echo ${X:-unset}", 5)).output == expected


async def test_command_ignoring_sigint_restarts_shell(shell):
    await shell.run("X=lost", 5)
    r = await shell.run("bash -c 'trap \"\" INT; sleep 60'", 1)
    assert r.timed_out and r.restarted and not r.interrupted
    assert "reset" in r.render()
    assert (await shell.run("echo ${X:-unset}", 5)).output == "unset\n"
    assert shell.restarts == 1


async def test_exit_restarts_shell(shell):
    r = await shell.run("exit 4", 5)
    assert r.restarted and r.exit_code == 4 and "exited" in r.render()
    assert (await shell.run("echo again", 5)).output == "again\n"


async def test_background_job_survives_interrupt(shell):
    await shell.run("sleep 30 & echo $! > /tmp/.vf-test-bg-$$; BG=$!", 5)
    await shell.run("sleep 60", 1)  # interrupted
    r = await shell.run("kill -0 $BG && echo alive; kill $BG", 5)
    assert r.output.startswith("alive"), r


async def test_huge_output_keeps_head_and_tail_in_bounded_memory():
    """A command printing far more than any buffer keeps its head and its tail; the cut is
    marked and counted (the OOM-kill counter bash reports in its frame is checked on
    Docker: tests/test_sandbox_env.py)."""
    s = ShellSession(head_tail_starter(1000), output_limit=1000)
    try:
        r = await s.run("echo START; head -c 30000000 /dev/zero | tr '\\0' x; echo; echo END", 30)
        assert r.output.startswith("START\nxxx") and r.output.endswith("xxx\nEND\n"), r.output[:80]
        assert "bytes cut ...]" in r.output and r.dropped_bytes > 29_990_000 and len(r.output) < 1200
        assert (await s.run("echo ok", 5)).output == "ok\n"
    finally:
        await s.close()


async def test_a_buffer_keeping_the_newest_bytes_marks_the_cut_at_the_start():
    """A starter without head_tail (the default buffer): the output's start is lost, and the
    result says so rather than passing a middle piece off as the head."""
    s = ShellSession(start_local, output_limit=1000)
    try:
        r = await s.run("echo START; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END", 30)
        assert r.output.startswith("\n[... ") and "START" not in r.output and r.output.endswith("xxx\nEND\n")
    finally:
        await s.close()


async def test_output_capped_head_and_tail():
    s = ShellSession(start_local, output_limit=1000)
    try:
        r = await s.run("echo START; yes middle | head -n 20000; echo END", 10)
        assert r.dropped_bytes > 100_000
        assert r.output.startswith("START\n") and r.output.endswith("END\n")
        assert f"[... {r.dropped_bytes} bytes cut ...]" in r.output
        assert len(r.output.encode()) < 1100
    finally:
        await s.close()


def test_cap_text_keeps_utf8_valid():
    text, cut = cap_text("é" * 1000, 101)
    assert cut == 2000 - 100 and "bytes cut" in text
    text.encode("utf-8")


def test_ansi_c_quote_roundtrip():
    import subprocess

    tricky = "a'b\"c\\d\n\te$f`g`\x01\x7f ✓"
    out = subprocess.run(["bash", "-c", f"printf '%s' {ansi_c_quote(tricky)}"], capture_output=True, text=True).stdout
    assert out == tricky


async def test_the_framing_functions_hold_against_the_model(shell):
    """The figures are taken by two read-only functions defined once per shell (a pipe
    is read one byte per read(2): the command line stays short); the model cannot redefine
    or unset them, and a shell that lost them (`exec bash`) still answers with the status."""
    r = await shell.run("__vf_post() { echo forged; }; unset -f __vf_pre; echo after", 5)
    assert "forged" not in r.output and "after" in r.output, r
    r = await shell.run("exit_probe() { return 3; }; exit_probe", 5)
    assert r.exit_code == 3 and r.output == "", r
    await shell.run("exec bash --noprofile --norc", 5)
    r = await shell.run("echo nested; false", 5)
    assert r.output == "nested\n" and r.exit_code == 1 and not r.timed_out, r


async def test_a_command_line_stays_short(shell):
    """Each command costs its own text plus a fixed frame of ~150 bytes (the figures live
    in the functions `start` defines)."""
    data, _ = shell._request("true", 7)
    assert len(data) < 200, data
