"""The persistent Python worker that runs INSIDE a sandbox (stdlib only, Python 3.8+).

One process keeps one namespace (`__name__ == "__main__"`) across cells.
It is driven over its own stdin/stdout with a framed protocol; the cell's
own output never touches that channel:

* request  (stdin, one line):  `{"id": N, "code": "...", "max_output": B}`
  or `{"id": N, "shutdown": true}`.
* response (stdout): `<json>` + `\\x1e` + `N` + `\\n`, where json is
  `{"id", "status": "ok"|"error"|"interrupted", "stdout", "stderr",
  "stdout_dropped", "stderr_dropped", "result", "traceback",
  "execution_count", "duration", "oom_kills"}`. The worker announces itself with the
  frame of id 0 (`{"id": 0, "ready": true, "pid": ...}`).

Because every response carries the request's id and the terminator names it,
a caller that gave up on request N (timeout) can read on until frame N and
discard it: pairing never desynchronises.

Cell output: file descriptors 1 and 2 are pipes drained by two threads into
bounded buffers (head and tail kept, the middle counted), so output of
`print`, of C extensions and of child processes is all captured and memory
stays bounded whatever a cell prints. stdin is /dev/null.

SIGINT raises KeyboardInterrupt only while a cell runs (it is ignored while
the worker reads or answers), so an interrupt can never break the protocol;
the namespace survives it.
"""

import ast
import io
import json
import linecache
import os
import signal
import sys
import threading
import time
import traceback
import types

DEFAULT_MAX_OUTPUT = 16384  # bytes kept per stream per cell (head + tail)
FRAME_END = "\x1e"
_WORKER_GLOBALS = globals()

# OOM_FILES, oom_kills() and _write_all() come from prelude.py, put in front of this
# source when it is loaded (common.in_sandbox_source).


class BoundedSink:
    """Bytes drained from one pipe: keeps `limit//2` head bytes and `limit//2` tail bytes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset(DEFAULT_MAX_OUTPUT)

    def reset(self, limit):
        with self.lock:
            self.limit = max(2, int(limit))
            self.head = bytearray()
            self.tail = bytearray()
            self.dropped = 0

    def add(self, data):
        with self.lock:
            half = self.limit // 2
            room = half - len(self.head)
            if room > 0:
                self.head += data[:room]
                data = data[room:]
            if not data:
                return
            self.tail += data
            extra = len(self.tail) - (self.limit - half)
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def take(self):
        with self.lock:
            return bytes(self.head), bytes(self.tail), self.dropped


class PipeCapture:
    """Redirect file descriptor `fd` into a pipe drained by a thread into a BoundedSink."""

    def __init__(self, fd):
        self.fd = fd
        self.sink = BoundedSink()
        self._cv = threading.Condition()
        self._token = None
        self._seen = False
        rfd, wfd = os.pipe()
        os.dup2(wfd, fd)
        os.close(wfd)
        self._rfd = rfd
        t = threading.Thread(target=self._drain, name="capture-%d" % fd, daemon=True)
        t.start()

    def _drain(self):
        carry = b""
        while True:
            try:
                data = os.read(self._rfd, 65536)
            except InterruptedError:
                continue
            if not data:
                return
            buf = carry + data
            with self._cv:
                token = self._token
            if token is not None:
                i = buf.find(token)
                if i >= 0:
                    self.sink.add(buf[:i])
                    carry = buf[i + len(token):]
                    with self._cv:
                        self._token = None
                        self._seen = True
                        self._cv.notify_all()
                    continue
                keep = len(token) - 1
                if len(buf) > keep:
                    self.sink.add(buf[:len(buf) - keep])
                    carry = buf[len(buf) - keep:]
                else:
                    carry = buf
            else:
                self.sink.add(buf)
                carry = b""

    def sync(self, timeout=5.0):
        """Wait until everything written to the fd so far has reached the sink."""
        token = b"\x00vf-sync-" + os.urandom(8).hex().encode() + b"\x00"
        with self._cv:
            self._token = token
            self._seen = False
        _write_all(self.fd, token)  # noqa: F821 (prelude.py)
        with self._cv:
            self._cv.wait_for(lambda: self._seen, timeout)


class Worker:
    def __init__(self, proto_in, proto_out):
        self.proto_in = proto_in
        self.proto_out = proto_out
        # the cells' namespace is a fresh `__main__` module (so pickle and
        # `import __main__` see the user's names, not the worker's)
        main_mod = types.ModuleType("__main__")
        main_mod.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main_mod
        self.ns = main_mod.__dict__
        self.count = 0
        self.interruptible = False
        self.stdin = sys.stdin
        self.out = PipeCapture(1)
        self.err = PipeCapture(2)
        self.stdout = self.stderr = None
        self._reset_streams()
        signal.signal(signal.SIGINT, self._on_sigint)

    def _reset_streams(self):
        """Point sys.stdout/err/in back at the captured fds (a cell may have replaced or closed them)."""
        if self.stdout is None or self.stdout.closed:
            self.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                           errors="backslashreplace", line_buffering=True)
        if self.stderr is None or self.stderr.closed:
            self.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                           errors="backslashreplace", line_buffering=True)
        if self.stdin.closed:
            self.stdin = open(os.devnull)
        sys.stdout, sys.stderr, sys.stdin = self.stdout, self.stderr, self.stdin

    def _on_sigint(self, signum, frame):
        if self.interruptible:
            raise KeyboardInterrupt

    def send(self, obj):
        line = json.dumps(obj, ensure_ascii=True) + FRAME_END + str(obj["id"]) + "\n"
        _write_all(self.proto_out, line.encode("ascii"))  # noqa: F821 (prelude.py)

    def run(self):
        self.send({"id": 0, "ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
        while True:
            try:
                line = self.proto_in.readline()
            except KeyboardInterrupt:
                continue
            if not line:
                return
            try:
                req = json.loads(line)
                rid = req["id"]
            except Exception as exc:
                self.send({"id": -1, "status": "error", "traceback": "bad request: %r" % (exc,)})
                continue
            if req.get("shutdown"):
                self.send({"id": rid, "status": "ok", "shutdown": True})
                return
            resp = self.run_cell(req.get("code", ""), int(req.get("max_output") or DEFAULT_MAX_OUTPUT))
            resp["id"] = rid
            self.send(resp)

    def run_cell(self, code, max_output):
        """Run one cell in the namespace and answer its response (all fields but the id)."""
        n, filename = self._start_cell(code, max_output)
        start = time.monotonic()
        status, result, tb = self._execute(code, filename, max_output)
        duration = time.monotonic() - start
        self._flush_output()
        resp = {"status": status, "result": result, "traceback": tb, "execution_count": n,
                "duration": round(duration, 6), "oom_kills": oom_kills()}  # noqa: F821 (prelude.py)
        self._add_captured_output(resp)
        return resp

    def _start_cell(self, code, max_output):
        """Number the cell, register its source for tracebacks, empty the sinks: (number, filename)."""
        self.count += 1
        n = self.count
        filename = "<cell-%d>" % n
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        self.out.sink.reset(max_output)
        self.err.sink.reset(max_output)
        self._reset_streams()
        return n, filename

    def _execute(self, code, filename, max_output):
        """Compile and run the cell, SIGINT armed only while it runs: (status, result repr or None, traceback)."""
        status, result, tb = "ok", None, None
        try:
            try:
                body, expr = _compile_cell(code, filename)
                self.interruptible = True
                try:
                    exec(body, self.ns)
                    if expr is not None:
                        value = eval(expr, self.ns)
                        if value is not None:
                            self.ns["_"] = value
                            result = _bounded(repr(value), max_output)
                finally:
                    self.interruptible = False
            except KeyboardInterrupt:
                self.interruptible = False
                status, tb = "interrupted", self.format_exc()
            except BaseException:  # SystemExit too: the worker must survive the cell
                self.interruptible = False
                status, tb = "error", self.format_exc()
        except KeyboardInterrupt:  # a late interrupt landing in the handlers above
            self.interruptible = False
            status = "interrupted"
        self.interruptible = False
        return status, result, tb

    def _flush_output(self):
        """Flush the cell's Python streams and wait until all its fd output reached the sinks."""
        for stream in (sys.stdout, sys.stderr, self.stdout, self.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self.out.sync()
        self.err.sync()

    def _add_captured_output(self, resp):
        """Put the captured stdout/stderr (head, cut marker, tail) and their dropped counts into `resp`."""
        for key, cap in (("stdout", self.out), ("stderr", self.err)):
            head, tail, dropped = cap.sink.take()
            if dropped:
                resp[key] = "%s\n[... %d bytes cut ...]\n%s" % (
                    head.decode("utf-8", "replace"), dropped, tail.decode("utf-8", "replace"))
            else:
                resp[key] = (head + tail).decode("utf-8", "replace")
            resp[key + "_dropped"] = dropped

    def format_exc(self):
        etype, value, tb = sys.exc_info()
        # show only the user's frames: the worker's own share this module's globals
        frames = []
        while tb is not None:
            if tb.tb_frame.f_globals is not _WORKER_GLOBALS:
                frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        if not frames:
            return "".join(traceback.format_exception_only(etype, value))
        stack = traceback.StackSummary.extract(frames)
        return "Traceback (most recent call last):\n" + "".join(stack.format()) + "".join(
            traceback.format_exception_only(etype, value))


def _compile_cell(code, filename):
    """(body code, last-expression code or None): a trailing expression statement is split off to be evaluated."""
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
    body = compile(tree, filename, "exec")
    expr = compile(ast.Expression(last.value), filename, "eval") if last is not None else None
    return body, expr


def _bounded(text, limit):
    if len(text) <= limit:
        return text
    half = limit // 2
    return "%s\n[... %d characters cut ...]\n%s" % (text[:half], len(text) - 2 * half, text[-half:])


def main():
    # Keep private copies of the protocol channel, then point fds 0/1/2 elsewhere
    proto_in_fd = os.dup(0)
    proto_out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull)
    proto_in = os.fdopen(proto_in_fd, "rb", buffering=0)
    proto_in = io.BufferedReader(proto_in)
    workdir = os.environ.get("VF_REPL_CWD")
    if workdir:
        try:
            os.chdir(workdir)
        except OSError:
            pass
    if "" not in sys.path:
        sys.path.insert(0, "")
    sys.argv = [""]
    Worker(proto_in, proto_out_fd).run()


if __name__ == "__main__":
    main()
