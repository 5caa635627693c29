"""The local model server through real sockets and the real openai / anthropic SDKs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest

from testmodel.model_server import (
    ModelServer,
    PolicyRequest,
    Reply,
    ToolCallSpec,
    compute,
    compute_answer,
    fail,
    fail_first,
    fixed,
    stall,
    tool_then_answer,
)


async def test_chat_compute_and_usage():
    async with ModelServer(compute()) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x")
        resp = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is 12 * (3 + 4)?"}]
        )
        assert resp.choices[0].message.content == "The answer is \\boxed{84}."
        assert resp.choices[0].finish_reason == "stop"
        assert resp.usage.prompt_tokens > 0
        assert srv.count == 1 and srv.requests[0].model == "m"
        await client.close()


async def test_completions_endpoint():
    async with ModelServer(fixed("hello")) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x")
        resp = await client.completions.create(model="m", prompt="say hi")
        assert resp.choices[0].text == "hello"
        assert srv.requests[0].api == "completions"
        assert srv.requests[0].last_user_text() == "say hi"
        await client.close()


async def test_chat_tool_call_then_answer():
    async with ModelServer(tool_then_answer("add", {"a": 2, "b": 3})) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x")
        tools = [{"type": "function", "function": {"name": "add", "description": "add", "parameters": {"type": "object"}}}]
        msgs = [{"role": "user", "content": "add 2 and 3"}]
        r1 = await client.chat.completions.create(model="m", messages=msgs, tools=tools)
        call = r1.choices[0].message.tool_calls[0]
        assert r1.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
        assert srv.requests[0].tools[0]["name"] == "add"
        msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        r2 = await client.chat.completions.create(model="m", messages=msgs, tools=tools)
        assert r2.choices[0].message.content == "5"
        await client.close()


async def test_anthropic_messages_tool_roundtrip():
    async with ModelServer(tool_then_answer("bash", {"command": "ls"}, answer="done")) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.anthropic_base_url, api_key="x")
        tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
        msgs = [{"role": "user", "content": "list files"}]
        r1 = await client.messages.create(model="claude", max_tokens=100, system="sys", messages=msgs, tools=tools)
        assert r1.stop_reason == "tool_use"
        use = [b for b in r1.content if b.type == "tool_use"][0]
        assert use.name == "bash" and use.input == {"command": "ls"}
        assert srv.requests[0].messages[0] == {"role": "system", "content": "sys"}
        msgs += [
            {"role": "assistant", "content": [b.model_dump() for b in r1.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]},
        ]
        r2 = await client.messages.create(model="claude", max_tokens=100, messages=msgs, tools=tools)
        assert r2.content[0].text == "done" and r2.stop_reason == "end_turn"
        assert srv.requests[1].tool_results() == ["a.txt"]
        await client.close()


@pytest.mark.parametrize("status,exc", [(401, openai.AuthenticationError), (429, openai.RateLimitError), (500, openai.InternalServerError)])
async def test_failures_map_to_sdk_errors(status, exc):
    async with ModelServer(fail(status)) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=1)
        with pytest.raises(exc):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        # 401 is not retried by the SDK; 429 and 500 are (one retry here)
        assert srv.count == (1 if status == 401 else 2)
        await client.close()


async def test_anthropic_auth_error():
    async with ModelServer(fail(401)) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.anthropic_base_url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        await client.close()


async def test_fail_first_then_recover_and_custom_policy():
    async with ModelServer(fail_first(2, 500, then=fixed("ok"))) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=3)
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "ok" and srv.count == 3
        await client.close()

    seen: list[PolicyRequest] = []

    async def custom(req: PolicyRequest) -> Reply:
        seen.append(req)
        return Reply(tool_calls=[ToolCallSpec("f", {"x": len(req.messages)}, id="call_1")], content=None)

    async with ModelServer(custom) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x")
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.tool_calls[0].id == "call_1"
        assert json.loads(resp.choices[0].message.tool_calls[0].function.arguments) == {"x": 1}
        assert seen[0].headers.get("Authorization") == "Bearer x"
        await client.close()


async def test_stall_times_out_client():
    async with ModelServer(stall(5)) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=0.3)
        t0 = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert time.monotonic() - t0 < 3
        await client.close()


def test_run_in_thread_sync_client():
    with ModelServer(compute()).run_in_thread() as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")
        resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2"}])
        assert "\\boxed{4}" in resp.choices[0].message.content
        client.close()


def test_compute_answer_parsing():
    assert compute_answer("What is 3 + 4 * 2?") == "11"
    assert compute_answer("Compute 7/2.") == "3.5"
    assert compute_answer("no numbers here") is None


def test_cli_process_serves():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "testmodel.model_server", "--port", str(port), "--policy", "fixed:pong"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert "model server on" in proc.stdout.readline()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.json()["choices"][0]["message"]["content"] == "pong"
    finally:
        proc.terminate()
        proc.wait(10)
