"""`DockerBackend`: sandboxes as Docker containers, driven through the Engine
API with aiodocker, every command served by the in-sandbox agent over one
attached exec per sandbox.

Each container runs with networking off (unless `spec.network`: then on the
project's egress-only bridge, see network.py; never host networking), every
capability dropped (`spec.user_switch`: all but SETUID/SETGID/SETPCAP, which the
agent alone keeps and every command sheds; containers with the agent only),
no-new-privileges, pids/memory(+swap)/CPU limits, an init
process, AutoRemove, and PID 1 wrapped in `timeout -s KILL <lifetime>`: it is
gone after `timeout_minutes` even if its owner was SIGKILLed. That timer is
within reach of the container's root code (it can SIGSTOP `timeout`), so the
lifetime is also enforced from outside: the creating process deletes the
container at its labelled deadline (`EXPIRES_AT`) + DEADLINE_SLACK_SECONDS (an
event-loop timer, cancelled on delete), and the reaper removes any managed
container past its deadline, its owner alive or not. Creation is
idempotent (the container name derives from the idempotency key; a 409 means
"fetch the one a previous attempt made"), retried on transient InfraErrors
only (`retry_op`, as every idempotent operation; delete too).
Images missing locally are built from `images/` when a recipe maps to them.

`spec.isolation == "gvisor"` runs the container under the engine's gVisor
runtime (`HostConfig.Runtime`, "runsc" unless `gvisor_runtime=` says
otherwise); an engine that does not list that runtime is refused with a
ConfigError naming it and saying how to register it (scripts/setup.sh does
it for the engine it manages). The agent is the same: one attached exec per
sandbox, one round trip per command, also under gVisor.

`spec.rollout_isolation == "namespace"` hands out cells of pooled cell-host
containers (`sandboxes.cells`): a host is an ordinary container of the image
whose agent (alone, as root) holds the capabilities that build a cell's
namespaces, overlay and cgroup (CELL_HOST_CAPS; seccomp and no-new-privileges
stay on) and drops all of them in the cell before anything runs there.

Snapshots (`SupportsSnapshots`): a container's snapshot is its filesystem committed
to a local image (snapshots.py), forks are containers of it; a cell's snapshot is
its writable layer frozen in its cell host (`CellHosts.create_from_snapshot`).
Every handle this backend returns has `snapshot_backend` set to it (`Sandbox.fork`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import aiodocker
import aiohttp

from sandboxes import lifecycle
from sandboxes.agent import AgentSandbox
from sandboxes.agent.client import AgentConnection
from sandboxes.agent.protocol import agent_argv
from sandboxes.cells import CellHosts, auto_refusal, is_cell_id
from sandboxes.errors import (
    AgentError,
    BackendUnavailable,
    ConfigError,
    ImageNotFound,
    SandboxCreateError,
    SandboxNotRunning,
    SnapshotUnsupported,
)
from sandboxes.images import BuiltImage, ImageBuildRequest, PullProgress, RecipeStatus, RegistryAuth
from sandboxes.interface import Sandbox
from sandboxes.labels import EXPIRES_AT, MANAGED, PREFIX, lifecycle_labels
from sandboxes.results import SandboxInfo
from sandboxes.retry import RetryPolicy, idempotent, retry_op
from sandboxes.snapshots import Snapshot
from sandboxes.spec import SandboxSpec

from .build import EngineImages
from .channel import DockerExecChannel
from .engine import DEFAULT_URL, _sync_conn, resolve_url  # noqa: F401  (re-exported)
from . import orphans
from .network import check_network_mode, ensure_egress_network
from .snapshots import DockerSnapshots

log = logging.getLogger(__name__)

NAME_PREFIX = "vf-"
DEADLINE_SLACK_SECONDS = 5.0
"""The creating process deletes a container this long after its labelled deadline (the
in-container `timeout` normally ends it first; this is for one whose `timeout` was stopped)."""
OOM_EVENT_WAIT = 3.0  # seconds died_of_oom waits for the engine to log a dead sandbox's oom event
PYTHON_PROBE = "command -v python3 >/dev/null 2>&1 && python3 -c 'import sys; sys.exit(sys.version_info < (3, 7))'"


def container_name(prefix: str, key: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", prefix).strip("-.") or "sandbox"
    return f"{NAME_PREFIX}{safe[:40]}-{key}"


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def ping_sync(url: str | None = None, timeout: float = 5.0) -> str | None:
    """None when the daemon at `url` answers /_ping, else why not (blocking; for tests and CLIs)."""
    url = resolve_url(url)
    conn = _sync_conn(url, timeout)
    try:
        conn.request("GET", "/_ping")
        resp = conn.getresponse()
        body = resp.read()
        return None if resp.status == 200 else f"Docker daemon at {url} answered {resp.status}: {body[:200]!r}"
    except OSError as exc:
        return f"Docker daemon at {url} does not answer: {exc}"
    finally:
        conn.close()


def remove_container_sync(url: str, container_id: str, timeout: float = 15.0) -> int:
    """Force-remove a container with one blocking HTTP call (signal handlers, atexit); the
    engine's status (204 removed, 404 no such container)."""
    conn = _sync_conn(url, timeout)
    try:
        conn.request("DELETE", f"/containers/{container_id}?force=1&v=1")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


PENDING_WAIT = 8.0
"""Seconds a signal's cleanup waits for a container whose creation the engine may still be
completing (the request was sent, its answer not read: the process dies right after)."""


def remove_pending_sync(url: str, name: str, wait: float = PENDING_WAIT) -> None:
    """Remove container `name` whose creation is in flight (blocking; signal handlers):
    force-remove it by name, retrying while the engine does not know it yet."""
    deadline = time.monotonic() + wait
    while remove_container_sync(url, name) == 404 and time.monotonic() < deadline:
        time.sleep(0.2)


def spec_of_container(inspect: dict[str, Any], gvisor_runtime: str) -> SandboxSpec:
    """The spec a running container of ours was made with, as far as the engine tells
    (`get` of a sandbox another process made): image, workdir, user, limits, network,
    isolation, user labels, start command, lifetime (environment: the image's and the
    container's mixed, so it is left out; a snapshot's commit carries it anyway)."""
    config, host = inspect.get("Config") or {}, inspect.get("HostConfig") or {}
    spec: dict[str, Any] = {"image": config.get("Image") or "", "workdir": config.get("WorkingDir") or "/",
                            "user": config.get("User") or None,
                            "isolation": "gvisor" if host.get("Runtime") == gvisor_runtime else "runc",
                            "network": (host.get("NetworkMode") or "none") != "none",
                            "labels": {k: v for k, v in (config.get("Labels") or {}).items()
                                       if not k.startswith(PREFIX + ".")}}
    if host.get("Memory"):
        spec["memory_gb"] = host["Memory"] / 1024**3
    if host.get("NanoCpus"):
        spec["cpu_cores"] = host["NanoCpus"] / 1e9
    if host.get("PidsLimit"):
        spec["pids_limit"] = host["PidsLimit"]
    cmd = config.get("Cmd") or []
    if len(cmd) == 7 and cmd[:3] == ["timeout", "-s", "KILL"] and cmd[4:6] == ["/bin/sh", "-c"]:
        spec["start_command"] = cmd[6]
        with contextlib.suppress(ValueError):
            spec["timeout_minutes"] = int(cmd[3].rstrip("s")) / 60
    return SandboxSpec(**spec)


class DockerSandbox(AgentSandbox):
    """A container served by the agent; `delete()` removes the container."""

    backend_name = "docker"

    def __init__(self, connection: AgentConnection, *, backend: "DockerBackend", **kw: Any):
        super().__init__(connection, backend_name="docker", **kw)
        self._backend = backend
        self.snapshot_backend = backend
        self._created_at = time.time()  # bounds the engine-event query of died_of_oom

    async def snapshot(self, *, keep: bool = False) -> Snapshot:
        """The container's filesystem committed to an image (see backends/docker/snapshots.py)."""
        if self._deleted:
            raise SandboxNotRunning(f"sandbox {self.name} was deleted")
        return await self._backend._snapshots.take(self, keep=keep)

    async def _destroy(self) -> None:
        await self._backend.delete(self.id)

    async def alive(self) -> bool:
        if self._deleted:
            return False
        if self._conn.dead is None:
            return await super().alive()
        return await self._backend._running(self.id)

    async def died_of_oom(self) -> bool:
        """The container was OOM-killed as a whole (the engine's `oom` event for it). Under
        gVisor a memory bomb takes the whole sandbox down (the host's OOM killer hits the
        sentry, whose memory is the sandbox's): that is the sandbox's own doing, a task
        failure, not an infrastructure error. The engine keeps its recent events after an
        AutoRemove container is gone; an engine that cannot answer counts as "no". The engine
        may log the `oom` event a moment after the caller saw the sandbox die (seen under load:
        the bomb was then retried as an infrastructure error), so a "no" is asked again for up
        to OOM_EVENT_WAIT seconds; only a dead sandbox's caller pays that wait."""
        docker = await self._backend._client()
        deadline = time.monotonic() + OOM_EVENT_WAIT
        while True:
            params = {"since": str(int(self._created_at) - 5), "until": str(int(time.time()) + 1),
                      "filters": json.dumps({"container": [self.id], "event": ["oom"]})}
            try:
                async with docker._query("events", params=params, timeout=10) as resp:
                    text = await resp.text()
            except Exception as exc:  # noqa: BLE001 - cannot tell: the caller keeps the infra error
                log.debug("events of %s: %s", self.id, exc)
                return False
            if '"oom"' in text:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.5)

    async def gone(self) -> bool:
        """Only the engine's own answer counts: no such container (404) or not running.
        Any other engine error propagates (the watchdog then cannot tell, and waits)."""
        docker = await self._backend._client()
        try:
            container = await docker.containers.get(self.id)
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return True
            raise
        return not container["State"].get("Running")


# what a cell host's agent needs to build cells: namespaces, mounts and cgroups (SYS_ADMIN),
# the overlay's copy-up and whiteouts (DAC_OVERRIDE, MKNOD), chroot into the cell's root,
# loopback up in its network namespace (NET_ADMIN), switching to the sandbox user (SETUID/GID),
# emptying the cell's capability bounding set (SETPCAP); the overlay acts on its upper layer with
# the mounter's credentials, so a chmod / copy-up of a file of the cell's user needs FOWNER / CHOWN;
# the watcher kills a cell's init running as another user (delete, lifetime): KILL
USER_SWITCH_CAPS = ["SETUID", "SETGID", "SETPCAP"]  # spec.user_switch: the agent's, never a command's


def check_user_switch(spec: SandboxSpec) -> None:
    """ConfigError unless the agent of a user_switch container starts as root (only root's
    agent holds the capabilities; commands still default to the image's user)."""
    if spec.user not in (None, "", "0", "root") and not str(spec.user).startswith(("0:", "root:")):
        raise ConfigError(f"user_switch=True needs the sandbox's agent to run as root, but spec.user={spec.user!r}: "
                          "leave spec.user unset (or root) and pass exec(user=...) per command")


CELL_HOST_CAPS = ["SYS_ADMIN", "DAC_OVERRIDE", "MKNOD", "SYS_CHROOT", "NET_ADMIN", "SETUID", "SETGID", "SETPCAP",
                  "FOWNER", "CHOWN", "KILL"]


def cell_host_agent_argv(argv: list[str]) -> list[str]:
    """A cell host's agent under a shell that ends the host container when the agent ends
    on its own (exit 0: its client's channel closed, even when the client was SIGKILLed):
    nobody can reach the host's cells any more. `kill -9 -1` (root in the container) takes
    every process but PID 1 down, `timeout` among them, and docker-init then ends the
    container with every cell in it. An agent that failed (python3 missing, a crash) exits
    non-zero and leaves the container to the client (which reads why, then deletes it)."""
    return ["/bin/sh", "-c", '"$@" && kill -9 -1', "vf-cell-host", *argv]


class DockerBackend:
    """Docker Engine backend (registered as "docker")."""

    name = "docker"

    def __init__(
        self,
        url: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        build_missing: bool = True,
        network_mode: str | None = None,
        hello_timeout: float = 60.0,
        require_disk_limit: bool = False,
        api_timeout: float = 120.0,
        python: str = "python3",
        gvisor_runtime: str = "runsc",
        cells_per_host: int | None = None,
    ):
        self.url = resolve_url(url)
        self.retry = retry or RetryPolicy()
        self.build_missing = build_missing
        if network_mode is not None:
            check_network_mode(network_mode)  # refused at once, not at the first networked sandbox
        self.network_mode = network_mode
        self.hello_timeout = hello_timeout
        self.require_disk_limit = require_disk_limit
        self._disk_limits: bool | None = None  # can this engine cap a container's writable layer?
        self._disk_why = ""
        self._disk_warned = False
        self.api_timeout = api_timeout
        self.python = python
        self.gvisor_runtime = gvisor_runtime
        self._engine_info: dict[str, Any] | None = None  # `docker info`, read once (see _info)
        self._docker: aiodocker.Docker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._images: dict[str, str] = {}  # requested image -> image to run
        self._image_locks: dict[str, asyncio.Lock] = {}
        self._no_agent: set[str] = set()  # images without a usable python3
        self._engine_images = EngineImages(self.url)
        self.cells = CellHosts(self._create_cell_host, cells_per_host=cells_per_host)
        self._snapshots = DockerSnapshots(self)
        self._deadlines: dict[str, asyncio.TimerHandle] = {}  # container id -> its deletion at the deadline

    # ---------------------------------------------------------- plumbing
    async def _client(self) -> aiodocker.Docker:
        loop = asyncio.get_running_loop()
        if self._docker is not None and self._loop is not loop:
            self._docker = None  # made on another (maybe closed) event loop: unusable here
        if self._docker is None:
            self._loop = loop
            timeout = aiohttp.ClientTimeout(total=self.api_timeout, connect=10, sock_connect=10)
            if self.url.startswith("unix://"):
                connector: aiohttp.BaseConnector = aiohttp.UnixConnector(self.url[len("unix://"):], limit=0)
                url = "unix://localhost"
            else:
                connector = aiohttp.TCPConnector(limit=0)
                url = re.sub(r"^tcp://", "http://", self.url)
            # limit=0: every sandbox's agent stream holds one connection for its lifetime
            self._docker = aiodocker.Docker(url=url, connector=connector, timeout=timeout, api_version="v1.41")
        return self._docker

    def _unavailable(self, exc: BaseException, what: str) -> BackendUnavailable:
        return BackendUnavailable(
            f"Docker daemon at {self.url} does not answer ({what}): {getattr(exc, 'message', None) or exc!r}. "
            "Is dockerd running? (start it, or set DOCKER_HOST)"
        )

    @contextlib.asynccontextmanager
    async def _api(self, what: str):
        """Translate transport failures to BackendUnavailable."""
        try:
            yield
        except aiodocker.DockerError as exc:
            if exc.status == 900:
                raise self._unavailable(exc, what) from exc
            raise
        except (aiohttp.ClientConnectionError, ConnectionError, FileNotFoundError, asyncio.TimeoutError) as exc:
            raise self._unavailable(exc, what) from exc

    async def _info(self, fresh: bool = False) -> dict[str, Any]:
        """The engine's `docker info` (storage driver, runtimes), read once; again with `fresh`."""
        if self._engine_info is None or fresh:
            docker = await self._client()
            async with self._api("info"):
                self._engine_info = await docker.system.info()
        return self._engine_info

    async def ping(self) -> None:
        """Raise BackendUnavailable unless the daemon answers."""
        docker = await self._client()
        async with self._api("ping"):
            await docker._query_json("version")

    async def close(self) -> None:
        """Release connections and remove this backend's snapshots (not kept, not in use);
        sandboxes stay."""
        with contextlib.suppress(Exception):
            await self.cells.close()
        with contextlib.suppress(Exception):
            await self._snapshots.close()
        for handle in self._deadlines.values():  # the reaper is the backstop for what is left
            handle.cancel()
        self._deadlines.clear()
        if self._docker is not None:
            docker, self._docker = self._docker, None
            with contextlib.suppress(Exception):
                await docker.close()
            with contextlib.suppress(Exception):
                await docker.connector.close()

    # ---------------------------------------------------------- images
    async def resolve_image(self, image: str) -> str:
        """The local image to run for `image`, building it from images/ if needed."""
        if image in self._images:
            return self._images[image]
        lock = self._image_locks.setdefault(image, asyncio.Lock())
        async with lock:
            if image in self._images:
                return self._images[image]
            docker = await self._client()
            try:
                async with self._api("inspect image"):
                    await docker.images.inspect(image)
                self._images[image] = image
                return image
            except aiodocker.DockerError as exc:
                if exc.status != 404:
                    raise SandboxCreateError(f"cannot inspect image {image}: {exc.message}") from exc
            from . import images as image_recipes

            recipe = image_recipes.find_recipe(image)
            if recipe is None or not self.build_missing:
                raise ImageNotFound(image_recipes.missing_image_message(image))
            built = await asyncio.to_thread(image_recipes.ensure_image, recipe.name, self.url)
            self._images[image] = built
            return built

    async def derive_image(self, base: str, packages: Sequence[str]) -> str:
        """A local image = `base` + pip `packages` (the `SupportsDerivedImages`
        capability), built once from wheels downloaded on the host with
        networking off and found by its content-hash tag afterwards.

        Raises ImageNotFound when the base is missing or has no python3, or a
        package cannot be downloaded or installed; BackendUnavailable when the
        daemon does not answer.
        """
        resolved = await self.resolve_image(base)
        from . import images as image_recipes

        return await asyncio.to_thread(image_recipes.derive_image, resolved, list(packages), self.url)

    # ---------------------------------------------------------- image builds (SupportsImageBuild)
    async def image_id(self, image: str) -> str | None:
        """The local image's id, or None when absent."""
        return await asyncio.to_thread(self._engine_images.image_id, image)

    async def find_image(self, request: ImageBuildRequest) -> BuiltImage | None:
        """The already built image for `request`, or None (never builds)."""
        return await asyncio.to_thread(self._engine_images.find, request)

    async def build_image(self, request: ImageBuildRequest, *, force: bool = False,
                          on_log: Callable[[str], None] | None = None) -> BuiltImage:
        """Build `request` through the Engine API (see backends/docker/build.py) unless cached."""
        return await asyncio.to_thread(self._engine_images.build, request, force=force, on_log=on_log)

    async def pull_image(self, image: str, auth: RegistryAuth | None = None,
                         on_progress: Callable[[PullProgress], None] | None = None) -> str:
        """Pull `image` from its registry (ImageNotFound where it cannot be)."""
        return await asyncio.to_thread(self._engine_images.pull, image, auth, on_progress)

    async def remove_image(self, image: str) -> bool:
        """Remove the local image name (never forced; see backends/docker/build.py)."""
        return await asyncio.to_thread(self._engine_images.remove, image)

    async def push_image(self, image: str, target: str, auth: RegistryAuth | None = None) -> str:
        """Tag `image` as `target` and push it (see backends/docker/build.py)."""
        return await asyncio.to_thread(self._engine_images.push, image, target, auth)

    # ---------------------------------------------------------- recipes (SupportsImageRecipes)
    async def image_recipes(self) -> list[RecipeStatus]:
        """images/recipes.toml with the state of each recipe's image."""
        from . import images as image_recipes

        return await asyncio.to_thread(image_recipes.ImageBuilder(self.url).statuses)

    async def build_recipe(self, name: str, *, force: bool = False) -> BuiltImage:
        """Build recipe `name` (or an alias) and its parents unless up to date."""
        from . import images as image_recipes

        return await asyncio.to_thread(image_recipes.ImageBuilder(self.url).ensure, name, force)

    # ---------------------------------------------------------- create
    async def _network_mode(self) -> str:
        """The network of a sandbox with `spec.network`: the one named by `network_mode`, else the
        project's egress-only bridge (backends/docker/network.py). Never the host's namespace."""
        if self.network_mode is None:
            docker = await self._client()
            async with self._api("sandbox network"):
                self.network_mode = await ensure_egress_network(docker, self.url)
        check_network_mode(self.network_mode)
        return self.network_mode

    async def _runtime(self, spec: SandboxSpec) -> str | None:
        """The OCI runtime for `spec` (None = the engine's default, runc); ConfigError
        when gVisor is asked for and the engine has no such runtime."""
        if spec.isolation != "gvisor":
            return None
        name = self.gvisor_runtime
        runtimes = (await self._info()).get("Runtimes") or {}
        if name not in runtimes:  # read again: set-up may have registered it since
            runtimes = (await self._info(fresh=True)).get("Runtimes") or {}
        if name not in runtimes:
            raise ConfigError(
                f"isolation='gvisor' needs the Docker runtime {name!r}, which the engine at {self.url} does not "
                f"have (it has: {', '.join(sorted(runtimes)) or 'none'}). Install gVisor (Debian: "
                f"`apt-get install runsc`), add to /etc/docker/daemon.json "
                f'{{"runtimes": {{"{name}": {{"path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", '
                f'"--network=none"]}}}}}} and reload dockerd (`kill -HUP <dockerd pid>`); scripts/setup.sh does this '
                f"for the engine it starts. Or pass gvisor_runtime=<name> in the backend options.")
        args = (runtimes.get(name) or {}).get("runtimeArgs") or []
        if spec.network and "--network=none" in args:
            raise ConfigError(
                f"network=True with isolation='gvisor': the engine's {name!r} runtime runs with --network=none "
                f"(no network at all); drop network=True or register a runsc runtime with gVisor networking")
        return name

    async def container_config(self, spec: SandboxSpec, image: str, cell_host: bool = False) -> dict[str, Any]:
        """The Engine API create body for `spec` (secure defaults; a cell host's agent
        also gets CELL_HOST_CAPS, dropped in every cell)."""
        lifetime = max(1, int(spec.timeout_minutes * 60))
        memory = spec.memory_bytes
        host: dict[str, Any] = {
            "NetworkMode": (await self._network_mode()) if spec.network else "none",
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "PidsLimit": spec.pids_limit,
            "Memory": memory,
            "MemorySwap": memory,
            "NanoCpus": int(spec.cpu_cores * 1e9),
            "Init": True,
            "AutoRemove": True,
        }
        if spec.user_switch and not cell_host:
            check_user_switch(spec)
            host["CapAdd"] = list(USER_SWITCH_CAPS)  # the agent's alone: dropped in every command it starts
        if cell_host:
            host["CapAdd"] = list(CELL_HOST_CAPS)
            if spec.isolation == "gvisor":
                # the engine's pids limit counts the gVisor kernel's host threads (several per
                # sandboxed thread); each cell's own pids cgroup, enforced inside gVisor, is the limit
                host["PidsLimit"] = max(spec.pids_limit * 8, 32768)
            host["NanoCpus"] = int(min(spec.cpu_cores, await self._engine_cpus()) * 1e9)
        runtime = await self._runtime(spec)
        if runtime:
            host["Runtime"] = runtime
        if spec.gpu_count:
            host["DeviceRequests"] = [{"Driver": "nvidia", "Count": spec.gpu_count, "Capabilities": [["gpu"]]}]
        labels = {**{k: str(v) for k, v in spec.labels.items()}, **lifecycle_labels(spec)}
        return {
            "Image": image,
            "Cmd": ["timeout", "-s", "KILL", f"{lifetime}s", "/bin/sh", "-c", spec.start_command],
            "Env": [f"{k}={v}" for k, v in spec.environment_vars.items()] + [orphans.MARK_ENV],
            "WorkingDir": spec.workdir,
            "User": spec.user or "",
            "Labels": labels,
            "NetworkDisabled": not spec.network,
            "HostConfig": host,
        }

    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None) -> AgentSandbox:
        if spec.rollout_isolation == "namespace":
            if spec.user_switch:
                raise ConfigError("user_switch=True is not available in cells (rollout_isolation='namespace': "
                                  "their processes hold no capability); use rollout_isolation='container'")
            cell = await self.cells.create(spec)
            cell.snapshot_backend = self
            return cell
        return await self._create(spec, idempotency_key)

    # ---------------------------------------------------------- snapshots (SupportsSnapshots)
    async def create_from_snapshot(self, snapshot: Snapshot) -> Sandbox:
        """A sandbox of `snapshot`: a container of its image ("image"), or a cell stacking
        its layer ("layer", made by the cell hosts). A snapshot only a registry has (pushed,
        then removed here) is pulled first (anonymously: call `pull_image` with credentials
        for a private registry)."""
        if snapshot.kind == "layer":
            create = getattr(self.cells, "create_from_snapshot", None)
            if create is None:
                raise SnapshotUnsupported("the docker backend cannot create cells from layer snapshots yet")
            sandbox = await create(snapshot)
            sandbox.snapshot_backend = self
            return sandbox
        return await self._snapshots.create_from(snapshot)

    async def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Remove a snapshot now, or (an image under containers made of it here) when the last
        of them is deleted; idempotent. The registry copy of a pushed one stays."""
        kind = snapshot.kind if isinstance(snapshot, Snapshot) else None
        cells_delete = getattr(self.cells, "delete_snapshot", None)
        if kind != "image" and cells_delete is not None:
            if await cells_delete(snapshot.id if isinstance(snapshot, Snapshot) else snapshot):
                return  # a layer of this process's cell hosts
        if kind != "layer":
            await self._snapshots.release(snapshot)

    async def list_snapshots(self, labels: dict[str, str] | None = None) -> list[Snapshot]:
        """Snapshot images of vf-sandbox on this engine (any process's) and this process's
        cell-layer snapshots, carrying all `labels`."""
        out = await self._snapshots.list(labels)
        cells_list = getattr(self.cells, "list_snapshots", None)
        if cells_list is not None:
            listed = cells_list(labels)
            out += await listed if inspect.isawaitable(listed) else listed
        return out

    async def push_snapshot(self, snapshot: Snapshot, target: str, auth: RegistryAuth | None = None) -> Snapshot:
        """Push an image snapshot as `target`; the returned snapshot's `image` is `target`
        (SnapshotUnsupported for a cell's layer)."""
        return await self._snapshots.push(snapshot, target, auth)

    async def cells_available(self, spec: SandboxSpec) -> bool:
        """`SupportsCells`: whether `spec` can be cells here (`rollout_isolation="auto"`).
        Only under runc (a cell's memory limit is not enforced under gVisor), without
        network or GPUs, and proven by opening and closing one cell: that starts the
        spec's cell host (the first rollouts' need it anyway) and finds an engine whose
        cgroups cannot be divided or an image without python3; and only where the cell
        host's agent has the hardening `sandboxes.cells.AUTO_HARDENING` requires."""
        why = ("isolation='gvisor'" if spec.isolation != "runc" else "user_switch=True" if spec.user_switch
               else "no python3 in the image" if spec.image in self._no_agent else "")
        if not why:
            try:  # network / GPUs are refused by the cells' own check before any host starts
                cell = await self.cells.create(spec.model_copy(update={"rollout_isolation": "namespace"}))
            except ConfigError as exc:  # what a cell cannot give (refuse_in_cells, CellsUnsupported, no python3)
                why = str(exc)
            else:
                why = auto_refusal(cell) or ""
                await cell.delete()
                if not why:
                    return True
        log.info("rollout_isolation='auto': a container per sandbox of %s (%s)", spec.image, why)
        return False

    async def _create(self, spec: SandboxSpec, idempotency_key: str | None, cell_host: bool = False) -> AgentSandbox:
        key = _key_digest(idempotency_key) if idempotency_key else uuid.uuid4().hex[:16]
        name = container_name(spec.name, key)
        return await retry_op(lambda: self._create_attempt(spec, name, cell_host), self.retry, f"docker: create {name}")

    async def _create_cell_host(self, spec: SandboxSpec) -> AgentSandbox:
        return await self._create(spec, None, cell_host=True)

    async def _engine_cpus(self) -> int:
        """The engine's CPU count (a container's CPU limit cannot exceed it)."""
        return int((await self._info()).get("NCPU") or 1)

    async def _create_attempt(self, spec: SandboxSpec, name: str, cell_host: bool = False) -> AgentSandbox:
        """One try; retried as a whole on InfraError (same name: a 409 adopts the earlier container)."""
        image = await self.resolve_image(spec.image)
        return await self._create_once(spec, image, name, cell_host)

    async def _disk_supported(self) -> bool:
        """Whether the engine's storage driver can cap a container's writable layer
        (`StorageOpt size`): overlay2 on xfs (mounted with pquota), btrfs, zfs, devicemapper."""
        if self._disk_limits is None:
            info = await self._info()
            driver = info.get("Driver", "")
            backing = dict(tuple(x) for x in info.get("DriverStatus") or [] if len(x) == 2).get("Backing Filesystem", "")
            self._disk_limits = driver in ("btrfs", "zfs", "devicemapper", "windowsfilter") or (
                driver in ("overlay2", "fuse-overlayfs") and backing == "xfs")
            self._disk_why = f"storage driver {driver} on {backing or 'an unknown filesystem'}"
        return self._disk_limits

    async def _storage_opt(self, spec: SandboxSpec) -> dict[str, str] | None:
        """{"size": ...} enforcing `spec.disk_size_gb`, or None (warned loudly, or refused
        with `require_disk_limit`) where the engine cannot."""
        if await self._disk_supported():
            return {"size": f"{max(1, int(spec.disk_size_gb * 1024))}m"}
        msg = (f"disk_size_gb={spec.disk_size_gb:g} is NOT enforced by the Docker engine at {self.url}: "
               f"{self._disk_why} cannot cap a container's writable layer (needs overlay2 on xfs mounted with "
               f"pquota, btrfs or zfs); a sandbox can fill the host's disk")
        if self.require_disk_limit:
            raise ConfigError(msg + " (require_disk_limit=True)")
        if not self._disk_warned:
            self._disk_warned = True
            log.warning(msg)
        return None

    async def _create_once(self, spec: SandboxSpec, image: str, name: str, cell_host: bool = False) -> AgentSandbox:
        docker = await self._client()
        config = await self.container_config(spec, image, cell_host)
        storage = await self._storage_opt(spec)
        if storage:
            config["HostConfig"]["StorageOpt"] = storage
        started = False
        # a signal while the engine creates it: the cleanup waits for the container and removes it
        lifecycle.track(name, partial(remove_pending_sync, self.url, name), backend=self.name, kind="pending")
        try:
            async with self._api("create container"):
                container = await self._shielded_create(docker, config, name)
            cid = container.id
        except aiodocker.DockerError as exc:
            lifecycle.untrack(name, "pending")
            if exc.status == 404:
                self._images.pop(spec.image, None)
                raise ImageNotFound(f"image {image} vanished: {exc.message}") from exc
            if exc.status != 409 and storage and "storage-opt" in str(exc.message).lower():
                # e.g. xfs without pquota: the engine cannot after all; warn (or refuse) and go on without
                self._disk_limits, self._disk_why = False, f"the engine said: {exc.message}"
                return await self._create_once(spec, image, name, cell_host)
            if exc.status != 409:
                raise SandboxCreateError(f"cannot create container {name}: {exc.message}") from exc
            # a previous attempt of this very call created it: use that one
            try:
                async with self._api("inspect container"):
                    container = await docker.containers.get(name)
            except aiodocker.DockerError as exc2:
                raise SandboxCreateError(f"container {name} exists but cannot be inspected: {exc2.message}") from exc2
            cid = container.id
            state = container["State"]
            if state.get("Running"):
                started = True
            elif state.get("Status") != "created":
                raise SandboxCreateError(f"container {name} from an earlier attempt is {state.get('Status')}") from exc
        except BaseException:
            lifecycle.untrack(name, "pending")
            raise
        lifecycle.track(cid, partial(remove_container_sync, self.url, cid), backend=self.name)
        lifecycle.untrack(name, "pending")
        adopted = ((getattr(container, "_container", None) or {}).get("Config") or {}).get("Labels")
        self._schedule_deadline(cid, adopted or config["Labels"])  # an adopted container: its own deadline
        try:
            if not started:
                try:
                    async with self._api("start container"):
                        await container.start()
                except aiodocker.DockerError as exc:
                    raise SandboxCreateError(f"cannot start container {name}: {exc.message}") from exc
            return await self._attach(container, spec, name, cell_host)
        except BaseException:
            # never leave a half-made container behind; a retry makes a fresh one
            with contextlib.suppress(Exception):
                await asyncio.shield(self.delete(cid))
            raise

    def _schedule_deadline(self, cid: str, labels: dict[str, str]) -> None:
        """Delete container `cid` from this process at its labelled deadline + slack: the
        lifetime held from outside the container (its root code can stop `timeout`)."""
        try:
            deadline = float(labels[EXPIRES_AT]) + DEADLINE_SLACK_SECONDS
        except (KeyError, TypeError, ValueError):
            return
        loop = asyncio.get_running_loop()
        old = self._deadlines.pop(cid, None)
        if old is not None:
            old.cancel()
        self._deadlines[cid] = loop.call_later(max(0.0, deadline - time.time()), self._deadline_passed, cid)

    def _deadline_passed(self, cid: str) -> None:
        self._deadlines.pop(cid, None)

        async def remove() -> None:
            try:
                await self.delete(cid)
            except Exception as exc:  # noqa: BLE001 - best effort: the reaper removes what is left
                log.warning("could not remove container %s past its lifetime: %s", cid[:12], exc)
            else:
                log.debug("removed container %s at its deadline", cid[:12])

        asyncio.ensure_future(remove())

    async def _shielded_create(self, docker, config: dict[str, Any], name: str):
        """Create the container; if the caller is cancelled meanwhile, the container
        the daemon still makes is tracked and removed rather than leaked."""
        task = asyncio.ensure_future(docker.containers.create(config, name=name))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._discard_created)
            raise

    def _discard_created(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        cid = task.result().id
        lifecycle.track(cid, partial(remove_container_sync, self.url, cid), backend=self.name)
        asyncio.ensure_future(self.delete(cid))

    async def _attach(self, container, spec: SandboxSpec, name: str, cell_host: bool = False) -> AgentSandbox:
        """Start the agent in a running container and return the sandbox handle (a cell
        host's agent runs as root with --cells)."""
        if spec.image in self._no_agent and not cell_host:
            return await self._fallback(container, spec, name)
        try:
            async with self._api("start agent"):
                argv = agent_argv(self.python, cells=cell_host)
                channel = await DockerExecChannel.open(container, cell_host_agent_argv(argv) if cell_host else argv,
                                                       user="0" if cell_host else spec.user, workdir=spec.workdir)
        except aiodocker.DockerError as exc:
            if exc.status in (404, 409):
                raise SandboxNotRunning(
                    f"container {name} stopped before the agent started ({exc.message}); its PID 1 is "
                    f"`timeout -s KILL <lifetime> /bin/sh -c {spec.start_command!r}`: the image needs `timeout` "
                    "and /bin/sh, and the start command must keep running") from exc
            raise SandboxCreateError(f"cannot start the agent in {name}: {exc.message}") from exc
        conn = AgentConnection(channel)
        try:
            await conn.start(self.hello_timeout)
        except AgentError as exc:
            if cell_host:
                if not await self._has_python(container):  # the image's own limit: no retry helps
                    self._no_agent.add(spec.image)
                    raise ConfigError(f"rollout_isolation='namespace' needs python3 >= 3.7 in the image "
                                      f"({spec.image} has none): use rollout_isolation='container'") from exc
                raise SandboxCreateError(f"the cell host agent did not start in {name}: {exc}") from exc
            if not await self._has_python(container):
                log.info("image %s has no python3 >= 3.7: one exec per command", spec.image)
                self._no_agent.add(spec.image)
                return await self._fallback(container, spec, name)
            raise SandboxCreateError(f"the agent did not start in {name}: {exc}") from exc
        return DockerSandbox(conn, backend=self, id=container.id, name=name, spec=spec)

    async def _has_python(self, container) -> bool:
        from .fallback import run_exec

        try:
            code, _, _, _ = await run_exec(container, ["/bin/sh", "-c", PYTHON_PROBE], timeout=30)
        except Exception:
            log.exception("python probe")
            return True  # cannot tell: report the agent failure itself
        return code == 0

    async def _fallback(self, container, spec: SandboxSpec, name: str) -> AgentSandbox:
        from .fallback import ExecSandbox

        if spec.user_switch:  # its commands are `docker exec`s: as root they would hold the capabilities
            raise ConfigError(f"user_switch=True needs the in-sandbox agent (python3 >= 3.7 in the image); "
                              f"{spec.image} has none")

        return ExecSandbox(container, backend=self, id=container.id, name=name, spec=spec)

    # ---------------------------------------------------------- other operations
    async def get(self, sandbox_id: str) -> AgentSandbox:
        if is_cell_id(sandbox_id):
            cell = self.cells.cell(sandbox_id)
            if cell is None or cell.connection.dead is not None:
                raise SandboxNotRunning(f"cell {sandbox_id} is not open in this process")
            handle = cell.another_handle()
            handle.snapshot_backend = self
            return handle
        docker = await self._client()
        try:
            async with self._api("inspect container"):
                container = await docker.containers.get(sandbox_id)
        except aiodocker.DockerError as exc:
            raise SandboxNotRunning(f"sandbox {sandbox_id} not found: {exc.message}") from exc
        if not container["State"].get("Running"):
            raise SandboxNotRunning(f"sandbox {sandbox_id} is {container['State'].get('Status')}")
        labels = container["Config"].get("Labels") or {}
        if labels.get(MANAGED) != "true":
            raise SandboxNotRunning(f"container {sandbox_id} is not a vf-sandbox sandbox")
        spec = spec_of_container(container._container, self.gvisor_runtime)
        return await self._attach(container, spec, container["Name"].lstrip("/"))

    async def _running(self, sandbox_id: str) -> bool:
        docker = await self._client()
        try:
            async with self._api("inspect container"):
                container = await docker.containers.get(sandbox_id)
        except aiodocker.DockerError:
            return False
        return bool(container["State"].get("Running"))

    @idempotent
    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        docker = await self._client()
        wanted = {MANAGED: "true", **(labels or {})}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        async with self._api("list containers"):
            containers = await docker.containers.list(all=True, filters=filters)
        out = self.cells.infos(wanted)  # this process's cells stand for its own cell hosts
        hosts = set(self.cells.host_ids())
        for c in containers:
            raw = c._container
            if raw["Id"] in hosts:
                continue
            out.append(SandboxInfo(
                id=raw["Id"], name=(raw.get("Names") or ["/"])[0].lstrip("/"), backend=self.name,
                status=raw.get("State", ""), image=raw.get("Image", ""), labels=raw.get("Labels") or {},
                created_at=float(raw.get("Created", 0)) or None,
            ))
        return out

    @idempotent
    async def delete(self, sandbox_id: str) -> None:
        if is_cell_id(sandbox_id):
            await self.cells.delete(sandbox_id)
            return
        docker = await self._client()
        try:
            async with self._api("remove container"):
                await docker.containers.container(sandbox_id).delete(force=True, v=True)
        except aiodocker.DockerError as exc:
            if exc.status not in (404, 409):  # 404 gone, 409 AutoRemove already removing it
                raise SandboxCreateError(f"cannot remove {sandbox_id}: {exc.message}") from exc
        lifecycle.untrack(sandbox_id)
        handle = self._deadlines.pop(sandbox_id, None)
        if handle is not None:
            handle.cancel()
        await self._snapshots.sandbox_deleted(sandbox_id)

    async def delete_many(self, labels: dict[str, str] | None = None, ids: Sequence[str] | None = None) -> int:
        """By label (every vf-sandbox container when both are None), or by ids
        (optionally also filtered by labels): only live sandboxes of ours, unknown or
        already deleted ids are skipped (ids may be full or short container ids).
        By label, the snapshots (not kept) carrying `labels` go too, after the
        containers (they are not counted)."""
        if ids is not None and not ids:
            return 0
        cells = 0
        if ids is not None:
            cells = await self.cells.delete_many([i for i in ids if is_cell_id(i)], labels)
            ids = [i for i in ids if not is_cell_id(i)]
            if not ids:
                return cells
        ours = {info.id for info in await self.list(labels)}
        if ids is None:
            targets = ours
        else:
            targets = {full for full in ours for i in set(ids) if i and full.startswith(i) and not is_cell_id(full)}
        results = await asyncio.gather(*(self.delete(t) for t in targets), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        if ids is None:
            await self._snapshots.remove_labelled(labels)
        return len(targets) + cells

    async def reap_orphans(self, *, dry_run: bool = False) -> list[str]:
        """Remove our sandboxes this engine lost in a crash (containerd still holds them, the
        Engine API lists them no more; see orphans.py); their ids."""

        async def engine_ids() -> set[str]:
            docker = await self._client()
            async with self._api("list containers"):
                return {c.id for c in await docker.containers.list(all=True)}

        return await orphans.reap(self.url, engine_ids, dry_run=dry_run)

    async def __aenter__(self) -> "DockerBackend":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

