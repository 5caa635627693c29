"""Host side of the sandbox relay (see sandboxes/programs/v1_relay.py): carries the HTTP
requests of a sandboxed program to the interception endpoint over the
sandbox's command channel (a BackgroundProcess's stdout / stdin), so the
sandbox keeps its network off."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from typing import Any

import aiohttp

from sandboxes.cancel import cancel_and_settle
from sandboxes.errors import AgentError
from sandboxes.interface import BackgroundProcess, Sandbox
from sandboxes.program_files import program_path

log = logging.getLogger(__name__)

RELAY_SOURCE = program_path("v1_relay.py")
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
        self.proc = await self.sandbox.start_process([self.python, "-u", RELAY_REMOTE_PATH])
        out, err = await self.proc.read_output(until="\n", timeout=READY_TIMEOUT)
        first, _, rest = out.partition("\n")
        if not first.startswith("VFRELAY "):
            raise AgentError(f"the v1 relay did not start in the sandbox: stdout={out[-500:]!r} stderr={err[-1000:]!r}")
        self.base_url = f"http://127.0.0.1:{int(first.split()[1])}/v1"
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        self._pump = asyncio.create_task(self._run(rest))
        return self

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
            while "\n" in buf:
                line, _, buf = buf.partition("\n")
                if line.startswith("VFREQ "):
                    task = asyncio.create_task(self._forward(line[6:]))
                    self._inflight.add(task)
                    task.add_done_callback(self._inflight.discard)
            out, _ = await self.proc.read_output(until="\n", timeout=POLL)
            buf += out
            if not out:
                if not (await self.proc.poll()).running:
                    log.warning("v1 relay exited in sandbox %s", self.sandbox.id)
                    return

    async def _forward(self, payload: str) -> None:
        assert self._http is not None and self.proc is not None
        req = json.loads(base64.b64decode(payload))
        try:
            async with self._http.request(req["method"], self.target + req["path"],
                                          data=base64.b64decode(req["body"]),
                                          headers={"Authorization": req.get("auth", ""),
                                                   "Content-Type": "application/json"}) as resp:
                status, body = resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            status, body = 502, json.dumps({"error": {"message": f"interception endpoint: {exc}"}}).encode()
        answer = {"id": req["id"], "status": status, "body": base64.b64encode(body).decode()}
        await self.proc.write_stdin(base64.b64encode(json.dumps(answer).encode()).decode() + "\n")
