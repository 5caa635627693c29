"""A local OpenAI- and Anthropic-compatible model server with scripted policies.

For tests, demos and benchmarks: real HTTP on a real loopback socket (aiohttp),
so the official `openai` and `anthropic` SDKs talk to it unmodified.

Routes (with or without the `/v1` prefix):

    POST /v1/chat/completions   OpenAI chat completions (tool calls included)
    POST /v1/completions        OpenAI legacy completions
    POST /v1/messages           Anthropic messages (tool_use / tool_result)
    POST /v1/responses          OpenAI Responses (function_call / function_call_output items)
    POST /v1/chat/completions/tokens   vLLM's token route: the prompt as token ids in `tokens`
                                (refused with 400 unless they equal the server's own
                                tokenization of `messages`, so a stitching error fails loudly)
    POST /tokenize              vLLM's tokenizer route: {"tokens", "count", "max_model_len"}
    POST /inference/v1/generate vLLM's token-in generate route (the renderer client's): the
                                prompt as `token_ids`, the completion as `token_ids` +
                                logprobs; needs `ModelServer(renderer=, tokenizer=)` (see below)
    GET  /v1/models             a one-model list
    GET  /health                "ok"

Streaming is not supported.

Tokens: the server has a toy chat template (each message is its role's id,
one id per whitespace-separated word of its content and tool calls, then the
stop id 2; a generation prompt is the assistant role's id) over a growing
vocabulary. A chat request with `return_token_ids` gets vLLM's fields back
(`prompt_token_ids`, the choice's `token_ids`, and logprobs when asked).
`ModelServer(nemo_gym=True)` answers as NeMo Gym's vllm_model server instead:
the ids in the assistant message (`prompt_token_ids`, `generation_token_ids`,
`generation_log_probs`), and earlier assistant messages that carry
`generation_token_ids` must match the server's own tokens (else 400).
`ModelServer(renderer=r, tokenizer=t)` (a `renderers` renderer of a ChatML
template, e.g. Qwen3's, and its tokenizer) serves the generate route: the
prompt ids are decoded and read back into messages (`testmodel.chatml`)
for the policy, and accepted only when they are the renderer's rendering of
those messages or extend an earlier prompt + completion this server produced
(a bridged turn), else 400; the reply is rendered by the same renderer into
completion ids (up to its stop token; without it for finish_reason "length").
`srv.generated` lists each request's ids and whether they were bridged (not the
rendering of their conversation, an extension of an earlier turn's ids).
`ModelServer(max_model_len=N)` reports N for the model "local-model" on /v1/models.

Policies
--------
A policy is any callable ``policy(req: PolicyRequest) -> Reply`` (sync or
async). ``PolicyRequest`` carries the request normalised to OpenAI chat form,
whatever API was called:

    req.api        "chat" | "chat_tokens" (the token route) | "generate" | "completions" | "anthropic" | "responses"
    req.model      the model name sent
    req.messages   list of {"role", "content", ["tool_calls"], ["tool_call_id"]}
                   (anthropic `system`, tool_use and tool_result blocks mapped
                   to system / assistant.tool_calls / role "tool" messages;
                   a completions prompt becomes one user message)
    req.tools      list of {"name", "description", "parameters"} (both APIs)
    req.body       the raw JSON body;  req.headers  the request headers (case-insensitive)
    req.call_index 0-based count of requests the server has seen so far
    req.last_user_text()  /  req.tool_results()  helpers

and returns a ``Reply``:

    Reply(content="text")                                   answer
    Reply(tool_calls=[ToolCallSpec("bash", {"command": "ls"})])   call tools
    Reply(error_status=500)  / 429 / 401                    fail with that HTTP status
    Reply(stall_seconds=30, content="late")                 answer after a delay
    Reply(content="...", finish_reason="length")            truncated answer

Ready-made policies: ``echo()``, ``fixed(text)``, ``compute()`` (evaluates the
last arithmetic expression in the user's message and answers ``\\boxed{n}``),
``tool_then_answer(name, args, answer=None)`` (calls the tool once, then
answers with the tool's output or ``answer``), ``tool_script([...])`` (a
sequence of tool calls, then an answer), ``fail(status)``, ``stall(seconds)``,
``sequence(p1, p2, ...)`` (the i-th request gets p_i, the last one repeats),
``fail_first(n, status, then)``, ``tool_compute(tool, arg)`` (calls the tool
with the prompt's arithmetic, then boxes its output), ``auto()`` (tool_compute
when tools are offered, else compute; the CLI default). ``policy_from_spec("compute")`` parses the
CLI's ``--policy`` strings.

Using it
--------
In async tests::

    async with ModelServer(compute()) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="x")
        anthropic = AsyncAnthropic(base_url=srv.anthropic_base_url, api_key="x")

In sync code or with a subprocess under test (runs its own loop in a thread)::

    with ModelServer(my_policy).run_in_thread() as srv:
        subprocess.run([... "-b", srv.base_url ...])

``srv.requests`` keeps the last 10,000 ``PolicyRequest``s, ``srv.count`` the
total. From a shell: ``python -m testmodel.model_server --port 8765 --policy compute``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import collections
import contextlib
import inspect
import itertools
import json
import operator
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from envs.protocols import anthropic_to_chat, responses_to_chat, text_of, tools_of

__all__ = [
    "ModelServer",
    "PolicyRequest",
    "Reply",
    "ToolCallSpec",
    "compute",
    "echo",
    "fail",
    "fail_first",
    "fixed",
    "policy_from_spec",
    "sequence",
    "stall",
    "auto",
    "tool_compute",
    "tool_script",
    "tool_then_answer",
]


# --------------------------------------------------------------------------- data


@dataclass
class ToolCallSpec:
    """One tool call the scripted model makes."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass
class Reply:
    """What the scripted model answers (or how it fails)."""

    content: str | None = None
    tool_calls: list[ToolCallSpec] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "tool_calls"; inferred when None
    error_status: int | None = None
    error_message: str = "scripted failure"
    retry_after_ms: int = 10  # sent with 429 / 5xx so SDK retries are quick in tests
    retry_after: float | None = None  # if set, sent as `retry-after: <seconds>` instead of retry-after-ms
    stall_seconds: float = 0.0
    reasoning_content: str | None = None


@dataclass
class PolicyRequest:
    """An incoming request, normalised to OpenAI chat form (see module docstring)."""

    api: str
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    body: dict[str, Any]
    headers: CIMultiDict[str]  # case-insensitive
    call_index: int

    def last_user_text(self) -> str:
        for msg in reversed(self.messages):
            if msg.get("role") == "user":
                return text_of(msg.get("content"))
        return ""

    def tool_results(self) -> list[str]:
        return [text_of(m.get("content")) for m in self.messages if m.get("role") == "tool"]

    def n_tool_turns(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant" and m.get("tool_calls"))


Policy = Callable[[PolicyRequest], "Reply | Awaitable[Reply]"]


# --------------------------------------------------------------------------- policies


def echo() -> Policy:
    """Answer with the last user message."""
    return lambda req: Reply(content=req.last_user_text())


def fixed(text: str) -> Policy:
    """Always answer `text`."""
    reply = Reply(content=text)
    return lambda req: reply


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_EXPR = re.compile(r"[-+*/%().\d\s]*\d[-+*/%().\d\s]*")


def safe_eval(expr: str) -> float | int:
    """Evaluate a pure arithmetic expression (numbers and + - * / // % ** only)."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)}")

    return ev(ast.parse(expr.strip(), mode="eval"))


def _format_number(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def compute_answer(text: str) -> str | None:
    """The value of the longest arithmetic expression in `text`, or None."""
    candidates = sorted((m.group(0) for m in _EXPR.finditer(text)), key=len, reverse=True)
    for cand in candidates:
        cand = cand.strip().rstrip(".")
        if not cand:
            continue
        try:
            return _format_number(safe_eval(cand))
        except Exception:
            continue
    return None


def compute(wrong_every: int = 0) -> Policy:
    """Answer ``\\boxed{value}`` of the arithmetic in the last user message.

    With `wrong_every=k`, every k-th request answers a wrong value (to get
    rewards that are neither all 0 nor all 1)."""

    def policy(req: PolicyRequest) -> Reply:
        value = compute_answer(req.last_user_text())
        if value is None:
            return Reply(content="I cannot compute that.")
        if wrong_every and req.call_index % wrong_every == wrong_every - 1:
            value = value + "1"
        return Reply(content=f"The answer is \\boxed{{{value}}}.")

    return policy


def tool_then_answer(
    name: str,
    args: dict[str, Any] | Callable[[PolicyRequest], dict[str, Any]],
    answer: str | Callable[[PolicyRequest], str] | None = None,
) -> Policy:
    """First turn: call tool `name` with `args`. After a tool result: answer
    `answer` (or the tool's last output when None)."""
    return tool_script([(name, args)], answer)


def tool_script(
    calls: list[tuple[str, dict[str, Any] | Callable[[PolicyRequest], dict[str, Any]]]],
    answer: str | Callable[[PolicyRequest], str] | None = None,
) -> Policy:
    """Call the tools in `calls` one per turn, then answer (see tool_then_answer)."""

    def policy(req: PolicyRequest) -> Reply:
        turn = req.n_tool_turns()
        if turn < len(calls):
            name, args = calls[turn]
            if callable(args):
                args = args(req)
            return Reply(tool_calls=[ToolCallSpec(name, args)])
        if callable(answer):
            return Reply(content=answer(req))
        if answer is not None:
            return Reply(content=answer)
        results = req.tool_results()
        return Reply(content=results[-1] if results else "")

    return policy


def tool_compute(tool: str = "calculator", arg: str = "expression") -> Policy:
    """Call `tool` with {arg: <the arithmetic in the user's message>}, then answer
    ``\\boxed{<tool output>}``."""

    def expression(req: PolicyRequest) -> dict[str, Any]:
        candidates = sorted((m.group(0).strip().rstrip(".") for m in _EXPR.finditer(req.last_user_text())), key=len, reverse=True)
        return {arg: candidates[0] if candidates else ""}

    def answer(req: PolicyRequest) -> str:
        results = req.tool_results()
        return f"The answer is \\boxed{{{results[-1].strip() if results else ''}}}."

    return tool_script([(tool, expression)], answer)


def auto() -> Policy:
    """`tool_compute` with the first offered tool when the request offers tools, else `compute`."""
    plain = compute()

    def policy(req: PolicyRequest) -> Reply | Awaitable[Reply]:
        if req.tools:
            params = req.tools[0].get("parameters", {}).get("properties", {}) or {"expression": {}}
            return tool_compute(req.tools[0]["name"], next(iter(params)))(req)
        return plain(req)

    return policy


def fail(status: int = 500, message: str | None = None, retry_after: float | None = None) -> Policy:
    """Fail every request with HTTP `status` (500, 429, 401, ...); with `retry_after`,
    the answer carries `Retry-After: <seconds>`."""
    reply = Reply(error_status=status, error_message=message or f"scripted HTTP {status}", retry_after=retry_after)
    return lambda req: reply


def stall(seconds: float = 3600.0, then: Policy | None = None) -> Policy:
    """Wait `seconds` before answering (with `then`, default echo)."""
    inner = then or echo()

    async def policy(req: PolicyRequest) -> Reply:
        await asyncio.sleep(seconds)
        return await _call_policy(inner, req)

    return policy


def sequence(*policies: Policy) -> Policy:
    """The i-th request (server-wide) is answered by policies[i]; the last one repeats."""

    async def policy(req: PolicyRequest) -> Reply:
        return await _call_policy(policies[min(req.call_index, len(policies) - 1)], req)

    return policy


def fail_first(n: int, status: int = 500, then: Policy | None = None, retry_after: float | None = None) -> Policy:
    """Fail the first `n` requests with `status`, then answer with `then` (default echo)."""
    return sequence(*([fail(status, retry_after=retry_after)] * n), then or echo())


def policy_from_spec(spec: str) -> Policy:
    """Parse a CLI policy: auto | tool-compute[:NAME[:ARG]] | echo | compute | fixed:TEXT | fail:STATUS | stall:SECONDS
    | tool:NAME:JSON_ARGS (call once, then answer the tool output)
    | py:MODULE:FACTORY (an importable zero-argument function returning a policy, e.g. an
    example environment's `scripted_policy`)."""
    kind, _, rest = spec.partition(":")
    if kind == "py":
        import importlib

        module, _, attr = rest.partition(":")
        return getattr(importlib.import_module(module), attr or "scripted_policy")()
    if kind == "auto":
        return auto()
    if kind == "tool-compute":
        name, _, arg = rest.partition(":")
        return tool_compute(name or "calculator", arg or "expression")
    if kind == "echo":
        return echo()
    if kind == "compute":
        return compute(int(rest) if rest else 0)
    if kind == "fixed":
        return fixed(rest)
    if kind == "fail":
        return fail(int(rest or 500))
    if kind == "stall":
        return stall(float(rest or 3600))
    if kind == "tool":
        name, _, args = rest.partition(":")
        return tool_then_answer(name, json.loads(args or "{}"))
    raise ValueError(f"unknown policy {spec!r} (echo, compute, fixed:TEXT, fail:STATUS, stall:S, tool:NAME:JSON, py:MODULE:FACTORY)")


async def _call_policy(policy: Policy, req: PolicyRequest) -> Reply:
    reply = policy(req)
    if inspect.isawaitable(reply):
        reply = await reply
    return reply  # type: ignore[return-value]


# --------------------------------------------------------------------------- normalisation


def _ntokens(text: str) -> int:
    return max(1, len(text.split())) if text else 0


# --------------------------------------------------------------------------- server


class ModelServer:
    """The HTTP server. Bind with `async with` (in a running loop) or `run_in_thread()`."""

    def __init__(self, policy: Policy | None = None, host: str = "127.0.0.1", port: int = 0, keep_requests: int = 10_000,
                 nemo_gym: bool = False, renderer: Any = None, tokenizer: Any = None,
                 max_model_len: int | None = None):
        self.policy: Policy = policy or echo()
        self.nemo_gym = nemo_gym  # answer as NeMo Gym's vllm_model server (tokens in the message)
        self.host = host
        self.port = port
        self.requests: collections.deque[PolicyRequest] = collections.deque(maxlen=keep_requests)
        self.count = 0
        self._counter = itertools.count()
        self._runner: web.AppRunner | None = None
        self._created = int(time.time())
        self._vocab: dict[str, int] = {}
        self.token_prompts: list[list[int]] = []  # the `tokens` of each token-route request
        self.renderer, self.tokenizer = renderer, tokenizer  # the generate route's template
        self.max_model_len = max_model_len
        self.generated: list[dict[str, Any]] = []  # per generate request: {"token_ids", "bridged"} (not the rendering)
        self._served: list[list[int]] = []  # prompt + completion ids of each generate reply

    # ---- addresses
    @property
    def base_url(self) -> str:
        """Base URL for the OpenAI SDK (ends in /v1)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Base URL for the Anthropic SDK (it appends /v1/messages itself)."""
        return f"http://{self.host}:{self.port}"

    # ---- lifecycle
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/chat/completions/tokens", self._chat_tokens)
            app.router.add_post(f"{prefix}/completions", self._completions)
            app.router.add_post(f"{prefix}/messages", self._messages)
            app.router.add_post(f"{prefix}/responses", self._responses)
            app.router.add_get(f"{prefix}/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/inference/v1/generate", self._generate)
        return app

    async def start(self) -> ModelServer:
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ModelServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def run_in_thread(self) -> Iterator[ModelServer]:
        """Serve from a background thread with its own event loop (for sync code)."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # surface bind errors to the caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=run, name="model-server", daemon=True)
        thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    # ---- handlers
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        card: dict[str, Any] = {"id": "local-model", "object": "model", "owned_by": "local"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [card]})

    async def _policy_reply(self, api: str, request: web.Request, body: dict[str, Any] | None = None,
                            messages: list[dict[str, Any]] | None = None) -> tuple[PolicyRequest, Reply]:
        body = await request.json() if body is None else body
        if api == "anthropic":
            messages = anthropic_to_chat(body)
        elif api == "completions":
            messages = [{"role": "user", "content": text_of(body.get("prompt"))}]
        elif api == "responses":
            messages = responses_to_chat(body)
        elif messages is None:
            messages = body.get("messages") or []
        req = PolicyRequest(
            api=api,
            model=str(body.get("model", "")),
            messages=messages,
            tools=tools_of(body, api),
            body=body,
            headers=CIMultiDict(request.headers),
            call_index=next(self._counter),
        )
        self.count += 1
        self.requests.append(req)
        reply = await _call_policy(self.policy, req)
        if reply.stall_seconds:
            await asyncio.sleep(reply.stall_seconds)
        return req, reply

    @staticmethod
    def _error(api: str, reply: Reply) -> web.Response:
        status = int(reply.error_status or 500)
        headers = {"retry-after-ms": str(reply.retry_after_ms), "retry-after": "0"} if status in (429, 500, 502, 503, 529) else {}
        if reply.retry_after is not None:
            headers = {"retry-after": f"{reply.retry_after:g}"}
        if api == "anthropic":
            kind = {401: "authentication_error", 429: "rate_limit_error", 400: "invalid_request_error"}.get(status, "api_error")
            payload = {"type": "error", "error": {"type": kind, "message": reply.error_message}}
        else:
            kind = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status, "server_error")
            payload = {"error": {"message": reply.error_message, "type": kind, "code": kind, "param": None}}
        return web.json_response(payload, status=status, headers=headers)

    @staticmethod
    def _arguments_json(call: ToolCallSpec) -> str:
        return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)

    def _usage(self, req: PolicyRequest, reply: Reply) -> tuple[int, int]:
        prompt_tokens = sum(_ntokens(text_of(m.get("content"))) for m in req.messages)
        completion_tokens = _ntokens(reply.content or "") + 8 * len(reply.tool_calls or [])
        return prompt_tokens, completion_tokens

    # ---- the toy chat template (see the module docstring)
    TOKEN_ROLES = {"system": 3, "user": 4, "assistant": 5, "tool": 6}
    TOKEN_END = 2

    def _word_ids(self, text: str) -> list[int]:
        return [self._vocab.setdefault(w, 100 + len(self._vocab)) for w in text.split()]

    def render_tokens(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` under the toy template."""
        ids: list[int] = []
        for m in messages:
            text = text_of(m.get("content"))
            for call in m.get("tool_calls") or []:
                text += f" {call['function']['name']} {call['function'].get('arguments') or ''}"
            ids += [self.TOKEN_ROLES.get(m.get("role", ""), 7), *self._word_ids(text), self.TOKEN_END]
        return ids + [self.TOKEN_ROLES["assistant"]] if add_generation_prompt else ids

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body.get("messages")
        if messages is None:
            ids = self._word_ids(text_of(body.get("prompt")))
        else:
            ids = self.render_tokens(messages, bool(body.get("add_generation_prompt", True)))
        return web.json_response({"count": len(ids), "max_model_len": 32768, "tokens": ids, "token_strs": None})

    async def _chat_tokens(self, request: web.Request) -> web.Response:
        body = await request.json()
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or tokens != self.render_tokens(body.get("messages") or []):
            return web.json_response({"error": {"message": "tokens do not match the conversation", "type": "BadRequest",
                                                "code": 400}}, status=400)
        self.token_prompts.append(tokens)
        return await self._chat(request, api="chat_tokens")

    # ---- the generate route (a renderer's template)
    @staticmethod
    def _bad_request(message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "BadRequest", "code": 400}}, status=400)

    def _completion_ids(self, reply: Reply) -> list[int]:
        """The reply as the renderer's template has a model sample it after the generation prompt."""
        msg: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
        if reply.reasoning_content:
            msg["reasoning_content"] = reply.reasoning_content
        if reply.tool_calls:
            msg["tool_calls"] = [{"id": call.id or f"call_{i}", "type": "function",
                                  "function": {"name": call.name, "arguments": self._arguments_json(call)}}
                                 for i, call in enumerate(reply.tool_calls)]
        context = [{"role": "user", "content": "x"}]
        prefix = self.renderer.render(context, add_generation_prompt=True).token_ids
        full = self.renderer.render([*context, msg], add_generation_prompt=False).token_ids
        assert full[: len(prefix)] == prefix, "the template renders the generation prompt differently"
        ids = list(full[len(prefix):])
        stops = set(self.renderer.get_stop_token_ids())
        end = next((i for i, t in enumerate(ids) if t in stops), len(ids) - 1)
        return ids[:end] if reply.finish_reason == "length" else ids[: end + 1]

    async def _generate(self, request: web.Request) -> web.Response:
        from testmodel.chatml import ChatMLError, parse_prompt

        if self.renderer is None or self.tokenizer is None:
            return self._bad_request("this server has no renderer: ModelServer(renderer=, tokenizer=)")
        body = await request.json()
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return self._bad_request("token_ids must be a list of ints")
        try:
            messages, tools = parse_prompt(self.tokenizer.decode(ids, skip_special_tokens=False))
        except (ChatMLError, ValueError, KeyError) as exc:
            return self._bad_request(f"token_ids are not a ChatML conversation: {exc}")
        expected = self.renderer.render(messages, tools=tools or None, add_generation_prompt=True).token_ids
        bridged = ids != list(expected)
        if bridged and not any(len(ids) > len(prev) and ids[: len(prev)] == prev for prev in self._served):
            return self._bad_request("token_ids are neither the rendering of their conversation nor an "
                                     "extension of an earlier prompt + completion")
        self.generated.append({"token_ids": ids, "bridged": bridged})
        req, reply = await self._policy_reply("generate", request, {**body, "tools": tools}, messages)
        if reply.error_status:
            return self._error("chat", reply)
        completion = self._completion_ids(reply)
        self._served.append(ids + completion)
        finish = reply.finish_reason or ("length" if completion[-1:] and completion[-1] not in
                                         self.renderer.get_stop_token_ids() else "stop")
        logprobs = [{"token": f"token_id:{t}", "logprob": -0.01 * (i + 1)} for i, t in enumerate(completion)]
        choice = {"index": 0, "token_ids": completion, "finish_reason": finish, "logprobs": {"content": logprobs}}
        return web.json_response({"request_id": f"gen-{req.call_index}", "choices": [choice]})

    async def _chat(self, request: web.Request, api: str = "chat") -> web.Response:
        req, reply = await self._policy_reply(api, request)
        if reply.error_status:
            return self._error("chat", reply)
        if self.nemo_gym:  # earlier assistant turns must carry the engine's own ids back
            for m in req.messages:
                ids = m.get("generation_token_ids") if m.get("role") == "assistant" else None
                if ids is not None and ids != self.render_tokens([m], add_generation_prompt=False)[1:]:
                    return web.json_response({"error": {"message": "generation_token_ids do not match the message",
                                                        "type": "BadRequest", "code": 400}}, status=400)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        finish = reply.finish_reason or "stop"
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": self._arguments_json(call)},
                }
                for call in reply.tool_calls
            ]
            finish = reply.finish_reason or "tool_calls"
        if reply.reasoning_content is not None:
            message["reasoning_content"] = reply.reasoning_content
        p, c = self._usage(req, reply)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{req.call_index}",
            "object": "chat.completion",
            "created": self._created,
            "model": req.model,
            "choices": [choice],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
        }
        if self.nemo_gym:  # NeMo Gym's vllm_model: the tokens ride in the message
            message["prompt_token_ids"] = self.render_tokens(req.messages)
            message["generation_token_ids"] = self.render_tokens([message], add_generation_prompt=False)[1:]
            message["generation_log_probs"] = [-0.01 * (i + 1) for i in range(len(message["generation_token_ids"]))]
        if req.body.get("return_token_ids"):  # vLLM's fields
            payload["prompt_token_ids"] = self.render_tokens(req.messages)
            choice["token_ids"] = self.render_tokens([message], add_generation_prompt=False)[1:]
            if req.body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": str(t), "logprob": -0.01 * (i + 1), "bytes": None,
                                                   "top_logprobs": []} for i, t in enumerate(choice["token_ids"])]}
        return web.json_response(payload)

    async def _completions(self, request: web.Request) -> web.Response:
        req, reply = await self._policy_reply("completions", request)
        if reply.error_status:
            return self._error("completions", reply)
        p, c = self._usage(req, reply)
        return web.json_response(
            {
                "id": f"cmpl-{req.call_index}",
                "object": "text_completion",
                "created": self._created,
                "model": req.model,
                "choices": [{"index": 0, "text": reply.content or "", "finish_reason": reply.finish_reason or "stop", "logprobs": None}],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
            }
        )

    async def _messages(self, request: web.Request) -> web.Response:
        req, reply = await self._policy_reply("anthropic", request)
        if reply.error_status:
            return self._error("anthropic", reply)
        content: list[dict[str, Any]] = []
        if reply.content:
            content.append({"type": "text", "text": reply.content})
        stop = {"length": "max_tokens", "tool_calls": "tool_use"}.get(reply.finish_reason or "", "end_turn")
        for call in reply.tool_calls or []:
            args = json.loads(call.arguments) if isinstance(call.arguments, str) else call.arguments
            content.append({"type": "tool_use", "id": call.id or f"toolu_{uuid.uuid4().hex[:12]}", "name": call.name, "input": args})
            stop = "tool_use"
        p, c = self._usage(req, reply)
        return web.json_response(
            {
                "id": f"msg_{req.call_index}",
                "type": "message",
                "role": "assistant",
                "model": req.model,
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": p, "output_tokens": c},
            }
        )


    async def _responses(self, request: web.Request) -> web.Response:
        req, reply = await self._policy_reply("responses", request)
        if reply.error_status:
            return self._error("responses", reply)
        output: list[dict[str, Any]] = []
        if reply.reasoning_content:
            output.append({"type": "reasoning", "id": f"rs_{req.call_index}",
                           "summary": [{"type": "summary_text", "text": reply.reasoning_content}]})
        if reply.content:
            output.append({"type": "message", "id": f"msg_{req.call_index}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
        for call in reply.tool_calls or []:
            cid = call.id or f"call_{uuid.uuid4().hex[:12]}"
            output.append({"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": call.name,
                           "arguments": self._arguments_json(call), "status": "completed"})
        truncated = reply.finish_reason == "length"
        p, c = self._usage(req, reply)
        return web.json_response({
            "id": f"resp_{req.call_index}", "object": "response", "created_at": self._created, "model": req.model,
            "status": "incomplete" if truncated else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "output": output, "usage": {"input_tokens": p, "output_tokens": c, "total_tokens": p + c},
        })


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--policy", default="auto", help="auto | tool-compute[:NAME[:ARG]] | echo | compute[:K] | fixed:TEXT | fail:STATUS | stall:S | tool:NAME:JSON")
    args = parser.parse_args(argv)
    server = ModelServer(policy_from_spec(args.policy), host=args.host, port=args.port)

    async def serve() -> None:
        await server.start()
        print(f"model server on {server.base_url} (policy {args.policy})", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
