"""The v1 API (envs.v1): Task / State rules, Config models, every local program
form against the local model server (real SDK, real sockets), Toolset
visibility / bindings / scopes, MCPTool over a real stdio MCP server, and Env
under Environment.evaluate. Sandboxed programs and the CLI: tests/test_v1_e2e.py."""

import json
import sys
import textwrap

import pytest
from openai import AsyncOpenAI

import envs as vf
from testmodel.model_server import ModelServer, compute, fixed, tool_then_answer
from envs.v1 import (
    Config,
    Env,
    EnvConfig,
    Harness,
    HarnessConfig,
    MCPTool,
    SandboxConfig,
    State,
    Task,
    Taskset,
    TasksetConfig,
    Toolset,
)
from envs.errors import error_kind
from sandboxes.errors import ConfigError, UsageError


def client_for(srv):
    return AsyncOpenAI(base_url=srv.base_url, api_key="x")


# --------------------------------------------------------------------------- Task / State


def test_task_is_frozen_and_refuses_system_messages():
    task = Task({"question": "hi", "answer": "1"}).freeze()
    assert task["prompt"] == [{"role": "user", "content": "hi"}] and task.frozen
    with pytest.raises(TypeError, match="frozen"):
        task["answer"] = "2"
    with pytest.raises(TypeError):
        task.update(answer="2")
    assert Task(task, answer="2")["answer"] == "2"  # copies are writable
    with pytest.raises(ConfigError, match="system"):
        Task(prompt=[{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
    with pytest.raises(ConfigError, match="runtime"):
        Task(prompt="x", runtime={})
    assert json.loads(json.dumps(task)) == dict(task)


def test_state_guards_managed_fields_and_borrows_handles():
    parent = State.for_task({"prompt": "p", "answer": "a", "example_id": 3})
    assert parent["example_id"] == 3 and parent["is_completed"] is False and parent["trajectory"] == []
    for key in ("is_completed", "stop_condition", "is_truncated", "error"):
        with pytest.raises(UsageError, match="managed"):
            parent[key] = True
    with pytest.raises(UsageError):
        parent.update(error="x")
    parent["mine"] = 1  # user fields are free
    parent.stop("found_it")
    assert parent["is_completed"] is True and parent["stop_condition"] == "found_it"

    async def bash(command: str) -> str:
        return command

    async def other() -> str:
        return ""

    parent.runtime.update(model="m", client=object(), sandbox="SB", tools={"bash": bash, "other": other})
    child = parent.for_task({"prompt": "c"}, borrow=["model", "sandbox", "tools"], tools="bash")
    assert child.get_model() == "m" and child.runtime["sandbox"] == "SB" and list(child.get_tools()) == ["bash"]
    assert child.runtime["client"] is parent.runtime["client"]
    # borrowed handles are process-local: never part of the serialised state
    assert "sandbox" not in json.dumps(child.serializable(), default=str) and "runtime" not in child
    with pytest.raises(ConfigError, match="borrow"):
        parent.for_task({"prompt": "c"}, borrow=["secrets"])
    with pytest.raises(UsageError, match="no model"):
        State.for_task({"prompt": "x"}).get_model()
    assert State.for_task({"prompt": "x", "max_turns": 2}).get_max_turns(9) == 2
    assert State.for_task({"prompt": "x"}).get_max_turns(9) == 9


# --------------------------------------------------------------------------- Config


class MyHarnessConfig(HarnessConfig):
    depth: int = 1


class MyEnvConfig(EnvConfig):
    harness: MyHarnessConfig  # annotation only: defaults to MyHarnessConfig()


def test_config_models(tmp_path):
    cfg = MyEnvConfig()
    assert isinstance(cfg.harness, MyHarnessConfig) and isinstance(cfg.taskset, TasksetConfig)
    cfg = MyEnvConfig({"harness": {"depth": 3, "max_turns": 4}}, taskset={"taskset_id": "t"})
    assert cfg.harness.depth == 3 and cfg.harness.max_turns == 4 and cfg.taskset.taskset_id == "t"
    with pytest.raises(ValueError, match="harness.dpeth"):
        MyEnvConfig({"harness": {"dpeth": 3}})
    with pytest.raises(ValueError, match="imge"):
        SandboxConfig(imge="x")
    assert MyHarnessConfig(MyHarnessConfig(depth=2), max_turns=3).model_dump()["depth"] == 2
    assert HarnessConfig.from_config(cfg.harness) is cfg.harness

    class WithConfigField(Config):  # the source is positional-only: a field may be named config
        config: str = "x"

    assert WithConfigField({"config": "a"}, config="b").config == "b"
    path = tmp_path / "c.toml"
    path.write_text('[env.harness]\ndepth = 5\n[env.harness.sandbox]\nimage = "img"\n')
    h = MyHarnessConfig.from_toml(path, "env.harness")
    assert h.depth == 5 and h.sandbox.image == "img"
    assert MyEnvConfig.from_toml(path, ["env"]).harness.depth == 5
    with pytest.raises(ConfigError, match="no section"):
        MyHarnessConfig.from_toml(path, "env.taskset")
    assert vf.v1.resolve_ref("json:dumps") is json.dumps
    with pytest.raises(ConfigError, match="no attribute"):
        vf.v1.resolve_ref("json:nope")


# --------------------------------------------------------------------------- programs


def add(a: int, b: int, secret: str) -> str:
    """Add two numbers."""
    return f"{a + b} ({secret})"


def mul(a: int, b: int) -> int:
    """Multiply."""
    return a * b


async def test_base_loop_with_toolset_bindings_and_visibility():
    async with ModelServer(tool_then_answer("add", {"a": 2, "b": 3}, answer="\\boxed{5}")) as srv:
        ts = Toolset(tools=[add, mul], bindings={"add.secret": "task.answer"}, hide=["mul"])
        harness = Harness(client=client_for(srv), model="m", toolsets=[ts], system_prompt="be brief")
        state = await harness.run({"prompt": "add 2 and 3", "answer": "S"})
        assert state["error"] is None and state["stop_condition"] == "no_tools_called"
        assert [m["role"] for m in state["completion"]] == ["assistant", "tool", "assistant"]
        assert state["completion"][1]["content"] == "5 (S)"  # the binding filled `secret`
        sent = srv.requests[0]
        assert [t["name"] for t in sent.tools] == ["add"]  # mul hidden
        assert "secret" not in json.dumps(sent.tools)  # bound args never reach the model
        assert sent.messages[0] == {"role": "system", "content": "be brief"}
        assert len(state["trajectory"]) == 2 and state["usage"]["input_tokens"] > 0
        assert len(state["timing"].model.spans) == 2
        # per-task visibility narrows further
        state = await harness.run({"prompt": "x", "answer": "S", "tools": {"hide": ["add"]}})
        assert srv.requests[-1].tools == []
        await harness.teardown()


async def test_base_loop_max_turns_and_model_errors_are_typed():
    async with ModelServer(tool_then_answer("mul", {"a": 2, "b": 3})) as srv:
        harness = Harness(client=client_for(srv), model="m", toolsets=[Toolset(tools=[mul])], max_turns=1)
        state = await harness.run({"prompt": "x"})
        assert state["stop_condition"] == "max_turns_reached" and len(state["trajectory"]) == 1
        await harness.teardown()
        # {"base": true} is the same loop; its max_turns, and a task's, win over the harness's
        harness = Harness(program={"base": True, "max_turns": 1}, client=client_for(srv), model="m",
                          toolsets=[Toolset(tools=[mul])], max_turns=5)
        state = await harness.run({"prompt": "x"})
        assert state["stop_condition"] == "max_turns_reached" and len(state["trajectory"]) == 1
        state = await harness.run({"prompt": "x", "max_turns": 2})
        assert state["stop_condition"] == "no_tools_called" and len(state["trajectory"]) == 2
        await harness.teardown()
    from testmodel.model_server import fail

    async with ModelServer(fail(400, "bad request body")) as srv:
        harness = Harness(client=client_for(srv), model="m")
        state = await harness.run({"prompt": "x"})
        assert isinstance(state["error"], vf.ModelError) and state["stop_condition"] == "has_error"
        await harness.teardown()


async def test_callable_program_uses_the_endpoint_and_is_recorded():
    async def program(task, state):
        client = state.get_client()
        resp = await client.chat.completions.create(model="ignored", messages=task["prompt"], temperature=0.9)
        state["answer_seen"] = resp.choices[0].message.content
        state.stop("done_by_program")

    async with ModelServer(compute()) as srv:
        harness = Harness(program=program, client=client_for(srv), model="the-model", sampling_args={"temperature": 0.1})
        state = await harness.run({"prompt": "What is 2 + 2?"})
        assert state["answer_seen"] == "The answer is \\boxed{4}." and state["stop_condition"] == "done_by_program"
        req = srv.requests[-1]
        assert req.model == "the-model" and req.body["temperature"] == 0.1  # the run's model and sampling args win
        assert state["completion"] == [{"role": "assistant", "content": "The answer is \\boxed{4}."}]
        # the rollout's key dies with the rollout
        key = state.runtime["endpoint"]["api_key"]
        stale = AsyncOpenAI(base_url=state.runtime["endpoint"]["base_url"], api_key=key, max_retries=0)
        with pytest.raises(Exception, match="401"):
            await stale.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await harness.teardown()


async def test_fn_program_and_local_command_program(tmp_path, monkeypatch):
    pkg = tmp_path / "v1prog"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(textwrap.dedent("""
        def run(task, state):
            state["ran_with"] = task["answer"]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    script = textwrap.dedent("""
        import json, os, sys, urllib.request
        task = json.loads(os.environ["VF_TASK_JSON"])
        body = {"model": os.environ["OPENAI_MODEL"], "messages": task["prompt"]}
        req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        print(json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"], sys.argv[1:], os.environ["EXTRA"])
    """)
    async with ModelServer(compute()) as srv:
        harness = Harness(program={"fn": "v1prog.agent:run"}, client=client_for(srv), model="m")
        state = await harness.run({"prompt": "x", "answer": "A"})
        assert state["ran_with"] == "A" and state["error"] is None
        await harness.teardown()

        harness = Harness(program={"command": [sys.executable, "-c", script], "args": ["--flag"], "env": {"EXTRA": "e"}},
                          client=client_for(srv), model="m")
        state = await harness.run({"prompt": "What is 3 + 4?", "program": {"args": ["--task-arg"]}})
        res = state["program_result"]
        assert res["exit_code"] == 0, res
        assert res["stdout"].strip() == "The answer is \\boxed{7}. ['--flag', '--task-arg'] e"
        assert len(state["trajectory"]) == 1 and state["completion"][-1]["content"] == "The answer is \\boxed{7}."
        failing = Harness(program={"command": [sys.executable, "-c", "import sys; print('oops'); sys.exit(4)"]},
                          client=client_for(srv), model="m")
        state = await failing.run({"prompt": "x"})
        assert state["program_result"]["exit_code"] == 4 and state["error"] is None  # a task result, not an error
        await harness.teardown()
        await failing.teardown()


def test_program_forms_are_validated():
    with pytest.raises(ConfigError, match="exactly one"):
        Harness(program={"fn": "a:b", "command": ["x"]})
    with pytest.raises(ConfigError, match="unknown program field"):
        Harness(program={"command": ["x"], "cmd": 1})
    with pytest.raises(ConfigError, match="non-empty list"):
        Harness(program={"command": "ls"})
    with pytest.raises(ConfigError, match="sandbox"):
        Harness(program=lambda t, s: None, sandbox={"image": "x"})
    with pytest.raises(ConfigError, match="write must be a boolean"):
        Toolset(tools=[add], write="yes")
    with pytest.raises(ValueError, match="write"):
        Toolset(config={"write": "yes"})
    with pytest.raises(ConfigError, match="per rollout"):
        Harness(program={"base": True}, sandbox={"scope": "group"})
    with pytest.raises(ConfigError, match="framework paths"):
        Toolset(tools=[add], bindings={"add.secret": "literal"})
    with pytest.raises(ConfigError, match="no tool"):
        Toolset(tools=[add], bindings={"nope.secret": "task.answer"})
    with pytest.raises(ValueError, match="progam"):
        Harness(config={"progam": None})


async def test_toolset_object_scopes():
    built = []

    def factory():
        built.append(1)
        return {"n": len(built)}

    def which(db: dict) -> str:
        """Which db."""
        return str(db["n"])

    # an explicit scope wins; without one, write=True is per rollout and read-only (the default) global
    cases = [({"scope": "rollout"}, 3), ({"scope": "group"}, 2), ({"scope": "global"}, 1),
             ({}, 1), ({"write": True}, 3), ({"write": True, "scope": "group"}, 2),
             ({"config": {"write": True}}, 3), ({"config": {"write": False}}, 1)]
    for kwargs, expected in cases:
        built.clear()
        ts = Toolset(tools=[which], objects={"db": factory}, bindings={"which.db": "objects.db"}, **kwargs)
        for example_id in (0, 0, 1):
            task = Task(prompt="x", example_id=example_id)
            state = State.for_task(task)
            tools, defs = await ts.resolve(task, state)
            assert defs[0].parameters["properties"] == {}
            await tools["which"]()
            await ts.cleanup(task, state)
        assert len(built) == expected, kwargs


MCP_SERVER = textwrap.dedent("""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calc")

    @server.tool()
    def multiply(a: int, b: int) -> str:
        '''Multiply two integers.'''
        return str(a * b)

    server.run("stdio")
""")


async def test_mcp_tool_over_stdio_in_the_base_loop(tmp_path):
    script = tmp_path / "mcp_server.py"
    script.write_text(MCP_SERVER)
    async with ModelServer(tool_then_answer("multiply", {"a": 6, "b": 7})) as srv:
        harness = Harness(client=client_for(srv), model="m",
                          toolsets=[Toolset(tools=[MCPTool(sys.executable, [str(script)])], scope="global")])
        state = await harness.run({"prompt": "6 * 7?"})
        assert state["error"] is None, state["error"]
        assert state["completion"][1] == {"role": "tool", "tool_call_id": state["completion"][0]["tool_calls"][0]["id"],
                                          "content": "42"}
        assert srv.requests[0].tools[0]["name"] == "multiply"
        assert srv.requests[0].tools[0]["parameters"]["required"] == ["a", "b"]
        assert state["completion"][-1]["content"] == "42"
        await harness.teardown()


MCP_PID_SERVER = textwrap.dedent("""
    import os

    from mcp.server.mcpserver import MCPServer

    server = MCPServer("pid")
    calls = []

    @server.tool()
    def pid() -> str:
        '''The server's process id and how many calls it served.'''
        calls.append(1)
        return f"{os.getpid()}:{len(calls)}"

    server.run("stdio")
""")


def _alive(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_write_toolsets_get_an_mcp_server_process_per_rollout(tmp_path):
    """A write=True toolset's MCP server is started per rollout and stopped when it ends; a
    read-only one (the default) is one process shared by every rollout, stopped at teardown."""
    script = tmp_path / "mcp_pid.py"
    script.write_text(MCP_PID_SERVER)

    async def calls(ts):
        out = []
        for i in range(3):
            task = Task(prompt="x", example_id=i)
            state = State.for_task(task)
            tools, defs = await ts.resolve(task, state)
            assert [d.name for d in defs] == ["pid"]
            out.append((await tools["pid"]()).split(":"))
            await ts.cleanup(task, state)
        return out

    ts = Toolset(tools=[MCPTool(sys.executable, [str(script)])], write=True)
    per_rollout = await calls(ts)
    assert len({pid for pid, _ in per_rollout}) == 3 and [n for _, n in per_rollout] == ["1", "1", "1"]
    assert not any(_alive(pid) for pid, _ in per_rollout)  # each stopped with its rollout
    await ts.teardown()
    ts = Toolset(tools=[MCPTool(sys.executable, [str(script)])])
    shared = await calls(ts)
    assert len({pid for pid, _ in shared}) == 1 and [n for _, n in shared] == ["1", "2", "3"]
    assert _alive(shared[0][0])
    await ts.teardown()
    assert not _alive(shared[0][0])


# --------------------------------------------------------------------------- Env


def exact(task, state) -> float:
    return 1.0 if vf.extract_boxed_answer(state["completion"][-1]["content"] or "", strict=True) == task["answer"] else 0.0


def n_turns(task, state) -> float:
    return float(len(state["trajectory"]))


async def test_env_evaluates_like_a_classic_env():
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    cleaned = []
    taskset = Taskset(source=lambda: rows, taskset_id="arith", rewards=[exact], system_prompt="sys",
                      cleanups=[lambda t, s: cleaned.append(t["example_id"])])
    env = Env(taskset, Harness(metrics=[n_turns]))
    assert env.env_id == "arith" and len(env.get_dataset()) == 3
    async with ModelServer(compute(wrong_every=3)) as srv:
        out = await env.evaluate(client_for(srv), "m", num_examples=3, rollouts_per_example=2)
    rows_out = out["outputs"]
    assert len(rows_out) == 6 and {r["example_id"] for r in rows_out} == {0, 1, 2}
    assert all(r["metrics"]["n_turns"] == 1.0 for r in rows_out)
    assert sorted(r["reward"] for r in rows_out).count(0.0) == 2  # every third answer is wrong
    assert out["metadata"]["avg_reward"] == pytest.approx(4 / 6)
    assert sorted(cleaned) == [0, 0, 1, 1, 2, 2]
    assert srv.requests[0].messages[0] == {"role": "system", "content": "sys"}
    await env.teardown()


async def test_env_records_program_errors_and_keeps_going():
    def program(task, state):
        if task["example_id"] == 1:
            raise ValueError("broken task")
        state["completion"] = [{"role": "assistant", "content": "\\boxed{%s}" % task["answer"]}]

    env = Env(Taskset(source=[{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}], rewards=[exact]),
              Harness(program=program))
    async with ModelServer(fixed("unused")) as srv:
        out = await env.evaluate(client_for(srv), "m", num_examples=2, rollouts_per_example=1)
    by_id = {r["example_id"]: r for r in out["outputs"]}
    assert by_id[0]["reward"] == 1.0 and by_id[0]["error"] is None
    assert by_id[1]["reward"] == 0.0 and by_id[1]["error"] == "ValueError: broken task"
    assert by_id[1]["stop_condition"] == "has_error"
    await env.teardown()


def test_the_runs_isolation_reaches_the_harness_sandboxes():
    """-x isolation=gvisor on a v1 env puts gVisor on the spec its harness creates
    sandboxes from (it was recorded in metadata and not applied)."""
    env = Env(Taskset(source=[{"prompt": [{"role": "user", "content": "hi"}]}]),
              Harness(sandbox=SandboxConfig(image="vf-sandbox/python:3.11")))
    task = {"prompt": [{"role": "user", "content": "hi"}]}
    assert env.harness.sandbox_spec(task).isolation == "runc"
    env.set_kwargs(isolation="gvisor")
    assert env.harness.sandbox_spec(task).isolation == "gvisor" and env.isolation_in_use() == "gvisor"
    # the run's sandbox settings (-x) reach the harness's config, validated; none without a sandbox
    env.set_kwargs(image="other:1", pool_size=0, timeout_per_command_seconds=5)
    assert env.harness.sandbox.image == "other:1" and env.harness.sandbox_spec(task).image == "other:1"
    assert env.harness.effective_pool_size == 0 and env.harness.sandbox.timeout_per_command_seconds == 5
    with pytest.raises(ConfigError, match="invalid sandbox settings"):
        env.set_kwargs(cpu_cores="many")
    with pytest.raises(ConfigError, match="no sandbox"):
        Env(Taskset(source=[{"prompt": "x"}]), Harness()).set_kwargs(image="x")


# --------------------------------------------------------------------------- defects of session 3 (review.md)


def _swallowing_program(task, state):
    """A sync program that catches the model's failure and carries on as if it had answered."""
    import openai as _openai

    try:
        state.get_client(sync=True).chat.completions.create(model="m", messages=task["prompt"])
    except _openai.APIStatusError:
        state["gave_up"] = True


async def test_model_errors_surface_the_same_way_in_every_program_form(tmp_path, monkeypatch):
    """A failed model call the program never recovered from is the rollout's model error,
    whatever the program form did with the SDK's exception (it was only re-raised by the
    base loop: a callable / fn / command program turned it into a task error or nothing)."""
    from envs.clients.base import TransientModelError
    from testmodel.model_server import fail, fail_first

    pkg = tmp_path / "v1swallow"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(textwrap.dedent("""
        import openai

        def run(task, state):
            try:
                state.get_client(sync=True).chat.completions.create(model="m", messages=task["prompt"])
            except openai.APIStatusError:
                state["gave_up"] = True
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    ask = textwrap.dedent("""
        import json, os, urllib.request, urllib.error
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        try:
            urllib.request.urlopen(req)
        except urllib.error.HTTPError as exc:
            print("model failed", exc.code)
    """)

    async def raising(task, state):
        await state.get_client().chat.completions.create(model="m", messages=task["prompt"])

    forms = {"base": None, "callable-raises": raising, "callable-swallows": _swallowing_program,
             "fn": {"fn": "v1swallow.agent:run"}, "command": {"command": [sys.executable, "-c", ask]}}
    for status, expected in ((400, vf.ModelError), (503, TransientModelError)):
        async with ModelServer(fail(status)) as srv:
            for name, program in forms.items():
                harness = Harness(program=program, client=AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0),
                                  model="m")
                state = await harness.run({"prompt": "x"})
                assert isinstance(state["error"], expected), (name, status, repr(state["error"]))
                assert error_kind(state["error"]) == "model" and state["stop_condition"] == "has_error"
                await harness.teardown()
    # a program that recovers (a later call succeeds) has no error
    async def retrying(task, state):
        import openai as _openai

        try:
            await state.get_client().chat.completions.create(model="m", messages=task["prompt"])
        except _openai.APIStatusError:
            resp = await state.get_client().chat.completions.create(model="m", messages=task["prompt"])
            state["answer_seen"] = resp.choices[0].message.content

    async with ModelServer(fail_first(1, 503, then=compute())) as srv:
        harness = Harness(program=retrying, client=AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0),
                          model="m")
        state = await harness.run({"prompt": "What is 1 + 1?"})
        assert state["error"] is None and state["answer_seen"] == "The answer is \\boxed{2}."
        await harness.teardown()
    # under Env: the row says "model", and a transient failure is retried
    env = Env(Taskset(source=[{"prompt": "What is 2 + 2?", "answer": "4"}], rewards=[exact]),
              Harness(program=_swallowing_program))
    async with ModelServer(fail(400)) as srv:
        out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0), "m", num_examples=1)
    row = out["outputs"][0]
    assert row["error_kind"] == "model" and row["reward"] == 0.0, row["error"]
    await env.teardown()

    def answering(task, state):
        resp = state.get_client(sync=True).chat.completions.create(model="m", messages=task["prompt"])
        state["completion"] = [{"role": "assistant", "content": resp.choices[0].message.content}]

    env = Env(Taskset(source=[{"prompt": "What is 2 + 2?", "answer": "4"}], rewards=[exact]), Harness(program=answering))
    async with ModelServer(fail_first(1, 503, then=compute())) as srv:
        out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0), "m", num_examples=1,
                                 max_retries=1)
    row = out["outputs"][0]
    assert row["error"] is None and row["attempts"] == 2 and row["reward"] == 1.0
    await env.teardown()


async def test_model_auth_error_stops_the_run_as_in_the_classic_stack():
    from envs.clients.base import ModelAuthError
    from testmodel.model_server import fail

    env = Env(Taskset(source=[{"prompt": "x"}]), Harness(program=_swallowing_program))
    async with ModelServer(fail(401)) as srv:
        with pytest.raises(ModelAuthError):
            await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0), "m", num_examples=1)
    await env.teardown()


async def test_sync_user_code_runs_off_the_loop_and_a_raising_reward_scores_only_its_rollout_zero():
    import threading

    seen: dict[str, list[bool]] = {"reward": [], "metric": [], "setup": [], "tool": [], "program": [], "cleanup": []}

    def on_loop(kind):
        seen[kind].append(threading.current_thread() is threading.main_thread())

    calls = []

    def flaky(task, state) -> float:
        on_loop("reward")
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("reward bug")
        return 1.0

    def turns(task, state) -> float:
        on_loop("metric")
        return 1.0

    def tool(x: int) -> int:
        """Echo."""
        on_loop("tool")
        return x

    def program(task, state):
        on_loop("program")

    env = Env(Taskset(source=[{"prompt": "a"}], rewards=[flaky], setups=[lambda t, s: on_loop("setup")],
                      cleanups=[lambda t, s: on_loop("cleanup")]),
              Harness(program=program, metrics=[turns]))
    async with ModelServer(fixed("unused")) as srv:
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=2)
    rows = sorted(out["outputs"], key=lambda r: r["reward"])
    assert [r["reward"] for r in rows] == [0.0, 1.0]  # one raising call scores its rollout 0, not the group
    assert rows[0]["error"] == "ScoringError: scoring function flaky raised ZeroDivisionError: reward bug"
    assert rows[0]["error_kind"] == "task" and rows[1]["error"] is None
    assert rows[0]["metrics"]["turns"] == 1.0 and rows[1]["metrics"] == {"flaky": 1.0, "turns": 1.0}
    await env.teardown()
    ts = Toolset(tools=[tool])
    harness = Harness(program=program, toolsets=[ts], client=client_for(srv), model="m")
    task = Task(prompt="x")
    state = State.for_task(task)
    tools, _ = await ts.resolve(task, state)
    assert await tools["tool"](x=3) == 3
    for kind in ("reward", "metric", "setup", "program", "cleanup", "tool"):
        assert seen[kind] and not any(seen[kind]), (kind, seen[kind])  # never on the event loop's thread
    await harness.teardown()


async def test_sdk_clients_of_a_rollout_are_closed_when_it_ends():
    kept = []

    async def program(task, state):
        client = state.get_client()
        assert state.get_client() is client  # one per rollout, not one per call
        kept.extend([client, state.get_client(sync=True)])
        await client.chat.completions.create(model="m", messages=task["prompt"])

    async with ModelServer(compute()) as srv:
        harness = Harness(program=program, client=client_for(srv), model="m")
        state = await harness.run({"prompt": "What is 1 + 2?"})
        assert state["error"] is None and len(kept) == 2
        assert all(c.is_closed() for c in kept)
        await harness.teardown()


async def test_toolset_and_taskset_stops_end_the_base_loop():
    def product_seen(task, state) -> bool:
        """Any tool result so far (the toolset's own stop)."""
        return any(m.get("role") == "tool" for step in state["trajectory"] for m in step["prompt"]) or bool(
            state.get("tool_ran"))

    def mul_marking(a: int, b: int, state: dict) -> int:
        """Multiply."""
        state["tool_ran"] = True
        return a * b

    def never(task, state) -> bool:
        return False

    async with ModelServer(tool_then_answer("mul_marking", {"a": 2, "b": 3})) as srv:
        ts = Toolset(tools=[mul_marking], bindings={"mul_marking.state": lambda t, s: s}, stops=[product_seen])
        harness = Harness(client=client_for(srv), model="m", toolsets=[ts], stops=[never])
        state = await harness.run({"prompt": "x"})
        assert state["stop_condition"] == "product_seen" and len(state["trajectory"]) == 1  # no second model turn
        await harness.teardown()
    # a taskset's stop joins the harness's under Env
    def one_turn(task, state) -> bool:
        return len(state["trajectory"]) >= 1

    env = Env(Taskset(source=[{"prompt": "x"}], toolsets=[Toolset(tools=[mul])], stops=[one_turn]), Harness())
    async with ModelServer(tool_then_answer("mul", {"a": 2, "b": 3})) as srv:
        out = await env.evaluate(client_for(srv), "m", num_examples=1)
    assert out["outputs"][0]["stop_condition"] == "one_turn" and len(out["outputs"][0]["trajectory"]) == 1
    await env.teardown()
    # stops only mean something to the base loop: refused elsewhere, never ignored
    with pytest.raises(ConfigError, match="base tool loop only"):
        Harness(program=lambda t, s: None, toolsets=[Toolset(tools=[mul], stops=[never])])
    with pytest.raises(ConfigError, match="base tool loop only"):
        Env(Taskset(source=[{"prompt": "x"}], stops=[never]), Harness(program=lambda t, s: None))


def haggler(task, state, message):
    """A scripted user: asks a follow-up once, then stops; records what it saw."""
    state.setdefault("user_saw", []).append(message)
    if message == "":
        return "What is 2 + 2?"
    return "And what is 4 + 1?" if len(state["user_saw"]) <= (2 if task.get("prompt") == [] else 1) else None


async def test_a_simulated_user_answers_the_base_loop():
    async with ModelServer(compute()) as srv:
        harness = Harness(client=client_for(srv), model="m", user=haggler)
        state = await harness.run({"prompt": "What is 1 + 1?"})
        assert state["error"] is None and state["stop_condition"] == "no_tools_called"  # one reply allowed
        assert [m["role"] for m in state["completion"]] == ["assistant", "user", "assistant"]
        assert state["completion"][1]["content"] == "And what is 4 + 1?"
        assert state["completion"][2]["content"] == "The answer is \\boxed{5}." and len(state["trajectory"]) == 2
        assert state["user_saw"] == ["The answer is \\boxed{2}."]
        await harness.teardown()
        # UserConfig (a ref, more turns); a prompt-less task is opened by the user; a user that declines ends it
        env = Env(Taskset(source=[{"prompt": []}], user={"fn": f"{__name__}:haggler", "max_turns": 5}), Harness())
        out = await env.evaluate(client_for(srv), "m", num_examples=1)
        row = out["outputs"][0]
        assert row["error"] is None and row["stop_condition"] == "user_done"
        assert row["prompt"] == [{"role": "user", "content": "What is 2 + 2?"}]
        assert [m["content"] for m in row["completion"]] == ["The answer is \\boxed{4}.", "And what is 4 + 1?",
                                                              "The answer is \\boxed{5}."]
        await env.teardown()
    with pytest.raises(ConfigError, match="base tool loop only"):
        Harness(program=lambda t, s: None, user=haggler)
    with pytest.raises(ConfigError, match="keep one"):
        Env(Taskset(source=[{"prompt": "x"}], user=haggler), Harness(user=haggler))
    with pytest.raises(ValueError, match="max_trns"):
        Harness(user={"fn": haggler, "max_trns": 2})


async def test_updates_run_after_each_turn_and_advantages_replace_the_default():
    def count_turns(task, state):
        state["turns_seen"] = state.get("turns_seen", 0) + 1
        state["last_role"] = state["completion"][-1]["role"]

    def two_turns(task, state) -> bool:
        return state.get("turns_seen", 0) >= 2

    def scaled(tasks, states):
        return [10 * s["reward"] + i for i, s in enumerate(states)]

    taskset = Taskset(source=[{"prompt": "What is 1 + 2?", "answer": "3"}], rewards=[exact], advantages=[scaled],
                      toolsets=[Toolset(tools=[mul], updates=[count_turns])], stops=[two_turns])
    env = Env(taskset, Harness(max_turns=5))
    async with ModelServer(tool_then_answer("mul", {"a": 1, "b": 3}, answer="\\boxed{3}")) as srv:
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=2)
    rows = out["outputs"]
    assert all(r["stop_condition"] == "no_tools_called" and r["reward"] == 1.0 for r in rows), [(r["stop_condition"], r["reward"], r["error"], r["completion"]) for r in rows]
    assert sorted(r["advantage"] for r in rows) == [10.0, 11.0]  # not reward - mean (0.0)
    await env.teardown()
    # updates see the completion so far and feed the stops
    async with ModelServer(tool_then_answer("mul", {"a": 1, "b": 3})) as srv:
        harness = Harness(client=client_for(srv), model="m", updates=[count_turns], stops=[two_turns],
                          toolsets=[Toolset(tools=[mul])])
        state = await harness.run({"prompt": "x"})
        assert state["turns_seen"] == 1 and state["last_role"] == "tool" and state["stop_condition"] == "no_tools_called"
        await harness.teardown()
    with pytest.raises(ConfigError, match="base tool loop only"):
        Harness(program=lambda t, s: None, updates=[count_turns])
    bad = Env(Taskset(source=[{"prompt": "x"}], advantages=[lambda tasks, states: [0.0]]), Harness())
    async with ModelServer(fixed("a")) as srv:
        out = await bad.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=2)
    assert all("returned 1 values for a group of 2" in r["error"] for r in out["outputs"])
    await bad.teardown()


async def test_the_token_client_stitches_through_the_interception_endpoint(monkeypatch):
    """The v1 endpoint hands the rollout's state to the token client: turn 2 goes to the
    token route with the engine's turn-1 ids, and the steps record them."""
    monkeypatch.setenv("VF_TEST_KEY", "k")
    async with ModelServer(tool_then_answer("mul", {"a": 2, "b": 3})) as srv:
        cfg = vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY",
                              client_type="openai_chat_completions_token")
        harness = Harness(client=cfg, model="m", toolsets=[Toolset(tools=[mul])])
        state = await harness.run({"prompt": "2 * 3?"})
        assert state["error"] is None and [r.api for r in srv.requests] == ["chat", "chat_tokens"]
        t0, t1 = (step["tokens"] for step in state["trajectory"])
        assert srv.token_prompts == [t1["prompt_ids"]]
        assert t1["prompt_ids"][: len(t0["prompt_ids"]) + len(t0["completion_ids"])] == t0["prompt_ids"] + t0["completion_ids"]
        await harness.teardown()


async def test_the_endpoint_translates_the_responses_and_anthropic_apis():
    """A program may speak OpenAI Responses or Anthropic Messages to the endpoint: each call
    goes to the rollout's one client and is recorded like a chat call."""
    async def program(task, state):
        out = []
        resp = await state.get_client("responses").responses.create(model="x", input="What is 2 + 3?", max_output_tokens=50)
        out.append(resp.output_text)
        msg = await state.get_client("anthropic_messages").messages.create(
            model="x", max_tokens=50, system="be brief", messages=[{"role": "user", "content": "What is 4 + 4?"}])
        out.append(msg.content[0].text)
        tool = await state.get_client("anthropic_messages").messages.create(
            model="x", max_tokens=50, messages=[{"role": "user", "content": "go"}],
            tools=[{"name": "mul", "description": "Multiply.", "input_schema": {"type": "object", "properties": {}}}])
        out.append((tool.stop_reason, tool.content[0].name, tool.content[0].input))
        state["answers"] = out

    policy_calls = []

    def policy(req):
        from testmodel.model_server import Reply, ToolCallSpec, compute_answer

        policy_calls.append((req.api, req.messages, req.body))
        if req.tools:
            return Reply(tool_calls=[ToolCallSpec("mul", {"a": 2})])
        return Reply(content=f"\\\\boxed{{{compute_answer(req.last_user_text())}}}")

    async with ModelServer(policy) as srv:
        harness = Harness(program=program, client=client_for(srv), model="the-model")
        state = await harness.run({"prompt": "x"})
        assert state["error"] is None, state["error"]
        assert state["answers"] == ["\\\\boxed{5}", "\\\\boxed{8}", ("tool_use", "mul", {"a": 2})]
        assert {c[0] for c in policy_calls} == {"chat"}  # one client, whatever the program spoke
        assert policy_calls[0][2]["max_tokens"] == 50 and policy_calls[1][1][0] == {"role": "system", "content": "be brief"}
        assert len(state["trajectory"]) == 3 and all(r.model == "the-model" for r in srv.requests)
        await harness.teardown()
