"""How the conformance suite gets a backend: one async context manager per
backend kind that yields `(backend, base_spec)` and cleans up after itself.

  docker             the real engine (conftest's test image, $VF_CONFORMANCE_DOCKER_IMAGE to
                     override); FAILS when the engine is missing and VF_REQUIRE_DOCKER=1
  docker-gvisor      the same with isolation="gvisor" (the engine's runsc runtime; setup.sh
                     registers it): FAILS when the engine lacks it and VF_REQUIRE_DOCKER=1
  docker-cells       docker with rollout_isolation="namespace": every sandbox a cell of a
  docker-gvisor-cells  pooled host container (sandboxes/cells.py), under runc / gVisor
  local              bubblewrap when usable, plain processes otherwise
  local-nobwrap      forced plain processes (VF_LOCAL_NO_BWRAP semantics via use_bwrap=False)
  kubernetes         against tests/fakes/k8s_server.py (a CONTRACT FAKE) through a kubeconfig
  prime              against tests/fakes/prime_server.py (a CONTRACT FAKE) through the real SDK
  kubernetes-real    a real cluster: VF_K8S_CONTEXT (required), VF_K8S_NAMESPACE, VF_K8S_IMAGE

Also checks that the backend test files (test_backend_kubernetes.py,
test_backend_prime.py) make against their fakes alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sandboxes import SandboxSpec


@contextlib.asynccontextmanager
async def _docker(isolation: str = "runc", rollout_isolation: str = "container") -> AsyncIterator[tuple[object, SandboxSpec]]:
    from conftest import DEFAULT_TEST_IMAGE, TEST_LABELS, require_docker, require_gvisor

    require_docker()  # skips, or FAILS with VF_REQUIRE_DOCKER=1, when no engine answers
    if isolation == "gvisor":
        require_gvisor()
    from backends.docker import DockerBackend
    from backends.docker.images import ensure_image

    image = await asyncio.to_thread(ensure_image, os.environ.get("VF_CONFORMANCE_DOCKER_IMAGE", DEFAULT_TEST_IMAGE))
    backend = DockerBackend()
    try:
        yield backend, SandboxSpec(image=image, memory_gb=1, timeout_minutes=10, labels=dict(TEST_LABELS),
                                   isolation=isolation, rollout_isolation=rollout_isolation)
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def _local(use_bwrap: bool = True) -> AsyncIterator[tuple[object, SandboxSpec]]:
    from backends.local import LocalBackend

    base = tempfile.mkdtemp(prefix="vf-conf-local-")
    backend = LocalBackend(base_dir=base, use_bwrap=use_bwrap)
    try:
        yield backend, SandboxSpec()
    finally:
        await backend.delete_many()
        await backend.close()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def _kubernetes_fake() -> AsyncIterator[tuple[object, SandboxSpec]]:
    from backends.kubernetes import KubernetesBackend
    from fakes.k8s_server import FakeKubernetes

    async with FakeKubernetes() as k8s:
        d = tempfile.mkdtemp(prefix="vf-conf-kube-")
        kubeconfig = k8s.write_kubeconfig(os.path.join(d, "config"))
        backend = KubernetesBackend(kubeconfig=str(kubeconfig), context="fake", namespace=k8s.namespace,
                                    runtime_class_name=None, poll_interval=0.05)
        try:
            yield backend, SandboxSpec(image="python:3.11-slim")
        finally:
            await backend.close()
            shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def _prime_fake() -> AsyncIterator[tuple[object, SandboxSpec]]:
    pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")
    from backends.prime import PrimeBackend
    from fakes.prime_server import FakePrime

    home = tempfile.mkdtemp(prefix="vf-conf-prime-home-")
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = home  # the SDK caches gateway tokens under ~/.prime
    try:
        async with FakePrime() as fake:
            backend = PrimeBackend(api_key=fake.api_key, base_url=fake.url)
            try:
                yield backend, SandboxSpec(image="python:3.11-slim")
            finally:
                await backend.close()
    finally:
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home
        shutil.rmtree(home, ignore_errors=True)


@contextlib.asynccontextmanager
async def _kubernetes_real() -> AsyncIterator[tuple[object, SandboxSpec]]:
    context = os.environ.get("VF_K8S_CONTEXT")
    if not context:
        pytest.fail("the k8s suite needs VF_K8S_CONTEXT=<kubeconfig context>")
    from backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(context=context, namespace=os.environ.get("VF_K8S_NAMESPACE", "default"))
    try:
        yield backend, SandboxSpec(image=os.environ.get("VF_K8S_IMAGE", "python:3.11-slim"))
    finally:
        await backend.close()


KINDS = {
    "docker": _docker,
    "docker-gvisor": lambda: _docker("gvisor"),
    "docker-cells": lambda: _docker(rollout_isolation="namespace"),
    "docker-gvisor-cells": lambda: _docker("gvisor", "namespace"),
    "local": _local,
    "local-nobwrap": lambda: _local(use_bwrap=False),
    "kubernetes": _kubernetes_fake,
    "prime": _prime_fake,
    "kubernetes-real": _kubernetes_real,
}


def open_backend(kind: str):
    return KINDS[kind]()


async def check_cancelled_create_does_not_leak(backend: Any, requested: Callable[[], Any], live: Callable[[], dict]) -> None:
    """Cancel `backend.create()` once the fake saw the request (`requested()` truthy) but
    before the sandbox is ready; then the fake's `live()` sandboxes must drain to {}."""
    task = asyncio.ensure_future(backend.create(SandboxSpec()))
    for _ in range(400):  # cancel once the sandbox was requested, before it is ready
        if requested():
            break
        await asyncio.sleep(0.005)
    assert requested() and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not live():
            break
        await asyncio.sleep(0.05)
    assert live() == {}


async def check_reaper_deletes_expired_and_old(backend: Any, live: Callable[[], dict]) -> None:
    """`reap()` deletes the sandbox that expired and keeps the other; `reap(max_age_seconds=0)`
    then deletes that one too; the fake's `live()` sandboxes follow."""
    short = await backend.create(SandboxSpec(timeout_minutes=0.001))
    keep = await backend.create(SandboxSpec())
    await asyncio.sleep(0.1)
    assert await backend.reap() == [short.id]
    assert set(live()) == {keep.id}
    assert await backend.reap(max_age_seconds=0) == [keep.id]
    assert live() == {}
