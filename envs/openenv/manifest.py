"""The OpenEnv project's `.build.json` manifest and its `openenv.yaml` config.

`vf-sandbox openenv build PROJECT` writes `PROJECT/.build.json`;
`OpenEnvEnv` reads it to know which image to run, on which port, with which
start command, and which contract (gym or mcp) to expect.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandboxes.errors import ConfigError

MANIFEST_NAME = ".build.json"
SCHEMA_VERSION = 1
DEFAULT_PORT = 8000
DEFAULT_APP = "server.app:app"

Contract = Literal["gym", "mcp"]


class ProjectConfig(BaseModel):
    """The fields of `openenv.yaml` that matter here (`openenv init` writes them)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="Environment name; becomes the environment_id.")
    app: str = Field(DEFAULT_APP, description="ASGI app as module:attribute, relative to the project root.")
    port: int = Field(DEFAULT_PORT, gt=0, lt=65536, description="Port the server listens on.")


class BuildManifest(BaseModel):
    """`.build.json`: what `openenv build` produced for one project."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = Field(SCHEMA_VERSION, description="Format version of this file.")
    environment_id: str = Field(description="Project name from openenv.yaml (or the directory name).")
    image: str = Field(description="Local image name:tag holding the project and its dependencies.")
    port: int = Field(DEFAULT_PORT, description="Port the server listens on inside the sandbox.")
    app: str = Field(DEFAULT_APP, description="ASGI app as module:attribute.")
    contract: Contract = Field(description="gym (reset/step with the env's own action) or mcp (call_tool actions).")
    contract_source: Literal["schema", "source"] = Field(
        "source", description="schema: read from the running server's /schema at build time; source: an older "
        "manifest's guess from the app's source (rebuilt on the next build).")
    start_command: str = Field(description="Shell command that starts the server inside the image.")
    image_status: str = Field("built", description="built: the image exists locally.")
    content_hash: str = Field("", description="Hash of the project's files the image was built from.")
    deps_image: str = Field("", description="The dependency layer image the project image is based on.")


def _parse_simple_yaml(text: str) -> dict[str, str]:
    """Top-level `key: value` pairs (all openenv.yaml uses) when PyYAML is absent."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_][\w-]*)\s*:\s*(.*?)\s*(#.*)?$", line)
        if m and m.group(2):
            out[m.group(1)] = m.group(2).strip("'\"")
    return out


def read_project_config(project: str | Path) -> ProjectConfig:
    """The project's openenv.yaml (name defaults to the directory name when the file is absent)."""
    root = Path(project)
    if not root.is_dir():
        raise ConfigError(f"OpenEnv project {str(root)!r} is not a directory")
    path = root / "openenv.yaml"
    data: dict = {}
    if path.exists():
        text = path.read_text()
        try:
            import yaml

            data = yaml.safe_load(text) or {}
        except ImportError:
            data = _parse_simple_yaml(text)
        except Exception as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    data.setdefault("name", root.resolve().name)
    try:
        return ProjectConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def manifest_path(project: str | Path) -> Path:
    return Path(project) / MANIFEST_NAME


def read_manifest(project: str | Path) -> BuildManifest:
    """Read PROJECT/.build.json. Raises ConfigError when it is missing or malformed."""
    path = manifest_path(project)
    if not path.exists():
        raise ConfigError(f"{path} not found: run `vf-sandbox openenv build {project}` first")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{path}: schema_version {data.get('schema_version')!r} is not {SCHEMA_VERSION}")
    try:
        return BuildManifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def write_manifest(project: str | Path, manifest: BuildManifest) -> Path:
    path = manifest_path(project)
    path.write_text(json.dumps(manifest.model_dump(), indent=2) + "\n")
    return path


def default_start_command(app: str, port: int) -> str:
    """The server's start command inside an image built by `openenv build`."""
    return f"cd /app/env && exec /app/.venv/bin/uvicorn {app} --host 0.0.0.0 --port {port}"
