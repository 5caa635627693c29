"""Image recipes (`images/recipes.toml`) and the cached builder.

A `dir` recipe is built offline through the build capability's engine side
(`build.EngineImages`: the Engine API's `/build` with a tar context, never the
docker CLI) and labelled with a content hash of its context plus its parent
image's id: an unchanged recipe is "built" in milliseconds by reading that
label back. A `script` recipe (the debootstrap
base) is run only when its image is absent. A recipe's `FROM` naming another
recipe builds that one first; a public image is pulled by the daemon where
the machine can.

Derived images (`derive_image`, behind `DockerBackend.derive_image`): a base
image plus Python packages, `FROM base; COPY wheelhouse; RUN pip install
--no-index`, built with networking off from wheels downloaded on the host.
The tag `vf-sandbox/python-env:<hash>` hashes the base image id and the sorted
package list, so an unchanged request is found by tag in milliseconds.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from sandboxes.errors import BackendUnavailable, ImageNotFound
from sandboxes.images import BuiltImage, ImageBuildFailed, ImageBuildRequest, RecipeStatus, hash_tree, host_arch
from sandboxes import wheels
from sandboxes import settings

from .build import EngineImages, split_name

log = logging.getLogger(__name__)

REPO_IMAGES = Path(__file__).resolve().parents[2] / "images"
HASH_LABEL = "vf-sandbox.recipe-hash"
RECIPE_LABEL = "vf-sandbox.recipe"
DERIVED_REPO = "vf-sandbox/python-env"
DERIVED_LABEL = "vf-sandbox.python-env"
PROBE_LABEL = "vf-sandbox.probe"
RECIPE_PLATFORMS = ("manylinux2014", "manylinux_2_28", "any")
DERIVED_PLATFORMS = ("manylinux_2_36", "manylinux2014", "any")  # bases are bookworm-like (glibc 2.36)
_build_lock = threading.Lock()
_derive_locks: dict[str, threading.Lock] = {}
_derive_locks_guard = threading.Lock()


def images_root() -> Path:
    """The image recipes' directory: the running settings' (`sandboxes.settings.current()`)
    $VF_SANDBOX_IMAGES, else the repository's images/."""
    configured = settings.current().sandbox_images
    return Path(configured) if configured else REPO_IMAGES


class Recipe(BaseModel):
    """One entry of images/recipes.toml."""

    name: str = Field(description="Image name:tag the recipe produces.")
    dir: str | None = Field(None, description="Build context (with a Dockerfile), relative to images/.")
    script: str | None = Field(None, description="Program producing the image when absent, relative to images/.")
    aliases: list[str] = Field(default_factory=list, description="Other names this recipe stands in for.")
    description: str = ""
    root: Path = Field(default_factory=images_root)

    @property
    def context(self) -> Path:
        return self.root / (self.dir or "")

    def parents(self) -> list[str]:
        """Images named by FROM lines of the Dockerfile."""
        if not self.dir:
            return []
        text = (self.context / "Dockerfile").read_text()
        return [m.group(1) for m in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)", text)]


BuildOutcome = BuiltImage  # the name this module used before the build capability


def load_recipes(root: Path | None = None) -> list[Recipe]:
    root = root or images_root()
    index = root / "recipes.toml"
    if not index.exists():
        return []
    data = tomllib.loads(index.read_text())
    return [Recipe(**entry, root=root) for entry in data.get("image", [])]


def find_recipe(image: str, root: Path | None = None) -> Recipe | None:
    """The recipe producing `image` (by name or alias), if any."""
    for recipe in load_recipes(root):
        if image == recipe.name or image in recipe.aliases:
            return recipe
    return None


def missing_image_message(image: str) -> str:
    names = ", ".join(r.name for r in load_recipes()) or "none"
    return (
        f"image {image!r} is not present locally and no recipe in {images_root()}/recipes.toml builds it. "
        f"Build it (`docker build -t {image} <context>`), load it (`docker load -i <file>.tar`) or, on a "
        f"machine with a registry, pull it (`docker pull {image}`). Recipes available: {names} "
        "(`vf-sandbox images build NAME`)."
    )


def recipe_hash(recipe: Recipe, parent_ids: list[str]) -> str:
    """Content hash of the recipe's script or build context (`hash_tree`) and parent image ids."""
    h = hashlib.sha256()
    if recipe.script:
        h.update((recipe.root / recipe.script).read_bytes())
    if recipe.dir:
        hash_tree(recipe.context, into=h)
    for pid in parent_ids:
        h.update(pid.encode())
    return h.hexdigest()[:24]


class ImageBuilder:
    """Builds recipes through the engine's API (`EngineImages`, blocking: call from a thread)."""

    def __init__(self, url: str | None = None, root: Path | None = None):
        self.engine = EngineImages(url)
        self.url = self.engine.url
        self.root = root or images_root()

    def image(self, name: str) -> dict | None:
        return self.engine.inspect(name)

    def status(self, recipe: Recipe) -> str:
        """'missing', 'stale' or 'ok'."""
        if self.image(recipe.name) is None:
            return "missing"
        if recipe.script:
            return "ok"
        parent_ids = [p["Id"] for p in (self.image(x) for x in recipe.parents()) if p]
        return "ok" if self._current(recipe, recipe_hash(recipe, parent_ids)) is not None else "stale"

    def _current(self, recipe: Recipe, digest: str) -> dict | None:
        """The recipe's image if it was built from these inputs (its recipe-hash label is
        `digest`): the one cache check of a `dir` recipe."""
        info = self.image(recipe.name)
        if info is not None and ((info.get("Config") or {}).get("Labels") or {}).get(HASH_LABEL) == digest:
            return info
        return None

    def statuses(self) -> list[RecipeStatus]:
        return [RecipeStatus(name=r.name, status=self.status(r), source=r.dir or r.script or "",
                             aliases=r.aliases, description=r.description) for r in load_recipes(self.root)]

    def ensure(self, name: str, force: bool = False) -> BuiltImage:
        """Build `name` (a recipe name or alias) unless an up-to-date image exists."""
        recipe = find_recipe(name, self.root)
        if recipe is None:
            raise ImageNotFound(missing_image_message(name))
        with _build_lock:
            return self._ensure(recipe, force)

    def _ensure(self, recipe: Recipe, force: bool) -> BuiltImage:
        t0 = time.monotonic()
        if recipe.script:
            info = self.image(recipe.name)
            cached = info is not None and not force
            if not cached:
                self._run_script(recipe)
                info = self.image(recipe.name)
                if info is None:
                    raise ImageNotFound(f"{recipe.script} finished but {recipe.name} does not exist")
            digest = recipe_hash(recipe, [])
            return BuiltImage(name=recipe.name, image_id=info["Id"], key=digest, cached=cached,
                              seconds=time.monotonic() - t0)
        parent_ids = []
        for parent in recipe.parents():
            if (parent_recipe := find_recipe(parent, self.root)) is not None:
                parent_ids.append(self._ensure(parent_recipe, False).image_id)
            else:
                info = self.image(parent)
                parent_ids.append(info["Id"] if info else parent)  # pulled by the build where possible
        want = recipe_hash(recipe, parent_ids)
        if not force and (info := self._current(recipe, want)) is not None:
            return BuiltImage(name=recipe.name, image_id=info["Id"], key=want, cached=True,
                              seconds=time.monotonic() - t0)
        built = self._build_dir(recipe, want)
        return built.model_copy(update={"cached": False, "seconds": time.monotonic() - t0})

    def _run_script(self, recipe: Recipe) -> None:
        script = recipe.root / recipe.script
        log.warning("building %s with %s (may take a few minutes)", recipe.name, script)
        proc = subprocess.run(["bash", str(script), recipe.name], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise ImageNotFound(f"building {recipe.name} with {script} failed (exit {proc.returncode}):\n{tail}")

    def _build_dir(self, recipe: Recipe, digest: str) -> BuiltImage:
        """Build a `dir` recipe through the build capability, always (`_current` was the cache
        check; the capability's own key check is skipped); its key stands on the recipe hash."""
        repository, tag = split_name(recipe.name)
        with tempfile.TemporaryDirectory(prefix="vf-image-") as tmp:
            ctx = Path(tmp) / "ctx"
            shutil.copytree(recipe.context, ctx, symlinks=True)
            wanted = ctx / "wheels.txt"
            if wanted.exists():
                wheels.copy_wheels(fetch_wheels(wanted), ctx / "wheelhouse")
                shutil.copy(wanted, ctx / "wheelhouse" / "wheels.txt")
            request = ImageBuildRequest(
                repository=repository, tag=tag, dockerfile=(ctx / "Dockerfile").read_text(), context=ctx,
                context_digest=digest, labels={HASH_LABEL: digest, RECIPE_LABEL: recipe.name},
            )
            return self.engine.build(request, force=True)


def fetch_wheels(
    requirements: Path | Sequence[str],
    python_version: str = "3.11",
    platforms: Sequence[str] = RECIPE_PLATFORMS,
) -> Path:
    """Download the wheels of `requirements` (a requirements file or a list of
    requirement strings) and their dependencies for Linux/CPython
    `python_version` on the host, into the one wheelhouse (`sandboxes.wheels`)."""
    if isinstance(requirements, Path):
        reqs = [line.strip() for line in requirements.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    else:
        reqs = list(requirements)
    arch = host_arch().machine
    try:
        return wheels.fetch_wheels(reqs, python_version=python_version,
                                   platforms=[p if p == "any" else f"{p}_{arch}" for p in platforms])
    except wheels.WheelDownloadError as exc:
        raise ImageNotFound(f"downloading wheels for {' '.join(reqs)} failed: {exc}") from exc


def ensure_image(name: str, url: str | None = None, force: bool = False) -> str:
    """Build the recipe for `name` if needed; returns the image name to run."""
    return ImageBuilder(url).ensure(name, force=force).name


# ---------------------------------------------------------------- derived images
def derived_tag(base_id: str, packages: Sequence[str]) -> str:
    """The content-addressed tag of `base_id` + `packages` (order and duplicates ignored)."""
    digest = hashlib.sha256((base_id + "\n" + "\n".join(sorted(set(packages)))).encode()).hexdigest()[:16]
    return f"{DERIVED_REPO}:{digest}"


def derive_image(base: str, packages: Sequence[str], url: str | None = None) -> str:
    """The tag of an image = local image `base` + pip `packages`, building it
    if absent (blocking: call from a thread). ImageNotFound when the base is
    missing, has no python3, or a package cannot be downloaded or installed."""
    packages = sorted(set(packages))
    builder = ImageBuilder(url)
    base_info = builder.image(base)
    if base_info is None:
        raise ImageNotFound(f"base image {base} for the Python packages is not present locally")
    if not packages:
        return base
    tag = derived_tag(base_info["Id"], packages)
    with _derive_locks_guard:
        lock = _derive_locks.setdefault(tag, threading.Lock())
    with lock:
        if builder.image(tag) is not None:
            return tag
        house = fetch_wheels(packages, _python_version(builder.url, base), DERIVED_PLATFORMS)
        with tempfile.TemporaryDirectory(prefix="vf-python-env-") as tmp:
            ctx = Path(tmp)
            wheels.copy_wheels(house, ctx / "wheelhouse")
            reqs = " ".join(shlex.quote(p) for p in packages)
            repository, digest = split_name(tag)
            request = ImageBuildRequest(
                repository=repository, tag=digest, context=ctx, context_digest=digest,
                dockerfile=(
                    f"FROM {base}\n"
                    "COPY wheelhouse /tmp/vf-wheelhouse\n"
                    f"RUN python3 -m pip install -q --no-index --find-links /tmp/vf-wheelhouse {reqs} "
                    "&& rm -rf /tmp/vf-wheelhouse /root/.cache/pip\n"
                ),
                labels={DERIVED_LABEL: " ".join(packages), f"{DERIVED_LABEL}.base": base},
            )
            log.warning("building %s (FROM %s + %s)", tag, base, " ".join(packages))
            try:
                builder.engine.build(request, force=True)
            except ImageBuildFailed as exc:
                raise ImageNotFound(
                    f"building {tag} (FROM {base} + {' '.join(packages)}) failed: {exc.reason}\n{exc.tail}"
                ) from exc
        return tag


def _python_version(url: str, image: str) -> str:
    """'3.11' for an image whose python3 is CPython 3.11 (a throwaway container, networking off)."""
    import uuid

    import docker
    import requests

    probe = uuid.uuid4().hex[:12]
    client = docker.DockerClient(base_url=url, version="1.41")
    try:
        out = client.containers.run(image, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                    remove=True, network_mode="none", labels={PROBE_LABEL: probe})
    except (docker.errors.ContainerError, docker.errors.APIError) as exc:  # exits non-zero / python3 not found
        for c in client.containers.list(all=True, filters={"label": f"{PROBE_LABEL}={probe}"}):
            c.remove(force=True)
        raise ImageNotFound(f"image {image} has no usable python3 for the packages: {exc}") from exc
    except (docker.errors.DockerException, requests.ConnectionError) as exc:
        raise BackendUnavailable(f"Docker daemon at {url} failed probing {image}'s python3: {exc}") from exc
    finally:
        client.close()
    return out.decode().strip()
