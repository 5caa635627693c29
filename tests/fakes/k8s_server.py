"""A CONTRACT FAKE of the Kubernetes API server: not Kubernetes, and passing
tests against it says nothing about a real cluster's scheduling, images,
resource limits or NetworkPolicy enforcement. Run `pytest -m k8s` with
VF_K8S_CONTEXT set for that.

What it does speak is the real wire protocol of the subset the backend uses,
so the backend's HTTP and websocket code runs unmodified against it:

* REST (JSON, Bearer-token auth, `Status` objects on errors):
  pods create / get / list (labelSelector: `k=v`, `k==v`, `k!=v`, `k`, `!k`) /
  delete / deletecollection, networkpolicies create / get / list / delete.
* `pods/{name}/exec` upgraded to a websocket with subprotocol
  `v5.channel.k8s.io` or `v4.channel.k8s.io`: binary frames whose first byte
  is the channel (0 stdin, 1 stdout, 2 stderr, 3 status JSON, 255 close), an
  empty frame per output channel on open, the exit `Status` on channel 3.

Each pod is a temporary directory; every exec is a real host process tree
started in it (inside bubblewrap when usable, with the directory as `/`), so
commands really execute. Test hooks make pods fail the way real ones do:
special image names (`...imagepullbackoff...`, `...unschedulable...`,
`...crashloop...`) and `evict()`, `oom_kill()`, `drop_exec_streams()`; `fail_next(n, status | reset=True)`
makes the next REST requests fail transiently. Images: by default any name
runs (the host's /usr, /etc, /opt); `FakeKubernetes(images={name: dir})` makes
the fake's "registry" hold exactly those images: a pod of one starts with the
directory's tree copied into its root (its filesystem), any other name fails
to pull (`ErrImagePull`) as on a cluster. `created_images` lists the image of
every pod created.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from backends.local.isolation import Isolation, find_bwrap, prepare_root

from .sandbox_host import SANDBOX_PATH, FakeServer, kill_groups, spawn

API = "/api/v1/namespaces/{ns}"
NET = "/apis/networking.k8s.io/v1/namespaces/{ns}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_obj(code: int, reason: str, message: str, details: dict | None = None) -> dict[str, Any]:
    obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code}
    if details:
        obj["details"] = details
    return obj


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status_obj(code, reason, message), status=code)


def container_status(container: dict[str, Any], state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    """A complete V1ContainerStatus (the official client's models require imageID and restartCount)."""
    return {"name": container["name"], "image": container["image"], "imageID": "", "containerID": "",
            "ready": ready, "started": "running" in state, "restartCount": 0, "state": state}


def match_selector(labels: dict[str, str], selector: str | None) -> bool:
    """Kubernetes equality/existence label selector semantics."""
    if not selector:
        return True
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakePod:
    def __init__(self, manifest: dict[str, Any], root: Path, bwrap: str | None) -> None:
        self.manifest = manifest
        self.name: str = manifest["metadata"]["name"]
        self.root = root
        self.isolation = Isolation(root=root, bwrap=bwrap, network=True)
        self.procs: set[asyncio.subprocess.Process] = set()
        self.sockets: set[web.WebSocketResponse] = set()
        self.deadline: asyncio.TimerHandle | None = None

    @property
    def labels(self) -> dict[str, str]:
        return self.manifest["metadata"].get("labels") or {}

    @property
    def container(self) -> dict[str, Any]:
        return self.manifest["spec"]["containers"][0]

    def set_running(self) -> None:
        c = self.container
        self.manifest["status"] = {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [container_status(c, {"running": {"startedAt": _now()}}, ready=True)],
            "startTime": _now(),
        }

    def set_waiting(self, reason: str, message: str) -> None:
        c = self.container
        self.manifest["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [container_status(c, {"waiting": {"reason": reason, "message": message}})],
        }

    def set_failed(self, reason: str, message: str, *, container_reason: str | None = None, exit_code: int = 137) -> None:
        """Phase Failed: with a pod-level reason (Evicted...) or a terminated container (OOMKilled...)."""
        status: dict[str, Any] = {"phase": "Failed", "reason": reason, "message": message}
        if container_reason:
            term = {"reason": container_reason, "exitCode": exit_code, "finishedAt": _now()}
            status["containerStatuses"] = [container_status(self.container, {"terminated": term})]
        self.manifest["status"] = status

    @property
    def running(self) -> bool:
        return (self.manifest.get("status") or {}).get("phase") == "Running"

    async def kill_all(self) -> None:
        for ws in list(self.sockets):
            with contextlib.suppress(Exception):
                await ws.close()
        await kill_groups(self.procs)
        self.procs.clear()


class FakeKubernetes(FakeServer):
    """An in-process fake API server on 127.0.0.1. `async with FakeKubernetes() as k8s:`"""

    def __init__(self, namespace: str = "default", token: str = "fake-token", start_delay: float = 0.05,
                 use_bwrap: bool = True, protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io"),
                 images: dict[str, str | Path] | None = None) -> None:
        super().__init__("vf-fake-k8s-")
        self.namespace = namespace
        self.protocols = protocols  # exec subprotocols offered, in order of preference (older servers: v4 only)
        self.token = token
        self.start_delay = start_delay
        self.bwrap = find_bwrap() if use_bwrap else None
        self.pods: dict[str, FakePod] = {}
        self.network_policies: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.fail_next_exec: int = 0  # test hook: refuse this many exec handshakes with 500
        self.empty_stdin_frames = 0  # keepalive frames seen on exec streams
        self.create_times: list[float] = []  # monotonic time of each pod create request
        self.delete_bodies: list[dict[str, Any]] = []  # DeleteOptions received
        self._rv = itertools.count(1)
        self.images = None if images is None else {k: Path(v) for k, v in images.items()}
        self.created_images: list[str] = []  # the image of every pod created, in order

    # lifecycle (start, stop, `async with`: FakeServer) ----------------------------
    def _boxes(self) -> list[FakePod]:
        return list(self.pods.values())

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_mw], client_max_size=64 * 1024 * 1024)
        ns = "/api/v1/namespaces/{ns}"
        app.router.add_post(ns + "/pods", self._create_pod)
        app.router.add_get(ns + "/pods", self._list_pods)
        app.router.add_delete(ns + "/pods", self._delete_pods)
        app.router.add_get(ns + "/pods/{name}", self._get_pod)
        app.router.add_delete(ns + "/pods/{name}", self._delete_pod)
        app.router.add_get(ns + "/pods/{name}/exec", self._exec)
        app.router.add_post(ns + "/pods/{name}/exec", self._exec)
        net = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
        app.router.add_post(net, self._create_np)
        app.router.add_get(net, self._list_np)
        app.router.add_get(net + "/{name}", self._get_np)
        app.router.add_delete(net + "/{name}", self._delete_np)
        return app

    def write_kubeconfig(self, path: str | Path, context: str = "fake") -> Path:
        """A kubeconfig pointing at this server (what the backend loads, like kubectl would)."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": "fake", "user": "fake", "namespace": self.namespace}}],
        }
        path = Path(path)
        path.write_text(json.dumps(cfg))
        return path

    # test hooks -------------------------------------------------------------
    async def evict(self, name: str, message: str = "The node was low on resource: memory.") -> None:
        pod = self.pods[name]
        await pod.kill_all()
        pod.set_failed("Evicted", message)

    async def oom_kill(self, name: str) -> None:
        pod = self.pods[name]
        await pod.kill_all()
        pod.set_failed("", "", container_reason="OOMKilled", exit_code=137)

    async def drop_exec_streams(self, name: str) -> int:
        """Close every exec websocket of a pod abruptly (the processes get stdin EOF)."""
        pod = self.pods[name]
        n = 0
        for ws in list(pod.sockets):
            n += 1
            with contextlib.suppress(Exception):
                await ws.close(code=1006)
        return n

    def count(self, method: str, suffix: str) -> int:
        return sum(1 for m, p, _ in self.requests if m == method and p.endswith(suffix))

    # plumbing -----------------------------------------------------------------
    @web.middleware
    async def _auth_mw(self, request: web.Request, handler):
        self.requests.append((request.method, request.path, dict(request.query)))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "Unauthorized", "Unauthorized")
        ns = request.match_info.get("ns")
        if ns is not None and ns != self.namespace:
            return _error(404, "NotFound", f'namespaces "{ns}" not found')
        return await self._faulty(request, handler)

    def _pod_or_404(self, request: web.Request) -> FakePod | web.Response:
        name = request.match_info["name"]
        pod = self.pods.get(name)
        if pod is None:
            return _error(404, "NotFound", f'pods "{name}" not found')
        return pod

    # pods ---------------------------------------------------------------------
    async def _create_pod(self, request: web.Request) -> web.Response:
        self.create_times.append(time.monotonic())
        body = await request.json()
        if body.get("kind", "Pod") != "Pod":  # like the API server: kind may be omitted, not wrong
            return _error(400, "BadRequest", f"the body of the request was in an unknown format: kind {body.get('kind')}")
        body.setdefault("kind", "Pod")
        body.setdefault("apiVersion", "v1")
        if not (body.get("metadata") or {}).get("name"):
            return _error(422, "Invalid", "Pod is invalid: metadata.name: Required value")
        name = body["metadata"]["name"]
        if name in self.pods:
            return _error(409, "AlreadyExists", f'pods "{name}" already exists')
        containers = (body.get("spec") or {}).get("containers") or []
        if len(containers) != 1 or not containers[0].get("image"):
            return _error(422, "Invalid", "Pod is invalid: spec.containers: Required value")
        meta = body["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion=str(next(self._rv)),
                    namespace=self.namespace)
        root = self._dir / name
        prepare_root(root)
        image = containers[0]["image"]
        self.created_images.append(image)
        if self.images is not None and image in self.images:  # the image's filesystem
            shutil.copytree(self.images[image], root, symlinks=True, dirs_exist_ok=True)
        pod = FakePod(body, root, self.bwrap)
        pod.manifest["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                                  "containerStatuses": [container_status(containers[0], {"waiting": {"reason": "ContainerCreating"}})]}
        self.pods[name] = pod
        asyncio.get_running_loop().call_later(self.start_delay, self._start_pod, name)
        return web.json_response(pod.manifest, status=201)

    def _start_pod(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is None:
            return
        image = pod.container["image"].lower()
        if self.images is not None and pod.container["image"] not in self.images:
            pod.set_waiting("ErrImagePull", f'failed to pull and unpack image "{pod.container["image"]}": not found')
        elif "imagepullbackoff" in image:
            pod.set_waiting("ImagePullBackOff", f'Back-off pulling image "{pod.container["image"]}"')
        elif "unschedulable" in image:
            pod.manifest["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
        elif "crashloop" in image:
            pod.set_failed("", "", container_reason="Error", exit_code=1)
        else:
            pod.set_running()
            deadline = pod.manifest["spec"].get("activeDeadlineSeconds")
            if deadline:
                pod.deadline = asyncio.get_running_loop().call_later(float(deadline), self._deadline, name)

    def _deadline(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is not None and pod.running:
            asyncio.ensure_future(pod.kill_all())
            pod.manifest["status"] = {"phase": "Failed", "reason": "DeadlineExceeded",
                                      "message": "Pod was active on the node longer than the specified deadline"}

    async def _get_pod(self, request: web.Request) -> web.Response:
        pod = self._pod_or_404(request)
        return pod if isinstance(pod, web.Response) else web.json_response(pod.manifest)

    async def _list_pods(self, request: web.Request) -> web.Response:
        sel = request.query.get("labelSelector")
        items = [p.manifest for p in self.pods.values() if match_selector(p.labels, sel)]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(next(self._rv))}, "items": items})

    async def _remove(self, pod: FakePod) -> dict[str, Any]:
        self.pods.pop(pod.name, None)
        if pod.deadline:
            pod.deadline.cancel()
        await pod.kill_all()
        shutil.rmtree(pod.root, ignore_errors=True)
        pod.manifest["metadata"]["deletionTimestamp"] = _now()
        return pod.manifest

    async def _record_delete(self, request: web.Request) -> None:
        if request.can_read_body:
            with contextlib.suppress(ValueError):
                self.delete_bodies.append(await request.json())

    async def _delete_pod(self, request: web.Request) -> web.Response:
        await self._record_delete(request)
        pod = self._pod_or_404(request)
        if isinstance(pod, web.Response):
            return pod
        return web.json_response(await self._remove(pod))

    async def _delete_pods(self, request: web.Request) -> web.Response:
        await self._record_delete(request)
        sel = request.query.get("labelSelector")
        gone = [await self._remove(p) for p in list(self.pods.values()) if match_selector(p.labels, sel)]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": gone})

    # network policies -----------------------------------------------------------
    async def _create_np(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = (body.get("metadata") or {}).get("name")
        if body.get("kind", "NetworkPolicy") != "NetworkPolicy" or not name:
            return _error(422, "Invalid", "NetworkPolicy is invalid")
        if name in self.network_policies:
            return _error(409, "AlreadyExists", f'networkpolicies.networking.k8s.io "{name}" already exists')
        self.network_policies[name] = body
        return web.json_response(body, status=201)

    async def _get_np(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.network_policies:
            return _error(404, "NotFound", f'networkpolicies.networking.k8s.io "{name}" not found')
        return web.json_response(self.network_policies[name])

    async def _list_np(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "NetworkPolicyList", "items": list(self.network_policies.values())})

    async def _delete_np(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.network_policies.pop(name, None) is None:
            return _error(404, "NotFound", f'networkpolicies.networking.k8s.io "{name}" not found')
        return web.json_response(status_obj(200, "", "deleted") | {"status": "Success"})

    # exec ---------------------------------------------------------------------
    async def _exec(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod_or_404(request)
        if isinstance(pod, web.Response):
            return pod
        if self.fail_next_exec > 0:
            self.fail_next_exec -= 1
            return _error(500, "InternalError", "error dialing backend: container not found")
        if not pod.running:
            return _error(400, "BadRequest", f"container {pod.container['name']} is not running")
        argv = request.query.getall("command", [])
        container = request.query.get("container", pod.container["name"])
        if container != pod.container["name"]:
            return _error(400, "BadRequest", f"container {container} is not valid for pod {pod.name}")
        if not argv:
            return _error(400, "BadRequest", "you must specify at least 1 command")
        ws = web.WebSocketResponse(protocols=self.protocols, max_msg_size=0)
        if not ws.can_prepare(request).ok:
            return _error(400, "BadRequest", "exec needs a websocket upgrade in this fake")
        await ws.prepare(request)
        env = {"PATH": SANDBOX_PATH, "HOME": "/root", "HOSTNAME": pod.name}
        env.update({e["name"]: e.get("value", "") for e in pod.container.get("env") or []})
        workdir = pod.container.get("workingDir") or "/"
        # A deny-all NetworkPolicy selecting the pod is "enforced" by a fresh network namespace (bwrap only).
        isolated = any(
            all(pod.labels.get(k) == v for k, v in ((np.get("spec") or {}).get("podSelector") or {}).get("matchLabels", {}).items())
            and not (np.get("spec") or {}).get("egress")
            for np in self.network_policies.values()
        )
        iso = pod.isolation.model_copy(update={"network": not isolated})
        try:
            proc = await spawn(iso, argv, workdir, env)
        except OSError as e:
            st = status_obj(500, "InternalError", f"failed to exec in container: {e}")
            await ws.send_bytes(b"\x03" + json.dumps(st).encode())
            await ws.close()
            return ws
        pod.procs.add(proc)
        pod.sockets.add(ws)
        for ch in (1, 2, 3):
            await ws.send_bytes(bytes([ch]))  # the API server announces each channel with an empty frame

        async def pump(stream: asyncio.StreamReader, ch: int) -> None:
            while True:
                data = await stream.read(65536)
                if not data:
                    return
                if ws.closed:
                    continue  # keep draining so the process never blocks on a full pipe
                with contextlib.suppress(Exception):
                    await ws.send_bytes(bytes([ch]) + data)

        pumps = [asyncio.create_task(pump(proc.stdout, 1)), asyncio.create_task(pump(proc.stderr, 2))]  # type: ignore[arg-type]

        async def feed() -> None:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                ch, payload = msg.data[0], msg.data[1:]
                if ch == 0 and not payload:
                    self.empty_stdin_frames += 1
                elif ch == 0 and payload and proc.stdin and not proc.stdin.is_closing():
                    try:
                        proc.stdin.write(payload)
                        await proc.stdin.drain()
                    except (ConnectionError, BrokenPipeError):
                        pass
                elif ch == 255 and payload[:1] == b"\x00" and proc.stdin:
                    proc.stdin.close()

        feeder = asyncio.create_task(feed())
        waiter = asyncio.create_task(proc.wait())
        await asyncio.wait({feeder, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            # The client went away: the process loses its stdin (as with a real kubelet).
            if proc.stdin and not proc.stdin.is_closing():
                proc.stdin.close()
            try:
                await asyncio.wait_for(asyncio.shield(waiter), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await waiter
        await asyncio.gather(*pumps, return_exceptions=True)
        code = proc.returncode
        if code == 0:
            st: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            st = status_obj(0, "NonZeroExitCode", f"command terminated with non-zero exit code: exit status {code}",
                            {"causes": [{"reason": "ExitCode", "message": str(code if code >= 0 else 128 - code)}]})
            st.pop("code")
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.send_bytes(b"\x03" + json.dumps(st).encode())
                await ws.close()
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await feeder
        pod.procs.discard(proc)
        pod.sockets.discard(ws)
        return ws


async def _serve(kubeconfig: str) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with FakeKubernetes() as k8s:  # pods and their temp dirs are removed on exit
        k8s.write_kubeconfig(kubeconfig)
        print(f"fake Kubernetes API at {k8s.url}; kubeconfig written to {kubeconfig} (context 'fake')", flush=True)
        await stop.wait()


if __name__ == "__main__":  # python tests/fakes/k8s_server.py /tmp/kubeconfig  (Ctrl-C to stop)
    import sys

    asyncio.run(_serve(sys.argv[1] if len(sys.argv) > 1 else "kubeconfig-fake"))
