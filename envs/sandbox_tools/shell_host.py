"""The persistent-shell host that runs INSIDE a sandbox (stdlib only, Python 3.7+).

`python3 -u -c <this source> bash --noprofile --norc` starts bash with its
stdout and stderr on one pipe that only this program reads, and serves one
command at a time over its own stdin/stdout:

* request  (stdin, one line): `{"id": N, "line": "<bash line>", "end": "<frame tail>", "limit": B}`.
  `line` runs the command and then prints the frame `\\x1e<exit status><end>`.
* response (stdout): `<json>` + `\\x1e` + `N` + `\\n`, json being
  `{"id", "output", "dropped", "exit_code", "exited", "oom_kills"}` (the
  cgroup's OOM-kill counter after the command, null where not exposed). `output` keeps the
  first and last `limit//2` bytes of what the command printed (the middle
  is counted in `dropped`), so memory stays bounded however much it prints.
  The frame of id 0 (`{"id": 0, "ready": true}`) says the shell is up.

When bash exits, the response says `exited` with its status and this
program ends. SIGINT (sent by the host to the process group when a command
times out) reaches bash and its foreground job; here it is caught and
ignored, so only the command is interrupted.
"""

import json
import os
import signal
import sys

FRAME_END = "\x1e"

# OOM_FILES, oom_kills() and _write_all() come from prelude.py, put in front of this
# source when it is loaded (common.in_sandbox_source).


class Capture(object):
    """Head and tail of one command's output (bytes), the middle counted."""

    def __init__(self, limit):
        self.half = max(1, int(limit) // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data):
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            extra = len(self.tail) - self.half
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def text(self):
        if self.dropped:
            return "%s\n[... %d bytes cut ...]\n%s" % (
                self.head.decode("utf-8", "replace"), self.dropped, self.tail.decode("utf-8", "replace"))
        return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")


class Shell(object):
    """bash with its stdin on one pipe and its stdout and stderr on another. Plain
    fork/exec: importing `subprocess` costs more than the rest of this program's start,
    which every rollout pays once."""

    def __init__(self, argv):
        in_r, self.in_fd = os.pipe()  # os.pipe descriptors are not inherited across exec
        self.out_fd, out_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(out_w, 2)
                os.closerange(3, 256)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; a shell must not
                os.execvp(argv[0], argv)
            except BaseException:  # noqa: BLE001 - exec failed: the child must not return into this program
                pass
            os._exit(127)
        os.close(in_r)
        os.close(out_w)
        self.code = None

    def write(self, data):
        _write_all(self.in_fd, data)  # noqa: F821 (prelude.py)

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def wait(self):
        if self.code is None:
            while True:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    break
                except InterruptedError:
                    continue
            self.code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.code


def main():
    # a handler (not SIG_IGN): bash and its children get the default disposition back
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    argv = sys.argv[1:] or ["bash", "--noprofile", "--norc"]
    shell = Shell(argv)
    out_fd = shell.out_fd
    proto_out = sys.stdout.fileno()
    proto_in = sys.stdin.buffer

    def send(obj):
        line = json.dumps(obj, ensure_ascii=True) + FRAME_END + str(obj["id"]) + "\n"
        _write_all(proto_out, line.encode("ascii"))  # noqa: F821 (prelude.py)

    send({"id": 0, "ready": True, "pid": shell.pid})
    while True:
        try:
            raw = proto_in.readline()
        except InterruptedError:
            continue
        if not raw:
            shell.kill()
            return
        try:
            req = json.loads(raw)
            rid = req["id"]
            end = req["end"].encode()
        except Exception as exc:
            send({"id": -1, "error": "bad request: %r" % (exc,)})
            continue
        cap = Capture(req.get("limit") or 16384)
        try:
            shell.write(req["line"].encode())
        except OSError:
            pass  # bash is gone: the read below sees EOF
        keep = len(end) + 16  # bytes held back: the frame may be arriving
        pending = bytearray()
        code = None
        exited = False
        while True:
            try:
                data = os.read(out_fd, 65536)
            except InterruptedError:
                continue
            if not data:
                exited = True
                break
            pending += data
            i = pending.find(end)
            if i >= 0:
                start = pending.rfind(b"\x1e", 0, i)
                try:
                    code = int(pending[start + 1:i])
                except ValueError:
                    code = None
                cap.add(bytes(pending[:max(start, 0)]))
                # anything after the frame (a background job's output) is dropped
                break
            if len(pending) > keep:
                cap.add(bytes(pending[:-keep]))
                del pending[:-keep]
        if exited:
            cap.add(bytes(pending))
            code = shell.wait()
        send({"id": rid, "output": cap.text(), "dropped": cap.dropped, "exit_code": code, "exited": exited,
              "oom_kills": oom_kills()})  # noqa: F821 (prelude.py)
        if exited:
            return


if __name__ == "__main__":
    main()
