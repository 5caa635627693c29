"""Starting an OpenEnv server inside a sandbox: its start command as a background
process (output to SERVER_LOG), a transport to its port, `/health` polled until
OK. One way, used by rollouts (`OpenEnvEnv`) and by `openenv build` (which starts
the server once to ask its `/schema`, see `probe.py`).

Starts are admitted a few at a time (`StartGate`): an OpenEnv server's start is
CPU-bound (openenv-core imports FastAPI, gradio, ...: ~5 s of CPU), so at `-c 32`
on 2 cores thirty-two simultaneous starts would each take ~30x longer and time
out. The gate admits `limit` starts at once (default: one per CPU core) and the
start timeout only counts once a start is admitted. A start that still does not
get healthy is a `ServerStartError` (an InfraError: retried on a fresh sandbox)
carrying the server's log tail.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sandboxes.errors import ServerStartError
from sandboxes.interface import BackgroundProcess, Sandbox

from .forwarder import Transport
from .session import OpenEnvSession

SERVER_LOG = "/tmp/openenv-server.log"
LOG_TAIL = 4000


def default_start_limit() -> int:
    """Server starts admitted at once by default: one per CPU core (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores)


class StartGate:
    """Admits at most `limit` server starts at once (per event loop); records how long
    starts waited to be admitted and how long admitted starts took."""

    def __init__(self, limit: int | None = None):
        self.limit = max(1, int(limit)) if limit else default_start_limit()
        self._sems: dict[int, asyncio.Semaphore] = {}
        self.waits: list[float] = []  # seconds each start waited to be admitted
        self.starts: list[float] = []  # seconds each admitted start took (to healthy or failure)
        self.running = 0
        self.peak = 0  # most starts ever running at once

    def _sem(self) -> asyncio.Semaphore:
        key = id(asyncio.get_running_loop())
        if key not in self._sems:
            self._sems[key] = asyncio.Semaphore(self.limit)
        return self._sems[key]

    async def run(self, start: Callable[[], Awaitable["ServerHandle"]]) -> "ServerHandle":
        t0 = time.monotonic()
        async with self._sem():
            t1 = time.monotonic()
            self.waits.append(t1 - t0)
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                return await start()
            finally:
                self.running -= 1
                self.starts.append(time.monotonic() - t1)

    def __getstate__(self) -> dict:  # an env handed to a worker process: no loop-bound semaphores
        return {**self.__dict__, "_sems": {}}


@dataclass
class ServerHandle:
    """A started server: its process, the transport to it and a session over that transport."""

    process: BackgroundProcess
    transport: Transport
    session: OpenEnvSession


async def log_tail(sandbox: Sandbox) -> str:
    """The end of the server's log (or why it cannot be read)."""
    try:
        res = await sandbox.exec(["tail", "-c", str(LOG_TAIL), SERVER_LOG], timeout=10)
    except Exception as exc:  # the sandbox itself may be gone
        return f"(server log unavailable: {type(exc).__name__}: {exc})"
    return res.stdout if res.exit_code == 0 else f"(server log unavailable: {res.output.strip()})"


async def start_server(
    sandbox: Sandbox,
    start_command: str,
    transport_factory: Callable[[], Awaitable[Transport]],
    *,
    startup_timeout: float,
    step_timeout: float = 60.0,
    what: str = "OpenEnv server",
) -> ServerHandle:
    """Start the server in `sandbox` and wait until `/health` answers; ServerStartError
    (with the log tail) when it dies or is not healthy within `startup_timeout` seconds."""
    process = await sandbox.start_process(["/bin/sh", "-c", f"({start_command}) >{SERVER_LOG} 2>&1"])
    transport = await transport_factory()
    session = OpenEnvSession(transport, step_timeout=step_timeout)

    async def alive() -> bool:
        return (await process.poll()).running

    try:
        await session.wait_healthy(startup_timeout, alive=alive)
    except (TimeoutError, RuntimeError) as exc:
        tail = await log_tail(sandbox)
        await transport.close()
        raise ServerStartError(
            f"{what} did not become healthy: {exc}\n--- server log tail ({SERVER_LOG}) ---\n{tail}"
        ) from exc
    return ServerHandle(process=process, transport=transport, session=session)
