"""The four envs that give rollouts sandboxes (SandboxEnv / PythonEnv, the v1
harness, OpenEnvEnv, SWEDebugEnv) obtain them through the one lifecycle,
`sandboxes.rollouts.RolloutSandboxes`:

* structurally: no env module makes a backend (`get_backend`), a warm pool
  (`SandboxPool`) or a sandbox (`<backend>.create`) itself;
* in a rollout of each: its sandbox is one the env's own lifecycle handed out
  (`RolloutSandboxes.acquire`), nothing is left held after teardown;
* `set_backend` behaves one way everywhere: applied before the first sandbox,
  refused with a different backend after it (ConfigError).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sandboxes.errors import ConfigError
from sandboxes.rollouts import RolloutSandboxes
from sandboxes.spec import SandboxSpec

ROOT = Path(__file__).resolve().parents[1]
ENV_MODULES = [ROOT / "envs/sandbox_env.py", ROOT / "envs/python_env.py", *sorted((ROOT / "envs/v1").glob("*.py")),
               ROOT / "envs/openenv/env.py", ROOT / "swe_debug/env.py"]


def _own_sandbox_making(path: Path) -> list[str]:
    """Calls in `path` that make a backend, a pool or a sandbox without the lifecycle."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("get_backend", "SandboxPool"):
            found.append(f"{path.name}:{node.lineno} {name}(...)")
        elif name == "create" and isinstance(func, ast.Attribute) and "backend" in ast.unparse(func.value).lower():
            found.append(f"{path.name}:{node.lineno} {ast.unparse(func)}(...)")
    return found


def test_no_env_module_makes_backends_pools_or_sandboxes_itself():
    assert all(p.exists() for p in ENV_MODULES)
    assert [hit for p in ENV_MODULES for hit in _own_sandbox_making(p)] == []


@pytest.fixture
def handed(monkeypatch) -> list[tuple[RolloutSandboxes, str]]:
    """(lifecycle, sandbox id) of every sandbox a RolloutSandboxes handed out."""
    out: list[tuple[RolloutSandboxes, str]] = []
    acquire = RolloutSandboxes.acquire

    async def spy(self, *args, **kwargs):
        sandbox = await acquire(self, *args, **kwargs)
        out.append((self, sandbox.id))
        return sandbox

    monkeypatch.setattr(RolloutSandboxes, "acquire", spy)
    return out


def _from(handed: list[tuple[RolloutSandboxes, str]], lifecycle: RolloutSandboxes) -> list[str]:
    return [sid for lc, sid in handed if lc is lifecycle]


# ---------------------------------------------------------------- set_backend, one way


async def test_set_backend_applies_before_the_first_sandbox_and_is_refused_after():
    lc = RolloutSandboxes(SandboxSpec(), "local", pool_size=0)
    lc.set_backend("docker", {})
    lc.set_backend("local", {})  # nothing made yet: applied
    sandbox = await lc.acquire()
    try:
        lc.set_backend("local", {})  # the same one: fine
        with pytest.raises(ConfigError, match="after the first sandbox"):
            lc.set_backend("docker", {})
        assert lc.held == [sandbox.id]
    finally:
        await lc.close()
    assert lc.held == []


async def test_every_env_refuses_another_backend_after_its_first_sandbox(tmp_path):
    import envs as vf
    from envs.v1 import Harness
    from swe_debug.env import SWEDebugEnv
    from swe_debug.taskset import SWETaskSet
    from test_sandbox_env import dataset

    made = [vf.SandboxEnv(dataset=dataset(), backend="local", pool_size=0),
            Harness(program={"command": ["true"]}, sandbox={"image": "python:3.11-slim"}),
            SWEDebugEnv(SWETaskSet([]), dataset=[{"prompt": [], "answer": ""}])]
    for env in made:
        env.set_backend("local", {})
        env.backend  # the backend of the first sandbox
        with pytest.raises(ConfigError, match="after the first sandbox"):
            env.set_backend("docker", {})
        assert isinstance(env.sandboxes, RolloutSandboxes)
        await (env.teardown())


# ---------------------------------------------------------------- a rollout of each env


async def test_sandbox_env_and_python_env_rollouts(handed):
    import envs as vf
    from testmodel.model_server import tool_script
    from test_sandbox_env import dataset, run_env

    env = vf.SandboxEnv(dataset=dataset(), backend="local", max_turns=3)
    await run_env(env, tool_script([("bash", {"command": "echo hi"})]))
    assert len(_from(handed, env.sandboxes)) == len(handed) >= 1
    assert env.sandboxes.held == [] and env.active_sandboxes == set()

    handed.clear()
    env = vf.PythonEnv(dataset=dataset(), backend="local", pip_install_packages="", max_turns=3)
    await run_env(env, tool_script([("python", {"code": "1 + 1"})]))
    assert len(_from(handed, env.sandboxes)) == len(handed) >= 1
    assert env.sandboxes.held == []


@pytest.mark.docker
async def test_v1_harness_rollout(handed, docker_backend, python_image):
    from openai import AsyncOpenAI

    from testmodel.model_server import ModelServer, compute
    from envs.v1 import Harness, Task

    async with ModelServer(compute()) as srv:
        harness = Harness(program={"command": ["true"]}, sandbox={"image": python_image, "pool_size": 1},
                          client=AsyncOpenAI(base_url=srv.base_url, api_key="x"), model="m")
        harness.set_backend(docker_backend)
        task = Task(prompt="hi").freeze()
        try:
            state = await harness.run(task)
            assert state["error"] is None, state["error"]
            assert _from(handed, harness.sandboxes) == [state.runtime["sandbox"].id]
            assert harness.sandboxes.pool is not None and harness.sandboxes.pool.stats["acquired"] == 1
            await harness.cleanup_group([task], [state])
            assert harness.sandboxes.held == []
        finally:
            await harness.teardown()


@pytest.mark.docker
async def test_openenv_env_rollout(handed):
    from conftest import require_docker

    require_docker()
    from envs.openenv.build import ensure_built
    from envs.openenv.env import OpenEnvEnv
    from testmodel.model_server import ModelServer, fixed
    from test_openenv_env import ECHO, _client, echo_render

    ensure_built(ECHO)
    async with ModelServer(fixed('{"message": "abc"}')) as srv:
        env = OpenEnvEnv(ECHO, prompt_renderer=echo_render, max_turns=1)
        inp = env._to_input(env._eval_rows_all()[0])
        try:
            state = await env.rollout(inp, _client(srv), "scripted")
            assert state.get("error") is None, state.get("error")
            assert _from(handed, env.sandboxes) == [state["sandbox_id"]] == [sid for _, sid in handed]
            assert env.sandboxes.held == []
        finally:
            await env.teardown()


@pytest.mark.docker
@pytest.mark.timeout(900)
async def test_swe_debug_env_rollout(handed, instances):
    from test_swe_docker import IDNA, _taskset

    from swe_debug.env import SWEDebugEnv

    env = SWEDebugEnv(_taskset(instances, [IDNA]))
    env.set_backend("docker")
    inp = env._to_input(env._eval_rows_all()[0])
    try:
        state = await env.rollout(inp, None, "none")  # no model: the gold patch is the debug step
    finally:
        await env.teardown()
    assert state["info"]["verdict"]["valid"] is True, state["info"]["verdict"]
    assert len(_from(handed, env.sandboxes)) == len(handed) == 1  # the gold run's one sandbox
    assert env.sandboxes.held == []


from test_swe_docker import examples, instances  # noqa: E402,F401  (session fixtures: images built once)
