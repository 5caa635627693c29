"""Build an OpenEnv project's image locally and offline, and write its manifest.
The manifest's contract (gym or mcp) is what the built server really serves: its
server is started once and asked for `/schema` (`probe.py`).

Two images, both content-addressed so an unchanged project rebuilds in
well under a second:

* deps image `vf-sandbox/openenv-deps:<hash of the requirements + base>`: the
  base image plus `/app/.venv` with the project's dependencies installed from
  a host wheelhouse (`pip download` on the host; the build runs with
  networking off and installs with `--no-index`). Shared by every project
  with the same requirements.
* project image `vf-openenv/<env_id>:<hash of the project's files>`: the deps
  image plus the project copied to `/app/env`.

Both are built through the backend's image-build capability
(`sandboxes.images.image_builder`, `SupportsImageBuild`; the Docker backend by
default): no engine CLI, no backend module imported here.

Requirements come from `uv.lock` (via `uv export`) when present and uv is
installed, else `[project].dependencies` of pyproject.toml, else
`server/requirements.txt`. The project's own Dockerfile is not used (it
needs a registry and the network).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from sandboxes.errors import BackendUnavailable, ConfigError, ImageNotFound, InfraError
from sandboxes.images import ImageBuildRequest, image_builder, run_sync
from sandboxes import settings
from sandboxes.wheels import WheelDownloadError, copy_wheels, fetch_wheels

from .contract import app_source_path
from .probe import probe_contract
from .manifest import (
    BuildManifest,
    default_start_command,
    read_manifest,
    read_project_config,
    write_manifest,
)

DEFAULT_BASE_IMAGE = "vf-sandbox/base:bookworm"
DEPS_REPO = "vf-sandbox/openenv-deps"
PROJECT_REPO_PREFIX = "vf-openenv"
FALLBACK_REQUIREMENT = "openenv-core[core]"
_SKIP_PARTS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", "outputs", ".ruff_cache"}
_SKIP_NAMES = {".build.json", ".DS_Store"}


DEFAULT_BUILD_BACKEND = "docker"


class BuildError(InfraError):
    """pip or uv failed while preparing a build (message carries the output tail)."""


class BuildResult(BaseModel):
    manifest: BuildManifest
    built: bool  # False: the image for this content already existed
    deps_built: bool
    seconds: float


def base_image() -> str:
    """The running settings' $VF_OPENENV_BASE_IMAGE (`sandboxes.settings.current()`) or vf-sandbox/base:bookworm."""
    return settings.current().openenv_base_image or DEFAULT_BASE_IMAGE


def wheelhouse_dir() -> Path:
    """The one wheelhouse of the running settings (`sandboxes.settings.current()`): $VF_SANDBOX_WHEELHOUSE,
    else $VF_SANDBOX_CACHE/wheelhouse, else ~/.cache/vf-sandbox/wheelhouse."""
    return settings.current().wheelhouse_root()


def _project_files(project: Path) -> list[Path]:
    files = []
    for path in sorted(project.rglob("*")):
        rel = path.relative_to(project)
        if any(part in _SKIP_PARTS for part in rel.parts) or path.name in _SKIP_NAMES:
            continue
        if path.suffix in (".pyc", ".pyo") or not path.is_file():
            continue
        files.append(path)
    return files


def content_hash(project: str | Path) -> str:
    """sha256 over the project's file names and bytes (caches, venvs and the manifest excluded)."""
    root = Path(project)
    h = hashlib.sha256()
    for path in _project_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _run(cmd: list[str], *, what: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 1800) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise BuildError(f"{what}: {cmd[0]} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{what}: timed out after {timeout}s") from exc
    if proc.returncode != 0:
        tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-3000:]).strip()
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def project_requirements(project: str | Path) -> list[str]:
    """The project's dependency list (pinned when a uv.lock exists and uv is installed)."""
    root = Path(project)
    if (root / "uv.lock").exists() and shutil.which("uv"):
        out = _run(
            ["uv", "export", "--frozen", "--no-hashes", "--no-emit-project", "--no-dev", "--no-header"],
            what="uv export", cwd=root,
        )
        reqs = [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if reqs:
            return reqs
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        try:
            deps = tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", [])
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{pyproject}: {exc}") from exc
        if deps:
            return list(deps)
    req = root / "server" / "requirements.txt"
    if req.exists():
        reqs = [ln.strip() for ln in req.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        if reqs:
            return reqs
    return [FALLBACK_REQUIREMENT]


def _builder(backend: object | str | None):
    """The image-build capability of `backend` (a name or an instance; default docker)."""
    return image_builder(backend or DEFAULT_BUILD_BACKEND)


def _image_id(image: str, backend: object | str | None = None) -> str | None:
    """The image's id on the build backend, or None when absent."""
    builder = _builder(backend)
    return run_sync(lambda: builder.image_id(image))


def image_exists(image: str, backend: object | str | None = None) -> bool:
    return _image_id(image, backend) is not None


def builder_available(backend: object | str | None = None) -> bool:
    """True when the build backend answers."""
    try:
        _image_id(base_image(), backend)
    except BackendUnavailable:
        return False
    return True


def _build(request: ImageBuildRequest, backend: object | str | None, log: Callable[[str], None]) -> str:
    builder = _builder(backend)
    built = run_sync(lambda: builder.build_image(request, force=True))
    log(f"built {built.name} in {built.seconds:.1f}s")
    return built.name


def collect_wheels(requirements: list[str], dest: Path, *, wheelhouse: Path | None = None,
                   log: Callable[[str], None] = lambda s: None) -> None:
    """Copy exactly the wheels `requirements` need into `dest/wheels` (and the requirements
    into `dest/requirements.txt`), from the one wheelhouse (`sandboxes.wheels`), which
    downloads them once: the only step that uses the network. `wheelhouse` overrides its root."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("\n".join(requirements) + "\n")
    try:
        house = fetch_wheels(requirements, root=wheelhouse or wheelhouse_dir(), log=log)
    except WheelDownloadError as exc:
        raise BuildError(str(exc)) from exc
    copy_wheels(house, dest / "wheels")


def ensure_deps_image(requirements: list[str], *, wheelhouse: Path | None = None,
                      log: Callable[[str], None] = lambda s: None,
                      backend: object | str | None = None) -> tuple[str, bool]:
    """(image, built): the deps image for these requirements on the base image."""
    base = base_image()
    base_id = _image_id(base, backend)
    if base_id is None:
        raise ImageNotFound(f"base image {base} not found locally: build it with images/base/build.sh")
    key = hashlib.sha256(("\n".join(requirements) + "\n" + base_id).encode()).hexdigest()[:16]
    tag = f"{DEPS_REPO}:{key}"
    if image_exists(tag, backend):
        return tag, False
    log(f"building dependency image {tag} ...")
    with tempfile.TemporaryDirectory(prefix="vf-openenv-deps-") as tmp:
        ctx = Path(tmp)
        collect_wheels(requirements, ctx, wheelhouse=wheelhouse, log=log)
        dockerfile = (
            f"FROM {base}\n"
            "COPY requirements.txt /tmp/vf-deps/requirements.txt\n"
            "COPY wheels /tmp/vf-deps/wheels\n"
            "RUN python3 -m venv /app/.venv \\\n"
            " && /app/.venv/bin/pip install -q --no-index --no-cache-dir --find-links /tmp/vf-deps/wheels"
            " -r /tmp/vf-deps/requirements.txt \\\n"
            " && rm -rf /tmp/vf-deps\n"
            "ENV PATH=/app/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        )
        # the key covers the requirements and the base: the wheels are a function of them
        _build(ImageBuildRequest(repository=DEPS_REPO, tag=key, dockerfile=dockerfile, context=ctx,
                                 context_digest=key), backend, log)
    return tag, True


def _docker_name(name: str) -> str:
    slug = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-._")
    return slug or "env"


def _current_manifest(root: Path, digest: str, image: str, *, force: bool,
                      backend: object | str | None) -> BuildManifest | None:
    """The manifest already written for exactly this content and image, or None when a build is due.

    Up to date means: not forced, same content hash and image, contract read from /schema, and the image
    present on the build backend. Without an engine to build on (a remote backend) the manifest is
    trusted as is."""
    try:
        old = read_manifest(root)
    except ConfigError:
        return None
    if (not force and old.content_hash == digest and old.image == image and old.contract_source == "schema"
            and (not builder_available(backend) or image_exists(image, backend))):
        return old
    return None


def _build_project_image(root: Path, image: str, *, deps_image: str, env_id: str, digest: str, start: str,
                         backend: object | str | None, log: Callable[[str], None]) -> None:
    """Build `image`: the deps image plus the project's files copied to /app/env, started with `start`."""
    log(f"building {image} ...")
    with tempfile.TemporaryDirectory(prefix="vf-openenv-build-") as tmp:
        ctx = Path(tmp)
        for path in _project_files(root):
            dst = ctx / "env" / path.relative_to(root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst)
        dockerfile = (
            f"FROM {deps_image}\n"
            "COPY env /app/env\n"
            "ENV PYTHONPATH=/app/env ENABLE_WEB_INTERFACE=false PYTHONUNBUFFERED=1\n"
            "WORKDIR /app/env\n"
            f'LABEL vf-sandbox.openenv.id="{env_id}" vf-sandbox.openenv.content="{digest}"\n'
            f'CMD ["sh", "-c", "{start}"]\n'
        )
        _build(ImageBuildRequest(repository=image.rpartition(":")[0], tag=digest[:16], dockerfile=dockerfile,
                                 context=ctx, context_digest=digest), backend, log)


def build_project(project: str | Path, *, force: bool = False, wheelhouse: Path | None = None,
                  log: Callable[[str], None] = lambda s: None,
                  backend: object | str | None = None) -> BuildResult:
    """Build PROJECT's image (when its content changed) and write PROJECT/.build.json.

    `backend` (a name or instance implementing SupportsImageBuild; default
    docker) builds the images; UsageError when it cannot build."""
    t0 = time.monotonic()
    root = Path(project).resolve()
    cfg = read_project_config(root)
    app_source_path(root, cfg.app)  # a missing app module fails here, before any build
    digest = content_hash(root)
    env_id = cfg.name
    image = f"{PROJECT_REPO_PREFIX}/{_docker_name(env_id)}:{digest[:16]}"
    start = default_start_command(cfg.app, cfg.port)

    current = _current_manifest(root, digest, image, force=force, backend=backend)
    if current is not None:
        return BuildResult(manifest=current, built=False, deps_built=False, seconds=time.monotonic() - t0)

    deps_image, deps_built = ensure_deps_image(project_requirements(root), wheelhouse=wheelhouse, log=log,
                                               backend=backend)
    built = force or not image_exists(image, backend)
    if built:
        _build_project_image(root, image, deps_image=deps_image, env_id=env_id, digest=digest, start=start,
                             backend=backend, log=log)
    log(f"starting {image}'s server once to read its contract from /schema ...")
    contract = probe_contract(image, start, cfg.port, environment_id=env_id, backend=backend)
    manifest = BuildManifest(
        environment_id=env_id, image=image, port=cfg.port, app=cfg.app, contract=contract, contract_source="schema",
        start_command=start, image_status="built", content_hash=digest, deps_image=deps_image,
    )
    write_manifest(root, manifest)
    return BuildResult(manifest=manifest, built=built, deps_built=deps_built, seconds=time.monotonic() - t0)


def ensure_built(project: str | Path, *, log: Callable[[str], None] = lambda s: None,
                 backend: object | str | None = None) -> BuildManifest:
    """The project's manifest, building first when it is missing or stale."""
    return build_project(project, log=log, backend=backend).manifest
