"""The one in-sandbox relay (stdlib only, Python >= 3.8): HTTP between the host and
the inside of a sandbox over the sandbox's own command channel (this process's
stdin / stdout), so the sandbox keeps its network off. Two directions, one wire
format:

    python3 relay.py PORT [CHUNK_BYTES]    forward: the host reaches the server at
                                           127.0.0.1:PORT inside the sandbox
                                           (OpenEnv; envs.openenv.forwarder)
    python3 relay.py listen                listen: a program inside the sandbox
                                           reaches the host (v1 programs' model
                                           calls; envs.v1.sandbox_relay)

Wire format (both modes; `sandboxes/relay_wire.py` is its host side):

  a message is one JSON object (compact, ASCII: bodies are base64) with an "id";
  host -> relay  one JSON line per message;
  relay -> host  one frame per message: <JSON line>\n@@vfr-end-ID@@\n
  an HTTP request   {"id", "op": "http", "method", "path", "headers", "body", "timeout"}
  an HTTP answer    {"id", "ok": true, "status", "headers", "body", "more"}
  a failure         {"id", "ok": false, "kind": "connect"|"timeout"|"protocol"|"bad_request",
                     "error": "..."}

forward: the host sends the requests, the relay answers each (strictly in
order), further ops:
      {"id": N, "op": "ws_open", "path": "/ws", "timeout": 10}
      {"id": N, "op": "ws_send", "sid": S, "text": "...", "timeout": 30}
                                                 (answer: the next message, as "body")
      {"id": N, "op": "ws_close", "sid": S}
      {"id": N, "op": "more", "of": M}          next chunk of response M
      {"id": N, "op": "ping"}
  http and ws_send answers carry "body" (base64; http also "status" and
  "headers") and "more": true when it continues (ask with op "more"); a
  response body is cut into CHUNK_BYTES pieces so no frame exceeds the
  channel's output bound.
listen: the relay serves HTTP on an ephemeral 127.0.0.1 port, announced in the
  frame {"id": "ready", "ok": true, "port": P}; each request a program makes
  there is a request frame to the host, which answers it with one JSON line
  (requests are served concurrently; answers may come in any order). The host
  gone, every waiting request gets a 502.

The relay writes nothing else to stdout, and what it writes is ASCII, so any
decoding of the channel's output on the host is lossless.
"""

import base64
import hashlib
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time

END = "@@vfr-end-%s@@"
DEFAULT_CHUNK = 256 * 1024
MAX_WS_MESSAGE = 64 * 1024 * 1024
MAX_HTTP_BODY = 256 * 1024 * 1024
IDLE_RECONNECT_S = 3.0  # uvicorn closes idle keep-alive connections after 5 s


_emit_lock = threading.Lock()


def emit(out, rid, payload):
    """One frame to the host: the message as a JSON line, then its end marker."""
    payload["id"] = rid
    data = json.dumps(payload, separators=(",", ":")) + "\n" + (END % rid) + "\n"
    with _emit_lock:  # listen mode: request threads emit concurrently
        out.write(data)
        out.flush()


class Http:
    """One keep-alive connection to the local server, reopened when stale."""

    def __init__(self, port):
        self.port = port
        self.conn = None
        self.last_used = 0.0

    def _fresh(self, timeout):
        if self.conn is not None:
            self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def drop(self):
        """Forget the connection (after a timeout or error it may hold a half-read response)."""
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def request(self, method, path, headers, body, timeout):
        idle = time.monotonic() - self.last_used
        if self.conn is None or idle > IDLE_RECONNECT_S:
            self._fresh(timeout)
        else:
            self.conn.timeout = timeout
            if self.conn.sock is not None:
                self.conn.sock.settimeout(timeout)
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read(MAX_HTTP_BODY + 1)
                if len(data) > MAX_HTTP_BODY:
                    self.drop()
                    raise ValueError("response body larger than %d bytes" % MAX_HTTP_BODY)
                self.last_used = time.monotonic()
                if resp.will_close or not resp.isclosed():
                    self.drop()
                return resp.status, dict(resp.getheaders()), data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # A stale keep-alive connection: safe to retry only for methods without side effects.
                self._fresh(timeout)
                if attempt or method not in ("GET", "HEAD", "OPTIONS"):
                    raise
        raise AssertionError("unreachable")


class WebSocket:
    """A minimal RFC 6455 client: text messages, ping/pong, close."""

    def __init__(self, port, path, timeout):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (
            "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ) % (path, port, key)
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            part = self.sock.recv(4096)
            if not part:
                raise ConnectionError("server closed the connection during the WebSocket handshake")
            head += part
            if len(head) > 65536:
                raise ValueError("WebSocket handshake response too large")
        head, _, self.buf = head.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise ValueError("WebSocket handshake refused: %s" % status.decode("latin-1"))
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        if accept not in head:
            raise ValueError("WebSocket handshake: bad Sec-WebSocket-Accept")

    def _recv_exact(self, n):
        while len(self.buf) < n:
            part = self.sock.recv(max(65536, n - len(self.buf)))
            if not part:
                raise ConnectionError("WebSocket closed by the server")
            self.buf += part
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        head = bytearray([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head.append(0x80 | n)
        elif n < 65536:
            head.append(0x80 | 126)
            head += struct.pack("!H", n)
        else:
            head.append(0x80 | 127)
            head += struct.pack("!Q", n)
        mask = os.urandom(4)
        head += mask
        # XOR with the mask via big-int arithmetic: fast enough without numpy.
        m = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big") if n else b""
        self.sock.sendall(bytes(head) + masked)

    def send_text(self, text):
        self._send_frame(0x1, text.encode("utf-8"))

    def recv_text(self, timeout):
        self.sock.settimeout(timeout)
        parts = []
        size = 0
        while True:
            b0, b1 = self._recv_exact(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b1 & 0x80 else None
            payload = self._recv_exact(n)
            if mask:
                m = (mask * (n // 4 + 1))[:n]
                payload = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                raise ConnectionError("WebSocket closed by the server (code %d)" % code)
            size += n
            if size > MAX_WS_MESSAGE:
                raise ValueError("WebSocket message larger than %d bytes" % MAX_WS_MESSAGE)
            parts.append(payload)
            if fin:
                return b"".join(parts).decode("utf-8", "replace")

    def close(self):
        """Close handshake: send a close frame, wait briefly for the server's, then close."""
        try:
            self._send_frame(0x8, struct.pack("!H", 1000))
            self.recv_text(1.0)
        except (OSError, ValueError):
            pass  # ConnectionError on the server's close frame is the normal end
        self.sock.close()


class Forward:
    """forward mode's state: the keep-alive connection to the server, the open WebSocket
    sessions and the unsent rest of chunked responses; one method per op, each emitting
    its answer frame."""

    def __init__(self, out, port, chunk):
        self.out = out
        self.port = port
        self.chunk = chunk
        self.http = Http(port)
        self.sockets = {}
        self.pending = {}  # response id -> remaining body bytes
        self.next_sid = 1
        self.ops = {"http": self.op_http, "more": self.op_more, "ws_open": self.op_ws_open,
                    "ws_send": self.op_ws_send, "ws_close": self.op_ws_close, "ping": self.op_ping}

    def handle(self, line):
        """Answer one request line; what goes wrong is answered as a typed failure."""
        out = self.out
        try:
            req = json.loads(line)
            rid = req["id"]
        except (ValueError, KeyError, TypeError) as exc:
            emit(out, "x", {"ok": False, "kind": "bad_request", "error": "unreadable request: %s" % exc})
            return
        op = req.get("op")
        timeout = float(req.get("timeout") or 30)
        try:
            run = self.ops.get(op) if isinstance(op, str) else None
            if run is None:
                emit(out, rid, {"ok": False, "kind": "bad_request", "error": "unknown op %r" % op})
            else:
                run(rid, req, timeout)
        except (socket.timeout, TimeoutError) as exc:
            self.http.drop()
            emit(out, rid, {"ok": False, "kind": "timeout", "error": "timed out after %ss: %s" % (timeout, exc)})
        except (ConnectionError, OSError, http.client.HTTPException) as exc:
            self.http.drop()
            emit(out, rid, {"ok": False, "kind": "connect", "error": "%s: %s" % (type(exc).__name__, exc)})
        except (ValueError, KeyError, TypeError) as exc:
            emit(out, rid, {"ok": False, "kind": "protocol", "error": "%s: %s" % (type(exc).__name__, exc)})

    def _first_chunk(self, key, data):
        """(first chunk of `data`, whether more follows); the rest is kept under `key` for op "more"."""
        first, rest = data[:self.chunk], data[self.chunk:]
        if rest:
            self.pending[key] = rest
        return base64.b64encode(first).decode(), bool(rest)

    def op_http(self, rid, req, timeout):
        self.pending.clear()  # one response in flight at a time: leftovers were abandoned
        body = base64.b64decode(req["body"]) if req.get("body") else None
        status, headers, data = self.http.request(
            req.get("method", "GET"), req.get("path", "/"), req.get("headers") or {}, body, timeout
        )
        first, more = self._first_chunk(rid, data)
        emit(self.out, rid, {"ok": True, "status": status, "headers": headers, "body": first, "size": len(data),
                             "more": more})

    def op_more(self, rid, req, timeout):
        first, more = self._first_chunk(req.get("of"), self.pending.pop(req.get("of"), b""))
        emit(self.out, rid, {"ok": True, "body": first, "more": more})

    def op_ws_open(self, rid, req, timeout):
        self.sockets[self.next_sid] = WebSocket(self.port, req.get("path", "/ws"), timeout)
        emit(self.out, rid, {"ok": True, "sid": self.next_sid})
        self.next_sid += 1

    def op_ws_send(self, rid, req, timeout):
        """Send one text message and answer with the server's next one (a failed session is closed)."""
        self.pending.clear()
        ws = self.sockets.get(req.get("sid"))
        if ws is None:
            emit(self.out, rid, {"ok": False, "kind": "bad_request", "error": "no such WebSocket session"})
            return
        try:
            ws.send_text(req["text"])
            text = ws.recv_text(timeout)
        except BaseException:
            self.sockets.pop(req.get("sid"), None)
            ws.close()
            raise
        first, more = self._first_chunk(rid, text.encode("utf-8"))
        emit(self.out, rid, {"ok": True, "body": first, "more": more})

    def op_ws_close(self, rid, req, timeout):
        ws = self.sockets.pop(req.get("sid"), None)
        if ws is not None:
            ws.close()
        emit(self.out, rid, {"ok": True})

    def op_ping(self, rid, req, timeout):
        emit(self.out, rid, {"ok": True, "pid": os.getpid()})

    def close(self):
        for ws in self.sockets.values():
            ws.close()


def forward(argv):
    """forward mode: requests from the host to the server at 127.0.0.1:PORT."""
    relay = Forward(sys.stdout, int(argv[1]), int(argv[2]) if len(argv) > 2 else DEFAULT_CHUNK)
    for line in sys.stdin:
        line = line.strip()
        if line:
            relay.handle(line)
    relay.close()


# --------------------------------------------------------------------------- listen


class Listen:
    """listen mode: requests of a program in the sandbox, carried to the host."""

    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()
        self.waiting = {}  # request id -> [Event, answer]
        self.next_id = 0

    def ask(self, method, path, headers, body):
        """Send one request frame to the host and wait for its answer."""
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            slot = self.waiting[rid] = [threading.Event(), None]
        emit(self.out, rid, {"op": "http", "method": method, "path": path, "headers": headers,
                             "body": base64.b64encode(body).decode()})
        slot[0].wait()
        with self.lock:
            self.waiting.pop(rid, None)
        return slot[1]

    def read_answers(self, lines):
        """Answers from the host (one JSON line each); when it is gone, fail every waiting request."""
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
                rid = msg["id"]
            except (ValueError, KeyError, TypeError):
                continue  # not an answer: nothing waits for it
            with self.lock:
                slot = self.waiting.get(rid)
            if slot is not None:
                slot[1] = msg
                slot[0].set()
        gone = {"ok": False, "kind": "connect", "error": "relay host closed"}
        with self.lock:
            for slot in self.waiting.values():
                slot[1] = gone
                slot[0].set()


def listen(argv):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    relay = Listen(sys.stdout)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {"Authorization": self.headers.get("Authorization", "")}
            answer = relay.ask(self.command, self.path, headers, body)
            if answer.get("ok"):
                status, data = int(answer.get("status", 502)), base64.b64decode(answer.get("body") or "")
            else:
                status = 502
                data = json.dumps({"error": {"message": answer.get("error", "relay error")}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _relay

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=relay.read_answers, args=(sys.stdin,), daemon=True).start()
    emit(sys.stdout, "ready", {"ok": True, "port": server.server_address[1]})
    server.serve_forever()


def main(argv):
    if len(argv) > 1 and argv[1] == "listen":
        listen(argv[1:])
    else:
        forward(argv)


if __name__ == "__main__":
    main(sys.argv)
