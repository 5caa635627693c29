"""The one wheelhouse: wheels downloaded on the host for offline image builds.

Every image that installs Python packages is built with networking off from
wheels fetched here first: derived Python images and image recipes
(`backends/docker/images.py`), OpenEnv dependency images
(`envs/openenv/build.py`) and SWE environment layers (`swe_debug/images.py`).
They all call `fetch_wheels`, which keeps one directory per request under one
root (the running settings' `wheelhouse_root()`, `sandboxes.settings.current()`:
$VF_SANDBOX_WHEELHOUSE, else $VF_SANDBOX_CACHE/wheelhouse, else
~/.cache/vf-sandbox/wheelhouse):

    <root>/<key>/            the wheels of one request, `.complete` once whole

`<key>` hashes everything that decides which wheels come back (requirements,
the no-deps ones, the target Python, platforms and ABIs), so an unchanged
request is a directory lookup and a changed one a new directory. A house is
written into a temporary directory and renamed into place, so concurrent
processes asking for the same house never see half of one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from . import settings

COMPLETE = ".complete"
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class WheelDownloadError(Exception):
    """pip could not download the wheels (the message carries its output's tail), or no pip was
    found. Deliberately neither a UsageError nor an InfraError: each caller says which it is
    (a package that does not exist is a usage error of a PythonEnv, an infrastructure error of
    an OpenEnv build, as before this helper)."""


def wheelhouse_root() -> Path:
    """The one wheelhouse directory (of the running settings, `sandboxes.settings.current()`)."""
    return settings.current().wheelhouse_root()


def find_pip() -> list[str]:
    """A host pip to download wheels with: $VF_SWE_PIP, this interpreter's, python3's or
    python's, pip3 / pip on PATH, else `uvx pip` (a uv-made venv has no pip of its own)."""
    configured = settings.current().swe_pip
    return configured.split() if configured else list(_discover_pip())


@functools.lru_cache(maxsize=1)
def _discover_pip() -> tuple[str, ...]:
    candidates = [[sys.executable, "-m", "pip"]]
    candidates += [[p, "-m", "pip"] for p in (shutil.which("python3"), shutil.which("python")) if p]
    candidates += [[p] for p in (shutil.which("pip3"), shutil.which("pip")) if p]
    for argv in candidates:
        if subprocess.run([*argv, "--version"], capture_output=True).returncode == 0:
            return tuple(argv)
    if uvx := shutil.which("uvx"):
        return (uvx, "pip")
    raise WheelDownloadError("no pip on the host to download wheels with (install pip or uv, or set VF_SWE_PIP)")


def target_args(python_version: str | None, platforms: Sequence[str], abis: Sequence[str]) -> list[str]:
    """pip download's target flags: binary wheels only (an image build is offline: nothing to
    compile there), for CPython `python_version` on `platforms` with `abis` (none given: this
    host's interpreter and platform)."""
    args: list[str] = ["--only-binary=:all:"]
    if python_version:
        args += ["--python-version", python_version, "--implementation", "cp"]
    args += [a for abi in abis for a in ("--abi", abi)]
    args += [a for plat in platforms for a in ("--platform", plat)]
    return args


def house_key(requirements: Sequence[str], no_deps: Sequence[str], target: Sequence[str]) -> str:
    blob = json.dumps([sorted(set(requirements)), sorted(set(no_deps)), list(target)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fetch_wheels(
    requirements: Sequence[str],
    *,
    no_deps: Sequence[str] = (),
    python_version: str | None = None,
    platforms: Sequence[str] = (),
    abis: Sequence[str] = (),
    root: Path | None = None,
    timeout: float = 900,
    log: Callable[[str], None] = lambda s: None,
) -> Path:
    """The directory holding the wheels of `requirements` and their dependencies (plus
    `no_deps` without theirs) for the target, downloading them once (blocking: call from
    a thread in async code). WheelDownloadError when pip fails."""
    target = target_args(python_version, platforms, abis)
    root = root or wheelhouse_root()
    house = root / house_key(requirements, no_deps, target)
    if (house / COMPLETE).exists():
        return house
    with _locks_guard:
        lock = _locks.setdefault(str(house), threading.Lock())
    with lock:
        if (house / COMPLETE).exists():
            return house
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=root))
        try:
            log(f"downloading wheels into {house} ...")
            for reqs, extra in ((requirements, []), (no_deps, ["--no-deps"])):
                if reqs:
                    _pip_download(reqs, extra, tmp, target, timeout)
            (tmp / COMPLETE).write_text(json.dumps({"requirements": list(requirements), "no_deps": list(no_deps),
                                                    "target": target}) + "\n")
            _move_into_place(tmp, house)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return house


def _pip_download(reqs: Sequence[str], extra: list[str], dest: Path, target: list[str], timeout: float) -> None:
    """`pip download` `reqs` (with `extra` options, e.g. --no-deps) for `target` into `dest`;
    WheelDownloadError when pip fails or runs past `timeout` seconds."""
    argv = [*find_pip(), "download", "-q", "--disable-pip-version-check", "-d", str(dest), *target, *extra, *reqs]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise WheelDownloadError(f"pip download timed out after {timeout:.0f}s for {list(reqs)}") from exc
    if proc.returncode != 0:
        raise WheelDownloadError(f"pip download failed for {list(reqs)}:\n"
                                 f"{(proc.stdout + proc.stderr)[-2000:]}")


def _move_into_place(tmp: Path, house: Path) -> None:
    """Rename the completed download `tmp` to `house` (clearing an incomplete one first); a house another
    process completed first is kept."""
    if house.exists() and not (house / COMPLETE).exists():
        shutil.rmtree(house, ignore_errors=True)  # debris of an interrupted rename
    try:
        tmp.rename(house)
    except OSError:  # another process finished the same house first
        if not (house / COMPLETE).exists():
            raise


def copy_wheels(house: Path, dest: Path) -> Path:
    """`dest` filled with the house's wheels (its `.complete` marker left out)."""
    shutil.copytree(house, dest, ignore=shutil.ignore_patterns(COMPLETE), dirs_exist_ok=True)
    return dest
