"""Model clients over real sockets with the real SDKs (local model server)."""

import json

import pytest

import envs as vf
from envs.clients import make_client
from testmodel.model_server import ModelServer, Reply, ToolCallSpec, fail, fail_first, fixed, stall, tool_then_answer

TOOLS = [vf.Tool(name="add", description="Add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("VF_TEST_KEY", "secret-key")


async def test_chat_client_response_tools_usage_and_headers():
    async with ModelServer(tool_then_answer("add", {"a": 1})) as srv:
        cfg = vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", extra_headers={"X-Team": "t1"})
        client = make_client(cfg)
        assert type(client).__name__ == "OpenAIChatCompletionsClient"
        resp = await client.get_response([{"role": "user", "content": "hi"}], "m", {"temperature": 0.1, "top_k": 5}, TOOLS, extra_headers={"X-Session-ID": "7"})
        assert resp.message.finish_reason == "tool_calls"
        assert resp.message.tool_calls[0].name == "add" and json.loads(resp.message.tool_calls[0].arguments) == {"a": 1}
        assert resp.usage.prompt_tokens > 0
        req = srv.requests[0]
        assert req.headers["Authorization"] == "Bearer secret-key"
        assert req.headers["X-Team"] == "t1" and req.headers["X-Session-ID"] == "7"
        assert req.body["temperature"] == 0.1 and req.body["top_k"] == 5  # unknown args go through extra_body
        assert req.tools[0]["name"] == "add"
        await client.close()


async def test_completions_client():
    async with ModelServer(fixed("done")) as srv:
        client = make_client(vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", client_type="openai_completions"))
        resp = await client.get_response("2+2=", "m", {"max_tokens": 5})
        assert resp.message.content == "done" and srv.requests[0].api == "completions"
        await client.close()


async def test_anthropic_client_system_and_tool_roundtrip():
    async with ModelServer(tool_then_answer("add", {"a": 2}, answer="four")) as srv:
        cfg = vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", client_type="anthropic_messages")
        client = make_client(cfg)
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add"}]
        r1 = await client.get_response(msgs, "claude", {}, TOOLS)
        assert r1.message.finish_reason == "tool_calls"
        call = r1.message.tool_calls[0]
        assert srv.requests[0].api == "anthropic" and srv.requests[0].messages[0]["content"] == "be brief"
        assert srv.requests[0].body["max_tokens"] > 0
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "add", "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
        r2 = await client.get_response(msgs, "claude", {}, TOOLS)
        assert r2.message.content == "four" and r2.message.finish_reason == "stop"
        assert srv.requests[1].tool_results() == ["3"]
        await client.close()


@pytest.mark.parametrize("client_type", ["openai_chat_completions", "anthropic_messages"])
async def test_auth_error_fails_fast_without_retries(client_type):
    async with ModelServer(fail(401)) as srv:
        client = make_client(vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", client_type=client_type, max_retries=5))
        with pytest.raises(vf.ModelAuthError):
            await client.get_response([{"role": "user", "content": "hi"}], "m", {})
        assert srv.count == 1
        await client.close()


async def test_transient_errors_are_retried():
    async with ModelServer(fail_first(2, 500, then=fixed("ok"))) as srv:
        client = make_client(vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", max_retries=3))
        resp = await client.get_response([{"role": "user", "content": "hi"}], "m", {})
        assert resp.message.content == "ok" and srv.count == 3
        await client.close()
    async with ModelServer(fail(429)) as srv:
        client = make_client(vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", max_retries=1))
        with pytest.raises(vf.ModelError) as ei:
            await client.get_response([{"role": "user", "content": "hi"}], "m", {})
        assert not isinstance(ei.value, vf.ModelAuthError) and srv.count == 2
        await client.close()


async def test_endpoint_down_is_model_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = make_client(vf.ClientConfig(api_base_url=f"http://127.0.0.1:{port}/v1", api_key_var="VF_TEST_KEY", max_retries=0))
    with pytest.raises(vf.ModelError, match="unreachable"):
        await client.get_response([{"role": "user", "content": "hi"}], "m", {})
    await client.close()


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("VF_NOT_SET_KEY", raising=False)
    with pytest.raises(vf.MissingKeyError, match="VF_NOT_SET_KEY"):
        make_client(vf.ClientConfig(api_base_url="http://127.0.0.1:1/v1", api_key_var="VF_NOT_SET_KEY"))


async def test_empty_response_is_invalid():
    async with ModelServer(lambda req: Reply(content="")) as srv:
        client = make_client(vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY"))
        with pytest.raises(vf.EmptyModelResponseError):
            await client.get_response([{"role": "user", "content": "hi"}], "m", {})
        await client.close()


async def test_replicas_round_robin_per_group_and_header_from_state():
    async with ModelServer(fixed("a")) as s1, ModelServer(fixed("b")) as s2:
        cfg = vf.ClientConfig(
            api_key_var="VF_TEST_KEY",
            endpoint_configs=[
                vf.EndpointClientConfig(api_base_url=s1.base_url, api_key_var="VF_TEST_KEY"),
                vf.EndpointClientConfig(api_base_url=s2.base_url, api_key_var="VF_TEST_KEY"),
            ],
            extra_headers_from_state={"X-Session-ID": "example_id"},
        )
        env = vf.SingleTurnEnv(dataset=[{"question": f"q{i}", "answer": ""} for i in range(4)])
        out = await env.evaluate(cfg, "m", num_examples=4, rollouts_per_example=2)
        assert s1.count == 4 and s2.count == 4  # groups alternate between replicas
        by_example = {}
        for o in out["outputs"]:
            by_example.setdefault(o["example_id"], set()).add(o["completion"][0]["content"])
        assert all(len(v) == 1 for v in by_example.values())  # a group stays on one replica
        assert {r.headers["X-Session-ID"] for r in s1.requests} | {r.headers["X-Session-ID"] for r in s2.requests} == {"0", "1", "2", "3"}
        assert "," in out["metadata"]["base_url"]


async def test_raw_sdk_clients_are_wrapped():
    from openai import AsyncOpenAI

    async with ModelServer(lambda req: Reply(tool_calls=[ToolCallSpec("x", {})], content=None)) as srv:
        client = make_client(AsyncOpenAI(base_url=srv.base_url, api_key="k"))
        resp = await client.get_response("plain string prompt", "m", {})
        assert resp.message.tool_calls[0].name == "x"
        assert srv.requests[0].messages == [{"role": "user", "content": "plain string prompt"}]
        await client.close()


def _closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.mark.parametrize("client_type", ["openai_chat_completions", "anthropic_messages"])
@pytest.mark.parametrize("case, policy, words", [
    ("connection_refused", None, "connection refused"),
    ("dns", None, "DNS lookup failed"),
    ("timeout", stall(30), "timed out"),
    ("rate_limit", fail(429), "rate limited (429)"),
    ("server_error", fail(503), "server error (5xx)"),
    ("auth", fail(401), "refused the API key (401)"),
])
async def test_model_api_errors_are_classified_by_cause(case, policy, words, client_type, caplog):
    """Issue 16: each failure of the model API says its cause (not a bare
    `APITimeoutError` for a refused connection); the client's own retries are
    each a log line (none for auth, which is not retried)."""
    import contextlib
    import logging

    async with contextlib.AsyncExitStack() as stack:
        if policy is not None:
            url = (await stack.enter_async_context(ModelServer(policy))).base_url
        else:
            url = _closed_port_url() if case == "connection_refused" else "http://vf-no-such-host.invalid/v1"
        client = make_client(vf.ClientConfig(api_base_url=url, api_key_var="VF_TEST_KEY", client_type=client_type,
                                             max_retries=1, timeout=1.0, connect_timeout=1.0))
        with caplog.at_level(logging.WARNING, logger="envs.clients"), pytest.raises(vf.ModelError) as ei:
            await client.get_response([{"role": "user", "content": "hi"}], "m", {})
        await client.close()
    err = ei.value
    assert err.cause == case and words in str(err), str(err)
    assert "APITimeoutError" not in str(err).split("(")[0]
    retries = [r for r in caplog.records if "model API client retry" in r.getMessage()]
    if case == "auth":
        assert isinstance(err, vf.ModelAuthError) and not retries
        assert "key read from $VF_TEST_KEY" in str(err) and url in str(err)
    else:
        assert not isinstance(err, vf.ModelAuthError) and err.retryable and len(retries) == 1
        if case in ("connection_refused", "dns"):
            assert url.rsplit("/v1", 1)[0] in str(err)  # the URL it tried


@pytest.mark.parametrize("client_type", ["openai_chat_completions", "anthropic_messages"])
async def test_prime_key_and_team_precedence(monkeypatch, tmp_path, client_type):
    """With api_key_var PRIME_API_KEY (the default): key $PRIME_API_KEY > ~/.prime/config.json,
    team $PRIME_TEAM_ID > ~/.prime/config.json, sent as X-Prime-Team-ID; no team header for
    another key variable."""
    (tmp_path / ".prime").mkdir()
    (tmp_path / ".prime" / "config.json").write_text(json.dumps({"api_key": "file-key", "team_id": "file-team"}))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)
    async with ModelServer(fixed("ok")) as srv:
        async def headers(**cfg):
            client = make_client(vf.ClientConfig(api_base_url=srv.base_url, client_type=client_type, **cfg))
            await client.get_response([{"role": "user", "content": "hi"}], "m", {"max_tokens": 5})
            await client.close()
            h = srv.requests[-1].headers
            return h.get("Authorization") or "Bearer " + h.get("x-api-key", ""), h.get("X-Prime-Team-ID")

        assert await headers() == ("Bearer file-key", "file-team")
        monkeypatch.setenv("PRIME_API_KEY", "env-key")
        monkeypatch.setenv("PRIME_TEAM_ID", "env-team")
        assert await headers() == ("Bearer env-key", "env-team")
        assert await headers(api_key_var="VF_TEST_KEY") == ("Bearer secret-key", None)


async def test_token_client_stitches_the_engines_tokens_across_turns():
    """openai_chat_completions_token: the first turn asks the chat route for token ids; the
    next turns send the previous turn's engine ids + the bridge tokens of the new messages
    to /v1/chat/completions/tokens (the server refuses ids that differ from its own
    tokenization of the conversation); every step records ids and logprobs."""
    from testmodel.model_server import tool_script

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    env = vf.ToolEnv(dataset=[{"question": "What is 2 + 3?", "answer": "5"}], tools=[add], max_turns=4)
    async with ModelServer(tool_script([("add", {"a": 2, "b": 3}), ("add", {"a": 5, "b": 0})], answer="\\boxed{5}")) as srv:
        cfg = vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY",
                              client_type="openai_chat_completions_token")
        out = await env.evaluate(cfg, "m", num_examples=1, state_columns=["trajectory"])
    row = out["outputs"][0]
    assert row["error"] is None, row["error"]
    assert [r.api for r in srv.requests] == ["chat", "chat_tokens", "chat_tokens"]
    first = srv.requests[0].body
    assert first["return_token_ids"] is True and first["logprobs"] is True
    steps = row["trajectory"]
    assert len(steps) == 3 and all(s["tokens"] and s["tokens"]["completion_ids"] for s in steps)
    for prev, step, sent in zip(steps, steps[1:], srv.token_prompts):
        assert sent == step["tokens"]["prompt_ids"]  # what the engine got is what the step records
        # the previous turn's engine ids are kept as they were, not re-tokenized
        assert sent[: len(prev["tokens"]["prompt_ids"]) + len(prev["tokens"]["completion_ids"])] == (
            prev["tokens"]["prompt_ids"] + prev["tokens"]["completion_ids"])
    assert len(steps[0]["tokens"]["completion_logprobs"]) == len(steps[0]["tokens"]["completion_ids"])
    assert steps[0]["tokens"]["completion_mask"] == [1] * len(steps[0]["tokens"]["completion_ids"])
    await env.teardown()


async def test_nemorl_client_carries_the_engines_tokens_both_ways():
    """nemorl_chat_completions against a NeMo Gym-style server: the ids in the returned
    message become the step's tokens, and later requests carry each earlier assistant
    turn's ids back (the server refuses ids that are not its own)."""
    from testmodel.model_server import tool_script

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    env = vf.ToolEnv(dataset=[{"question": "What is 2 + 3?", "answer": "5"}], tools=[add], max_turns=4)
    async with ModelServer(tool_script([("add", {"a": 2, "b": 3}), ("add", {"a": 5, "b": 0})], answer="\\boxed{5}"),
                           nemo_gym=True) as srv:
        cfg = vf.ClientConfig(api_base_url=srv.base_url, api_key_var="VF_TEST_KEY", client_type="nemorl_chat_completions")
        out = await env.evaluate(cfg, "m", num_examples=1)
    row = out["outputs"][0]
    assert row["error"] is None, row["error"]
    steps = row["trajectory"]
    assert len(steps) == 3 and all(s["tokens"]["completion_ids"] for s in steps)
    assert steps[0]["tokens"]["completion_logprobs"] == [-0.01 * (i + 1) for i in range(len(steps[0]["tokens"]["completion_ids"]))]
    last = srv.requests[-1].messages
    carried = [m["generation_token_ids"] for m in last if m["role"] == "assistant"]
    assert carried == [steps[0]["tokens"]["completion_ids"], steps[1]["tokens"]["completion_ids"]]
    assert all("generation_token_ids" not in m for m in row["completion"])  # the fields never reach results' messages
    await env.teardown()


def test_client_config_refuses_unknown_fields():
    """A misspelt client setting is an error naming it, never accepted and ignored."""
    from pydantic import ValidationError

    from envs.types import ClientConfig

    with pytest.raises(ValidationError, match="preserve_all_thinkin"):
        ClientConfig(preserve_all_thinkin=True)
