"""`LocalProcess`: a `BackgroundProcess` over a plain host subprocess.

It gives the in-sandbox programs (bash driver, Python worker) the same
contract they get inside a sandbox — stdin pipe, `read_output(until=,
timeout=)`, group kill — so their drivers can be tested and benchmarked on
the host without any backend. Output buffers are bounded like the agent's.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
from collections.abc import Sequence

from sandboxes.errors import ConfigError
from sandboxes.interface import BackgroundProcess
from sandboxes.results import ProcessStatus

DEFAULT_BUFFER_LIMIT = 1024 * 1024


class _Buffer:
    """Unread output of one stream, bounded as the agent's: when full the oldest bytes
    go, or (head_tail) the bytes after the first half; counted until the read that
    returns the cut, whose place in that text it reports."""

    def __init__(self, limit: int, head_tail: bool = False) -> None:
        self.data = bytearray()
        self.limit = limit
        self.head_tail = head_tail
        self.dropped = 0
        self.gap: int | None = None

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        extra = len(self.data) - self.limit
        if extra > 0 and self.head_tail:
            at = self.limit // 2
            del self.data[at:at + extra]
            self.gap = at if self.gap is None else self.gap
        elif extra > 0:
            del self.data[:extra]
            self.gap = 0
        self.dropped += max(0, extra)

    def take(self, cut: int) -> tuple[str, int | None, int]:
        """The first `cut` bytes as text, where in it the gap is (None: nothing cut there)
        and how many bytes were dropped there."""
        data = bytes(self.data[:cut])
        del self.data[:cut]
        gap, dropped = self.gap, self.dropped
        if gap is not None and gap > cut:  # the cut is in what stays buffered: reported later
            self.gap = gap - cut
            return data.decode("utf-8", "replace"), None, 0
        self.gap, self.dropped = None, 0
        if gap is None:
            return data.decode("utf-8", "replace"), None, 0
        head = data[:gap].decode("utf-8", "replace")
        return head + data[gap:].decode("utf-8", "replace"), len(head), dropped


class LocalProcess(BackgroundProcess):
    """A host subprocess in its own process group, with bounded stdout/stderr buffers."""

    def __init__(self, proc: asyncio.subprocess.Process, buffer_limit: int, keep: str = "newest") -> None:
        self._proc = proc
        self.pid = proc.pid
        self._out = _Buffer(buffer_limit, keep == "head_tail")
        self._err = _Buffer(buffer_limit, keep == "head_tail")
        self._changed = asyncio.Condition()
        self._eof = 0
        self._tasks = [
            asyncio.ensure_future(self._pump(proc.stdout, self._out)),
            asyncio.ensure_future(self._pump(proc.stderr, self._err)),
        ]

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        keep: str = "newest",
    ) -> "LocalProcess":
        if keep not in ("newest", "head_tail"):  # refused before anything starts, as the agent does
            raise ConfigError(f"keep must be newest or head_tail, not {keep!r}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:  # as the agent does: a program that cannot start is a usage error
            raise ConfigError(f"cannot start process: {exc}") from exc
        return cls(proc, buffer_limit, keep)

    async def _pump(self, stream: asyncio.StreamReader | None, buf: _Buffer) -> None:
        assert stream is not None
        while True:
            chunk = await stream.read(65536)
            async with self._changed:
                if chunk:
                    buf.add(chunk)
                else:
                    self._eof += 1
                self._changed.notify_all()
            if not chunk:
                return

    def _status(self) -> ProcessStatus:
        rc = self._proc.returncode
        if rc is None:
            return ProcessStatus(pid=self.pid, running=True)
        if rc < 0:
            return ProcessStatus(pid=self.pid, running=False, signal=-rc)
        return ProcessStatus(pid=self.pid, running=False, exit_code=rc)

    async def poll(self) -> ProcessStatus:
        return self._status()

    async def read_output(self, until: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        marker = until.encode() if until else None
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        async with self._changed:
            while marker is not None:
                if marker in self._out.data or self._eof >= 2:
                    break
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        await self._changed.wait()
                except asyncio.TimeoutError:
                    break
            cut = len(self._out.data)
            if marker is not None:
                i = self._out.data.find(marker)
                if i >= 0:
                    cut = i + len(marker)
            out, out_gap, out_dropped = self._out.take(cut)
            err, err_gap, err_dropped = self._err.take(len(self._err.data))
        seen = self.total_dropped_bytes
        self.dropped_bytes = (out_dropped, err_dropped)
        self.total_dropped_bytes = (seen[0] + out_dropped, seen[1] + err_dropped)
        self.gap_at = (out_gap, err_gap)
        return out, err

    async def write_stdin(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(data)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the process exited; poll() tells

    async def kill(self, signal: int = 9, group: bool = True) -> None:
        if self._proc.returncode is not None:
            return
        try:
            if group:
                os.killpg(self.pid, signal)
            else:
                os.kill(self.pid, signal)
        except ProcessLookupError:
            pass

    async def wait(self, timeout: float | None = None) -> ProcessStatus:
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._proc.wait())
        except asyncio.TimeoutError:
            pass
        return self._status()

    async def close(self) -> None:
        """Kill the group and reap (host-only helper)."""
        await self.kill(_signal.SIGKILL, group=True)
        await self.wait(5)
        for t in self._tasks:
            t.cancel()
