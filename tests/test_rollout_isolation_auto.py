"""`rollout_isolation="auto"`, SandboxEnv's default (real Docker): a cell per
rollout where the backend offers cells for the env's spec, else a container
per rollout — decided once, recorded, and never weaker than asked: what a
cell cannot give (network, gVisor's memory limits, an image without python3)
gets a container, an explicit setting is obeyed, and nothing is left behind."""

from __future__ import annotations

import pytest

import envs as vf
from conftest import require_gvisor
from testmodel.model_server import tool_script
from sandboxes import ConfigError
from test_docker import nopython_image  # noqa: F401 - fixture
from test_sandbox_env import bash_env, containers_with, run_env, tool_messages, unique_labels, wait_gone

pytestmark = pytest.mark.docker

# what a rollout sees of its own sandbox: private /tmp, its own PID namespace (bash is PID <= 3
# in a cell; a container's PID 1 is its start command), no capability
PROBE = tool_script([("bash", {"command": "echo x > /tmp/mine; ls /tmp | wc -l; grep CapEff /proc/self/status"})])


async def test_default_is_auto_and_gives_each_rollout_a_cell_on_docker():
    labels = unique_labels()
    env = bash_env(labels, n=6)
    assert env.rollout_isolation == "auto" and env.rollout_isolation_in_use() == "auto"  # not decided yet
    rows = await run_env(env, PROBE, n=6, concurrency=3)
    assert env.rollout_isolation_in_use() == "namespace"
    for r in rows:
        assert r["error"] is None, r["error"]
        count, caps = tool_messages(r)[0].split("\n")[:2]
        assert count.strip() == "1", tool_messages(r)  # only its own file: /tmp is private per rollout
        assert caps.split()[-1] == "0000000000000000"
    assert wait_gone(labels) == []  # the cell host went with the env


async def test_auto_runs_one_host_container_for_the_whole_run():
    """Cells come from one pooled host container, not a container per rollout."""
    labels = unique_labels()
    env = bash_env(labels, n=4)
    env.set_concurrency(2)
    try:
        assert await env.warm_up(2) == 4  # two ready cells per running rollout
        assert len(containers_with(labels)) == 1
    finally:
        await env.teardown()
    assert wait_gone(labels) == []


@pytest.mark.parametrize("settings, why", [
    ({"network": True}, "network"),
    ({"isolation": "gvisor"}, "gvisor"),
    ({"rollout_isolation": "container"}, "explicit"),
])
async def test_auto_gives_a_container_where_a_cell_would_be_weaker_or_was_not_asked(settings, why):
    labels = unique_labels()
    env = bash_env(labels, n=2, **settings)
    if why == "gvisor":
        require_gvisor()
    policy = tool_script([("bash", {"command": "echo ok"})])
    rows = await run_env(env, policy, n=2, concurrency=2)
    assert [tool_messages(r)[0].strip() for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    assert env.rollout_isolation_in_use() == "container"
    assert wait_gone(labels) == []


async def test_auto_falls_back_to_a_container_for_an_image_without_python(nopython_image):  # noqa: F811
    labels = unique_labels()
    env = bash_env(labels, n=1, docker_image=nopython_image)
    rows = await run_env(env, tool_script([("bash", {"command": "echo plain"})]), n=1, concurrency=1)
    assert rows[0]["error"] is None and tool_messages(rows[0])[0].strip() == "plain"
    assert env.rollout_isolation_in_use() == "container"
    assert wait_gone(labels) == []


async def test_explicit_namespace_on_an_image_without_python_is_a_clear_usage_error(nopython_image):  # noqa: F811
    from backends.docker import DockerBackend
    from sandboxes import SandboxSpec

    backend = DockerBackend()
    try:
        with pytest.raises(ConfigError, match="python3"):
            await backend.create(SandboxSpec(image=nopython_image, rollout_isolation="namespace",
                                             labels=unique_labels(), timeout_minutes=5))
    finally:
        await backend.close()


def test_auto_is_settable_like_any_sandbox_setting_and_checked():
    env = bash_env(unique_labels(), rollout_isolation="container")
    env.set_kwargs(rollout_isolation="auto")
    assert env.rollout_isolation == "auto" and env.sandbox_spec.rollout_isolation == "container"
    env.set_kwargs(rollout_isolation="namespace")
    assert env.sandbox_spec.rollout_isolation == "namespace"
    with pytest.raises(ConfigError, match="rollout_isolation"):
        env.set_kwargs(rollout_isolation="vm")
    with pytest.raises(ConfigError, match="rollout_isolation"):
        vf.SandboxEnv(rollout_isolation="vm")


@pytest.mark.parametrize("extra, want", [((), "namespace"), (("-x", "rollout_isolation=container"), "container")])
def test_metadata_records_what_each_rollout_ran_in(tmp_path, extra, want):
    """`vf-sandbox eval` of the bash example: metadata.json says what a rollout got."""
    from test_sandbox_env_e2e import bash_files_policy, eval_four_solved

    rows, meta, label = eval_four_solved(tmp_path, "bash-files", bash_files_policy(), *extra)
    assert meta["rollout_isolation"] == want and meta["isolation"] == "runc"
    assert wait_gone({"vf-test-case": label}) == []
