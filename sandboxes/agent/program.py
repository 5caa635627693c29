"""The in-sandbox agent: one long-lived process per sandbox that runs commands,
background processes and file transfers for the host, many at once.

Started once per sandbox as `python3 -u -c <this source>` (nothing is written
into the sandbox first). Standard library only, Python 3.7+. It speaks JSON
lines on stdin/stdout (see `protocol.py` for the message shapes; binary data
is base64) and logs to stderr. Each request runs in its own worker thread, so
one slow command never blocks another; two spare workers wait beyond the
requests in flight, so a sandbox whose code fills its pids limit (a fork bomb:
no thread can be started) is still served (`dispatch`). Every command runs in its own session
(setsid): a timeout kills its whole process group and the agent lives on.
Output buffers are bounded (head + tail kept, dropped bytes counted).
On stdin EOF the agent kills every process group it started and exits.
Where it holds CAP_SETUID/SETGID/SETPCAP (`SandboxSpec.user_switch`) every command
sheds them in its child before exec (`prepare_shed`, `spawn`): the agent switches
users, the sandboxed code never holds a capability.
"""

import base64
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time

PROTOCOL_VERSION = 1
READ_SIZE = 65536
CHUNK = 1 << 20  # bytes per data chunk of file/tar transfers
WINDOW = 4 << 20  # unacknowledged chunk bytes per request before the sender waits
DRAIN_GRACE = 0.1  # seconds to wait for pipes to close after the main process exited

_out = sys.stdout.buffer
_out_lock = threading.Lock()
_requests = {}  # id -> Request (live ones)
_requests_lock = threading.Lock()
_procs = {}  # pid -> Background
_procs_lock = threading.Lock()
_groups = set()  # pgids of running execs (killed on exit)
# commands between their fork and the registration of their pid above: a cell's PID 1 reaps
# orphans (cells_program.reap_orphans) and must never take the status of a child not yet
# registered (subprocess then reads ECHILD as exit code 0: a failed command reported as
# passed), so it reaps only while none is in that window (counted under _spawn_lock; the
# spawns themselves run concurrently)
_spawning = [0]
_spawn_lock = threading.Lock()


def spawn_registered(register, req, **kw):
    """spawn(req, **kw), then register(proc), inside the window reap_orphans waits out."""
    with _spawn_lock:
        _spawning[0] += 1
    try:
        proc = spawn(req, **kw)
        register(proc)
        return proc
    finally:
        with _spawn_lock:
            _spawning[0] -= 1
_jobs = queue.SimpleQueue()  # requests for the worker threads
_idle = [0]  # free workers minus queued requests (negative: requests waiting for a worker)
SPARE_WORKERS = 2  # free workers kept beyond the queued requests (`dispatch`)
INLINE_OPS = ("kill", "poll", "ping", "forget")  # never block: served by the reading thread when no worker is free
_idle_lock = threading.Lock()


def log(msg):
    try:
        sys.stderr.write("agent: %s\n" % msg)
        sys.stderr.flush()
    except Exception:
        pass


def send(msg):
    line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
    with _out_lock:
        write_all(_out, line)


def write_all(out, data):
    """Write every byte: `python -u` makes stdout a raw file whose write() may be partial
    (gVisor returns short writes on pipes over 64 KiB where Linux blocks), or None on EAGAIN."""
    view = memoryview(data)
    while view:
        n = out.write(view)
        if n is None:  # non-blocking and full: wait until writable
            select.select([], [out], [], 1.0)
            continue
        view = view[n:]
    out.flush()


def b64(data):
    return base64.b64encode(bytes(data)).decode("ascii")


def unb64(text):
    return base64.b64decode(text) if text else b""


class AgentPathError(Exception):
    kind = "path"

    def __init__(self, message, code=None):
        Exception.__init__(self, message)
        self.code = code  # errno name (ENOENT, EISDIR, EACCES...): the host's typed PathError


class AgentUsageError(Exception):
    kind = "usage"


class AgentTooLarge(Exception):
    kind = "too_large"


class AgentUserError(Exception):
    """exec(user=...): "unknown_user" (not in /etc/passwd) or "user_unsupported" (cannot switch)."""

    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind


CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 6, 7, 8
SWITCH_CAPS = (CAP_SETGID, CAP_SETUID, CAP_SETPCAP)  # what a user_switch sandbox gives its agent alone
PR_CAPBSET_DROP = 24
CAP_VERSION_3 = 0x20080522
_shed = []  # [libc] once the agent holds SWITCH_CAPS (user_switch): every command sheds them


def _cap_sets():
    """(effective, permitted, bounding) capability masks of this process, from /proc/self/status."""
    caps = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapEff:", "CapPrm:", "CapBnd:")):
                caps[line[:6]] = int(line.split()[1], 16)
    return caps.get("CapEff", 0), caps.get("CapPrm", 0), caps.get("CapBnd", 0)


def prepare_shed():
    """Arm shedding when the agent (root, spec.user_switch) holds SWITCH_CAPS: ctypes and the
    libc are loaded now, before any command runs, so the forked child only makes calls."""
    try:
        eff = _cap_sets()[0]
    except (OSError, ValueError, IndexError):
        return
    if not any(eff & (1 << c) for c in SWITCH_CAPS):
        return
    import ctypes
    import grp  # noqa: F401  (every module the agent imports late, imported before any
    import pwd  # noqa: F401   command could plant a replacement where the agent holds these)
    import stat  # noqa: F401
    import tarfile  # noqa: F401

    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _shed.append((libc, header, data))


def drop_bounding():
    """In a command's child before exec: drop SWITCH_CAPS from the bounding set (needs
    CAP_SETPCAP, so before the sets are cleared). Raising fails the start."""
    libc = _shed[0][0]
    for cap in SWITCH_CAPS:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError("PR_CAPBSET_DROP %d failed" % cap)


def clear_sets():
    """In a command's child, last: remove SWITCH_CAPS from its effective, permitted and
    inheritable sets, so the sandboxed code never holds them. Raising fails the start."""
    libc, header, data = _shed[0]
    header[0], header[1] = CAP_VERSION_3, 0
    if libc.capget(header, data) != 0:
        raise OSError("capget failed")
    mask = ~sum(1 << c for c in SWITCH_CAPS) & 0xFFFFFFFF
    for i in (0, 1, 2, 3, 4, 5):  # effective, permitted, inheritable of caps 0-31 and 32-63
        data[i] &= mask if i < 3 else 0xFFFFFFFF
    header[0], header[1] = CAP_VERSION_3, 0
    if libc.capset(header, data) != 0:
        raise OSError("capset failed")


def _can_switch_users():
    """uid 0 holding CAP_SETUID and CAP_SETGID (what setgroups/setgid/setuid need)."""
    if os.geteuid() != 0:
        return False
    try:
        eff = _cap_sets()[0]
    except (OSError, ValueError, IndexError):
        return False
    return bool(eff & (1 << CAP_SETUID)) and bool(eff & (1 << CAP_SETGID))


def user_switch(user):
    """Popen keywords that run a command as `user` ("name", "uid" or "uid:gid"), {} when it
    is the agent's own user. AgentUserError when the user is unknown or cannot be switched to."""
    if user is None or user == "":
        return {}
    import grp
    import pwd

    name, _, group = str(user).partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid, home, uname = entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_name
    except KeyError:
        if not name.isdigit():
            raise AgentUserError("unknown_user", "no such user in the sandbox: %r (unable to find user %s)" % (name, name))
        uid, gid, home, uname = int(name), int(name), "/", None
    try:
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise AgentUserError("unknown_user", "no such group in the sandbox: %r" % group)
    groups = [gid] + ([g.gr_gid for g in grp.getgrall() if uname in g.gr_mem and g.gr_gid != gid] if uname else [])
    if uid == os.geteuid() and gid == os.getegid():
        return {}
    if not _can_switch_users():
        raise AgentUserError("user_unsupported", "cannot run as %r: the sandbox runs commands as uid %d without "
                             "CAP_SETUID/CAP_SETGID (capabilities dropped), so it cannot switch users" % (user, os.geteuid()))
    env = {"HOME": home or "/"}
    if uname:
        env.update(USER=uname, LOGNAME=uname)
    if _shed:  # the switch and the shedding in one child hook (spawn)
        return {"_become": (groups, gid, uid), "_env": env}
    if sys.version_info >= (3, 9):
        return {"user": uid, "group": gid, "extra_groups": groups, "_env": env}

    def become():
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    return {"preexec_fn": become, "_env": env}


class HeadTail(object):
    """Bounded output buffer: keeps the first and last `limit // 2` bytes."""

    def __init__(self, limit):
        self.head_max = limit - limit // 2
        self.tail_max = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data):
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        extra = len(self.tail) - self.tail_max
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def fields(self, name):
        return {name + "_head": b64(self.head), name + "_tail": b64(self.tail), name + "_dropped": self.dropped}


class Request(object):
    """One in-flight request: flow control for chunks, cancellation, inbound data."""

    def __init__(self, rid):
        self.id = rid
        self.cond = threading.Condition()
        self.unacked = 0
        self.cancelled = False
        self.inbox = []  # inbound data pieces (bytes) or None at EOF

    def chunk(self, stream, data, deadline=None):
        """Send a chunk, waiting while the host has too much unacknowledged data.
        Returns False when the wait ran past `deadline` or the request was cancelled."""
        with self.cond:
            while self.unacked >= WINDOW and not self.cancelled:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
            if self.cancelled:
                return False
            self.unacked += len(data)
        send({"id": self.id, "ev": "chunk", "stream": stream, "data": b64(data)})
        return True

    def ack(self, n):
        with self.cond:
            self.unacked = max(0, self.unacked - n)
            self.cond.notify_all()

    def cancel(self):
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    def feed(self, data):
        with self.cond:
            self.inbox.append(data)
            self.cond.notify_all()

    def read_inbound(self):
        """Next inbound piece (bytes), b'' at EOF."""
        with self.cond:
            while not self.inbox and not self.cancelled:
                self.cond.wait()
            if not self.inbox:
                return b""
            piece = self.inbox.pop(0)
            return b"" if piece is None else piece


class InboundReader(object):
    """File-like view of the data messages that follow a request (for tarfile)."""

    def __init__(self, req):
        self.req = req
        self.buf = b""
        self.eof = False

    def read(self, n=-1):
        while not self.eof and (n < 0 or len(self.buf) < n):
            piece = self.req.read_inbound()
            if not piece:
                self.eof = True
                break
            self.buf += piece
        if n < 0:
            out, self.buf = self.buf, b""
        else:
            out, self.buf = self.buf[:n], self.buf[n:]
        return out


class ChunkWriter(object):
    """File-like sink that sends what is written as chunk events of CHUNK bytes."""

    def __init__(self, req, stream="data", limit=None, what="transfer"):
        self.req = req
        self.stream = stream
        self.buf = bytearray()
        self.limit = limit
        self.what = what
        self.total = 0

    def write(self, data):
        self.total += len(data)
        if self.limit is not None and self.total > self.limit:
            raise AgentTooLarge("%s is larger than the transfer limit of %d bytes" % (self.what, self.limit))
        self.buf += data
        while len(self.buf) >= CHUNK:
            self._emit(bytes(self.buf[:CHUNK]))
            del self.buf[:CHUNK]
        return len(data)

    def flush(self):
        pass

    def close_out(self):
        if self.buf:
            self._emit(bytes(self.buf))
            self.buf = bytearray()

    def _emit(self, data):
        if not self.req.chunk(self.stream, data):
            raise AgentUsageError("transfer cancelled")


# ---------------------------------------------------------------- processes


def command_argv(req):
    if req.get("shell") is not None:
        return ["/bin/sh", "-c", req["shell"]]
    argv = req.get("argv")
    if not argv:
        raise AgentUsageError("empty command")
    return [str(a) for a in argv]


def command_env(req):
    if not req.get("env"):
        return None  # inherit
    env = dict(os.environ)
    env.update(req["env"])
    return env


def oom_kills():
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"), ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key:
                        return int(parts[1])
        except (OSError, ValueError):
            continue
    return None


def kill_group(pid, sig=signal.SIGKILL):
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def kill_group_fully(proc, within=2.0):
    """SIGKILL the command's process group until it is empty (a fork bomb forks between
    signals: one killpg can miss children born meanwhile, which then hold the pids limit)."""
    end = time.monotonic() + within
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            return
        proc.poll()  # reap the leader: a zombie still counts as a member of its group
        if time.monotonic() > end:
            return
        time.sleep(0.005)


def spawn(req, stdin_pipe, switch=None):
    switch = dict(switch or {})
    env = command_env(req)
    if "_env" in switch:  # another user: its HOME / USER (the request's own env still wins)
        env = dict(env if env is not None else os.environ)
        env.update(switch.pop("_env"))
        env.update(req.get("env") or {})
    become = switch.pop("_become", None)
    if _shed:
        def child():
            if become is not None:
                os.setgroups(become[0])
                os.setgid(become[1])
            drop_bounding()  # while CAP_SETPCAP is held
            if become is not None:
                os.setuid(become[2])  # 0 -> non-zero uid: the kernel clears permitted and effective
            clear_sets()  # a root command (or uid 0 with another group): nothing of SWITCH_CAPS left
        switch["preexec_fn"] = child
    return subprocess.Popen(
        command_argv(req),
        stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=req.get("cwd") or None,
        env=env,
        start_new_session=True,
        **switch
    )



def wait_exit(proc, left):
    """proc.wait(left) without Popen's 1 ms first sleep: a pidfd where the kernel has them."""
    if proc.poll() is not None:
        return proc.returncode
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = None
    if pidfd is not None:
        try:
            p = select.poll()
            p.register(pidfd, select.POLLIN)
            p.poll(None if left is None else left * 1000.0)
        finally:
            os.close(pidfd)
        if proc.poll() is not None:
            return proc.returncode
        if left is not None:
            raise subprocess.TimeoutExpired(proc.args, left)
    end = None if left is None else time.monotonic() + left
    delay = 0.0001
    while proc.poll() is None:
        if end is not None and time.monotonic() >= end:
            raise subprocess.TimeoutExpired(proc.args, left)
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return proc.returncode


def failed_start(exc, started):
    """Result for a command that could not start (like a shell: 127 not found, 126 otherwise)."""
    code = 127 if isinstance(exc, FileNotFoundError) else 126
    msg = ("agent: cannot run command: %s\n" % exc).encode()
    return {"exit_code": code, "signal": None, "timed_out": False, "oom_killed": False,
            "stdout_head": "", "stdout_tail": "", "stdout_dropped": 0,
            "stderr_head": b64(msg), "stderr_tail": "", "stderr_dropped": 0,
            "duration": time.monotonic() - started, "start_error": ERRNO_NAMES.get(type(exc)) or "EINVAL"}


def _drain_forever(pipes):
    """Read and discard what processes left behind still write (a `cmd &` of the command)."""
    by_fd = dict((p.fileno(), p) for p in pipes)
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    while by_fd:
        for fd, _ in poller.poll():
            try:
                data = os.read(fd, READ_SIZE)
            except OSError:
                data = b""
            if not data:
                poller.unregister(fd)
                _close(by_fd.pop(fd))


def _close(fileobj):
    """Close through the file object (never os.close: its fd number could be reused by then)."""
    try:
        fileobj.close()
    except (OSError, ValueError):
        pass


def op_exec(req, ctx):
    """Run one command to its end: its output read into bounded buffers (streamed as chunks
    with `stream`), killed at its deadline or on cancel, its exit status and OOM kill read."""
    started = time.monotonic()
    timeout = req.get("timeout")
    deadline = started + float(timeout) if timeout else None
    limit = int(req.get("limit") or (1 << 20))
    streaming = bool(req.get("stream"))
    stdin_data = unb64(req.get("stdin"))
    oom_before = oom_kills()
    switch = user_switch(req.get("user"))
    try:
        proc = spawn_registered(lambda p: _groups.add(p.pid), req, stdin_pipe=bool(stdin_data), switch=switch)
    except (OSError, ValueError, TypeError) as exc:
        return failed_start(exc, started)
    if stdin_data:
        try:
            _feed_stdin(proc, stdin_data)
        except PidsLimitError as exc:  # the command could not be run (killed): as a failed start
            _groups.discard(proc.pid)
            return failed_start(exc, started)
    run = CommandRun(proc, ctx, started, deadline, limit, streaming)
    try:
        run.read_until_exit()
        run.read_leftovers_after_kill()
        code = run.wait_for_exit()
    finally:
        _groups.discard(proc.pid)
        run.release_pipes()
    return run.result(code, time.monotonic() - started, oom_before)


class PidsLimitError(RuntimeError):
    """The sandbox's pids limit left no thread to serve a process the agent just started."""


def start_serving(proc, threads):
    """Start the threads that serve a process just spawned (its stdin writer, its output
    pumps: (target, args) each). A sandbox at its pids limit may refuse them (the process
    itself may have filled it): then the process's whole group is killed, since no handle
    to it will reach the client, and PidsLimitError says why."""
    try:
        for target, args in threads:
            threading.Thread(target=target, args=args, daemon=True).start()
    except RuntimeError as exc:
        kill_group_fully(proc)
        proc.wait()
        raise PidsLimitError("the sandbox's pids limit left no thread to serve the process (%s); it was killed" % exc)


def _feed_stdin(proc, data):
    """Write a command's stdin from a thread (a command that reads nothing must not block us)."""
    def feed():
        try:
            proc.stdin.write(data)
        except (OSError, ValueError):
            pass
        finally:
            _close(proc.stdin)
    start_serving(proc, [(feed, ())])


class CommandRun(object):
    """The output pipes of one exec'd command and the clocks that end it: stdout and stderr
    polled into bounded buffers until both close, the main process has exited for
    DRAIN_GRACE, the deadline passes (timed_out) or the request is cancelled."""

    def __init__(self, proc, ctx, started, deadline, limit, streaming):
        self.proc = proc
        self.ctx = ctx
        self.deadline = deadline
        self.streaming = streaming
        self.bufs = {proc.stdout.fileno(): ("stdout", HeadTail(limit)),
                     proc.stderr.fileno(): ("stderr", HeadTail(limit))}
        self.fds = list(self.bufs)
        self.pipes = {proc.stdout.fileno(): proc.stdout, proc.stderr.fileno(): proc.stderr}
        self.poller = select.poll()
        for fd in self.fds:
            self.poller.register(fd, select.POLLIN)
        self.open_fds = set(self.fds)
        self.timed_out = False
        self.exited_at = None
        self.last_poll = started

    def read_ready(self, wait):
        """Read what the pipes hold after up to `wait` s; False when a streamed chunk found
        the request cancelled, else whether any pipe had an event."""
        events = self.poller.poll(None if wait is None else wait * 1000.0)
        for fd, _ in events:
            try:
                data = os.read(fd, READ_SIZE)
            except OSError:
                data = b""
            if not data:
                self.poller.unregister(fd)
                self.open_fds.discard(fd)
                continue
            name, buf = self.bufs[fd]
            buf.add(data)
            if self.streaming and not self.ctx.chunk(name, data, self.deadline) and self.ctx.cancelled:
                return False
        return bool(events)

    def read_until_exit(self):
        """Read until both pipes close, DRAIN_GRACE after the main process exited (leftovers
        may keep the pipes open), or the deadline / a cancel kills the process group."""
        proc, ctx, deadline = self.proc, self.ctx, self.deadline
        while self.open_fds:
            now = time.monotonic()
            if ctx.cancelled or (deadline is not None and now >= deadline):
                self.timed_out = not ctx.cancelled
                kill_group_fully(proc)
                break
            if self.exited_at is not None and now - self.exited_at > DRAIN_GRACE:
                break  # main process gone; leftovers keep the pipes open
            wait = 0.05 if self.exited_at is None else DRAIN_GRACE / 2
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            got = self.read_ready(wait)
            if self.exited_at is None and (not got or now - self.last_poll > 0.05):
                self.last_poll = now
                if proc.poll() is not None:
                    self.exited_at = time.monotonic()
            if ctx.cancelled:
                kill_group(proc.pid)
                break

    def read_leftovers_after_kill(self):
        """After a timeout or cancel the group is dead: take what is still buffered in the
        pipes, briefly (0.5 s at most)."""
        if self.timed_out or self.ctx.cancelled:
            end = time.monotonic() + 0.5
            while self.open_fds and time.monotonic() < end:
                self.read_ready(0.05)

    def wait_for_exit(self):
        """The main process's exit code, waited for until the deadline; one that closed its
        pipes but kept running past it is killed (timed_out)."""
        proc = self.proc
        try:
            left = None
            if self.deadline is not None and not self.timed_out:
                left = max(0.0, self.deadline - time.monotonic())
            return wait_exit(proc, left)
        except subprocess.TimeoutExpired:  # closed its pipes but kept running
            self.timed_out = True
            kill_group(proc.pid)
            return proc.wait()

    def release_pipes(self):
        """Close the closed pipes; the still open ones (a `cmd &` left behind) are drained by
        a thread so their writers never block, or closed after a timeout / cancel or when
        no thread can be started (pids limit)."""
        leftover = [self.pipes[fd] for fd in self.fds if fd in self.open_fds]
        for fd in self.fds:
            if fd not in self.open_fds:
                _close(self.pipes[fd])
        drained = False
        if leftover and not self.timed_out and not self.ctx.cancelled:
            try:
                threading.Thread(target=_drain_forever, args=(leftover,), daemon=True).start()
                drained = True
            except RuntimeError:  # no thread to spare (pids limit): the leftovers lose their pipes
                pass
        if not drained:
            for pipe in leftover:
                _close(pipe)

    def result(self, code, duration, oom_before):
        """The exec reply: exit code or signal, timed_out, oom_killed, duration and output."""
        sig = -code if code < 0 else None
        oom = False
        if not self.timed_out and (sig == signal.SIGKILL or code == 128 + signal.SIGKILL):
            # killed by SIGKILL itself, or a shell reporting a child's SIGKILL (exit 137): an OOM
            # kill when the sandbox cgroup's oom_kill counter rose while the command ran
            after = oom_kills()
            oom = after is not None and oom_before is not None and after > oom_before
        result = {"exit_code": None if sig else code, "signal": sig, "timed_out": self.timed_out,
                  "oom_killed": oom, "duration": duration}
        result.update(self.bufs[self.fds[0]][1].fields("stdout"))
        result.update(self.bufs[self.fds[1]][1].fields("stderr"))
        return result


class Background(object):
    """A background process: pipes drained by two threads into bounded buffers. A full
    buffer drops its oldest bytes ("newest") or, with keep="head_tail", the bytes after
    the first half: what was unread keeps its head and its newest bytes, and `gap` says
    where the cut is (a command's output, read up to its end frame, as a shell shows it)."""

    def __init__(self, proc, limit, keep="newest"):
        self.proc = proc
        self.limit = limit
        self.head_tail = keep == "head_tail"
        self.cond = threading.Condition()
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.dropped = {"stdout": 0, "stderr": 0}
        self.gap = {"stdout": None, "stderr": None}
        self.eof = {"stdout": False, "stderr": False}
        start_serving(proc, [(self._pump, ("stdout", proc.stdout)), (self._pump, ("stderr", proc.stderr))])

    def _pump(self, name, pipe):
        fd = pipe.fileno()
        while True:
            try:
                data = os.read(fd, READ_SIZE)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.eof[name] = True
                    self.cond.notify_all()
                    break
                buf = self.out[name]
                buf += data
                extra = len(buf) - self.limit
                if extra > 0 and self.head_tail:  # keep the head and the newest bytes
                    at = self.limit // 2
                    del buf[at:at + extra]
                    self.dropped[name] += extra
                    if self.gap[name] is None:
                        self.gap[name] = at
                elif extra > 0:  # keep the most recent output
                    del buf[:extra]
                    self.dropped[name] += extra
                self.cond.notify_all()
        try:
            pipe.close()
        except OSError:
            pass

    def drain(self, grace=DRAIN_GRACE, cap=1.0):
        """After the process exited: wait until the pumps have taken what it wrote, so a read
        after `wait` sees all of it. Done at EOF on both pipes, or once `grace` has passed and
        nothing is left unread in them (a leftover child may hold a pipe open), or at `cap`
        (a leftover child that keeps writing)."""
        now = time.monotonic()
        grace_end, cap_end = now + grace, now + cap
        with self.cond:
            while not all(self.eof.values()):
                now = time.monotonic()
                if now >= cap_end or (now >= grace_end and not self._pending()):
                    break
                self.cond.wait(0.02)

    def _pending(self):
        """A pipe not yet at EOF holds unread bytes, or its EOF (under `cond`: its pump has
        not closed it)."""
        fds = [p.fileno() for name, p in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
               if not self.eof[name]]
        try:
            return bool(fds) and bool(select.select(fds, [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def status(self):
        code = self.proc.poll()
        sig = -code if code is not None and code < 0 else None
        return {"pid": self.proc.pid, "running": code is None,
                "exit_code": None if (code is None or sig) else code, "signal": sig}

    def read(self, until=None, timeout=None):
        marker = until.encode() if until else None
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        exited = False
        with self.cond:
            while marker is not None:
                if marker in self.out["stdout"] or all(self.eof.values()) or exited:
                    break
                exited = self.proc.poll() is not None  # one more short wait for the pumps
                left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                if left <= 0:
                    break
                self.cond.wait(left)
            out = self.out["stdout"]
            cut = len(out)
            if marker is not None:
                pos = out.find(marker)
                if pos >= 0:
                    cut = pos + len(marker)
            stdout = bytes(out[:cut])
            del out[:cut]
            stderr = bytes(self.out["stderr"])
            del self.out["stderr"][:]
            dropped = dict(self.dropped)
            gap = dict(self.gap)
            self.dropped = {"stdout": 0, "stderr": 0}
            self.gap = {"stdout": None, "stderr": None}
            if gap["stdout"] is not None and gap["stdout"] > cut:  # the cut is in what stays buffered
                self.dropped["stdout"], self.gap["stdout"] = dropped["stdout"], gap["stdout"] - cut
                dropped["stdout"], gap["stdout"] = 0, None
        return {"stdout": b64(stdout), "stderr": b64(stderr), "stdout_dropped": dropped["stdout"],
                "stderr_dropped": dropped["stderr"], "stdout_gap": gap["stdout"], "stderr_gap": gap["stderr"],
                "found": bool(marker) and marker in stdout}


def get_proc(req):
    with _procs_lock:
        bg = _procs.get(int(req.get("pid", -1)))
    if bg is None:
        raise AgentUsageError("no background process with pid %s" % req.get("pid"))
    return bg


def op_start(req, ctx):
    limit = int(req.get("limit") or (1 << 20))
    keep = req.get("keep") or "newest"
    if keep not in ("newest", "head_tail"):
        raise AgentUsageError("keep must be newest or head_tail, not %r" % (keep,))
    def register(proc):
        bg = Background(proc, limit, keep)
        with _procs_lock:
            _procs[proc.pid] = bg

    try:
        proc = spawn_registered(register, req, stdin_pipe=True)
    except (OSError, ValueError, TypeError) as exc:
        raise AgentUsageError("cannot start process: %s" % exc) from None
    return {"pid": proc.pid}


def op_poll(req, ctx):
    return get_proc(req).status()


def op_read(req, ctx):
    return get_proc(req).read(req.get("until"), req.get("timeout"))


def op_write_stdin(req, ctx):
    bg = get_proc(req)
    try:
        if req.get("data"):
            bg.proc.stdin.write(unb64(req["data"]))
            bg.proc.stdin.flush()
        if req.get("close"):
            bg.proc.stdin.close()
    except (OSError, ValueError) as exc:
        return {"written": False, "error": str(exc)}
    return {"written": True}


def op_kill(req, ctx):
    bg = get_proc(req)
    sig = int(req.get("signal") or signal.SIGKILL)
    if req.get("group", True):
        kill_group(bg.proc.pid, sig)
    elif bg.proc.poll() is None:
        try:
            os.kill(bg.proc.pid, sig)
        except OSError:
            pass
    return bg.status()


def op_wait(req, ctx):
    bg = get_proc(req)
    try:
        bg.proc.wait(req.get("timeout"))
        bg.drain()
    except subprocess.TimeoutExpired:
        pass
    return bg.status()


def op_forget(req, ctx):
    with _procs_lock:
        bg = _procs.pop(int(req.get("pid", -1)), None)
    if bg is not None and bg.proc.poll() is None:
        kill_group(bg.proc.pid)
        bg.proc.wait()
    return {}


# ---------------------------------------------------------------- files


ERRNO_NAMES = {FileNotFoundError: "ENOENT", NotADirectoryError: "ENOTDIR", IsADirectoryError: "EISDIR",
               PermissionError: "EACCES", FileExistsError: "EEXIST"}  # the host's typed PathErrors


def path_errors(fn):
    def wrapped(req, ctx):
        try:
            return fn(req, ctx)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError) as exc:
            code = ERRNO_NAMES.get(type(exc))
            raise AgentPathError("%s: %s" % (exc.strerror or type(exc).__name__, exc.filename or req.get("path")),
                                 code) from None
    return wrapped


@path_errors
def op_write_file(req, ctx):
    path = req["path"]
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as f:
        if "data" in req:
            f.write(unb64(req["data"]))
        else:
            while True:
                piece = ctx.read_inbound()
                if not piece:
                    break
                f.write(piece)
    os.chmod(path, int(req.get("mode", 0o644)))
    return {"path": path}


@path_errors
def op_read_file(req, ctx):
    path = req["path"]
    max_bytes = req.get("max_bytes")
    limit = req.get("limit")  # only without max_bytes: a larger file is refused, not cut
    left = None if max_bytes is None else int(max_bytes)
    size = 0
    with open(path, "rb") as f:
        if left is None and limit is not None:
            total = os.fstat(f.fileno()).st_size
            if total > int(limit):
                raise AgentTooLarge("%s is %d bytes, over the read limit of %d bytes: pass max_bytes= to read "
                                    "its start, or download() it" % (path, total, int(limit)))
        while left is None or left > 0:
            data = f.read(CHUNK if left is None else min(CHUNK, left))
            if not data:
                break
            size += len(data)
            if left is not None:
                left -= len(data)
            elif limit is not None and size > int(limit):  # grew while read, or a /proc-like file
                raise AgentTooLarge("%s: more than the read limit of %d bytes" % (path, int(limit)))
            if not ctx.chunk("data", data):
                raise AgentUsageError("transfer cancelled")
    return {"size": size}


def _inside(root, path):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root.rstrip("/") + "/")


@path_errors
def op_put_tar(req, ctx):
    import tarfile

    dest = req["dest"]
    limit = req.get("limit")
    os.makedirs(dest, exist_ok=True)
    reader = InboundReader(ctx)
    dirs = []
    total = 0
    try:
        with tarfile.open(fileobj=reader, mode="r|") as tar:  # uncompressed only: no decompression bombs
            for m in tar:
                total += max(0, m.size)
                if limit is not None and total > int(limit):
                    raise AgentTooLarge("archive holds more than the transfer limit of %d bytes (at %s)" % (int(limit), m.name))
                name = os.path.normpath(m.name)
                if name == ".":
                    dirs.append((dest, m))
                    continue
                if os.path.isabs(m.name) or name.startswith(".."):
                    raise AgentPathError("archive member escapes destination: %s" % m.name)
                target = os.path.join(dest, name)
                if not _inside(dest, os.path.dirname(target)):
                    raise AgentPathError("archive member would be written through a link out of destination: %s" % m.name)
                if m.islnk():
                    link = os.path.normpath(m.linkname)
                    if os.path.isabs(m.linkname) or link.startswith(".."):
                        raise AgentPathError("hard link escapes destination: %s" % m.name)
                if m.isdev():
                    raise AgentPathError("device files are refused: %s" % m.name)
                if m.isdir():
                    dirs.append((target, m))
                    os.makedirs(target, exist_ok=True)
                    continue
                if os.path.lexists(target) and not os.path.isdir(target):
                    os.unlink(target)
                kw = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}
                tar.extract(m, dest, **kw)
    except tarfile.TarError as exc:
        raise AgentUsageError("bad tar stream: %s" % exc) from None
    for path, m in reversed(dirs):
        try:
            os.chmod(path, m.mode)
        except OSError:
            pass
    return {"dest": dest}


@path_errors
def op_get_tar(req, ctx):
    import tarfile

    path = req["path"]
    st = os.lstat(path)
    import stat as stat_mod
    kind = "dir" if stat_mod.S_ISDIR(st.st_mode) else "file"
    limit = req.get("limit")
    sink = ChunkWriter(ctx, limit=None if limit is None else int(limit), what=path)
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        if kind == "dir":
            tar.add(path, arcname=".", recursive=True)
        else:
            tar.add(path, arcname=os.path.basename(path.rstrip("/")) or "file", recursive=False)
    sink.close_out()
    return {"kind": kind}


def op_ping(req, ctx):
    return {"pong": True, "time": time.time()}


OPS = {
    "exec": op_exec, "start": op_start, "poll": op_poll, "read": op_read,
    "write_stdin": op_write_stdin, "kill": op_kill, "wait": op_wait, "forget": op_forget,
    "write_file": op_write_file, "read_file": op_read_file,
    "put_tar": op_put_tar, "get_tar": op_get_tar, "ping": op_ping,
}


def answer(req, ctx):
    """Run one request: its reply (a result, or an error of a kind the client maps)."""
    rid = req.get("id")
    try:
        op = OPS.get(req.get("op"))
        if op is None:
            raise AgentUsageError("unknown op %r" % req.get("op"))
        result = op(req, ctx)
        msg = {"id": rid, "ev": "result"}
        msg.update(result)
    except (AgentPathError, AgentUsageError, AgentTooLarge, AgentUserError) as exc:
        msg = {"id": rid, "ev": "error", "kind": exc.kind, "message": str(exc)}
        if getattr(exc, "code", None):
            msg["code"] = exc.code
    except Exception as exc:  # a bug or an unexpected OS error: report it, keep serving
        log("request %s (%s) failed: %r" % (rid, req.get("op"), exc))
        msg = {"id": rid, "ev": "error", "kind": "internal", "message": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        with _requests_lock:
            _requests.pop(rid, None)
    return msg


def reply(msg):
    try:
        send(msg)
    except Exception as exc:
        log("cannot send reply: %r" % exc)


def _worker():
    """A request thread: takes requests off `_jobs` for the agent's life. It counts itself
    free *before* its reply leaves, so the request a client sends on reading the reply
    finds it (a sandbox at its pids limit has no thread to give that request)."""
    while True:
        req, ctx = _jobs.get()
        msg = answer(req, ctx)
        with _idle_lock:
            _idle[0] += 1
        reply(msg)


def start_worker():
    """One more request thread (counted free); False when the sandbox has no thread to give."""
    with _idle_lock:
        _idle[0] += 1
    try:
        threading.Thread(target=_worker, daemon=True).start()
        return True
    except RuntimeError as exc:  # at the pids limit (a fork bomb)
        with _idle_lock:
            _idle[0] -= 1
        log("cannot start a request thread (%s): requests wait for a free one" % exc)
        return False


def dispatch(req, ctx):
    """Hand a request to a free worker, then keep SPARE_WORKERS free ones beyond the queued
    requests (started off the request's path: the free worker already has it). Requests
    never wait for each other while the sandbox can start a thread. When it cannot (its pids
    limit is full: a fork bomb) the spares started in better times serve the next requests
    (two: a shell's pipelined write + read), a request that cannot block (kill, poll, ping,
    forget: how the bomb is ended) is answered here on the reading thread, and any other
    waits for the next free worker instead of failing."""
    with _idle_lock:
        free = _idle[0] > 0
    if not free and not start_worker() and req.get("op") in INLINE_OPS:
        reply(answer(req, ctx))
        return
    _jobs.put((req, ctx))
    with _idle_lock:
        _idle[0] -= 1
        short = SPARE_WORKERS - _idle[0]
    for _ in range(short):
        if not start_worker():
            break


def no_cells(req):
    """Messages for a cell reach an agent started without --cells: refuse them."""
    if req.get("op") not in ("data", "ack", "cancel"):
        send({"cell": req.get("cell"), "id": req.get("id"), "ev": "error", "kind": "usage",
              "message": "this sandbox hosts no cells (its agent was started without --cells)"})


forward_cell = no_cells  # replaced by the cells extension (cells_program.py)
HELLO = {}  # fields an extension adds to the hello (cells_program.py: the host's hardening level)


def shutdown():
    """Kill every command's process group. Also run from the SIGTERM handler, which may have
    interrupted the reading thread inside `with _procs_lock` (a poll or kill is answered
    there): taking the lock would wait forever, so neither table is locked (a copy of a
    set or a dict's values is made whole under the GIL)."""
    for pgid in list(_groups):
        kill_group(pgid)
    for bg in list(_procs.values()):
        kill_group(bg.proc.pid)


def _on_term(signum, frame):
    """SIGTERM/SIGHUP (e.g. a remote API ending the live process without closing stdin):
    take every command's process group down with the agent."""
    shutdown()
    os._exit(128 + signum)


PR_SET_DUMPABLE = 4


def not_dumpable():
    """PR_SET_DUMPABLE 0: the sandbox's code, though it may share the agent's uid, can no
    longer ptrace the agent, read or write its memory (/proc/<pid>/mem), take its
    descriptors (/proc/<pid>/fd, pidfd_getfd) or read its environment: each needs
    CAP_SYS_PTRACE, which no sandbox process holds. Otherwise a process the model leaves
    behind could make the agent forge the result of the next (grading) command.
    Inherited by fork, reset by execve: the commands the agent starts are ordinary
    dumpable processes (a debugger in the sandbox can still trace its own children)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            log("cannot make the agent non-dumpable: errno %d" % ctypes.get_errno())
    except Exception as exc:  # no ctypes / libc: log it, keep serving
        log("cannot make the agent non-dumpable: %r" % exc)


def seal_channel():
    """Mode 0 on the pipes of the agent's channel (stdin and stdout, when they are pipes):
    a second layer beside `not_dumpable` for runtimes whose /proc lets a process reopen
    another's descriptors without the ptrace check Linux makes (gVisor, at least its
    2022-12 releases: /proc/<agent>/fd/1 opened for writing by the sandbox's code, as root
    or as the agent's user, put forged results on the channel). Reopening a pipe through
    /proc checks the pipe's mode, and the sandbox's code holds no CAP_DAC_OVERRIDE; the
    agent's own descriptors are open already and keep working. Only these two and only
    pipes: stderr (logs) may be a pipe the agent shares with its starter (a local run)."""
    import stat

    for fd in (0, 1):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.fchmod(fd, 0)
        except OSError as exc:  # not ours to change (another user's pipe): log it, keep serving
            log("cannot seal descriptor %d of the agent's channel: %s" % (fd, exc))


def main():
    not_dumpable()
    seal_channel()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_term)
    send(dict({"id": 0, "ev": "hello", "version": PROTOCOL_VERSION, "pid": os.getpid(),
               "python": "%d.%d.%d" % sys.version_info[:3]}, **HELLO))
    for _ in range(SPARE_WORKERS):
        start_worker()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        try:
            req = json.loads(line)
        except ValueError:
            log("bad request line: %r" % line[:200])
            continue
        if "cell" in req:
            forward_cell(req)
            continue
        op = req.get("op")
        rid = req.get("id")
        if op in ("data", "ack", "cancel"):
            with _requests_lock:
                ctx = _requests.get(rid)
            if ctx is None:
                continue
            if op == "data":
                ctx.feed(None if req.get("eof") else unb64(req.get("data")))
            elif op == "ack":
                ctx.ack(int(req.get("bytes", 0)))
            else:
                ctx.cancel()
            continue
        ctx = Request(rid)
        with _requests_lock:
            _requests[rid] = ctx
        dispatch(req, ctx)
    shutdown()


if __name__ == "__main__" and "--cells" not in sys.argv and "--cell-agent" not in sys.argv:
    prepare_shed()
    try:
        main()
    except KeyboardInterrupt:
        shutdown()
