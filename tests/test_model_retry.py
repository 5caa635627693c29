"""Transient model-API errors (connection errors, 429, 5xx) are classified by
both clients, through the real SDKs and real sockets, as TransientModelError
(carrying the server's Retry-After); a rollout that hits one is retried under
the env's policy, waits at least Retry-After, counts the tries in `attempts`,
and stays a model error ("model"), never a task or infra one. 401/403 and 400
are never retried. `max_retries` means extra tries after the first: the env's
`set_max_retries` holds unless `generate(max_retries=N)` overrides it."""

from __future__ import annotations

import socket
import time

import anthropic
import openai
import pytest

import envs as vf
from envs.clients import AnthropicMessagesClient, ModelAuthError, OpenAIChatCompletionsClient, TransientModelError
from envs.errors import ModelError, OverlongPromptError, error_kind
from testmodel.model_server import ModelServer, fail, fail_first, fixed
from sandboxes.retry import is_retryable


def rows(n):
    return [{"question": f"q{i}", "answer": "ok"} for i in range(n)]


def oai(srv, **kw):  # the SDK's own retries off: what is left is ours
    return OpenAIChatCompletionsClient(openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0, **kw))


def claude(srv):
    return AnthropicMessagesClient(anthropic.AsyncAnthropic(base_url=srv.anthropic_base_url, api_key="x", max_retries=0))


def kind_of(row) -> str | None:
    """The row's error kind, whichever serialisation the writer uses."""
    for key in ("error_info", "error"):
        if isinstance(row.get(key), dict) and "kind" in row[key]:
            return row[key]["kind"]
    return row.get("error_kind")


def fast(env, attempts_extra: int) -> None:
    env.set_max_retries(attempts_extra)
    env.retry_policy = env.retry_policy.model_copy(update={"initial_delay": 0.01, "max_delay": 0.05, "jitter": 0.0})


@pytest.mark.parametrize("make", [oai, claude], ids=["openai", "anthropic"])
@pytest.mark.parametrize("status", [429, 500, 503, 529])
async def test_transient_statuses_are_classified_with_retry_after(make, status):
    async with ModelServer(fail(status, retry_after=7)) as srv:
        client = make(srv)
        with pytest.raises(TransientModelError) as e:
            await client.get_response([{"role": "user", "content": "hi"}], "m")
        await client.close()
    assert e.value.status == status and e.value.retry_after == 7.0
    assert is_retryable(e.value) and error_kind(e.value) == "model"


@pytest.mark.parametrize("make", [oai, claude], ids=["openai", "anthropic"])
@pytest.mark.parametrize("status,cls", [(401, ModelAuthError), (403, ModelAuthError), (400, ModelError), (404, ModelError)])
async def test_auth_and_bad_requests_are_not_retryable(make, status, cls):
    async with ModelServer(fail(status)) as srv:
        client = make(srv)
        with pytest.raises(cls) as e:
            await client.get_response([{"role": "user", "content": "hi"}], "m")
        await client.close()
    assert not isinstance(e.value, TransientModelError) and not is_retryable(e.value)


async def test_context_overflow_400_is_an_overlong_prompt():
    async with ModelServer(fail(400, message="This model's maximum context length is 8 tokens")) as srv:
        client = oai(srv)
        with pytest.raises(OverlongPromptError):
            await client.get_response([{"role": "user", "content": "hi"}], "m")
        await client.close()


@pytest.mark.parametrize("make", ["openai", "anthropic"])
async def test_connection_refused_is_transient(make):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}"
    if make == "openai":
        client = OpenAIChatCompletionsClient(openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    else:
        client = AnthropicMessagesClient(anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0))
    with pytest.raises(TransientModelError, match="unreachable"):
        await client.get_response([{"role": "user", "content": "hi"}], "m")
    await client.close()


async def test_rollout_retried_on_5xx_counts_attempts_and_uses_env_policy():
    async with ModelServer(fail_first(2, 503, then=fixed("ok"))) as srv:
        env = vf.SingleTurnEnv(dataset=rows(1))
        fast(env, 3)
        out = await env.evaluate(oai(srv), "m", num_examples=1, rollouts_per_example=1)  # default: env's policy
        assert srv.count == 3
    row = out["outputs"][0]
    assert row["attempts"] == 3 and not row["error"]


@pytest.mark.parametrize("make,status", [(oai, 503), (claude, 429)], ids=["openai-503", "anthropic-429"])
async def test_retry_after_is_honoured_between_rollout_attempts(make, status):
    async with ModelServer(fail_first(1, status, then=fixed("ok"), retry_after=1)) as srv:
        env = vf.SingleTurnEnv(dataset=rows(1))
        fast(env, 1)  # the backoff alone would wait 10 ms
        t0 = time.monotonic()
        out = await env.evaluate(make(srv), "m", num_examples=1, rollouts_per_example=1)
        elapsed = time.monotonic() - t0
        assert srv.count == 2
    row = out["outputs"][0]
    assert row["attempts"] == 2 and not row["error"] and elapsed >= 0.95


async def test_exhausted_retries_leave_a_model_error_not_a_task_error():
    async with ModelServer(fail(503)) as srv:
        env = vf.SingleTurnEnv(dataset=rows(1))
        fast(env, 2)
        out = await env.evaluate(oai(srv), "m", num_examples=1, rollouts_per_example=1)
        assert srv.count == 3
    row = out["outputs"][0]
    assert row["attempts"] == 3 and kind_of(row) == "model"


async def test_generate_max_retries_overrides_the_env_policy():
    async with ModelServer(fail_first(1, 500, then=fixed("ok"))) as srv:
        env = vf.SingleTurnEnv(dataset=rows(1))
        fast(env, 3)
        out = await env.evaluate(oai(srv), "m", num_examples=1, rollouts_per_example=1, max_retries=0)
        assert srv.count == 1
    row = out["outputs"][0]
    assert row["attempts"] == 1 and kind_of(row) == "model"


async def test_400_is_not_retried():
    async with ModelServer(fail(400)) as srv:
        env = vf.SingleTurnEnv(dataset=rows(1))
        fast(env, 3)
        out = await env.evaluate(oai(srv), "m", num_examples=1, rollouts_per_example=1)
        assert srv.count == 1
    row = out["outputs"][0]
    assert row["attempts"] == 1 and kind_of(row) == "model"


async def test_auth_error_is_not_retried_and_aborts():
    async with ModelServer(fail(401)) as srv:
        env = vf.SingleTurnEnv(dataset=rows(1))
        fast(env, 3)
        with pytest.raises(ModelAuthError):
            await env.evaluate(oai(srv), "m", num_examples=1, rollouts_per_example=1)
        assert srv.count == 1
