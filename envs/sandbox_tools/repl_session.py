"""`ReplSession`: the host-side driver of the persistent Python worker
(`sandboxes/programs/repl_worker.py`, started inside the sandbox with `python3 -u -c <source>`).

One `python(code)` call is one request line written to the worker's stdin
and one `read_output(until="\\x1e<id>\\n")` waited inside the sandbox. Every
response names its request id; frames of other ids (a late answer to a cell
that was given up on) are discarded, so pairing never desynchronises.

Timeout: SIGINT to the worker only (KeyboardInterrupt in the cell; the
namespace survives), then wait `interrupt_grace` for the cell's frame. If it
does not come (C code ignoring signals, a cell catching KeyboardInterrupt)
or the worker died, the worker is killed and restarted, and the result says
that every variable was lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Literal

from pydantic import BaseModel

from sandboxes.errors import ConfigError, ServerStartError
from sandboxes.interface import BackgroundProcess

from .common import (
    DEFAULT_OUTPUT_LIMIT,
    GUARD_SECONDS,
    ProcessSession,
    ProcessStarter,
    cap_text,
    find_frame,
    guarded,
    in_sandbox_source,
    interrupt_and_read,
    send_and_read,
    status_after_missing_reply,
)

FRAME_END = "\x1e"


def worker_source() -> str:
    """The worker program's source text (shipped beside this module)."""
    return in_sandbox_source("repl_worker.py")


class CellResult(BaseModel):
    """What one cell did."""

    status: Literal["ok", "error", "interrupted", "lost"] = "ok"
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    traceback: str | None = None
    execution_count: int | None = None
    timed_out: bool = False
    restarted: bool = False
    dropped_bytes: int = 0
    duration: float = 0.0
    oom_kills: int | None = None
    note: str | None = None

    def render(self) -> str:
        """The text shown to the model (stdout, stderr, then Out[n] or the traceback)."""
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("stderr:\n" + self.stderr.rstrip("\n"))
        if self.traceback:
            parts.append(self.traceback.rstrip("\n"))
        elif self.result is not None:
            parts.append(f"Out[{self.execution_count}]: {self.result}")
        if self.note:
            parts.append(f"[{self.note}]")
        return "\n".join(parts) or "(no output)"


class ReplSession(ProcessSession):
    """One persistent Python worker driven through a `BackgroundProcess`."""

    def __init__(
        self,
        start: ProcessStarter,
        *,
        python: str = "python3",
        env: dict[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        interrupt_grace: float = 3.0,
        startup_timeout: float = 30.0,
    ) -> None:
        self._start = start
        self._python = python
        self._env = env
        self.output_limit = output_limit
        self.interrupt_grace = interrupt_grace
        self.startup_timeout = startup_timeout
        self._proc: BackgroundProcess | None = None
        self._id = 0
        self._lock = asyncio.Lock()
        self.restarts = 0
        self.ready_wait = 0.0

    async def start(self) -> None:
        """Start (or restart) the worker and wait for its ready frame."""
        await self._kill()
        t0 = time.monotonic()
        argv = [self._python, "-u", "-c", worker_source()]
        self._proc = await guarded(self._start(argv, self._env), self.startup_timeout + GUARD_SECONDS, "start python")
        out, err = await guarded(
            self._proc.read_output(until=f"{FRAME_END}0\n", timeout=self.startup_timeout),
            self.startup_timeout + GUARD_SECONDS,
            "start python",
        )
        if self._find(out, 0) is None:
            status = await self._proc.poll()
            await self._kill()
            detail = (err or out).strip()[-500:]
            if not status.running and status.exit_code in (126, 127):
                raise ConfigError(f"no {self._python} in the sandbox image: {detail}")
            raise ServerStartError(f"the Python worker did not start: {detail!r}")
        self.ready_wait = time.monotonic() - t0

    @staticmethod
    def _find(out: str, rid: int) -> dict | None:
        """The response frame of request `rid` in `out` (other frames are stale: dropped)."""
        return find_frame(out, rid)

    async def run(self, code: str, timeout: float) -> CellResult:
        """Run one cell; never raises for what the cell did. InfraError when the sandbox stops answering."""
        async with self._lock:
            if self._proc is None:
                await self.start()
            assert self._proc is not None
            proc = self._proc
            self._id += 1
            rid = self._id
            until = f"{FRAME_END}{rid}\n"
            t0 = time.monotonic()
            line = json.dumps({"id": rid, "code": code, "max_output": self.output_limit}) + "\n"
            out = await send_and_read(proc, line, until, timeout, "a cell")
            resp = self._find(out, rid)
            timed_out, note = False, None
            if resp is None:
                resp, timed_out, note = await self._recover_missing_reply(proc, rid, until, t0, timeout)
            if resp is None:  # the worker is lost: a fresh one, the cell's result with it
                self.restarts += 1
                await self.start()
                res = CellResult(status="lost", timed_out=timed_out, restarted=True, note=note)
            else:
                res = self._cell_result(resp, timed_out, note)
            res.duration = time.monotonic() - t0
            return res

    async def _recover_missing_reply(self, proc: BackgroundProcess, rid: int, until: str, t0: float,
                                     timeout: float) -> tuple[dict | None, bool, str]:
        """No reply to cell `rid`: the worker died, or the cell timed out and is interrupted.
        Returns (the reply, None when the worker is lost and must be restarted; whether the
        cell timed out; the note saying what happened)."""
        status = await status_after_missing_reply(proc, t0, timeout, "python")
        if not status.running:
            how = f"signal {status.signal}" if status.signal else f"exit code {status.exit_code}"
            return None, False, (
                f"the Python worker died ({how}); it was restarted and all variables and imports were lost"
            )
        more = await interrupt_and_read(proc, until, self.interrupt_grace, group=False)
        resp = self._find(more, rid)
        if resp is not None:
            return resp, True, f"cell timed out after {timeout:g}s and was interrupted; variables are kept"
        return None, True, (
            f"cell timed out after {timeout:g}s and did not stop on interrupt; the Python "
            "worker was restarted and all variables and imports were lost"
        )

    def _cell_result(self, resp: dict, timed_out: bool, note: str | None) -> CellResult:
        """The worker's reply as a CellResult (both streams' cut bytes summed, the result capped)."""
        res = CellResult(
            status=resp.get("status", "error"),
            stdout=resp.get("stdout") or "",
            stderr=resp.get("stderr") or "",
            result=resp.get("result"),
            traceback=resp.get("traceback"),
            execution_count=resp.get("execution_count"),
            dropped_bytes=int(resp.get("stdout_dropped") or 0) + int(resp.get("stderr_dropped") or 0),
            timed_out=timed_out,
            oom_kills=resp.get("oom_kills"),
            note=note,
        )
        if res.result is not None:
            res.result, cut = cap_text(res.result, self.output_limit)
        return res
