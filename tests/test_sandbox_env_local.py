"""SandboxEnv and PythonEnv are backend-neutral: the same rollouts on the
`local` backend (no Docker), chosen by name through `backend=`."""

from __future__ import annotations

import pytest

import envs as vf
from testmodel.model_server import tool_script
from sandboxes.errors import ConfigError
from test_sandbox_env import dataset, run_env, tool_messages


async def test_bash_tool_on_local_backend():
    env = vf.SandboxEnv(dataset=dataset(), backend="local", timeout_per_command_seconds=2, max_turns=5)
    policy = tool_script([("bash", {"command": "cd /tmp && X=1"}), ("bash", {"command": "pwd; echo $X; sleep 30"}),
                          ("bash", {"command": "echo $X"})])
    rows = await run_env(env, policy)
    outs = tool_messages(rows[0])
    assert outs[1].startswith("/tmp\n1\n") and "interrupted" in outs[1]
    assert outs[2] == "1"
    assert env.active_sandboxes == set()


async def test_python_tool_on_local_backend():
    env = vf.PythonEnv(dataset=dataset(), backend="local", pip_install_packages="", max_turns=5)
    rows = await run_env(env, tool_script([("python", {"code": "a = 2"}), ("python", {"code": "a * 21"})]))
    assert tool_messages(rows[0]) == ["(no output)", "Out[2]: 42"]


async def test_sandbox_settings_cannot_change_under_a_started_pool():
    """The warm pool's sandboxes are made from the spec at its start: a later change
    would be accepted and not applied, so it is refused (setting the same value is fine)."""
    env = vf.SandboxEnv(dataset=dataset(), backend="local", pool_size=1)
    try:
        env.set_memory_gb(1.5)  # before the pool: applied
        await env._get_pool(env.sandbox_spec)
        with pytest.raises(ConfigError, match="after the warm pool was started"):
            env.set_memory_gb(3)
        with pytest.raises(ConfigError, match="after the warm pool was started"):
            env.set_isolation("gvisor")
        env.set_memory_gb(1.5)
        assert env.sandbox_spec.memory_gb == 1.5
    finally:
        await env.teardown()
