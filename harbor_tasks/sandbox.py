"""A Harbor task's image and sandbox: what `[environment]`, the users and the network
policy of task.toml become in a `SandboxSpec`, and the image built from
environment/Dockerfile through the backend's image-build capability
(`SupportsImageBuild.build_image`: offline, content-addressed, so an unchanged task
is a cache hit).

The image gets one layer on top of the task's: /logs/agent, /logs/verifier,
/logs/artifacts (mode 1777: anyone writes, only an owner removes) under a /logs
nobody but root may rename in, and /tests and /solution (0777) made (Harbor
bind-mounts /logs and copies /tests as root; a non-root task user must still
reach them), the Dockerfile's last USER restored after it.

Network policy (per phase, Harbor's resolution): "no-network" is our default (off);
"public" turns the sandbox's network on where the backend offers it; "allowlist"
is refused (`TaskUnsupported`) because no backend here can enforce a host
allowlist, and so is an agent policy different from the verifier's (one sandbox
serves both phases and cannot change its network in between).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from sandboxes import SandboxSpec
from sandboxes.errors import ImageNotFound, UsageError
from sandboxes.images import BuiltImage, ImageBuildRequest, image_builder

from .config import NetworkMode
from .phases import AGENT_LOGS, DEFAULT_AGENT_TIMEOUT, LOGS, SOLUTION, TESTS, VERIFIER_LOGS, resolve_env
from .task import HarborTask, TaskUnsupported

log = logging.getLogger(__name__)

REPOSITORY = "vf-harbor-tasks"
LABEL = "vf-sandbox.harbor-task"


def logs_layer(dockerfile: str) -> str:
    """The Dockerfile with the /logs, /tests, /solution layer appended (module docstring)."""
    users = re.findall(r"(?im)^\s*USER\s+(\S+)\s*$", dockerfile)
    dirs = f"{AGENT_LOGS} {VERIFIER_LOGS} {LOGS}/artifacts {TESTS} {SOLUTION}"
    logs = f"{AGENT_LOGS} {VERIFIER_LOGS} {LOGS}/artifacts"
    lines = [dockerfile.rstrip("\n"), "", "# vf-sandbox: Harbor's runtime directories",
             "USER root", f"RUN mkdir -p {dirs} && chmod 0755 {LOGS} && chmod 1777 {logs} && chmod 0777 {TESTS} {SOLUTION}"]
    if users:
        lines.append(f"USER {users[-1]}")
    return "\n".join(lines) + "\n"


def build_request(task: HarborTask) -> ImageBuildRequest:
    """The image build of `task`: its Dockerfile and environment/ as the context, or
    `FROM [environment].docker_image` when it names a prebuilt image."""
    env = task.config.environment
    if env.docker_image:
        dockerfile, context = f"FROM {env.docker_image}\n", None
    else:
        dockerfile, context = task.dockerfile.read_text(), task.environment_dir
    return ImageBuildRequest(repository=f"{REPOSITORY}/{_slug(task.name)}", dockerfile=logs_layer(dockerfile),
                             context=context, labels={LABEL: task.name}, network=False,
                             timeout=env.build_timeout_sec)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "task"


async def build_image(task: HarborTask, backend: Any) -> BuiltImage:
    """The task's image on `backend` (built unless cached). A parent that is one of our
    image recipes (vf-sandbox/python:3.11, ...) is built first when missing. Raises
    UsageError (ImageBuildFailed, ImageNotFound): the task's environment is broken;
    InfraError: the engine does not answer."""
    be = image_builder(backend)
    request = build_request(task)
    try:
        return await be.build_image(request)
    except ImageNotFound:
        recipes = getattr(be, "build_recipe", None)
        if recipes is None:
            raise
        for parent in request.parents():
            if await be.image_id(parent) is None:
                try:
                    await recipes(parent)
                except UsageError as exc:  # not a recipe of ours: the original error says it
                    log.info("parent %s of %s is not a recipe: %s", parent, task.name, exc)
        return await be.build_image(request)


def network_on(task: HarborTask, backend_name: str) -> bool:
    """Whether the task's sandbox has networking; TaskUnsupported for a policy this
    stack cannot honour (an allowlist, or different policies for the two phases)."""
    agent, verifier = task.config.policy("agent"), task.config.policy("verifier")
    for phase, policy in (("agent", agent), ("verifier", verifier)):
        if policy.network_mode == NetworkMode.ALLOWLIST:
            raise TaskUnsupported(
                f"task {task.name}: the {phase} network policy is an allowlist ({', '.join(policy.allowed_hosts)}); "
                f"the {backend_name!r} backend can only turn a sandbox's network on or off, not limit it to hosts, "
                "so the task is refused rather than run with more or less network than it asks for")
    if agent.network_mode != verifier.network_mode:
        raise TaskUnsupported(
            f"task {task.name}: agent network {agent.network_mode.value!r} differs from verifier network "
            f"{verifier.network_mode.value!r}; one sandbox serves both phases and cannot change its network")
    return agent.network_mode == NetworkMode.PUBLIC


def sandbox_spec(task: HarborTask, image: str, backend_name: str, *, labels: dict[str, str] | None = None,
                 name: str = "harbor-task", **overrides: Any) -> SandboxSpec:
    """The sandbox of `task` in `image`: `[environment]` cpus / memory_mb / storage_mb /
    env / workdir, the agent's user (the verifier's, if different, is switched to per
    command), network per `network_on`, and a lifetime covering both phases."""
    c = task.config
    env = c.environment
    lifetime_s = (c.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT) + c.verifier.timeout_sec + 600
    fields: dict[str, Any] = dict(
        image=image, name=name, network=network_on(task, backend_name),
        environment_vars=resolve_env(env.env), labels={LABEL: _slug(task.name), **(labels or {})},
        timeout_minutes=max(10.0, lifetime_s / 60), rollout_isolation="container",
    )
    if env.cpus:
        fields["cpu_cores"] = float(env.cpus)
    if env.memory_mb:
        fields["memory_gb"] = env.memory_mb / 1024
    if env.storage_mb:
        fields["disk_size_gb"] = env.storage_mb / 1024
    if task.workdir():
        fields["workdir"] = task.workdir()
    if c.agent.user is not None:
        fields["user"] = str(c.agent.user)
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return SandboxSpec(**fields)
