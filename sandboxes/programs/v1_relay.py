"""Runs INSIDE a sandbox (stdlib only): the sandboxed program's way to the v1
interception endpoint without opening the sandbox's network.

It listens on 127.0.0.1 (an ephemeral port, announced as `VFRELAY <port>` on
stdout). Each HTTP request becomes one line `VFREQ <base64 json>` on stdout;
the host answers with one line `<base64 json>` on stdin
({"id", "status", "body"}). Requests are served concurrently."""

import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_lock = threading.Lock()
_waiting = {}
_next = [0]


def _emit(line):
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _reader():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(base64.b64decode(line))
        slot = _waiting.get(msg["id"])
        if slot is not None:
            slot[1] = msg
            slot[0].set()
    for slot in list(_waiting.values()):  # host gone: fail everything waiting
        slot[1] = {"status": 502, "body": base64.b64encode(b'{"error": "relay host closed"}').decode()}
        slot[0].set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _relay(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with _lock:
            _next[0] += 1
            rid = _next[0]
        slot = [threading.Event(), None]
        _waiting[rid] = slot
        req = {"id": rid, "method": self.command, "path": self.path,
               "auth": self.headers.get("Authorization", ""), "body": base64.b64encode(body).decode()}
        _emit("VFREQ " + base64.b64encode(json.dumps(req).encode()).decode())
        slot[0].wait()
        _waiting.pop(rid, None)
        resp = slot[1]
        data = base64.b64decode(resp.get("body") or "")
        self.send_response(int(resp.get("status", 502)))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _relay

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=_reader, daemon=True).start()
    _emit("VFRELAY %d" % server.server_address[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
