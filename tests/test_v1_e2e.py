"""v1 programs in real Docker sandboxes, and v1 environments under
`vf-sandbox eval` (a subprocess) against the local scripted model server:
results, [env.taskset] / [env.harness] from the eval TOML, resume after a kill."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from testmodel.model_server import ModelServer, PolicyRequest, Reply, compute
from envs.v1 import Harness, State, Task

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "environments" / "v1_sandbox_agent"))
import v1_sandbox_agent  # noqa: E402

pytestmark = pytest.mark.docker

ASK = r"""
import json, os, sys, urllib.request
task = json.loads(os.environ["VF_TASK_JSON"])
body = {"model": os.environ["OPENAI_MODEL"], "messages": task["prompt"]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
print(json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"])
print(open("/task/note.txt").read() if os.path.exists("/task/note.txt") else "no note")
"""


async def test_command_program_in_a_sandbox_reaches_the_endpoint_over_the_channel(docker_backend, python_image):
    async with ModelServer(compute()) as srv:
        harness = Harness(program={"command": ["python3", "/opt/ask.py"], "files": {"/opt/ask.py": ASK}},
                          sandbox={"image": python_image}, client=AsyncOpenAI(base_url=srv.base_url, api_key="x"),
                          model="m")
        harness.set_backend(docker_backend)  # an instance passes through sandboxes.registry.get_backend
        task = Task(prompt="What is 5 + 6?", program={"files": {"/task/note.txt": "from the task"}}).freeze()
        state = await harness.run(task)
        res = state["program_result"]
        assert state["error"] is None and res["exit_code"] == 0, res
        assert res["stdout"].splitlines() == ["The answer is \\boxed{11}.", "from the task"]
        assert len(state["trajectory"]) == 1 and srv.requests[-1].messages == [{"role": "user", "content": "What is 5 + 6?"}]
        sandbox = state.runtime["sandbox"]
        assert sandbox.spec.network is False  # the relay needs no network
        probe = await sandbox.exec(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 2)"])
        assert probe.exit_code != 0
        # a child harness borrowing the parent's sandbox runs there and leaves it alive
        child = Harness(program={"command": ["python3", "/opt/ask.py"]}, sandbox={"image": python_image})
        child.set_backend(docker_backend)
        child_state = state.for_task({"prompt": "What is 1 + 1?"}, borrow=["model", "sandbox"])
        await child.run(child_state.runtime["task"], child_state)
        assert child_state["program_result"]["stdout"].splitlines() == ["The answer is \\boxed{2}.", "from the task"]
        assert child_state.runtime["sandbox"] is sandbox and "sandbox" not in json.dumps(child_state.serializable(), default=str)
        await child.cleanup_group([child_state.runtime["task"]], [child_state])
        assert await sandbox.alive()  # not the child's to delete
        await harness.cleanup_group([task], [state])
        assert not await sandbox.alive()
        await child.teardown()
        await harness.teardown()


def cli_env(workdir: Path) -> dict[str, str]:
    env = {**os.environ, "VF_E2E_KEY": "k", "VF_RUNS_DB": str(workdir / "runs.db"), "COLUMNS": "160"}
    env.pop("VF_RUN_ID", None)
    return env


def eval_cmd(workdir: Path, config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "vfcli.app", "eval", str(config), *args]


def write_config(workdir: Path, base_url: str, extra: str = "", num_examples: int = 2) -> Path:
    cfg = workdir / "eval.toml"
    cfg.write_text(f"""
model = "test-model"
api_base_url = "{base_url}"
api_key_var = "VF_E2E_KEY"
env_dir_path = "{ROOT / 'environments'}"
endpoints_path = "{workdir / 'none.toml'}"
max_concurrent = 2

[env.taskset]
num_tasks = 4
seed = 11

[[eval]]
env_id = "v1-sandbox-agent"
num_examples = {num_examples}
rollouts_per_example = 2
{extra}
""")
    return cfg


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]


def test_v1_env_under_vf_sandbox_eval(tmp_path):
    with ModelServer(v1_sandbox_agent.scripted_policy()).run_in_thread() as srv:
        cfg = write_config(tmp_path, srv.base_url, extra="[eval.env.harness]\nmax_turns = 3\n")
        res = subprocess.run(eval_cmd(tmp_path, cfg, "-d"), cwd=tmp_path, env=cli_env(tmp_path),
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert {r.api for r in srv.requests} == {"chat"} and srv.count == 8  # 4 rollouts x (tool call + answer)
    run_dir = next((tmp_path / "outputs" / "evals" / "v1-sandbox-agent--test-model").iterdir())
    rows = rows_of(run_dir)
    expected = {i: t["answer"] for i, t in enumerate(v1_sandbox_agent.make_tasks(4, 11))}
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    assert all(r["reward"] == 1.0 and r["metrics"] == {"correct": 1.0, "agent_exit_ok": 1.0, "recount_in_sandbox": 1.0}
               for r in rows)
    assert all(r["answer"] == expected[r["example_id"]] for r in rows)  # seed 11 from [env.taskset]
    assert all(len(r["trajectory"]) == 2 and r["completion"][1]["role"] == "tool" for r in rows)
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["avg_reward"] == 1.0 and meta["env_args"]["config"] == {"taskset": {"num_tasks": 4, "seed": 11},
                                                                          "harness": {"max_turns": 3}}
    env_calls = [r for r in srv.requests if r.tool_results()]
    assert all(r.messages[0]["role"] == "system" for r in env_calls)


def test_v1_env_config_unknown_field_is_named(tmp_path):
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1", extra="[eval.env.harness]\nmax_trns = 3\n")
    res = subprocess.run(eval_cmd(tmp_path, cfg, "-d"), cwd=tmp_path, env=cli_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "harness.max_trns" in res.stderr, res.stderr[-2000:]
    cfg.write_text(cfg.read_text().replace("[eval.env.harness]\nmax_trns = 3\n", "[eval.env.sandbox]\nimage = 'x'\n"))
    res = subprocess.run(eval_cmd(tmp_path, cfg, "-d"), cwd=tmp_path, env=cli_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "only the sections" in res.stderr, res.stderr[-2000:]


def slow_agent_policy(delay: float):
    inner = v1_sandbox_agent.scripted_policy()

    async def policy(req: PolicyRequest) -> Reply:
        await asyncio.sleep(delay)
        return inner(req)

    return policy


def test_v1_env_resume_after_sigkill(tmp_path, docker_backend):
    with ModelServer(slow_agent_policy(0.4)).run_in_thread() as srv:
        cfg = write_config(tmp_path, srv.base_url, num_examples=4)
        proc = subprocess.Popen(eval_cmd(tmp_path, cfg, "-d", "-s"), cwd=tmp_path, env=cli_env(tmp_path),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        root = tmp_path / "outputs" / "evals" / "v1-sandbox-agent--test-model"
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                dirs = sorted(root.iterdir()) if root.exists() else []
                if dirs and (dirs[0] / "results.jsonl").exists() and len(rows_of(dirs[0])) >= 2:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("no rows before the deadline")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            asyncio.run(docker_backend.delete_many(labels={"vf-sandbox.owner-pid": str(proc.pid)}))
        run_dir = sorted(root.iterdir())[0]
        before = rows_of(run_dir)
        assert 2 <= len(before) < 8 and len(before) % 2 == 0
        count0 = srv.count
        res = subprocess.run(eval_cmd(tmp_path, cfg, "-d", "-s", "--resume", str(run_dir)), cwd=tmp_path,
                             env=cli_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert srv.count - count0 == 2 * (8 - len(before))  # only the missing rollouts ran
    after = rows_of(run_dir)
    assert after[: len(before)] == before and len(after) == 8
    assert sorted(r["example_id"] for r in after) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r["reward"] == 1.0 for r in after)


async def test_base_loop_with_a_sandbox_gets_a_bash_tool_there(docker_backend, python_image):
    from testmodel.model_server import tool_then_answer

    async with ModelServer(tool_then_answer("bash", {"command": "echo hi > /tmp/f && cat /tmp/f && exit 3"})) as srv:
        harness = Harness(program={"base": True}, sandbox={"image": python_image},
                          client=AsyncOpenAI(base_url=srv.base_url, api_key="x"), model="m")
        harness.set_backend(docker_backend)
        task = Task(prompt="go").freeze()
        state = await harness.run(task)
        assert state["error"] is None and [t["name"] for t in srv.requests[0].tools] == ["bash"]
        assert state["completion"][1]["content"] == "hi\n[exit code 3]"  # rendered as SandboxEnv's bash
        sandbox = state.runtime["sandbox"]
        await harness.cleanup_group([task], [state])
        assert not await sandbox.alive()
        await harness.teardown()


async def test_bash_tool_output_is_capped_by_the_sandbox_config_as_in_sandbox_env(docker_backend, python_image):
    """The bash tool kept a hard-coded 8000-char tail: it now keeps head and tail up to
    `output_limit_bytes` (SandboxEnv's default 16 KiB, settable), like SandboxEnv's tool."""
    from testmodel.model_server import tool_then_answer

    command = "python3 -c \"print('S' + 'a' * 12000 + 'E')\""
    for limit, whole in ((None, True), (1000, False)):
        async with ModelServer(tool_then_answer("bash", {"command": command})) as srv:
            sandbox = {"image": python_image, **({"output_limit_bytes": limit} if limit else {})}
            harness = Harness(program={"base": True}, sandbox=sandbox,
                              client=AsyncOpenAI(base_url=srv.base_url, api_key="x"), model="m")
            harness.set_backend(docker_backend)
            task = Task(prompt="go").freeze()
            state = await harness.run(task)
            out = state["completion"][1]["content"]
            assert out.startswith("S") and out.endswith("E"), out[:50]
            if whole:
                assert len(out) == 12002
            else:
                assert "bytes cut ...]" in out and len(out.encode()) < 1100
            await harness.cleanup_group([task], [state])
            await harness.teardown()


async def test_a_retried_rollout_does_not_keep_its_first_sandbox(docker_backend, python_image):
    """A rollout retried after an infrastructure error released its first attempt's
    sandbox only at teardown (sandboxes were keyed by id(state)): now at once."""
    import uuid

    from envs.v1 import Env, Taskset
    from sandboxes.errors import InfraError

    tries = []

    async def flaky_setup(task, state):
        tries.append(state.runtime["sandbox"].id)
        if len(tries) == 1:
            raise InfraError("the sandbox's agent went away")

    label = {"vf-test-v1-retry": uuid.uuid4().hex}
    env = Env(Taskset(source=[{"prompt": "hi"}], setups=[flaky_setup]),
              Harness(program={"base": True}, sandbox={"image": python_image, "labels": label}))
    env.set_backend(docker_backend)
    try:
        async with ModelServer(compute()) as srv:
            out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m", num_examples=1, max_retries=1)
        row = out["outputs"][0]
        assert row["error"] is None and row["attempts"] == 2 and len(set(tries)) == 2
        assert await docker_backend.list(labels=label) == []  # both attempts' sandboxes are gone before teardown
    finally:
        await env.teardown()


AGENT_PKG = '''
import json, os, socket


async def run(task, state):
    """Asks the model through state.get_client() (the stdlib client: the image has no openai)."""
    client = state.get_client()
    resp = await client.chat.completions.create(messages=task["prompt"])
    state["answer_seen"] = resp.choices[0].message.content
    state["ran_in"] = open("/etc/hostname").read().strip()
    state["note"] = open("/task/note.txt").read() if os.path.exists("/task/note.txt") else None
    try:
        socket.create_connection(("1.1.1.1", 53), 2)
        state["network"] = True
    except OSError:
        state["network"] = False
    state.stop("answered_in_sandbox")


def sync_run(task, state):
    resp = state.get_client(sync=True).chat.completions.create(messages=task["prompt"])
    state["completion"] = [{"role": "assistant", "content": resp.choices[0].message.content}]


def broken(task, state):
    raise ValueError("bad input: " + task["answer"])


async def with_tools(task, state):
    """Calls the rollout's host tools from inside the sandbox."""
    tools = state.get_tools()
    state["tool_names"] = sorted(tools)
    state["product"] = await tools["times"](a=6, b=7)
    try:
        await tools["times"](a="x", b="y")
    except RuntimeError as exc:
        state["tool_error"] = str(exc)


def swallow(task, state):
    try:
        state.get_client(sync=True).chat.completions.create(messages=task["prompt"])
    except Exception as exc:
        state["swallowed"] = type(exc).__name__
'''


def make_agent_pkg(root: Path, name: str, deps: list[str] | None = None) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(AGENT_PKG)
    if deps is not None:
        (pkg / "pyproject.toml").write_text(f"[project]\nname = '{name}'\nversion = '0'\ndependencies = {deps!r}\n")


async def test_fn_and_callable_programs_run_in_the_sandbox_through_the_relay(tmp_path, monkeypatch, docker_backend,
                                                                             python_image):
    """{"fn": ...} and a module-level callable run inside the harness's sandbox (the
    package uploaded, network off), their model calls recorded on the host state."""
    import importlib

    from envs.errors import error_kind
    from testmodel.model_server import fail
    from envs.v1.sandbox_python import SandboxedProgramError
    from sandboxes.errors import ConfigError

    make_agent_pkg(tmp_path, "v1sbagent", deps=["iniconfig"])  # iniconfig is in the test image
    make_agent_pkg(tmp_path, "v1sbneeds", deps=["numpy>=1.0"])
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = importlib.import_module("v1sbagent.agent")
    async with ModelServer(compute()) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="x")
        for program in ({"fn": "v1sbagent.agent:run"}, agent.run):
            harness = Harness(program=program, sandbox={"image": python_image}, client=client, model="m")
            harness.set_backend(docker_backend)
            task = Task(prompt="What is 5 + 6?", program={"files": {"/task/note.txt": "from the task"}}).freeze()
            state = await harness.run(task)
            assert state["error"] is None, (state["error"], state.get("program_result"))
            sandbox = state.runtime["sandbox"]
            assert state["answer_seen"] == "The answer is \\boxed{11}." and state["stop_condition"] == "answered_in_sandbox"
            assert state["ran_in"] == sandbox.id[:12] and state["note"] == "from the task"
            assert state["network"] is False and sandbox.spec.network is False
            assert len(state["trajectory"]) == 1 and srv.requests[-1].model == "m"  # recorded on the host
            assert state["completion"] == [{"role": "assistant", "content": "The answer is \\boxed{11}."}]
            await harness.cleanup_group([task], [state])
            assert not await sandbox.alive()
            await harness.teardown()
        # a sync program; what it raised; a missing dependency
        for ref, check in (
            ("v1sbagent.agent:sync_run", lambda st: st["error"] is None and st["completion"][0]["content"].endswith("{2}.")),
            ("v1sbagent.agent:broken", lambda st: isinstance(st["error"], SandboxedProgramError)
             and str(st["error"]) == "ValueError: bad input: A" and "broken" in st["error"].remote_traceback),
            ("v1sbneeds.agent:run", lambda st: isinstance(st["error"], ConfigError) and "numpy" in str(st["error"])),
        ):
            harness = Harness(program={"fn": ref}, sandbox={"image": python_image}, client=client, model="m")
            harness.set_backend(docker_backend)
            task = Task(prompt="What is 1 + 1?", answer="A").freeze()
            state = await harness.run(task)
            assert check(state), (ref, repr(state["error"]), state.get("program_result"))
            await harness.cleanup_group([task], [state])
            await harness.teardown()
    # tools are forwarded: the program in the sandbox calls the rollout's tools, which run on the host
    ran_on = []

    def times(a: int, b: int, secret: str) -> int:
        """Multiply."""
        ran_on.append(secret)
        return a * b

    from envs.v1 import Toolset

    async with ModelServer(compute()) as srv:
        harness = Harness(program={"fn": "v1sbagent.agent:with_tools"}, sandbox={"image": python_image},
                          client=AsyncOpenAI(base_url=srv.base_url, api_key="x"), model="m",
                          toolsets=[Toolset(tools=[times], bindings={"times.secret": "task.answer"})])
        harness.set_backend(docker_backend)
        task = Task(prompt="x", answer="host-side").freeze()
        state = await harness.run(task)
        assert state["error"] is None, (state["error"], state.get("program_result"))
        assert state["tool_names"] == ["times"] and state["product"] == 42 and ran_on[0] == "host-side"
        assert state["tool_error"].startswith("TypeError")
        await harness.cleanup_group([task], [state])
        await harness.teardown()
    # a model failure inside the sandbox is the rollout's model error, even when the program swallowed it
    async with ModelServer(fail(400)) as srv:
        harness = Harness(program={"fn": "v1sbagent.agent:swallow"}, sandbox={"image": python_image},
                          client=AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0), model="m")
        harness.set_backend(docker_backend)
        task = Task(prompt="x").freeze()
        state = await harness.run(task)
        assert state["swallowed"] == "ModelCallError" and error_kind(state["error"]) == "model", repr(state["error"])
        await harness.cleanup_group([task], [state])
        await harness.teardown()


def test_sandboxed_python_programs_are_validated():
    from sandboxes.errors import ConfigError

    def local(task, state):
        pass

    with pytest.raises(ConfigError, match="module-level"):
        Harness(program=local, sandbox={"image": "x"})



async def test_the_harness_keeps_a_warm_pool_sized_by_the_run(docker_backend, python_image):
    """As SandboxEnv: the run's concurrency sizes a warm pool of the harness's sandbox
    spec; a task whose own sandbox settings change the spec gets one created for it;
    everything is gone after teardown."""
    import uuid

    from envs.v1 import Env, Taskset
    from sandboxes.errors import ConfigError

    label = {"vf-test-v1-pool": uuid.uuid4().hex}
    rows = [{"prompt": "What is 1 + 1?"}, {"prompt": "What is 2 + 2?"}, {"prompt": "What is 3 + 3?", "sandbox": {"memory_gb": 1}}]
    env = Env(Taskset(source=rows), Harness(program={"base": True}, sandbox={"image": python_image, "labels": label}))
    env.set_backend(docker_backend)
    env.set_concurrency(2)
    try:
        async with ModelServer(compute()) as srv:
            out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m", num_examples=3)
        assert all(r["error"] is None for r in out["outputs"]), [r["error"] for r in out["outputs"]]
        pool = env.harness._pool
        assert pool is not None and env.harness.effective_pool_size == 2 and pool.stats["acquired"] == 2  # the third spec differs
        assert pool.size == 0  # its refill target once the run's rollouts all had a sandbox (RolloutSandboxes.expect)
        with pytest.raises(ConfigError, match="after the warm pool was started"):
            env.set_kwargs(memory_gb=1)  # its sandboxes were made from the old spec
        with pytest.raises(ConfigError, match="after the warm pool was started"):
            env.set_kwargs(isolation="gvisor")
        assert env.isolation_in_use() != "gvisor" and env.harness.sandbox_spec({}).isolation == "runc"
        env.set_kwargs(output_limit_bytes=1000)  # not part of the spec: fine
    finally:
        await env.teardown()
    assert await docker_backend.list(labels=label) == []
    # pool_size=0: one creation per rollout, no pool
    harness = Harness(program={"base": True}, sandbox={"image": python_image, "pool_size": 0})
    harness.set_concurrency(4)
    assert harness.effective_pool_size == 0


TOOLS_PKG = '''
def where(x: int) -> str:
    """Where the tool ran, and twice x."""
    return open("/etc/hostname").read().strip() + ":" + str(2 * x)


def broken(x: int) -> str:
    """Always fails."""
    raise ValueError("no luck with " + str(x))
'''


async def test_sandboxed_toolsets_run_their_tools_in_a_sandbox(tmp_path, monkeypatch, docker_backend, python_image):
    """Toolset(sandbox="program") runs each call in the harness's sandbox; Toolset(sandbox=
    SandboxConfig) in one of its own per rollout, deleted with the rollout."""
    import importlib
    import uuid

    from testmodel.model_server import tool_then_answer
    from envs.v1 import Toolset
    from sandboxes.errors import ConfigError

    pkg = tmp_path / "v1sbtools"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tools.py").write_text(TOOLS_PKG)
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = importlib.import_module("v1sbtools.tools")
    label = {"vf-test-v1-tools": uuid.uuid4().hex}
    async with ModelServer(tool_then_answer("where", {"x": 21})) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="x")
        # colocated in the program's sandbox
        harness = Harness(program={"base": True}, sandbox={"image": python_image}, client=client, model="m",
                          toolsets=[Toolset(tools=[tools.where], sandbox="program")])
        harness.set_backend(docker_backend)
        task = Task(prompt="go").freeze()
        state = await harness.run(task)
        assert state["error"] is None, state["error"]
        assert state["completion"][1]["content"] == state.runtime["sandbox"].id[:12] + ":42"
        await harness.cleanup_group([task], [state])
        await harness.teardown()
        # a sandbox of the toolset's own, the harness has none
        ts = Toolset(tools=[tools.where], sandbox={"image": python_image, "labels": label})
        harness = Harness(client=client, model="m", toolsets=[ts])
        harness.set_backend(docker_backend)
        state = await harness.run(task)
        assert state["error"] is None, state["error"]
        [own] = await docker_backend.list(labels=label)
        assert state["completion"][1]["content"] == own.id[:12] + ":42" and "sandbox" not in state.runtime
        await harness.cleanup_group([task], [state])
        assert await docker_backend.list(labels=label) == []  # deleted with its rollout
        await harness.teardown()
        # SandboxConfig.scope="group" (write=True changes the objects' scope, not the sandbox's):
        # the rollouts of one example share the toolset's sandbox, deleted at teardown
        ts = Toolset(tools=[tools.where], write=True, sandbox={"image": python_image, "labels": label, "scope": "group"})
        harness = Harness(client=client, model="m", toolsets=[ts])
        harness.set_backend(docker_backend)
        states = [await harness.run(task) for _ in range(2)]
        [own] = await docker_backend.list(labels=label)
        assert [s["completion"][1]["content"] for s in states] == [own.id[:12] + ":42"] * 2
        await harness.cleanup_group([task, task], states)
        assert [s.id for s in await docker_backend.list(labels=label)] == [own.id]
        await harness.teardown()
        assert await docker_backend.list(labels=label) == []
    async with ModelServer(tool_then_answer("broken", {"x": 1})) as srv:
        harness = Harness(program={"base": True}, sandbox={"image": python_image}, model="m",
                          client=AsyncOpenAI(base_url=srv.base_url, api_key="x"),
                          toolsets=[Toolset(tools=[tools.broken], sandbox="program")])
        harness.set_backend(docker_backend)
        state = await harness.run(task)
        assert state["completion"][1]["content"] == "Error: SandboxedProgramError: ValueError: no luck with 1"
        await harness.cleanup_group([task], [state])
        await harness.teardown()
    with pytest.raises(ConfigError, match="host"):
        Toolset(tools=[tools.where], sandbox="program", objects={"db": dict}, bindings={"where.x": "objects.db"})
    with pytest.raises(ConfigError, match="module-level"):
        Toolset(tools=[lambda x: x], sandbox="program")
