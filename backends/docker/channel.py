"""The agent channel over a Docker attached exec: stdin frames carry requests,
stdout frames the agent's replies, stderr frames its log (kept, bounded)."""

from __future__ import annotations

import collections
import contextlib

import aiodocker

from sandboxes.agent import AgentChannel


class DockerExecChannel(AgentChannel):
    """One attached `docker exec` stream to the agent (aiodocker `Stream`)."""

    def __init__(self, stream, container_id: str, exec_id: str = ""):
        self.stream = stream
        self.container_id = container_id
        self.exec_id = exec_id
        self._log: collections.deque[str] = collections.deque(maxlen=50)
        self._closed = False

    @classmethod
    async def open(cls, container, argv: list[str], *, user: str | None = None,
                   workdir: str | None = None) -> "DockerExecChannel":
        """Create and start an attached exec of `argv` in `container` (aiodocker DockerContainer)."""
        ex = await container.exec(argv, stdin=True, stdout=True, stderr=True, tty=False,
                                  user=user or "", workdir=workdir)
        stream = ex.start(detach=False)
        await stream._init()  # upgrade the connection now: errors surface here
        return cls(stream, container.id, ex.id)

    async def send(self, data: bytes) -> None:
        await self.stream.write_in(data)

    async def receive(self) -> bytes:
        while True:
            try:
                msg = await self.stream.read_out()
            except aiodocker.DockerError:
                return b""
            if msg is None:
                return b""
            if msg.stream == 2:
                text = msg.data.decode("utf-8", "replace")
                self._log.extend(line for line in text.splitlines() if line.strip())
                continue
            return msg.data

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self.stream.close()

    def describe(self) -> str:
        return f"docker exec {self.exec_id[:12]} in container {self.container_id[:12]}"

    def log_tail(self) -> str:
        return "\n".join(self._log)
