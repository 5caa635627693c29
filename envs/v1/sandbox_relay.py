"""Host side of the sandbox relay's listen mode (`sandboxes/programs/relay.py listen`):
carries the HTTP requests of a sandboxed program to the interception endpoint over
the sandbox's command channel (a BackgroundProcess's stdout / stdin), so the sandbox
keeps its network off. The wire format is the one relay format (`sandboxes.relay_wire`,
also OpenEnv's forwarder): request frames come from the relay, each answered with one
JSON line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from typing import Any

import aiohttp

from sandboxes import relay_wire
from sandboxes.cancel import cancel_and_settle
from sandboxes.errors import AgentError
from sandboxes.interface import BackgroundProcess, Sandbox
from sandboxes.program_files import program_path

log = logging.getLogger(__name__)

RELAY_SOURCE = program_path("relay.py")
RELAY_REMOTE_PATH = "/tmp/vf_v1_relay.py"
READY_TIMEOUT = 30.0
POLL = 1.0


class SandboxRelay:
    """`async with SandboxRelay(sandbox, target_base) as relay:` then give the program
    `relay.base_url` (its OPENAI_BASE_URL inside the sandbox)."""

    def __init__(self, sandbox: Sandbox, target_base_url: str, python: str = "python3"):
        self.sandbox = sandbox
        self.target = target_base_url.rstrip("/")
        if self.target.endswith("/v1"):
            self.target = self.target[: -len("/v1")]
        self.python = python
        self.proc: BackgroundProcess | None = None
        self.base_url = ""
        self._pump: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "SandboxRelay":
        await self.sandbox.write_file(RELAY_REMOTE_PATH, RELAY_SOURCE.read_text())
        self.proc = await self.sandbox.start_process([self.python, "-u", RELAY_REMOTE_PATH, "listen"])
        ready, rest = await self._ready()
        self.base_url = f"http://127.0.0.1:{int(ready['port'])}/v1"
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        self._pump = asyncio.create_task(self._run(rest))
        return self

    async def _ready(self) -> tuple[dict[str, Any], str]:
        """The relay's `ready` frame (its port) and what followed it."""
        assert self.proc is not None
        buf, err, deadline = "", "", time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            out, e = await self.proc.read_output(until=relay_wire.marker("ready"),
                                                 timeout=max(0.1, deadline - time.monotonic()))
            buf, err = buf + out, err + e
            try:
                frames, rest = relay_wire.split_frames(buf)
            except relay_wire.WireError:
                break
            if frames:
                if frames[0].get("id") == "ready" and frames[0].get("ok"):
                    return frames[0], rest
                break
            if not out and not (await self.proc.poll()).running:
                break
        raise AgentError(f"the v1 relay did not start in the sandbox: stdout={buf[-500:]!r} stderr={err[-1000:]!r}")

    async def __aexit__(self, *exc: Any) -> None:
        if self._pump is not None:
            await cancel_and_settle([self._pump])
        for t in list(self._inflight):
            t.cancel()
        if self.proc is not None:
            with contextlib.suppress(Exception):
                await self.proc.kill()
        if self._http is not None:
            await self._http.close()

    async def _run(self, pending: str) -> None:
        assert self.proc is not None
        buf = pending
        while True:
            try:
                frames, buf = relay_wire.split_frames(buf)
            except relay_wire.WireError as exc:
                log.warning("v1 relay in sandbox %s broke the wire format: %s", self.sandbox.id, exc)
                return
            for req in frames:
                task = asyncio.create_task(self._forward(req))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            out, _ = await self.proc.read_output(until="\n", timeout=POLL)
            buf += out
            if not out:
                if not (await self.proc.poll()).running:
                    log.warning("v1 relay exited in sandbox %s", self.sandbox.id)
                    return

    async def _forward(self, req: dict[str, Any]) -> None:
        """One request of the sandboxed program, sent to the interception endpoint; its
        answer (or a 502 saying why not) goes back as one line."""
        assert self._http is not None and self.proc is not None
        try:
            if req.get("op") != "http" or not str(req.get("path", "")).startswith("/"):
                raise ValueError(f"not an HTTP request: {str(req)[:200]}")
            async with self._http.request(str(req.get("method") or "POST"), self.target + req["path"],
                                          data=base64.b64decode(req.get("body") or ""),
                                          headers={"Authorization": (req.get("headers") or {}).get("Authorization", ""),
                                                   "Content-Type": "application/json"}) as resp:
                status, body = resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            status, body = 502, json.dumps({"error": {"message": f"interception endpoint: {exc}"}}).encode()
        except (ValueError, TypeError) as exc:
            status, body = 400, json.dumps({"error": {"message": f"v1 relay: {exc}"}}).encode()
        answer = {"id": req.get("id"), "ok": True, "status": status, "headers": {},
                  "body": base64.b64encode(body).decode()}
        await self.proc.write_stdin(relay_wire.line(answer).decode("ascii"))
