"""The conformance suite against a REAL Kubernetes cluster (deselected by default).

    VF_K8S_CONTEXT=<kubeconfig context> [VF_K8S_NAMESPACE=default] \\
    [VF_K8S_IMAGE=python:3.11-slim] .venv/bin/pytest -m k8s tests/test_k8s_real.py

Needs a namespace where the kubeconfig user may create/delete pods and
networkpolicies and create pods/exec, and an image with python3 that the
cluster can pull. Without VF_K8S_CONTEXT every test fails (it never skips
silently when asked for with -m k8s).
"""

from __future__ import annotations

import pytest

import test_conformance as suite
from backend_harness import open_backend
from test_conformance import *  # noqa: F401,F403  (the conformance tests, collected here with the fixture below)

pytestmark = pytest.mark.k8s


@pytest.fixture(params=["kubernetes-real"])
async def backend_env(request):
    async with open_backend(request.param) as env:
        yield env


async def test_pod_is_hardened_on_a_real_cluster(backend, spec):
    """The pod the cluster accepted keeps our security settings (admission may mutate pods)."""
    async with await backend.create(spec) as sb:
        pod = await backend.api.get_pod(sb.id)
        c = pod["spec"]["containers"][0]
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["limits"] == c["resources"]["requests"]
        r = await sb.exec("test -e /var/run/secrets/kubernetes.io/serviceaccount/token")
        assert r.exit_code != 0


assert suite.BACKENDS  # the suite module is imported for its tests
