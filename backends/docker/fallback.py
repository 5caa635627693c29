"""The slow path for images without python3: one `docker exec` per command
(wrapped in `timeout -s KILL`, guarded on the host too, output capped head +
tail on the host) and files through the Engine's archive endpoint.
Background processes need the agent and are refused with a clear error."""

from __future__ import annotations

import asyncio
import io
import posixpath
import stat
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiodocker

from sandboxes.agent.client import extract_tar, tree_size
from sandboxes.cancel import cancel_and_settle
from sandboxes.errors import ConfigError, PathError, SandboxNotRunning, TransferTooLarge, UnknownUser
from sandboxes.interface import BackgroundProcess, Command, Sandbox
from sandboxes.results import ExecResult, OutputChunk
from sandboxes.spec import SandboxSpec

HOST_GRACE = 5.0


class HeadTail:
    """Host-side bounded buffer: first and last `limit // 2` bytes, dropped count."""

    def __init__(self, limit: int):
        self.head_max, self.tail_max = limit - limit // 2, limit // 2
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            extra = len(self.tail) - self.tail_max
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def text(self) -> str:
        h, t = self.head.decode("utf-8", "replace"), self.tail.decode("utf-8", "replace")
        return f"{h}\n[... {self.dropped} bytes dropped ...]\n{t}" if self.dropped else h + t


async def run_exec(container, argv: list[str], *, timeout: float, stdin: bytes | None = None,
                   env: dict[str, str] | None = None, workdir: str | None = None, user: str | None = None,
                   limit: int = 1 << 20, on_chunk=None) -> tuple[int | None, HeadTail, HeadTail, bool]:
    """Run one exec to completion: (exit code, stdout, stderr, host-side timeout hit)."""
    ex = await container.exec(argv, stdin=stdin is not None, stdout=True, stderr=True, tty=False,
                              environment=env, workdir=workdir, user=user or "")
    out, err = HeadTail(limit), HeadTail(limit)
    timed_out = False
    async with ex.start(detach=False) as stream:
        if stdin is not None:
            await stream.write_in(stdin)
            transport = stream._resp.connection.transport
            if transport is not None and transport.can_write_eof():
                transport.write_eof()

        async def pump() -> None:
            while (msg := await stream.read_out()) is not None:
                (out if msg.stream == 1 else err).add(msg.data)
                if on_chunk is not None:
                    await on_chunk(OutputChunk(stream="stdout" if msg.stream == 1 else "stderr", data=msg.data))

        try:
            async with asyncio.timeout(None if timeout == float("inf") else timeout + HOST_GRACE):
                await pump()
        except asyncio.TimeoutError:
            timed_out = True
    info = await ex.inspect()
    code = None if info.get("Running") else info.get("ExitCode")
    return code, out, err, timed_out


class ExecSandbox(Sandbox):
    """A container without the agent: each command is its own docker exec."""

    backend_name = "docker"

    def __init__(self, container, *, backend, id: str, name: str, spec: SandboxSpec):
        self._container = container
        self._backend = backend
        self.snapshot_backend = backend
        self.id, self.name, self.spec = id, name, spec
        self._deleted = False

    async def snapshot(self, *, keep: bool = False):
        """The container's filesystem committed to an image (backends/docker/snapshots.py)."""
        if self._deleted:
            raise SandboxNotRunning(f"sandbox {self.name} was deleted")
        return await self._backend._snapshots.take(self, keep=keep)

    def _argv(self, cmd: Command, timeout: float) -> list[str]:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv:
            raise ConfigError("empty command")
        if timeout == float("inf"):
            return argv
        return ["timeout", "-s", "KILL", f"{timeout:g}", *argv]

    async def _run(self, cmd, timeout, env, cwd, stdin, output_limit, on_chunk=None, user=None) -> ExecResult:
        if self._deleted:
            raise SandboxNotRunning(f"sandbox {self.name} was deleted")
        t = float(timeout if timeout is not None else self.spec.timeout_per_command_seconds)
        if not t > 0:
            raise ConfigError(f"timeout must be > 0 seconds (math.inf for none), got {timeout!r}")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        started = time.monotonic()
        try:
            code, out, err, host_timeout = await run_exec(
                self._container, self._argv(cmd, t), timeout=t, stdin=stdin or None,
                env={**self.spec.environment_vars, **(env or {})} or None, workdir=cwd,
                user=self.spec.user if user is None else str(user),
                limit=int(output_limit or self.spec.output_limit_bytes), on_chunk=on_chunk)
        except aiodocker.DockerError as exc:
            if user is not None and "unable to find user" in str(exc.message).lower():  # the engine's own wording
                raise UnknownUser(f"no such user in {self.name}: {user!r} ({exc.message})") from exc
            raise SandboxNotRunning(f"exec in {self.name} failed: {exc.message}") from exc
        duration = time.monotonic() - started
        timed_out = host_timeout or (code == 137 and duration >= t)
        killed = code is not None and code > 128 and (timed_out or code == 137)
        return ExecResult(
            stdout=out.text(), stderr=err.text(), exit_code=None if (timed_out or killed) else code,
            timed_out=timed_out, signal=(code - 128) if killed else (9 if timed_out else None),
            stdout_dropped_bytes=out.dropped, stderr_dropped_bytes=err.dropped, duration=duration)

    async def exec(self, cmd: Command, *, timeout: float | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None, stdin: bytes | str | None = None, output_limit: int | None = None,
                   user: str | None = None) -> ExecResult:
        """docker exec runs the command as `user` itself (no capability needed to switch)."""
        return await self._run(cmd, timeout, env, cwd, stdin, output_limit, user=user)

    async def exec_stream(self, cmd: Command, *, timeout: float | None = None, env: dict[str, str] | None = None,
                          cwd: str | None = None) -> AsyncIterator[OutputChunk | ExecResult]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=64)

        async def on_chunk(chunk: OutputChunk) -> None:
            await queue.put(chunk)

        task = asyncio.create_task(self._run(cmd, timeout, env, cwd, None, None, on_chunk))
        task.add_done_callback(lambda _: queue.put_nowait(None) if not queue.full() else None)
        try:
            while not (task.done() and queue.empty()):
                getter = asyncio.create_task(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    item = getter.result()
                    if item is not None:
                        yield item
                else:
                    getter.cancel()
            yield await task
        finally:
            await cancel_and_settle([task])

    async def start_process(self, cmd: Command, *, env=None, cwd=None, output_limit=None, keep="newest") -> BackgroundProcess:
        raise ConfigError(f"image {self.spec.image} has no python3 >= 3.7: background processes need the agent")

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        path = posixpath.join(self.spec.workdir, path)
        parent, base = posixpath.split(path)
        await self._mkdir(parent)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(base)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        await self._put(parent, buf.getvalue())

    async def _mkdir(self, path: str) -> None:
        r = await self.exec(["mkdir", "-p", path], timeout=30)
        if not r.ok:
            raise PathError(f"cannot create {path}: {r.stderr.strip()}")

    async def _put(self, dest: str, data: bytes) -> None:
        try:
            await self._container.put_archive(dest, data)
        except aiodocker.DockerError as exc:
            raise PathError(f"cannot write into {dest}: {exc.message}") from exc

    async def _get(self, path: str) -> tarfile.TarFile:
        try:
            return await self._container.get_archive(posixpath.join(self.spec.workdir, path))
        except aiodocker.DockerError as exc:
            raise PathError(f"cannot read {path}: {exc.message}") from exc

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        if not path:
            raise PathError("empty path")
        if max_bytes is not None and max_bytes < 0:
            raise ConfigError(f"max_bytes must be >= 0 or None, got {max_bytes}")
        tar = await self._get(path)
        member = tar.next()
        if member is None or not member.isfile():
            raise PathError(f"{path} is not a regular file")
        if max_bytes is None and member.size > self.spec.read_limit_bytes:
            raise TransferTooLarge(f"{path} is {member.size} bytes, over the read limit of "
                                   f"{self.spec.read_limit_bytes} bytes: pass max_bytes= or download() it")
        data = tar.extractfile(member).read()
        return data if max_bytes is None else data[:max_bytes]

    async def upload(self, local: str | Path, remote: str) -> None:
        local = Path(local)
        if not local.exists():
            raise PathError(f"no such local file or directory: {local}")
        limit = self.spec.transfer_limit_bytes
        size = local.stat().st_size if not local.is_dir() else await asyncio.to_thread(tree_size, local)
        if size > limit:
            raise TransferTooLarge(f"upload {local}: {size} bytes, over the transfer limit of {limit} bytes")
        if not local.is_dir():
            await self.write_file(remote, local.read_bytes(), mode=stat.S_IMODE(local.stat().st_mode))
            return
        remote = posixpath.join(self.spec.workdir, remote)
        await self._mkdir(remote)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(str(local), arcname=".")
        await self._put(remote, buf.getvalue())

    async def download(self, remote: str, local: str | Path) -> None:
        tar = await self._get(remote)
        members = tar.getmembers()
        if not members:
            raise PathError(f"{remote}: empty archive")
        if sum(m.size for m in members) > self.spec.transfer_limit_bytes:
            raise TransferTooLarge(f"download {remote}: more than the transfer limit of {self.spec.transfer_limit_bytes} bytes")
        top = members[0]
        top_name, top_is_dir = top.name, top.isdir()
        # the archive is rooted at basename(remote): re-root it at "."
        out = tempfile.SpooledTemporaryFile(max_size=8 << 20)
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as re_tar:
            for m in members:
                rel = posixpath.relpath(m.name, top_name) if top_is_dir else posixpath.basename(m.name)
                fobj = tar.extractfile(m) if m.isfile() else None
                m.name = rel
                re_tar.addfile(m, fobj)
        await asyncio.to_thread(extract_tar, out, "dir" if top_is_dir else "file", Path(local))

    async def alive(self) -> bool:
        return not self._deleted and await self._backend._running(self.id)

    async def delete(self) -> None:
        if self._deleted:
            return
        self._deleted = True
        await self._backend.delete(self.id)


__all__ = ["ExecSandbox", "HeadTail", "run_exec"]
