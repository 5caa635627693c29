"""Setup once per rollout group, then forks (issue 28, `setup_scope="group"`), on the real
Docker engine: the lifecycle's `prepare_group` / `acquire_group` (forks carry the prepared
files, are isolated from each other, nothing is left after close), and SandboxEnv runs
(in process and `vf-sandbox eval -w 2`) whose setup counts itself: once per group with
"group", once per rollout with "rollout"; the fallback to a setup per rollout where the
backend has no snapshots (local processes)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import envs as vf
from sandboxes import SandboxSpec
from sandboxes.rollouts import RolloutSandboxes
from testmodel.model_server import ModelServer
from test_sandbox_env import processes_in, wait_gone

REPO = Path(__file__).resolve().parents[1]
ENV_DIR = REPO / "tests" / "data" / "group_setup_env"
sys.path.insert(0, str(ENV_DIR))

import group_setup_env  # noqa: E402

ISOLATIONS = ["container", "namespace"]


def unique_labels() -> dict[str, str]:
    return {"vf-sandbox.test": "1", "vf-test-case": uuid.uuid4().hex[:12]}


def images_with(labels: dict[str, str]) -> list[str]:
    """Ids of the engine's images carrying `labels` (snapshot images carry their source's labels)."""
    import docker

    client = docker.from_env()
    try:
        return [i["Id"] for i in client.api.images(filters={"label": [f"{k}={v}" for k, v in labels.items()]})]
    finally:
        client.close()


def assert_nothing_left(labels: dict[str, str]) -> None:
    assert wait_gone(labels) == []
    assert images_with(labels) == []


def setups(counter: Path) -> list[str]:
    return counter.read_text().splitlines() if counter.exists() else []


# --------------------------------------------------------------------------- the lifecycle


@pytest.mark.docker
@pytest.mark.parametrize("rollout_isolation", ISOLATIONS)
async def test_acquire_group_forks_carry_setup_and_are_isolated(python_image, rollout_isolation):
    labels = unique_labels()
    spec = SandboxSpec(image=python_image, memory_gb=1, timeout_minutes=10, labels=labels,
                       environment_vars={"GROUP_VAR": "v1"}, workdir="/srv", rollout_isolation=rollout_isolation)
    sandboxes = RolloutSandboxes(spec, "docker", pool_size=0, rollout_isolation=rollout_isolation)
    ran: list[str] = []

    async def prepare(sb):
        ran.append(sb.id)
        await sb.write_file("/srv/prepared.txt", "ready\n")
        assert (await sb.exec(["sh", "-c", "echo built > /srv/built.txt"])).ok

    try:
        forks = await sandboxes.acquire_group(3, prepare)
        assert len(ran) == 1 and len(forks) == 3 and ran[0] not in {f.id for f in forks}
        assert sorted(sandboxes.held) == sorted(f.id for f in forks)
        assert sandboxes.snapshots == []  # released once the forks exist
        for sb in forks:  # the prepared files, environment and working directory carried
            r = await sb.exec(["sh", "-c", "cat prepared.txt built.txt; echo $GROUP_VAR; pwd"])
            assert r.stdout.split() == ["ready", "built", "v1", "/srv"], r
        assert (await forks[0].exec(["sh", "-c", "echo mine > /srv/only-0.txt; rm /srv/prepared.txt"])).ok
        for sb in forks[1:]:  # a write (and a removal) in one fork is not seen by its siblings
            r = await sb.exec(["sh", "-c", "ls /srv"])
            assert r.stdout.split() == ["built.txt", "prepared.txt"], r
        await sandboxes.release(forks[0])
        assert sorted(sandboxes.held) == sorted(f.id for f in forks[1:])
    finally:
        await sandboxes.close()
    assert_nothing_left(labels)


@pytest.mark.docker
async def test_prepared_group_forks_on_demand_and_releases_its_snapshot(python_image):
    """`prepare_group`: a fork per `acquire()` (a retried rollout gets one too), the
    snapshot held until the group closes, forks still held stay until released."""
    labels = unique_labels()
    spec = SandboxSpec(image=python_image, memory_gb=1, timeout_minutes=10, labels=labels)
    sandboxes = RolloutSandboxes(spec, "docker", pool_size=0)
    count = 0

    async def prepare(sb):
        nonlocal count
        count += 1
        await sb.write_file("/tmp/p.txt", "p")

    try:
        group = await sandboxes.prepare_group(prepare)
        assert group.mode == "fork" and len(sandboxes.snapshots) == 1 and sandboxes.held == []
        a, prepared_a = await group.acquire()
        b, prepared_b = await group.acquire()
        assert prepared_a and prepared_b and group.forks == 2 and count == 1
        assert (await a.read_file("/tmp/p.txt")) == b"p" and (await b.read_file("/tmp/p.txt")) == b"p"
        await sandboxes.release(a)
        await group.close()
        assert sandboxes.snapshots == [] and sandboxes.held == [b.id]
        assert (await b.read_file("/tmp/p.txt")) == b"p"  # a fork outlives its group's snapshot
    finally:
        await sandboxes.close()
    assert_nothing_left(labels)


@pytest.mark.docker
async def test_a_fork_that_cannot_be_made_gives_a_fresh_sandbox(python_image):
    """The snapshot gone under the group (a cell fork also fails this way when its host is
    full or past its admission window): the rollout gets a fresh sandbox, prepared=False,
    so it sets itself up, instead of an error."""
    labels = unique_labels()
    spec = SandboxSpec(image=python_image, memory_gb=1, timeout_minutes=10, labels=labels, rollout_isolation="namespace")
    sandboxes = RolloutSandboxes(spec, "docker", pool_size=0, rollout_isolation="namespace")

    async def prepare(sb):
        await sb.write_file("/tmp/p.txt", "p")

    try:
        group = await sandboxes.prepare_group(prepare)
        assert group.mode == "fork" and group.snapshot is not None
        await sandboxes.backend.delete_snapshot(group.snapshot)  # behind the lifecycle's back
        sb, prepared = await group.acquire()
        assert prepared is False and group.fork_failures == 1 and group.forks == 0
        assert sb.id in sandboxes.held
        assert not (await sb.exec(["test", "-e", "/tmp/p.txt"])).ok  # a fresh sandbox: not set up
        await group.close()
    finally:
        await sandboxes.close()
    assert_nothing_left(labels)


async def test_no_snapshots_falls_back_to_setup_per_rollout(caplog, tmp_path):
    """The local backend has no snapshots: the group is in "rollout" mode (the prepared
    sandbox to the first rollout, fresh ones after), warned once, the note kept."""
    sandboxes = RolloutSandboxes(SandboxSpec(), "local", pool_size=0)
    ran: list[str] = []

    async def prepare(sb):
        ran.append(sb.id)

    try:
        with caplog.at_level(logging.WARNING, logger="sandboxes.rollouts"):
            group = await sandboxes.prepare_group(prepare)
            assert group.mode == "rollout" and "local" in group.reason
            first, p1 = await group.acquire()
            second, p2 = await group.acquire()
            assert (p1, p2) == (True, False) and first.id == ran[0]
            again = await sandboxes.prepare_group(prepare)  # later groups skip the preparation
            assert again.mode == "rollout" and len(ran) == 1
            forks = await sandboxes.acquire_group(2, prepare)  # each prepared here
            assert len(forks) == 2 and len(ran) == 3
        assert "local" in (sandboxes.group_setup_note or "")
        assert sum("setup per group asked for" in r.getMessage() for r in caplog.records) == 1
        await group.close()
        await again.close()
    finally:
        await sandboxes.close()


# --------------------------------------------------------------------------- SandboxEnv runs


async def evaluate(env: vf.Environment, n: int, r: int, c: int) -> list[dict]:
    async with ModelServer(group_setup_env.scripted_policy()) as srv:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))
        try:
            out = await env.evaluate(client, "test-model", num_examples=n, rollouts_per_example=r, max_concurrent=c)
        finally:
            await env.teardown()
    return list(out["outputs"])


@pytest.mark.docker
@pytest.mark.parametrize("rollout_isolation", ISOLATIONS)
async def test_group_setup_runs_once_per_group_and_forks_are_isolated(python_image, tmp_path, rollout_isolation):
    labels = unique_labels()
    counter = tmp_path / "setups.txt"
    env = group_setup_env.load_environment(str(counter), num_examples=2, docker_image=python_image, labels=labels,
                                           rollout_isolation=rollout_isolation, pool_size=0)
    env.set_kwargs(setup_scope="group")
    rows = await evaluate(env, n=2, r=3, c=6)
    assert len(rows) == 6 and [r.get("error") for r in rows] == [None] * 6
    assert sorted(line.split()[1] for line in setups(counter)) == ["0", "1"]  # once per example's group
    assert [r["reward"] for r in rows] == [1.0] * 6  # seed carried, seeded_for copied, siblings unseen
    assert [r["metrics"]["sandbox_forked"] for r in rows] == [1.0] * 6
    assert env.setup_scope_in_use() == "group"
    assert_nothing_left(labels)


@pytest.mark.docker
async def test_rollout_scope_sets_up_every_rollout(python_image, tmp_path):
    labels = unique_labels()
    counter = tmp_path / "setups.txt"
    env = group_setup_env.load_environment(str(counter), num_examples=2, docker_image=python_image, labels=labels,
                                           rollout_isolation="container", pool_size=0)
    assert env.setup_scope == "rollout"  # the default
    rows = await evaluate(env, n=2, r=3, c=6)
    assert [r["reward"] for r in rows] == [1.0] * 6
    assert sorted(line.split()[1] for line in setups(counter)) == ["0", "0", "0", "1", "1", "1"]
    assert all("sandbox_forked" not in r["metrics"] for r in rows)
    assert_nothing_left(labels)


async def test_group_scope_on_a_backend_without_snapshots_sets_up_per_rollout(tmp_path):
    """The local backend: the run works, the setup runs per rollout, rows say sandbox_forked 0."""
    counter = tmp_path / "setups.txt"
    env = group_setup_env.load_environment(str(counter), num_examples=1, backend="local", pool_size=0,
                                           setup_scope="group")
    rows = await evaluate(env, n=1, r=2, c=2)
    assert len(setups(counter)) == 2
    assert [r["metrics"]["sandbox_forked"] for r in rows] == [0.0, 0.0]
    assert env.setup_scope_in_use().startswith("rollout (setup_scope=group fell back")


def test_setup_scope_is_a_validated_setting():
    from sandboxes.errors import ConfigError

    env = vf.SandboxEnv(dataset=[{"question": "q", "answer": ""}])
    assert "setup_scope" in env.settable_kwargs() and env.setup_scope == "rollout"
    env.set_kwargs(setup_scope="group")
    assert env.setup_scope == "group"
    with pytest.raises(ConfigError, match="setup_scope"):
        env.set_kwargs(setup_scope="example")
    with pytest.raises(ConfigError, match="setup_scope"):
        vf.SandboxEnv(dataset=[{"question": "q", "answer": ""}], setup_scope="run")
    assert "setup_scope" in vf.PythonEnv.settable_kwargs()


@pytest.mark.docker
def test_eval_with_two_workers_sets_up_once_per_group(python_image, tmp_path):
    """`vf-sandbox eval -w 2 -x setup_scope=group`: a group runs in one worker process,
    its setup once there; every row is a fork's."""
    labels = unique_labels()
    counter = tmp_path / "setups.txt"
    (tmp_path / "no-endpoints.toml").write_text("")
    args = {"counter_path": str(counter), "num_examples": 4, "docker_image": python_image, "labels": labels}
    with ModelServer(group_setup_env.scripted_policy()).run_in_thread() as srv:
        cmd = [sys.executable, "-m", "vfcli.app", "eval", "group-setup-env", "-p", str(ENV_DIR.parent),
               "-e", str(tmp_path / "no-endpoints.toml"), "-k", "VF_E2E_SANDBOX_KEY", "-m", "test-model",
               "-b", srv.base_url, "-s", "-d", "-n", "4", "-r", "3", "-c", "6", "-w", "2",
               "-a", json.dumps(args), "-x", "setup_scope=group"]
        env = {**os.environ, "VF_E2E_SANDBOX_KEY": "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
        env.pop("VF_RUN_ID", None)
        res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = list((tmp_path / "outputs" / "evals" / "group-setup-env--test-model").iterdir())
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 12 and [r["reward"] for r in rows] == [1.0] * 12
    assert [r["metrics"]["sandbox_forked"] for r in rows] == [1.0] * 12
    lines = setups(counter)
    assert sorted(line.split()[1] for line in lines) == ["0", "1", "2", "3"]  # once per group, across workers
    assert len({line.split()[0] for line in lines}) == 2  # both worker processes set up groups
    assert_nothing_left(labels)


@pytest.mark.docker
async def test_python_env_group_setup_installs_once(python_image, tmp_path):
    """PythonEnv: its setup runs once per group, and its REPL (a process: not carried by a
    fork) starts in every fork and sees the prepared file."""
    labels = unique_labels()
    from testmodel.model_server import tool_script

    env = vf.PythonEnv(dataset=[{"question": "q", "answer": ""}], docker_image=python_image, labels=labels,
                       pip_install_packages="", pool_size=0, setup_scope="group", rollout_isolation="container")
    policy = tool_script([("python", {"code": "import os; os.path.exists('/tmp/seed')"})])

    seeded: list[str] = []

    async def post_sandbox_setup(state):
        seeded.append(state["sandbox_id"])
        await env.get_sandbox(state).write_file("/tmp/seed", "1")

    env.post_sandbox_setup = post_sandbox_setup  # type: ignore[method-assign]
    async with ModelServer(policy) as srv:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))
        try:
            out = await env.evaluate(client, "test-model", num_examples=1, rollouts_per_example=3, max_concurrent=3)
        finally:
            await env.teardown()
    rows = out["outputs"]
    assert len(seeded) == 1
    tools = [[m["content"] for m in r["completion"] if m.get("role") == "tool"] for r in rows]
    assert tools == [["Out[1]: True"]] * 3, tools
    assert_nothing_left(labels)


# --------------------------------------------------------------------------- the v1 harness


@pytest.mark.docker
@pytest.mark.parametrize("scope", ["group", "rollout"])
async def test_v1_harness_setups_once_per_group_with_forks(python_image, scope):
    from envs.v1 import Env, Harness, Taskset

    labels = unique_labels()
    ran: list[str] = []

    async def seed(task, state):
        ran.append(task["example_id"])
        await state.runtime["sandbox"].write_file("/tmp/seed.txt", f"seed {task['example_id']}\n")
        state["seeded_for"] = task["example_id"]

    def seeded(task, state) -> float:  # what the group's setup wrote to its state reached every rollout
        return float(state.get("seeded_for") == task["example_id"])

    rows = [{"prompt": [{"role": "user", "content": f"example {i}"}], "example_id": i} for i in range(2)]
    env = Env(Taskset(source=rows, setups=[seed], rewards=[seeded]),
              Harness(program={"base": True}, sandbox={"image": python_image, "labels": labels, "pool_size": 0}))
    env.set_kwargs(setup_scope=scope)
    env.set_backend("docker")
    try:
        async with ModelServer(group_setup_env.scripted_policy()) as srv:
            out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m", num_examples=2,
                                     rollouts_per_example=3, max_concurrent=6)
    finally:
        await env.teardown()
    outs = out["outputs"]
    assert [r["error"] for r in outs] == [None] * 6 and [r["reward"] for r in outs] == [1.0] * 6
    assert sorted(ran) == ([0, 1] if scope == "group" else [0, 0, 0, 1, 1, 1])
    for r in outs:
        tool = [m["content"] for m in r["completion"] if m.get("role") == "tool"][0]
        lines = tool.splitlines()  # the seed carried; a sibling's file never seen
        assert lines == [f"seed {r['example_id']}", "1"], tool
    if scope == "group":
        assert [r["metrics"]["sandbox_forked"] for r in outs] == [1.0] * 6
    assert_nothing_left(labels)


@pytest.mark.docker
@pytest.mark.parametrize("rollout_isolation", ISOLATIONS)
def test_sigterm_while_forks_run_leaves_nothing(python_image, tmp_path, rollout_isolation):
    """`vf-sandbox eval` with group setup, SIGTERM while the group's forks run their commands:
    the forks, the cell host and the snapshot (a committed image for containers) all go."""
    labels = unique_labels()
    (tmp_path / "no-endpoints.toml").write_text("")
    args = {"counter_path": str(tmp_path / "setups.txt"), "num_examples": 1, "docker_image": python_image,
            "labels": labels, "rollout_isolation": rollout_isolation, "setup_scope": "group"}
    with ModelServer(group_setup_env.scripted_policy(linger=25)).run_in_thread() as srv:
        cmd = [sys.executable, "-m", "vfcli.app", "eval", "group-setup-env", "-p", str(ENV_DIR.parent),
               "-e", str(tmp_path / "no-endpoints.toml"), "-k", "VF_E2E_SANDBOX_KEY", "-m", "test-model",
               "-b", srv.base_url, "-d", "-n", "1", "-r", "3", "-c", "3", "-a", json.dumps(args)]
        env = {**os.environ, "VF_E2E_SANDBOX_KEY": "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
        env.pop("VF_RUN_ID", None)
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while processes_in(labels, "sleep 25") < 3 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.3)
            assert processes_in(labels, "sleep 25") == 3, "the forks never ran their commands"
            if rollout_isolation == "container":
                assert len(images_with(labels)) == 1  # the group's snapshot, held by its forks
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(setups(tmp_path / "setups.txt")) == 1
    assert proc.returncode != 0, out[-2000:]
    assert_nothing_left(labels)
