"""Version info recorded in run metadata (framework and environment package)."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _vf() -> tuple[str, str | None]:
    try:
        version = metadata.version("vf-sandbox")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    commit = None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5
        )
        commit = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return version, commit


@functools.lru_cache(maxsize=64)
def _env(env_id: str) -> str | None:
    for name in (env_id, env_id.replace("_", "-"), env_id.replace("-", "_")):
        try:
            return metadata.version(name)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


def version_info(env_id: str | None = None) -> dict[str, str | None]:
    vf_version, vf_commit = _vf()
    return {"vf_version": vf_version, "vf_commit": vf_commit, "env_version": _env(env_id) if env_id else None, "env_commit": None}
