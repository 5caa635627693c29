"""The program forms a v1 Harness runs: the base tool loop, a callable, an
importable `{"fn": "pkg.module:run"}` (in process here; in a sandbox:
`sandbox_python.py`), and `{"command": [...]}` locally or in a sandbox. Every
form reaches the model through the state's interception endpoint
(`state.get_client()` / OPENAI_BASE_URL)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

from sandboxes.errors import ConfigError

from ..sandbox_tools.common import DEFAULT_OUTPUT_LIMIT, cap_text
from ..tool_schema import tool_message_content
from .config import resolve_ref
from .user import User, user_messages
from .usercode import call_user

OUTPUT_LIMIT = DEFAULT_OUTPUT_LIMIT  # bytes of a command's stdout / stderr kept in program_result (head and tail)


def program_kind(program: Any) -> str:
    """"base", "callable", "fn" or "command" (ConfigError for anything else)."""
    if program is None:
        return "base"
    if callable(program):
        return "callable"
    if isinstance(program, Mapping):
        kinds = [k for k in ("base", "fn", "command") if program.get(k)]
        if len(kinds) != 1:
            raise ConfigError(f"a program mapping needs exactly one of base / fn / command, got {dict(program)!r}")
        known = {"base", "fn", "command", "env", "cwd", "timeout", "files", "args", "max_turns"}
        unknown = set(program) - known
        if unknown:
            raise ConfigError(f"unknown program field(s) {sorted(unknown)}; known: {sorted(known)}")
        if kinds[0] == "command" and not (isinstance(program["command"], list) and program["command"]):
            raise ConfigError("program.command must be a non-empty list of strings")
        return kinds[0]
    raise ConfigError(f"a program is None, a callable or a mapping, not {type(program).__name__}")


async def call_program(fn: Any, task: Any, state: Any, pool: Any = None) -> None:
    """An in-process program: async on the loop, sync in the harness's thread pool."""
    fn = resolve_ref(fn)
    if not callable(fn):
        raise ConfigError(f"program {fn!r} is not callable")
    await call_user(pool, fn, task, state)


def _openai_tool(tool: Any) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if tool.strict is not None:
        fn["strict"] = tool.strict
    return {"type": "function", "function": fn}


async def base_loop(task: Any, state: Any, system: list[dict[str, Any]], max_turns: int,
                    stops: list[Any], pool: Any = None, user: User | None = None,
                    updates: list[Any] | None = None) -> None:
    """The default endpoint-backed tool loop: ask, run the tools called, repeat; with
    a simulated `user`, an answer without tool calls gets the user's reply (user.py).
    After each turn the `updates` run (`(task, state)`, `state["completion"]` current),
    then the stop conditions are checked; the first that fires ends the loop."""
    client = state.get_client()
    tools = state.get_tools()
    tool_defs = state.runtime.get("tool_defs") or []
    if not state["prompt"] and user is not None:  # the user opens the conversation
        state["prompt"] = user_messages(await call_user(pool, user.fn, task, state, ""))
    messages: list[dict[str, Any]] = [*system, *state["prompt"]]
    start = len(messages)
    turns = replies = 0
    try:
        while True:
            if turns >= max_turns:
                state.stop("max_turns_reached")
                break
            msg = await _ask_model(client, state, messages, tool_defs)
            turns += 1
            if msg.tool_calls:
                for call in msg.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": await _run_tool(tools, call.function.name, call.function.arguments)})
            elif user is None or replies >= user.max_turns:
                state.stop("no_tools_called")
                break
            else:
                reply = user_messages(await call_user(pool, user.fn, task, state, msg.content or ""))
                replies += 1
                if not reply:
                    state.stop("user_done")
                    break
                messages.extend(reply)
            await _end_turn(task, state, messages[start:], updates, stops, pool)
            if state.get("is_completed"):
                break
    finally:  # a failed model call surfaces as the rollout's model error (harness.rollout_error)
        state["completion"] = messages[start:]


async def _ask_model(client: Any, state: Any, messages: list[dict[str, Any]], tool_defs: list[Any]) -> Any:
    """One model turn through the endpoint: its message, appended to `messages` as the
    assistant's (with its tool calls)."""
    kwargs: dict[str, Any] = {"model": state.get_model(), "messages": messages}
    if tool_defs:
        kwargs["tools"] = [_openai_tool(t) for t in tool_defs]
    resp = await client.chat.completions.create(**kwargs)
    msg = resp.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in msg.tool_calls]
    messages.append(out)
    return msg


async def _end_turn(task: Any, state: Any, completion: list[dict[str, Any]], updates: list[Any] | None,
                    stops: list[Any], pool: Any) -> None:
    """After a turn: the `updates` run (with `state["completion"]` = `completion`), then the
    stop conditions are checked; the first that fires stops the rollout under its name."""
    if updates:
        state["completion"] = completion
        for update in updates:
            await call_user(pool, update, task, state)
    for stop in stops:
        if await call_user(pool, stop, task, state):
            state.stop(getattr(stop, "__name__", "stop"))
            break


async def _run_tool(tools: Mapping[str, Any], name: str, arguments: str) -> Any:
    fn = tools.get(name)
    if fn is None:
        return f"Error: unknown tool {name!r}; available: {sorted(tools)}"
    try:
        args = json.loads(arguments or "{}")
    except ValueError as exc:
        return f"Error: tool arguments are not JSON: {exc}"
    try:
        return tool_message_content(await fn(**args))
    except Exception as exc:  # a failing tool is the model's feedback, not the rollout's end
        return f"Error: {type(exc).__name__}: {exc}"


def command_env(state: Any, base_url: str, program: Mapping[str, Any], task: Mapping[str, Any]) -> dict[str, str]:
    endpoint = state.get_endpoint_config()
    env = {
        "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": endpoint["api_key"], "OPENAI_MODEL": endpoint["model"],
        "ANTHROPIC_BASE_URL": base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url,
        "ANTHROPIC_API_KEY": endpoint["api_key"], "VF_TASK_JSON": json.dumps(dict(task), default=str),
    }
    env.update({k: str(v) for k, v in (program.get("env") or {}).items()})
    env.update({k: str(v) for k, v in ((task.get("program") or {}).get("env") or {}).items()})
    return env


def command_argv(program: Mapping[str, Any], task: Mapping[str, Any]) -> list[str]:
    return [str(a) for a in [*program["command"], *(program.get("args") or []),
                             *((task.get("program") or {}).get("args") or [])]]


def record_result(state: Any, exit_code: int | None, stdout: str, stderr: str, timed_out: bool = False,
                  limit: int = OUTPUT_LIMIT, completion_from_stdout: bool = True) -> None:
    """`state["program_result"]` (outputs capped, head and tail); a command that never
    called the model has its stdout as the completion."""
    state["program_result"] = {"exit_code": exit_code, "timed_out": timed_out,
                               "stdout": cap_text(stdout, limit)[0], "stderr": cap_text(stderr, limit)[0]}
    if completion_from_stdout and not state["trajectory"] and stdout.strip():
        state["completion"] = [{"role": "assistant", "content": stdout.strip()}]


async def run_local_command(task: Any, state: Any, program: Mapping[str, Any]) -> None:
    env = {**os.environ, **command_env(state, state.get_endpoint_config()["base_url"], program, task)}
    proc = await asyncio.create_subprocess_exec(*command_argv(program, task), cwd=program.get("cwd"), env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    try:
        async with asyncio.timeout(float(program.get("timeout", 600))):
            out, err = await proc.communicate()
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        record_result(state, None, out.decode(errors="replace"), err.decode(errors="replace"), timed_out=True)
        return
    except asyncio.CancelledError:
        proc.kill()
        raise
    record_result(state, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def run_sandboxed_command(task: Any, state: Any, program: Mapping[str, Any], sandbox: Any,
                                timeout: float = 600.0, limit: int = OUTPUT_LIMIT) -> None:
    """`program.command` in `sandbox`, its model calls relayed over the sandbox's command
    channel; `timeout` (the sandbox config's per-command timeout) unless the program sets one."""
    from .sandbox_relay import SandboxRelay

    files = {**(program.get("files") or {}), **((task.get("program") or {}).get("files") or {})}
    for path, text in files.items():
        await sandbox.write_file(path, text)
    async with SandboxRelay(sandbox, state.get_endpoint_config()["base_url"]) as relay:
        res = await sandbox.exec(command_argv(program, task), env=command_env(state, relay.base_url, program, task),
                                 cwd=program.get("cwd"), timeout=float(program.get("timeout", timeout)))
    record_result(state, res.exit_code, res.stdout, res.stderr, timed_out=bool(getattr(res, "timed_out", False)),
                  limit=limit)
