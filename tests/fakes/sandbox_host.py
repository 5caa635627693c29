"""Plumbing shared by the contract fakes (`k8s_server.py`, `prime_server.py`):
the in-process aiohttp server on 127.0.0.1 (start, stop, `async with`),
scripted transient failures (`fail_next`: the next N matching requests get a
5xx/429, optionally with Retry-After, or a reset connection), one
temporary directory per fake holding a root per sandbox, and the "sandbox
process": a real host process tree started in a sandbox root (inside
bubblewrap when usable) and killed by process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from backends.local.isolation import Isolation

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""$PATH of a process started in a fake sandbox."""


async def spawn(iso: Isolation, argv: Sequence[str], cwd: str, env: dict[str, str], *,
                stdin: int = asyncio.subprocess.PIPE) -> asyncio.subprocess.Process:
    """Start `argv` in the sandbox `iso` (cwd inside the sandbox), in its own process group."""
    return await asyncio.create_subprocess_exec(
        *iso.argv(list(argv), cwd=cwd), cwd=iso.host_cwd(cwd), env=env,
        stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


async def kill_groups(procs: Iterable[asyncio.subprocess.Process]) -> None:
    """SIGKILL each process's group, then reap each (at most 5 s apiece)."""
    procs = list(procs)
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(p.wait(), 5)


class _Failure:
    def __init__(self, count: int, status: int, reset: bool, method: str | None, path: str | None,
                 retry_after: float | None, after: bool) -> None:
        self.count, self.status, self.reset = count, status, reset
        self.method, self.path, self.retry_after, self.after = method, path, retry_after, after


class FakeServer:
    """Base of the fakes: `_app()` builds the aiohttp application, `_boxes()`
    lists the sandboxes (each with `async kill_all()`) to kill on stop. Each
    fake's middleware passes requests through `_faulty(request, handler)`."""

    def __init__(self, dir_prefix: str) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix=dir_prefix))
        self._runner: web.AppRunner | None = None
        self.url = ""
        self._failures: list[_Failure] = []
        self.injected = 0  # failures served so far

    def fail_next(self, count: int, status: int = 503, *, reset: bool = False, method: str | None = None,
                  path: str | None = None, retry_after: float | None = None, after: bool = False) -> None:
        """Test hook: the next `count` requests matching `method` and containing `path` fail:
        with HTTP `status` (and a Retry-After header when given), or with the connection
        reset (`reset=True`). With `after=True` the request is carried out first and only
        the answer is lost (the client cannot tell whether it happened)."""
        self._failures.append(_Failure(count, status, reset, method, path, retry_after, after))

    def _failure_for(self, request: web.Request) -> _Failure | None:
        for f in self._failures:
            if f.count > 0 and (f.method is None or f.method == request.method) and (f.path is None or f.path in request.path):
                f.count -= 1
                self.injected += 1
                return f
        return None

    async def _faulty(self, request: web.Request, handler) -> web.StreamResponse:
        failure = self._failure_for(request)
        if failure is None:
            return await handler(request)
        if failure.after:
            await handler(request)
        if failure.reset:
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("fake: connection reset (injected)")
        headers = {"Retry-After": f"{failure.retry_after:g}"} if failure.retry_after is not None else {}
        return web.json_response({"kind": "Status", "status": "Failure", "code": failure.status,
                                  "reason": "InjectedFailure", "message": "injected transient failure",
                                  "detail": "injected transient failure"}, status=failure.status, headers=headers)

    def _app(self) -> web.Application:
        raise NotImplementedError

    def _boxes(self) -> Iterable[Any]:
        raise NotImplementedError

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> str:
        self._runner = web.AppRunner(self._app(), handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for box in list(self._boxes()):
            await box.kill_all()
        if self._runner:
            await self._runner.cleanup()
        shutil.rmtree(self._dir, ignore_errors=True)
