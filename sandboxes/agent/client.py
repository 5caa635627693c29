"""Host side of the in-sandbox agent: `AgentSandbox` implements the whole
`Sandbox` contract over any async byte channel to a running agent.

How a backend plugs in (Docker, Kubernetes, local pipes, ...):

1. Start the agent inside the sandbox once, with stdin/stdout attached:
   the command is `protocol.agent_argv()` (`python3 -u -c <source>`).
2. Wrap the attached stream in an `AgentChannel`: `send(bytes)` writes to the
   agent's stdin, `receive()` returns the next bytes of its stdout (b"" at
   EOF), `close()` ends the stream. Optionally `describe()` names the channel
   and `log_tail()` returns the agent's recent stderr (both go into errors).
3. `sb = await MySandbox.connect(channel, id=..., name=..., spec=spec)` where
   `MySandbox(AgentSandbox)` overrides `_destroy()` (remove the sandbox; must be
   idempotent) and, if it has a cheaper check, `alive()`.

Everything else (exec, streaming, background processes, files, tar
transfers, timeouts, bounded output) comes from here. When the channel hits
EOF or breaks, every pending request fails with `AgentError` (an InfraError)
and no request is ever re-sent: a command that may have started is the
caller's to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import stat
import tarfile
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..cancel import cancel_and_settle
from ..errors import (
    AgentError,
    ConfigError,
    FileNotFound,
    IsADirectory,
    PathError,
    PermissionDenied,
    SandboxNotRunning,
    TransferTooLarge,
    UnknownUser,
    UserSwitchUnsupported,
)
from ..interface import BackgroundProcess, Command, OutputKeep, Sandbox
from ..results import ExecResult, OutputChunk, ProcessStatus
from ..spec import SandboxSpec
from . import protocol
from .protocol import ACK_EVERY, INLINE_MAX, b64, unb64

log = logging.getLogger(__name__)

TRANSFER_CHUNK = 1 << 20
EXEC_GRACE = 30.0  # seconds the host waits past a command's timeout before declaring the agent lost


class AgentChannel:
    """An async byte pipe to one running agent (its stdin and stdout)."""

    async def send(self, data: bytes) -> None:
        """Write bytes to the agent's stdin (raise on a broken channel)."""
        raise NotImplementedError

    async def receive(self) -> bytes:
        """The next bytes of the agent's stdout; b"" at EOF."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the channel; the agent exits on stdin EOF. Idempotent."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    def log_tail(self) -> str:
        """The agent's recent stderr, if the channel collects it."""
        return ""


class _Waiter:
    __slots__ = ("future", "queue")

    def __init__(self, streaming: bool):
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future | None = None if streaming else loop.create_future()
        self.queue: asyncio.Queue | None = asyncio.Queue() if streaming else None


class AgentConnection:
    """Request/response multiplexing over one channel: ids, dispatch, failure."""

    def __init__(self, channel: AgentChannel):
        self.channel = channel
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._send_lock = asyncio.Lock()
        self._hello: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reader: asyncio.Task | None = None
        self._dead: BaseException | None = None
        self._closing = False
        self.hello: dict[str, Any] = {}
        self.cells: dict[int, AgentConnection] = {}  # connections to this agent's cells (cells.py)

    # -- lifecycle
    async def start(self, timeout: float = 30.0) -> dict[str, Any]:
        """Start reading and wait for the agent's hello."""
        self._reader = asyncio.create_task(self._read_loop())
        try:
            async with asyncio.timeout(timeout):
                self.hello = await asyncio.shield(self._hello)
        except asyncio.TimeoutError:
            await self.close()
            raise AgentError(f"agent did not start within {timeout:.0f}s on {self.channel.describe()}{self._log()}") from None
        return self.hello

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(Exception):
            await self.channel.close()
        if self._reader is not None and not self._reader.done():
            await cancel_and_settle([self._reader])
        self._fail(SandboxNotRunning("the agent connection was closed (sandbox deleted)"))

    @property
    def dead(self) -> BaseException | None:
        return self._dead

    def _log(self) -> str:
        tail = self.channel.log_tail().strip()
        return f"; agent log: {tail[-2000:]}" if tail else ""

    def _fail(self, exc: BaseException) -> None:
        if self._dead is None:
            self._dead = exc
        if not self._hello.done():
            self._hello.set_exception(self._dead)
            self._hello.exception()  # mark retrieved
        for waiter in self._waiters.values():
            if waiter.future is not None:
                if not waiter.future.done():
                    waiter.future.set_exception(self._dead)
            else:
                waiter.queue.put_nowait(self._dead)
        self._waiters.clear()
        for cell in list(self.cells.values()):  # a cell is reached only through this agent
            cell._fail(self._dead)

    async def _read_loop(self) -> None:
        held: list[bytes] = []  # the pieces of a line not yet complete, joined once at its end
        error: BaseException | None = None
        try:
            while True:
                data = await self.channel.receive()
                if not data:
                    break
                data = bytes(data)
                start = 0
                while True:
                    i = data.find(b"\n", start)
                    if i < 0:
                        if start < len(data):
                            held.append(data[start:] if start else data)
                        break
                    if held:
                        held.append(data[start:i])
                        line = b"".join(held)
                        held.clear()
                    else:
                        line = data[start:i]
                    start = i + 1
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        raise AgentError(f"agent sent garbage: {line[:300]!r}") from None
                    self._dispatch(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broken channel or garbage on it
            error = exc
        if self._closing:
            return
        what = f"agent channel {self.channel.describe()} "
        what += f"broke: {error}" if error else "closed (agent or sandbox died)"
        self._fail(AgentError(what + self._log()))

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if not isinstance(msg, dict):
            raise AgentError(f"agent sent a message that is not an object: {str(msg)[:300]}")
        cell = msg.pop("cell", None)
        if cell is not None:  # a reply of one of this agent's cells: the host agent checked it and set `cell`
            conn = self.cells.get(cell) if isinstance(cell, int) else None
            if conn is not None:
                if msg.get("ev") == "gone":
                    reason = msg.get("message") or ("its processes were killed or it outlived its lifetime")
                    conn._fail(SandboxNotRunning(f"cell {cell} ended ({reason})"))
                else:
                    try:
                        conn._dispatch(msg)
                    except Exception as exc:  # noqa: BLE001 - whatever a cell's reply is, it fails only that cell
                        conn._fail(AgentError(f"cell {cell} sent a reply that cannot be read: {exc!r}"))
            return
        rid = msg.get("id")
        if not isinstance(rid, int):
            return
        if rid == 0 and msg.get("ev") == "hello":
            if not self._hello.done():
                self._hello.set_result(msg)
            return
        waiter = self._waiters.get(rid)
        if waiter is None:
            return  # answer to an abandoned request
        final = msg.get("ev") != "chunk"
        if final:
            del self._waiters[rid]
        if waiter.future is not None:
            if final and not waiter.future.done():
                waiter.future.set_result(msg)
        else:
            waiter.queue.put_nowait(msg)

    # -- requests
    def _check(self) -> None:
        if self._dead is not None:
            raise self._dead

    async def _send(self, msg: dict[str, Any]) -> None:
        data = protocol.encode(msg)
        try:
            async with self._send_lock:
                await self.channel.send(data)
        except Exception as exc:
            err = AgentError(f"cannot write to agent channel {self.channel.describe()}: {exc!r}{self._log()}")
            self._fail(err)
            raise err from exc

    async def notify(self, msg: dict[str, Any]) -> None:
        """Send a control message (data / ack / cancel); never waits for an answer."""
        if self._dead is None:
            with contextlib.suppress(AgentError):
                await self._send(msg)

    def _register(self, msg: dict[str, Any], streaming: bool) -> tuple[int, _Waiter]:
        self._check()
        rid = next(self._ids)
        msg["id"] = rid
        waiter = _Waiter(streaming)
        self._waiters[rid] = waiter
        return rid, waiter

    async def call(self, msg: dict[str, Any], timeout: float | None = None, cancel_on_abort: bool = False) -> dict:
        """Send one request and return its result event (errors raised as typed exceptions)."""
        rid, waiter = self._register(msg, streaming=False)
        timer = None
        if timeout is not None:  # a timer, not wait_for: no extra task on the hot path
            timer = asyncio.get_running_loop().call_later(timeout, self._expire, waiter.future, msg.get("op"), timeout)
        try:
            await self._send(msg)
            reply = await waiter.future
        except BaseException:
            if self._waiters.pop(rid, None) is not None and cancel_on_abort:
                await asyncio.shield(self.notify({"op": "cancel", "id": rid}))
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return _raise_error(reply)

    def _expire(self, future: asyncio.Future, op: str, timeout: float) -> None:
        if not future.done():
            future.set_exception(AgentError(
                f"agent did not answer {op} within {timeout:.0f}s on {self.channel.describe()}{self._log()}"))

    async def stream(self, msg: dict[str, Any], inbound: AsyncIterator[bytes] | None = None) -> AsyncIterator[dict]:
        """Send a request and yield its chunk events, then its result event.

        Chunks are acknowledged as they are consumed (flow control). `inbound`
        bytes are sent as data messages after the request, then EOF."""
        rid, waiter = self._register(msg, streaming=True)
        finished = False
        try:
            await self._send(msg)
            if inbound is not None:
                async for piece in inbound:
                    self._check()
                    await self._send({"op": "data", "id": rid, "data": b64(piece)})
                await self._send({"op": "data", "id": rid, "eof": True})
            consumed = 0
            while True:
                ev = await waiter.queue.get()
                if isinstance(ev, BaseException):
                    raise ev
                if ev.get("ev") == "chunk":
                    yield ev
                    consumed += len(ev.get("data", "")) * 3 // 4
                    if consumed >= ACK_EVERY:
                        await self.notify({"op": "ack", "id": rid, "bytes": consumed})
                        consumed = 0
                    continue
                finished = True
                yield _raise_error(ev)
                return
        finally:
            if not finished and self._waiters.pop(rid, None) is not None:
                await asyncio.shield(self.notify({"op": "cancel", "id": rid}))


def _raise_error(msg: dict[str, Any]) -> dict:
    if msg.get("ev") != "error":
        return msg
    kind, text = msg.get("kind"), msg.get("message", "")
    if kind == "path":
        typed = _PATH_ERRORS.get(msg.get("code"))
        raise typed(text, _path_of(text)) if typed else PathError(text)
    if kind == "unknown_user":
        raise UnknownUser(text)
    if kind == "user_unsupported":
        raise UserSwitchUnsupported(text)
    if kind == "usage":
        raise ConfigError(text)
    if kind == "too_large":
        raise TransferTooLarge(text)
    raise AgentError(f"agent failed: {text}")


_PATH_ERRORS = {"ENOENT": FileNotFound, "ENOTDIR": FileNotFound, "EISDIR": IsADirectory,
                "EACCES": PermissionDenied, "EPERM": PermissionDenied, "EROFS": PermissionDenied}


def _path_of(text: str) -> str | None:
    """The path an agent path error names ("<strerror>: <path>")."""
    _, sep, path = text.partition(": ")
    return path if sep else None


# ---------------------------------------------------------------- results


def _join(head: str, tail: str, dropped: int) -> str:
    h = unb64(head).decode("utf-8", "replace")
    t = unb64(tail).decode("utf-8", "replace")
    if dropped:
        return f"{h}\n[... {dropped} bytes dropped ...]\n{t}"
    return h + t


def exec_result(r: dict[str, Any]) -> ExecResult:
    """An `ExecResult` from the agent's exec result event."""
    return ExecResult(
        stdout=_join(r.get("stdout_head", ""), r.get("stdout_tail", ""), r.get("stdout_dropped", 0)),
        stderr=_join(r.get("stderr_head", ""), r.get("stderr_tail", ""), r.get("stderr_dropped", 0)),
        exit_code=r.get("exit_code"),
        timed_out=bool(r.get("timed_out")),
        signal=r.get("signal"),
        oom_killed=bool(r.get("oom_killed")),
        stdout_dropped_bytes=r.get("stdout_dropped", 0),
        stderr_dropped_bytes=r.get("stderr_dropped", 0),
        duration=float(r.get("duration", 0.0)),
        start_error=r.get("start_error"),
    )


def _command(cmd: Command) -> dict[str, Any]:
    if isinstance(cmd, str):
        return {"shell": cmd}
    argv = [str(a) for a in cmd]
    if not argv:
        raise ConfigError("empty command")
    return {"argv": argv}


def _status(r: dict[str, Any]) -> ProcessStatus:
    return ProcessStatus(pid=r["pid"], running=r["running"], exit_code=r.get("exit_code"), signal=r.get("signal"))


# ---------------------------------------------------------------- tar safety


def _check_member(member: tarfile.TarInfo, dest: str) -> None:
    """Refuse members that would land outside `dest` (absolute, `..`, links out, devices)."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is not None:
        try:
            data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise PathError(f"refused archive member {member.name!r}: {exc}") from None
        return
    name = os.path.normpath(member.name)
    if os.path.isabs(member.name) or name == ".." or name.startswith("../"):
        raise PathError(f"refused archive member {member.name!r}: outside the destination")
    if member.issym() or member.islnk():
        base = os.path.dirname(name) if member.issym() else ""
        target = os.path.normpath(os.path.join(base, member.linkname))
        if os.path.isabs(member.linkname) or target == ".." or target.startswith("../"):
            raise PathError(f"refused archive member {member.name!r}: link points outside the destination")
    if member.isdev():
        raise PathError(f"refused archive member {member.name!r}: device file")
    real = os.path.realpath(os.path.join(dest, name))
    root = os.path.realpath(dest)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        raise PathError(f"refused archive member {member.name!r}: written through a link out of the destination")


def _safe_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    _check_member(member, dest)
    return member  # modes and links kept as they are


def extract_tar(fileobj, kind: str, local: Path) -> None:
    """Extract the agent's get_tar stream (`kind` file or dir) to `local`, refusing traversal."""
    fileobj.seek(0)
    with tarfile.open(fileobj=fileobj, mode="r:") as tar:
        if kind == "file":
            member = tar.next()
            if member is None or not member.isfile():
                raise PathError(f"expected one regular file in the archive, got {member!r}")
            local.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            with open(local, "wb") as out:
                while chunk := src.read(TRANSFER_CHUNK):
                    out.write(chunk)
            os.chmod(local, member.mode & 0o7777)
            return
        local.mkdir(parents=True, exist_ok=True)
        dest = str(local)
        members = []
        for m in tar:
            _check_member(m, dest)
            members.append(m)
        kw = {"filter": _safe_filter} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **kw)


def _tar_local(local: Path, out) -> None:
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(local), arcname=".", recursive=True)


def tree_size(root: Path) -> int:
    """Bytes of the regular files under `root` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, f))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


async def _file_pieces(fileobj) -> AsyncIterator[bytes]:
    while True:
        piece = await asyncio.to_thread(fileobj.read, TRANSFER_CHUNK)
        if not piece:
            return
        yield piece


# ---------------------------------------------------------------- sandbox


class AgentProcess(BackgroundProcess):
    """A background process served by the agent."""

    def __init__(self, sandbox: "AgentSandbox", pid: int):
        self._sb = sandbox
        self.pid = pid

    async def _call(self, op: str, guard: float | None = None, **fields) -> dict:
        msg = {"op": op, "pid": self.pid, **{k: v for k, v in fields.items() if v is not None}}
        return await self._sb._call(msg, timeout=guard)

    async def poll(self) -> ProcessStatus:
        return _status(await self._call("poll", guard=EXEC_GRACE))

    async def read_output(self, until: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        raw = await self.read_output_bytes(until, timeout)
        texts, gaps = [], []
        for data, gap in zip(raw, self.gap_at):  # byte offsets here: as positions in the decoded text
            head = data[:gap].decode("utf-8", "replace") if gap else ""
            texts.append(head + data[gap or 0:].decode("utf-8", "replace"))
            gaps.append(None if gap is None else len(head))
        self.gap_at = (gaps[0], gaps[1])
        return texts[0], texts[1]

    async def read_output_bytes(self, until: str | None = None, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Like `read_output`, undecoded (also updates `dropped_bytes`, `gap_at` as byte
        offsets, and `total_dropped_bytes`)."""
        guard = None if (until and timeout is None) else (timeout or 0) + EXEC_GRACE
        r = await self._call("read", guard=guard, until=until, timeout=timeout)
        dropped = (int(r.get("stdout_dropped", 0)), int(r.get("stderr_dropped", 0)))
        self.dropped_bytes = dropped
        self.total_dropped_bytes = (self.total_dropped_bytes[0] + dropped[0], self.total_dropped_bytes[1] + dropped[1])
        gaps = [r.get(f"{name}_gap") for name in ("stdout", "stderr")]
        # "newest" (and an older agent) drops the oldest bytes: the gap is before the text
        self.gap_at = tuple(0 if gap is None and n else gap if n else None for gap, n in zip(gaps, dropped))
        return unb64(r["stdout"]), unb64(r["stderr"])

    async def write_stdin(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        await self._call("write_stdin", data=b64(data))

    async def close_stdin(self) -> None:
        """Close the process's stdin (it sees EOF)."""
        await self._call("write_stdin", close=True)

    async def kill(self, signal: int = 9, group: bool = True) -> None:
        await self._call("kill", guard=EXEC_GRACE, signal=signal, group=group)

    async def wait(self, timeout: float | None = None) -> ProcessStatus:
        guard = None if timeout is None else timeout + EXEC_GRACE
        return _status(await self._call("wait", guard=guard, timeout=timeout))


PROBE_AFTER = 3.0  # seconds a call may be pending before the engine is asked whether the sandbox is gone
PROBE_EVERY = 10.0  # and again this often while it stays pending


class _Watchdog:
    """Probes `sandbox.gone()` while one request (call or stream) is pending (a timer,
    no task on the hot path); a gone sandbox fails every pending request with
    SandboxNotRunning. Used as `with _Watchdog(sandbox): ...`."""

    def __init__(self, sandbox: AgentSandbox):
        self.sandbox = sandbox
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        if type(sandbox).gone is not AgentSandbox.gone:  # a backend that cannot tell: nothing to arm
            self.loop = asyncio.get_running_loop()
            self.timer = self.loop.call_later(PROBE_AFTER, self._fire)

    def _fire(self) -> None:
        self.timer = None
        self.task = self.loop.create_task(self._probe())

    async def _probe(self) -> None:
        try:
            gone = await self.sandbox.gone()
        except Exception:  # noqa: BLE001 - the engine cannot tell now: the call's own timeout still applies
            gone = False
        if self.task is None:  # stopped meanwhile
            return
        if gone:
            self.sandbox.connection._fail(SandboxNotRunning(
                f"sandbox {self.sandbox.name} is gone (removed behind this handle)"))
        else:
            self.task = None
            self.timer = self.loop.call_later(PROBE_EVERY, self._fire)

    def __enter__(self) -> "_Watchdog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            task, self.task = self.task, None
            task.cancel()


class AgentSandbox(Sandbox):
    """A `Sandbox` whose every operation goes through the in-sandbox agent.

    Backends subclass it and override `_destroy()` (and maybe `alive()`)."""

    backend_name = "agent"

    def __init__(self, connection: AgentConnection, *, id: str, name: str, spec: SandboxSpec, backend_name: str | None = None):
        self._conn = connection
        self.id = id
        self.name = name
        self.spec = spec
        if backend_name:
            self.backend_name = backend_name
        self._deleted = False
        self._delete_lock: asyncio.Lock | None = None

    @classmethod
    async def connect(cls, channel: AgentChannel, *, hello_timeout: float = 30.0, **kwargs: Any) -> "AgentSandbox":
        """Wrap a channel to a freshly started agent; waits for its hello (AgentError if none)."""
        conn = AgentConnection(channel)
        await conn.start(hello_timeout)
        return cls(conn, **kwargs)

    @property
    def connection(self) -> AgentConnection:
        return self._conn

    async def _call(self, msg: dict[str, Any], timeout: float | None = None, cancel_on_abort: bool = False) -> dict:
        if self._deleted:
            raise SandboxNotRunning(f"sandbox {self.name} was deleted")
        with _Watchdog(self):  # still pending after PROBE_AFTER: ask the engine whether the sandbox is gone
            return await self._conn.call(msg, timeout=timeout, cancel_on_abort=cancel_on_abort)

    async def gone(self) -> bool:
        """True when the backend knows the sandbox no longer runs (removed behind this
        handle). Asked by the watchdog of a pending call: a channel does not always see
        its sandbox die (under gVisor the exec proxy may outlive a removed container).
        Backends that can ask their engine override it; the default cannot tell."""
        return False

    def _exec_msg(self, cmd, timeout, env, cwd, output_limit, user=None) -> tuple[dict[str, Any], float]:
        t = float(timeout if timeout is not None else self.spec.timeout_per_command_seconds)
        if not t > 0:
            raise ConfigError(f"timeout must be > 0 seconds (math.inf for none), got {timeout!r}")
        msg: dict[str, Any] = {"op": "exec", **_command(cmd), "limit": int(output_limit or self.spec.output_limit_bytes)}
        if math.isfinite(t):
            msg["timeout"] = t
        merged = {str(k): str(v) for k, v in {**self.spec.environment_vars, **(env or {})}.items()}
        if merged:
            msg["env"] = merged
        if cwd:
            msg["cwd"] = cwd
        if user is not None:
            if not str(user):
                raise ConfigError("user must be a name, uid or uid:gid, not an empty string")
            msg["user"] = str(user)
        return msg, t

    async def exec(self, cmd: Command, *, timeout: float | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None, stdin: bytes | str | None = None, output_limit: int | None = None,
                   user: str | None = None) -> ExecResult:
        msg, t = self._exec_msg(cmd, timeout, env, cwd, output_limit, user)
        if stdin:
            msg["stdin"] = b64(stdin.encode() if isinstance(stdin, str) else stdin)
        guard = t * 1.5 + EXEC_GRACE if math.isfinite(t) else None
        reply = await self._call(msg, timeout=guard, cancel_on_abort=True)
        return exec_result(reply)

    async def exec_stream(self, cmd: Command, *, timeout: float | None = None, env: dict[str, str] | None = None,
                          cwd: str | None = None) -> AsyncIterator[OutputChunk | ExecResult]:
        if self._deleted:
            raise SandboxNotRunning(f"sandbox {self.name} was deleted")
        msg, _ = self._exec_msg(cmd, timeout, env, cwd, None)
        msg["stream"] = True
        stream = self._conn.stream(msg)
        try:
            with _Watchdog(self):
                async for ev in stream:
                    if ev.get("ev") == "chunk":
                        yield OutputChunk(stream=ev["stream"], data=unb64(ev["data"]))
                    else:
                        yield exec_result(ev)
        finally:
            await stream.aclose()

    async def start_process(self, cmd: Command, *, env: dict[str, str] | None = None, cwd: str | None = None,
                            output_limit: int | None = None, keep: OutputKeep = "newest") -> AgentProcess:
        msg: dict[str, Any] = {"op": "start", **_command(cmd), "limit": output_limit or self.spec.output_limit_bytes}
        if keep != "newest":
            msg["keep"] = keep
        merged = {str(k): str(v) for k, v in {**self.spec.environment_vars, **(env or {})}.items()}
        if merged:
            msg["env"] = merged
        if cwd:
            msg["cwd"] = cwd
        reply = await self._call(msg, timeout=EXEC_GRACE)
        return AgentProcess(self, reply["pid"])

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        if not path:
            raise PathError("empty path")
        if isinstance(data, str):
            data = data.encode()
        msg: dict[str, Any] = {"op": "write_file", "path": path, "mode": mode}
        if len(data) <= INLINE_MAX:
            msg["data"] = b64(data)
            await self._call(msg)
            return

        async def pieces():
            for i in range(0, len(data), TRANSFER_CHUNK):
                yield data[i : i + TRANSFER_CHUNK]

        await self._run_stream(msg, pieces())

    async def _run_stream(self, msg: dict[str, Any], inbound=None, sink=None) -> dict:
        if self._deleted:
            raise SandboxNotRunning(f"sandbox {self.name} was deleted")
        result: dict = {}
        with _Watchdog(self):
            async for ev in self._conn.stream(msg, inbound):
                if ev.get("ev") == "chunk":
                    if sink is not None:
                        await sink(unb64(ev["data"]))
                else:
                    result = ev
        return result

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        if not path:
            raise PathError("empty path")
        if max_bytes is not None and max_bytes < 0:
            raise ConfigError(f"max_bytes must be >= 0 or None, got {max_bytes}")
        parts: list[bytes] = []
        limit = self.spec.read_limit_bytes
        got = [0]

        async def sink(data: bytes) -> None:
            got[0] += len(data)
            if max_bytes is None and got[0] > limit:  # the agent checks too; never hold more than asked
                raise TransferTooLarge(f"{path}: more than the read limit of {limit} bytes")
            parts.append(data)

        msg: dict[str, Any] = {"op": "read_file", "path": path}
        if max_bytes is not None:
            msg["max_bytes"] = int(max_bytes)
        else:
            msg["limit"] = limit
        await self._run_stream(msg, sink=sink)
        return b"".join(parts)

    async def upload(self, local: str | Path, remote: str) -> None:
        local = Path(local)
        limit = self.spec.transfer_limit_bytes
        try:
            st = local.stat()
        except FileNotFoundError:
            raise PathError(f"no such local file or directory: {local}") from None
        if not stat.S_ISDIR(st.st_mode):
            if st.st_size > limit:
                raise TransferTooLarge(f"upload {local}: {st.st_size} bytes, over the transfer limit of {limit} bytes")
            msg = {"op": "write_file", "path": remote, "mode": stat.S_IMODE(st.st_mode)}
            with open(local, "rb") as fh:  # streamed: never the whole file in memory
                await self._run_stream(msg, inbound=_file_pieces(fh))
            return
        size = await asyncio.to_thread(tree_size, local)
        if size > limit:
            raise TransferTooLarge(f"upload {local}: the tree holds {size} bytes, over the transfer limit of {limit} bytes")
        with tempfile.TemporaryFile() as tmp:
            await asyncio.to_thread(_tar_local, local, tmp)
            tmp.seek(0)
            await self._run_stream({"op": "put_tar", "dest": remote, "limit": limit}, inbound=_file_pieces(tmp))

    async def download(self, remote: str, local: str | Path) -> None:
        local = Path(local)
        limit = self.spec.transfer_limit_bytes
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as tmp:
            got = [0]

            async def sink(data: bytes) -> None:
                got[0] += len(data)
                if got[0] > limit:  # the agent stops too; the temp file never grows past the limit
                    raise TransferTooLarge(f"download {remote}: more than the transfer limit of {limit} bytes")
                tmp.write(data)

            result = await self._run_stream({"op": "get_tar", "path": remote, "limit": limit}, sink=sink)
            await asyncio.to_thread(extract_tar, tmp, result.get("kind", "dir"), local)

    async def ping(self, timeout: float = 10.0) -> float:
        """Round trip to the agent, in seconds."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self._call({"op": "ping"}, timeout=timeout)
        return loop.time() - t0

    def known_gone(self) -> bool:
        return self._deleted or self._conn.dead is not None

    async def alive(self) -> bool:
        if self._deleted or self._conn.dead is not None:
            return False
        try:
            await self.ping(timeout=10.0)
            return True
        except AgentError:
            return False

    async def delete(self) -> None:
        if self._delete_lock is None:
            self._delete_lock = asyncio.Lock()
        async with self._delete_lock:
            if self._deleted:
                return
            self._deleted = True
            await self._conn.close()
            await self._destroy()

    async def _destroy(self) -> None:
        """Remove the underlying sandbox (backends override; must be idempotent)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.backend_name})>"
