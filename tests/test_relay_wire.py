"""One relay, one wire format (issue 25): `sandboxes/programs/relay.py` carries HTTP over a
command channel in both directions (forward: OpenEnv, the host reaches a server in the
sandbox; listen: a v1 program in the sandbox reaches the host), and both speak the format
of `sandboxes.relay_wire`: JSON lines to the relay, `<JSON line>\\n@@vfr-end-ID@@\\n`
frames from it. Here the relay runs as a host subprocess; tests/test_openenv_forwarder.py
and tests/test_v1_e2e.py run it inside sandboxes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandboxes import relay_wire
from sandboxes.program_files import PROGRAMS_DIR, program_path, program_source

RELAY = str(program_path("relay.py"))


def read_frames(proc: subprocess.Popen, want: int) -> list[dict]:
    buf, frames = "", []
    while len(frames) < want:
        line = proc.stdout.readline()
        assert line, f"relay ended; stderr: {proc.stderr.read()[-2000:]}"
        buf += line
        got, buf = relay_wire.split_frames(buf)
        frames += got
    return frames


def test_the_wire_format_round_trips_and_refuses_what_is_not_it():
    msg = {"id": 7, "op": "http", "method": "POST", "path": "/x", "body": base64.b64encode(b"\x00\xff").decode()}
    frame = relay_wire.line(msg).decode() + relay_wire.marker(7)[1:]
    assert relay_wire.message(frame, 7) == msg
    frames, rest = relay_wire.split_frames(frame + frame.replace('"id":7', '"id":8').replace("end-7", "end-8") + '{"id":9')
    assert [f["id"] for f in frames] == [7, 8] and rest == '{"id":9'
    with pytest.raises(relay_wire.WireError, match="awaited"):
        relay_wire.message(frame, 8)
    with pytest.raises(relay_wire.WireError, match="closed by the marker"):
        relay_wire.split_frames(relay_wire.line(msg).decode() + relay_wire.marker(8)[1:])
    with pytest.raises(relay_wire.WireError):
        relay_wire.split_frames("not json\n@@vfr-end-1@@\n")


def test_every_in_sandbox_program_is_in_one_place():
    names = sorted(p.name for p in PROGRAMS_DIR.glob("*.py"))
    assert names == ["python_runner.py", "relay.py", "repl_worker.py"]
    assert not (PROGRAMS_DIR / "__init__.py").exists()  # shipped as source, never imported
    assert "def listen(" in program_source("relay.py") and "def forward(" in program_source("relay.py")
    with pytest.raises(KeyError):
        program_path("../settings.py")


@pytest.fixture
def http_server():
    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = json.dumps({"path": self.path, "got": body.decode()}).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def test_forward_mode_answers_in_the_format(http_server):
    proc = subprocess.Popen([sys.executable, "-u", RELAY, str(http_server)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(relay_wire.line({"id": 1, "op": "http", "method": "POST", "path": "/a",
                                          "body": base64.b64encode(b"hi").decode()}).decode())
        proc.stdin.flush()
        (answer,) = read_frames(proc, 1)
        assert answer["id"] == 1 and answer["ok"] and answer["status"] == 201
        assert json.loads(base64.b64decode(answer["body"])) == {"path": "/a", "got": "hi"}
    finally:
        proc.kill()
        proc.wait()


def test_listen_mode_asks_in_the_same_format_and_fails_waiting_requests_when_the_host_goes():
    proc = subprocess.Popen([sys.executable, "-u", RELAY, "listen"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        (ready,) = read_frames(proc, 1)
        assert ready["id"] == "ready" and ready["ok"]
        results: list = []

        def program(body: bytes) -> None:  # what a sandboxed program does: HTTP to the relay's loopback port
            req = urllib.request.Request(f"http://127.0.0.1:{ready['port']}/v1/chat/completions", data=body,
                                         headers={"Authorization": "Bearer k"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    results.append((resp.status, resp.read()))
            except urllib.error.HTTPError as exc:
                results.append((exc.code, exc.read()))

        t = threading.Thread(target=program, args=(b'{"q": 1}',))
        t.start()
        (req,) = read_frames(proc, 1)
        assert (req["op"], req["method"], req["path"]) == ("http", "POST", "/v1/chat/completions")
        assert req["headers"] == {"Authorization": "Bearer k"} and base64.b64decode(req["body"]) == b'{"q": 1}'
        proc.stdin.write(relay_wire.line({"id": req["id"], "ok": True, "status": 200, "headers": {},
                                          "body": base64.b64encode(b'{"a": 2}').decode()}).decode())
        proc.stdin.flush()
        t.join(30)
        assert results == [(200, b'{"a": 2}')]

        t = threading.Thread(target=program, args=(b"{}",))
        t.start()
        read_frames(proc, 1)
        proc.stdin.close()  # the host is gone: the waiting request fails, it does not hang
        t.join(30)
        assert not t.is_alive() and results[1][0] == 502 and b"relay host closed" in results[1][1]
    finally:
        proc.kill()
        proc.wait()
