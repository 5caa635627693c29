"""RendererClient (client_type "renderer") against the local model server's token-in generate route.

Real tokenization: a Qwen3-template renderer of the `renderers` package over a small
BPE tokenizer built here (testmodel.tokenizer) and loaded from disk by transformers;
the Hugging Face hub is never reached (HF_HUB_OFFLINE). The server reads the prompt
ids back into messages, refuses ids that are neither their conversation's rendering
nor an extension of an earlier turn, and answers with completion ids of the same
template."""

import sys

import pytest

import envs as vf
from envs.clients import make_client
from testmodel.model_server import ModelServer, Reply, ToolCallSpec, tool_script
from sandboxes.errors import ConfigError

import renderers  # noqa: E402  (the `renderers` extra is part of the dev install: fail loudly without it)
from renderers.base import load_tokenizer  # noqa: E402

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VF_TEST_KEY", "secret-key")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from testmodel.tokenizer import build_chatml_tokenizer

    return str(build_chatml_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def template(tokenizer_dir):
    """(tokenizer, renderer) of the server: the same template the client builds for itself."""
    tokenizer = load_tokenizer(tokenizer_dir)
    return tokenizer, renderers.create_renderer(tokenizer, renderers.Qwen3RendererConfig())


def config(srv, tokenizer_dir, **kw):
    return vf.ClientConfig(client_type="renderer", api_base_url=srv.base_url, api_key_var="VF_TEST_KEY",
                           renderer_model_name=tokenizer_dir, renderer_config={"name": "qwen3"}, **kw)


async def test_renderer_client_in_a_tool_env_records_tokens_and_bridges_turns(tokenizer_dir, template):
    """The first prompt is the renderer's rendering of the conversation (tools in the system
    turn); the tool-result turns keep the sampled ids verbatim and add only the new messages;
    every trajectory step records the ids the server got and sampled, with logprobs."""
    tokenizer, renderer = template

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    env = vf.ToolEnv(dataset=[{"question": "What is 2 + 3?", "answer": "5"}], tools=[add], max_turns=4)
    policy = tool_script([("add", {"a": 2, "b": 3}), ("add", {"a": 5, "b": 0})], answer="\\boxed{5}")
    async with ModelServer(policy, renderer=renderer, tokenizer=tokenizer) as srv:
        out = await env.evaluate(config(srv, tokenizer_dir), "m", num_examples=1, state_columns=["trajectory"],
                                 sampling_args={"temperature": 0.7, "max_tokens": 64})
    row = out["outputs"][0]
    assert row["error"] is None, row["error"]
    assert row["completion"][-1]["content"] == "\\boxed{5}"
    calls = [m["tool_calls"][0] for m in row["completion"] if m.get("tool_calls")]
    assert [(c["name"] if "name" in c else c["function"]["name"]) for c in calls] == ["add", "add"]
    # the policy saw the conversation the ids encode
    first, last = srv.requests[0], srv.requests[-1]
    assert first.api == "generate" and first.tools[0]["name"] == "add" and "2 + 3" in first.last_user_text()
    assert last.tool_results() == ["5", "5"]
    assert first.body["sampling_params"]["temperature"] == 0.7 and first.body["sampling_params"]["max_tokens"] == 64
    # turn 1: the client's own tokenization equals the template's rendering of the prompt
    prompt = [dict(m) for m in row["prompt"]]
    tools = [{"type": "function", "function": {k: v for k, v in t.model_dump().items() if v is not None}}
             for t in env.tool_defs]
    assert srv.generated[0] == {"token_ids": renderer.render(prompt, tools=tools, add_generation_prompt=True).token_ids,
                                "bridged": False}
    steps = row["trajectory"]
    assert len(steps) == 3 and [g["bridged"] for g in srv.generated] == [False, True, True]
    for step, sent in zip(steps, srv.generated):
        assert step["tokens"]["prompt_ids"] == sent["token_ids"]  # what the engine got is what the step records
        n = len(step["tokens"]["completion_ids"])
        assert step["tokens"]["completion_logprobs"] == pytest.approx([-0.01 * (i + 1) for i in range(n)])
        assert step["tokens"]["completion_mask"] == [1] * n and set(step["tokens"]["prompt_mask"]) == {0}
    for prev, step in zip(steps, steps[1:]):  # earlier turns' sampled ids kept as they were
        kept = prev["tokens"]["prompt_ids"] + prev["tokens"]["completion_ids"]
        assert step["tokens"]["prompt_ids"][: len(kept)] == kept
    assert "<tool_call>" in tokenizer.decode(steps[0]["tokens"]["completion_ids"])
    await env.teardown()


async def _turn(client, messages, trajectory, tools=None):
    """One model call as an env makes it; the step goes onto `trajectory`."""
    resp = await client.get_response(messages, "m", {}, tools=tools, state={"trajectory": trajectory})
    msg = {"role": "assistant", "content": resp.message.content, "reasoning_content": resp.message.reasoning_content}
    if resp.message.tool_calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in resp.message.tool_calls]
    trajectory.append({"prompt": list(messages), "completion": [msg], "tokens": resp.message.tokens.model_dump(),
                       "response": resp})
    return msg


def _thinking_policy(req):
    """Thinks aloud on every turn; calls `add` once, then answers."""
    if req.n_tool_turns() == 0 and req.tools:
        return Reply(reasoning_content="plan one", tool_calls=[ToolCallSpec("add", {"a": 1, "b": 2})])
    return Reply(reasoning_content=f"plan {req.call_index + 1}", content=f"answer {req.call_index}")


@pytest.mark.parametrize("flags, after_user", [
    ({}, False),  # Qwen3's template: thinking kept within a tool cycle, dropped at a new user turn
    ({"preserve_all_thinking": True}, True),
    ({"preserve_thinking_between_tool_calls": True}, False),
])
async def test_preserve_thinking_flags_change_the_rendered_prompt(tokenizer_dir, template, flags, after_user):
    """preserve_* reach the renderer as its thinking_retention: with preserve_all_thinking the
    turn after a new user message keeps the earlier sampled thinking (its ids extended);
    otherwise that prompt is rendered again by the template, which drops it."""
    tokenizer, renderer = template
    async with ModelServer(_thinking_policy, renderer=renderer, tokenizer=tokenizer) as srv:
        client = make_client(config(srv, tokenizer_dir, **flags))
        built = await client.renderer_for("m")
        assert built.config.thinking_retention == {"preserve_all_thinking": "all",
                                                   "preserve_thinking_between_tool_calls": "tool_cycle"}.get(
                                                       next(iter(flags), None))
        trajectory = []
        messages = [{"role": "user", "content": "What is 1 + 2?"}]
        call = await _turn(client, messages, trajectory, tools=[vf.Tool(name="add", description="Add two integers.",
                                                                        parameters=ADD["function"]["parameters"])])
        messages += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "3"}]
        answer = await _turn(client, messages, trajectory, tools=[vf.Tool(
            name="add", description="Add two integers.", parameters=ADD["function"]["parameters"])])
        # in the tool cycle the sampled ids (thinking included) are extended, whatever the flags
        kept = trajectory[0]["tokens"]["prompt_ids"] + trajectory[0]["tokens"]["completion_ids"]
        assert srv.generated[1]["token_ids"][: len(kept)] == kept
        assert "plan one" in tokenizer.decode(srv.generated[1]["token_ids"])
        messages += [answer, {"role": "user", "content": "And 2 + 2?"}]
        await _turn(client, messages, trajectory, tools=[vf.Tool(
            name="add", description="Add two integers.", parameters=ADD["function"]["parameters"])])
        third = srv.generated[2]
        assert third["bridged"] is after_user
        text = tokenizer.decode(third["token_ids"])
        assert ("plan one" in text) is after_user and ("plan 2" in text) is after_user
        if after_user:
            kept = trajectory[1]["tokens"]["prompt_ids"] + trajectory[1]["tokens"]["completion_ids"]
            assert third["token_ids"][: len(kept)] == kept
        await client.close()


async def test_renderer_client_overlong_prompt_and_config_errors(tokenizer_dir, template):
    tokenizer, renderer = template
    async with ModelServer(lambda req: Reply(content="hi"), renderer=renderer, tokenizer=tokenizer,
                           max_model_len=8) as srv:
        client = make_client(config(srv, tokenizer_dir))
        with pytest.raises(vf.OverlongPromptError):
            await client.get_response([{"role": "user", "content": "a prompt longer than eight tokens " * 3}],
                                      "local-model", {})
        resp = await client.get_response([{"role": "user", "content": "hi"}], "m", {})  # another model: no cap
        assert resp.message.content == "hi" and resp.message.tokens.completion_ids
        await client.close()
        with pytest.raises(ConfigError, match="thinking_retention"):
            make_client(config(srv, tokenizer_dir, preserve_all_thinking=True)
                        .model_copy(update={"renderer_config": {"name": "qwen3", "thinking_retention": "tool_cycle"}}))
        with pytest.raises(ConfigError, match="renderer_config"):
            make_client(config(srv, tokenizer_dir).model_copy(update={"renderer_config": {"name": "no-such"}}))
        with pytest.raises(ConfigError, match="renderer passed in"):
            vf.RendererClient(config(srv, tokenizer_dir, preserve_all_thinking=True), renderer=renderer)


def test_renderer_client_without_the_package_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "renderers" or m.startswith("renderers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "renderers", None)  # `import renderers` raises ImportError
    with pytest.raises(ConfigError, match=r"vf-sandbox\[renderers\]"):
        make_client(vf.ClientConfig(client_type="renderer", api_key_var="VF_TEST_KEY"))


async def test_renderer_client_behind_the_v1_interception_endpoint(tokenizer_dir, template):
    """A v1 harness's model calls go through the endpoint to the renderer client with the
    rollout's state: turn 2 extends turn 1's sampled ids, and the steps record them."""
    from envs.v1 import Harness, Toolset

    tokenizer, renderer = template

    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    async with ModelServer(tool_script([("mul", {"a": 2, "b": 3})]), renderer=renderer, tokenizer=tokenizer) as srv:
        harness = Harness(client=config(srv, tokenizer_dir), model="m", toolsets=[Toolset(tools=[mul])])
        state = await harness.run({"prompt": "2 * 3?"})
        assert state["error"] is None, state["error"]
        assert state["completion"][-1]["content"] == "6" and [r.api for r in srv.requests] == ["generate"] * 2
        t0, t1 = (step["tokens"] for step in state["trajectory"])
        assert [g["token_ids"] for g in srv.generated] == [t0["prompt_ids"], t1["prompt_ids"]]
        assert t1["prompt_ids"][: len(t0["prompt_ids"]) + len(t0["completion_ids"])] == (
            t0["prompt_ids"] + t0["completion_ids"])
        await harness.teardown()


async def test_chat_template_kwargs_reach_the_renderer_and_renderers_are_shared(tokenizer_dir, template, tmp_path,
                                                                                caplog):
    """`chat_template_kwargs` in extra_body configure the renderer (Qwen3's enable_thinking=False
    prefills an empty think block), never the engine; instances share built renderers; an
    unloadable tokenizer is a ConfigError."""
    tokenizer, _ = template
    no_thinking = renderers.create_renderer(tokenizer, renderers.Qwen3RendererConfig(enable_thinking=False))
    async with ModelServer(lambda req: Reply(content="ok"), renderer=no_thinking, tokenizer=tokenizer) as srv:
        a, b = make_client(config(srv, tokenizer_dir)), make_client(config(srv, tokenizer_dir))
        args = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 5},
                "tool_choice": "auto"}
        resp = await a.get_response([{"role": "user", "content": "hi"}], "m", args)
        assert resp.message.content == "ok" and srv.requests[0].body["sampling_params"]["top_k"] == 5
        assert "tool_choice" not in srv.requests[0].body["sampling_params"]
        assert "['tool_choice'] have no meaning for token-in generation" in caplog.text  # said, not silently dropped
        assert tokenizer.decode(srv.generated[0]["token_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert "chat_template_kwargs" not in srv.requests[0].body["sampling_params"]
        with pytest.raises(vf.ModelError, match="400"):  # without them: the template's thinking prompt
            await b.get_response([{"role": "user", "content": "hi"}], "m", {})
        assert await a.renderer_for("m") is await b.renderer_for("m")
        assert await a.renderer_for("m", {"enable_thinking": False}) is not await a.renderer_for("m")
        missing = make_client(config(srv, str(tmp_path / "no-tokenizer-here")))
        with pytest.raises(ConfigError, match="cannot load the tokenizer"):
            await missing.get_response([{"role": "user", "content": "hi"}], "m", {})
        for client in (a, b, missing):
            await client.close()
