"""The subset of the Kubernetes API the backend uses, async over one aiohttp
session: pods (create/get/list/delete/deletecollection), NetworkPolicies,
and the pods/exec websocket (`v5.channel.k8s.io`, falling back to
`v4.channel.k8s.io`: one binary frame per message, first byte = channel:
0 stdin, 1 stdout, 2 stderr, 3 error/status JSON, 255 close in v5).

Why not the official client's transport: `kubernetes` (the official client)
is synchronous, and its `stream()` exec helper blocks a thread per stream and
is known to hang (kubernetes-client/python#602); inspect_k8s_sandbox runs it
on a thread pool for that reason. `kubernetes_asyncio` would add a second,
generated client for the same dozen calls. So the backend uses the official
`kubernetes` package only for what it does well and what is hard to redo:
loading kubeconfig (contexts, client certs, exec/OIDC auth plugins, token
refresh) and in-cluster config. Requests and the exec websocket go through
aiohttp: async all the way down, one connection pool, websocket pings as
keepalives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import aiohttp

from sandboxes.errors import AgentError, BackendUnavailable, ConfigError, SandboxNotRunning
from sandboxes.retry import retry_op

from .config import KubernetesConfig

log = logging.getLogger(__name__)

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
_STDIN_CHUNK = 256 * 1024  # bytes per websocket frame sent on stdin


class ApiError(BackendUnavailable):
    """The API server answered with an unexpected status (the Status object's reason in the message)."""

    def __init__(self, status: int, message: str, reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(f"kubernetes API {status} {reason}: {message}".replace("  ", " "))
        self.status = status
        self.reason = reason
        self.retry_after = retry_after  # seconds, from the Retry-After header (429 / 503)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:  # an HTTP date: not worth parsing, the backoff applies
        return None


class Connection(object):
    """Host, TLS context and auth headers of one cluster, from kubeconfig or in-cluster config."""

    def __init__(self, host: str, ssl_context: ssl.SSLContext | bool | None, configuration: Any) -> None:
        self.host = host.rstrip("/")
        self.ssl = ssl_context
        self._configuration = configuration

    def headers(self) -> dict[str, str]:
        """Auth headers, asking the kubernetes client each time (it refreshes expiring tokens)."""
        cfg = self._configuration
        if cfg is None:
            return {}
        out: dict[str, str] = {}
        for setting in cfg.auth_settings().values():  # BearerToken / basic auth, per the client's version
            if setting.get("in") == "header" and setting.get("value"):
                out[setting.get("key", "authorization").title()] = setting["value"]
        return out

    @classmethod
    def load(cls, cfg: KubernetesConfig) -> "Connection":
        """Load cluster access the way kubectl does (blocking: call in a thread)."""
        try:
            from kubernetes import client as kclient
            from kubernetes import config as kconfig
        except ImportError as e:  # pragma: no cover - a core dependency
            raise ConfigError("the kubernetes backend needs the 'kubernetes' package") from e
        configuration = kclient.Configuration()
        in_cluster = cfg.in_cluster
        if in_cluster is None:
            in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (cfg.kubeconfig or cfg.context)
        try:
            if in_cluster:
                kconfig.load_incluster_config(client_configuration=configuration)
            else:
                kconfig.load_kube_config(
                    config_file=cfg.kubeconfig, context=cfg.context, client_configuration=configuration
                )
        except kconfig.ConfigException as e:
            raise ConfigError(f"cannot load Kubernetes config: {e}") from e
        except FileNotFoundError as e:
            raise ConfigError(f"cannot load Kubernetes config: {e}") from e
        ctx: ssl.SSLContext | bool | None = None
        if configuration.host.startswith("https"):
            if not configuration.verify_ssl:
                ctx = False
            else:
                ctx = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
                if configuration.cert_file:
                    ctx.load_cert_chain(configuration.cert_file, configuration.key_file)
        return cls(configuration.host, ctx, configuration)


def _status_message(body: Any) -> tuple[str, str]:
    if isinstance(body, dict):
        return str(body.get("message") or body), str(body.get("reason") or "")
    return str(body)[:500], ""


class KubeApi:
    """Async REST + exec client for one namespace."""

    def __init__(self, conn: Connection, cfg: KubernetesConfig) -> None:
        self.conn = conn
        self.cfg = cfg
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.request_timeout),
                connector=aiohttp.TCPConnector(limit=256, ssl=self.conn.ssl if self.conn.ssl is not None else True),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ns_path(self, group_path: str, resource: str) -> str:
        return f"{group_path}/namespaces/{quote(self.cfg.namespace)}/{resource}"

    async def request(
        self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None, missing_ok: bool = False
    ) -> dict[str, Any] | None:
        """One REST call; returns the decoded JSON (None for a tolerated 404).

        Every call this backend makes is idempotent (GET, DELETE, and POSTs of
        fixed names whose 409 the caller adopts), so each is repeated under the
        backend's retry policy on 408/429/5xx and connection errors."""
        return await retry_op(lambda: self._request_once(method, path, body=body, params=params, missing_ok=missing_ok),
                              self.cfg.retry, f"kubernetes {method} {path}")

    async def _request_once(
        self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None, missing_ok: bool = False
    ) -> dict[str, Any] | None:
        url = self.conn.host + path
        try:
            async with self.session.request(
                method, url, json=body, params=params, headers=self.conn.headers(),
                timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout),
            ) as resp:
                text = await resp.text()
                try:
                    data = json.loads(text) if text else {}
                except ValueError:
                    data = text
                if resp.status < 300:
                    return data if isinstance(data, dict) else {}
                if resp.status == 404 and missing_ok:
                    return None
                message, reason = _status_message(data)
                if resp.status in (401, 403):
                    raise ConfigError(f"kubernetes API refused {method} {path}: {resp.status} {reason}: {message}")
                if resp.status == 404 and method == "POST":  # a create misses only its namespace (or API group)
                    raise ConfigError(f"kubernetes API {method} {path}: {message} (namespace {self.cfg.namespace!r})")
                if resp.status in (400, 422):
                    raise ConfigError(f"kubernetes API rejected {method} {path}: {reason}: {message}")
                raise ApiError(resp.status, message, reason, _retry_after(resp.headers.get("Retry-After")))
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            raise BackendUnavailable(f"kubernetes API server {self.conn.host} unreachable: {e!r}") from e

    # pods ---------------------------------------------------------------
    async def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", self._ns_path("/api/v1", "pods"), body=manifest)  # type: ignore[return-value]

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        return await self.request("GET", self._ns_path("/api/v1", f"pods/{quote(name)}"), missing_ok=True)

    async def list_pods(self, label_selector: str) -> list[dict[str, Any]]:
        data = await self.request("GET", self._ns_path("/api/v1", "pods"), params={"labelSelector": label_selector})
        return list((data or {}).get("items") or [])

    async def delete_pod(self, name: str) -> bool:
        """Delete with grace 0; False when it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "propagationPolicy": "Background"}
        data = await self.request("DELETE", self._ns_path("/api/v1", f"pods/{quote(name)}"), body=body, missing_ok=True)
        return data is not None

    async def delete_pods(self, label_selector: str) -> list[str]:
        """deletecollection by selector with grace 0; returns the names deleted."""
        data = await self.request(
            "DELETE", self._ns_path("/api/v1", "pods"),
            params={"labelSelector": label_selector, "gracePeriodSeconds": "0"},
            body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
        return [((i.get("metadata") or {}).get("name", "")) for i in (data or {}).get("items") or []]

    def delete_pod_sync(self, name: str, timeout: float = 10.0) -> None:
        """Blocking grace-0 delete for signal handlers / atexit (no event loop); 404 is fine."""
        import urllib.error
        import urllib.request

        url = self.conn.host + self._ns_path("/api/v1", f"pods/{quote(name)}") + "?gracePeriodSeconds=0"
        body = json.dumps({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}).encode()
        req = urllib.request.Request(url, data=body, method="DELETE",
                                     headers={"Content-Type": "application/json", **self.conn.headers()})
        ctx = self.conn.ssl
        if ctx is False:
            ctx = ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx or None):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise

    # network policies -----------------------------------------------------
    async def ensure_network_policy(self, manifest: dict[str, Any]) -> None:
        path = self._ns_path("/apis/networking.k8s.io/v1", "networkpolicies")
        name = manifest["metadata"]["name"]
        if await self.request("GET", f"{path}/{quote(name)}", missing_ok=True) is not None:
            return
        try:
            await self.request("POST", path, body=manifest)
        except ApiError as e:
            if e.status != 409:  # created concurrently: fine
                raise
        except ConfigError as e:
            raise ConfigError(
                f"cannot create the deny-all NetworkPolicy {name!r} that keeps network-off sandboxes offline ({e}); "
                "have an admin create it (backends.kubernetes.manifest.deny_all_network_policy), "
                "or pass create_network_policy=False if your cluster isolates pods otherwise"
            ) from e

    # exec -------------------------------------------------------------------
    async def exec_channel(self, pod: str, argv: Sequence[str], *, container: str | None = None) -> "ExecChannel":
        """Open a pods/exec websocket running `argv` with stdin/stdout/stderr attached."""
        params = [("container", container or self.cfg.container_name), ("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
        params += [("command", a) for a in argv]
        url = self.conn.host + self._ns_path("/api/v1", f"pods/{quote(pod)}/exec")
        url = "ws" + url[4:] if url.startswith("http") else url
        try:
            ws = await self.session.ws_connect(
                url, params=params, protocols=EXEC_PROTOCOLS, headers=self.conn.headers(),
                max_msg_size=0, autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0) if hasattr(aiohttp, "ClientWSTimeout") else 5.0,
            )
        except aiohttp.WSServerHandshakeError as e:
            if e.status == 404:
                raise SandboxNotRunning(f"pod {pod}: exec refused, pod not found ({e.message})") from e
            if e.status in (401, 403):
                raise ConfigError(f"pod {pod}: exec forbidden ({e.status} {e.message}); needs pods/exec create") from e
            raise AgentError(f"pod {pod}: exec handshake failed ({e.status} {e.message})") from e
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            raise BackendUnavailable(f"kubernetes API server {self.conn.host} unreachable for exec: {e!r}") from e
        return ExecChannel(ws, pod, keepalive=self.cfg.keepalive)


class ExecChannel:
    """A byte channel over one exec websocket: `send` writes the process's stdin,
    `recv` returns its stdout (b"" at end), stderr is kept (bounded) for
    diagnostics, and the error channel's Status is kept as `status`."""

    STDERR_KEEP = 64 * 1024

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, pod: str, keepalive: float | None = 30.0) -> None:
        self.ws = ws
        self.pod = pod
        self.keepalive = keepalive
        self.keepalives_sent = 0
        self._last_send = time.monotonic()
        self.protocol = ws.protocol or "v4.channel.k8s.io"
        self.status: dict[str, Any] | None = None
        self.stderr = bytearray()
        self._stdout: asyncio.Queue[bytes] = asyncio.Queue()
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._eof = False
        self._pump = asyncio.create_task(self._read_loop())
        self._pinger = asyncio.create_task(self._keepalive()) if keepalive else None

    async def _keepalive(self) -> None:
        """An empty stdin frame after `keepalive` idle seconds: a no-op for the process that
        keeps load balancers and proxies from closing an idle stream. (Websocket pings are
        answered by the server automatically but a missing pong would not tell us more than
        a failed send does, so we do not close on them.)"""
        assert self.keepalive
        while not self.closed:
            await asyncio.sleep(max(0.0, self._last_send + self.keepalive - time.monotonic()))
            if self.closed:
                return
            if time.monotonic() - self._last_send >= self.keepalive:
                try:
                    async with self._send_lock:
                        await self.ws.send_bytes(bytes([STDIN]))
                    self.keepalives_sent += 1
                    self._last_send = time.monotonic()
                except Exception:  # the read loop notices the broken stream
                    return

    async def _read_loop(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    data = msg.data
                elif msg.type == aiohttp.WSMsgType.TEXT:  # some proxies re-frame as text
                    data = msg.data.encode("latin-1", "replace")
                else:
                    break
                if not data:
                    continue
                channel, payload = data[0], data[1:]
                if channel == STDOUT and payload:
                    self._stdout.put_nowait(bytes(payload))
                elif channel == STDERR and payload:
                    self.stderr += payload
                    del self.stderr[: max(0, len(self.stderr) - self.STDERR_KEEP)]
                elif channel == ERROR and payload:
                    try:
                        self.status = json.loads(bytes(payload))
                    except ValueError:
                        self.status = {"status": "Failure", "message": bytes(payload).decode(errors="replace")}
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            log.debug("exec stream of %s dropped: %r", self.pod, e)
        finally:
            self._eof = True
            self._stdout.put_nowait(b"")

    @property
    def closed(self) -> bool:
        return self._eof or self._closed

    async def send(self, data: bytes) -> None:
        if self.closed or self.ws.closed:
            raise AgentError(f"exec stream to pod {self.pod} is closed")
        try:
            async with self._send_lock:
                view = memoryview(data)
                for i in range(0, len(view), _STDIN_CHUNK):
                    await self.ws.send_bytes(b"\x00" + bytes(view[i : i + _STDIN_CHUNK]))
                self._last_send = time.monotonic()
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as e:
            raise AgentError(f"exec stream to pod {self.pod} dropped while sending: {e!r}") from e

    async def recv(self) -> bytes:
        """Next stdout bytes; b"" once the stream ended (and forever after)."""
        if self._eof and self._stdout.empty():
            return b""
        data = await self._stdout.get()
        if not data:
            self._stdout.put_nowait(b"")  # keep EOF sticky for other readers
        return data

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.protocol.startswith("v5") and not self.ws.closed:
                await self.ws.send_bytes(bytes([CLOSE, STDIN]))
        except Exception:  # best effort
            pass
        if self._pinger is not None:
            self._pinger.cancel()
        await self.ws.close()
        self._pump.cancel()
        try:
            await self._pump
        except (asyncio.CancelledError, Exception):
            pass
