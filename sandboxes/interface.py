"""The sandbox contract: an async `Sandbox` handle and the `SandboxBackend`
protocol. Backends translate it to one substrate each; everything above
(envs, swe_debug, CLIs) uses only this. Optional backend capabilities are
small protocols of their own (`SupportsDerivedImages`, `SupportsSnapshots`);
callers test for them with `getattr(backend, "<method>", None)` / `isinstance` and
fall back when absent.

Snapshots and forks (see `sandboxes.snapshots`): call `await sandbox.fork(n)` /
`await sandbox.snapshot()`; for a `Snapshot` object, `await
backend.create_from_snapshot(snap)`. A backend with snapshots sets
`sandbox.snapshot_backend = self` on every handle it returns; `fork` reaches the
backend through it.

Limits and errors, for every backend:

* Output: each stream of one exec keeps at most `spec.output_limit_bytes`
  (default 1 MiB): head and tail are kept, the middle dropped and counted.
  Bytes that are not UTF-8 decode with replacement.
* Timeouts: a command past its timeout has its whole process group killed;
  the result says `timed_out=True`; the sandbox stays usable.
* A command's own failure (exit code, timeout, OOM of the command) is an
  `ExecResult`, never an exception.
* `InfraError` (and subclasses) when the sandbox or backend itself failed:
  gone, killed, agent died, daemon unreachable. A command that may have
  started is never re-run silently; the caller decides.
* `PathError` for path traversal in archives, missing files, bad types.

The errors of each operation (every backend; the conformance suite checks it):

    create        SandboxCreateError / BackendUnavailable (InfraError),
                  ImageNotFound / ConfigError (UsageError)
    get           SandboxNotRunning for an unknown or stopped id
    list          BackendUnavailable; [] when nothing matches
    delete        never for an unknown or already deleted id; BackendUnavailable
    delete_many   never for unknown ids; BackendUnavailable
    exec, files   InfraError (usually SandboxNotRunning / AgentError) once the
                  sandbox is gone; PathError / ConfigError for bad arguments
    read_file     PathError: empty path, and its typed subclasses FileNotFound
                  (missing), IsADirectory, PermissionDenied (callers map them to
                  the builtins: `err.builtin`); ConfigError: max_bytes < 0;
                  TransferTooLarge: past spec.read_limit_bytes
    write_file    the same PathError subclasses (IsADirectory: the path is one;
                  PermissionDenied: the sandbox's user may not write it)
    exec(user=)   UnknownUser (ConfigError): no such user in the sandbox;
                  UserSwitchUnsupported: another user than the sandbox's own,
                  and the sandbox cannot switch (no CAP_SETUID/SETGID: the
                  secure default drops every capability; cells hold none)
    upload,       TransferTooLarge: past spec.transfer_limit_bytes
    download
    snapshot,     SnapshotUnsupported (UnsupportedError, UsageError) naming the backend
    fork          where it has no snapshots (Kubernetes, Prime, local processes);
                  InfraError when the sandbox or the engine failed; ConfigError: n < 1

Idempotent operations (create with its idempotency key, get, list, delete,
delete_many) are repeated by the backend on transient InfraErrors under its
`retry` option (`sandboxes.retry`); nothing else is.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from .errors import ConfigError, SnapshotUnsupported
from .results import ExecResult, OutputChunk, ProcessStatus, SandboxInfo
from .snapshots import Snapshot
from .spec import SandboxSpec

Command = str | Sequence[str]
"""A shell string (run with `/bin/sh -c`) or an argv list (run directly)."""
OutputKeep = Literal["newest", "head_tail"]
"""What a full background-process output buffer keeps (`Sandbox.start_process`)."""


class BackgroundProcess(abc.ABC):
    """A process started with `Sandbox.start_process`, running detached from any exec.

    Its stdout and stderr wait in bounded buffers (the output limit, 1 MiB by
    default) until `read_output` takes them. A buffer that fills keeps the
    NEWEST bytes (`keep="newest"`, the default: the oldest are dropped) or, with
    `keep="head_tail"`, the first half of what is unread and the newest bytes
    (the middle is dropped) — never silently:

    * `dropped_bytes` — (stdout, stderr) bytes dropped in the output the latest
      `read_output` returned; (0, 0) when nothing was lost. Updated by every
      `read_output` call.
    * `gap_at` — (stdout, stderr) where in that returned text the dropped bytes
      were: 0 with "newest" (the text starts after the gap), the head's length
      with "head_tail"; None where nothing was dropped.
    * `total_dropped_bytes` — the dropped bytes summed over the process's lifetime.
    """

    pid: int
    dropped_bytes: tuple[int, int] = (0, 0)
    gap_at: tuple[int | None, int | None] = (None, None)
    total_dropped_bytes: tuple[int, int] = (0, 0)

    @abc.abstractmethod
    async def poll(self) -> ProcessStatus:
        """Current status; never blocks."""

    @abc.abstractmethod
    async def read_output(self, until: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) produced since the previous call (each bounded by the output limit;
        what overflowed is counted in `dropped_bytes`, set by this call).

        With `until`, wait (inside the sandbox, one round trip) until stdout contains
        that marker, the process exits or `timeout` seconds pass, whichever is first;
        output after the marker stays buffered for the next call.
        """

    @abc.abstractmethod
    async def write_stdin(self, data: bytes | str) -> None:
        """Write to the process's stdin (kept open as a pipe). PathError-free; InfraError if the agent died."""

    @abc.abstractmethod
    async def kill(self, signal: int = 9, group: bool = True) -> None:
        """Send `signal` to the process group (or only the process with group=False);
        idempotent once it exited."""

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> ProcessStatus:
        """Wait for exit (or `timeout` seconds); returns the status then. Once it reports an
        exit, what the process wrote before exiting is in `read_output`."""


class Sandbox(abc.ABC):
    """An async handle to one running sandbox. Use as `async with` to delete it on exit."""

    id: str
    name: str
    spec: SandboxSpec
    backend_name: str
    snapshot_backend: "SupportsSnapshots | None" = None
    """The backend `fork` creates from (set by backends with snapshots on the handles they return)."""

    @abc.abstractmethod
    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        output_limit: int | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run one command to completion (or timeout).

        timeout: seconds, default `spec.timeout_per_command_seconds`.
        user: run as this user (name, uid or uid:gid, resolved in the sandbox's
        /etc/passwd) instead of `spec.user`; the same user as the sandbox's own
        always works, another one needs a sandbox that may switch users
        (UserSwitchUnsupported otherwise), an unknown one raises UnknownUser.
        Raises InfraError only when the sandbox/agent failed.
        """

    @abc.abstractmethod
    def exec_stream(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncIterator[OutputChunk | ExecResult]:
        """Run a command, yielding `OutputChunk`s as output arrives and exactly one
        `ExecResult` last (its stdout/stderr hold the bounded head+tail)."""

    @abc.abstractmethod
    async def start_process(
        self, cmd: Command, *, env: dict[str, str] | None = None, cwd: str | None = None,
        output_limit: int | None = None, keep: OutputKeep = "newest",
    ) -> BackgroundProcess:
        """Start a background process in its own process group and return at once.
        `output_limit` bounds each stream's unread buffer (default: the spec's output
        limit); `keep` says what a full buffer keeps (see `BackgroundProcess`)."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file (parent directories created). Raises PathError on a bad path."""

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes, exactly (binary-safe, no decoding).

        max_bytes: None reads the whole file up to `spec.read_limit_bytes`
        (64 MiB by default; it is held in memory): a larger file raises
        TransferTooLarge before anything is read. Otherwise at most the
        file's first `max_bytes` bytes are returned: a longer file is cut
        there, without an error (compare the length with `max_bytes` to tell).
        Raises PathError when the path is missing, a directory or empty,
        ConfigError for max_bytes < 0, InfraError when the sandbox is gone.
        """

    @abc.abstractmethod
    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a local file or directory tree to `remote` (a tar stream: modes and symlinks kept),
        streamed. More than `spec.transfer_limit_bytes` (1 GiB by default) raises TransferTooLarge
        before anything is sent."""

    @abc.abstractmethod
    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a sandbox file or directory tree to `local`. Members escaping `local`
        (absolute paths, `..`, links pointing out) are refused with PathError. Streamed
        through a temporary file; a tree past `spec.transfer_limit_bytes` (1 GiB by
        default, sparse files count at their full size) raises TransferTooLarge and
        nothing is extracted."""

    @abc.abstractmethod
    async def alive(self) -> bool:
        """True while the sandbox runs."""

    def known_gone(self) -> bool:
        """True when this handle already knows, without asking anyone, that its sandbox
        is gone (deleted, or its agent's channel closed: the container was killed, a
        cell's host died). False when it cannot tell: `alive()` asks."""
        return False

    @abc.abstractmethod
    async def delete(self) -> None:
        """Remove the sandbox; idempotent, never raises for an already gone sandbox."""

    async def snapshot(self, *, keep: bool = False) -> Snapshot:
        """Freeze this sandbox's filesystem as a `Snapshot` to create sandboxes from
        (`backend.create_from_snapshot`). The sandbox keeps running; its later writes
        are not in the snapshot. Carried: the filesystem, and the spec (environment,
        workdir, user, limits, isolation, network, start command); NOT carried:
        processes, memory, open files (see `sandboxes.snapshots`).

        The snapshot is labelled like a sandbox and goes away with the run (backend
        close, cleanup on signals / exit, the reaper once this process is dead)
        unless `keep=True`. Raises SnapshotUnsupported naming the backend where it
        has none; InfraError when the sandbox or the engine failed.
        """
        raise SnapshotUnsupported(
            f"the {self.backend_name} backend cannot snapshot or fork a sandbox (filesystem snapshots exist on the "
            "docker backend: containers and cells); create each sandbox and run its setup instead")

    async def fork(self, n: int) -> list["Sandbox"]:
        """`n` (>= 1) new sandboxes, each a copy of this one's filesystem now, made concurrently:
        `snapshot()`, then `n` `create_from_snapshot` on this sandbox's backend.

        Forks are independent: a write in one is never seen by its siblings nor by
        the source, which keeps running (its later writes are not in the forks).
        Environment, workdir, user, limits and isolation are carried; processes are
        NOT (each fork starts with nothing running but its start command). Either all
        `n` exist or none: if one creation fails (or the caller is cancelled), the
        forks already made are deleted and the error re-raised. The snapshot made for
        the fork is released with `delete_snapshot` once the forks exist: the backend
        removes it at once, or when the last fork made of it is deleted where the forks
        need it (Docker images; see the backend); a run's end removes it in any case.
        Raises SnapshotUnsupported where the backend has no snapshots, ConfigError for n < 1.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"fork(n) needs an integer n >= 1, got {n!r}")
        backend = self.snapshot_backend
        snap = await self.snapshot()  # SnapshotUnsupported from backends without snapshots
        if backend is None:
            raise SnapshotUnsupported(f"the {self.backend_name} backend made a snapshot but gave this handle no "
                                      "backend to create from (snapshot_backend is None)")
        try:
            return await create_from_snapshot_many(backend, snap, n)
        finally:
            await asyncio.shield(backend.delete_snapshot(snap))

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.delete()


@runtime_checkable
class SandboxBackend(Protocol):
    """Creates and manages sandboxes on one substrate (docker, kubernetes, prime, local)."""

    name: str

    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None) -> Sandbox:
        """Create a sandbox and wait until it is ready for `exec`.

        Never creates two sandboxes for one call, also under retry: the
        backend shields creation until the id is known or uses the key.
        Raises SandboxCreateError / BackendUnavailable (InfraError) or
        ImageNotFound / ConfigError (UsageError).
        """
        ...

    async def get(self, sandbox_id: str) -> Sandbox:
        """A handle to an existing sandbox. Raises SandboxNotRunning if it is gone."""
        ...

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        """Sandboxes of this backend carrying all `labels` (vf-sandbox's own only)."""
        ...

    async def delete(self, sandbox_id: str) -> None:
        """Remove one sandbox; idempotent."""
        ...

    async def delete_many(self, labels: dict[str, str] | None = None, ids: Sequence[str] | None = None) -> int:
        """Remove sandboxes of this backend (vf-sandbox's own only); returns how many were removed.

        * `ids` None: every sandbox carrying all `labels` (every one of ours when
          `labels` is None too).
        * `ids` given: those of them that are live sandboxes of ours (and carry
          `labels`, when given); unknown or already deleted ids are skipped
          without error and not counted; `ids=[]` removes nothing.

        Raises BackendUnavailable when the substrate does not answer.
        """
        ...

    async def close(self) -> None:
        """Release connections; sandboxes stay."""
        ...


@runtime_checkable
class SupportsDerivedImages(Protocol):
    """Optional backend capability: bake Python packages into an image ahead of time.

    A backend offering it builds (once, cached by content) an image that is
    `base` with `packages` pip-installed, without network inside the sandbox,
    and returns its name to use as `SandboxSpec.image`. Backends without it
    leave callers to install at boot (`python3 -m pip install` in the sandbox).
    """

    async def derive_image(self, base: str, packages: Sequence[str]) -> str:
        """The image to run for `base` + `packages`. Raises ImageNotFound
        (UsageError) for a missing base or a package that cannot be installed,
        BackendUnavailable (InfraError) when the substrate does not answer."""
        ...


@runtime_checkable
class SupportsOrphanReap(Protocol):
    """Optional backend capability: find sandboxes the substrate itself lost track of.

    A crashed engine can come back without listing sandboxes that still run
    (Docker: containers only containerd still holds after dockerd was
    SIGKILLed); `list` / `delete` cannot reach them. `sandboxes.lifecycle.reap`
    (so `vf-sandbox sandboxes reap` and every CLI's start-up) calls this too.
    """

    async def reap_orphans(self, *, dry_run: bool = False) -> list[str]:
        """Remove (unless `dry_run`) vf-sandbox's sandboxes the substrate lost; their ids.
        Never raises for what it cannot inspect (it logs and returns what it found)."""
        ...


@runtime_checkable
class SupportsCells(Protocol):
    """Optional backend capability: sandboxes as *cells* (`rollout_isolation="namespace"`,
    see `sandboxes.cells`) — private overlay, namespaces and cgroup limits inside a
    pooled host sandbox, made in milliseconds.

    `rollout_isolation="auto"` (SandboxEnv's default) asks it once per env whether
    the env's own spec can be a cell here; backends without it get a container
    (pod) per sandbox.
    """

    async def cells_available(self, spec: SandboxSpec) -> bool:
        """True when sandboxes of `spec` can be cells on this substrate, proven by
        opening one (which starts the spec's cell host: the first rollouts need it
        anyway). False, with the reason logged, for what a cell cannot give (network,
        GPUs, a kernel boundary other than runc), an engine whose cgroups cannot be
        divided, an image without python3 for the cell agent, or a cell host without
        the hardening `sandboxes.cells.AUTO_HARDENING` requires. Raises InfraError
        when the substrate itself fails (never read as "no cells")."""
        ...


@runtime_checkable
class SupportsSnapshots(Protocol):
    """Optional backend capability: sandboxes from snapshots (see `sandboxes.snapshots`).

    `Sandbox.snapshot()` makes one (the handle knows how: a container commits its
    filesystem to an image, a cell freezes its writable layer); the backend creates
    from, lists, removes and pushes them. Backends without it leave `Sandbox.snapshot`
    / `fork` to raise SnapshotUnsupported naming the backend.
    """

    async def create_from_snapshot(self, snapshot: Snapshot) -> Sandbox:
        """A new sandbox of `snapshot`: its filesystem, created with `snapshot.spec` (fresh
        lifecycle labels). Raises SnapshotUnsupported for a kind this backend cannot
        create from, ImageNotFound when the snapshot is gone, InfraError as `create`."""
        ...

    async def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Release a snapshot (object or id), kept or not: removed now, or, where sandboxes
        still run of it and need it (a Docker image under its containers), as soon as the
        last of them is deleted through this backend (at the latest when the backend closes
        or the reaper finds its owner dead). Idempotent; never raises for an unknown id."""
        ...

    async def list_snapshots(self, labels: dict[str, str] | None = None) -> list[Snapshot]:
        """vf-sandbox's snapshots on this backend carrying all `labels` (kept ones included)."""
        ...

    async def push_snapshot(self, snapshot: Snapshot, target: str, auth: RegistryAuth | None = None) -> Snapshot:
        """Push an "image" snapshot to a registry as `target` (`registry/repository:tag`);
        returns the snapshot with `image` = the registry reference, which other hosts and
        backends can create from. SnapshotUnsupported for a "layer" snapshot,
        ImagePushFailed when the registry refuses it."""
        ...


async def create_from_snapshot_many(backend: SupportsSnapshots, snapshot: Snapshot, n: int) -> list[Sandbox]:
    """`n` sandboxes of `snapshot`, created concurrently: all of them, or (on the first
    failure, or when the caller is cancelled) none: those made are deleted, the error
    re-raised."""
    tasks = [asyncio.ensure_future(backend.create_from_snapshot(snapshot)) for _ in range(n)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
        if failed is None:
            return [t.result() for t in tasks]
    except BaseException:
        await asyncio.shield(_discard(tasks))
        raise
    await asyncio.shield(_discard(tasks))
    raise failed


async def _discard(tasks: list[asyncio.Future]) -> None:
    """Cancel the creations still running, wait for all, delete every sandbox made."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    made = [t.result() for t in tasks if not t.cancelled() and t.exception() is None]
    await asyncio.gather(*(sb.delete() for sb in made), return_exceptions=True)


# ---------------------------------------------------------------- image builds
# (Capabilities callers test for with `isinstance(backend, SupportsImageBuild)`;
# request/result models live in sandboxes/images.py.)
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

    from .images import BuiltImage, ImageBuildRequest, PullProgress, RecipeStatus, RegistryAuth


@runtime_checkable
class SupportsImageBuild(Protocol):
    """Optional backend capability: build images from a Dockerfile and a context.

    Requests and results are `sandboxes.images.ImageBuildRequest` /
    `BuiltImage`; tags are content-addressed (same inputs → same tag → no
    rebuild) and builds target the host's architecture. Callers find it with
    `sandboxes.images.image_builder(name)` (or `isinstance(backend,
    SupportsImageBuild)`); backends that cannot build (local, kubernetes,
    prime) do not implement it, and `image_builder` refuses them with a
    UsageError naming the capability.
    """

    async def image_id(self, image: str) -> str | None:
        """The local image's id, or None when absent. BackendUnavailable when the engine does not answer."""
        ...

    async def find_image(self, request: ImageBuildRequest) -> BuiltImage | None:
        """The already built image for `request` (a cache hit), or None; never builds."""
        ...

    async def build_image(self, request: ImageBuildRequest, *, force: bool = False,
                          on_log: Callable[[str], None] | None = None) -> BuiltImage:
        """The image for `request`, built unless a matching one exists (or `force`).

        `on_log` receives the build log as it streams. Raises ImageBuildFailed
        (UsageError) naming the image with the log's last lines when the build
        fails, ImageNotFound for a missing parent image, BackendUnavailable
        (InfraError) when the engine does not answer.
        """
        ...

    async def pull_image(self, image: str, auth: RegistryAuth | None = None,
                         on_progress: Callable[[PullProgress], None] | None = None) -> str:
        """Fetch `image` from a registry; returns its id. ImageNotFound when it cannot be
        pulled (no such image or tag, bad credentials: the message says which).
        `on_progress` receives the pull's byte counts as they change (maybe from
        another thread), the last one with `finished`."""
        ...

    async def remove_image(self, image: str) -> bool:
        """Remove the local image (or just this name of it); False when it is absent or in
        use by a container (never forced)."""
        ...

    async def push_image(self, image: str, target: str, auth: RegistryAuth | None = None) -> str:
        """Tag the local `image` as `target` (`registry/repository:tag`) and push it;
        returns the pushed digest. ImagePushFailed when the registry refuses it."""
        ...


@runtime_checkable
class SupportsImageRecipes(Protocol):
    """Optional backend capability: named image recipes (images/recipes.toml), built on demand.

    What `vf-sandbox images build|ls` drives, whichever backend is named.
    """

    async def image_recipes(self) -> list[RecipeStatus]:
        """Every recipe with the state of its image ('ok', 'stale' or 'missing')."""
        ...

    async def build_recipe(self, name: str, *, force: bool = False) -> BuiltImage:
        """Build recipe `name` (or an alias) and the recipes it is FROM, unless up to date."""
        ...
