"""A CONTRACT FAKE of the Prime Intellect sandbox API: not Prime, and passing
tests against it says nothing about Prime's scheduling, images, quotas or
network enforcement. It exists because the real service cannot be reached
from here.

It speaks the wire protocols the real `prime-sandboxes` SDK (0.5.x) uses, as
read from the installed SDK's source, so the SDK runs unmodified against it:

* Control plane, JSON under `/api/v1`, `Authorization: Bearer <key>`:
  `POST /sandbox` (idempotent by `idempotency_key`), `GET /sandbox`
  (page, per_page, labels[], is_active), `GET|DELETE /sandbox/{id}`,
  `DELETE /sandbox` (bulk: ids and/or labels), `POST /sandbox/status:batchGet`,
  `GET /sandbox/{id}/error-context`, `POST /sandbox/{id}/auth`. Responses are
  camelCase, errors `{"detail": ...}` with the HTTP status (402, 404, 409...).
* Gateway: Connect RPC (protocol version 1, binary protobuf, the SDK's own
  `command_session.proto` messages) at `{gateway}/{user_ns}/{job_id}/
  command_session.CommandSession/{Start,Connect,SendInput,SendSignal}`.
  Server streams are enveloped (`application/connect+proto`, flag 0x02 on
  the JSON end-of-stream message); unary calls are `application/proto` with
  JSON errors.

Each sandbox is a temporary directory; every command-session is a real host
process tree in it (inside bubblewrap when usable, the directory as `/`).
Test hooks: `payment_required`, images containing `imagepull`,
`oom_kill(id)`, `time_out(id)`, `fail_next(n, status | reset=True)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import struct
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from backends.local.isolation import Isolation, find_bwrap, prepare_root

from .sandbox_host import SANDBOX_PATH, FakeServer, kill_groups, spawn

try:
    from prime_sandboxes._proto.command_session import command_session_pb2 as pb
except ImportError:  # pragma: no cover - the prime extra is not installed
    pb = None

SERVICE = "command_session.CommandSession"
_HTTP_OF_CODE = {"not_found": 404, "unauthenticated": 401, "invalid_argument": 400, "failed_precondition": 400,
                 "deadline_exceeded": 408, "unavailable": 503, "internal": 500}


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _detail(status: int, detail: str) -> web.Response:
    return web.json_response({"detail": detail}, status=status)


class Session:
    """One command-session: a process and the stream currently attached to it."""

    def __init__(self, uuid_: str, proc: asyncio.subprocess.Process) -> None:
        self.uuid = uuid_
        self.proc = proc
        self.events: asyncio.Queue = asyncio.Queue()  # pb.CommandSessionEvent, None = end
        self.exit_code: int | None = None
        self.applied: set[str] = set()  # input/signal idempotency keys already applied


class FakeSandbox:
    def __init__(self, sid: str, body: dict[str, Any], root: Path, bwrap: str | None) -> None:
        self.id = sid
        self.body = body
        self.root = root
        self.isolation = Isolation(root=root, bwrap=bwrap, network=True)
        self.status = "PENDING"
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.created = dt.datetime.now(dt.timezone.utc).timestamp()
        self.sessions: dict[str, Session] = {}

    def json(self) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id, "name": b.get("name", self.id), "dockerImage": b.get("docker_image") or "",
            "startCommand": b.get("start_command"), "cpuCores": b.get("cpu_cores", 1.0),
            "memoryGB": b.get("memory_gb", 1.0), "diskSizeGB": b.get("disk_size_gb") or 5.0,
            "diskMountPath": "/", "gpuCount": b.get("gpu_count", 0), "gpuType": b.get("gpu_type"),
            "vm": True, "networkAllowlist": b.get("network_allowlist"), "networkDenylist": b.get("network_denylist"),
            "status": self.status, "timeoutMinutes": b.get("timeout_minutes", 60),
            "environmentVars": b.get("environment_vars"), "labels": b.get("labels") or [],
            "createdAt": _iso(self.created), "updatedAt": _iso(self.created),
            "errorType": self.error_type, "errorMessage": self.error_message, "teamId": b.get("team_id"),
        }

    async def kill_all(self) -> None:
        await kill_groups(s.proc for s in list(self.sessions.values()))


class FakePrime(FakeServer):
    """In-process fake on 127.0.0.1. Point the SDK at it with PRIME_API_BASE_URL=fake.url."""

    def __init__(self, api_key: str = "fake-prime-key", start_delay: float = 0.0, use_bwrap: bool = True) -> None:
        if pb is None:
            raise RuntimeError("the fake Prime API needs the prime-sandboxes package (its protobuf messages)")
        super().__init__("vf-fake-prime-")
        self.api_key = api_key
        self.start_delay = start_delay
        self.bwrap = find_bwrap() if use_bwrap else None
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.by_key: dict[str, str] = {}
        self.tokens: dict[str, str] = {}  # gateway token -> sandbox id
        self.requests: list[tuple[str, str]] = []
        self.payment_required = False

    # lifecycle (start, stop, `async with`: FakeServer) ----------------------------
    def _boxes(self) -> list[FakeSandbox]:
        return list(self.sandboxes.values())

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._mw], client_max_size=256 * 1024 * 1024)
        r = app.router
        r.add_post("/api/v1/sandbox", self._create)
        r.add_get("/api/v1/sandbox", self._list)
        r.add_delete("/api/v1/sandbox", self._bulk_delete)
        r.add_post("/api/v1/sandbox/status:batchGet", self._batch_status)
        r.add_get("/api/v1/sandbox/{id}", self._get)
        r.add_delete("/api/v1/sandbox/{id}", self._delete)
        r.add_get("/api/v1/sandbox/{id}/error-context", self._error_context)
        r.add_post("/api/v1/sandbox/{id}/auth", self._auth)
        r.add_post("/gw/{ns}/{job}/" + SERVICE + "/{method}", self._rpc)
        return app

    # test hooks -----------------------------------------------------------
    async def oom_kill(self, sid: str) -> None:
        await self._fail(sid, "ERROR", "OOM_KILLED", "Sandbox exceeded its memory limit")

    async def time_out(self, sid: str) -> None:
        await self._fail(sid, "TIMEOUT", "TIMEOUT", "Sandbox exceeded its lifetime")

    async def _fail(self, sid: str, status: str, error_type: str, message: str) -> None:
        sb = self.sandboxes[sid]
        sb.status, sb.error_type, sb.error_message = status, error_type, message
        await sb.kill_all()

    # plumbing ---------------------------------------------------------------
    @web.middleware
    async def _mw(self, request: web.Request, handler):
        self.requests.append((request.method, request.path))
        auth = request.headers.get("Authorization", "")
        if request.path.startswith("/gw/"):
            sid = self.tokens.get(auth.removeprefix("Bearer "))
            if sid is None or sid != request.match_info.get("job"):
                return _connect_error(request, "unauthenticated", "invalid gateway token")
        elif auth != f"Bearer {self.api_key}":
            return _detail(401, "Invalid API key")
        return await self._faulty(request, handler)

    def _sandbox(self, request: web.Request) -> FakeSandbox | web.Response:
        sb = self.sandboxes.get(request.match_info["id"])
        return sb if sb is not None else _detail(404, "Sandbox not found")

    # control plane -------------------------------------------------------------
    async def _create(self, request: web.Request) -> web.Response:
        if self.payment_required:
            return _detail(402, "Insufficient balance")
        body = await request.json()
        if not body.get("name") or not body.get("docker_image"):
            return _detail(422, "name and docker_image are required")
        key = body.get("idempotency_key")
        if key and key in self.by_key and self.by_key[key] in self.sandboxes:
            return web.json_response(self.sandboxes[self.by_key[key]].json(), status=201)
        sid = "sb" + uuid.uuid4().hex[:20]
        root = self._dir / sid
        prepare_root(root)
        sb = FakeSandbox(sid, body, root, self.bwrap)
        self.sandboxes[sid] = sb
        if key:
            self.by_key[key] = sid
        asyncio.get_running_loop().call_later(self.start_delay, self._boot, sid)
        return web.json_response(sb.json(), status=201)

    def _boot(self, sid: str) -> None:
        sb = self.sandboxes.get(sid)
        if sb is None or sb.status != "PENDING":
            return
        if "imagepull" in (sb.body.get("docker_image") or "").lower():
            sb.status, sb.error_type = "ERROR", "IMAGE_PULL_FAILED"
            sb.error_message = f"failed to pull image {sb.body.get('docker_image')}: not found"
        else:
            sb.status = "RUNNING"

    async def _list(self, request: web.Request) -> web.Response:
        want = request.query.getall("labels", [])
        active = request.query.get("is_active")
        page = int(request.query.get("page", 1))
        per_page = int(request.query.get("per_page", 50))
        rows = [s for s in self.sandboxes.values() if all(lbl in (s.body.get("labels") or []) for lbl in want)]
        if active in ("true", "True", "1"):
            rows = [s for s in rows if s.status in ("PENDING", "PROVISIONING", "RUNNING")]
        chunk = rows[(page - 1) * per_page : page * per_page]
        return web.json_response({"sandboxes": [s.json() for s in chunk], "total": len(rows), "page": page,
                                  "perPage": per_page, "hasNext": page * per_page < len(rows)})

    async def _get(self, request: web.Request) -> web.Response:
        sb = self._sandbox(request)
        return sb if isinstance(sb, web.Response) else web.json_response(sb.json())

    async def _remove(self, sb: FakeSandbox) -> None:
        self.sandboxes.pop(sb.id, None)
        await sb.kill_all()
        shutil.rmtree(sb.root, ignore_errors=True)

    async def _delete(self, request: web.Request) -> web.Response:
        sb = self._sandbox(request)
        if isinstance(sb, web.Response):
            return sb
        await self._remove(sb)
        return web.json_response({"success": True, "message": f"Sandbox {sb.id} deleted"})

    async def _bulk_delete(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        ids, labels = body.get("sandbox_ids"), body.get("labels")
        if not ids and not labels:
            return _detail(422, "sandbox_ids or labels required")
        targets = [s for s in self.sandboxes.values()
                   if (not ids or s.id in ids) and (not labels or all(l in (s.body.get("labels") or []) for l in labels))]
        failed = [{"sandbox_id": i, "error": "not found"} for i in (ids or []) if i not in self.sandboxes]
        for s in targets:
            await self._remove(s)
        return web.json_response({"succeeded": [s.id for s in targets], "failed": failed,
                                  "message": f"deleted {len(targets)} sandboxes"})

    async def _batch_status(self, request: web.Request) -> web.Response:
        ids = (await request.json()).get("sandbox_ids") or []
        statuses, errors = [], []
        for i in ids:
            sb = self.sandboxes.get(i)
            if sb is None:
                errors.append({"sandbox_id": i, "code": "NOT_FOUND", "message": "Sandbox not found"})
            else:
                statuses.append({"sandbox_id": i, "status": sb.status, "error_type": sb.error_type,
                                 "error_message": sb.error_message})
        return web.json_response({"statuses": statuses, "errors": errors})

    async def _error_context(self, request: web.Request) -> web.Response:
        sb = self._sandbox(request)
        if isinstance(sb, web.Response):
            return sb
        return web.json_response({"status": sb.status, "errorType": sb.error_type, "errorMessage": sb.error_message})

    async def _auth(self, request: web.Request) -> web.Response:
        sb = self._sandbox(request)
        if isinstance(sb, web.Response):
            return sb
        if sb.status != "RUNNING":
            return _detail(409, f"Sandbox is {sb.status}")
        token = uuid.uuid4().hex
        self.tokens[token] = sb.id
        expires = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
        return web.json_response({"gateway_url": self.url + "/gw", "user_ns": "fake-ns", "job_id": sb.id,
                                  "token": token, "expires_at": expires.isoformat().replace("+00:00", "Z")})

    # gateway: Connect RPC ---------------------------------------------------------
    async def _rpc(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        sb = self.sandboxes.get(request.match_info["job"])
        if sb is None or sb.status != "RUNNING":
            return _connect_error(request, "not_found", "sandbox not found or not running")
        body = await request.read()
        if method in ("Start", "Connect"):
            if not request.content_type.startswith("application/connect+proto"):
                return web.Response(status=415, text="expected application/connect+proto")
            msg_bytes = _unenvelope(body)
            if method == "Start":
                req = pb.StartRequest.FromString(msg_bytes)
                return await self._start(request, sb, req)
            req = pb.ConnectRequest.FromString(msg_bytes)
            session = sb.sessions.get(req.session.session_uuid)
            if session is None:
                return await _stream_error(request, "not_found", "no such session")
            return await self._attach(request, session)
        if method == "SendInput":
            req = pb.SendInputRequest.FromString(body)
            session = sb.sessions.get(req.session.session_uuid)
            if session is None:
                return _connect_error(request, "not_found", "no such session")
            if req.input_uuid not in session.applied:
                session.applied.add(req.input_uuid)
                stdin = session.proc.stdin
                if stdin is None or stdin.is_closing():
                    return _connect_error(request, "failed_precondition", "stdin is closed")
                with contextlib.suppress(ConnectionError):
                    stdin.write(req.input.stdin)
                    await stdin.drain()
            return _unary_ok(pb.SendInputResponse())
        if method == "SendSignal":
            req = pb.SendSignalRequest.FromString(body)
            session = sb.sessions.get(req.session.session_uuid)
            if session is None:
                return _connect_error(request, "not_found", "no such session")
            sig = signal.SIGKILL if req.signal == pb.SIGNAL_SIGKILL else signal.SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session.proc.pid, sig)
            return _unary_ok(pb.SendSignalResponse())
        return _connect_error(request, "unimplemented", f"{method} is not implemented by the fake")

    async def _start(self, request: web.Request, sb: FakeSandbox, req: Any) -> web.StreamResponse:
        key = req.session_uuid if req.HasField("session_uuid") else uuid.uuid4().hex
        if key in sb.sessions:  # create-or-attach
            return await self._attach(request, sb.sessions[key])
        spec = req.command
        cwd = spec.cwd if spec.HasField("cwd") and spec.cwd else "/"
        env = {"PATH": SANDBOX_PATH, "HOME": "/root"}
        env.update(sb.body.get("environment_vars") or {})
        env.update(dict(spec.envs))
        try:
            proc = await spawn(sb.isolation, [spec.cmd, *spec.args], cwd, env,
                               stdin=asyncio.subprocess.PIPE if req.stdin else asyncio.subprocess.DEVNULL)
        except OSError as e:
            return await _stream_error(request, "invalid_argument", f"cannot start {spec.cmd}: {e}")
        session = Session(key, proc)
        sb.sessions[key] = session
        asyncio.ensure_future(self._pump_session(session))
        return await self._attach(request, session)

    async def _pump_session(self, session: Session) -> None:
        async def pump(stream: asyncio.StreamReader, which: str) -> None:
            while data := await stream.read(65536):
                ev = pb.CommandSessionEvent()
                setattr(ev.data, which, data)
                session.events.put_nowait(ev)

        await asyncio.gather(pump(session.proc.stdout, "stdout"), pump(session.proc.stderr, "stderr"))  # type: ignore[arg-type]
        code = await session.proc.wait()
        session.exit_code = code if code >= 0 else 128 - code
        ev = pb.CommandSessionEvent()
        ev.end.exit_code = session.exit_code
        session.events.put_nowait(ev)
        session.events.put_nowait(None)

    async def _attach(self, request: web.Request, session: Session) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/connect+proto"})
        await resp.prepare(request)
        start = pb.CommandSessionEvent()
        start.start.pid = session.proc.pid
        try:
            await resp.write(_envelope(pb.StartResponse(event=start).SerializeToString()))
            while True:
                ev = await session.events.get()
                if ev is None:
                    session.events.put_nowait(None)  # a later Connect replays the end
                    break
                await resp.write(_envelope(pb.StartResponse(event=ev).SerializeToString()))
                if ev.WhichOneof("event") == "end":
                    ended = pb.CommandSessionEvent()
                    ended.end.exit_code = ev.end.exit_code
                    session.events.put_nowait(ended)  # retained end event for re-attachers
                    session.events.put_nowait(None)
                    break
            await resp.write(_envelope(b"{}", flags=0x02))
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp


def _envelope(data: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(data)) + data


def _unenvelope(body: bytes) -> bytes:
    if len(body) < 5:
        return b""
    flags, n = struct.unpack(">BI", body[:5])
    return body[5 : 5 + n]


def _unary_ok(msg: Any) -> web.Response:
    return web.Response(body=msg.SerializeToString(), content_type="application/proto")


def _connect_error(request: web.Request, code: str, message: str) -> web.Response:
    if request.content_type.startswith("application/connect+"):
        # streaming calls report errors in the end-of-stream message with HTTP 200
        body = _envelope(json.dumps({"error": {"code": code, "message": message}}).encode(), flags=0x02)
        return web.Response(body=body, content_type="application/connect+proto")
    return web.json_response({"code": code, "message": message}, status=_HTTP_OF_CODE.get(code, 500))


async def _stream_error(request: web.Request, code: str, message: str) -> web.Response:
    return _connect_error(request, code, message)
