"""What the two remote agent backends (kubernetes, prime) share: the sandbox
handle that turns a broken agent stream into the backend's typed error, the
shielded create that never leaks a sandbox when its caller is cancelled, the
"started or deleted" step after the control-plane create, and starting the
agent over a bootstrap command.

Each backend keeps what really differs (its API calls, messages, liveness
check and reconnects) and plugs it in through the hooks named below.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sandboxes.agent import AgentSandbox
from sandboxes.agent.client import AgentChannel, AgentConnection
from sandboxes.agent.protocol import bootstrap_payload
from sandboxes.errors import AgentError, InfraError, SandboxCreateError
from sandboxes.results import ExecResult, OutputChunk

T = TypeVar("T")


class RemoteAgentSandbox(AgentSandbox):
    """`AgentSandbox` whose requests go through two backend hooks: `_ensure()`
    runs before each request (e.g. a reconnect after a dropped stream), and an
    AgentError is passed to `_classified()`, which returns it unchanged or the
    sandbox's own typed error (raised from it). Deleting goes through
    `backend.delete(id)`."""

    def __init__(self, *args, backend: Any, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._backend = backend

    async def _ensure(self) -> None:
        """Hook run before every request; nothing by default."""

    async def _classified(self, exc: AgentError) -> BaseException:
        """Hook: the error to raise for a failed agent request (`exc` itself by default)."""
        return exc

    @contextlib.asynccontextmanager
    async def _typed_errors(self) -> AsyncIterator[None]:
        try:
            yield
        except AgentError as e:
            err = await self._classified(e)
            if err is e:
                raise
            raise err from e

    async def _call(self, msg: dict[str, Any], timeout: float | None = None, cancel_on_abort: bool = False) -> dict:
        await self._ensure()
        async with self._typed_errors():
            return await super()._call(msg, timeout=timeout, cancel_on_abort=cancel_on_abort)

    async def _run_stream(self, msg: dict[str, Any], inbound=None, sink=None) -> dict:
        await self._ensure()
        async with self._typed_errors():
            return await super()._run_stream(msg, inbound, sink)

    async def exec_stream(self, cmd, *, timeout=None, env=None, cwd=None) -> AsyncIterator[OutputChunk | ExecResult]:
        await self._ensure()
        async with self._typed_errors():
            async for item in super().exec_stream(cmd, timeout=timeout, env=env, cwd=cwd):
                yield item

    async def _destroy(self) -> None:
        await self._backend.delete(self.id)


async def shielded_create(make: Awaitable[T], fallback: Callable[[], Awaitable[Any]] | None = None) -> T:
    """Await the sandbox `make` creates, shielded from the caller's cancellation:
    a caller that gives up does not leak it. Once `make` finishes, the sandbox
    it made is deleted; if it failed instead, `fallback()` (when given) cleans
    up whatever it may have left."""
    task = asyncio.ensure_future(make)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: asyncio.ensure_future(_discard(t, fallback)))
        raise


async def _discard(task: asyncio.Future, fallback: Callable[[], Awaitable[Any]] | None) -> None:
    if not task.cancelled() and task.exception() is None:
        with contextlib.suppress(Exception):
            await task.result().delete()
            return
    if fallback is not None:
        with contextlib.suppress(Exception):
            await fallback()


async def started_or_deleted(
    start: Callable[[], Awaitable[T]],
    delete: Callable[[], Awaitable[Any]],
    failed: str,
    keep: tuple[type[BaseException], ...] = (SandboxCreateError,),
) -> T:
    """Run `start()` on a sandbox that exists; if it fails in any way the sandbox
    is deleted (best effort), and an InfraError that is not one of `keep`
    becomes a SandboxCreateError "`failed`: <error>" (cause kept)."""
    try:
        return await start()
    except BaseException as e:
        with contextlib.suppress(Exception):
            await delete()
        if isinstance(e, InfraError) and not isinstance(e, keep):
            raise SandboxCreateError(f"{failed}: {e}") from e
        raise


async def start_bootstrapped(channel: AgentChannel, timeout: float) -> AgentConnection:
    """The agent's connection over `channel`, whose process runs `bootstrap_argv()`:
    send it the agent source and wait for its hello (closed again on any failure)."""
    conn = AgentConnection(channel)
    try:
        await channel.send(bootstrap_payload())
        await conn.start(timeout=timeout)
    except BaseException:
        await conn.close()
        raise
    return conn


__all__ = ["RemoteAgentSandbox", "shielded_create", "started_or_deleted", "start_bootstrapped"]
