"""Every backend repeats its idempotent operations (create with an idempotency
key, delete, status/list) under ONE retry policy (`sandboxes.retry`), set by
the backend's `retry` option: Kubernetes and Prime against their contract
fakes failing the first N requests with 5xx/429 or a reset connection, the
local backend with an agent that fails to start once. Non-transient errors
(4xx, a sandbox that is gone) are never repeated."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from sandboxes import BackendUnavailable, SandboxNotRunning, SandboxSpec, get_backend
from sandboxes.retry import RetryPolicy, is_transient

FAST = {"attempts": 3, "initial_delay": 0.01, "max_delay": 0.05, "jitter": 0}


def _count(requests, method: str, fragment: str) -> int:
    return sum(1 for r in requests if r[0] == method and fragment in r[1])


def test_transient_predicate():
    from backends.kubernetes.api import ApiError

    assert is_transient(BackendUnavailable("down"))
    assert is_transient(ApiError(503, "x")) and is_transient(ApiError(429, "x")) and is_transient(ApiError(500, "x"))
    assert not is_transient(ApiError(409, "exists")) and not is_transient(ApiError(410, "gone"))
    assert not is_transient(SandboxNotRunning("gone"))
    assert not is_transient(ValueError("task"))


# -- kubernetes (contract fake) ----------------------------------------------------

@pytest.fixture
async def k8s(tmp_path, monkeypatch):
    for var in ("VF_K8S_CONTEXT", "VF_K8S_NAMESPACE", "VF_K8S_RUNTIME_CLASS", "KUBECONFIG"):
        monkeypatch.delenv(var, raising=False)
    from fakes.k8s_server import FakeKubernetes

    async with FakeKubernetes() as fake:
        fake.kubeconfig = str(fake.write_kubeconfig(tmp_path / "kubeconfig"))
        yield fake


@pytest.fixture
async def kube(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, poll_interval=0.05, retry=FAST)
    yield be
    await be.delete_many()
    await be.close()


@pytest.mark.parametrize("failure", [{"status": 503}, {"status": 500}, {"reset": True}])
async def test_k8s_create_survives_transient_failures(kube, k8s, failure):
    k8s.fail_next(2, method="POST", path="/pods", **failure)
    sb = await kube.create(SandboxSpec(), idempotency_key="k8s-retry")
    assert (await sb.exec("echo hi")).stdout == "hi\n"
    assert k8s.injected == 2 and _count(k8s.requests, "POST", "/pods") == 3
    assert list(k8s.pods) == [sb.id]


async def test_k8s_create_whose_answer_was_lost_adopts_the_pod(kube, k8s):
    """The server made the pod but the answer never arrived: the retry (same name) gets
    409 and adopts it instead of making a second pod."""
    k8s.fail_next(1, method="POST", path="/pods", reset=True, after=True)
    sb = await kube.create(SandboxSpec(), idempotency_key="lost-answer")
    assert list(k8s.pods) == [sb.id] and (await sb.exec("echo ok")).ok


async def test_k8s_delete_list_get_retry_and_honour_retry_after(kube, k8s):
    sb = await kube.create(SandboxSpec())
    k8s.fail_next(1, 429, method="GET", path="/pods", retry_after=0.4)
    t0 = time.monotonic()
    assert [i.id for i in await kube.list()] == [sb.id]
    assert time.monotonic() - t0 >= 0.38  # the server's Retry-After, not the 10 ms backoff
    k8s.fail_next(2, 502, method="DELETE")
    await kube.delete(sb.id)
    assert k8s.pods == {}


async def test_k8s_gives_up_after_the_policy_and_never_repeats_4xx(kube, k8s):
    k8s.fail_next(10, 503, method="GET", path="/pods")
    before = _count(k8s.requests, "GET", "/pods")
    with pytest.raises(BackendUnavailable, match="503"):
        await kube.list()
    assert _count(k8s.requests, "GET", "/pods") - before == 3  # attempts=3
    k8s._failures.clear()
    k8s.fail_next(1, 403, method="GET", path="/pods")
    before = _count(k8s.requests, "GET", "/pods")
    with pytest.raises(Exception, match="403"):
        await kube.list()
    assert _count(k8s.requests, "GET", "/pods") - before == 1


async def test_k8s_policy_comes_from_the_options(k8s):
    be = get_backend("kubernetes", kubeconfig=k8s.kubeconfig, retry={"attempts": 1})
    assert be.config.retry == RetryPolicy(attempts=1)
    k8s.fail_next(1, 503, method="GET", path="/pods")
    with pytest.raises(BackendUnavailable):
        await be.list()
    assert await be.list() == []
    await be.close()


# -- prime (contract fake, the real SDK in the loop) -------------------------------------

@pytest.fixture
async def prime(tmp_path, monkeypatch):
    pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")
    monkeypatch.setenv("HOME", str(tmp_path))  # the SDK caches gateway tokens under ~/.prime
    from fakes.prime_server import FakePrime

    async with FakePrime() as fake:
        be = get_backend("prime", api_key=fake.api_key, base_url=fake.url, retry=FAST)
        yield be, fake
        await be.delete_many()
        await be.close()


@pytest.mark.parametrize("failure", [{"status": 500}, {"status": 500, "after": True}, {"reset": True, "after": True}])
async def test_prime_create_survives_transient_failures_with_one_sandbox(prime, failure):
    be, fake = prime
    fake.fail_next(2, method="POST", path="/api/v1/sandbox", **failure)
    sb = await be.create(SandboxSpec())
    assert (await sb.exec("echo hi")).stdout == "hi\n"
    assert fake.injected == 2
    assert list(fake.sandboxes) == [sb.id]  # the idempotency key: never a second sandbox


async def test_prime_delete_list_status_retry(prime):
    be, fake = prime
    sb = await be.create(SandboxSpec())
    fake.fail_next(2, 500, method="GET", path="/api/v1/sandbox")
    assert [i.id for i in await be.list()] == [sb.id]
    fake.fail_next(2, 500, method="GET", path=f"/sandbox/{sb.id}")
    assert await sb.alive()
    fake.fail_next(2, 500, method="DELETE")
    await be.delete(sb.id)
    assert fake.sandboxes == {}
    assert fake.injected == 6


async def test_prime_gives_up_after_the_policy(prime):
    be, fake = prime
    fake.fail_next(10, 500, method="GET", path="/api/v1/sandbox")
    before = _count(fake.requests, "GET", "/api/v1/sandbox")
    with pytest.raises(BackendUnavailable):
        await be.list()
    assert _count(fake.requests, "GET", "/api/v1/sandbox") - before == 3


# -- local ----------------------------------------------------------------------------

async def test_local_create_retries_an_agent_that_failed_to_start(tmp_path):
    """The first agent start fails (its interpreter exits at once): create is an
    InfraError the policy repeats; nothing is left of the failed try."""
    marker = tmp_path / "failed-once"
    py = tmp_path / "flaky-python"
    py.write_text(f"#!/bin/sh\nif [ ! -e {marker} ]; then touch {marker}; exit 1; fi\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    base = tmp_path / "sandboxes"
    be = get_backend("local", base_dir=str(base), use_bwrap=False, python=str(py), hello_timeout=5, retry=FAST)
    try:
        sb = await be.create(SandboxSpec(), idempotency_key="local-retry")
        assert marker.exists() and (await sb.exec("echo ok")).stdout == "ok\n"
        assert sorted(os.listdir(base)) == [sb.id]  # the failed try's directory is gone
        await sb.delete()
        assert os.listdir(base) == []
    finally:
        await be.delete_many()
        await be.close()
    no_retry = get_backend("local", base_dir=str(base), use_bwrap=False, python=str(py), retry={"attempts": 1})
    marker.unlink()
    with pytest.raises(Exception) as e:
        await no_retry.create(SandboxSpec())
    assert is_transient(e.value)
    await asyncio.sleep(0)
    assert os.listdir(base) == []
