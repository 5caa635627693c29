"""`KubernetesBackend` ("kubernetes"): one pod per sandbox, commands through
the shared in-sandbox agent over one pods/exec websocket per sandbox.

Create: rate-limited (token bucket) POST of the pod from `manifest.py`
(plus, once, the deny-all NetworkPolicy for network-off sandboxes), then
poll until Running (`status.py` turns ImagePullBackOff, Unschedulable past a
grace period, OOMKilled, Evicted... into typed InfraErrors carrying the pod's
own reason), then open the exec websocket running the agent; its hello is
the readiness probe. Creation is shielded: a caller cancelled mid-create
does not leak the pod (it is deleted), and with an idempotency key the pod
name is derived from the key, so a retried create adopts the first pod
instead of making a second.

Exec costs one round trip on the open websocket (pings every
`keepalive` seconds keep idle streams alive through proxies). The agent is
started with a tiny bootstrap (`python3 -u -c <20 lines>` reading the agent
source from stdin) so the exec URL stays short. When the stream drops, every
request in flight fails with AgentError (never re-sent: it may have run);
the next call reconnects once per drop, after checking that the pod still
runs (otherwise the pod's typed error is raised). Background processes die
with the dropped agent.

Delete is grace 0; `delete_many` uses deletecollection by label selector;
`reap` deletes sandboxes whose owner died or that expired.

Snapshots: a pod's filesystem cannot be committed through the Kubernetes API, so
`snapshot()` / `fork()` raise SnapshotUnsupported; `create_from_snapshot` makes a
pod of a snapshot pushed to a registry (a docker snapshot + `push_snapshot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from sandboxes import labels as lc
from sandboxes import lifecycle
from sandboxes.agent.client import AgentChannel, AgentConnection
from sandboxes.agent.protocol import bootstrap_argv
from sandboxes.ratelimit import RateLimiter
from sandboxes.errors import AgentError, BackendUnavailable, InfraError, SandboxCreateError, SnapshotUnsupported
from sandboxes.images import RegistryAuth
from sandboxes.results import SandboxInfo
from sandboxes.snapshots import Snapshot, image_spec, in_registry, restore_tmp
from sandboxes.spec import SandboxSpec, refuse_namespace, refuse_user_switch

from .._remote import RemoteAgentSandbox, shielded_create, start_bootstrapped, started_or_deleted
from . import manifest as mf
from .api import Connection, ExecChannel, KubeApi
from .config import KubernetesConfig
from .poller import StatusBatcher
from .status import classify, pod_error

log = logging.getLogger(__name__)

MAX_RECONNECTS = 3  # per sandbox handle; each drop gets one attempt


class KubeAgentChannel(AgentChannel):
    """`AgentChannel` over an exec websocket whose process is the bootstrapped agent."""

    def __init__(self, ch: ExecChannel) -> None:
        self.ch = ch

    async def send(self, data: bytes) -> None:
        await self.ch.send(data)

    async def receive(self) -> bytes:
        return await self.ch.recv()

    async def close(self) -> None:
        await self.ch.close()

    def describe(self) -> str:
        return f"pods/exec websocket to {self.ch.pod} ({self.ch.protocol})"

    def log_tail(self) -> str:
        tail = bytes(self.ch.stderr[-4000:]).decode("utf-8", "replace")
        if self.ch.status and self.ch.status.get("status") != "Success":
            tail += f"\nexec status: {self.ch.status.get('message', self.ch.status)}"
        return tail


class KubeSandbox(RemoteAgentSandbox):
    backend_name = "kubernetes"
    _backend: "KubernetesBackend"

    def __init__(self, *args, backend: "KubernetesBackend", **kwargs) -> None:
        super().__init__(*args, backend=backend, **kwargs)
        self._reconnects = 0
        self._reconnect_lock = asyncio.Lock()

    async def snapshot(self, *, keep: bool = False):
        """Refused: the Kubernetes API cannot freeze a pod's filesystem (no commit of a
        container in the pod or exec API; the fake speaks the same API)."""
        raise SnapshotUnsupported(
            "the kubernetes backend cannot snapshot or fork a sandbox: the Kubernetes API has no way to commit a "
            "pod's filesystem. Snapshot a docker sandbox, push_snapshot it to a registry, and create pods of it "
            "with create_from_snapshot")

    async def _ensure(self) -> None:
        """Reconnect the agent once after a dropped stream, if the pod still runs."""
        if self._deleted or self._conn.dead is None:
            return
        async with self._reconnect_lock:
            if self._conn.dead is None or self._deleted:
                return
            pod = await self._backend.api.get_pod(self.id)
            state, _ = classify(pod) if pod else ("failed", None)
            if state != "ready":
                raise pod_error(pod, self.id) from self._conn.dead
            if self._reconnects >= MAX_RECONNECTS:
                raise AgentError(f"pod {self.id}: agent stream dropped again after {self._reconnects} reconnects") from self._conn.dead
            self._reconnects += 1
            log.warning("pod %s: agent stream dropped (%s); reconnecting", self.id, self._conn.dead)
            self._conn = await self._backend._start_agent(self.id)

    async def _classified(self, exc: AgentError) -> BaseException:
        """A dropped stream caused by the pod dying becomes the pod's typed error."""
        with contextlib.suppress(InfraError):
            pod = await self._backend.api.get_pod(self.id)
            if pod is None or classify(pod)[0] != "ready":
                return pod_error(pod, self.id)
        return exc

    async def alive(self) -> bool:
        if self._deleted:
            return False
        try:
            pod = await self._backend.api.get_pod(self.id)
        except InfraError:
            return False
        if pod is None or classify(pod)[0] != "ready":
            return False
        try:
            await self._ensure()
        except InfraError:
            return False
        return await super().alive()


class KubernetesBackend:
    """Sandboxes as pods. Options: the fields of `KubernetesConfig`."""

    name = "kubernetes"

    def __init__(self, **options: Any) -> None:
        self.config = KubernetesConfig(**options)
        self.limiter = RateLimiter(self.config.creates_per_second, self.config.create_burst)
        self._api: KubeApi | None = None
        self._api_lock = asyncio.Lock()
        self._policy_ready = False
        self._status: StatusBatcher | None = None

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise RuntimeError("kubernetes backend used before connecting")
        return self._api

    async def connect(self) -> KubeApi:
        """Load cluster config (kubeconfig or in-cluster) once."""
        if self._api is None:
            async with self._api_lock:
                if self._api is None:
                    conn = await asyncio.to_thread(Connection.load, self.config)
                    self._api = KubeApi(conn, self.config)
                    self._status = StatusBatcher(self._api)
        return self._api

    # -- snapshots (SupportsSnapshots): pods of pushed snapshots; the cluster takes none itself
    async def create_from_snapshot(self, snapshot: Snapshot) -> KubeSandbox:
        """A pod of a pushed "image" snapshot (`push_snapshot` on the docker backend): its
        registry reference, with the snapshot's spec (limits, isolation, environment, workdir,
        user). A snapshot only a docker engine holds, or a cell's layer, is refused
        (SnapshotUnsupported): the cluster can pull only what a registry has."""
        if not in_registry(snapshot):
            raise SnapshotUnsupported(
                f"the kubernetes backend creates pods only of snapshots pushed to a registry; snapshot {snapshot.id} "
                f"is a {snapshot.kind!r} snapshot at {snapshot.image or 'its cell host'}: push_snapshot it (docker "
                "backend) to a registry the cluster can pull from")
        return await restore_tmp(await self.create(image_spec(snapshot, snapshot.image)), snapshot)

    async def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Nothing to do: the cluster holds no snapshot (a pushed one's registry copy is not ours)."""

    async def list_snapshots(self, labels: dict[str, str] | None = None) -> list[Snapshot]:
        """Always empty: the cluster holds no snapshot."""
        return []

    async def push_snapshot(self, snapshot: Snapshot, target: str, auth: RegistryAuth | None = None) -> Snapshot:
        """Refused: the cluster holds no snapshot to push (push from the docker backend)."""
        raise SnapshotUnsupported("the kubernetes backend has no snapshots to push: push_snapshot on the docker "
                                  "backend that made it")

    # -- create
    async def create(self, spec: SandboxSpec, *, idempotency_key: str | None = None) -> KubeSandbox:
        refuse_namespace(spec, "kubernetes")
        refuse_user_switch(spec, "kubernetes")
        api = await self.connect()
        labels = {**spec.labels, **lc.lifecycle_labels(spec)}
        name = mf.pod_name(spec)
        if idempotency_key:
            name = name.rsplit("-", 1)[0] + "-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]
        manifest = mf.pod_manifest(spec, self.config, name, labels)
        if not spec.network and self.config.create_network_policy and not self._policy_ready:
            await api.ensure_network_policy(mf.deny_all_network_policy(self.config))
            self._policy_ready = True
        # If the caller gives up, the pod may still come to exist: make sure it does not leak.
        run_selector = mf.selector({lc.RUN_ID: labels[lc.RUN_ID]})  # this pod's run (a backend serves every run)
        return await shielded_create(self._create_and_wait(manifest, spec, run_selector),
                                     lambda: self.api.delete_pod(name))

    async def _create_and_wait(self, manifest: dict[str, Any], spec: SandboxSpec, run_selector: str) -> KubeSandbox:
        name = manifest["metadata"]["name"]
        await self.limiter.acquire()
        try:
            await self.api.create_pod(manifest)
        except InfraError as e:
            if getattr(e, "status", None) != 409:
                raise SandboxCreateError(f"cannot create pod {name}: {e}") from e
            log.info("pod %s already exists (idempotent create): adopting it", name)
        async def start() -> AgentConnection:
            await self._wait_running(name, run_selector)
            return await self._start_agent(name)

        # e.g. PodOOMKilled or an agent that never said hello: creation failed (cause kept)
        conn = await started_or_deleted(start, lambda: self.api.delete_pod(name), f"pod {name} failed while starting",
                                        keep=(SandboxCreateError, BackendUnavailable))
        lifecycle.track(name, functools.partial(self.api.delete_pod_sync, name), backend=self.name)
        return KubeSandbox(conn, id=name, name=name, spec=spec, backend_name=self.name, backend=self)

    async def _wait_running(self, name: str, run_selector: str) -> dict[str, Any]:
        cfg = self.config
        deadline = time.monotonic() + cfg.ready_timeout
        unschedulable_since: float | None = None
        last: dict[str, Any] | None = None
        delay = 0.05  # short first polls: a warm node starts a pod in well under a second
        assert self._status is not None
        while True:
            pod = await self._status.get(name, run_selector)  # coalesced with the run's other pods starting now
            if pod is None:
                raise SandboxCreateError(f"pod {name} disappeared while starting")
            last = pod
            state, err = classify(pod)
            if state == "ready":
                return pod
            if state == "failed":
                raise err  # type: ignore[misc]
            if state == "unschedulable":
                unschedulable_since = unschedulable_since or time.monotonic()
                if time.monotonic() - unschedulable_since >= cfg.unschedulable_grace:
                    raise err  # type: ignore[misc]
            else:
                unschedulable_since = None
            if time.monotonic() >= deadline:
                phase = (last.get("status") or {}).get("phase")
                raise SandboxCreateError(f"pod {name} not running after {cfg.ready_timeout:.0f}s (phase {phase})")
            await asyncio.sleep(delay)
            delay = min(cfg.poll_interval, delay * 2)

    async def _start_agent(self, name: str) -> AgentConnection:
        """Open the exec websocket, bootstrap the agent, wait for its hello (the readiness probe)."""
        ch = await self.api.exec_channel(name, bootstrap_argv(self.config.python))
        try:
            return await start_bootstrapped(KubeAgentChannel(ch), timeout=min(60.0, self.config.ready_timeout))
        except AgentError as e:
            raise AgentError(f"pod {name}: agent did not start (is {self.config.python} in the image?): {e}") from e

    # -- the rest of the contract
    async def get(self, sandbox_id: str) -> KubeSandbox:
        api = await self.connect()
        pod = await api.get_pod(sandbox_id)
        if pod is None or classify(pod)[0] != "ready":
            raise pod_error(pod, sandbox_id)
        spec = mf.spec_of(pod) or SandboxSpec(image=pod["spec"]["containers"][0]["image"])
        conn = await self._start_agent(sandbox_id)
        return KubeSandbox(conn, id=sandbox_id, name=sandbox_id, spec=spec, backend_name=self.name, backend=self)

    async def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        api = await self.connect()
        pods = await api.list_pods(mf.selector(labels or {}))
        out = []
        for pod in pods:
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue  # terminating: already deleted as far as callers are concerned
            exact = mf.labels_of(pod)
            if labels and any(exact.get(k) != v for k, v in labels.items()):
                continue  # a sanitised-value collision: the annotation has the truth
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            created = exact.get(lc.CREATED_AT)
            out.append(SandboxInfo(
                id=meta.get("name", ""), name=meta.get("name", ""), backend=self.name,
                status=str(status.get("phase", "Pending")).lower(),
                image=((pod.get("spec") or {}).get("containers") or [{}])[0].get("image", ""),
                labels=exact, created_at=float(created) if created else None,
            ))
        return out

    async def delete(self, sandbox_id: str) -> None:
        api = await self.connect()
        await api.delete_pod(sandbox_id)
        lifecycle.untrack(sandbox_id)

    async def delete_many(self, labels: dict[str, str] | None = None, ids: Sequence[str] | None = None) -> int:
        """By label (every vf-sandbox pod when both are None): one deletecollection call;
        by ids (optionally filtered by labels): one grace-0 delete per live pod of ours
        among them (unknown or already deleted ids are skipped)."""
        api = await self.connect()
        if ids is None:
            gone = await api.delete_pods(mf.selector(labels or {}))
            for name in gone:
                lifecycle.untrack(name)
            return len(gone)
        if not ids:
            return 0
        targets = set(ids) & {i.id for i in await self.list(labels or {})}  # never a pod that is not ours
        results = await asyncio.gather(*(api.delete_pod(t) for t in targets))
        for t in targets:
            lifecycle.untrack(t)
        return sum(1 for r in results if r)

    async def reap(self, *, max_age_seconds: float | None = None) -> list[str]:
        """Delete sandboxes whose owner process died, that expired, or are older than `max_age_seconds`."""
        now = time.time()
        doomed = [i.id for i in await self.list() if lifecycle.reap_due(i, now, max_age_seconds)]
        await asyncio.gather(*(self.delete(d) for d in doomed))
        return doomed

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()


__all__ = ["KubernetesBackend", "KubeSandbox", "KubeAgentChannel"]
