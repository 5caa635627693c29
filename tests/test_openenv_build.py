"""`openenv build` decides gym vs mcp from what the built server really serves: it
starts the server once in a sandbox (real Docker) and reads `/schema`. An MCP app
written with an aliased `CallToolAction` import, a subclass of it, or built in
another module is recorded as mcp (a source scan called each of these gym); a
server that cannot start fails the build with its log tail and leaves no sandbox."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envs.openenv.build import build_project
from envs.openenv.probe import PROBE_LABEL
from sandboxes.errors import ServerStartError, is_infra_error

# Every test that runs `openenv build`'s probe (a sandbox labelled only with the project's
# environment id, shared by every copy of the echo/arith projects) is in one xdist group, so
# one worker runs them in turn: test_server_that_cannot_start_fails_the_build_with_its_log_tail
# asserts that no probe sandbox is left, which another worker's probe would contradict.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900), pytest.mark.xdist_group("openenv-probe")]

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "environments/openenv_echo/openenv_echo/echo_env"
ARITH = ROOT / "environments/openenv_mcp/openenv_mcp/arith_mcp"
IMPORT = "from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation"
CALL = "create_app(ArithEnvironment, CallToolAction, CallToolObservation"


def _aliased(proj: Path) -> None:
    app = proj / "server" / "app.py"
    text = app.read_text()
    assert IMPORT in text and CALL in text
    app.write_text(text.replace(IMPORT, IMPORT.replace("CallToolAction,", "CallToolAction as ToolStep,"))
                   .replace(CALL, CALL.replace("CallToolAction", "ToolStep")))


def _subclass(proj: Path) -> None:
    app = proj / "server" / "app.py"
    text = app.read_text()
    app.write_text(text.replace(CALL, CALL.replace("CallToolAction", "ArithAction"))
                   .replace("app = create_app(", 'class ArithAction(CallToolAction):\n    """Our own action name."""\n\n\napp = create_app(', 1))


def _other_module(proj: Path) -> None:
    app = proj / "server" / "app.py"
    (proj / "server" / "factory.py").write_text(app.read_text())
    app.write_text('"""The app lives in factory.py."""\n\ntry:\n    from .factory import app\nexcept ImportError:\n'
                   "    from server.factory import app\n")


def _containers(label: str) -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True,
                          check=True).stdout.split()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".build.json", "__pycache__"))
    return dst


@pytest.mark.parametrize("variant", [_aliased, _subclass, _other_module], ids=["aliased-import", "subclass", "app-in-another-module"])
def test_mcp_variants_are_recorded_as_mcp(tmp_path, variant):
    from conftest import require_docker

    require_docker()
    proj = _copy(ARITH, tmp_path / "arith_mcp")
    variant(proj)
    assert "CallToolAction, CallToolObservation" not in (proj / "server" / "app.py").read_text() or variant is _subclass
    res = build_project(proj)
    try:
        assert res.manifest.contract == "mcp" and res.manifest.contract_source == "schema"
        assert _containers(f"{PROBE_LABEL}={res.manifest.environment_id}") == []
    finally:
        if res.built:
            subprocess.run(["docker", "rmi", "-f", res.manifest.image], capture_output=True)


def test_gym_project_is_recorded_as_gym_and_an_unchanged_project_is_not_probed_again(tmp_path):
    from conftest import require_docker

    require_docker()
    proj = _copy(ECHO, tmp_path / "echo_env")
    first = build_project(proj)
    assert first.manifest.contract == "gym" and first.manifest.contract_source == "schema"
    again = build_project(proj, log=lambda s: pytest.fail(f"an up-to-date build did something: {s}"))
    assert again.manifest == first.manifest and not again.built


def test_server_that_cannot_start_fails_the_build_with_its_log_tail(tmp_path):
    from conftest import require_docker

    require_docker()
    proj = _copy(ECHO, tmp_path / "broken_echo")
    app = proj / "server" / "app.py"
    app.write_text(app.read_text() + "\nraise RuntimeError('boom at import: vf-marker-5519')\n")
    with pytest.raises(ServerStartError) as err:
        build_project(proj)
    assert "vf-marker-5519" in str(err.value) and "/schema" in str(err.value) and is_infra_error(err.value)
    assert not (proj / ".build.json").exists()
    assert _containers(PROBE_LABEL) == []
