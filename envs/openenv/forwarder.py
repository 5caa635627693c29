"""Reach a server inside a sandbox without opening the sandbox's network.

`Forwarder` speaks to `sandboxes/programs/relay.py` (forward mode; its wire format is
the v1 sandbox relay's too: `sandboxes.relay_wire`), a stdlib-only process started in
the sandbox, over a `Channel`: the sandbox's own command channel (a
`BackgroundProcess`'s stdin/stdout) or, for tests and benchmarks, a host
subprocess. One request costs one write and one marker-terminated read,
the same on Docker, Kubernetes and the remote API.

`DirectTransport` is the other `Transport`: plain HTTP/WebSocket to a URL,
used where a backend publishes a port and the user asked for it.

Errors are `ForwardError` (an `InfraError`): `ServerUnreachable` (nothing
listens on the port), `ForwardTimeout`, `RelayDied` (the relay process
exited; the message carries its stderr tail).
"""

from __future__ import annotations

import abc
import asyncio
import base64
import collections
import itertools
import json as jsonlib
import sys
import time
from typing import Any, Protocol

from pydantic import BaseModel, Field

from sandboxes.errors import InfraError
from sandboxes.interface import BackgroundProcess, Sandbox
from sandboxes import relay_wire
from sandboxes.program_files import program_path

RELAY_SOURCE = program_path("relay.py")  # forward mode (`relay.py PORT CHUNK`)
RELAY_REMOTE_PATH = "/tmp/vf_openenv_relay.py"
DEFAULT_CHUNK = 256 * 1024  # raw bytes per response frame: base64 keeps it well under 1 MiB
STDIN_PIECE = 512 * 1024  # bytes per write_stdin call
ERR_TAIL = 4000


class ForwardError(InfraError):
    """The forward to the in-sandbox server failed."""


class ServerUnreachable(ForwardError):
    """Nothing answers on the server's port inside the sandbox (refused, reset, closed)."""


class ForwardTimeout(ForwardError):
    """The server (or the relay) did not answer in time."""


class RelayDied(ForwardError):
    """The relay process exited or broke its protocol; the message carries its stderr tail."""


class HttpResponse(BaseModel):
    """One HTTP response relayed from the sandbox."""

    status: int
    headers: dict[str, str] = Field(default_factory=dict)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.body)


class Transport(Protocol):
    """What the OpenEnv client needs: HTTP requests and WebSocket sessions to one server."""

    async def request(
        self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
        headers: dict[str, str] | None = None, timeout: float = 30.0,
    ) -> HttpResponse: ...

    async def ws_open(self, path: str = "/ws", timeout: float = 10.0) -> int: ...

    async def ws_send(self, sid: int, text: str, timeout: float = 60.0) -> str: ...

    async def ws_close(self, sid: int) -> None: ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- channels


class Channel(abc.ABC):
    """A byte pipe to the relay: write requests, read marker-terminated frames."""

    @abc.abstractmethod
    async def send(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def read_frame(self, marker: str, timeout: float) -> str:
        """Text up to and including `marker`. Raises ForwardTimeout / RelayDied."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def exchange(self, data: bytes, marker: str, timeout: float) -> str:
        """Send one request and read its frame."""
        await self.send(data)
        return await self.read_frame(marker, timeout)


class ProcessChannel(Channel):
    """The relay as a sandbox `BackgroundProcess`: stdin in, marker reads out."""

    def __init__(self, proc: BackgroundProcess):
        self.proc = proc
        self._buf = ""
        self._err: collections.deque[str] = collections.deque(maxlen=64)

    def stderr_tail(self) -> str:
        return "".join(self._err)[-ERR_TAIL:]

    async def send(self, data: bytes) -> None:
        for i in range(0, len(data), STDIN_PIECE):
            await self.proc.write_stdin(data[i : i + STDIN_PIECE])

    async def exchange(self, data: bytes, marker: str, timeout: float) -> str:
        """Write and wait-for-marker pipelined: the agent serves requests concurrently,
        so a step costs one agent round trip, not two."""
        reader = asyncio.ensure_future(self.read_frame(marker, timeout))
        try:
            await self.send(data)
        except BaseException:
            reader.cancel()
            raise
        return await reader

    async def read_frame(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while marker not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ForwardTimeout(f"relay gave no answer within {timeout:.0f}s")
            out, err = await self.proc.read_output(until=marker, timeout=remaining)
            self._buf += out
            if err:
                self._err.append(err)
            if marker not in self._buf and not out:
                status = await self.proc.poll()
                if not status.running:
                    raise RelayDied(
                        f"relay exited (code {status.exit_code}, signal {status.signal}); "
                        f"stderr tail:\n{self.stderr_tail()}"
                    )
        frame, _, self._buf = self._buf.partition(marker)
        return frame + marker

    async def close(self) -> None:
        try:
            await self.proc.kill()
        except InfraError:
            pass


class LocalChannel(Channel):
    """The relay as a host subprocess (tests, benchmarks)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise RelayDied(f"relay stdin closed: {exc}") from exc

    async def read_frame(self, marker: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                data = await self.proc.stdout.readuntil(marker.encode())
        except asyncio.TimeoutError:
            raise ForwardTimeout(f"relay gave no answer within {timeout:.0f}s") from None
        except asyncio.IncompleteReadError as exc:
            err = b""
            if self.proc.stderr is not None:
                try:
                    async with asyncio.timeout(2):
                        err = await self.proc.stderr.read()
                except asyncio.TimeoutError:
                    pass
            raise RelayDied(f"relay exited; stderr tail:\n{err.decode('utf-8', 'replace')[-ERR_TAIL:]}") from exc
        return data.decode("utf-8", "replace")

    async def close(self) -> None:
        if self.proc.returncode is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                async with asyncio.timeout(2):
                    await self.proc.wait()
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()


# --------------------------------------------------------------------------- forwarder


class Forwarder:
    """HTTP and WebSocket to 127.0.0.1:PORT inside a sandbox, through a `Channel` to the relay.

    Requests are serialized (one relay, one channel); each costs one round trip,
    plus one more per extra `chunk` bytes of response body.
    """

    def __init__(self, channel: Channel, *, chunk: int = DEFAULT_CHUNK):
        self.channel = channel
        self.chunk = chunk
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def start_in_sandbox(
        cls, sandbox: Sandbox, port: int, *, python: str = "python3", chunk: int = DEFAULT_CHUNK
    ) -> "Forwarder":
        """Upload the relay into `sandbox`, start it and check it answers."""
        await sandbox.write_file(RELAY_REMOTE_PATH, RELAY_SOURCE.read_bytes())
        proc = await sandbox.start_process([python, "-u", RELAY_REMOTE_PATH, str(port), str(chunk)])
        return await cls._checked(ProcessChannel(proc), chunk)

    @classmethod
    async def start_local(
        cls, port: int, *, python: str = sys.executable, chunk: int = DEFAULT_CHUNK
    ) -> "Forwarder":
        """Run the relay as a host subprocess (for tests and benchmarks)."""
        return await cls.start_subprocess([python, "-u", str(RELAY_SOURCE), str(port), str(chunk)], chunk=chunk)

    @classmethod
    async def start_subprocess(cls, argv: list[str], *, chunk: int = DEFAULT_CHUNK) -> "Forwarder":
        """Run the relay through any host command whose stdin/stdout reach it
        (e.g. `docker exec -i CONTAINER python3 -u /tmp/relay.py PORT`)."""
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,
        )
        return await cls._checked(LocalChannel(proc), chunk)

    @classmethod
    async def _checked(cls, channel: Channel, chunk: int) -> "Forwarder":
        """A Forwarder over `channel` once the relay answers a ping (closed if it does not)."""
        fwd = cls(channel, chunk=chunk)
        try:
            await fwd.ping()
        except BaseException:
            await fwd.close()
            raise
        return fwd

    async def _call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        rid = next(self._ids)
        msg["id"] = rid
        frame = await self.channel.exchange(relay_wire.line(msg), relay_wire.marker(rid), timeout + 5.0)
        try:
            reply = relay_wire.message(frame, rid)
        except relay_wire.WireError as exc:
            raise RelayDied(f"relay spoke garbage: {exc}") from exc
        if not reply.get("ok"):
            kind, error = reply.get("kind"), reply.get("error", "")
            if kind == "connect":
                raise ServerUnreachable(f"{msg.get('op')} {msg.get('path', '')}: {error}")
            if kind == "timeout":
                raise ForwardTimeout(f"{msg.get('op')} {msg.get('path', '')}: {error}")
            raise RelayDied(f"relay refused {msg.get('op')}: {error}")
        return reply

    async def ping(self, timeout: float = 30.0) -> int:
        """Round trip to the relay itself; returns its pid."""
        async with self._lock:
            return (await self._call({"op": "ping"}, timeout))["pid"]

    async def request(
        self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
        headers: dict[str, str] | None = None, timeout: float = 30.0,
    ) -> HttpResponse:
        hdrs = dict(headers or {})
        if json is not None:
            content = jsonlib.dumps(json).encode()
            hdrs.setdefault("Content-Type", "application/json")
        msg: dict[str, Any] = {"op": "http", "method": method.upper(), "path": path, "headers": hdrs,
                               "timeout": timeout}
        if content is not None:
            msg["body"] = base64.b64encode(content).decode()
        async with self._lock:
            reply = await self._call(msg, timeout)
            body = await self._body(reply, timeout)
        return HttpResponse(status=reply["status"], headers=reply.get("headers") or {}, body=body)

    async def _body(self, reply: dict[str, Any], timeout: float) -> bytes:
        """The reply's whole body, fetching further chunks with op "more" (lock held)."""
        parts = [base64.b64decode(reply["body"])]
        more = reply.get("more")
        while more:
            nxt = await self._call({"op": "more", "of": reply["id"]}, timeout)
            parts.append(base64.b64decode(nxt["body"]))
            more = nxt.get("more")
        return b"".join(parts)

    async def ws_open(self, path: str = "/ws", timeout: float = 10.0) -> int:
        async with self._lock:
            return (await self._call({"op": "ws_open", "path": path, "timeout": timeout}, timeout))["sid"]

    async def ws_send(self, sid: int, text: str, timeout: float = 60.0) -> str:
        """Send one text message and return the server's next text message."""
        async with self._lock:
            reply = await self._call({"op": "ws_send", "sid": sid, "text": text, "timeout": timeout}, timeout)
            return (await self._body(reply, timeout)).decode("utf-8", "replace")

    async def ws_close(self, sid: int) -> None:
        async with self._lock:
            await self._call({"op": "ws_close", "sid": sid}, 10.0)

    async def close(self) -> None:
        await self.channel.close()


class DirectTransport:
    """HTTP/WebSocket straight to a URL (a published port, or a server on the host)."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._session = None
        self._ws: dict[int, Any] = {}
        self._ids = itertools.count(1)

    async def _client(self):
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def request(
        self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
        headers: dict[str, str] | None = None, timeout: float = 30.0,
    ) -> HttpResponse:
        import aiohttp

        session = await self._client()
        try:
            async with session.request(
                method, self.base_url + path, json=json, data=content, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                return HttpResponse(status=resp.status, headers=dict(resp.headers), body=await resp.read())
        except aiohttp.ClientConnectionError as exc:
            raise ServerUnreachable(f"{method} {path}: {exc}") from exc
        except asyncio.TimeoutError as exc:
            raise ForwardTimeout(f"{method} {path}: no answer within {timeout}s") from exc

    async def ws_open(self, path: str = "/ws", timeout: float = 10.0) -> int:
        import aiohttp

        session = await self._client()
        try:
            ws = await session.ws_connect(self.base_url + path, timeout=aiohttp.ClientWSTimeout(ws_close=timeout),
                                          max_msg_size=64 * 1024 * 1024)
        except aiohttp.ClientConnectionError as exc:
            raise ServerUnreachable(f"ws {path}: {exc}") from exc
        sid = next(self._ids)
        self._ws[sid] = ws
        return sid

    async def ws_send(self, sid: int, text: str, timeout: float = 60.0) -> str:
        ws = self._ws[sid]
        await ws.send_str(text)
        try:
            return await ws.receive_str(timeout=timeout)
        except asyncio.TimeoutError as exc:
            raise ForwardTimeout(f"ws: no answer within {timeout}s") from exc
        except TypeError as exc:  # a close/binary frame instead of text
            raise ServerUnreachable(f"ws closed by the server: {exc}") from exc

    async def ws_close(self, sid: int) -> None:
        ws = self._ws.pop(sid, None)
        if ws is not None:
            await ws.close()

    async def close(self) -> None:
        for sid in list(self._ws):
            await self.ws_close(sid)
        if self._session is not None:
            await self._session.close()
            self._session = None
