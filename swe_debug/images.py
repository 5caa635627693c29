"""Layered, content-addressed images for SWE instances, built offline.

    vf-sandbox/base:bookworm                    (images/base/build.sh, debootstrap)
      └─ vf-swe/env.<arch>:<key>                venv from a host-side wheelhouse  (images/swe/env.Dockerfile)
           └─ vf-swe/inst.<arch>.<id>:<key>     repo at base_commit in /testbed   (images/swe/instance.Dockerfile)

`<arch>` is the host's architecture in SWE-bench's naming (x86_64, arm64;
`sandboxes.images.host_arch`), which is also what the layers are built for
and what the wheels are downloaded for. Each key is a hash of everything that
goes into the layer (the parent image id, the recipe text, the requirements
or the source tree bytes, the install commands, the platform), so a changed
input yields a new tag and an unchanged one is a cache hit (one image lookup,
~50 ms). Wheels are fetched on the host with `pip download` for the image's
Python and platform; every build runs with networking off. An instance that
names a prebuilt `image_name` that exists locally uses it as is.

Images are built through a backend's image-build capability
(`sandboxes.images.image_builder`: the run's backend when it has one, else the
Docker backend): this module imports no backend and runs no engine CLI. When
the run's backend pulls images itself (kubernetes, prime), a row's named image
is handed to it unchecked and no engine is asked anything (only a row built
here and pushed with `push_to` needs one).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import BaseModel

from sandboxes.errors import ConfigError, ImageNotFound, InfraError, UsageError
from sandboxes.images import BuiltImage, ImageBuildRequest, PullProgress, RegistryAuth, hash_tree, host_arch, image_builder
from sandboxes import wheels
from sandboxes.settings import ProcessSettings
from sandboxes.settings import current as current_settings

from .instances import EnvironmentSpec, SWEInstance

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "images" / "swe"
DEFAULT_BASE_IMAGE = "vf-sandbox/base:bookworm"
DEFAULT_BASE_PYTHON = "3.11"  # Debian bookworm's python3: the only interpreter of the default base image
RECIPE_VERSION = "1"


class ImageRef(BaseModel):
    """An image ready for an instance, and how it got there."""

    tag: str
    layer: str  # "instance" | "prebuilt"
    built: list[str] = []  # layers built by this call (empty = all cached)
    env_tag: str | None = None  # the environment layer under it
    seconds: float = 0.0
    pushed: str | None = None  # where --push-to put it (`registry/repository:tag`)
    local: str | None = None  # the local name when `tag` is another (a remote backend runs the pushed name)


class ImagePullFailed(InfraError):
    """An instance's image could not be pulled (no such image or tag, bad credentials,
    registry down): an infrastructure error of the row (retried, resumable), never a
    verdict on the instance."""


IMAGE_SCHEMES = {"swe-bench": "_1776_", "swe-gym": "_s_"}
"""How each published image set spells an instance id's `__` in image names (SWE-bench on
Docker Hub: `_1776_`; SWE-Gym's `xingyaoww/sweb.eval.x86_64.*`: `_s_`)."""


def swebench_image_name(namespace: str, instance_id: str, tag: str = "latest", scheme: str = "swe-bench") -> str:
    """The SWE-bench harness's published name of an instance image:
    `{namespace}/sweb.eval.{arch}.{instance id}` lower-cased, with `__` spelled `_1776_`
    (as on Docker Hub; `_s_` in SWE-Gym's scheme); `namespace` may start with a registry
    (`host:port/ns`)."""
    key = f"sweb.eval.{host_arch().swebench}.{instance_id.lower()}".replace("__", IMAGE_SCHEMES[scheme])
    return f"{namespace.rstrip('/')}/{key}:{tag}"


DEFAULT_NAMESPACE = "swebench"
"""The SWE-bench harness's namespace (Docker Hub's `swebench/sweb.eval.*`): what `--registry`
alone puts its images under."""


def has_registry_host(name: str) -> bool:
    """Whether an image name or namespace starts with a registry host (Docker's rule: a first
    component with a `.` or `:`, or `localhost`)."""
    first, sep, _ = name.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def image_namespace(registry: str | None, namespace: str | None) -> str | None:
    """Where SWE-bench-named images live: `{registry}/{namespace}` (namespace default
    `swebench` when only a registry is given), the namespace alone (Docker Hub, or one
    that already names its host), or None. UsageError when both name a registry host."""
    if not registry:
        return namespace or None
    registry = registry.strip().rstrip("/")
    if "/" in registry or not registry:
        raise UsageError(f"--registry is a registry host[:port] (e.g. registry.example:5000), got {registry!r}; "
                         "put the path under it in --namespace")
    ns = (namespace or DEFAULT_NAMESPACE).strip("/")
    if has_registry_host(ns + "/"):
        raise UsageError(f"--namespace {namespace!r} already names a registry host; give either --registry "
                         f"{registry} with a plain namespace, or the namespace with its host alone")
    return f"{registry}/{ns}"


class ImageBuildError(ConfigError):
    """Preparing a layer failed on the host (pip download); a failed build itself is
    `sandboxes.images.ImageBuildFailed` (the message carries the build log tail)."""


def env_repository() -> str:
    """`vf-swe/env.<arch>`: the environment layers' repository on this host."""
    return f"vf-swe/env.{host_arch().swebench}"


def instance_repository(instance_id: str) -> str:
    """`vf-swe/inst.<arch>.<id>`: an instance layer's repository on this host."""
    return f"vf-swe/inst.{host_arch().swebench}.{_safe(instance_id)}"


def _sha(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _safe(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.")[:100] or "x"


async def _run(*argv: str, cwd: str | None = None, env: dict[str, str] | None = None, timeout: float = 1800) -> tuple[int, str]:
    """Run a host program (pip) and return (exit code, combined output)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"timed out after {timeout}s: {' '.join(argv)}"
    return proc.returncode or 0, out.decode("utf-8", "replace")


def find_pip() -> list[str]:
    """A host pip to download wheels with (`sandboxes.wheels.find_pip`: $VF_SWE_PIP, this
    interpreter's, python3's, one on PATH)."""
    try:
        return wheels.find_pip()
    except wheels.WheelDownloadError as exc:
        raise ImageBuildError(str(exc)) from exc


PullListener = Callable[[PullProgress], None]
_PULL_LISTENERS: list[PullListener] = []


def add_pull_listener(fn: PullListener) -> None:
    """Have `fn` told how every image pull of this process goes (e.g. a progress bar);
    it may be called from a worker thread."""
    _PULL_LISTENERS.append(fn)


def remove_pull_listener(fn: PullListener) -> None:
    with contextlib.suppress(ValueError):
        _PULL_LISTENERS.remove(fn)


def _notify_pull(p: PullProgress) -> None:
    for fn in list(_PULL_LISTENERS):
        try:
            fn(p)
        except Exception:  # noqa: BLE001 - a display must never fail a pull
            log.debug("pull listener failed", exc_info=True)


class ImageBuilder:
    """Builds and caches environment and instance layers (one per key, concurrency-safe)."""

    def __init__(
        self,
        base_image: str | None = None,
        cache_dir: Path | str | None = None,
        recipes: Path | str = RECIPES,
        backend: object | str | None = None,
        build_timeout: float = 1800,
        salt: str = "",
        no_cache: bool = False,
        namespace: str | None = None,
        registry: str | None = None,
        push_to: str | None = None,
        auth: RegistryAuth | None = None,
        pull_concurrency: int = 2,
        keep_images: int | None = None,
        settings: ProcessSettings | None = None,
    ):
        # disk policy: of the images THIS builder pulled or built (never others), keep the
        # `keep_images` most recently used ones that no rollout holds; None = keep all
        self.keep_images = keep_images
        self._held: dict[str, int] = {}  # image -> rollouts holding it
        self._owned: dict[str, float] = {}  # images pulled/built here -> last use (monotonic)
        # rows without an image field: the SWE-bench name under `registry/namespace`
        self.namespace = image_namespace(registry, namespace)
        self.push_to = push_to  # built instance images are pushed to `push_to/<repository>:<tag>`
        # `settings`: the process settings this builder uses (None: the running ones,
        # `sandboxes.settings.current()`): base image, wheel cache and registry credentials
        settings = settings or current_settings()
        # registry credentials: `auth`, else the settings' (VF_REGISTRY_*), else the engine's Docker config
        self.auth = auth if auth is not None else RegistryAuth.from_settings(settings)
        self.pull_concurrency = max(1, pull_concurrency)
        self._pulls: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._pushed: set[str] = set()
        self.no_cache = no_cache  # do not reuse the engine's layer cache: a truly cold build
        self.salt = salt  # mixed into every key: a separate set of tags (benchmarks' cold builds)
        self.base_image = base_image or settings.swe_base_image or DEFAULT_BASE_IMAGE
        # wheels: `cache_dir/wheels` when one is given (or $VF_SWE_CACHE), else the one wheelhouse
        cache_dir = cache_dir or settings.swe_cache
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.wheel_root = self.cache_dir / "wheels" if self.cache_dir else None
        self.recipes = Path(recipes)
        # where images are checked, pulled and built: a backend name or instance with the
        # SupportsImageBuild capability; None = the run's backend when it has it, else docker
        self.backend = backend
        self.run_backend: object | None = None  # the run's sandbox backend (`use_backend`)
        self.build_timeout = build_timeout
        self._builder = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._image_ids: dict[str, str] = {}
        self._found: dict[str, BuiltImage] = {}  # context digest -> image found or built
        self._tree_hashes: dict[tuple[str, float, int], str] = {}

    # ------------------------------------------------------------------ the build capability

    def use_backend(self, backend: object) -> None:
        """The run's sandboxes are made by `backend` (an instance). One with the image-build
        capability (docker) sees this engine's images: it checks, pulls and builds them
        (with its own options). One without it (kubernetes, prime) pulls images by name
        itself: then named images are passed on unchecked and nothing here talks to an
        engine, except to build a row's image and push it (`push_to`)."""
        self.run_backend = backend
        if self.backend is None:
            self._builder = None

    @property
    def remote(self) -> bool:
        """Whether the run's backend pulls images itself (no SupportsImageBuild: kubernetes, prime)."""
        from sandboxes.interface import SupportsImageBuild

        return self.run_backend is not None and not isinstance(self.run_backend, SupportsImageBuild)

    @property
    def builder(self):
        """The backend's image-build capability (UsageError naming it when the backend has none)."""
        if self._builder is None:
            target = self.backend
            if target is None:
                target = self.run_backend if self.run_backend is not None and not self.remote else "docker"
            self._builder = image_builder(target)
        return self._builder

    async def image_id(self, tag: str) -> str | None:
        """The image's id, or None when it does not exist locally."""
        if tag in self._image_ids:
            return self._image_ids[tag]
        image_id = await self.builder.image_id(tag)
        if image_id is not None:
            self._image_ids[tag] = image_id
        return image_id

    def _request(self, recipe: str, digest: str, build_args: dict[str, str], labels: dict[str, str],
                 repository: str) -> ImageBuildRequest:
        return ImageBuildRequest(
            repository=repository, dockerfile=self._recipe(recipe), context_digest=digest, build_args=build_args,
            labels=labels, no_cache=self.no_cache, timeout=self.build_timeout,
        )

    async def _ensure_layer(self, request: ImageBuildRequest, fill: Callable[[Path], Awaitable[None]]) -> BuiltImage:
        """The image for `request`: found by its content key, else built from a context `fill` writes."""
        digest = request.context_digest or ""
        if digest in self._found:
            return self._found[digest]
        async with self._lock(digest):
            if digest in self._found:  # another task of this builder made it meanwhile
                return self._found[digest]
            found = await self.builder.find_image(request)
            if found is None:
                with tempfile.TemporaryDirectory(prefix="vf-swe-build-") as ctx:
                    await fill(Path(ctx))
                    found = await self.builder.build_image(request.model_copy(update={"context": Path(ctx)}))
            self._found[digest] = found.model_copy(update={"cached": True})  # later asks are cache hits
            return found

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    # ------------------------------------------------------------------ keys

    def _recipe(self, name: str) -> str:
        return (self.recipes / name).read_text()

    def environment_key(self, env: EnvironmentSpec, base_id: str) -> str:
        return _sha(RECIPE_VERSION, self.salt, base_id, self._recipe("env.Dockerfile"), env.model_dump_json())[:16]

    def tree_hash(self, path: Path) -> str:
        """`hash_tree` of an archive file or a directory tree (.git skipped), cached per path, mtime, size."""
        st = path.stat()
        cache_key = (str(path), st.st_mtime, st.st_size)
        if cache_key in self._tree_hashes:
            return self._tree_hashes[cache_key]
        digest = hash_tree(path, exclude=(".git",))
        self._tree_hashes[cache_key] = digest
        return digest

    def instance_key(self, inst: SWEInstance, env_id: str) -> str:
        assert inst.source is not None
        src = Path(inst.source.archive or inst.source.dir or "")
        if not src.exists():
            raise ImageNotFound(f"{inst.instance_id}: source {src} does not exist (build the dataset first?)")
        return _sha(
            RECIPE_VERSION,
            self.salt,
            env_id,
            self._recipe("instance.Dockerfile"),
            self._recipe("setup-repo.sh"),
            self.tree_hash(src),
            json.dumps([inst.source.strip_components, inst.source.verify_commit, inst.base_commit, inst.install]),
        )[:16]

    # ------------------------------------------------------------------ wheelhouse

    async def wheelhouse(self, env: EnvironmentSpec) -> Path:
        """Download (once) the wheels of `env` on the host for the image's Python, into the
        one wheelhouse (`sandboxes.wheels`; `cache_dir/wheels` when the builder was given one)."""
        arch = host_arch().machine
        target = dict(
            python_version=env.python_version,
            abis=[f"cp{env.python_version.replace('.', '')}", "abi3", "none"],
            platforms=[f"manylinux2014_{arch}", f"manylinux_2_17_{arch}", f"manylinux_2_28_{arch}",
                       f"linux_{arch}", "any"],
        )
        try:
            return await asyncio.to_thread(wheels.fetch_wheels, env.packages, no_deps=env.no_deps_packages,
                                           root=self.wheel_root, **target)
        except wheels.WheelDownloadError as exc:
            raise ImageBuildError(str(exc)) from exc

    # ------------------------------------------------------------------ layers

    def check_python(self, env: EnvironmentSpec) -> None:
        """Refuse an `environment.python_version` the base image cannot provide (the venv
        is made with the base image's python3, offline: no other interpreter to fetch)."""
        if self.base_image == DEFAULT_BASE_IMAGE and env.python_version != DEFAULT_BASE_PYTHON:
            raise ImageBuildError(
                f"environment.python_version {env.python_version} is not available: the base image "
                f"{self.base_image} has Python {DEFAULT_BASE_PYTHON} only (and builds are offline). Use a "
                f"prebuilt image_name with Python {env.python_version}, or a base image that has it "
                f"(VF_SWE_BASE_IMAGE)")

    async def ensure_environment(self, env: EnvironmentSpec) -> tuple[str, bool]:
        """(tag, built?) of the environment layer."""
        self.check_python(env)
        base_id = await self.image_id(self.base_image)
        if base_id is None:
            raise ImageNotFound(f"base image {self.base_image} is missing: run images/base/build.sh")
        key = self.environment_key(env, base_id)
        request = self._request("env.Dockerfile", key, {"BASE_IMAGE": self.base_image},
                                {"vf-sandbox.swe-layer": "env", "vf-sandbox.swe-key": key[:16]}, env_repository())

        async def fill(c: Path) -> None:
            house = await self.wheelhouse(env)
            wheels.copy_wheels(house, c / "wheels")
            (c / "requirements.txt").write_text("\n".join(env.packages) + "\n" if env.packages else "")
            (c / "requirements-nodeps.txt").write_text("\n".join(env.no_deps_packages) + "\n" if env.no_deps_packages else "")
            (c / "env-setup.sh").write_text("\n".join(["true", *env.setup]) + "\n")

        image = await self._ensure_layer(request, fill)
        self._image_ids[image.name] = image.image_id
        return image.name, not image.cached

    def remote_image(self, inst: SWEInstance) -> str | None:
        """The image a row names (`image_name`), else its SWE-bench name under `namespace`."""
        if inst.image_name:
            return inst.image_name
        return swebench_image_name(self.namespace, inst.instance_id, scheme=inst.image_scheme) if self.namespace else None

    async def ensure(self, inst: SWEInstance) -> ImageRef:
        """The image to run `inst` in: a local or pulled prebuilt image, or the cached/built
        instance layer (pushed to `push_to` when set). Pulls run `pull_concurrency` at a time."""
        t0 = time.perf_counter()
        name = self.remote_image(inst)
        if self.remote:
            if name:  # the run's backend pulls it (its pull errors are the rollout's infra errors)
                return ImageRef(tag=name, layer="prebuilt", seconds=time.perf_counter() - t0)
            if inst.source is None or not self.push_to:
                raise ImageNotFound(
                    f"{inst.instance_id}: the {getattr(self.run_backend, 'name', 'run')!r} backend runs images by "
                    f"name and builds none: name the image (image_name, or --namespace / --registry for SWE-bench "
                    f"names), or build it on this machine's Docker engine and push it (--push-to REGISTRY)")
        if name and await self.image_id(name):
            return ImageRef(tag=name, layer="prebuilt", seconds=time.perf_counter() - t0)
        # pull a named image when nothing can build it, or when the registry scheme names it
        if name and (inst.source is None or not inst.image_name):
            try:
                async with self._pull_slots():
                    await self.builder.pull_image(name, self.auth, on_progress=_notify_pull)
                self._image_ids.pop(name, None)
                return ImageRef(tag=name, layer="prebuilt", built=["pull"], seconds=time.perf_counter() - t0)
            except ImageNotFound as exc:
                if inst.source is None:
                    raise ImagePullFailed(f"{inst.instance_id}: image {name} cannot be pulled and the row has no "
                                          f"`source` to build it from: {exc}") from exc
                log.info("%s: %s cannot be pulled (%s); building it from source", inst.instance_id, name, exc)
        if inst.source is None:
            raise ImageNotFound(f"{inst.instance_id}: no image (set `image_name`, or --namespace for SWE-bench "
                                f"image names) and no `source` to build one")

        env_spec = inst.environment or EnvironmentSpec()
        built: list[str] = []
        env_tag, env_built = await self.ensure_environment(env_spec)
        if env_built:
            built.append("environment")
        env_id = await self.image_id(env_tag) or env_tag
        image = await self._ensure_instance(inst, env_tag, self.instance_key(inst, env_id))
        if not image.cached:
            built.append("instance")
        pushed = await self.push(image.name) if self.push_to else None
        if self.remote:  # the run's backend pulls what was pushed
            return ImageRef(tag=pushed or image.name, local=image.name, layer="instance", built=built, env_tag=env_tag,
                            pushed=pushed, seconds=time.perf_counter() - t0)
        return ImageRef(tag=image.name, layer="instance", built=built, env_tag=env_tag, pushed=pushed,
                        seconds=time.perf_counter() - t0)

    # ------------------------------------------------------------------ disk policy

    def hold(self, ref: ImageRef) -> None:
        """A rollout uses `ref`; the builder owns it when this call pulled it or built
        its instance layer (a new environment layer under a cached instance is not that)."""
        key = ref.local or ref.tag
        self._held[key] = self._held.get(key, 0) + 1
        if {"pull", "instance"} & set(ref.built):
            self._owned[key] = time.monotonic()

    async def release(self, ref: ImageRef) -> list[str]:
        """The rollout is done with `ref`; past `keep_images`, remove the least recently used
        owned images nobody holds. Returns the images removed."""
        key = ref.local or ref.tag
        n = self._held.get(key, 0) - 1
        if n > 0:
            self._held[key] = n
        else:
            self._held.pop(key, None)
        if key in self._owned:
            self._owned[key] = time.monotonic()
        if self.keep_images is None or len(self._owned) <= self.keep_images:
            return []
        idle = sorted((t, img) for img, t in self._owned.items() if img not in self._held)
        removed = []
        for _, img in idle[: len(self._owned) - self.keep_images]:
            self._owned.pop(img, None)
            self._image_ids.pop(img, None)
            self._found = {k: v for k, v in self._found.items() if v.name != img}
            try:
                if await self.builder.remove_image(img):
                    removed.append(img)
            except Exception as exc:  # noqa: BLE001 - disk hygiene never fails a rollout
                log.warning("could not remove image %s: %s", img, exc)
        if removed:
            log.info("removed %d image(s) past keep_images=%d: %s", len(removed), self.keep_images, ", ".join(removed))
        return removed

    def _pull_slots(self) -> asyncio.Semaphore:
        """The pull semaphore of the running loop (a builder may outlive one asyncio.run)."""
        loop = asyncio.get_running_loop()
        if self._pulls is None or self._pulls[0] is not loop:
            self._pulls = (loop, asyncio.Semaphore(self.pull_concurrency))
        return self._pulls[1]

    async def push(self, image: str) -> str:
        """Push a built image to `push_to` under its own repository and tag (content-keyed:
        the same instance gets the same name on every machine); the pushed name."""
        assert self.push_to
        target = f"{self.push_to.rstrip('/')}/{image}"
        async with self._lock("push-" + target):
            if target not in self._pushed:
                await self.builder.push_image(image, target, self.auth)
                self._pushed.add(target)
        return target

    async def _ensure_instance(self, inst: SWEInstance, env_tag: str, key: str) -> BuiltImage:
        assert inst.source is not None
        verify = inst.source.verify_commit and bool(re.fullmatch(r"[0-9a-f]{40}", inst.base_commit))
        script = (
            self._recipe("setup-repo.sh")
            .replace("@BASE_COMMIT@", inst.base_commit)
            .replace("@VERIFY@", "1" if verify else "0")
            .replace("@INSTALL@", "\n".join(inst.install) or "true")
        )
        request = self._request("instance.Dockerfile", key, {"ENV_IMAGE": env_tag},
                                {"vf-sandbox.swe-layer": "instance", "vf-sandbox.swe-key": key[:16],
                                 "vf-sandbox.swe-instance": _safe(inst.instance_id)},
                                instance_repository(inst.instance_id))

        async def fill(c: Path) -> None:
            await asyncio.to_thread(materialize_source, inst, c / "repo")
            (c / "setup-repo.sh").write_text(script)

        return await self._ensure_layer(request, fill)


def materialize_source(inst: SWEInstance, dest: Path) -> None:
    """Write the instance's source tree (archive or directory) to `dest`."""
    assert inst.source is not None
    src = inst.source
    dest.mkdir(parents=True, exist_ok=True)
    if src.dir:
        shutil.copytree(src.dir, dest, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return
    with tarfile.open(src.archive) as tf:
        members = []
        for m in tf.getmembers():
            parts = Path(m.name).parts[src.strip_components:]
            if not parts:
                continue
            m.name = str(Path(*parts))
            members.append(m)
        tf.extractall(dest, members=members, filter="data")
