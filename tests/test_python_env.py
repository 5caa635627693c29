"""PythonEnv on real Docker: the persistent interpreter through whole rollouts
(namespace across calls, Out[n], tracebacks, interrupt on timeout, a dead
worker restarted), the tool surface, packages baked into a cached image, and
a sandbox killed mid-rollout retried."""

from __future__ import annotations

import time

import pytest

import envs as vf
from testmodel.model_server import PolicyRequest, tool_script
from test_sandbox_env import dataset, run_env, tool_messages, unique_labels, wait_gone

pytestmark = pytest.mark.docker


def py_env(labels, **kw) -> vf.PythonEnv:
    kw.setdefault("timeout_per_command_seconds", 10)
    kw.setdefault("pip_install_packages", "")
    return vf.PythonEnv(dataset=dataset(kw.pop("n", 1)), labels=labels, max_turns=kw.pop("max_turns", 12), **kw)


def test_python_replaces_bash_unless_both_asked_for():
    env = vf.PythonEnv(dataset=dataset(), pip_install_packages="")
    assert [t.name for t in env.tool_defs] == ["python"]
    tool = env.tool_defs[0]
    assert tool.strict is True and tool.parameters["properties"].keys() == {"code"}
    assert tool.parameters["additionalProperties"] is False
    both = vf.PythonEnv(dataset=dataset(), pip_install_packages="", expose_bash=True)
    assert sorted(t.name for t in both.tool_defs) == ["bash", "python"]
    assert vf.PythonEnv(dataset=dataset()).pip_install_packages == ["numpy", "scipy", "sympy"]  # reference default


async def test_namespace_persists_output_and_tracebacks():
    labels = unique_labels()
    policy = tool_script([
        ("python", {"code": "import math\ndef sq(v):\n    return v * v\nvalues = [sq(i) for i in range(5)]"}),
        ("python", {"code": "print('sum', sum(values))\nimport sys\nprint('warn', file=sys.stderr)\nmath.sqrt(values[-1])"}),
        ("python", {"code": "undefined_name + 1"}),
        ("python", {"code": "values.append(100)\nlen(values)"}),
    ])
    rows = await run_env(py_env(labels), policy)
    row = rows[0]
    assert row["error"] is None, row["error"]
    outs = tool_messages(row)
    assert outs[0] == "(no output)"
    assert outs[1] == "sum 30\nstderr:\nwarn\nOut[2]: 4.0"
    assert outs[2].startswith("Traceback (most recent call last):") and "NameError" in outs[2]
    assert 'File "<cell-3>"' in outs[2] and "repl_worker" not in outs[2]
    assert outs[3] == "Out[4]: 6"
    m = row["metrics"]
    assert m["python_calls"] == 4 and m["sandbox_command_count"] == 4 and m["python_ready_wait_time"] > 0
    assert wait_gone(labels) == []


async def test_cell_timeout_interrupts_and_namespace_survives():
    labels = unique_labels()
    policy = tool_script([
        ("python", {"code": "state = {'n': 1}"}),
        ("python", {"code": "import time\nprint('working')\nwhile True:\n    time.sleep(0.01)"}),
        ("python", {"code": "state['n'] + 1"}),
    ])
    t0 = time.monotonic()
    rows = await run_env(py_env(labels, timeout_per_command_seconds=2), policy)
    assert time.monotonic() - t0 < 40
    outs = tool_messages(rows[0])
    assert outs[1].startswith("working\n") and "KeyboardInterrupt" in outs[1]
    assert "timed out after 2s" in outs[1] and "variables are kept" in outs[1]
    assert outs[2] == "Out[3]: 2"
    assert rows[0]["metrics"]["sandbox_timeout"] == 1.0


async def test_dead_worker_is_restarted_and_model_told_state_was_lost():
    labels = unique_labels()
    policy = tool_script([
        ("python", {"code": "x = 1"}),
        ("python", {"code": "import os\nos.kill(os.getpid(), 9)"}),
        ("python", {"code": "x"}),
        ("python", {"code": "y = 2\ny * 21"}),
    ])
    rows = await run_env(py_env(labels), policy)
    outs = tool_messages(rows[0])
    assert "died (signal 9)" in outs[1] and "were lost" in outs[1]
    assert "NameError" in outs[2]
    assert outs[3] == "Out[2]: 42"
    assert rows[0]["error"] is None


async def test_bash_and_python_share_the_sandbox_when_both_exposed():
    labels = unique_labels()
    policy = tool_script([
        ("bash", {"command": "cd /tmp && echo 'from-bash' > shared.txt"}),
        ("python", {"code": "open('/tmp/shared.txt').read().strip()"}),
    ])
    rows = await run_env(py_env(labels, expose_bash=True), policy)
    assert tool_messages(rows[0]) == ["(no output)", "Out[1]: 'from-bash'"]


async def test_packages_baked_into_cached_derived_image():
    """`pip_install_packages` become an image built once (wheels from the host);
    a second env resolves the same tag from cache without rebuilding."""
    labels = unique_labels()
    env = py_env(labels, pip_install_packages="six")
    policy = tool_script([("python", {"code": "import six\nsix.__name__"})])
    rows = await run_env(env, policy)
    assert tool_messages(rows[0]) == ["Out[1]: 'six'"], rows[0]["error"]
    first = env._image_cache
    assert list(first.values())[0].startswith("vf-sandbox/python-env:")

    again = py_env(labels, pip_install_packages=["six"])
    t0 = time.monotonic()
    spec = await again.resolve_spec(again.sandbox_spec)
    assert time.monotonic() - t0 < 5
    assert spec.image == list(first.values())[0]
    await again.teardown()
    assert wait_gone(labels) == []


async def test_backend_without_derived_images_keeps_the_image_and_installs_at_boot(monkeypatch):
    """Packages go into a derived image only through the backend capability
    (SupportsDerivedImages); a backend without it keeps the spec's image and
    PythonEnv pip-installs at boot instead."""
    from sandboxes.interface import SupportsDerivedImages

    env = vf.PythonEnv(dataset=dataset(), backend="local", pip_install_packages="six", max_turns=2)
    assert not isinstance(env.backend, SupportsDerivedImages) and env._derive_image() is None
    spec = await env.resolve_spec(env.sandbox_spec)
    assert spec.image == env.sandbox_spec.image and env._image_cache == {}

    docker_env = py_env(unique_labels(), pip_install_packages="six")
    assert isinstance(docker_env.backend, SupportsDerivedImages)
    asked: list[tuple[str, list[str]]] = []

    async def derive(base, packages):
        asked.append((base, list(packages)))
        return "derived:tag"

    monkeypatch.setattr(docker_env.backend, "derive_image", derive)
    spec = await docker_env.resolve_spec(docker_env.sandbox_spec)
    again = await docker_env.resolve_spec(docker_env.sandbox_spec)
    assert spec.image == again.image == "derived:tag" and asked == [(docker_env.sandbox_spec.image, ["six"])]
    await docker_env.teardown()
    await env.teardown()


@pytest.mark.parametrize("mode", ["container", "auto"])
async def test_sandbox_killed_mid_rollout_is_retried(mode):
    """Its container (with a cell: the cell host) killed under the REPL: retried on a fresh one."""
    import docker

    from test_sandbox_env import container_of

    labels = unique_labels()
    env = py_env(labels, rollout_isolation=mode)
    killed: list[str] = []

    def second(req: PolicyRequest) -> dict:
        if not killed:
            client = docker.from_env()
            for cid in list(env.active_sandboxes):
                client.containers.get(container_of(cid)).kill()
                killed.append(cid)
            client.close()
        return {"code": "total"}

    policy = tool_script([("python", {"code": "total = 40 + 2"}), ("python", second)])
    rows = await run_env(env, policy, max_retries=1)
    assert len(rows) == 1 and rows[0]["attempts"] == 2 and rows[0]["error"] is None
    assert tool_messages(rows[0]) == ["(no output)", "Out[2]: 42"]
    assert wait_gone(labels) == []


async def test_cell_exhausting_memory_restarts_worker_and_flags_oom():
    labels = unique_labels()
    policy = tool_script([
        ("python", {"code": "keep = 1"}),
        ("python", {"code": "big = bytearray(700 * 1024 * 1024)\nbig[::4096] = b'x' * len(big[::4096])"}),
        ("python", {"code": "1 + 1"}),
    ])
    rows = await run_env(py_env(labels, memory_gb=0.25), policy)
    outs = tool_messages(rows[0])
    assert "died" in outs[1] and "were lost" in outs[1], outs[1]
    assert outs[2] == "Out[1]: 2"
    assert rows[0]["metrics"]["sandbox_oom"] == 1.0 and rows[0]["error"] is None
    assert wait_gone(labels) == []


async def test_unknown_package_is_a_clear_usage_error_not_retried():
    labels = unique_labels()
    env = py_env(labels, n=2, pip_install_packages="vf-sandbox-no-such-package-xyz")
    rows = await run_env(env, tool_script([("python", {"code": "1"})]), n=2, max_retries=2)
    for r in rows:
        assert r["error"] is not None and r["attempts"] == 1
        assert "vf-sandbox-no-such-package-xyz" in str(r["error"]) and r["error_kind"] != "infra"
    assert wait_gone(labels) == []
