"""Derived images with Python packages preinstalled, built once and cached by content.

`pip install` inside a sandbox needs network (off by default) and costs every
boot, so PythonEnv bakes its packages into an image instead:

    FROM <base>                         # the image the env asked for, resolved locally
    COPY wheelhouse /tmp/vf-wheelhouse  # wheels downloaded on the HOST (pip download)
    RUN python3 -m pip install --no-index --find-links /tmp/vf-wheelhouse <packages>

built with `--network none`. The tag is `vf-sandbox/python-env:<hash>` where the
hash covers the base image id and the sorted package list: an unchanged request
finds its image by tag in milliseconds; a new base or package list builds anew.
Wheels are cached on the host by (packages, Python version).

This talks to the Docker Engine through the `docker` SDK (no `backends` import)
and applies only to backends named "docker"; others install at boot.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from sandboxes.errors import BackendUnavailable, ImageNotFound

TAG_REPO = "vf-sandbox/python-env"
LABEL = "vf-sandbox.python-env"
CACHE = Path(os.environ.get("VF_SANDBOX_CACHE", Path.home() / ".cache" / "vf-sandbox")) / "python-env-wheels"
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def normalize_packages(packages: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """"numpy sympy" or ["numpy", "sympy"] -> sorted unique requirement strings."""
    if not packages:
        return []
    items = packages.split() if isinstance(packages, str) else [p for item in packages for p in str(item).split()]
    return sorted(set(items))


def image_tag(base_id: str, packages: list[str]) -> str:
    digest = hashlib.sha256((base_id + "\n" + "\n".join(packages)).encode()).hexdigest()[:16]
    return f"{TAG_REPO}:{digest}"


def _pip() -> list[str]:
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "pip"]
    for exe in ("pip3", "pip"):
        path = shutil.which(exe)
        if path:
            return [path]
    raise ImageNotFound("no pip on the host to download the packages' wheels (install pip)")


def download_wheels(packages: list[str], python_version: str) -> Path:
    """Wheels of `packages` (and their dependencies) for Linux/CPython `python_version`, cached."""
    key = hashlib.sha256(("\n".join(packages) + "|" + python_version).encode()).hexdigest()[:16]
    house = CACHE / key
    if (house / ".complete").exists():
        return house
    house.mkdir(parents=True, exist_ok=True)
    arch = platform.machine() or "x86_64"
    argv = [*_pip(), "download", "-q", "-d", str(house), "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp",
            "--platform", f"manylinux_2_36_{arch}", "--platform", f"manylinux2014_{arch}", "--platform", "any",
            *packages]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageNotFound(f"downloading wheels for {' '.join(packages)} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    (house / ".complete").write_text("ok\n")
    return house


def build_derived_image(url: str | None, base: str, packages: list[str]) -> str:
    """The tag of an image = `base` + `packages`, building it if absent (blocking)."""
    import docker

    try:
        api = docker.APIClient(base_url=url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock",
                               version="1.41", timeout=900)
        base_info = api.inspect_image(base)
    except docker.errors.ImageNotFound as exc:
        raise ImageNotFound(f"base image {base} for the Python packages is not present: {exc}") from exc
    except docker.errors.DockerException as exc:
        raise BackendUnavailable(f"Docker daemon does not answer while preparing {base}: {exc}") from exc
    tag = image_tag(base_info["Id"], packages)
    with _locks_guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        try:
            api.inspect_image(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        version = _python_version(url, base)
        house = download_wheels(packages, version)
        with tempfile.TemporaryDirectory(prefix="vf-python-env-") as tmp:
            ctx = Path(tmp)
            shutil.copytree(house, ctx / "wheelhouse", ignore=shutil.ignore_patterns(".complete"))
            reqs = " ".join(_shell_quote(p) for p in packages)
            (ctx / "Dockerfile").write_text(
                f"FROM {base}\n"
                "COPY wheelhouse /tmp/vf-wheelhouse\n"
                f"RUN python3 -m pip install -q --no-index --find-links /tmp/vf-wheelhouse {reqs} "
                "&& rm -rf /tmp/vf-wheelhouse /root/.cache/pip\n"
            )
            log_lines: list[str] = []
            for chunk in api.build(path=str(ctx), tag=tag, network_mode="none", rm=True, forcerm=True, decode=True,
                                   labels={LABEL: " ".join(packages), f"{LABEL}.base": base}):
                if "stream" in chunk:
                    log_lines.append(chunk["stream"])
                if "error" in chunk:
                    raise ImageNotFound(
                        f"building {tag} (FROM {base} + {' '.join(packages)}) failed: {chunk['error']}\n"
                        + "".join(log_lines)[-3000:]
                    )
        return tag


def _python_version(url: str | None, image: str) -> str:
    import docker

    client = docker.DockerClient(base_url=url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock",
                                 version="1.41")
    try:
        out = client.containers.run(image, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                    remove=True, network_mode="none", labels={"vf-sandbox.probe": "1"})
    except docker.errors.ContainerError as exc:
        raise ImageNotFound(f"image {image} has no usable python3 for the packages: {exc}") from exc
    finally:
        client.close()
    return out.decode().strip()


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


async def ensure_derived_image(backend: Any, image: str, packages: list[str]) -> str:
    """`image` with `packages` baked in, for the docker backend (resolves the base through it)."""
    resolve = getattr(backend, "resolve_image", None)
    base = await resolve(image) if resolve is not None else image
    return await asyncio.to_thread(build_derived_image, getattr(backend, "url", None), base, packages)
