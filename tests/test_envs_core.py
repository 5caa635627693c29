"""Environment classes end to end against the local model server (real SDK, real sockets)."""

import asyncio
import json

import pytest
from sandboxes.errors import ConfigError
from openai import AsyncOpenAI

import envs as vf
from testmodel.model_server import ModelServer, PolicyRequest, Reply, compute, fixed, stall, tool_script, tool_then_answer
from envs.types import State


def rows(n):
    return [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def boxed_rubric():
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct(completion, answer, parser) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    return vf.Rubric(funcs=[correct], parser=parser)


@pytest.fixture
async def server():
    async with ModelServer(compute()) as srv:
        yield srv


def client_for(srv):
    return AsyncOpenAI(base_url=srv.base_url, api_key="x")


def test_package_exports_and_cheap_import():
    import subprocess
    import sys

    code = "import sys, envs; print(sorted(m for m in ('openai','anthropic','datasets') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    for name in ("SingleTurnEnv", "MultiTurnEnv", "ToolEnv", "StatefulToolEnv", "EnvGroup", "Rubric", "JudgeRubric",
                 "RubricGroup", "Parser", "XMLParser", "ThinkParser", "MaybeThinkParser", "extract_boxed_answer",
                 "extract_hash_answer", "ensure_keys", "MissingKeyError", "cleanup", "stop", "teardown", "State",
                 "Messages", "ChatMessage", "RolloutInput", "RolloutOutput", "TrajectoryStep", "RolloutTiming",
                 "TokenUsage", "GenerateOutputs", "GenerateMetadata", "ClientConfig", "Error", "ModelError"):
        assert hasattr(vf, name), name
    import sandboxes.errors

    assert vf.InfraError is sandboxes.errors.InfraError and vf.Error is sandboxes.errors.Error
    assert vf.OpenAIChatCompletionsClient.__name__ == "OpenAIChatCompletionsClient"


def test_state_forwards_input_fields():
    s = State(input={"prompt": "p", "answer": "a", "example_id": 3, "info": {}})
    assert s["answer"] == "a" and s.get("example_id") == 3 and "prompt" in s
    s["answer"] = "override"
    assert s["answer"] == "override"
    with pytest.raises(KeyError):
        s["missing"]


async def test_single_turn_evaluate_metadata_and_timing(server):
    env = vf.SingleTurnEnv(dataset=rows(6), system_prompt="box it", rubric=boxed_rubric())
    out = await env.evaluate(client_for(server), "m", num_examples=4, rollouts_per_example=2, max_concurrent=3)
    assert len(out["outputs"]) == 8
    o = out["outputs"][0]
    assert o["prompt"][0] == {"role": "system", "content": "box it"}
    assert o["completion"][0]["role"] == "assistant" and o["reward"] == 1.0
    assert o["stop_condition"] == "max_turns_reached" and o["is_completed"]
    t = o["timing"]
    assert t["model"]["duration"] > 0 and t["total"] >= t["model"]["duration"] and t["overhead"] >= 0
    assert o["token_usage"]["input_tokens"] > 0
    md = out["metadata"]
    assert md["avg_reward"] == 1.0 and md["pass_at_k"] == {"1": 1.0, "2": 1.0} and md["avg_error"] == 0.0
    assert md["num_examples"] == 4 and md["rollouts_per_example"] == 2 and md["version_info"]["vf_version"]
    json.dumps(md)
    json.dumps(out["outputs"])


async def test_concurrency_limit_is_respected():
    active, peak = 0, 0

    async def policy(req: PolicyRequest) -> Reply:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return Reply(content="x")

    async with ModelServer(policy) as srv:
        env = vf.SingleTurnEnv(dataset=rows(10))
        await env.evaluate(client_for(srv), "m", num_examples=10, rollouts_per_example=1, max_concurrent=3)
    assert peak == 3


def test_generate_sync_and_dataset_selection():
    with ModelServer(compute()).run_in_thread() as srv:
        env = vf.SingleTurnEnv(dataset=rows(10), rubric=boxed_rubric())
        ds = env.get_eval_dataset(n=3, seed=1)
        assert len(ds) == 3
        inputs = env.get_eval_inputs(2, 2)
        assert [i["example_id"] for i in inputs] == [0, 0, 1, 1]
        out = env.generate_sync(inputs, AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m")
        assert [o["reward"] for o in out["outputs"]] == [1.0] * 4


def test_hf_dataset_input():
    from datasets import Dataset

    env = vf.SingleTurnEnv(dataset=Dataset.from_list(rows(5)))
    ds = env.get_dataset(n=2)
    assert isinstance(ds, Dataset) and len(ds) == 2 and "prompt" in ds.column_names


class Lifecycle(vf.MultiTurnEnv):
    def __init__(self, log, fail_in=None, **kw):
        super().__init__(**kw)
        self.log = log
        self.fail_in = fail_in

    async def setup_state(self, state):
        if self.fail_in == "setup":
            raise RuntimeError("setup broke")
        state["turns_seen"] = 0
        return state

    async def env_response(self, messages, state, **kw):
        state["turns_seen"] += 1
        if self.fail_in == "env" and state["turns_seen"] == 1:
            raise ValueError("env broke")
        return [{"role": "user", "content": "again"}]

    @vf.stop(priority=50)
    async def enough(self, state):
        return len(state["trajectory"]) >= 2

    @vf.cleanup
    async def c_low(self, state):
        self.log.append(("cleanup_low", state.get("example_id")))

    @vf.cleanup(priority=10)
    async def c_high(self, state):
        self.log.append(("cleanup_high", state.get("example_id")))
        raise RuntimeError("a failing cleanup must not skip the others")

    @vf.teardown
    async def t_one(self):
        self.log.append(("teardown", None))


async def test_stop_cleanup_teardown_order_and_errors(server):
    log = []
    env = Lifecycle(log, dataset=rows(2), max_turns=5)
    out = await env.evaluate(client_for(server), "m", num_examples=2, rollouts_per_example=1)
    assert all(o["stop_condition"] == "enough" and o["metrics"]["num_turns"] == 2 for o in out["outputs"])
    assert [e[0] for e in log] == ["cleanup_high", "cleanup_low"] * 2
    await env.teardown()
    await env.teardown()
    assert log.count(("teardown", None)) == 1
    # discovered stop conditions: has_error first (priority 100), then ours (50)
    names = [c.__name__ for c in env.stop_conditions()]
    assert names[0] == "has_error" and names[1] == "enough"


@pytest.mark.parametrize("where", ["setup", "env"])
async def test_rollout_error_recorded_cleanup_runs_run_continues(server, where):
    log = []
    env = Lifecycle(log, fail_in=where, dataset=rows(3), max_turns=5)
    out = await env.evaluate(client_for(server), "m", num_examples=3, rollouts_per_example=1)
    assert len(out["outputs"]) == 3
    for o in out["outputs"]:
        assert o["error_info"]["type"] == ("RuntimeError" if where == "setup" else "ValueError")
        assert o["error"].startswith(o["error_info"]["type"] + ": ")
        assert o["error_kind"] == "task" and o["reward"] == 0.0 and o["stop_condition"] == "has_error"
    assert sum(1 for e in log if e[0] == "cleanup_low") == 3
    assert out["metadata"]["avg_error"] == 1.0


async def test_multiturn_timeout():
    class Slow(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kw):
            return [{"role": "user", "content": "more"}]

    async with ModelServer(stall(0.4, then=fixed("x"))) as srv:
        env = Slow(dataset=rows(1), timeout_seconds=0.6, max_turns=10)
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=1)
    o = out["outputs"][0]
    assert o["stop_condition"] == "timeout_reached" and o["error"] is None


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


async def test_tool_env_schema_calls_and_metrics():
    async with ModelServer(tool_then_answer("add", {"a": 2, "b": 3}, answer="\\boxed{5}")) as srv:
        env = vf.ToolEnv(tools=[add], dataset=[{"question": "add", "answer": "5"}], rubric=boxed_rubric())
        schema = env.tool_defs[0]
        assert schema.name == "add" and schema.description == "Add two integers."
        # the reference's strict schema: titles, every property required, closed object
        assert schema.parameters["properties"]["a"] == {"type": "integer", "description": "the first", "title": "A"}
        assert schema.parameters["properties"]["b"]["default"] == 0
        assert schema.parameters["required"] == ["a", "b"] and schema.parameters["additionalProperties"] is False
        assert schema.strict is True and schema.parameters["title"] == "add_args"
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=1)
        o = out["outputs"][0]
        assert [m["role"] for m in o["completion"]] == ["assistant", "tool", "assistant"]
        assert o["completion"][1]["content"] == "5" and o["reward"] == 1.0
        assert o["metrics"]["total_tool_calls"] == 1.0 and o["metrics"]["add_calls"] == 1.0
        assert o["stop_condition"] == "no_tools_called"
        assert srv.requests[0].tools[0]["name"] == "add"


async def test_tool_error_becomes_message_unless_stop_error():
    def explode(x: str) -> str:
        """Always fails."""
        raise KeyError("nope")

    async with ModelServer(tool_then_answer("explode", {"x": "1"}, answer="done")) as srv:
        env = vf.ToolEnv(tools=[explode], dataset=rows(1), error_formatter=lambda e: f"ERR {type(e).__name__}")
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=1)
        assert out["outputs"][0]["completion"][1]["content"] == "ERR KeyError" and out["outputs"][0]["error"] is None
        env = vf.ToolEnv(tools=[explode], dataset=rows(1), stop_errors=[KeyError])
        out = await env.evaluate(client_for(srv), "m", num_examples=1, rollouts_per_example=1)
        assert out["outputs"][0]["error_info"]["type"] == "ToolCallError" and "KeyError" in out["outputs"][0]["error_info"]["chain"]
        assert out["outputs"][0]["error"].startswith("ToolCallError: tool explode failed")


class Handle:
    def __init__(self):
        self.calls = []


class Stateful(vf.StatefulToolEnv):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.add_tool(self.run, args_to_skip=["handle"])
        self.handles = []

    async def run(self, command: str, handle: Handle) -> str:
        """Run a command.

        Args:
            command: what to run
        """
        handle.calls.append(command)
        return f"ran {command}"

    async def setup_state(self, state):
        state["handle"] = Handle()
        self.handles.append(state["handle"])
        return state

    async def update_tool_args(self, tool_name, tool_args, messages, state, **kw):
        return {**tool_args, "handle": state["handle"]}


async def test_stateful_tool_env_hidden_args_and_add_remove():
    async with ModelServer(tool_script([("run", {"command": "ls"}), ("run", {"command": "pwd"})], answer="ok")) as srv:
        env = Stateful(dataset=rows(2))
        params = env.tool_defs[0].parameters
        assert list(params["properties"]) == ["command"] and params["required"] == ["command"]
        assert "handle" not in json.dumps(srv.requests and srv.requests[0].tools or params)
        out = await env.evaluate(client_for(srv), "m", num_examples=2, rollouts_per_example=1)
        assert [h.calls for h in env.handles] == [["ls", "pwd"], ["ls", "pwd"]]
        assert "handle" not in json.dumps(srv.requests[0].tools)
        assert out["outputs"][0]["metrics"]["run_calls"] == 2.0
    env.remove_tool(env.run)
    assert env.tool_defs == [] and "run" not in env.tool_map
    env.add_tool(add)
    assert [t.name for t in env.tool_defs] == ["add"]


class FlakyInfra(vf.SingleTurnEnv):
    """Fails with a (wrapped) InfraError on the first `fail_times` attempts of every rollout."""

    def __init__(self, fail_times, **kw):
        super().__init__(**kw)
        self.fail_times = fail_times
        self.attempts = {}
        self.cleaned = 0

    async def setup_state(self, state):
        key = state["example_id"]
        self.attempts[key] = self.attempts.get(key, 0) + 1
        if self.attempts[key] <= self.fail_times:
            try:
                raise vf.InfraError("sandbox vanished")
            except vf.InfraError as exc:
                raise RuntimeError("tool wrapper") from exc
        return state

    @vf.cleanup
    async def count(self, state):
        self.cleaned += 1


async def test_rollout_retry_on_infra_error_reports_attempts(server):
    env = FlakyInfra(fail_times=2, dataset=rows(2), rubric=boxed_rubric())
    env.retry_policy = env.retry_policy.model_copy(update={"initial_delay": 0.01, "jitter": 0.0})
    out = await env.evaluate(client_for(server), "m", num_examples=2, rollouts_per_example=1, max_retries=3)
    assert [o["attempts"] for o in out["outputs"]] == [3, 3]
    assert all(o["error"] is None and o["reward"] == 1.0 for o in out["outputs"])
    assert env.cleaned == 6  # cleanup ran for every attempt, failed ones included

    env = FlakyInfra(fail_times=5, dataset=rows(1))
    env.retry_policy = env.retry_policy.model_copy(update={"initial_delay": 0.01, "jitter": 0.0})
    out = await env.evaluate(client_for(server), "m", num_examples=1, rollouts_per_example=1, max_retries=1)
    o = out["outputs"][0]
    assert o["attempts"] == 2 and o["error_kind"] == "infra" and o["error_type"] == "RuntimeError"
    assert "InfraError" in o["error_info"]["chain"]


async def test_task_errors_are_not_retried(server):
    class TaskFail(vf.SingleTurnEnv):
        n = 0

        async def setup_state(self, state):
            TaskFail.n += 1
            raise ValueError("task bug")

    env = TaskFail(dataset=rows(1))
    out = await env.evaluate(client_for(server), "m", num_examples=1, rollouts_per_example=1, max_retries=3)
    assert TaskFail.n == 1 and out["outputs"][0]["attempts"] == 1 and out["outputs"][0]["error_kind"] == "task"


async def test_model_auth_error_aborts_generate():
    from testmodel.model_server import fail

    async with ModelServer(fail(401)) as srv:
        env = vf.SingleTurnEnv(dataset=rows(3))
        with pytest.raises(vf.ModelAuthError):
            await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="bad", max_retries=0), "m", num_examples=3, rollouts_per_example=1)


async def test_env_recorded_metrics_appear(server):
    class Metered(vf.SingleTurnEnv):
        async def setup_state(self, state):
            self.record_metric(state, "setup_cost", 2.5)
            state["custom_col"] = {"x": 1}
            return state

    env = Metered(dataset=rows(2), rubric=boxed_rubric())
    out = await env.evaluate(client_for(server), "m", num_examples=2, rollouts_per_example=1, state_columns=["custom_col", "trajectory"])
    o = out["outputs"][0]
    assert o["metrics"]["setup_cost"] == 2.5 and o["metrics"]["correct"] == 1.0
    assert out["metadata"]["avg_metrics"]["setup_cost"] == 2.5
    assert o["custom_col"] == {"x": 1} and len(o["trajectory"]) == 1


async def test_env_group_routes_by_env_id(server):
    a = vf.SingleTurnEnv(dataset=rows(2), system_prompt="A", rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
    b = vf.SingleTurnEnv(dataset=rows(3), system_prompt="B", rubric=vf.Rubric(funcs=[lambda completion: 0.25]))
    group = vf.EnvGroup(envs=[a, b], env_names=["a", "b"])
    out = await group.evaluate(client_for(server), "m", num_examples=-1, rollouts_per_example=1)
    by_env = {}
    for o in out["outputs"]:
        by_env.setdefault(o["info"]["env_id"], []).append(o["reward"])
    assert by_env == {"a": [1.0, 1.0], "b": [0.25, 0.25, 0.25]}


async def test_independent_scoring_and_set_kwargs(server):
    env = vf.SingleTurnEnv(dataset=rows(2), rubric=boxed_rubric())
    env.set_kwargs(score_rollouts=False, max_seq_len=100)
    assert env.score_rollouts is False and env.max_seq_len == 100
    # a key the env has no setting for is refused, naming it, and nothing is applied
    with pytest.raises(ConfigError, match="'custom_attr'"):
        env.set_kwargs(max_seq_len=7, custom_attr=5)
    assert env.max_seq_len == 100 and not hasattr(env, "custom_attr")
    # a method is not a setting, and max_workers (only the initial pool size) would be ignored
    with pytest.raises(ConfigError, match="'rollout'"):
        env.set_kwargs(rollout=5)
    with pytest.raises(ConfigError, match="use -c 8 instead of -x max_workers"):
        env.set_kwargs(max_workers=8)
    out = await env.evaluate(client_for(server), "m", num_examples=2, rollouts_per_example=2)
    assert all(o["reward"] == 0.0 for o in out["outputs"])
    env.set_score_rollouts(True)
    out = await env.evaluate(client_for(server), "m", num_examples=2, rollouts_per_example=2, independent_scoring=True)
    assert all(o["reward"] == 1.0 for o in out["outputs"])


async def test_completion_message_type():
    async with ModelServer(fixed("42")) as srv:
        env = vf.SingleTurnEnv(dataset=[{"question": "6*7=", "answer": "42"}], message_type="completion",
                               rubric=vf.Rubric(funcs=[lambda completion, answer: float(completion.strip() == answer)]))
        from envs.clients import make_client
        client = make_client(vf.ClientConfig(api_base_url=srv.base_url, api_key_var="", client_type="openai_completions"))
        out = await env.evaluate(client, "m", num_examples=1, rollouts_per_example=1)
        assert out["outputs"][0]["completion"] == "42" and out["outputs"][0]["reward"] == 1.0
        assert srv.requests[0].api == "completions"
        await client.close()


async def test_no_interleave_scoring_scores_after_generation(server):
    order = []

    class Tracked(vf.SingleTurnEnv):
        async def setup_state(self, state):
            order.append("gen")
            return state

    def scored(completion) -> float:
        order.append("score")
        return 1.0

    env = Tracked(dataset=rows(4), rubric=vf.Rubric(funcs=[scored]))
    out = await env.generate(env.get_eval_inputs(4, 1), client_for(server), "m", interleave_scoring=False, max_concurrent_scoring=1)
    assert order == ["gen"] * 4 + ["score"] * 4 and all(o["reward"] == 1.0 for o in out["outputs"])


async def test_legacy_env_response_tuple_is_accepted(server):
    class Legacy(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kw):
            state["legacy"] = True
            return [{"role": "user", "content": "What is 2 + 2?"}], state

    env = Legacy(dataset=rows(1), max_turns=2, rubric=vf.Rubric(funcs=[lambda completion: float(len(completion))]))
    out = await env.evaluate(client_for(server), "m", num_examples=1, rollouts_per_example=1, state_columns=["legacy"])
    o = out["outputs"][0]
    assert [m["role"] for m in o["completion"]] == ["assistant", "user", "assistant"] and o["legacy"] is True


async def test_evaluate_save_results_api(server, tmp_path):
    env = vf.SingleTurnEnv(dataset=rows(3), rubric=boxed_rubric())
    run_dir = tmp_path / "run"
    out = await env.evaluate(client_for(server), "m", num_examples=3, rollouts_per_example=2, results_path=run_dir, save_results=True)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["reward"] == 1.0
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["avg_reward"] == out["metadata"]["avg_reward"] == 1.0 and meta["path_to_save"] == str(run_dir)
