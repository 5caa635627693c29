"""One OpenEnv episode over a `Transport`: health wait, schema, and the
WebSocket session protocol every OpenEnv client uses (`/ws`: reset, step,
state, close — the HTTP `/reset` and `/step` routes are stateless, a new
environment per request, so an episode needs the session).

Observation payloads are `{"observation": {...}, "reward": r, "done": d}`.
Errors the *model* caused (an action that fails validation or raises in
the env) come back as `ActionRejected`; anything else is infrastructure.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sandboxes.errors import Error

from .forwarder import ForwardError, ServerUnreachable, Transport


class OpenEnvProtocolError(ForwardError):
    """The server answered something that is not the OpenEnv session protocol."""


class ActionRejected(Error):
    """The server refused or failed an action (validation / execution error): the model's fault."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


_MODEL_CODES = {"VALIDATION_ERROR", "EXECUTION_ERROR", "INVALID_JSON"}


class OpenEnvSession:
    """Reset/step/state over one `/ws` session of the server behind `transport`."""

    def __init__(self, transport: Transport, *, step_timeout: float = 60.0):
        self.transport = transport
        self.step_timeout = step_timeout
        self.sid: int | None = None

    async def wait_healthy(self, timeout: float, *, alive=None, interval: float = 0.25) -> None:
        """Poll GET /health until 200. `alive()` (async, optional) → False aborts early.
        Raises TimeoutError (with the last failure) or RuntimeError when `alive` says the server died."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            try:
                resp = await self.transport.request("GET", "/health", timeout=5.0)
                if resp.status == 200:
                    return
                last = f"/health answered {resp.status}: {resp.text[:200]}"
            except ServerUnreachable as exc:
                last = str(exc)
            if alive is not None and not await alive():
                raise RuntimeError(f"the server process exited ({last})")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"/health not OK after {timeout:.0f}s ({last})")
            await asyncio.sleep(interval)

    async def schema(self) -> dict[str, Any]:
        resp = await self.transport.request("GET", "/schema", timeout=30.0)
        if resp.status != 200:
            raise OpenEnvProtocolError(f"GET /schema answered {resp.status}: {resp.text[:300]}")
        try:
            data = resp.json()
        except ValueError as exc:
            raise OpenEnvProtocolError(f"GET /schema is not JSON: {resp.text[:300]}") from exc
        if not isinstance(data, dict):
            raise OpenEnvProtocolError("GET /schema is not a JSON object")
        return data

    async def open(self) -> None:
        if self.sid is None:
            self.sid = await self.transport.ws_open("/ws")

    async def _send(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.open()
        assert self.sid is not None
        text = await self.transport.ws_send(self.sid, json.dumps(message), timeout=self.step_timeout)
        try:
            reply = json.loads(text)
        except ValueError as exc:
            raise OpenEnvProtocolError(f"session reply is not JSON: {text[:300]}") from exc
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            code = str(data.get("code", ""))
            message_text = str(data.get("message", "unknown error"))
            if data.get("errors"):
                message_text += ": " + json.dumps(data["errors"])[:2000]
            if code.upper() in _MODEL_CODES:
                raise ActionRejected(message_text, code)
            raise OpenEnvProtocolError(f"server error {code}: {message_text}")
        return reply

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        """{"observation", "reward", "done"} of the first observation."""
        return (await self._send({"type": "reset", "data": kwargs})).get("data") or {}

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return (await self._send({"type": "step", "data": action})).get("data") or {}

    async def state(self) -> dict[str, Any]:
        return (await self._send({"type": "state"})).get("data") or {}

    async def list_tools(self) -> list[dict[str, Any]]:
        """MCP contract: the env's tools as {"name", "description", "input_schema"}."""
        payload = await self.step({"type": "list_tools"})
        tools = (payload.get("observation") or {}).get("tools")
        if not isinstance(tools, list):
            raise OpenEnvProtocolError(f"list_tools returned no tool list: {str(payload)[:300]}")
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """MCP contract: one tool call as a step; {"observation", "reward", "done"}."""
        return await self.step({"type": "call_tool", "tool_name": name, "arguments": arguments})

    async def close(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            try:
                await self.transport.ws_close(sid)
            except ForwardError:
                pass
