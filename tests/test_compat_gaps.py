"""The compatibility gaps a user porting from the reference hits (issue 15), one
test each; the reference's own test files for parsers / rubrics / tool schemas /
client config run in tests/compat/."""

import io
import json
import logging

import pytest
from datasets import Dataset
from openai import AsyncOpenAI

import envs as vf
from testmodel.model_server import ModelServer, tool_then_answer


# --------------------------------------------------------------------------- Client


class ReferenceOnlyClient(vf.Client):
    """Implements exactly the reference's abstract methods, nothing else."""

    def setup_client(self, config):
        return None

    def to_native_prompt(self, messages):
        return messages, {}

    def to_native_tool(self, tool):
        return tool

    async def get_native_response(self, prompt, model, sampling_args, tools, **kwargs):
        if model == "boom":
            raise RuntimeError("provider down")
        return {"text": "hi"}

    def raise_from_native_response(self, response):
        return None

    def from_native_response(self, response):
        return vf.Response(id="r", model="m", message=vf.ResponseMessage(content=response["text"], finish_reason="stop"))

    async def close(self):
        return None


async def test_custom_client_with_only_the_reference_abstract_methods():
    client = ReferenceOnlyClient(object())
    resp = await client.get_response([{"role": "user", "content": "x"}], "m", {})
    assert resp.message.content == "hi"
    with pytest.raises(vf.ModelError, match="RuntimeError: provider down") as ei:
        await client.get_response([{"role": "user", "content": "x"}], "boom", {})
    assert isinstance(ei.value.__cause__, RuntimeError)


# --------------------------------------------------------------------------- types


def test_vf_types_are_dict_like_and_equal_to_their_dicts():
    tool = vf.Tool(name="add", description="Add.", parameters={"type": "object"})
    assert tool["name"] == "add" and tool.get("strict") is None and tool.get("nope", 1) == 1
    assert "description" in tool and "nope" not in tool
    assert tool == {"name": "add", "description": "Add.", "parameters": {"type": "object"}, "strict": None}
    assert tool != {"name": "add"}
    with pytest.raises(KeyError):
        tool["nope"]
    tool["description"] = "Sum."
    assert tool.description == "Sum." and dict(tool)["description"] == "Sum."
    sm = vf.SystemMessage(content="be brief")
    assert sm == {"role": "system", "content": "be brief"} and sm["role"] == "system"
    call = vf.ToolCall(id="1", name="f", arguments="{}")
    assert [call] == [{"id": "1", "name": "f", "arguments": "{}"}]


def test_reward_func_and_client_config_from_the_types_module():
    from envs.types import ClientConfig, EndpointClientConfig, RewardFunc  # noqa: F401

    assert ClientConfig is vf.ClientConfig and vf.RewardFunc is RewardFunc
    assert set(ClientConfig.model_fields["client_type"].annotation.__args__) >= {
        "openai_responses", "renderer", "nemorl_chat_completions"}


def test_client_config_endpoint_nesting_and_header_validation():
    cfg = vf.ClientConfig(endpoint_configs=[vf.ClientConfig(api_base_url="http://a/v1"), {"api_base_url": "http://b/v1"}])
    assert cfg.base_urls() == "http://a/v1,http://b/v1"
    with pytest.raises(ValueError, match="cannot include endpoint_configs"):
        vf.ClientConfig(endpoint_configs=[{"api_base_url": "http://a", "endpoint_configs": [{}]}])
    with pytest.raises(ValueError, match="non-empty strings"):
        vf.ClientConfig(extra_headers={" ": "x"})
    with pytest.raises(ValueError, match="values must be strings"):
        vf.EndpointClientConfig(extra_headers={"X-A": 1})


def test_sandbox_error_is_the_parent_of_sandbox_failures():
    from sandboxes.errors import AgentError, BackendUnavailable, SandboxCreateError, SandboxNotRunning, ServerStartError

    assert issubclass(vf.SandboxError, vf.InfraError)
    for cls in (SandboxCreateError, SandboxNotRunning, AgentError, ServerStartError):
        assert issubclass(cls, vf.SandboxError)
    assert not issubclass(BackendUnavailable, vf.SandboxError)
    assert vf.is_infra_error(RuntimeError("wrapped").with_traceback(None)) is False
    err = RuntimeError("tool failed")
    err.__cause__ = vf.SandboxError()
    assert vf.is_infra_error(err)


# --------------------------------------------------------------------------- datasets


def test_env_group_dataset_is_a_dataset_and_env_dataset_exists():
    a = vf.SingleTurnEnv(dataset=[{"question": "q1", "answer": "1"}])
    b = vf.SingleTurnEnv(dataset=[{"question": "q2", "answer": "2"}, {"question": "q3", "answer": "3"}],
                         eval_dataset=[{"question": "e", "answer": "e"}])
    group = vf.EnvGroup(envs=[a, b], env_names=["a", "b"])
    ds = group.get_dataset()
    assert isinstance(ds, Dataset) and len(ds) == 3
    assert [r["info"]["env_id"] for r in ds] == ["a", "b", "b"]
    assert isinstance(group.dataset, Dataset) and len(group.dataset) == 3
    assert isinstance(a.dataset, Dataset) and a.dataset[0]["prompt"] == [{"role": "user", "content": "q1"}]
    assert a.eval_dataset is None and isinstance(b.eval_dataset, Dataset) and len(b.eval_dataset) == 1
    assert len(group.get_dataset(n=2, seed=0)) == 2
    a.dataset = [{"question": "new", "answer": "x"}]
    assert a.get_dataset()[0]["prompt"][-1]["content"] == "new"


# --------------------------------------------------------------------------- tools


def look(name: str) -> list:
    """Return a picture and a caption."""
    return [{"type": "text", "text": f"caption of {name}"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]


async def test_tool_returning_content_parts_reaches_the_model_as_parts():
    async with ModelServer(tool_then_answer("look", {"name": "cat"}, answer="a cat")) as srv:
        env = vf.ToolEnv(tools=[look], dataset=[{"question": "look", "answer": "a cat"}])
        out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m",
                                 num_examples=1, rollouts_per_example=1)
        tool_msg = out["outputs"][0]["completion"][1]
        assert tool_msg["role"] == "tool" and tool_msg["content"] == look("cat")
        sent = [m for m in srv.requests[-1].messages if m.get("role") == "tool"][0]
        assert sent["content"] == look("cat")
    from envs.tool_schema import tool_message_content

    # anything that is not a list of text / image parts still becomes its str()
    assert tool_message_content({"a": 1}) == "{'a': 1}" and tool_message_content([{"type": "audio"}]) == "[{'type': 'audio'}]"


def test_convert_func_to_tool_def_is_the_reference_strict_schema():
    def search(query: str, limit: int = 5, tag: str | None = None) -> str:
        """Search pages.

        Args:
            query: What to look for.
            limit: At most this many.

        Returns:
            The hits.
        """
        return ""

    tool = vf.convert_func_to_tool_def(search)
    assert tool.strict is True and tool.description == "Search pages."
    p = tool.parameters
    assert p["title"] == "search_args" and p["additionalProperties"] is False
    assert p["required"] == ["query", "limit", "tag"]
    assert p["properties"]["query"] == {"type": "string", "title": "Query", "description": "What to look for."}
    assert p["properties"]["limit"]["default"] == 5
    assert "default" not in p["properties"]["tag"]  # a None default is dropped in strict mode


# --------------------------------------------------------------------------- rubrics / parsers


async def test_rubric_group_sums_same_named_functions():
    def correct(completion, answer) -> float:
        return 1.0

    def half(completion) -> float:
        return 0.5

    group = vf.RubricGroup([vf.Rubric(funcs=[correct]), vf.Rubric(funcs=[correct, half], weights=[2.0, 0.0])])
    state = vf.State(input={"prompt": [], "answer": "1", "example_id": 0})
    state["completion"] = [{"role": "assistant", "content": "1"}]
    state["metrics"] = {"recorded_earlier": 3.0}
    await group.score_rollout(state)
    assert state["metrics"] == {"recorded_earlier": 3.0, "correct": 2.0, "half": 0.5}
    assert state["reward"] == 3.0


def test_rubric_rejects_unknown_kwargs():
    with pytest.raises(TypeError):
        vf.Rubric(funcs=[], judge="x")


def test_think_and_xml_parsers_behave_as_the_reference():
    assert vf.ThinkParser().parse_answer([{"role": "assistant", "content": "42"}]) == ""
    assert vf.ThinkParser().parse_answer([{"role": "assistant", "content": "<think>a</think>42"}]) == "42"
    xp = vf.XMLParser(["reasoning", ("code", "answer")])
    assert xp.parse("<answer>unclosed").answer is None
    with pytest.raises(ValueError, match="Missing value for field 'code'"):
        xp.format(reasoning="r")


# --------------------------------------------------------------------------- logging


@pytest.fixture
def restore_envs_logger():
    names = (None, "envs", "httpx", "httpcore")
    saved = [(logging.getLogger(n), logging.getLogger(n).level, list(logging.getLogger(n).handlers),
              logging.getLogger(n).propagate) for n in names]
    yield
    for lg, level, handlers, propagate in saved:
        lg.setLevel(level)
        lg.handlers = handlers
        lg.propagate = propagate


def test_setup_logging_configures_the_package_logger(restore_envs_logger, tmp_path):
    buf = io.StringIO()
    vf.setup_logging("DEBUG", stream=buf)
    vf.setup_logging("DEBUG", stream=buf)  # twice: still one handler
    pkg = logging.getLogger("envs")
    assert pkg.level == logging.DEBUG and len(pkg.handlers) == 1 and pkg.propagate is False
    logging.getLogger("envs.some.module").debug("hello %s", "there")
    assert buf.getvalue().count("hello there") == 1

    buf = io.StringIO()
    vf.setup_logging("INFO", json_logging=True, stream=buf)
    logging.getLogger("envs.x").info("as json")
    logging.getLogger("my_env").info("env code too")
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [(r["name"], r["message"], r["level"]) for r in lines] == [("envs.x", "as json", "INFO"),
                                                                      ("my_env", "env code too", "INFO")]
    assert logging.getLogger("httpx").level == logging.WARNING

    log_file = tmp_path / "vf.log"
    vf.setup_logging("WARNING", console_logging=False, file_logging=True, log_file=str(log_file))
    logging.getLogger("envs.y").info("dropped")
    logging.getLogger("envs.y").warning("kept")
    assert "kept" in log_file.read_text() and "dropped" not in log_file.read_text()
    with pytest.raises(ValueError, match="log_file"):
        vf.setup_logging("INFO", file_logging=True)
    vf.setup_logging(None)
    assert logging.getLogger("envs").handlers == []


# --------------------------------------------------------------------------- clients


async def test_openai_responses_client_end_to_end_with_tools():
    from testmodel.model_server import Reply, ToolCallSpec

    def policy(req):
        if not req.tool_results():
            return Reply(tool_calls=[ToolCallSpec("add", {"a": 1, "b": 2})], reasoning_content="thinking")
        return Reply(content="\\boxed{" + req.tool_results()[-1] + "}")

    def add2(a: int, b: int) -> int:
        """Add."""
        return a + b

    async with ModelServer(policy) as srv:
        cfg = vf.ClientConfig(client_type="openai_responses", api_base_url=srv.base_url, api_key_var="EMPTY")
        from envs.clients import make_client

        client = make_client(cfg)
        assert type(client).__name__ == "OpenAIResponsesClient" and isinstance(client, vf.OpenAIResponsesClient)
        resp = await client.get_response([{"role": "system", "content": "s"}, {"role": "user", "content": "1+2?"}], "m",
                                         {"max_tokens": 50, "temperature": 0.2}, [vf.convert_func_to_tool_def(add2)])
        assert resp.message.tool_calls[0].name == "add" and json.loads(resp.message.tool_calls[0].arguments) == {"a": 1, "b": 2}
        assert resp.message.reasoning_content == "thinking" and resp.message.finish_reason == "tool_calls"
        body = srv.requests[-1].body
        assert srv.requests[-1].api == "responses" and body["max_output_tokens"] == 50 and body["tools"][0]["name"] == "add2"
        env = vf.ToolEnv(tools=[add2], dataset=[{"question": "1+2?", "answer": "3"}])
        env.tool_map["add"] = add2  # the scripted model calls it "add"
        out = await env.evaluate(cfg, "m", num_examples=1, rollouts_per_example=1)
        row = out["outputs"][0]
        assert row["error"] is None and row["completion"][-1]["content"] == "\\boxed{3}"
        # the tool round trip went back as function_call / function_call_output items
        last = srv.requests[-1]
        assert [i.get("type", "message") for i in last.body["input"]][-2:] == ["function_call", "function_call_output"]
        assert last.messages[-1] == {"role": "tool", "tool_call_id": row["completion"][0]["tool_calls"][0]["id"], "content": "3"}
        await client.close()


def test_every_reference_client_type_is_served_and_unknown_ones_refused():
    from typing import get_args

    from envs.clients import client_class
    from runner.config import CLIENT_TYPES
    from envs.types import ClientType
    from sandboxes.errors import ConfigError

    assert set(CLIENT_TYPES) == set(get_args(ClientType))
    assert client_class("renderer").__name__ == "RendererClient" and vf.RendererClient is client_class("renderer")
    with pytest.raises(ConfigError, match="unknown client type 'nope'"):
        client_class("nope")


async def test_client_config_connection_limit_is_honoured():
    import asyncio

    from envs.clients import make_client
    from testmodel.model_server import Reply

    inflight, peak = 0, 0

    async def policy(req):
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.2)
        inflight -= 1
        return Reply(content="ok")

    async with ModelServer(policy) as srv:
        for client_type, limit, expected in (("openai_chat_completions", 2, 2), ("openai_chat_completions", 100, 6),
                                             ("anthropic_messages", 3, 3), ("openai_responses", 2, 2)):
            peak = 0
            client = make_client(vf.ClientConfig(client_type=client_type, api_base_url=srv.base_url, api_key_var="EMPTY",
                                                 max_connections=limit, max_keepalive_connections=limit))
            await asyncio.gather(*(client.get_response([{"role": "user", "content": "x"}], "m", {}) for _ in range(6)))
            assert peak == expected, (client_type, limit, peak)
            await client.close()


def test_sandbox_env_reference_arguments_are_used_or_refused():
    from sandboxes.errors import ConfigError

    rows = [{"question": "q", "answer": "a"}]
    with pytest.raises(ConfigError, match="advanced_configs"):
        vf.SandboxEnv(dataset=rows, advanced_configs={"x": 1})
    env = vf.SandboxEnv(dataset=rows, team_id="team-7")
    with pytest.raises(ConfigError, match="prime backend only"):
        env.backend  # docker: a team means nothing there
    env = vf.SandboxEnv(dataset=rows, team_id="team-7")
    env.set_backend("prime", {"api_key": "k", "base_url": "http://127.0.0.1:9"})
    assert env.backend.config.team_id == "team-7"


# --------------------------------------------------------------------------- endpoint registry


def test_endpoint_toml_takes_the_reference_long_field_names(tmp_path):
    """api_base_url / api_key_var (the reference's ClientConfig names) beside url / key;
    both given must agree (issue 26 item 8)."""
    from runner.config import load_endpoints
    from sandboxes.errors import ConfigError

    p = tmp_path / "endpoints.toml"
    head = '[[endpoint]]\nendpoint_id = "mini"\nmodel = "openai/gpt-5-mini"\n'
    p.write_text(head + 'api_base_url = "https://api.example/v1"\napi_key_var = "EXAMPLE_KEY"\n')
    (ep,) = load_endpoints(p)["mini"]
    assert (ep.url, ep.key) == ("https://api.example/v1", "EXAMPLE_KEY")
    p.write_text(head + 'url = "https://api.example/v1"\napi_base_url = "https://api.example/v1"\n'
                 'key = "EXAMPLE_KEY"\napi_key_var = "EXAMPLE_KEY"\n')
    assert load_endpoints(p)["mini"][0].key == "EXAMPLE_KEY"
    p.write_text(head + 'url = "https://a/v1"\napi_base_url = "https://b/v1"\nkey = "K"\n')
    with pytest.raises(ConfigError, match="'url' and 'api_base_url' differ"):
        load_endpoints(p)
    p.write_text(head + 'api_base_url = "https://a/v1"\n')
    with pytest.raises(ConfigError, match=r"missing required key\(s\) \['key'\]"):
        load_endpoints(p)
