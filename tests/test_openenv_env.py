"""OpenEnvEnv end to end on real Docker, against real OpenEnv servers: the
project `openenv init` generates (gym) and an MCP project on openenv-core's
MCPEnvironment — in process and through `vf-sandbox eval` with the local
model server. Also: a server that never starts (ServerStartError with its
log tail), a contract mismatch, and the sandbox deleted in every case.

The first run builds the images (wheel download ~20 s when the wheelhouse is
empty, dependency image ~1 min); later runs find them (content-hashed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from envs.clients.openai_clients import OpenAIChatCompletionsClient
from envs.openenv.build import ensure_built
from envs.openenv.contract import ContractMismatch
from envs.openenv.env import OpenEnvEnv
from envs.openenv.manifest import read_manifest, write_manifest
from testmodel.model_server import ModelServer, Reply, fixed
from sandboxes.errors import ConfigError, ServerStartError, is_infra_error

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]  # the first test may build the images
# The tests that run `openenv build`'s probe (test_openenv_build.py says why they share a worker)
OPENENV_PROBE = pytest.mark.xdist_group("openenv-probe")

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "environments/openenv_echo/openenv_echo/echo_env"
ARITH = ROOT / "environments/openenv_mcp/openenv_mcp/arith_mcp"
VF = str(Path(sys.executable).with_name("vf-sandbox"))
LABEL = "vf-openenv-test"


@pytest.fixture(scope="session")
def built():
    """Both real projects built (no-op when their images exist)."""
    from conftest import require_docker

    require_docker()
    return {"echo": ensure_built(ECHO), "mcp": ensure_built(ARITH)}


@pytest.fixture
def run_label():
    """A label unique to the test; asserts at the end that no container carries it."""
    value = uuid.uuid4().hex[:12]
    yield value
    assert _wait_no_containers(value), f"sandboxes left behind: {_containers(value)}"


def _containers(value: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}={value}"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def _wait_no_containers(value: str, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not _containers(value):
            return True
        time.sleep(0.2)
    return False


def _client(srv: ModelServer) -> OpenAIChatCompletionsClient:
    return OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))


def echo_render(observation, context, reward=None):
    if context == "reset":
        return [{"role": "user", "content": "Say something: " + observation.get("echoed_message", "")}]
    return f"Echo: {observation.get('echoed_message')} (reward {reward})"


def mcp_policy(req):
    """The openenv-mcp environment's own scripted solver (multiply, add, submit;
    off by one for the model named "wrong")."""
    from openenv_mcp import scripted_policy

    return scripted_policy()(req)


async def _rollout(env: OpenEnvEnv, srv: ModelServer, model: str = "scripted"):
    rows = env._eval_rows_all()
    inp = env._to_input(rows[0])
    try:
        return await env.rollout(inp, _client(srv), model)
    finally:
        await env.teardown()


# ------------------------------------------------------------------ gym


async def test_gym_template_rollout(built, run_label):
    replies = iter(['```json\n{"message": "hello world"}\n```', "plain text", '{"message": 123}', "abc", "x"])
    async with ModelServer(lambda req: Reply(content=next(replies))) as srv:
        env = OpenEnvEnv(ECHO, prompt_renderer=echo_render, max_turns=5, labels={LABEL: run_label})
        assert env.manifest.contract == "gym"
        state = await _rollout(env, srv)
    assert state.get("error") is None, state.get("error")
    rewards = [step["reward"] for step in state["trajectory"]]
    # 1: fenced JSON → message "hello world"; 2: raw text (single required string field);
    # 3: the server rejects a non-string message (the model is told, reward 0, the episode goes on);
    # 4: "abc" again in the same session.
    assert rewards[:4] == [pytest.approx(1.1), pytest.approx(1.0), 0.0, pytest.approx(0.3)]
    assert state["openenv_invalid_actions"] == 1
    assert state["stop_condition"] == "max_turns_reached"
    text = json.dumps(state["completion"])
    assert "Echo: hello world (reward 1.1)" in text and "Invalid action" in text and "valid string" in text
    assert state["prompt"][0]["content"].startswith("Say something: Echo Env environment ready!")
    assert "openenv_sandbox" not in state  # cleanup ran


async def test_gym_default_rubric_is_sum_of_step_rewards(built, run_label):
    async with ModelServer(fixed('{"message": "abc"}')) as srv:
        env = OpenEnvEnv(ECHO, prompt_renderer=echo_render, max_turns=4, labels={LABEL: run_label})
        out = await env.evaluate(_client(srv), "scripted", num_examples=1, rollouts_per_example=1)
        await env.teardown()
    [row] = out["outputs"]
    assert row["error"] is None
    assert row["reward"] == pytest.approx(0.9)  # 3 steps × 0.3 (the 4th turn ends the rollout)
    assert row["metrics"]["sum_step_rewards"] == pytest.approx(0.9)


async def test_large_unicode_observation_through_the_docker_agent(built, run_label):
    """A ~4 MB observation (beyond the agent's 1 MiB output bound) crosses the
    command channel in chunks, in one stateful /ws session."""
    from envs.openenv.forwarder import Forwarder
    from envs.openenv.session import OpenEnvSession
    from sandboxes import SandboxSpec
    from sandboxes.registry import get_backend

    m = built["echo"]
    backend = get_backend("docker")
    try:
        async with await backend.create(SandboxSpec(image=m.image, labels={LABEL: run_label}, memory_gb=2)) as sb:
            await sb.start_process(["/bin/sh", "-c", f"({m.start_command}) >/tmp/server.log 2>&1"])
            fwd = await Forwarder.start_in_sandbox(sb, m.port)
            session = OpenEnvSession(fwd)
            await session.wait_healthy(120)
            await session.reset(seed=1)
            big = "ü✓ñ" * 600_000 + "end"
            payload = await session.step({"message": big})
            assert payload["observation"]["echoed_message"] == big
            assert payload["observation"]["message_length"] == len(big)
            assert (await session.state())["step_count"] == 1
            await session.close()
            await fwd.close()
    finally:
        await backend.close()


# ------------------------------------------------------------------ mcp


async def test_mcp_rollout_tools_and_done(built, run_label):
    async with ModelServer(mcp_policy) as srv:
        env = OpenEnvEnv(ARITH, prompt_renderer=lambda obs, context: obs["task"], labels={LABEL: run_label})
        assert env.manifest.contract == "mcp"
        out = await env.evaluate(_client(srv), "scripted", num_examples=2, rollouts_per_example=1)
        out_wrong = await env.evaluate(_client(srv), "wrong", num_examples=1, rollouts_per_example=1)
        await env.teardown()
        tool_names = sorted(t["name"] for t in srv.requests[0].tools)
    assert tool_names == ["add", "multiply", "submit"]
    for row in out["outputs"]:
        assert row["error"] is None
        assert row["reward"] == 1.0 and row["stop_condition"] == "openenv_done"
        tools_msgs = [m for m in row["completion"] if m["role"] == "tool"]
        assert tools_msgs[-1]["content"] == "correct"
    assert out_wrong["outputs"][0]["reward"] == 0.0
    assert out_wrong["outputs"][0]["stop_condition"] == "openenv_done"


async def test_mcp_reply_without_tool_calls_stops(built, run_label):
    async with ModelServer(fixed("I would rather not.")) as srv:
        env = OpenEnvEnv(ARITH, prompt_renderer=lambda obs, context: obs["task"], labels={LABEL: run_label})
        state = await _rollout(env, srv)
    assert state.get("error") is None
    assert state["stop_condition"] == "no_tools_called"
    assert len(state["trajectory"]) == 1


# ------------------------------------------------------------------ failures


BREAK_VAR = "VF_TEST_BREAK_SERVER"


@pytest.fixture(scope="module")
def breakable(tmp_path_factory):
    """The echo project whose server dies at import when BREAK_VAR is set in its sandbox
    (built once; the build's probe runs without it, so the build succeeds)."""
    proj = tmp_path_factory.mktemp("breakable") / "breakable_echo"
    shutil.copytree(ECHO, proj, ignore=shutil.ignore_patterns(".build.json", "__pycache__"))
    app = proj / "server" / "app.py"
    app.write_text(app.read_text() + f"\nimport os\nif os.environ.get({BREAK_VAR!r}):\n"
                   "    raise RuntimeError('boom at import: vf-marker-7731')\n")
    m = ensure_built(proj)
    yield proj
    subprocess.run(["docker", "rmi", "-f", m.image], capture_output=True)


def _broken_spec(env: OpenEnvEnv):
    return env.sandbox_spec.model_copy(update={"environment_vars": {**env.sandbox_spec.environment_vars, BREAK_VAR: "1"}})


@OPENENV_PROBE
async def test_server_that_never_starts_is_infra_error_with_log_tail(breakable, run_label):
    async with ModelServer(fixed("{}")) as srv:
        env = OpenEnvEnv(breakable, prompt_renderer=echo_render, startup_timeout=90, start_attempts=2,
                         labels={LABEL: run_label})
        env.sandbox_spec = _broken_spec(env)
        t0 = time.monotonic()
        state = await _rollout(env, srv)
    err = state.get("error")
    assert isinstance(err, ServerStartError) and is_infra_error(err)
    assert "vf-marker-7731" in str(err)  # the server's own traceback, from its log tail
    assert len(env.server_gate.starts) == 2  # retried once on a fresh sandbox, then given up
    assert time.monotonic() - t0 < 120  # the dead process is noticed, not waited out (90 s each)
    assert srv.count == 0  # the model was never asked


@OPENENV_PROBE
async def test_a_failed_server_start_is_retried_on_a_fresh_sandbox(breakable, run_label):
    """The first sandbox's server dies; the start is retried on a new sandbox (the
    first one deleted) and the rollout completes normally."""
    from backends.docker import DockerBackend

    class FirstStartBreaks(DockerBackend):
        specs: list = []

        async def create(self, spec, **kw):
            self.specs.append(spec)
            if len(self.specs) == 1:
                spec = spec.model_copy(update={"environment_vars": {**spec.environment_vars, BREAK_VAR: "1"}})
            return await super().create(spec, **kw)

    backend = FirstStartBreaks()
    replies = iter(['{"message": "hello"}'] * 3)
    try:
        async with ModelServer(lambda req: Reply(content=next(replies))) as srv:
            env = OpenEnvEnv(breakable, prompt_renderer=echo_render, max_turns=1, backend=backend,
                             labels={LABEL: run_label})
            state = await _rollout(env, srv)
        assert state.get("error") is None, state.get("error")
        assert len(backend.specs) == 2 and len(env.server_gate.starts) == 2
        assert state["prompt"][0]["content"].startswith("Say something: Echo Env environment ready!")  # reset served
    finally:
        await backend.close()


async def test_server_starts_are_admitted_a_few_at_a_time(built, run_label):
    """Six rollouts at once with max_concurrent_starts=2: never more than two servers
    starting at the same time, and every rollout completes."""
    import asyncio

    async with ModelServer(lambda req: Reply(content='{"message": "hi"}')) as srv:
        env = OpenEnvEnv(ECHO, prompt_renderer=echo_render, max_turns=1, max_concurrent_starts=2,
                         labels={LABEL: run_label})
        rows = env._eval_rows_all()[:6]
        try:
            states = await asyncio.gather(*(env.rollout(env._to_input(r), _client(srv), "m") for r in rows))
        finally:
            await env.teardown()
    assert [s.get("error") for s in states] == [None] * 6
    assert all(s["prompt"][0]["content"].startswith("Say something: Echo Env") for s in states)
    assert env.server_gate.peak == 2 and len(env.server_gate.starts) == 6


@OPENENV_PROBE
async def test_contract_mismatch_names_both_sides(built, run_label, tmp_path):
    proj = tmp_path / "echo_copy"
    shutil.copytree(ECHO, proj, ignore=shutil.ignore_patterns("__pycache__"))
    ensure_built(proj)
    m = read_manifest(proj)
    write_manifest(proj, m.model_copy(update={"contract": "mcp"}))
    async with ModelServer(fixed("{}")) as srv:
        env = OpenEnvEnv(proj, prompt_renderer=echo_render, auto_build=False, labels={LABEL: run_label})
        state = await _rollout(env, srv)
    err = state.get("error")
    assert isinstance(err, ContractMismatch) and not is_infra_error(err)
    assert "'mcp'" in str(err) and "'gym'" in str(err)


async def test_publish_port_refused_where_the_backend_has_none(built, run_label):
    async with ModelServer(fixed("{}")) as srv:
        env = OpenEnvEnv(ECHO, prompt_renderer=echo_render, publish_port=True, labels={LABEL: run_label})
        state = await _rollout(env, srv)
    err = state.get("error")
    assert isinstance(err, ConfigError) and "published ports" in str(err)


# ------------------------------------------------------------------ vf-sandbox eval


def _eval(tmp_path: Path, srv_url: str, env_id: str, *extra: str, label: str) -> dict:
    out = tmp_path / "out"
    env = dict(os.environ, VF_RUNS_DB=str(tmp_path / "runs.db"), FAKE_KEY="x")
    p = subprocess.run(
        [VF, "eval", env_id, "-m", "scripted", "-b", srv_url, "-k", "FAKE_KEY", "-d", "-s", "-o", str(out),
         "-n", "2", "-r", "1", "-a", json.dumps({"labels": {LABEL: label}}), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [results] = list(out.rglob("results.jsonl"))
    return {"rows": [json.loads(line) for line in results.read_text().splitlines() if line.strip()],
            "stdout": p.stdout}


def test_vf_sandbox_eval_openenv_echo(built, run_label, tmp_path):
    with ModelServer(fixed('{"message": "hi"}')).run_in_thread() as srv:
        res = _eval(tmp_path, srv.base_url, "openenv-echo", label=run_label)
    rows = res["rows"]
    assert len(rows) == 2
    for row in rows:
        assert row.get("error") is None, row.get("error")
        assert row["reward"] == pytest.approx(0.4)  # max_turns=3: two steps × 0.2


def test_vf_sandbox_eval_openenv_mcp(built, run_label, tmp_path):
    with ModelServer(mcp_policy).run_in_thread() as srv:
        res = _eval(tmp_path, srv.base_url, "openenv-mcp", label=run_label)
    rows = res["rows"]
    assert len(rows) == 2
    for row in rows:
        assert row.get("error") is None, row.get("error")
        assert row["reward"] == 1.0


# ------------------------------------------------------------------ vf-sandbox openenv build


def _build_cli(project: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run([VF, "openenv", "build", str(project)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p, time.monotonic() - t0


@OPENENV_PROBE
def test_build_cli_is_content_hashed(built, tmp_path):
    proj = tmp_path / "echo_env"
    shutil.copytree(ECHO, proj, ignore=shutil.ignore_patterns(".build.json", "__pycache__"))
    p, _ = _build_cli(proj)  # same bytes as the committed template: its image already exists
    m = json.loads((proj / ".build.json").read_text())
    assert m["image"] == built["echo"].image and m["contract"] == "gym" and m["schema_version"] == 1
    assert m["start_command"].startswith("cd /app/env") and m["port"] == 8000
    app = proj / "server" / "app.py"
    app.write_text(app.read_text() + "\n# an edit\n")
    p, secs = _build_cli(proj)
    new = json.loads((proj / ".build.json").read_text())
    try:
        assert "built" in p.stdout and new["image"] != m["image"]
        assert new["deps_image"] == m["deps_image"]  # dependency layer reused
        assert secs < 60, secs
        p, secs = _build_cli(proj)
        assert "up to date" in p.stdout and secs < 10, (p.stdout, secs)
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", new["image"], "cat",
                              "/app/env/server/app.py"], capture_output=True, text=True, check=True).stdout
        assert out.endswith("# an edit\n")
    finally:
        subprocess.run(["docker", "rmi", "-f", new["image"]], capture_output=True)


def test_build_cli_reports_a_broken_project(tmp_path):
    proj = tmp_path / "nothing_here"
    proj.mkdir()
    p = subprocess.run([VF, "openenv", "build", str(proj)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "error:" in p.stderr and "not found" in p.stderr
