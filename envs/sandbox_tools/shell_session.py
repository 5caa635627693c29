"""`ShellSession`: a persistent bash inside a sandbox, one round trip per command.

How it works (no prompt scraping, no pty, no pexpect):

* bash runs as a background process reading commands from its stdin pipe,
  with stderr merged into stdout (`exec 2>&1`) so output interleaves as on a
  terminal.
* Each command is sent as ONE line: `builtin source /dev/stdin <<< $'...'`
  (its text ANSI-C quoted), then the `printf` builtin writes an end frame
  `\x1e<exit status>|<session>.<seq>\x1e\n`. The host reads with
  `read_output(until="|<session>.<seq>\x1e\n")`, waited inside the sandbox.
  `source` reads the whole here-string before running it (so commands that
  read stdin see EOF, never the protocol) and runs it in the shell's own
  context: `cd`, exports, functions and even `declare` stay global. Quoting
  means a command can never swallow the frame that follows it, whatever
  quotes or heredocs it leaves open. No file is written and nothing forks.
* Timeout: SIGINT to the shell's process group. A `trap` makes bash abandon
  the rest of the command (`return` from the sourced file) and print the
  frame, so the shell and its state survive. If no frame arrives within the
  grace period (a builtin busy loop, a program ignoring SIGINT), the group is
  killed and a fresh shell started; the result says the state was reset.
* The shell exiting (`exit`, `set -e`) is reported and a fresh shell started.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Sequence

from pydantic import BaseModel

from sandboxes.errors import ConfigError
from sandboxes.interface import BackgroundProcess

from .common import DEFAULT_OUTPUT_LIMIT, GUARD_SECONDS, ProcessStarter, cap_text, guarded, kill_process, send_and_read

_QUOTE = {ord("\\"): "\\\\", ord("'"): "\\'", ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r", 0: ""}
_QUOTE.update({c: f"\\x{c:02x}" for c in list(range(1, 32)) + [127] if c not in _QUOTE})


def ansi_c_quote(text: str) -> str:
    """`text` as a bash `$'...'` word (NUL bytes dropped: bash strings cannot hold them)."""
    return "$'" + text.translate(_QUOTE) + "'"


class ShellResult(BaseModel):
    """What one command did in the persistent shell."""

    output: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    interrupted: bool = False
    restarted: bool = False
    dropped_bytes: int = 0
    duration: float = 0.0
    note: str | None = None

    def render(self) -> str:
        """The text shown to the model."""
        parts = [self.output] if self.output else []
        if self.note:
            parts.append(f"[{self.note}]")
        elif self.exit_code not in (0, None):
            parts.append(f"[exit code {self.exit_code}]")
        text = "\n".join(p.rstrip("\n") for p in parts)
        return text or "(no output)"


class ShellSession:
    """One persistent bash driven through a `BackgroundProcess`."""

    def __init__(
        self,
        start: ProcessStarter,
        *,
        argv: Sequence[str] = ("bash", "--noprofile", "--norc"),
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        interrupt_grace: float = 2.0,
        startup_timeout: float = 20.0,
    ) -> None:
        self._start = start
        self._argv = list(argv)
        self._env = env
        self._cwd = cwd
        self.output_limit = output_limit
        self.interrupt_grace = interrupt_grace
        self.startup_timeout = startup_timeout
        self._proc: BackgroundProcess | None = None
        self._session = os.urandom(4).hex()
        self._seq = 0
        self._lock = asyncio.Lock()
        self.restarts = 0

    @property
    def process(self) -> BackgroundProcess | None:
        return self._proc

    def _frame(self, seq: int) -> str:
        return f"|{self._session}.{seq}\x1e\n"

    def _line(self, command: str, seq: int) -> str:
        return (
            f"builtin source /dev/stdin <<< {ansi_c_quote(command)}; "
            f"builtin printf '\\036%d{self._frame(seq)[:-2]}\\036\\n' \"$?\"\n"
        )

    async def start(self) -> None:
        """Start (or restart) the shell and wait until it answers."""
        await self._kill()
        self._proc = await guarded(self._start(self._argv, self._env), self.startup_timeout + GUARD_SECONDS, "start bash")
        cd = f"builtin cd {ansi_c_quote(self._cwd)} 2>/dev/null; " if self._cwd else ""
        init = (
            "exec 2>&1; "
            "trap 'builtin break 1000000 2>/dev/null; builtin return 130 2>/dev/null' INT; "
            f"{cd}unset HISTFILE; "
        )
        self._seq += 1
        seq = self._seq
        await guarded(self._proc.write_stdin(init + self._line(":", seq)), GUARD_SECONDS, "start bash")
        out, _ = await guarded(
            self._proc.read_output(until=self._frame(seq), timeout=self.startup_timeout),
            self.startup_timeout + GUARD_SECONDS,
            "start bash",
        )
        if self._frame(seq) not in out:
            status = await self._proc.poll()
            await self._kill()
            if not status.running and status.exit_code == 127:
                raise ConfigError(f"no bash in the sandbox image ({out.strip()[-200:]})")
            from sandboxes.errors import ServerStartError

            raise ServerStartError(f"bash did not start in the sandbox: {out.strip()[-500:]!r}")

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await kill_process(proc)

    async def close(self) -> None:
        await self._kill()

    @staticmethod
    def _split(out: str, frame: str) -> tuple[str, int | None]:
        end = out.find(frame)
        if end < 0:
            return out, None
        start = out.rfind("\x1e", 0, end)
        try:
            code = int(out[start + 1 : end])
        except ValueError:
            code = None
        return out[:start], code

    async def run(self, command: str, timeout: float) -> ShellResult:
        """Run `command` in the shell; never raises for what the command did.

        Raises InfraError (AgentError...) when the sandbox stops answering."""
        async with self._lock:
            if self._proc is None:
                await self.start()
            assert self._proc is not None
            proc = self._proc
            self._seq += 1
            seq = self._seq
            frame = self._frame(seq)
            t0 = time.monotonic()
            out = await send_and_read(proc, self._line(command, seq), frame, timeout, "a command")
            res = ShellResult()
            if frame in out:
                text, res.exit_code = self._split(out, frame)
            else:
                text = out
                status = await guarded(proc.poll(), GUARD_SECONDS, "poll bash")
                if status.running and time.monotonic() - t0 < timeout * 0.9:
                    # the read ended early: the process is exiting; let it finish
                    status = await guarded(proc.wait(2.0), GUARD_SECONDS, "wait bash")
                if not status.running:
                    res.restarted = True
                    res.exit_code = status.exit_code
                    res.note = (
                        f"the shell exited (exit code {status.exit_code}); a fresh shell was started: "
                        "working directory, variables and functions were reset"
                    )
                else:
                    res.timed_out = True
                    await guarded(proc.kill(signal.SIGINT, group=True), GUARD_SECONDS, "interrupt")
                    more, _ = await guarded(
                        proc.read_output(until=frame, timeout=self.interrupt_grace),
                        self.interrupt_grace + GUARD_SECONDS,
                        "interrupt",
                    )
                    if frame in more:
                        tail, res.exit_code = self._split(more, frame)
                        text += tail
                        res.interrupted = True
                        res.note = f"command timed out after {timeout:g}s and was interrupted; the shell is still usable"
                    else:
                        text += more
                        res.restarted = True
                        res.note = (
                            f"command timed out after {timeout:g}s and did not stop on interrupt; the shell was "
                            "restarted: working directory, variables and functions were reset"
                        )
                if res.restarted:
                    self.restarts += 1
                    await self.start()
            res.duration = time.monotonic() - t0
            # error messages name the sourced file; show them as bash's own
            text = text.replace("/dev/stdin: line ", "bash: line ")
            res.output, res.dropped_bytes = cap_text(text, self.output_limit)
            return res
