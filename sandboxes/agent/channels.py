"""Ready-made `AgentChannel`s: `ProcessChannel` runs the agent as a local
subprocess over pipes (for tests and the local backend) or any command that
relays stdin/stdout to an agent (e.g. `docker exec -i`, `kubectl exec -i`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import Sequence

from .client import AgentChannel
from .protocol import agent_argv

READ_SIZE = 1 << 16


class ProcessChannel(AgentChannel):
    """The agent's stdin/stdout as pipes of a host subprocess; its stderr kept as a bounded log."""

    def __init__(self, proc: asyncio.subprocess.Process, label: str = "process"):
        self.proc = proc
        self.label = label
        self._log: collections.deque[str] = collections.deque(maxlen=50)
        self._log_task = asyncio.create_task(self._pump_log()) if proc.stderr else None

    @classmethod
    async def spawn(cls, argv: Sequence[str] | None = None, *, cwd: str | None = None,
                    env: dict[str, str] | None = None, start_new_session: bool = True) -> "ProcessChannel":
        """Start `argv` (default: the agent on this machine's python3) with piped stdio."""
        argv = list(argv or agent_argv())
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=cwd, env=env, start_new_session=start_new_session, limit=READ_SIZE,
        )
        return cls(proc, label=f"pid {proc.pid}")

    async def _pump_log(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self._log.append(line.decode("utf-8", "replace").rstrip())

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def receive(self) -> bytes:
        assert self.proc.stdout is not None
        return await self.proc.stdout.read(READ_SIZE)

    async def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            async with asyncio.timeout(2.0):
                await self.proc.wait()
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        if self._log_task is not None:
            # asyncio.wait: neither raises on the timeout nor swallows the caller's own cancellation
            await asyncio.wait([self._log_task], timeout=1.0)
            self._log_task.cancel()

    def describe(self) -> str:
        return f"{type(self).__name__}({self.label})"

    def log_tail(self) -> str:
        return "\n".join(self._log)


async def spawn_local_agent(**kwargs) -> ProcessChannel:
    """The agent as a subprocess of this process (same user, same machine: no isolation)."""
    return await ProcessChannel.spawn(env=kwargs.pop("env", dict(os.environ)), **kwargs)
