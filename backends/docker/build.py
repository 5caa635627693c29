"""Image builds through the Engine API (docker-py's `/build` with a tar
context, the log streamed): the `SupportsImageBuild` capability's engine side.

Blocking (docker-py); `DockerBackend` runs it in threads, the recipe builder
calls it directly. Never the docker CLI. One build per image name at a time in
this process; a second caller waiting on the same name finds the first one's
image as a cache hit.

    request ──► parents' ids (FROM, ARGs substituted; pulled if absent and pullable)
            ──► key = request.key(parent ids) ──► name (content tag or fixed tag)
            ──► present with that key? cached : tar(context + files + Dockerfile) ──► /build
"""

from __future__ import annotations

import contextlib
import io
import logging
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sandboxes.errors import BackendUnavailable, ImageNotFound, ImagePushFailed
from sandboxes.images import KEY_LABEL, BuiltImage, ImageBuildFailed, ImageBuildRequest, PullProgress, RegistryAuth, log_tail

from .engine import resolve_url

log = logging.getLogger(__name__)

API_VERSION = "1.41"
DOCKERFILE_NAME = ".vf-build.Dockerfile"  # inside the tar context; the context's own Dockerfile is not used
_name_locks: dict[str, threading.Lock] = {}
_name_locks_guard = threading.Lock()


def _name_lock(name: str) -> threading.Lock:
    with _name_locks_guard:
        return _name_locks.setdefault(name, threading.Lock())



def split_name(image: str) -> tuple[str, str]:
    """'repo/name:tag' -> ('repo/name', 'tag'); no tag -> 'latest' (a registry's
    `host:port/` is not a tag)."""
    name, sep, tag = image.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return image, "latest"


class EngineImages:
    """Look up, build and pull images on one Docker engine (blocking calls)."""

    def __init__(self, url: str | None = None):
        self.url = resolve_url(url)

    # ------------------------------------------------------------ plumbing
    @contextlib.contextmanager
    def api(self, what: str, timeout: float = 60) -> Iterator:
        """A docker-py APIClient for one operation; transport failures → BackendUnavailable."""
        import docker
        import requests

        try:
            client = docker.APIClient(base_url=self.url, version=API_VERSION, timeout=max(1, int(timeout)))
        except docker.errors.DockerException as exc:
            raise BackendUnavailable(f"Docker daemon at {self.url} does not answer ({what}): {exc}") from exc
        try:
            yield client
        except (requests.ConnectionError, requests.Timeout, ConnectionError, FileNotFoundError) as exc:
            raise BackendUnavailable(
                f"Docker daemon at {self.url} does not answer ({what}): {exc}. Is dockerd running? "
                "(start it, or set DOCKER_HOST)") from exc
        finally:
            client.close()

    # ------------------------------------------------------------ lookups
    def inspect(self, image: str) -> dict | None:
        """`docker image inspect` as a dict, or None when absent."""
        import docker

        with self.api(f"inspect image {image}") as api:
            try:
                return api.inspect_image(image)
            except docker.errors.ImageNotFound:
                return None
            except docker.errors.APIError as exc:
                if exc.status_code == 404:
                    return None
                raise

    def image_id(self, image: str) -> str | None:
        info = self.inspect(image)
        return info["Id"] if info else None

    def pull(self, image: str, auth: RegistryAuth | None = None,
             on_progress: Callable[[PullProgress], None] | None = None) -> str:
        """Pull `image` from its registry; its id. ImageNotFound when that fails (no registry
        here, no such image or tag, bad credentials: the registry's own words say which).
        `on_progress` gets the layers' downloaded / announced bytes as the engine reports them,
        and a last report when it ends (`failed` when it raised)."""
        repo, tag = split_name(image)
        layers = _LayerBytes(image, on_progress)
        try:
            return self._pull(image, repo, tag, auth, layers)
        except BaseException:
            layers.finish(failed=True)
            raise

    def _pull(self, image: str, repo: str, tag: str | None, auth: RegistryAuth | None, layers: "_LayerBytes") -> str:
        import docker

        with self.api(f"pull {image}", timeout=900) as api:
            try:
                for chunk in api.pull(repo, tag=tag, stream=True, decode=True,
                                      auth_config=auth.engine_config() if auth else None):
                    if "error" in chunk:
                        raise ImageNotFound(f"image {image} is not present locally and cannot be pulled: "
                                            f"{chunk['error']}")
                    layers.update(chunk)
            except docker.errors.APIError as exc:
                raise ImageNotFound(f"image {image} is not present locally and cannot be pulled: "
                                    f"{exc.explanation or exc}") from exc
        image_id = self.image_id(image)
        if image_id is None:
            raise ImageNotFound(f"image {image}: pull finished but the image is not present")
        layers.finish()
        return image_id

    def remove(self, image: str) -> bool:
        """Untag/remove `image`; False when absent or used by a container (never forced)."""
        import docker

        with self.api(f"remove {image}") as api:
            try:
                api.remove_image(image, force=False, noprune=False)
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # a container uses it
                    return False
                raise
        return True

    def push(self, image: str, target: str, auth: RegistryAuth | None = None) -> str:
        """Tag `image` as `target` and push it; the pushed digest. ImagePushFailed when refused."""
        import docker

        repo, tag = split_name(target)
        with self.api(f"push {target}", timeout=1800) as api:
            try:
                api.tag(image, repo, tag=tag)
                digest = ""
                for chunk in api.push(repo, tag=tag, stream=True, decode=True,
                                      auth_config=auth.engine_config() if auth else None):
                    if "error" in chunk:
                        raise ImagePushFailed(f"push of {image} as {target} refused: {chunk['error']}")
                    digest = (chunk.get("aux") or {}).get("Digest") or digest
            except docker.errors.APIError as exc:
                raise ImagePushFailed(f"push of {image} as {target} failed: {exc.explanation or exc}") from exc
        return digest

    # ------------------------------------------------------------ builds
    def _parent_ids(self, request: ImageBuildRequest, *, pull: bool) -> list[str]:
        ids = []
        for parent in request.parents():
            pid = self.image_id(parent)
            if pid is None:
                if not pull:
                    ids.append(f"missing:{parent}")
                    continue
                try:
                    pid = self.pull(parent)
                except ImageNotFound as exc:
                    raise ImageNotFound(f"parent image {parent} of {request.repository} is not present locally "
                                        f"and cannot be pulled: build it first ({exc})") from exc
            ids.append(pid)
        return ids

    def _cached(self, name: str, key: str) -> dict | None:
        info = self.inspect(name)
        if info and ((info.get("Config") or {}).get("Labels") or {}).get(KEY_LABEL) == key:
            return info
        return None

    def find(self, request: ImageBuildRequest) -> BuiltImage | None:
        """The built image for `request`, or None (never builds, never pulls)."""
        t0 = time.monotonic()
        parent_ids = self._parent_ids(request, pull=False)
        if any(p.startswith("missing:") for p in parent_ids):
            return None
        key = request.key(parent_ids)
        info = self._cached(request.name(key), key)
        if info is None:
            return None
        return BuiltImage(name=request.name(key), image_id=info["Id"], key=key, cached=True,
                          seconds=time.monotonic() - t0)

    def build(self, request: ImageBuildRequest, *, force: bool = False,
              on_log: Callable[[str], None] | None = None) -> BuiltImage:
        """The image for `request`: a cache hit by key, else built now (see module docstring)."""
        t0 = time.monotonic()
        key = request.key(self._parent_ids(request, pull=True))
        name = request.name(key)
        with _name_lock(name):
            if not force and (info := self._cached(name, key)) is not None:
                return BuiltImage(name=name, image_id=info["Id"], key=key, cached=True, seconds=time.monotonic() - t0)
            image_id = self._build(request, name, key, on_log)
        return BuiltImage(name=name, image_id=image_id, key=key, cached=False, seconds=time.monotonic() - t0)

    def _build(self, request: ImageBuildRequest, name: str, key: str,
               on_log: Callable[[str], None] | None) -> str:
        import docker

        if request.context is not None and not Path(request.context).is_dir():
            raise ImageNotFound(f"build context {request.context} of {name} is not a directory")
        log.warning("building image %s", name)
        lines: list[str] = []
        deadline = time.monotonic() + request.timeout
        with tempfile.TemporaryFile(prefix="vf-build-ctx-") as ctx, self.api(f"build {name}", request.timeout) as api:
            write_context(ctx, request)
            ctx.seek(0)
            try:
                stream = api.build(
                    fileobj=ctx, custom_context=True, dockerfile=DOCKERFILE_NAME, tag=name, decode=True,
                    rm=True, forcerm=True, nocache=request.no_cache, pull=False,
                    network_mode=None if request.network else "none", buildargs=dict(request.build_args) or None,
                    labels={**request.labels, KEY_LABEL: key}, platform=request.platform,
                )
                for chunk in stream:
                    text = chunk.get("stream") or chunk.get("status") or ""
                    if text:
                        lines.append(text)
                        if on_log is not None:
                            on_log(text)
                    if "error" in chunk:
                        raise ImageBuildFailed(name, chunk["error"], log_tail(lines))
                    if time.monotonic() > deadline:
                        raise BackendUnavailable(f"building {name} did not finish in {request.timeout:.0f}s")
            except docker.errors.APIError as exc:
                raise ImageBuildFailed(name, str(exc.explanation or exc), log_tail(lines)) from exc
        image_id = self.image_id(name)
        if image_id is None:
            raise ImageBuildFailed(name, "the engine reported no error but produced no image", log_tail(lines))
        return image_id


def write_context(fileobj, request: ImageBuildRequest) -> None:
    """Write the request's build context as an uncompressed tar: the context
    directory (symlinks kept), then `files`, then the Dockerfile text."""
    with tarfile.open(fileobj=fileobj, mode="w") as tf:
        if request.context is not None:
            root = Path(request.context)
            for path in sorted(root.rglob("*")):
                tf.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
        for rel, data in sorted(request.files.items()):
            _add_bytes(tf, rel, data)
        _add_bytes(tf, DOCKERFILE_NAME, request.dockerfile.encode())


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tf.addfile(info, io.BytesIO(data))


class _LayerBytes:
    """The engine's per-layer pull messages summed into one PullProgress for the image."""

    DONE = ("Download complete", "Pull complete", "Already exists")

    def __init__(self, image: str, on_progress: Callable[[PullProgress], None] | None):
        self.image, self.on_progress = image, on_progress
        self.total: dict[str, int] = {}
        self.current: dict[str, int] = {}

    def _emit(self, finished: bool = False, failed: bool = False) -> None:
        if self.on_progress is not None:
            total = sum(self.total.values())
            done = total if finished and not failed else min(sum(self.current.values()), total)
            try:
                self.on_progress(PullProgress(image=self.image, done=done, total=total, finished=finished, failed=failed))
            except Exception:  # noqa: BLE001 - a progress display never fails a pull
                log.debug("pull progress callback failed", exc_info=True)

    def update(self, chunk: dict) -> None:
        layer, status = chunk.get("id"), str(chunk.get("status") or "")
        if not layer or self.on_progress is None:
            return
        detail = chunk.get("progressDetail") or {}
        if status == "Downloading" and detail.get("total"):
            self.total[layer] = int(detail["total"])
            self.current[layer] = int(detail.get("current") or 0)
        elif status in self.DONE and layer in self.total:
            self.current[layer] = self.total[layer]
        else:
            return
        self._emit()

    def finish(self, failed: bool = False) -> None:
        self._emit(finished=True, failed=failed)
