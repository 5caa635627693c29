"""`LocalBackend` ("local"): sandboxes as host processes in a per-sandbox
directory, for development and for machines without a container engine.

Each sandbox is `<base>/<id>/` holding `meta.json` (spec, labels, agent pid)
and `root/`, the sandbox's root directory. The shared in-sandbox agent runs
on the host's `python3` with pipes as its channel (`sandboxes.agent`), so
exec, streaming, background processes, files and tar transfers behave as on
every other backend.

With bubblewrap usable, `root/` is mounted as `/` in fresh mount, pid, ipc,
uts (and, unless `spec.network`, network) namespaces, host /usr and /etc
read-only. Without it, commands are plain host processes started in `root/`
(with TMPDIR inside it) and a warning is logged once. **Neither is a
security boundary**; cpu, memory, disk and pids limits are not enforced, and
the image is ignored (the host's userland is the image). Use docker,
kubernetes or prime for untrusted code.

`get(id)` from another process starts a fresh agent in the same directory
(files are shared; background processes of the first agent are not).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from sandboxes import labels as lc
from sandboxes import lifecycle
from sandboxes.agent import AgentSandbox, agent_argv
from sandboxes.agent.channels import ProcessChannel
from sandboxes.errors import SandboxCreateError, SandboxNotRunning, SnapshotUnsupported
from sandboxes.results import SandboxInfo
from sandboxes.retry import RetryPolicy, idempotent
from sandboxes import settings
from sandboxes.spec import SandboxSpec, refuse_gvisor, refuse_namespace, refuse_user_switch

from .isolation import Isolation, find_bwrap, prepare_root, warn_unconfined_once

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LocalConfig(BaseModel):
    """Options of the local backend."""

    base_dir: str | None = Field(None, description="Where sandbox directories live; default $VF_LOCAL_SANDBOX_DIR or <tmp>/vf-sandbox-local.")
    use_bwrap: bool = Field(True, description="Confine with bubblewrap when it is usable.")
    python: str = Field("python3", description="Interpreter that runs the agent (inside the sandbox with bwrap).")
    hello_timeout: float = Field(30.0, gt=0, description="Seconds to wait for the agent to start.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Retry of create (same idempotency key), get, list and delete on transient InfraErrors.")


class _Meta(BaseModel):
    id: str
    name: str
    spec: SandboxSpec
    labels: dict[str, str]
    created_at: float
    bwrap: bool
    agent_pids: list[int] = Field(default_factory=list)


class LocalSandbox(AgentSandbox):
    backend_name = "local"

    def __init__(self, *args, backend: "LocalBackend", agent_channel: ProcessChannel, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._backend = backend
        self._channel = agent_channel

    async def snapshot(self, *, keep: bool = False):
        """Refused: a local sandbox is host processes over a host directory (bubblewrap's
        bind mounts at most), with no copy-on-write layer to freeze."""
        raise SnapshotUnsupported(
            "the local backend cannot snapshot or fork a sandbox: its sandboxes are host processes over a host "
            "directory, with no copy-on-write filesystem layer to freeze; use the docker backend")

    async def alive(self) -> bool:
        if not (self._backend._dir(self.id) / "meta.json").exists():
            return False
        return await super().alive()

    async def _destroy(self) -> None:
        _kill_group(self._channel.proc.pid)
        await self._backend.delete(self.id)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class LocalBackend:
    """Sandboxes as (bubblewrap-confined, when possible) host process trees."""

    name = "local"

    def __init__(self, **options) -> None:
        self.config = LocalConfig(**options)
        process = settings.current()  # the running settings fill what the options leave open
        base = self.config.base_dir or process.local_sandbox_dir or os.path.join(tempfile.gettempdir(), "vf-sandbox-local")
        self.base = Path(base)
        self.bwrap = find_bwrap() if self.config.use_bwrap and process.local_no_bwrap != "1" else None
        self._keys: dict[str, str] = {}  # idempotency key -> sandbox id (this process)

    @property
    def retry(self) -> RetryPolicy:
        return self.config.retry

    # -- helpers
    def _dir(self, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id in (".", ".."):
            raise SandboxNotRunning(f"no local sandbox {sandbox_id!r}")
        return self.base / sandbox_id

    def _read_meta(self, sandbox_id: str) -> _Meta | None:
        try:
            return _Meta.model_validate_json((self._dir(sandbox_id) / "meta.json").read_text())
        except (OSError, ValueError):
            return None

    def _write_meta(self, meta: _Meta) -> None:
        path = self._dir(meta.id) / "meta.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(meta.model_dump_json())
        os.replace(tmp, path)

    async def _connect(self, meta: _Meta) -> LocalSandbox:
        root = self._dir(meta.id) / "root"
        iso = Isolation(root=root, bwrap=self.bwrap if meta.bwrap else None, network=meta.spec.network)
        workdir = meta.spec.workdir or "/"
        iso.path(workdir).mkdir(parents=True, exist_ok=True)
        env = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": "/root", "HOSTNAME": "sandbox"}
        if iso.bwrap is None:
            warn_unconfined_once()
            env.update(PATH=os.environ.get("PATH", _PATH), HOME=str(root / "root"), TMPDIR=str(root / "tmp"))
            cwd = str(iso.path(workdir))
            argv = agent_argv(self.config.python)
        else:
            cwd = None
            argv = iso.argv(agent_argv(self.config.python), cwd=workdir)
        try:
            channel = await ProcessChannel.spawn(argv, cwd=cwd, env=env)
        except OSError as e:
            raise SandboxCreateError(f"cannot start the local agent ({argv[0]}): {e}") from e
        try:
            sb = await LocalSandbox.connect(
                channel, hello_timeout=self.config.hello_timeout, id=meta.id, name=meta.name, spec=meta.spec,
                backend_name=self.name, backend=self, agent_channel=channel,
            )
        except BaseException:
            _kill_group(channel.proc.pid)
            await channel.close()
            raise
        meta.agent_pids = [p for p in meta.agent_pids if lc.pid_exists(p)] + [channel.proc.pid]
        self._write_meta(meta)
        return sb

    # -- SandboxBackend
    @idempotent
    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None) -> LocalSandbox:
        refuse_namespace(spec, "local")
        refuse_user_switch(spec, "local")
        refuse_gvisor(spec, "local", "its commands are host processes (not a security boundary): use the "
                      "docker backend (runsc runtime) or kubernetes (a gVisor RuntimeClass)")
        if idempotency_key and idempotency_key in self._keys:
            meta = self._read_meta(self._keys[idempotency_key])
            if meta is not None:
                return await self._connect(meta)
        sid = f"{_slug(spec.name)}-{uuid.uuid4().hex[:10]}"
        labels = {**spec.labels, **lc.lifecycle_labels(spec)}
        meta = _Meta(id=sid, name=sid, spec=spec, labels=labels, created_at=time.time(), bwrap=self.bwrap is not None)
        d = self._dir(sid)
        try:
            prepare_root(d / "root")
            self._write_meta(meta)
        except OSError as e:
            raise SandboxCreateError(f"cannot create local sandbox directory {d}: {e}") from e
        if idempotency_key:
            self._keys[idempotency_key] = sid
        try:
            sb = await asyncio.shield(self._connect(meta))
        except BaseException:
            await self.delete(sid)
            raise
        lifecycle.track(sid, functools.partial(self._remove_sync, sid), backend=self.name)
        return sb

    def _remove_sync(self, sandbox_id: str) -> None:
        """Blocking removal for signal handlers / atexit."""
        meta = self._read_meta(sandbox_id)
        for pid in meta.agent_pids if meta else []:
            _kill_group(pid)
        _rmtree(self._dir(sandbox_id))

    @idempotent
    async def get(self, sandbox_id: str) -> LocalSandbox:
        meta = self._read_meta(sandbox_id)
        if meta is None:
            raise SandboxNotRunning(f"local sandbox {sandbox_id} does not exist")
        return await self._connect(meta)

    @idempotent
    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        out = []
        if not self.base.is_dir():
            return out
        for d in sorted(self.base.iterdir()):
            meta = self._read_meta(d.name)
            if meta is None or meta.labels.get(lc.MANAGED) != "true":
                continue
            if labels and any(meta.labels.get(k) != v for k, v in labels.items()):
                continue
            running = any(lc.pid_exists(p) for p in meta.agent_pids)
            out.append(SandboxInfo(id=meta.id, name=meta.name, backend=self.name,
                                   status="running" if running else "idle", image="(host)",
                                   labels=meta.labels, created_at=meta.created_at))
        return out

    @idempotent
    async def delete(self, sandbox_id: str) -> None:
        d = self._dir(sandbox_id)
        meta = self._read_meta(sandbox_id)
        if meta is not None:
            for pid in meta.agent_pids:
                _kill_group(pid)
        if d.exists():
            await asyncio.to_thread(_rmtree, d)
        lifecycle.untrack(sandbox_id)

    async def delete_many(self, labels: dict[str, str] | None = None, ids: Sequence[str] | None = None) -> int:
        """By label (every sandbox of ours when both are None), or by ids (optionally
        also filtered by labels): unknown or already deleted ids are skipped, an empty
        `ids` removes nothing. Returns how many sandboxes were removed."""
        if ids is not None and not ids:
            return 0
        targets = {i.id for i in await self.list(labels)}
        if ids is not None:
            targets &= set(ids)
        for sid in targets:
            await self.delete(sid)
        return len(targets)

    async def reap(self, *, max_age_seconds: float | None = None) -> list[str]:
        """Delete sandboxes whose owner died or which expired (or are older than `max_age_seconds`)."""
        now = time.time()
        gone = []
        for info in await self.list():
            if lifecycle.reap_due(info, now, max_age_seconds):
                await self.delete(info.id)
                gone.append(info.id)
        return gone

    async def close(self) -> None:
        return None


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40] or "sandbox"


def _rmtree(path: Path) -> None:
    def onerror(func, p, exc_info):  # read-only dirs written by commands: make writable and retry
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=onerror)
