"""`ShellSession`: a persistent bash inside a sandbox, one round trip per command.

How it works (no prompt scraping, no pty, no pexpect):

* bash runs as a background process, stderr merged into stdout so output
  interleaves as on a terminal. The process is started with
  `keep="head_tail"` and the output limit (`start_process`): the agent's
  buffer keeps the head and the newest bytes of each command's output, so
  memory and the reply stay bounded however much a command prints, and the
  cut is marked and counted. Nothing but bash runs in the sandbox (no
  interpreter started per session), so any image with bash works.
* Each command is sent as ONE bash line: `builtin source /dev/stdin <<< $'...'`
  (its text ANSI-C quoted), then the `printf` builtin writes an end frame
  `\x1e<exit status>,<OOM kills>|<session>.<seq>\x1e\n` (the cgroup's OOM-kill
  counter, read with `read` from the cgroup file: builtins only). `source` reads the whole
  here-string before running it (commands that read stdin see EOF, never the
  protocol) and runs it in the shell's own context: `cd`, exports, functions
  and even `declare` stay global. Quoting means a command can never swallow
  the frame that follows it, whatever quotes or heredocs it leaves open. No
  file is written and nothing forks. The host waits for the frame inside the
  sandbox (`read_output(until=...)`), the write pipelined with the read.
* Timeout: SIGINT to the process group. A `trap` makes bash abandon the rest
  of the command (`return` from the sourced text) and print the frame, so
  the shell and its state survive. If no frame arrives within the grace
  period (a program ignoring SIGINT...), the group is killed and a fresh
  shell started; the result says the state was reset.
* The shell exiting (`exit`, `set -e`) is reported and a fresh shell started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Sequence

from pydantic import BaseModel

from sandboxes.errors import ConfigError, ServerStartError
from sandboxes.interface import BackgroundProcess

from .prelude import OOM_FILES
from .common import (
    DEFAULT_OUTPUT_LIMIT,
    GUARD_SECONDS,
    ProcessSession,
    ProcessStarter,
    cap_text,
    guarded,
    interrupt_and_read,
    send_and_read,
    status_after_missing_reply,
)

log = logging.getLogger(__name__)

PIDS_DIRS = ("/sys/fs/cgroup", "/sys/fs/cgroup/pids")  # cgroup v2, v1: pids.max / pids.current

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
    oom_kills: int | None = None
    pids_limit: bool = False  # the command left processes filling the sandbox's pids limit (a fork bomb)
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


_INIT = "trap 'builtin break 1000000 2>/dev/null; builtin return 130 2>/dev/null' INT; unset HISTFILE; "


class ShellSession(ProcessSession):
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
        self._last_oom: int | None = None
        self._last_pids_full = False
        self._last_bg = False  # the command left a background job running
        self._last_pids: int | None = None  # the sandbox's pids.current after it

    # ------------------------------------------------------------------ wire format
    def _end(self, seq: int) -> str:
        return f"|{self._session}.{seq}\x1e\n"

    def _functions(self) -> str:
        """Two read-only bash functions, defined once per shell (`start`), that take each
        command's figures with builtins only (nothing forks: a fork bomb may hold every pid).
        `__vf_pre` before the command: pids.events' `max` and pids.current, and `$!`.
        `__vf_post <status> <seq>` after it prints the reply's frame `<status>,<oom count>,
        <pids flooded>,<started a background job>,<pids.current>` and the end marker.
        Flooded: the count is at 90 % of the limit, or a fork failed at the limit since the
        command started (pids.events' `max` grew: a bomb's count can sit below 90 % while its
        forks fail) and more processes are left than at its start (beyond the agent's spare
        threads). Defined once because bash reads a pipe one byte per read(2): the figures
        spelled out on every command line cost ~0.7 ms of CPU per command in a sandbox."""
        pids, ooms = " ".join(PIDS_DIRS), " ".join(OOM_FILES)
        end = self._end(0)[:-3]  # "|<session>." + the seq argument
        return (
            "__vf_pre() { __vf_e0=; __vf_c0=; local __vf_f __vf_k __vf_v; "
            f"for __vf_f in {pids}; do [[ -r $__vf_f/pids.events ]] && "
            "{ while builtin read -r __vf_k __vf_v; do [[ $__vf_k == max ]] && __vf_e0=$__vf_v; "
            "done < $__vf_f/pids.events; builtin read -r __vf_c0 < $__vf_f/pids.current; builtin break; }; done; "
            "__vf_b=$!; builtin return 0; }; "
            "__vf_post() { local __vf_o= __vf_p= __vf_g= __vf_c= __vf_e= __vf_m= __vf_f __vf_k __vf_v; "
            "[[ $! != \"$__vf_b\" ]] && __vf_g=1; "
            f"for __vf_f in {ooms}; do [[ -r $__vf_f ]] && "
            "while builtin read -r __vf_k __vf_v; do [[ $__vf_k == oom_kill ]] && __vf_o=$__vf_v; "
            "done < $__vf_f; done; "
            f"for __vf_f in {pids}; do [[ -r $__vf_f/pids.max ]] && "
            "{ builtin read -r __vf_m < $__vf_f/pids.max; builtin read -r __vf_c < $__vf_f/pids.current; "
            "[[ $__vf_m =~ ^[0-9]+$ && $__vf_c =~ ^[0-9]+$ ]] && (( __vf_c * 10 >= __vf_m * 9 )) && __vf_p=1; "
            "[[ -r $__vf_f/pids.events ]] && while builtin read -r __vf_k __vf_v; do [[ $__vf_k == max ]] && "
            "__vf_e=$__vf_v; done < $__vf_f/pids.events; "
            "[[ $__vf_e =~ ^[0-9]+$ && $__vf_e0 =~ ^[0-9]+$ && $__vf_c =~ ^[0-9]+$ && $__vf_c0 =~ ^[0-9]+$ ]] && "
            "(( __vf_e > __vf_e0 && __vf_c > __vf_c0 + 2 )) && __vf_p=1; "
            "builtin break; }; done; "
            f"builtin printf '\\036%d,%s,%s,%s,%s{end}%s\\036\\n' \"$1\" \"$__vf_o\" \"$__vf_p\" \"$__vf_g\" "
            "\"$__vf_c\" \"$2\"; builtin return 0; }; builtin declare -fr __vf_pre __vf_post; "
        )

    def _line(self, command: str, seq: int, prefix: str = "", probe: bool = False) -> str:
        # the figures are taken by the functions `start` defined (`_functions`); a shell that
        # lost them (the model ran `exec bash`) still frames each reply, with its status only.
        # A probe (`_watch_background`) keeps the command's starting figures.
        end = self._end(seq)[:-2]
        run = "__vf_rc=0; " if probe else (
            f"__vf_pre 2>/dev/null; builtin source /dev/stdin <<< {ansi_c_quote(command)}; __vf_rc=$?; ")
        return (
            f"{prefix}{run}__vf_post \"$__vf_rc\" {seq} 2>/dev/null || "
            f"builtin printf '\\036%d,,,,{end}\\036\\n' \"$__vf_rc\"\n"
        )

    async def _watch_background(self, proc: BackgroundProcess, timeout: float) -> None:
        """The command left a background job: is it a fork bomb (the sandbox's pids count
        still climbing to its limit)? Builtin-only probes (0.1 s apart, 3 s at most) while
        the count climbs; `_last_pids_full` says what they found. A command that starts a
        server (its count steady) costs two probes: on a loaded machine a bomb's count can
        stand still for one."""
        before = self._last_pids or 0
        steady = 0
        for _ in range(30):
            await asyncio.sleep(0.1)
            self._seq += 1
            data, until = self._request(":", self._seq, probe=True)
            out = await send_and_read(proc, data, until, min(timeout, 10.0), "a probe")
            complete, _, _ = self._parse(out, self._seq)
            if not complete or self._last_pids_full or self._last_pids is None:
                return
            steady = steady + 1 if self._last_pids <= before else 0
            if steady >= 2:
                return
            before = max(before, self._last_pids)

    def _request(self, command: str, seq: int, prefix: str = "", probe: bool = False) -> tuple[str, str]:
        """(bytes to write, marker ending the reply) for command number `seq`."""
        return self._line(command, seq, prefix, probe), self._end(seq)

    def _parse(self, out: str, seq: int) -> tuple[bool, str, int | None]:
        """(complete, output, exit code) of reply `seq` in `out` (a shell that exited sends
        no frame: the caller finds it from the process's status)."""
        end = self._end(seq)
        i = out.find(end)
        if i < 0:
            return False, out, None
        start = out.rfind("\x1e", 0, i)
        status, _, rest = out[start + 1 : i].partition(",")
        oom, _, rest = rest.partition(",")
        full, _, rest = rest.partition(",")
        bg, _, pids = rest.partition(",")
        try:
            code = int(status)
        except ValueError:
            code = None
        self._last_oom = int(oom) if oom.isdigit() else None
        self._last_pids_full = full == "1"
        self._last_bg = bg == "1"
        self._last_pids = int(pids) if pids.isdigit() else None
        return True, out[:start], code

    def _mark_cut(self, proc: BackgroundProcess, out: str) -> tuple[str, int]:
        """Where the process's output buffer dropped bytes of this read (its middle with
        `keep="head_tail"`, its start otherwise), marked and counted."""
        dropped = proc.dropped_bytes[0]
        if not dropped:
            return out, 0
        at = proc.gap_at[0] or 0
        return f"{out[:at]}\n[... {dropped} bytes cut ...]\n{out[at:]}", dropped

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start (or restart) the shell and wait until it answers."""
        await self._kill()
        self._proc = await guarded(self._start(self._argv, self._env), self.startup_timeout + GUARD_SECONDS, "start bash")
        prefix = "exec 2>&1; "
        cd = f"builtin cd {ansi_c_quote(self._cwd)} 2>/dev/null; " if self._cwd else ""
        self._seq += 1
        seq = self._seq
        data, until = self._request(":", seq, prefix=prefix + _INIT + self._functions() + cd)
        out = await send_and_read(self._proc, data, until, self.startup_timeout, "start bash")
        complete, text, _ = self._parse(out, seq)
        if not complete:
            status = await self._proc.poll()
            await self._kill()
            if not status.running and status.exit_code == 127:
                raise ConfigError(f"no bash in the sandbox image ({text.strip()[-200:]})")
            raise ServerStartError(f"bash did not start in the sandbox: {(text or out).strip()[-500:]!r}")

    # ------------------------------------------------------------------ commands
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
            data, until = self._request(command, seq)
            self._last_oom = None
            self._last_pids_full = False
            t0 = time.monotonic()
            out, dropped = self._mark_cut(proc, await send_and_read(proc, data, until, timeout, "a command"))
            res = ShellResult()
            complete, text, res.exit_code = self._parse(out, seq)
            if complete and self._last_bg and not self._last_pids_full and self._last_pids is not None:
                await self._watch_background(proc, timeout)
            if complete and self._last_pids_full:
                await self._kill_process_flood(proc, res)
            elif not complete:
                text, more_cut = await self._recover_missing_reply(proc, res, out, text, seq, until, t0, timeout)
                dropped += more_cut
            return await self._finish_result(res, text, dropped, t0)

    async def _kill_process_flood(self, proc: BackgroundProcess, res: ShellResult) -> None:
        """The command "ended" but what it started fills the pids limit (a fork bomb returns 0 at
        once while its children hold every pid): not a success (exit 137, noted); its processes
        are killed and the shell is to be restarted."""
        res.pids_limit = res.restarted = True
        res.note = (f"the command exited {res.exit_code} but left processes filling the sandbox's "
                    "process limit (a fork bomb?): they were killed (exit 137) and the shell restarted: "
                    "working directory, variables and functions were reset")
        res.exit_code = 137
        for _ in range(10):  # the bomb forks while it is killed: SIGKILL its group until it is empty
            try:
                await guarded(proc.kill(signal.SIGKILL, group=True), GUARD_SECONDS, "kill")
            except Exception:  # noqa: BLE001 - the group is gone (or the sandbox): restart below
                break
            await asyncio.sleep(0.02)

    async def _recover_missing_reply(self, proc: BackgroundProcess, res: ShellResult, out: str, text: str, seq: int,
                                     until: str, t0: float, timeout: float) -> tuple[str, int]:
        """No end frame for command `seq`: the shell exited (to be restarted), or the command
        timed out and is interrupted (the shell survives when the frame then arrives, else it
        is to be restarted). Returns (the command's output, bytes cut from what was read since)."""
        status = await status_after_missing_reply(proc, t0, timeout, "bash")
        if not status.running:
            res.restarted = True
            res.exit_code = status.exit_code
            res.note = (
                f"the shell exited (exit code {status.exit_code}); a fresh shell was started: "
                "working directory, variables and functions were reset"
            )
            return text, 0
        res.timed_out = True
        more, more_cut = self._mark_cut(proc, await interrupt_and_read(proc, until, self.interrupt_grace, group=True))
        complete, text, code = self._parse(out + more, seq)
        if complete:
            res.exit_code = code
            res.interrupted = True
            res.note = f"command timed out after {timeout:g}s and was interrupted; the shell is still usable"
        else:
            res.restarted = True
            res.note = (
                f"command timed out after {timeout:g}s and did not stop on interrupt; the shell was "
                "restarted: working directory, variables and functions were reset"
            )
        return text, more_cut

    async def _finish_result(self, res: ShellResult, text: str, dropped: int, t0: float) -> ShellResult:
        """Restart the shell when the command cost it, then fill in the result: duration, the
        output (bash's error lines as its own, capped) and its cut bytes, the OOM-kill count."""
        if res.restarted:
            self.restarts += 1
            await self.start()
        res.duration = time.monotonic() - t0
        # error messages name the here-string; show them as bash's own
        text = text.replace("/dev/stdin: line ", "bash: line ")
        text, cut = cap_text(text, self.output_limit + 64)
        res.output, res.dropped_bytes = text, dropped + cut
        res.oom_kills = self._last_oom
        return res
