"""The command-channel relay: framing (large and binary bodies, chunked
responses), WebSocket sessions, a server that is down, a relay that dies,
timeouts. Run against real servers: a stdlib HTTP server and a `websockets`
server on the host, and (docker) the relay inside a container via `docker exec -i`."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envs.openenv.forwarder import (
    RELAY_SOURCE,
    Forwarder,
    ForwardTimeout,
    RelayDied,
    ServerUnreachable,
)
from sandboxes.errors import InfraError


def _blob(n: int) -> bytes:
    """Deterministic bytes covering every byte value (incl. NUL, newlines, invalid UTF-8)."""
    out = bytearray()
    seed = b"vf"
    while len(out) < n:
        seed = hashlib.sha256(seed).digest()
        out += seed + bytes(range(256))
    return bytes(out[:n])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/octet-stream", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/blob/"):
            self._send(200, _blob(int(self.path.rsplit("/", 1)[1])))
        elif self.path == "/health":
            self._send(200, b'{"status":"healthy"}', "application/json")
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, b"late")
        elif self.path == "/headers":
            self._send(200, self.headers.get("X-Probe", "").encode(), extra={"X-Answer": "42"})
        else:
            self._send(404, b"no such path")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        if self.path == "/echo":
            self._send(200, body)
        elif self.path == "/sha":
            self._send(200, hashlib.sha256(body).hexdigest().encode())
        else:
            self._send(500, b"boom")


@pytest.fixture
def http_port():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def fwd(http_port):
    f = await Forwarder.start_local(http_port, chunk=64 * 1024)
    yield f
    await f.close()


async def test_small_json_and_status_codes(fwd):
    r = await fwd.request("GET", "/health")
    assert r.status == 200 and r.json() == {"status": "healthy"}
    r = await fwd.request("GET", "/nope")
    assert r.status == 404 and r.text == "no such path" and not r.ok
    r = await fwd.request("POST", "/fail", json={"a": 1})
    assert r.status == 500 and r.body == b"boom"


async def test_headers_pass_both_ways(fwd):
    r = await fwd.request("GET", "/headers", headers={"X-Probe": "hello"})
    assert r.body == b"hello"
    assert {k.lower(): v for k, v in r.headers.items()}["x-answer"] == "42"


async def test_large_binary_response_is_chunked_and_exact(fwd):
    n = 5 * 1024 * 1024 + 7  # 81 chunks of 64 KiB
    r = await fwd.request("GET", f"/blob/{n}")
    assert r.status == 200 and len(r.body) == n
    assert r.body == _blob(n)


async def test_large_binary_request_body(fwd):
    data = _blob(3 * 1024 * 1024 + 1)
    r = await fwd.request("POST", "/sha", content=data)
    assert r.text == hashlib.sha256(data).hexdigest()
    r = await fwd.request("POST", "/echo", content=data)
    assert r.body == data


async def test_binary_edge_bytes_round_trip(fwd):
    data = b"\x00\n@@vfr-end-1@@\n\xff\xfe" + bytes(range(256)) * 3
    r = await fwd.request("POST", "/echo", content=data)
    assert r.body == data
    r = await fwd.request("POST", "/echo", content=b"")
    assert r.body == b""


async def test_server_down_is_unreachable_and_relay_survives():
    port = _free_port()
    f = await Forwarder.start_local(port)
    try:
        with pytest.raises(ServerUnreachable) as ei:
            await f.request("GET", "/health")
        assert isinstance(ei.value, InfraError)
        with pytest.raises(ServerUnreachable):
            await f.ws_open("/ws")
        assert await f.ping() > 0  # the relay itself is still fine
    finally:
        await f.close()


async def test_server_goes_down_between_requests(tmp_path):
    port = _free_port()
    srv = subprocess.Popen(["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    f = await Forwarder.start_local(port)
    try:
        for _ in range(100):
            try:
                assert (await f.request("GET", "/")).ok
                break
            except ServerUnreachable:
                await asyncio.sleep(0.05)
        srv.kill()
        srv.wait()
        with pytest.raises(ServerUnreachable):
            await f.request("POST", "/echo", content=b"x")
        with pytest.raises(ServerUnreachable):
            await f.request("GET", "/")
    finally:
        srv.kill()
        await f.close()


async def test_slow_server_times_out(fwd):
    with pytest.raises(ForwardTimeout):
        await fwd.request("GET", "/slow", timeout=1)
    # The next request works at once: the half-read connection was dropped.
    assert (await fwd.request("GET", "/health")).ok


async def test_relay_death_is_reported_with_stderr():
    with pytest.raises(RelayDied) as ei:
        await Forwarder.start_subprocess(
            ["python3", "-c", "import sys; print('relay exploding', file=sys.stderr); sys.exit(3)"]
        )
    assert "relay exploding" in str(ei.value)


async def test_relay_killed_mid_session(http_port):
    f = await Forwarder.start_local(http_port)
    f.channel.proc.kill()  # type: ignore[attr-defined]
    await f.channel.proc.wait()  # type: ignore[attr-defined]
    with pytest.raises(RelayDied):
        await f.request("GET", "/health")
    await f.close()


@pytest.fixture
async def ws_port():
    import websockets

    async def handler(ws):
        async for msg in ws:
            if msg == "close-me":
                await ws.close(code=4000)
                return
            if msg.startswith("big:"):
                await ws.send("y" * int(msg[4:]))
            else:
                await ws.send("echo:" + msg)

    server = await websockets.serve(handler, "127.0.0.1", 0, max_size=None)
    port = next(iter(server.sockets)).getsockname()[1]
    yield port
    server.close()
    await server.wait_closed()


async def test_websocket_session(ws_port):
    f = await Forwarder.start_local(ws_port)
    try:
        sid = await f.ws_open("/ws")
        assert await f.ws_send(sid, '{"type":"reset"}') == 'echo:{"type":"reset"}'
        assert await f.ws_send(sid, "ünïcödé ✓") == "echo:ünïcödé ✓"
        big = await f.ws_send(sid, "big:3000000")  # > 64 KiB frames, > 1 chunk
        assert big == "y" * 3_000_000
        long_msg = "z" * 200_000
        assert await f.ws_send(sid, long_msg) == "echo:" + long_msg
        sid2 = await f.ws_open("/ws")  # independent sessions
        assert await f.ws_send(sid2, "two") == "echo:two"
        with pytest.raises(ServerUnreachable):
            await f.ws_send(sid, "close-me")
        assert await f.ws_send(sid2, "still") == "echo:still"
        await f.ws_close(sid2)
    finally:
        await f.close()


# --------------------------------------------------------------------------- docker


BASE_IMAGE = os.environ.get("VF_OPENENV_BASE_IMAGE", "vf-sandbox/base:bookworm")


@pytest.mark.docker
async def test_relay_inside_container_over_docker_exec():
    """The relay reaches a server inside a container with networking off,
    through nothing but `docker exec -i` stdin/stdout."""
    name = f"vf-openenv-relay-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", "--label", "vf-test=openenv", "--name", name,
         BASE_IMAGE, "sh", "-c",
         "mkdir -p /srv && head -c 3000000 /dev/urandom > /srv/blob && cd /srv && exec python3 -m http.server 8000"],
        check=True, capture_output=True,
    )
    try:
        subprocess.run(["docker", "cp", str(RELAY_SOURCE), f"{name}:/tmp/relay.py"], check=True)
        f = await Forwarder.start_subprocess(["docker", "exec", "-i", name, "python3", "-u", "/tmp/relay.py", "8000"])
        try:
            r = await _request_when_up(f, "GET", "/blob", tries=50)
            assert r.status == 200 and len(r.body) == 3_000_000
            digest = subprocess.run(["docker", "exec", name, "sha256sum", "/srv/blob"], capture_output=True,
                                    text=True, check=True).stdout.split()[0]
            assert hashlib.sha256(r.body).hexdigest() == digest
            down = await Forwarder.start_subprocess(
                ["docker", "exec", "-i", name, "python3", "-u", "/tmp/relay.py", "8001"])
            try:
                with pytest.raises(ServerUnreachable):
                    await down.request("GET", "/health")
            finally:
                await down.close()
        finally:
            await f.close()
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


# A server for the sandbox: answers a POST with its body reversed, on port argv[1].
_REVERSE_SERVER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_POST(self):\n"
    "        body = self.rfile.read(int(self.headers['Content-Length']))[::-1]\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


async def _request_when_up(f: Forwarder, method: str, path: str, *, content: bytes | None = None,
                           tries: int = 100, delay: float = 0.1):
    """The first answer of a server that may still be starting (None if it never answered)."""
    for _ in range(tries):
        try:
            return await f.request(method, path, content=content)
        except ServerUnreachable:
            await asyncio.sleep(delay)
    return None


@pytest.mark.docker
async def test_relay_through_the_docker_backend_agent(docker_sandbox):
    """The production channel: relay as a BackgroundProcess of a Docker sandbox
    (networking off), a 5 MiB binary body both ways through the agent's
    bounded output buffers, a WebSocket-less server, and a port nobody serves."""
    sb = docker_sandbox
    assert not sb.spec.network
    await sb.write_file("/tmp/srv.py", _REVERSE_SERVER)
    await sb.start_process(["python3", "/tmp/srv.py", "8000"])
    f = await Forwarder.start_in_sandbox(sb, 8000)
    try:
        data = _blob(5 * 1024 * 1024 + 3)
        r = await _request_when_up(f, "POST", "/rev", content=data)
        assert r.status == 200 and r.body == data[::-1]
        assert (await f.request("POST", "/rev", content=b"\x00\xff\n")).body == b"\n\xff\x00"
    finally:
        await f.close()
    down = await Forwarder.start_in_sandbox(sb, 8009)
    try:
        with pytest.raises(ServerUnreachable):
            await down.request("GET", "/health")
    finally:
        await down.close()


@pytest.mark.parametrize("kind", ["local", "local-nobwrap", "kubernetes", "prime"])
async def test_relay_over_other_backends_channels(kind):
    """The same relay, unchanged, over each backend's own command channel: local
    pipes (with and without bubblewrap), the Kubernetes exec websocket and the
    Prime API (the last two against the project's contract fakes of those APIs,
    whose sandboxes are local processes)."""
    from backend_harness import open_backend

    async with open_backend(kind) as (backend, spec):
        sb = await backend.create(spec)
        try:
            port = _free_port()
            await sb.write_file("/tmp/vf_rev_srv.py", _REVERSE_SERVER)
            await sb.start_process(["python3", "/tmp/vf_rev_srv.py", str(port)])
            f = await Forwarder.start_in_sandbox(sb, port, chunk=128 * 1024)
            try:
                data = _blob(2 * 1024 * 1024 + 5)
                r = await _request_when_up(f, "POST", "/", content=data)
                assert r.status == 200 and r.body == data[::-1]
            finally:
                await f.close()
        finally:
            await sb.delete()
