"""Kubernetes backend specifics: the pod manifest, label sanitising, pod status
classification, and behaviour against the contract fake API server
(failures with the pod's own reason, reconnect without re-running, rate
limit, idempotent and cancelled creates, grace-0 deletes, the reaper)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from backends.kubernetes import (
    KubernetesConfig,
    PodDeadlineExceeded,
    PodEvicted,
    PodImagePullError,
    PodOOMKilled,
    PodStartError,
    PodUnschedulable,
)
from backends.kubernetes import manifest as mf
from sandboxes.ratelimit import RateLimiter
from backends.kubernetes.status import PodTerminated, classify
from backend_harness import check_cancelled_create_does_not_leak, check_reaper_deletes_expired_and_old
from fakes.k8s_server import FakeKubernetes
from sandboxes import (
    AgentError,
    BackendUnavailable,
    ConfigError,
    InfraError,
    SandboxCreateError,
    SandboxNotRunning,
    SandboxSpec,
    get_backend,
)
from sandboxes import labels as lc

# -- manifest -----------------------------------------------------------------------


def test_pod_manifest_resources_security_and_scheduling():
    spec = SandboxSpec(image="img:1", cpu_cores=1.5, memory_gb=0.5, disk_size_gb=3, gpu_count=2,
                       environment_vars={"A": "1"}, user="1000:2000", timeout_minutes=2, workdir="/work",
                       start_command="sleep infinity")
    cfg = KubernetesConfig(namespace="ns", runtime_class_name="gvisor", node_selector={"pool": "sbx"},
                           tolerations=[{"key": "sbx", "operator": "Exists", "effect": "NoSchedule"}],
                           image_pull_secrets=["regcred"])
    labels = {"task": "t1", **lc.lifecycle_labels(spec)}
    pod = mf.pod_manifest(spec, cfg, "p-1", labels)
    c = pod["spec"]["containers"][0]
    res = c["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "1500m", "memory": "512Mi", "ephemeral-storage": "3072Mi",
                                                 "nvidia.com/gpu": "2"}
    assert c["image"] == "img:1" and c["command"] == ["/bin/sh", "-c", "sleep infinity"]
    assert c["env"] == [{"name": "A", "value": "1"}] and c["workingDir"] == "/work"
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (1000, 2000, True)
    ps = pod["spec"]
    assert ps["automountServiceAccountToken"] is False and ps["enableServiceLinks"] is False
    assert ps["restartPolicy"] == "Never" and ps["activeDeadlineSeconds"] == 120
    assert ps["runtimeClassName"] == "gvisor" and ps["nodeSelector"] == {"pool": "sbx"}
    assert ps["tolerations"][0]["key"] == "sbx" and ps["imagePullSecrets"] == [{"name": "regcred"}]
    meta = pod["metadata"]
    assert meta["namespace"] == "ns" and meta["labels"][lc.MANAGED] == "true"
    assert meta["labels"][mf.NETWORK_LABEL] == "off"
    assert json.loads(meta["annotations"][mf.LABELS_ANNOTATION]) == labels
    assert mf.labels_of(pod) == labels and mf.spec_of(pod) == spec


def test_pod_manifest_defaults_and_user_handling():
    pod = mf.pod_manifest(SandboxSpec(network=True), KubernetesConfig(), "p", {})
    c, ps = pod["spec"]["containers"][0], pod["spec"]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert "runAsUser" not in c["securityContext"] and "workingDir" not in c
    assert not {"runtimeClassName", "nodeSelector", "tolerations", "imagePullSecrets"} & set(ps)
    assert mf.NETWORK_LABEL not in pod["metadata"]["labels"]
    root = mf.pod_manifest(SandboxSpec(user="0"), KubernetesConfig(), "p", {})
    assert root["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is False
    with pytest.raises(ConfigError, match="numeric"):
        mf.pod_manifest(SandboxSpec(user="nobody"), KubernetesConfig(), "p", {})


def test_label_values_are_sanitised_injectively():
    assert mf.label_value("abc-1.2_3") == "abc-1.2_3"
    weird = ["has space", "x" * 80, "a/b", "-lead", "ünï"]
    out = [mf.label_value(v) for v in weird]
    assert len(set(out)) == len(out)
    for v in out:
        assert len(v) <= 63 and mf._KEY_NAME.match(v)
    assert mf.label_value("has space") == mf.label_value("has space")
    assert mf.selector({"run": "a b"}) == f"run={mf.label_value('a b')},{lc.MANAGED}=true"
    with pytest.raises(ConfigError):
        mf.label_key("bad key!")


def test_deny_all_network_policy():
    np = mf.deny_all_network_policy(KubernetesConfig(namespace="ns"))
    assert np["spec"]["podSelector"] == {"matchLabels": {mf.NETWORK_LABEL: "off"}}
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"] and np["spec"]["egress"] == []


# -- status classification ------------------------------------------------------------


def _pod(status):
    return {"metadata": {"name": "p"}, "status": status}


def _waiting(reason, message=""):
    return _pod({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": reason, "message": message}}}]})


@pytest.mark.parametrize("pod,state,err,text", [
    (_waiting("ImagePullBackOff", 'Back-off pulling image "nope"'), "failed", PodImagePullError, 'ImagePullBackOff: Back-off pulling image "nope"'),
    (_waiting("ErrImagePull"), "failed", PodImagePullError, "ErrImagePull"),
    (_waiting("CreateContainerConfigError", "secret x not found"), "failed", PodStartError, "secret x not found"),
    (_waiting("ContainerCreating"), "pending", None, None),
    (_pod({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                               "message": "0/3 nodes: Insufficient cpu"}]}),
     "unschedulable", PodUnschedulable, "Insufficient cpu"),
    (_pod({"phase": "Running", "containerStatuses": [{"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}),
     "failed", PodOOMKilled, "OOMKilled"),
    (_pod({"phase": "Failed", "reason": "Evicted", "message": "low on ephemeral-storage"}), "failed", PodEvicted, "low on ephemeral-storage"),
    (_pod({"phase": "Failed", "reason": "DeadlineExceeded", "message": "too long"}), "failed", PodDeadlineExceeded, "DeadlineExceeded"),
    (_pod({"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}), "ready", None, None),
])
def test_classify_pod_status(pod, state, err, text):
    got_state, got_err = classify(pod)
    assert got_state == state
    if err is None:
        assert got_err is None
    else:
        assert isinstance(got_err, err) and isinstance(got_err, InfraError) and text in str(got_err)


# -- against the fake API server --------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch):
    """The fake's kubeconfig must win over a developer's VF_K8S_* settings."""
    for var in ("VF_K8S_CONTEXT", "VF_K8S_NAMESPACE", "VF_K8S_RUNTIME_CLASS", "KUBECONFIG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
async def k8s(tmp_path):
    async with FakeKubernetes() as fake:
        fake.kubeconfig = str(fake.write_kubeconfig(tmp_path / "kubeconfig"))
        yield fake


@pytest.fixture
async def backend(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, poll_interval=0.05)
    yield be
    await be.delete_many()
    await be.close()


async def test_create_failures_carry_the_pod_reason_and_leave_no_pod(backend, k8s):
    with pytest.raises(PodImagePullError, match="ImagePullBackOff") as e:
        await backend.create(SandboxSpec(image="registry.example/imagepullbackoff:1"))
    assert isinstance(e.value, SandboxCreateError)
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, poll_interval=0.05, unschedulable_grace=0.2)
    with pytest.raises(PodUnschedulable, match="Insufficient nvidia.com/gpu"):
        await be.create(SandboxSpec(image="unschedulable", gpu_count=1))
    await be.close()
    with pytest.raises(SandboxCreateError, match="container terminated") as e:
        await backend.create(SandboxSpec(image="crashloop"))
    assert isinstance(e.value.__cause__, PodTerminated)
    assert k8s.pods == {}


async def test_evicted_and_oom_killed_pods_raise_typed_errors(backend, k8s):
    a = await backend.create(SandboxSpec())
    b = await backend.create(SandboxSpec())
    await k8s.evict(a.id)
    with pytest.raises(PodEvicted, match="low on resource"):
        await a.exec("echo x")
    await k8s.oom_kill(b.id)
    with pytest.raises(PodOOMKilled) as e:
        await b.exec("echo x")
    assert isinstance(e.value, SandboxNotRunning)
    assert not await b.alive()
    await a.delete()
    await b.delete()


async def test_dropped_stream_fails_in_flight_call_once_and_reconnects(backend, k8s):
    async with await backend.create(SandboxSpec()) as sb:
        d = (await sb.exec("mktemp -d")).stdout.strip()
        call = asyncio.ensure_future(sb.exec(f"echo run >> {d}/runs; sleep 5; echo done"))
        for _ in range(200):  # until the command has certainly started
            if (await sb.exec(f"test -e {d}/runs")).ok:
                break
            await asyncio.sleep(0.02)
        assert await k8s.drop_exec_streams(sb.id) == 1
        with pytest.raises(AgentError):
            await call
        # the next call reconnects (a second exec websocket) and the command ran exactly once
        assert (await sb.exec(f"cat {d}/runs")).stdout == "run\n"
        assert k8s.count("GET", f"/pods/{sb.id}/exec") == 2


async def test_reconnect_budget_is_bounded(backend, k8s):
    from backends.kubernetes.backend import MAX_RECONNECTS

    async with await backend.create(SandboxSpec()) as sb:
        for _ in range(MAX_RECONNECTS):
            await k8s.drop_exec_streams(sb.id)
            await asyncio.sleep(0.1)
            assert (await sb.exec("echo ok")).ok
        await k8s.drop_exec_streams(sb.id)
        await asyncio.sleep(0.1)
        with pytest.raises(AgentError, match="reconnects"):
            await sb.exec("echo ok")


async def test_failed_exec_handshake_is_infra(backend, k8s):
    async with await backend.create(SandboxSpec()) as sb:
        await k8s.drop_exec_streams(sb.id)
        await asyncio.sleep(0.1)
        k8s.fail_next_exec = 1
        with pytest.raises(AgentError, match=r"handshake failed \(500"):
            await sb.exec("echo x")


async def test_creation_rate_limit(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, poll_interval=0.05, creates_per_second=8, create_burst=1)
    await asyncio.gather(*(be.create(SandboxSpec()) for _ in range(4)))
    times = k8s.create_times
    assert len(times) == 4 and times[-1] - times[0] >= 3 / 8 * 0.8  # 1/8 s apart (minus jitter)
    await be.delete_many()
    await be.close()


async def test_rate_limiter_token_bucket():
    lim = RateLimiter(rate=20, burst=2)
    t0 = time.monotonic()
    waits = [await lim.acquire() for _ in range(6)]
    assert waits[:2] == [0.0, 0.0]
    assert time.monotonic() - t0 >= (6 - 2) / 20 * 0.9


async def test_idempotent_create_adopts_the_first_pod(backend, k8s):
    a = await backend.create(SandboxSpec(), idempotency_key="rollout-7")
    b = await backend.create(SandboxSpec(), idempotency_key="rollout-7")
    assert a.id == b.id and len(k8s.pods) == 1
    c = await backend.create(SandboxSpec(), idempotency_key="rollout-8")
    assert c.id != a.id
    for s in (a, b, c):
        await s.delete()


async def test_cancelled_create_does_not_leak(backend, k8s):
    await check_cancelled_create_does_not_leak(backend, lambda: k8s.create_times, lambda: k8s.pods)


async def test_deletes_use_grace_zero_and_network_policy_is_created_once(backend, k8s):
    a = await backend.create(SandboxSpec())
    await backend.create(SandboxSpec(labels={"group": "g"}))
    await backend.create(SandboxSpec(network=True, labels={"group": "g"}))
    assert list(k8s.network_policies) == ["vf-sandbox-deny-all"]
    assert k8s.count("POST", "/networkpolicies") == 1
    await a.delete()
    assert await backend.delete_many(labels={"group": "g"}) == 2
    assert k8s.delete_bodies and all(b.get("gracePeriodSeconds") == 0 for b in k8s.delete_bodies)
    assert k8s.pods == {}


async def test_network_off_sandbox_has_no_network_in_the_fake(backend, k8s):
    if k8s.bwrap is None:
        pytest.skip("the fake enforces NetworkPolicy with bubblewrap only")
    ifaces = "python3 -c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'"
    async with await backend.create(SandboxSpec()) as off, await backend.create(SandboxSpec(network=True)) as on:
        assert (await off.exec(ifaces)).stdout.strip() == "['lo']"
        assert (await on.exec(ifaces)).stdout.strip() != "['lo']"


async def test_reaper_deletes_expired_and_old_sandboxes(backend, k8s):
    await check_reaper_deletes_expired_and_old(backend, lambda: k8s.pods)


async def test_config_and_connectivity_errors(tmp_path, k8s):
    with pytest.raises(ConfigError, match="Kubernetes config"):
        await get_backend("kubernetes", kubeconfig=str(tmp_path / "missing")).create(SandboxSpec())
    k8s.token = "rotated"
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig)
    with pytest.raises(ConfigError, match="401"):
        await be.list()
    await be.close()
    cfg = json.loads(open(k8s.kubeconfig).read())
    cfg["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"
    (tmp_path / "down").write_text(json.dumps(cfg))
    be = get_backend("kubernetes", kubeconfig=str(tmp_path / "down"))
    with pytest.raises(BackendUnavailable):
        await be.list()
    await be.close()


async def test_idle_stream_gets_keepalive_frames(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, poll_interval=0.05, keepalive=0.1)
    async with await be.create(SandboxSpec()) as sb:
        await asyncio.sleep(0.65)  # idle: only keepalives cross the stream
        assert k8s.empty_stdin_frames >= 3
        before = k8s.empty_stdin_frames
        for _ in range(20):  # busy: requests keep the stream alive, keepalives are not needed
            await sb.exec(["sleep", "0.02"])
        assert k8s.empty_stdin_frames - before <= 5
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    await be.close()


async def test_lifecycle_cleanup_deletes_tracked_pods_synchronously(backend, k8s):
    from sandboxes import lifecycle

    sb = await backend.create(SandboxSpec())
    assert sb.id in lifecycle.live()
    # the remover is blocking (signal handler / atexit); run it off the loop that serves the fake
    assert await asyncio.to_thread(lifecycle.cleanup_all) >= 1
    assert k8s.pods == {} and sb.id not in lifecycle.live()
    other = await backend.create(SandboxSpec())
    await other.delete()
    assert other.id not in lifecycle.live()


async def test_delete_many_without_filters_removes_only_our_pods(backend, k8s):
    await backend.create(SandboxSpec())
    await backend.create(SandboxSpec(labels={"x": "y"}))
    foreign = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-ours", "labels": {"app": "web"}},
               "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    await backend.api.create_pod(foreign)
    assert await backend.delete_many() == 2
    assert set(k8s.pods) == {"not-ours"}
    assert await backend.delete_many(ids=["not-ours"]) == 0 and "not-ours" in k8s.pods


async def test_older_servers_speaking_only_v4(tmp_path):
    async with FakeKubernetes(protocols=("v4.channel.k8s.io",)) as old:
        be = get_backend("kubernetes", kubeconfig=str(old.write_kubeconfig(tmp_path / "kc")), poll_interval=0.05)
        async with await be.create(SandboxSpec()) as sb:
            assert sb.connection.channel.ch.protocol == "v4.channel.k8s.io"
            r = await sb.exec("head -c 300000 /dev/zero | tr '\\0' a", output_limit=1 << 20)
            assert len(r.stdout) == 300000
            path = (await sb.exec("mktemp")).stdout.strip()
            await sb.write_file(path, b"\x00\xff" * 1000)
            assert await sb.read_file(path) == b"\x00\xff" * 1000
        await be.close()


async def test_agent_that_cannot_start_is_a_create_error(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, poll_interval=0.05, python="no-such-python3")
    with pytest.raises(SandboxCreateError, match="no-such-python3"):
        await be.create(SandboxSpec())
    assert k8s.pods == {}
    await be.close()


async def test_the_fake_agrees_with_the_official_client(k8s):
    """The fake is checked against an independent implementation of the same protocols: the
    official `kubernetes` client's REST calls and its `stream()` exec over the websocket."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig
    from kubernetes.stream import stream

    def official() -> tuple[str, list[str], str]:
        api_client = kconfig.new_client_from_config(config_file=k8s.kubeconfig)
        v1 = kclient.CoreV1Api(api_client)
        pod = kclient.V1Pod(metadata=kclient.V1ObjectMeta(name="official", labels={"via": "client"}),
                            spec=kclient.V1PodSpec(containers=[kclient.V1Container(name="c", image="python:3.11-slim")]))
        v1.create_namespaced_pod("default", pod)
        for _ in range(100):
            if v1.read_namespaced_pod("official", "default").status.phase == "Running":
                break
            time.sleep(0.05)
        out = stream(v1.connect_get_namespaced_pod_exec, "official", "default",
                     command=["sh", "-c", "echo from-exec; echo err >&2"], stderr=True, stdin=False, stdout=True, tty=False)
        names = [p.metadata.name for p in v1.list_namespaced_pod("default", label_selector="via=client").items]
        try:
            v1.read_namespaced_pod("missing", "default")
        except kclient.ApiException as e:
            missing = f"{e.status} {json.loads(e.body)['reason']}"
        v1.delete_namespaced_pod("official", "default", grace_period_seconds=0)
        api_client.close()
        return out, names, missing

    out, names, missing = await asyncio.to_thread(official)
    assert "from-exec" in out and names == ["official"] and missing == "404 NotFound"
    assert k8s.pods == {}


async def test_starting_pods_share_status_requests(tmp_path):
    """Many sandboxes starting at once do not poll the API server once per pod."""
    async with FakeKubernetes(start_delay=0.4) as slow:
        be = get_backend("kubernetes", kubeconfig=str(slow.write_kubeconfig(tmp_path / "kc")), poll_interval=0.1,
                         creates_per_second=1000, create_burst=100)
        made = await asyncio.gather(*(be.create(SandboxSpec()) for _ in range(8)))
        pod_gets = sum(1 for m, p, _ in slow.requests if m == "GET" and "/pods/" in p and not p.endswith("/exec"))
        lists = sum(1 for m, p, q in slow.requests if m == "GET" and p.endswith("/pods") and lc.RUN_ID in q.get("labelSelector", ""))
        assert be._status.lists == lists >= 1
        assert pod_gets + lists < 8 * 4  # one GET per pod per poll would be ≥ 8 × 4 polls over 0.4 s
        for s in made:
            await s.delete()
        await be.close()


async def test_one_backend_serves_runs_one_after_another_and_at_once(tmp_path):
    """A backend outlives a run (a server process, a worker running several): the status reads of
    each run's starting pods are batched by that run's label, not the first run's."""
    from sandboxes import settings

    async with FakeKubernetes(start_delay=0.3) as slow:
        be = get_backend("kubernetes", kubeconfig=str(slow.write_kubeconfig(tmp_path / "kc")), poll_interval=0.05,
                         creates_per_second=1000, create_burst=100)

        async def run(label: str) -> list:
            with settings.use(settings.current().model_copy(update={"sandbox_run_id": label})):
                made = await asyncio.gather(*(be.create(SandboxSpec()) for _ in range(4)))
            assert {s.id for s in made} == {p.id for p in await be.list({lc.RUN_ID: label})}
            return made

        try:
            made = await run("run-a") + await run("run-b")
            made += sum(await asyncio.gather(run("run-c"), run("run-d")), [])
            assert len(made) == 16 and be._status.lists >= 4  # the LIST path, once per run at least
            selectors = {q.get("labelSelector", "") for m, p, q in slow.requests if m == "GET" and p.endswith("/pods")}
            assert {f"{lc.RUN_ID}=run-{x}" for x in "abcd"} <= {part for s in selectors for part in s.split(",")}
        finally:
            await be.delete_many()
            await be.close()


async def test_missing_namespace_is_a_config_error(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, namespace="no-such-ns")
    with pytest.raises(ConfigError, match="no-such-ns"):
        await be.create(SandboxSpec())
    await be.close()
