"""Harbor environment provider on vf-sandbox: `VfHarborEnvironment`, loaded by import path.

Harbor (`pip install harbor`, Python >= 3.12: `scripts/setup.sh` makes `.venv-harbor`)
picks a custom environment with `--env module.path:ClassName`; its options come as
`--ek key=value`:

    harbor run -p examples/harbor_tasks -a oracle \\
        --env integrations.harbor_env:VfHarborEnvironment \\
        --ek rollout_isolation=cell --ek isolation=runc

The options (`VfHarborOptions`) are the framework choice every integration shares
(`SandboxChoice`: backend, backend_options, isolation runc / gvisor, rollout_isolation
container / cell, pids_limit, timeout_minutes, labels, ...); what a Harbor task
declares wins over them:

* image: the task's `environment/Dockerfile`, built by the backend's image builder
  (`SupportsImageBuild.build_image`, offline: its FROM must be a local image such as
  vf-sandbox/python:3.11 or vf-sandbox/base:bookworm; content-addressed, so a second
  run reuses it; `force_build` rebuilds), or the task's prebuilt `docker_image`, or
  the `image` option when it is given explicitly. The built image carries the
  `labels` option (and `vf-sandbox.framework=harbor`): it is part of the content key,
  so a run with labels of its own has images of its own, removable by label. A task with a
  `docker-compose.yaml` is refused (no compose: one sandbox per trial).
* resources: the task's `cpus` and `memory_mb` (after Harbor's `--override-*`) are
  hard limits (cpu_cores, memory_gb), `storage_mb` the disk size (disk_size_gb, where
  the backend can cap it: a Docker engine that cannot says so in a warning); a task
  that declares none gets the option's (SandboxSpec's) defaults. GPUs and TPUs are refused
  by Harbor from our capabilities.
* network: Harbor's policy is enforced exactly or refused before start.
  `no-network` is our default. `public` (Harbor's default when a task says nothing)
  needs the operator's consent, `--ek network=true`, and a backend that can give a
  network (cells cannot: refused by the backend); without it the trial is refused
  with a message saying so. `allowlist` (`allowed_hosts`) is refused by Harbor itself
  from our capabilities: no backend here filters egress by host.
* workdir: the task's `workdir`, else the Dockerfile's last WORKDIR, else "/".
* users: commands run as the image's user. A task whose agent or verifier (or a
  step's) runs as another user needs the operator's consent, `--ek user_switch=true`
  (SandboxSpec.user_switch; secure by default, as for the network): the container's
  agent alone keeps CAP_SETUID/SETGID/SETPCAP, every command sheds them, so
  `exec(user=...)` switches while no task code holds a capability. Docker containers
  only: cells and other backends refuse it (ConfigError). Without it another user fails
  loudly with `UserSwitchUnsupported` (Harbor itself runs its bookkeeping as "root":
  images must run as root).

exec runs `bash -c command` (as Harbor's Docker environment does) with the merged
env (task env, trial env, per-exec env), cwd and timeout; a command past its timeout
has its process group killed and raises RuntimeError("Command timed out after N
seconds"), as Harbor's Docker environment reports it. Each output stream keeps the
sandbox's output limit (1 MiB, head and tail). Files and directories move as tar
streams (modes and symlinks kept).

Lifecycle: one backend per (event loop, backend choice), shared by the loop's trials
(cells of one choice share their host); it is closed when its last environment
stops and the loop has no other for `IDLE_CLOSE_SECONDS`, or when the loop ends.
Every sandbox carries our lifecycle labels and a lifetime; our reaper (started once
per backend) and `atexit` cover a killed or interrupted Harbor.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any

try:
    from harbor.environments.base import BaseEnvironment, ExecResult
    from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
    from harbor.environments.options import EnvironmentOptions
    from harbor.models.task.config import NetworkMode
    from harbor.models.trial.config import ResourceMode
except ImportError as exc:  # pragma: no cover - only the Harbor venv has harbor
    raise ImportError(
        "integrations.harbor_env needs Harbor (`pip install harbor`, Python >= 3.12); "
        "scripts/setup.sh installs it with vf-sandbox into .venv-harbor") from exc
from pydantic import Field

from sandboxes import Sandbox, SandboxBackend, SandboxSpec, get_backend
from sandboxes.images import ImageBuildRequest, dockerfile_workdir, image_builder

from ._choice import FRAMEWORK_LABEL, SandboxChoice
from ._lifecycle import start_lifecycle

FRAMEWORK = "harbor"
TASK_LABEL = "vf-sandbox.harbor-task"  # not the trial: cells of one task share a host (labels are part of its key)
IMAGE_REPOSITORY = "vf-harbor/task"
IDLE_CLOSE_SECONDS = 30.0


class VfHarborOptions(SandboxChoice, EnvironmentOptions):
    """`--ek` options: the sandbox choice every integration shares (SandboxSpec's fields
    and defaults, backend, rollout isolation), plus Harbor's own (`auto_mounting`:
    refused, our sandboxes mount nothing from the host)."""

    network: bool = Field(False, description="Allow a network for tasks whose policy is 'public' "
                          "(Harbor's default); off: such tasks are refused. 'no-network' tasks stay offline.")


# ---------------------------------------------------------------- backends per loop
class _LoopBackend:
    """One backend shared by the environments of one event loop and choice."""

    def __init__(self, backend: SandboxBackend):
        self.backend = backend
        self.users = 0
        self.closer: asyncio.Task | None = None


_backends: dict[tuple[int, str], _LoopBackend] = {}


def _acquire(opts: VfHarborOptions) -> SandboxBackend:
    key = opts.backend_key()
    entry = _backends.get(key)
    if entry is None:
        entry = _backends[key] = _LoopBackend(get_backend(opts.backend, **opts.backend_options))
    if entry.closer is not None:
        entry.closer.cancel()
        entry.closer = None
    entry.users += 1
    return entry.backend


def _release(opts: VfHarborOptions) -> None:
    """The environment is done with its backend: close it once no other uses it for a while
    (also when the loop ends first: asyncio.run cancels the closer, which then closes)."""
    key = opts.backend_key()
    entry = _backends.get(key)
    if entry is None:
        return
    entry.users -= 1
    if entry.users <= 0 and entry.closer is None:
        entry.closer = asyncio.get_running_loop().create_task(_close_when_idle(key, entry))


async def _close_when_idle(key: tuple[int, str], entry: _LoopBackend) -> None:
    try:
        await asyncio.sleep(IDLE_CLOSE_SECONDS)
    finally:  # idle long enough, or the loop is ending (cancelled): close unless reused meanwhile
        if entry.users <= 0 and _backends.get(key) is entry:
            del _backends[key]
            await asyncio.shield(entry.backend.close())


# ---------------------------------------------------------------- the environment
class VfHarborEnvironment(BaseEnvironment):
    """One Harbor trial's environment: a vf-sandbox sandbox (a container or a cell)."""

    options_model = VfHarborOptions
    options: VfHarborOptions

    def __init__(self, *args: Any, **kwargs: Any):
        self._sandbox: Sandbox | None = None
        self._backend: SandboxBackend | None = None
        super().__init__(*args, **kwargs)
        if self.auto_mounting:  # pragma: no cover - BaseEnvironment refuses it from our capabilities
            raise ValueError("vf-sandbox mounts nothing from the host (auto_mounting)")
        self._workdir = self.task_env_config.workdir or self._dockerfile_workdir() or "/"
        # the network the task's policy asks for, refused now (before start) if not given
        mode = self.network_policy.network_mode
        if mode == NetworkMode.PUBLIC and not self.options.network:
            raise ValueError(
                f"task {self.environment_name!r} asks for a public network (network_mode='public', "
                "Harbor's default when a task sets none); vf-sandbox sandboxes are offline unless the "
                "operator allows it: pass --ek network=true (a backend that has no network refuses it), "
                "or set network_mode = \"no-network\" in the task's [environment]")
        self._network = mode == NetworkMode.PUBLIC

    @staticmethod
    def type() -> str:
        return "vf-sandbox"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    # ------------------------------------------------------------ definition
    @property
    def _dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    def _dockerfile_workdir(self) -> str | None:
        if self._image_override() or self.task_env_config.docker_image or not self._dockerfile.is_file():
            return None
        return dockerfile_workdir(self._dockerfile.read_text())

    def _image_override(self) -> str | None:
        return self.options.image if "image" in self.options.model_fields_set else None

    def _validate_definition(self) -> None:
        compose = [p for p in ("docker-compose.yaml", "docker-compose.yml") if (self.environment_dir / p).exists()]
        if compose:
            raise ValueError(f"vf-sandbox runs one sandbox per trial: {self.environment_dir / compose[0]} "
                             "(a multi-container compose environment) is not supported")
        if not (self._image_override() or self.task_env_config.docker_image or self._dockerfile.is_file()):
            raise FileNotFoundError(f"{self._dockerfile} not found, and the task names no docker_image")

    async def _image(self, backend: SandboxBackend, force_build: bool) -> str:
        """The image to run: the option's, the task's prebuilt one, or its Dockerfile built offline."""
        if (image := self._image_override() or self.task_env_config.docker_image):
            return image
        request = ImageBuildRequest(
            repository=IMAGE_REPOSITORY, dockerfile=self._dockerfile.read_text(), context=self.environment_dir,
            labels={**self.options.labels, FRAMEWORK_LABEL: FRAMEWORK},  # the option's labels mark the image too
            timeout=float(self.task_env_config.build_timeout_sec))
        built = await image_builder(backend).build_image(
            request, force=force_build, on_log=lambda line: self.logger.debug(line.rstrip()))
        self.logger.debug(f"image {built.name} ({'cached' if built.cached else f'built in {built.seconds:.1f} s'})")
        return built.name

    def _spec(self, image: str) -> SandboxSpec:
        overrides: dict[str, Any] = {"image": image, "workdir": self._workdir, "network": self._network,
                                     "user_switch": self.options.user_switch}
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory_mb = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if cpus is not None:
            overrides["cpu_cores"] = float(cpus)
        if memory_mb is not None:
            overrides["memory_gb"] = memory_mb / 1024
        if self._effective_storage_mb is not None:
            overrides["disk_size_gb"] = self._effective_storage_mb / 1024
        task = re.sub(r"[^A-Za-z0-9_.-]", "-", self.environment_name)[:63] or "task"
        choice = SandboxChoice.model_validate(self.options.model_dump(include=set(SandboxChoice.model_fields)))
        return choice.model_copy(update=overrides).spec(labels={FRAMEWORK_LABEL: FRAMEWORK, TASK_LABEL: task})

    # ------------------------------------------------------------ lifecycle
    async def start(self, force_build: bool) -> None:
        start_lifecycle(self.options.backend)
        self._backend = _acquire(self.options)
        try:
            image = await self._image(self._backend, force_build)
            self._sandbox = await self._backend.create(self._spec(image))
            self.logger.debug(f"vf sandbox {self._sandbox.name} [{self._sandbox.id}] ({self.options.backend}, "
                              f"{self.options.rollout_isolation}, {self.options.isolation})")
            await self.ensure_dirs(self._mount_targets(writable_only=True))  # /logs/agent, /logs/verifier, ...
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

    async def stop(self, delete: bool) -> None:
        """Delete the sandbox, also with `delete=False` (Harbor's --no-delete): a kept sandbox
        would not outlive this process anyway (atexit and the reaper remove it), so it is
        removed now, with a warning."""
        sandbox, self._sandbox = self._sandbox, None
        try:
            if sandbox is not None:
                if not delete:
                    self.logger.warning(f"vf sandbox {sandbox.name}: removed anyway (kept sandboxes would "
                                        "outlive their owner; the reaper removes them)")
                await asyncio.shield(sandbox.delete())
        finally:
            if self._backend is not None:
                self._backend = None
                _release(self.options)

    # ------------------------------------------------------------ operations
    def _live(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError(f"the vf sandbox of {self.session_id} is not started (or was stopped)")
        return self._sandbox

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        user = self._resolve_user(user)
        r = await self._live().exec(
            ["bash", "-c", command], cwd=cwd or self._workdir, env=self._merge_env(env),
            timeout=math.inf if not timeout_sec else float(timeout_sec),
            user=None if user is None else str(user))
        if r.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 9)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        if not Path(source_path).is_file():
            raise FileNotFoundError(f"upload_file: {source_path} is not a file")
        await self._live().upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """The directory's contents into `target_dir` (created; files already there stay)."""
        if not Path(source_dir).is_dir():
            raise NotADirectoryError(f"upload_dir: {source_dir} is not a directory")
        await self._live().upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await self._live().download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """The directory's contents into `target_dir` (created; files there are overwritten)."""
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        await self._live().download(source_dir, target_dir)
