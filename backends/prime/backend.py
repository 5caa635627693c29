"""`PrimeBackend` ("prime"): sandboxes on Prime Intellect through the
`prime-sandboxes` SDK (optional extra: `pip install vf-sandbox[prime]`).

Control plane through the SDK: `create` (rate-limited; one idempotency key
per call, reused by the SDK's own retries, and the call shielded so a
cancelled caller does not leak the sandbox), `wait_for_creation` (RUNNING +
an exec probe), `get`, `list`/`bulk_delete` by label, `delete`.

Data plane: the SDK has no background processes with stdin, no bounded or
binary-safe output and no tar transfers, so the backend reuses the shared
in-sandbox agent. It runs as ONE live process per sandbox
(`AsyncSandboxClient.open_process`, a Connect-RPC server stream for stdout
plus a unary `SendInput` RPC per message to stdin). Cost: every request is
one HTTP/2 unary call up and its answer comes down the open stream; exec,
streaming, background processes, files and directories (tar) all behave as
on every other backend. If the stream drops, the SDK re-attaches but output
emitted while detached is lost; the agent protocol then fails the requests
in flight with AgentError (no command is ever re-run).

Labels: Prime labels are plain strings; a vf-sandbox label `k: v` is stored
as `"k=v"`. Network off (the default) is requested as egress denylist
`0.0.0.0/0`. `spec.user` is passed as the guest user of the agent process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import shlex
import time
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandboxes import labels as lc
from sandboxes import prime_credentials
from sandboxes import lifecycle
from sandboxes.agent.client import AgentChannel, AgentConnection
from sandboxes.agent.protocol import bootstrap_argv
from sandboxes.errors import AgentError, ConfigError, Error, SandboxNotRunning, SnapshotUnsupported
from sandboxes.ratelimit import RateLimiter
from sandboxes.retry import RetryPolicy, retry_op
from sandboxes.results import SandboxInfo
from sandboxes.spec import SandboxSpec, refuse_gvisor, refuse_namespace, refuse_user_switch

from .._remote import RemoteAgentSandbox, shielded_create, start_bootstrapped, started_or_deleted
from .errors import is_not_found, map_error

log = logging.getLogger(__name__)
API_KEY_VAR = "PRIME_API_KEY"


class PrimeConfig(BaseModel):
    """Options of the Prime backend."""

    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(None, description=f"API key; default ${API_KEY_VAR}, then ~/.prime/config.json (required).")
    base_url: str | None = Field(None, description="API base URL; default $PRIME_API_BASE_URL or the SDK's default.")
    team_id: str | None = Field(None, description="Team to create sandboxes in; default $PRIME_TEAM_ID, then "
                                "~/.prime/config.json, else the key's personal account.")
    gpu_type: str | None = Field(None, description="GPU type when spec.gpu_count > 0 (Prime requires one).")
    creates_per_minute: float = Field(400, gt=0, description="Creation rate cap (Prime publishes 500/min per token).")
    create_burst: int = Field(20, ge=1, description="Creations allowed at once before the rate applies.")
    wait_max_attempts: int = Field(120, ge=5, description="SDK wait_for_creation budget (120 ≈ 235 s).")
    python: str = Field("python3", description="Interpreter in the image that runs the agent.")
    hello_timeout: float = Field(60.0, gt=0, description="Seconds to wait for the agent's hello.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Retry of idempotent control-plane calls (create with its idempotency key, get, list, delete, bulk delete) on 429/5xx/transport errors, on top of the SDK's own few retries.")


def _labels_out(labels: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(labels.items())]


def _labels_in(raw: list[str]) -> dict[str, str]:
    out = {}
    for item in raw:
        k, sep, v = item.partition("=")
        out[k] = v if sep else "true"
    return out


class PrimeAgentChannel(AgentChannel):
    """`AgentChannel` over an SDK live process (`AsyncSandboxProcess`)."""

    def __init__(self, proc: Any, sandbox_id: str) -> None:
        self.proc = proc
        self.sandbox_id = sandbox_id
        self._stderr = bytearray()
        self._stdout = proc.stdout.__aiter__()
        self._log_task = asyncio.ensure_future(self._pump_stderr())

    async def _pump_stderr(self) -> None:
        with contextlib.suppress(Exception):
            async for data in self.proc.stderr:
                self._stderr += data
                del self._stderr[: max(0, len(self._stderr) - 64 * 1024)]

    async def send(self, data: bytes) -> None:
        try:
            await self.proc.write_stdin(data)
        except Exception as e:
            raise map_error(e, "write to agent") if not isinstance(e, BrokenPipeError) else AgentError(
                f"agent process in {self.sandbox_id} exited") from e

    async def receive(self) -> bytes:
        try:
            return await self._stdout.__anext__()
        except StopAsyncIteration:
            return b""

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(15):
                await self.proc.aclose()
        self._log_task.cancel()

    def describe(self) -> str:
        return f"prime live process in {self.sandbox_id}"

    def log_tail(self) -> str:
        return bytes(self._stderr[-4000:]).decode("utf-8", "replace")


class PrimeSandbox(RemoteAgentSandbox):
    backend_name = "prime"
    _backend: "PrimeBackend"

    async def snapshot(self, *, keep: bool = False):
        """Refused: the Prime sandbox API (and its SDK, which the fake serves) has no
        snapshot, checkpoint or image-from-sandbox endpoint."""
        raise SnapshotUnsupported(
            "the prime backend cannot snapshot or fork a sandbox: the Prime sandbox API has no snapshot endpoint. "
            "Create each sandbox and run its setup, or push a docker snapshot and use it as the image")

    async def _classified(self, exc: AgentError) -> BaseException:
        """A broken agent stream on a sandbox that died becomes Prime's typed error."""
        try:
            await self._backend._check_running(self.id)
        except Error as err:
            return err
        return exc

    async def alive(self) -> bool:
        if self._deleted:
            return False
        try:
            await self._backend._check_running(self.id)
        except Error:
            return False
        return await super().alive()


class PrimeBackend:
    """Sandboxes on Prime Intellect. Options: the fields of `PrimeConfig`."""

    name = "prime"

    def __init__(self, **options: Any) -> None:
        self.config = PrimeConfig(**options)
        key = self.config.api_key or prime_credentials.api_key()
        if not key:
            raise ConfigError(
                f"the prime backend needs an API key: set ${API_KEY_VAR}, run `prime login`, or pass api_key=...; "
                "create one at https://app.primeintellect.ai"
            )
        self._api_key = key
        self.team_id = self.config.team_id or prime_credentials.team_id()
        self.limiter = RateLimiter(self.config.creates_per_minute / 60.0, self.config.create_burst)
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The SDK's AsyncSandboxClient (created lazily, inside the running loop)."""
        if self._client is None:
            try:
                from prime_sandboxes import AsyncSandboxClient
            except ImportError as e:
                raise ConfigError("the prime backend needs the SDK: pip install 'vf-sandbox[prime]'") from e
            self._client = AsyncSandboxClient(api_key=self._api_key)
            if self.config.base_url:
                self._client.client.base_url = self.config.base_url.rstrip("/").removesuffix("/api/v1")
        return self._client

    @property
    def retry(self) -> RetryPolicy:
        return self.config.retry

    async def _sdk(self, what: str, call, *, idempotent: bool = False):
        """`await call()` with SDK errors mapped onto the hierarchy; an `idempotent`
        call is repeated under the backend's retry policy on transient errors."""

        async def once():
            try:
                return await call()
            except Error:
                raise
            except Exception as e:
                raise map_error(e, what) from e

        return await (retry_op(once, self.retry, f"prime: {what}") if idempotent else once())

    async def _check_running(self, sandbox_id: str) -> None:
        """Raise the typed error when the sandbox is not RUNNING."""
        sb = await self._sdk(f"get {sandbox_id}", lambda: self.client.get(sandbox_id), idempotent=True)
        if sb.status == "RUNNING":
            return
        from prime_sandboxes import exceptions as pe

        cls = {"OOM_KILLED": pe.SandboxOOMError, "TIMEOUT": pe.SandboxTimeoutError,
               "IMAGE_PULL_FAILED": pe.SandboxImagePullError}.get(sb.error_type or "", pe.SandboxNotRunningError)
        raise map_error(cls(sandbox_id, sb.status, sb.error_type, message=sb.error_message), f"sandbox {sandbox_id}")

    # -- create
    def _request(self, spec: SandboxSpec, key: str) -> Any:
        from prime_sandboxes import CreateSandboxRequest
        from prime_sandboxes.models import StartCommand

        if spec.gpu_count and not self.config.gpu_type:
            raise ConfigError("spec.gpu_count > 0 needs gpu_type=... for the prime backend")
        labels = {**spec.labels, **lc.lifecycle_labels(spec)}
        return CreateSandboxRequest(
            name=f"{spec.name}-{uuid.uuid4().hex[:8]}",
            docker_image=spec.image,
            start_command=StartCommand(executable="/bin/sh", args=["-c", spec.start_command]),
            cpu_cores=spec.cpu_cores,
            memory_gb=spec.memory_gb,
            disk_size_gb=spec.disk_size_gb,
            gpu_count=spec.gpu_count,
            gpu_type=self.config.gpu_type if spec.gpu_count else None,
            timeout_minutes=max(1, math.ceil(spec.timeout_minutes)),
            environment_vars=dict(spec.environment_vars) or None,
            network_denylist=None if spec.network else ["0.0.0.0/0"],
            labels=_labels_out(labels),
            team_id=self.team_id,
            idempotency_key=key,
        )

    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None) -> PrimeSandbox:
        refuse_namespace(spec, "prime")
        refuse_user_switch(spec, "prime")
        refuse_gvisor(spec, "prime", "Prime does not let us choose the sandbox runtime: use the docker backend "
                      "(runsc runtime) or kubernetes (a gVisor RuntimeClass)")
        request = self._request(spec, idempotency_key or uuid.uuid4().hex)
        return await shielded_create(self._create_and_wait(request, spec))

    async def _create_and_wait(self, request: Any, spec: SandboxSpec) -> PrimeSandbox:
        await self.limiter.acquire()
        # the same idempotency key on every try: a repeated create returns the first sandbox
        created = await self._sdk("create sandbox", lambda: self.client.create(request), idempotent=True)
        sid = created.id

        async def start() -> AgentConnection:
            await self._sdk(f"wait for {sid}",
                            lambda: self.client.wait_for_creation(sid, max_attempts=self.config.wait_max_attempts))
            return await self._start_agent(sid, spec)

        conn = await started_or_deleted(start, lambda: self.delete(sid), f"prime sandbox {sid} never became ready")
        lifecycle.track(sid, functools.partial(self._delete_sync, sid), backend=self.name)
        return PrimeSandbox(conn, id=sid, name=created.name, spec=spec, backend_name=self.name, backend=self)

    def _delete_sync(self, sandbox_id: str) -> None:
        """Blocking delete for signal handlers / atexit, with the SDK's sync client."""
        from prime_sandboxes import APIClient, SandboxClient

        api = APIClient(api_key=self._api_key)
        if self.config.base_url:
            api.base_url = self.config.base_url.rstrip("/").removesuffix("/api/v1")
        client = SandboxClient(api)
        try:
            client.delete(sandbox_id)
        except Exception as e:
            if not is_not_found(e):
                raise

    async def _start_agent(self, sid: str, spec: SandboxSpec) -> AgentConnection:
        proc = await self._sdk(
            f"start agent in {sid}",  # starts a process: never repeated
            lambda: self.client.open_process(sid, shlex.join(bootstrap_argv(self.config.python)),
                                             working_dir=spec.workdir or None, user=spec.user),
        )
        return await start_bootstrapped(PrimeAgentChannel(proc, sid), timeout=self.config.hello_timeout)

    # -- the rest of the contract
    async def get(self, sandbox_id: str) -> PrimeSandbox:
        sb = await self._sdk(f"get {sandbox_id}", lambda: self.client.get(sandbox_id), idempotent=True)
        if sb.status != "RUNNING":
            await self._check_running(sandbox_id)
        spec = SandboxSpec(image=sb.docker_image, cpu_cores=sb.cpu_cores, memory_gb=sb.memory_gb,
                           labels=_labels_in(sb.labels))
        conn = await self._start_agent(sandbox_id, spec)
        return PrimeSandbox(conn, id=sandbox_id, name=sb.name, spec=spec, backend_name=self.name, backend=self)

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        want = _labels_out({lc.MANAGED: "true", **(labels or {})})
        out: list[SandboxInfo] = []
        page = 1
        while True:
            resp = await self._sdk("list sandboxes", lambda: self.client.list(labels=want, page=page, per_page=100,
                                                                              exclude_terminated=True), idempotent=True)
            for sb in resp.sandboxes:
                exact = _labels_in(sb.labels)
                if labels and any(exact.get(k) != v for k, v in labels.items()):
                    continue
                created = exact.get(lc.CREATED_AT)
                out.append(SandboxInfo(id=sb.id, name=sb.name, backend=self.name, status=sb.status.lower(),
                                       image=sb.docker_image, labels=exact,
                                       created_at=float(created) if created else sb.created_at.timestamp()))
            if not resp.has_next:
                return out
            page += 1

    async def delete(self, sandbox_id: str) -> None:
        async def once() -> None:
            try:
                await self.client.delete(sandbox_id)
            except Exception as e:
                if not is_not_found(e):
                    raise map_error(e, f"delete {sandbox_id}") from e

        await retry_op(once, self.retry, f"prime: delete {sandbox_id}")
        lifecycle.untrack(sandbox_id)

    async def delete_many(self, labels: dict[str, str] | None = None, ids: Sequence[str] | None = None) -> int:
        """By label (all of ours when both are None): one server-side call. By ids
        (optionally also filtered by labels): only live sandboxes of ours among
        them, unknown or already deleted ids are skipped; bulk calls of <= 100 ids."""
        if ids is None:
            want = _labels_out({lc.MANAGED: "true", **(labels or {})})
            resp = await self._sdk("bulk delete", lambda: self.client.bulk_delete(labels=want), idempotent=True)
            for sid in resp.succeeded:
                lifecycle.untrack(sid)
            return len(resp.succeeded)
        if not ids:
            return 0
        ours = {i.id for i in await self.list(labels)}  # never a sandbox that is not ours
        targets = [t for t in dict.fromkeys(ids) if t in ours]
        total = 0
        for i in range(0, len(targets), 100):  # the API takes at most 100 ids per call
            batch = targets[i : i + 100]
            resp = await self._sdk("bulk delete", lambda: self.client.bulk_delete(sandbox_ids=batch), idempotent=True)
            total += len(resp.succeeded)
            for sid in resp.succeeded:
                lifecycle.untrack(sid)
        return total

    async def reap(self, *, max_age_seconds: float | None = None) -> list[str]:
        """Delete sandboxes whose owner process died, that expired, or are older than `max_age_seconds`."""
        now = time.time()
        doomed = [i.id for i in await self.list() if lifecycle.reap_due(i, now, max_age_seconds)]
        if doomed:
            await self.delete_many(ids=doomed)
        return doomed

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None


__all__ = ["PrimeBackend", "PrimeConfig", "PrimeSandbox", "SandboxNotRunning", "API_KEY_VAR"]
