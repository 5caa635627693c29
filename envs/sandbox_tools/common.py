"""Shared pieces of the host-side drivers: the process starter signature,
bounded head+tail text, the guard that turns a silent sandbox into an
`AgentError`, and the source of the in-sandbox programs (prelude included)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from pathlib import Path

from sandboxes.cancel import cancel_and_settle
from sandboxes.errors import AgentError
from sandboxes.interface import BackgroundProcess
from sandboxes.program_files import program_source
from sandboxes.results import ExecResult, ProcessStatus

ProcessStarter = Callable[[Sequence[str], "dict[str, str] | None"], Awaitable[BackgroundProcess]]
"""`start(argv, env) -> BackgroundProcess`: `sandbox.start_process` or `LocalProcess.start`."""

DEFAULT_OUTPUT_LIMIT = 16384
"""Bytes of output a tool call shows the model (half head, half tail)."""

GUARD_SECONDS = 30.0
"""Extra seconds granted to the backend beyond a wait it was asked to bound itself."""


@lru_cache(maxsize=None)
def in_sandbox_source(program: str) -> str:
    """Source of the in-sandbox program `program` (in sandboxes/programs/, e.g.
    "repl_worker.py") with `prelude.py` (beside this module) in front of it, ready for `python3 -c`."""
    return (Path(__file__).parent / "prelude.py").read_text() + "\n\n" + program_source(program)


def cap_text(text: str, limit: int) -> tuple[str, int]:
    """Keep `limit//2` bytes of head and of tail (UTF-8); returns (text, bytes cut)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, 0
    half = limit // 2
    cut = len(data) - 2 * half
    head = data[:half].decode("utf-8", "ignore")
    tail = data[-half:].decode("utf-8", "ignore")
    return f"{head}\n[... {cut} bytes cut ...]\n{tail}", cut


def render_exec(result: "ExecResult", limit: int, timeout_s: float) -> str:
    """What a one-exec `bash` tool shows the model: the output capped by `cap_text`,
    then a note for a timeout or a non-zero exit; "(no output)" when there is none.
    SandboxEnv (`persistent_shell=False`) and the v1 harness's bash tool share it."""
    text, _ = cap_text(result.output, limit)
    text = text.rstrip("\n")
    if result.timed_out:
        text += f"\n[command timed out after {timeout_s:g}s]"
    elif result.exit_code not in (0, None):
        text += f"\n[exit code {result.exit_code}]"
    return text.strip("\n") or "(no output)"


async def guarded(awaitable: Awaitable, seconds: float, what: str):
    """Await with a host-side deadline; past it the sandbox is declared unresponsive (InfraError)."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except asyncio.TimeoutError:
        raise AgentError(f"the sandbox did not answer {what} within {seconds:.0f}s") from None


async def start_local(argv: Sequence[str], env: dict[str, str] | None = None) -> BackgroundProcess:
    """A `ProcessStarter` running the program as a host subprocess (tests, benchmarks)."""
    from .local_process import LocalProcess

    return await LocalProcess.start(argv, env=env)


async def kill_process(proc: BackgroundProcess) -> None:
    """SIGKILL the process group and reap it; never raises (the sandbox may be gone already)."""
    try:
        await guarded(proc.kill(signal.SIGKILL, group=True), 10, "kill")
        await guarded(proc.wait(5), 10, "wait")
    except Exception:
        pass
    close = getattr(proc, "close", None)  # host processes: release the pipes too
    if close is not None:
        try:
            await close()
        except Exception:
            pass


class ProcessSession:
    """Base of the persistent-process sessions (ReplSession, ShellSession): the
    process handle, killing it and closing."""

    _proc: BackgroundProcess | None = None

    @property
    def process(self) -> BackgroundProcess | None:
        return self._proc

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await kill_process(proc)

    async def close(self) -> None:
        await self._kill()


async def status_after_missing_reply(proc: BackgroundProcess, t0: float, timeout: float, program: str) -> ProcessStatus:
    """The process's status once a read for its reply (started at `t0`, bounded by
    `timeout`) ended without it. A read that ended well before its timeout means the
    process is exiting: it gets 2 s to finish."""
    status = await guarded(proc.poll(), GUARD_SECONDS, f"poll {program}")
    if status.running and time.monotonic() - t0 < timeout * 0.9:
        # the read ended early: the process is exiting; let it finish
        status = await guarded(proc.wait(2.0), GUARD_SECONDS, f"wait {program}")
    return status


async def interrupt_and_read(proc: BackgroundProcess, until: str, grace: float, *, group: bool) -> str:
    """SIGINT the process (its whole group with `group`) and read its stdout up to
    `until` for at most `grace` seconds."""
    await guarded(proc.kill(signal.SIGINT, group=group), GUARD_SECONDS, "interrupt")
    more, _ = await guarded(proc.read_output(until=until, timeout=grace), grace + GUARD_SECONDS, "interrupt")
    return more


async def send_and_read(proc: BackgroundProcess, data: str, until: str, timeout: float, what: str) -> str:
    """Write `data` to the process's stdin and read its stdout up to `until`, pipelined:
    both requests are in flight at once (the agent serves requests concurrently), so a
    call costs one round trip instead of two."""
    writer = asyncio.ensure_future(proc.write_stdin(data))
    await asyncio.sleep(0)  # let the write go out first
    try:
        out, _ = await guarded(proc.read_output(until=until, timeout=timeout), timeout + GUARD_SECONDS, what)
    except BaseException:
        await cancel_and_settle([writer])
        raise
    await guarded(writer, GUARD_SECONDS, what)
    return out


def find_frame(out: str, rid: int) -> dict | None:
    """The JSON reply framed `<json>\\x1e<rid>\\n` in `out` (frames of other ids are stale: ignored)."""
    import json

    tag = str(rid)
    for line in out.split("\n"):
        body, sep, got = line.rpartition("\x1e")
        if sep and got == tag:
            try:
                return json.loads(body)
            except ValueError:
                return None
    return None
