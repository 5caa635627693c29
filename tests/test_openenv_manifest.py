"""OpenEnv project plumbing without Docker: openenv.yaml, the .build.json
manifest, contract detection from /schema, content hashing,
requirement resolution, and action parsing / tool conversion."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envs.openenv.actions import (
    ActionParseError,
    parse_action,
    single_string_field,
    strip_fences,
    tool_defs,
    tool_result_text,
)
from envs.openenv.build import content_hash, project_requirements
from envs.openenv.contract import (
    ContractMismatch,
    check_contract,
    app_source_path,
    contract_from_schema,
)
from envs.openenv.manifest import (
    BuildManifest,
    read_manifest,
    read_project_config,
    write_manifest,
)
from sandboxes.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "environments/openenv_echo/openenv_echo/echo_env"
ARITH = ROOT / "environments/openenv_mcp/openenv_mcp/arith_mcp"

ECHO_SCHEMA = {
    "action": {
        "properties": {"metadata": {"type": "object"}, "message": {"type": "string", "description": "Message"}},
        "required": ["message"], "title": "EchoEnvAction", "type": "object",
    },
    "observation": {}, "state": {},
}
MCP_SCHEMA = {
    "action": {
        "properties": {"metadata": {"type": "object"}, "type": {"const": "call_tool", "default": "call_tool"},
                       "tool_name": {"type": "string"}, "arguments": {"type": "object"}},
        "required": ["tool_name"], "title": "CallToolAction", "type": "object",
    },
}


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".build.json", "__pycache__"))
    return dst


# ---------------------------------------------------------------- openenv.yaml / manifest


def test_project_config_of_the_generated_template():
    cfg = read_project_config(ECHO)
    assert (cfg.name, cfg.app, cfg.port) == ("echo_env", "server.app:app", 8000)


def test_project_config_defaults_and_errors(tmp_path):
    (tmp_path / "p").mkdir()
    cfg = read_project_config(tmp_path / "p")
    assert cfg.name == "p" and cfg.port == 8000
    (tmp_path / "p" / "openenv.yaml").write_text("name: x\nport: notaport\n")
    with pytest.raises(ConfigError):
        read_project_config(tmp_path / "p")
    with pytest.raises(ConfigError):
        read_project_config(tmp_path / "missing")


def test_manifest_round_trip_and_errors(tmp_path):
    with pytest.raises(ConfigError, match="openenv build"):
        read_manifest(tmp_path)
    m = BuildManifest(environment_id="e", image="vf-openenv/e:abc", contract="gym",
                      start_command="cd /app/env && uvicorn server.app:app", content_hash="abc")
    path = write_manifest(tmp_path, m)
    data = json.loads(path.read_text())
    for key in ("schema_version", "environment_id", "image", "port", "app", "contract", "start_command"):
        assert key in data
    assert data["schema_version"] == 1 and data["port"] == 8000 and data["app"] == "server.app:app"
    assert read_manifest(tmp_path) == m
    path.write_text("{not json")
    with pytest.raises(ConfigError):
        read_manifest(tmp_path)
    path.write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(ConfigError, match="schema_version"):
        read_manifest(tmp_path)
    path.write_text(json.dumps({**data, "contract": "grpc"}))
    with pytest.raises(ConfigError):
        read_manifest(tmp_path)


# ---------------------------------------------------------------- contract


def test_missing_app_module_is_a_config_error(tmp_path):
    assert app_source_path(ECHO, "server.app:app") == ECHO / "server" / "app.py"
    with pytest.raises(ConfigError, match="not found"):
        app_source_path(tmp_path, "server.app:app")


def test_old_manifest_without_contract_source_reads_as_source():
    m = BuildManifest(environment_id="e", image="i:1", contract="gym", start_command="x")
    assert m.contract_source == "source"


def test_contract_from_schema():
    assert contract_from_schema(ECHO_SCHEMA) == "gym"
    assert contract_from_schema(MCP_SCHEMA) == "mcp"
    enum_only = {"action": {"properties": {"type": {"enum": ["list_tools", "call_tool"]}}}}
    assert contract_from_schema(enum_only) == "mcp"


def test_contract_mismatch_names_both_sides():
    assert check_contract("gym", ECHO_SCHEMA) == "gym"
    with pytest.raises(ContractMismatch) as ei:
        check_contract("mcp", ECHO_SCHEMA, where="echo_env")
    msg = str(ei.value)
    assert "'mcp'" in msg and "'gym'" in msg and "message" in msg and "echo_env" in msg
    assert isinstance(ei.value, UsageError)  # not retried as infra


# ---------------------------------------------------------------- hashing / requirements


def test_content_hash_tracks_content_not_caches(tmp_path):
    p = _copy(ECHO, tmp_path)
    h = content_hash(p)
    assert h == content_hash(p)
    (p / ".build.json").write_text("{}")
    (p / "__pycache__").mkdir()
    (p / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (p / ".venv").mkdir()
    (p / ".venv" / "f").write_text("x")
    assert content_hash(p) == h
    (p / "server" / "app.py").write_text((p / "server" / "app.py").read_text() + "\n# changed\n")
    assert content_hash(p) != h


def test_requirements_from_lock_and_pyproject(tmp_path):
    reqs = project_requirements(ECHO) if shutil.which("uv") else None
    if reqs is not None:
        assert any(r.startswith("openenv-core==") for r in reqs)
        assert all(not r.startswith("#") for r in reqs)
    p = tmp_path / "p"
    p.mkdir()
    (p / "pyproject.toml").write_text('[project]\nname="p"\ndependencies=["openenv-core[core]>=0.2", "numpy"]\n')
    assert project_requirements(p) == ["openenv-core[core]>=0.2", "numpy"]
    (p / "pyproject.toml").unlink()
    (p / "server").mkdir()
    (p / "server" / "requirements.txt").write_text("# c\nfastapi\n\nuvicorn\n")
    assert project_requirements(p) == ["fastapi", "uvicorn"]
    (p / "server" / "requirements.txt").unlink()
    assert project_requirements(p) == ["openenv-core[core]"]


# ---------------------------------------------------------------- actions


def test_strip_fences():
    assert strip_fences('```json\n{"a": 1}\n```') == '{"a": 1}'
    assert strip_fences('Sure:\n```\n{"a": 1}\n```\nbye') == '{"a": 1}'
    assert strip_fences("  plain ") == "plain"


def test_parse_action_single_string_field():
    schema = ECHO_SCHEMA["action"]
    assert single_string_field(schema) == "message"
    assert parse_action('```json\n{"message": "hi"}\n```', schema) == {"message": "hi"}
    assert parse_action("just text", schema) == {"message": "just text"}
    assert parse_action('{"other": 1}', schema) == {"message": '{"other": 1}'}


def test_parse_action_structured_schema():
    schema = {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}
    assert single_string_field(schema) is None
    assert parse_action('{"x": 1, "y": 2}', schema) == {"x": 1, "y": 2}
    with pytest.raises(ActionParseError, match=r"\['x', 'y'\]"):
        parse_action("move left", schema)
    with pytest.raises(ActionParseError):
        parse_action(None, schema)


def test_tools_and_results():
    defs = tool_defs([{"name": "add", "description": "Add.", "input_schema": {"type": "object",
                                                                             "properties": {"a": {"type": "integer"}}}}])
    assert defs[0].name == "add" and defs[0].parameters["properties"]["a"]["type"] == "integer"
    ok = {"tool_name": "add", "result": {"content": [{"type": "text", "text": "5"}], "data": 5}, "error": None}
    assert tool_result_text(ok) == "5"
    assert tool_result_text({"result": {"content": [], "data": {"k": 1}}}) == '{"k": 1}'
    err = {"error": {"error_type": "tool_not_found", "message": "no such tool"}}
    assert "tool_not_found" in tool_result_text(err) and "no such tool" in tool_result_text(err)


def test_committed_template_is_what_openenv_init_generates(tmp_path):
    """environments/openenv_echo/.../echo_env is `openenv init echo_env` output, unmodified:
    regenerate it with the installed openenv-core and compare (the README's front matter
    has random emoji/colours; uv.lock is resolved against the index at generation time)."""
    import os
    import subprocess
    import sys

    cli = Path(sys.executable).with_name("openenv")
    if not cli.exists():
        pytest.fail("openenv-core's CLI is missing: install the 'openenv' extra")
    subprocess.run([str(cli), "init", "echo_env"], cwd=tmp_path, check=True, capture_output=True,
                   env=dict(os.environ, UV_OFFLINE="1"), timeout=120)
    fresh = tmp_path / "echo_env"
    skip = {"uv.lock", ".build.json"}
    ours = {p.relative_to(ECHO) for p in ECHO.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and p.name not in skip}
    theirs = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file() and "__pycache__" not in p.parts
              and p.name not in skip}  # bytecode caches are not part of a template
    assert ours == theirs
    for rel in ours:
        a, b = (ECHO / rel).read_text(), (fresh / rel).read_text()
        if rel.name == "README.md":  # drop the YAML front matter
            a, b = a.split("---", 2)[2], b.split("---", 2)[2]
        assert a == b, f"{rel} differs from `openenv init` output"
