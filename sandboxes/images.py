"""Image builds as a backend capability: the request, its content key, the
host's architecture, and how a caller asks a backend for the capability.

Every offline image builder (the sandbox recipes under images/, SWE
environment/instance layers, OpenEnv project images) describes what it wants
as an `ImageBuildRequest` and hands it to a backend implementing
`SupportsImageBuild` (sandboxes/interface.py), found by name with
`image_builder("docker")`. Nothing above `sandboxes` talks to an engine or
its CLI.

Content addressing: `ImageBuildRequest.key(parent_ids)` hashes the Dockerfile
text, the build context (or a digest the caller vouches for), build args,
labels, the target platform and the ids of the images named by `FROM`. With
no explicit `tag` the image is `repository:<key[:16]>`, so the same inputs
give the same tag and an existing tag is a cache hit (no rebuild); a changed
input gives a new tag. An explicit `tag` (a fixed name such as
`vf-sandbox/python:3.11`) is a cache hit only while the image's
`vf-sandbox.build-key` label equals the key.

Architecture comes from the host, once (`host_arch()`): builds target it and
the SWE-bench-style names and wheel platform tags are derived from it.

Registries: `pull_image` / `push_image` take an optional `RegistryAuth`
(username + password as a SecretStr, never serialised in clear); without
one the engine's own credential sources apply (the Docker config file).
`RegistryAuth.from_settings()` takes them from the settings (`VF_REGISTRY_USERNAME` /
`VF_REGISTRY_PASSWORD`, `sandboxes.settings.current()` when none are given).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import os
import platform as _platform
import re
import threading
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from pydantic import BaseModel, Field, SecretStr, computed_field

from .errors import UsageError
from .settings import ProcessSettings
from .settings import current as current_settings

KEY_LABEL = "vf-sandbox.build-key"
KEY_VERSION = "1"  # bump to invalidate every content key
LOG_TAIL_LINES = 40

_T = TypeVar("_T")


# ---------------------------------------------------------------- registries


class PullProgress(TypedDict):
    """How far a pull of `image` is: bytes of its layers downloaded so far out of the
    bytes the registry announced (both grow as layers are announced); `finished` once,
    at the end, with `failed` when the pull did not bring the image."""

    image: str
    done: int
    total: int
    finished: bool
    failed: bool


class RegistryAuth(BaseModel):
    """Credentials for a registry. The password is a SecretStr: it prints and dumps as
    `**********`, so it never reaches results, logs or the run registry."""

    username: str
    password: SecretStr

    @classmethod
    def from_settings(cls, settings: ProcessSettings | None = None) -> RegistryAuth | None:
        """From the settings' registry_username / registry_password (default: the running
        ones, `sandboxes.settings.current()`); None when either is unset."""
        settings = settings or current_settings()
        user, password = settings.registry_username, settings.registry_password
        return cls(username=user, password=password) if user and password else None

    def engine_config(self) -> dict[str, str]:
        """The Engine API's auth config (sent to the engine only)."""
        return {"username": self.username, "password": self.password.get_secret_value()}


# ---------------------------------------------------------------- host arch
class HostArch(BaseModel):
    """The host's CPU architecture under the names each consumer uses."""

    machine: str = Field(description="Kernel name, normalised: x86_64 or aarch64 (pip wheel platform tags).")
    docker: str = Field(description="OCI/Docker name: amd64 or arm64.")
    swebench: str = Field(description="SWE-bench image-name component: x86_64 or arm64.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def platform(self) -> str:
        """The build/run platform, e.g. linux/amd64."""
        return f"linux/{self.docker}"


_ARCH_ALIASES = {
    "x86_64": ("x86_64", "amd64", "x86_64"),
    "amd64": ("x86_64", "amd64", "x86_64"),
    "x64": ("x86_64", "amd64", "x86_64"),
    "aarch64": ("aarch64", "arm64", "arm64"),
    "arm64": ("aarch64", "arm64", "arm64"),
}


def normalise_arch(machine: str) -> HostArch:
    """`platform.machine()`-style name → HostArch. Unknown names pass through unchanged."""
    m = machine.strip().lower()
    machine_name, docker_name, swe_name = _ARCH_ALIASES.get(m, (m, m, m))
    return HostArch(machine=machine_name, docker=docker_name, swebench=swe_name)


@functools.lru_cache(maxsize=1)
def host_arch() -> HostArch:
    """This host's architecture (the one place it is read)."""
    return normalise_arch(_platform.machine() or "x86_64")


# ---------------------------------------------------------------- request / result
class ImageBuildFailed(UsageError):
    """A build ran and failed (a RUN step exited non-zero, a bad Dockerfile): the
    message names the image and carries the build log's last lines. Not retried:
    the same inputs fail the same way."""

    def __init__(self, image: str, reason: str, tail: str = ""):
        self.image, self.reason, self.tail = image, reason, tail
        msg = f"building image {image} failed: {reason.strip()}"
        super().__init__(msg + (f"\n--- last lines of the build log ---\n{tail}" if tail else ""))


class ImageBuildRequest(BaseModel):
    """One image to build from a Dockerfile and a context, offline by default."""

    repository: str = Field(description="Image repository, e.g. vf-swe/env.")
    tag: str | None = Field(None, description="Fixed tag; default: the content key (content-addressed).")
    dockerfile: str = Field(description="Dockerfile text (replaces any Dockerfile in the context).")
    context: Path | None = Field(None, description="Directory sent as the build context.")
    files: dict[str, bytes] = Field(default_factory=dict, description="Extra context files (path -> bytes).")
    context_digest: str | None = Field(
        None, description="A digest of the context the caller computed from its inputs; when set the "
        "context is not hashed (the caller vouches it covers every byte that matters), so the key "
        "is known before the context exists.")
    build_args: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    platform: str = Field(default_factory=lambda: host_arch().platform)
    network: bool = Field(False, description="Networking during RUN steps (off: builds are offline).")
    no_cache: bool = Field(False, description="Do not reuse the engine's layer cache (a cold build).")
    timeout: float = Field(1800, gt=0, description="Seconds the whole build may take.")

    def parents(self) -> list[str]:
        """Images named by the Dockerfile's FROM lines, ARGs substituted (build args, then ARG defaults)."""
        defaults: dict[str, str] = {}
        for m in re.finditer(r"(?im)^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", self.dockerfile):
            if m.group(2) is not None:
                defaults[m.group(1)] = m.group(2).strip("\"'")
        values = {**defaults, **self.build_args}
        stages: set[str] = set()
        out = []
        for m in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", self.dockerfile):
            ref = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda v: values.get(v.group(1), ""), m.group(1))
            if ref.lower() not in stages and ref != "scratch":
                out.append(ref)
            if m.group(2):
                stages.add(m.group(2).lower())
        return out

    def context_hash(self) -> str:
        """`context_digest`, else a hash of the context tree (paths, exec bits, link targets, bytes) and `files`."""
        if self.context_digest is not None:
            return self.context_digest
        return hash_tree(self.context, self.files)

    def key(self, parent_ids: Sequence[str]) -> str:
        """The content key of this request given the ids of its parent images (hex sha256)."""
        h = hashlib.sha256()
        for part in (
            KEY_VERSION, self.dockerfile, self.context_hash(), self.platform,
            *(f"arg {k}={v}" for k, v in sorted(self.build_args.items())),
            *(f"label {k}={v}" for k, v in sorted(self.labels.items())),
            *(f"parent {p}" for p in parent_ids),
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def name(self, key: str) -> str:
        """The image name for `key`: repository:tag, the tag defaulting to the key's first 16 hex digits."""
        return f"{self.repository}:{self.tag or key[:16]}"


class BuiltImage(BaseModel):
    """The image a request resolved to and whether it had to be built."""

    name: str
    image_id: str
    key: str
    cached: bool
    seconds: float = 0.0


class RecipeStatus(BaseModel):
    """One named recipe (images/recipes.toml) and the state of its image."""

    name: str
    status: str = Field(description="'ok' (built, up to date), 'stale' (inputs changed) or 'missing'.")
    source: str = Field("", description="The recipe's build context or script.")
    aliases: list[str] = Field(default_factory=list)
    description: str = ""


def hash_tree(root: Path | None, files: Mapping[str, bytes] | None = None, *, exclude: Collection[str] = (),
              into: Any = None) -> str:
    """The content hash of a directory tree or of one file: the one tree hasher of vf-sandbox
    (build contexts, image recipes, SWE sources).

    In sorted path order, a regular file adds its relative path, exec bit and bytes, a symlink
    its path and target (never followed); directories count through what they hold. Paths with
    a part in `exclude` (e.g. ".git") are skipped; a `root` that is a file adds its bytes alone.
    `files` adds (path, bytes) entries after the tree. `into` continues a hashlib object the
    caller started (the object stays usable); the hex digest is returned."""
    h = into if into is not None else hashlib.sha256()
    if root is not None:
        root = Path(root)
        if root.is_file():
            _update_with_file(h, root)
        else:
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if exclude and any(part in exclude for part in rel.parts):
                    continue
                if path.is_symlink():
                    h.update(f"L {rel.as_posix()}\0{os.readlink(path)}\0".encode())
                elif path.is_file():
                    h.update(f"{rel.as_posix()}\0{os.access(path, os.X_OK)}\0".encode())
                    _update_with_file(h, path)
    for rel, data in sorted((files or {}).items()):
        h.update(f"B {rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _update_with_file(h: Any, path: Path) -> None:
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def dockerfile_workdir(dockerfile: str) -> str | None:
    """The working directory a Dockerfile's image starts in: its final stage's last absolute
    WORKDIR, or None when that stage sets none (then the parent image's applies)."""
    final = re.split(r"(?im)^\s*FROM\s", dockerfile)[-1]
    found = re.findall(r"(?im)^\s*WORKDIR\s+(\S+)\s*$", final)
    return found[-1] if found and found[-1].startswith("/") else None


def log_tail(lines: Sequence[str], n: int = LOG_TAIL_LINES) -> str:
    """The last `n` non-empty lines of a build log."""
    text = "".join(lines)
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-n:])


# ---------------------------------------------------------------- finding the capability
def image_builder(backend: object | str | None = "docker", **options: object):
    """The backend named `backend` (or the instance given) as a `SupportsImageBuild`.

    UsageError naming the capability when that backend cannot build images.
    """
    from .interface import SupportsImageBuild
    from .registry import get_backend

    be = backend if backend is not None and not isinstance(backend, str) else get_backend(backend, **options)
    if not isinstance(be, SupportsImageBuild):
        raise UsageError(
            f"the {getattr(be, 'name', type(be).__name__)!r} backend cannot build images (it does not implement "
            "SupportsImageBuild); build on a backend that does (docker) and push to a registry it can pull from"
        )
    return be


def run_sync(factory: Callable[[], Awaitable[_T]]) -> _T:
    """Run the coroutine `factory()` makes to completion from sync code, also when the
    calling thread already runs an event loop (then in a helper thread with its own loop,
    in the caller's context: its settings scope, `sandboxes.settings.use`, goes along)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())  # type: ignore[arg-type]
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=contextvars.copy_context().run, args=(target,), name="vf-image-build", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
