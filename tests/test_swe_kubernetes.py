"""`vf-swe-debug --backend kubernetes` needs no Docker on the machine running it: rows
that name their image (`image_name`, or the SWE-bench name under --registry /
--namespace) are handed to the cluster by name and graded there, while DOCKER_HOST
points at a socket that does not exist (any call to an engine would fail the row).

The cluster is the Kubernetes wire-protocol CONTRACT FAKE (tests/fakes/k8s_server.py):
its "registry" holds exactly the images given to it, each a directory tree that
becomes the pod's filesystem (a git work tree in /testbed; the tests run with the
host's /usr/bin/python3 and unittest), and any other name fails to pull. So a
wrongly resolved image name cannot be graded valid. What this does not show: a real
cluster pulling a real SWE-bench image (tests/test_k8s_real.py needs VF_K8S_CONTEXT).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = "registry.example:5000"  # never contacted: the fake cluster "pulls" from its own table
NO_DOCKER = "unix:///nonexistent/vf-no-docker.sock"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@invalid", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def _image_tree(root: Path) -> tuple[Path, dict]:
    """An image filesystem with /testbed at a buggy base commit, and the row's fields
    (gold patch fixing the bug, a test patch adding the failing test)."""
    repo = root / "testbed"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_base.py").write_text(
        "import unittest\n\nclass BaseTest(unittest.TestCase):\n    def test_one(self):\n        self.assertEqual(1, 1)\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    (repo / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\n"
        "class CalcTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    _git(repo, "add", "-N", "test_calc.py")
    test_patch = _git(repo, "diff")
    _git(repo, "rm", "-q", "--cached", "test_calc.py")
    (repo / "test_calc.py").unlink()
    assert _git(repo, "status", "--porcelain") == ""
    row = {"repo": "org/calc", "base_commit": base, "patch": patch, "test_patch": test_patch,
           "FAIL_TO_PASS": ["test_calc.CalcTest.test_add"], "PASS_TO_PASS": ["test_base.BaseTest.test_one"],
           "test_cmd": "python3 -m unittest -v", "test_directives": ["test_calc.py", "test_base.py"],
           "log_parser": "unittest"}
    return root, row


async def test_cli_on_kubernetes_grades_named_images_without_docker(tmp_path):
    from fakes.k8s_server import FakeKubernetes
    from swe_debug.images import swebench_image_name

    tree, fields = _image_tree(tmp_path / "image")
    by_scheme = swebench_image_name(f"{REGISTRY}/team", "org__calc-1")  # --registry + --namespace
    named = f"{REGISTRY}/other/calc:v1"  # the row's own image_name
    ds = tmp_path / "rows.jsonl"
    ds.write_text(json.dumps({"instance_id": "org__calc-1", **fields}) + "\n"
                  + json.dumps({"instance_id": "org__calc-2", "image_name": named, **fields}) + "\n")
    out = tmp_path / "out"
    async with FakeKubernetes(images={by_scheme: tree, named: tree}) as k8s:
        kubeconfig = k8s.write_kubeconfig(tmp_path / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VF_K8S_", "DOCKER_"))}
        env.update(KUBECONFIG=str(kubeconfig), VF_K8S_CONTEXT="fake", VF_K8S_NAMESPACE=k8s.namespace,
                   DOCKER_HOST=NO_DOCKER, VF_RUNS_DB=str(tmp_path / "runs.db"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "swe_debug.cli", str(ds), "--backend", "kubernetes", "--registry", REGISTRY,
            "--namespace", "team", "-o", str(out), "-q", "--max-retries", "0", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 600)
        created = list(k8s.created_images)
    text = stdout.decode() + stderr.decode()
    assert proc.returncode == 0, text
    rows = {r["info"]["instance_id"]: r for r in map(json.loads, next(out.rglob("results.jsonl")).read_text().splitlines())}
    for iid, image in (("org__calc-1", by_scheme), ("org__calc-2", named)):
        v = rows[iid]["info"]["verdict"]
        assert v["valid"] and v["reason"] == "pass" and v["image"] == image and v["images_built"] == [], v
        assert not rows[iid].get("error"), rows[iid]
    assert sorted(created) == sorted([by_scheme, named])  # one pod each, of the resolved names
    assert "docker" not in text.lower(), text  # nothing even tried the engine


async def test_fake_cluster_refuses_an_image_it_does_not_hold(tmp_path):
    """The check above can fail: a name the fake's registry does not hold never runs
    (ErrImagePull: the backend's infrastructure error, not a verdict)."""
    from backends.kubernetes import KubernetesBackend
    from fakes.k8s_server import FakeKubernetes
    from sandboxes import InfraError, SandboxSpec

    tree, _ = _image_tree(tmp_path / "image")
    async with FakeKubernetes(images={f"{REGISTRY}/held:1": tree}) as k8s:
        be = KubernetesBackend(kubeconfig=str(k8s.write_kubeconfig(tmp_path / "kc")), context="fake",
                               namespace=k8s.namespace, runtime_class_name=None, poll_interval=0.05, ready_timeout=10)
        try:
            sb = await be.create(SandboxSpec(image=f"{REGISTRY}/held:1"))
            assert (await sb.exec(["git", "-C", "/testbed", "status", "--porcelain"])).ok
            await be.delete(sb.id)
            with pytest.raises(InfraError, match="ErrImagePull"):
                await be.create(SandboxSpec(image=f"{REGISTRY}/not-held:1"))
        finally:
            await be.close()


async def test_a_row_to_build_on_kubernetes_needs_push_to(tmp_path, monkeypatch):
    """On a backend that pulls images itself, a row with only a `source` cannot be run
    without building it here and pushing it: a clear row error naming both ways,
    reached without asking any engine (DOCKER_HOST points nowhere)."""
    from backends.kubernetes import KubernetesBackend
    from sandboxes import UsageError
    from swe_debug.images import ImageBuilder
    from swe_debug.instances import SWEInstance

    monkeypatch.setenv("DOCKER_HOST", NO_DOCKER)
    _, fields = _image_tree(tmp_path / "image")
    inst = SWEInstance.model_validate({"instance_id": "org__calc-3", **fields,
                                       "source": {"dir": str(tmp_path / "image" / "testbed")}})
    builder = ImageBuilder()
    be = KubernetesBackend(kubeconfig=str(tmp_path / "none"), context="fake", runtime_class_name=None)
    builder.use_backend(be)
    assert builder.remote
    with pytest.raises(UsageError, match=r"runs images by name and builds none.*--push-to"):
        await builder.ensure(inst)
    assert builder._builder is None  # no engine was even looked up
