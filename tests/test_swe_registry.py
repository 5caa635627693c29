"""SWE instance images through a REAL registry (Debian's registry:2 server with
htpasswd auth, started here): images built here are pushed with --push-to,
removed locally and pulled back by name; rows without an image field run the
SWE-bench-named image under --namespace; wrong credentials and a missing tag are
an infrastructure error of the row (never a verdict); the registry password never
reaches outputs or the run registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry_server import start_registry, stop_registry
from test_swe_docker import IDNA, _run, examples, instances  # noqa: F401 - fixtures shared with the SWE suite

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    stop_registry(reg)


def _auth(reg, password=None):
    from sandboxes.images import RegistryAuth

    return RegistryAuth(username=reg.username, password=password or reg.password)


def _untag(name: str) -> None:
    import docker

    client = docker.APIClient()
    try:
        client.remove_image(name)
    finally:
        client.close()


def _bare_row(inst, **update):
    """The row as a registry-only dataset publishes it: no source to build from."""
    data = inst.model_dump(exclude={"source", "environment", "image_name"})
    return {**data, **update}


async def test_built_images_are_pushed_and_pulled_back_by_name(instances, registry):
    from swe_debug.images import ImageBuilder
    from swe_debug.instances import SWEInstance
    from swe_debug.taskset import SWETaskSet

    builder = ImageBuilder(push_to=f"{registry.url}/ci", auth=_auth(registry))
    rows = await _run(instances, [], taskset=SWETaskSet([instances[IDNA]], builder=builder))
    pushed = rows[IDNA]["image_pushed"]
    assert rows[IDNA]["valid"] and pushed == f"{registry.url}/ci/{rows[IDNA]['image']}"
    _untag(pushed)  # gone locally: the next run must pull it

    row = SWEInstance.model_validate(_bare_row(instances[IDNA], instance_id="from-registry", image_name=pushed))
    rows = await _run(instances, [], taskset=SWETaskSet([row], builder=ImageBuilder(auth=_auth(registry))))
    r = rows["from-registry"]
    assert r["valid"] and r["reason"] == "pass" and r["image"] == pushed and r["images_built"] == ["pull"], r
    _untag(pushed)


async def test_swebench_names_bad_credentials_and_missing_tags(instances, registry):
    from sandboxes.images import image_builder
    from swe_debug.images import ImageBuilder, swebench_image_name
    from swe_debug.instances import SWEInstance
    from swe_debug.taskset import SWETaskSet

    ns = f"{registry.url}/swebench"
    local = (await ImageBuilder().ensure(instances[IDNA])).tag
    name = swebench_image_name(ns, IDNA)
    assert "/sweb.eval." in name and "kjd_1776_idna-3.4" in name  # the harness's Docker Hub spelling
    await image_builder("docker").push_image(local, name, _auth(registry))
    _untag(name)

    named = SWEInstance.model_validate(_bare_row(instances[IDNA]), context={"named_images": True})
    missing = SWEInstance.model_validate(_bare_row(instances[IDNA], instance_id="org__missing-1"),
                                         context={"named_images": True})
    rows = await _run(instances, [], taskset=SWETaskSet([named, missing], builder=ImageBuilder(
        namespace=ns, auth=_auth(registry))), max_retries=0)
    assert rows[IDNA]["valid"] and rows[IDNA]["image"] == name and rows[IDNA]["images_built"] == ["pull"]
    gone = rows["org__missing-1"]
    assert gone["error_type"] == "ImagePullFailed" and "cannot be pulled" in gone["error"]
    assert "not found" in gone["error"] or "unknown" in gone["error"]
    _untag(name)

    wrong = await _run(instances, [], taskset=SWETaskSet([named], builder=ImageBuilder(
        namespace=ns, auth=_auth(registry, "not-the-password"))), max_retries=0)
    err = wrong[IDNA]
    assert err["error_type"] == "ImagePullFailed" and "unauthorized" in err["error"].lower(), err
    assert "not-the-password" not in json.dumps(err)


def test_cli_namespace_run_keeps_the_password_out_of_everything(instances, registry, tmp_path):
    """vf-swe-debug --namespace over a dataset with no image fields: credentials from
    VF_REGISTRY_*; the distinctive password is in no output file and not in the registry db."""
    from sandboxes.images import run_sync, image_builder
    from swe_debug.images import ImageBuilder, swebench_image_name

    ns = f"{registry.url}/cli"
    name = swebench_image_name(ns, IDNA)
    local = run_sync(lambda: ImageBuilder().ensure(instances[IDNA])).tag
    run_sync(lambda: image_builder("docker").push_image(local, name, _auth(registry)))
    _untag(name)
    ds = tmp_path / "published.jsonl"
    ds.write_text(json.dumps(_bare_row(instances[IDNA])) + "\n")
    out, db = tmp_path / "out", tmp_path / "runs.db"
    env = {**os.environ, "VF_RUNS_DB": str(db), "VF_REGISTRY_USERNAME": registry.username,
           "VF_REGISTRY_PASSWORD": registry.password}
    res = subprocess.run([sys.executable, "-m", "swe_debug.cli", str(ds), "--namespace", ns, "-o", str(out), "-q"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert registry.password not in res.stdout + res.stderr
    files = [p for p in [*out.rglob("*"), db] if p.is_file()]
    assert any(p.name == "results.jsonl" for p in files)
    for p in files:
        assert registry.password.encode() not in p.read_bytes(), p
    _untag(name)


def test_registry_option_names_the_host_of_swebench_images(instances, registry, tmp_path):
    """vf-swe-debug --registry HOST --namespace NS runs HOST/NS/sweb.eval.<arch>.<id> (pulled from
    the real registry); --registry alone means the harness's namespace `swebench`; a namespace that
    already names a host beside --registry is bad usage (exit 2, before anything runs)."""
    from sandboxes.images import image_builder, run_sync
    from swe_debug.images import ImageBuilder, image_namespace, swebench_image_name

    assert image_namespace(registry.url, None) == f"{registry.url}/swebench"
    assert image_namespace(None, "xingyaoww") == "xingyaoww"
    assert ImageBuilder(registry=registry.url, namespace="team").namespace == f"{registry.url}/team"
    name = swebench_image_name(f"{registry.url}/team", IDNA)
    local = run_sync(lambda: ImageBuilder().ensure(instances[IDNA])).tag
    run_sync(lambda: image_builder("docker").push_image(local, name, _auth(registry)))
    _untag(name)
    ds = tmp_path / "published.jsonl"
    ds.write_text(json.dumps(_bare_row(instances[IDNA])) + "\n")
    env = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db"), "VF_REGISTRY_USERNAME": registry.username,
           "VF_REGISTRY_PASSWORD": registry.password}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "swe_debug.cli", str(ds), *args, "-q"], capture_output=True,
                              text=True, cwd=ROOT, env=env, timeout=600)

    bad = cli("--registry", registry.url, "--namespace", f"{registry.url}/team", "-o", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "already names a registry host" in bad.stderr, bad.stdout + bad.stderr
    res = cli("--registry", registry.url, "--namespace", "team", "-o", str(tmp_path / "out"))
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        (row,) = [json.loads(x) for x in next((tmp_path / "out").rglob("results.jsonl")).read_text().splitlines()]
        v = row["info"]["verdict"]
        assert v["valid"] and v["image"] == name and v["images_built"] == ["pull"], v
    finally:
        _untag(name)


async def test_a_row_built_here_runs_on_kubernetes_under_its_pushed_name(instances, registry, tmp_path):
    """--backend kubernetes --push-to REG over a row that only has a `source`: the instance
    image is built on this engine, pushed to the real registry, and the cluster is asked
    for the pushed name (the Kubernetes fake runs no image: its pod gets a stand-in
    filesystem, so the verdict is not the point; the pod's image and the registry's copy are)."""
    from backends.kubernetes import KubernetesBackend
    from fakes.k8s_server import FakeKubernetes
    from sandboxes.images import image_builder
    from swe_debug.images import ImageBuilder
    from swe_debug.taskset import SWETaskSet

    local = (await ImageBuilder().ensure(instances[IDNA])).tag
    pushed = f"{registry.url}/k8s/{local}"
    stand_in = tmp_path / "fs"
    (stand_in / "testbed").mkdir(parents=True)
    async with FakeKubernetes(images={pushed: stand_in}) as k8s:
        be = KubernetesBackend(kubeconfig=str(k8s.write_kubeconfig(tmp_path / "kc")), context="fake",
                               namespace=k8s.namespace, runtime_class_name=None, poll_interval=0.05)
        rows = await _run(instances, [], backend=be, max_retries=0, taskset=SWETaskSet(
            [instances[IDNA]], builder=ImageBuilder(push_to=f"{registry.url}/k8s", auth=_auth(registry))))
        created = list(k8s.created_images)
    r = rows[IDNA]
    assert created == [pushed] and r["image"] == pushed and r["image_pushed"] == pushed, (created, r)
    assert r["reason"] == "setup_failed"  # the stand-in has no git tree: the fake cannot run the real image
    _untag(pushed)
    docker = image_builder("docker")
    assert await docker.image_id(pushed) is None
    await docker.pull_image(pushed, _auth(registry))  # the registry really holds it
    _untag(pushed)


async def test_keep_images_removes_only_what_the_run_pulled_least_recent_first(instances, registry):
    """--keep-images 1 over two instances pulled from the registry: the first pulled image
    goes after its rollout, the last stays, and the local build both came from (an image
    the run did not make) is never touched."""
    from sandboxes.images import image_builder
    from swe_debug.images import ImageBuilder, swebench_image_name
    from swe_debug.instances import SWEInstance
    from swe_debug.taskset import SWETaskSet

    ns = f"{registry.url}/keep"
    builder = image_builder("docker")
    local = (await ImageBuilder().ensure(instances[IDNA])).tag
    ids = ["org__first-1", "org__second-1"]
    names = [swebench_image_name(ns, i) for i in ids]
    for name in names:
        await builder.push_image(local, name, _auth(registry))
        _untag(name)
    rows_in = [SWEInstance.model_validate(_bare_row(instances[IDNA], instance_id=i), context={"named_images": True})
               for i in ids]
    rows = await _run(instances, [], taskset=SWETaskSet(rows_in, builder=ImageBuilder(
        namespace=ns, auth=_auth(registry), keep_images=1)), concurrency=1)
    assert all(rows[i]["valid"] and rows[i]["images_built"] == ["pull"] for i in ids), rows
    assert await builder.image_id(names[0]) is None  # pulled by the run, least recently used: removed
    assert await builder.image_id(names[1]) is not None  # within keep_images
    assert await builder.image_id(local) is not None  # not the run's: never removed
    _untag(names[1])


async def test_pull_progress_reaches_the_display(instances, registry):
    """Pulling an image whose layer is not local reports its bytes as they come (the
    engine's per-layer messages summed), ends with one `finished` report, and
    vf-swe-debug's display shows a bar per pull and a line when it is done."""
    import io
    import uuid

    import docker
    from rich.console import Console

    from sandboxes.images import image_builder
    from swe_debug.cli import SWEDisplay
    from swe_debug.images import ImageBuilder, add_pull_listener, remove_pull_listener
    from swe_debug.instances import SWEInstance

    local = (await ImageBuilder().ensure(instances[IDNA])).tag
    client = docker.from_env()
    tag = uuid.uuid4().hex[:12]
    c = client.containers.run(local, ["bash", "-c", "head -c 16000000 /dev/urandom > /blob"], detach=True,
                              network_disabled=True)
    try:
        assert c.wait()["StatusCode"] == 0
        c.commit(repository="vf-swe-test/pull-progress", tag=tag)
    finally:
        c.remove(force=True)
    name = f"{registry.url}/progress/blob:{tag}"
    await image_builder("docker").push_image(f"vf-swe-test/pull-progress:{tag}", name, _auth(registry))
    for n in (name, f"vf-swe-test/pull-progress:{tag}"):  # the image and its own layer leave this host
        client.images.remove(n)
    events: list = []
    listen = events.append
    add_pull_listener(listen)
    out = io.StringIO()
    inst = SWEInstance.model_validate(_bare_row(instances[IDNA], instance_id="org__progress-1", image_name=name))
    try:
        with SWEDisplay(Console(file=out, width=200)):
            ref = await ImageBuilder(auth=_auth(registry)).ensure(inst)
    finally:
        remove_pull_listener(listen)
        client.images.remove(name)
        client.close()
    assert ref.built == ["pull"] and ref.tag == name
    final = events[-1]
    assert final["finished"] and final["image"] == name and final["done"] == final["total"] >= 16_000_000, final
    assert [e for e in events if e["finished"]] == [final]
    assert any(0 < e["done"] < e["total"] for e in events[:-1]), events  # seen while downloading
    assert all(a["done"] <= b["done"] for a, b in zip(events, events[1:]))
    assert f"pulled {name} ({final['total'] / 1e6:.1f} MB)" in out.getvalue()
    assert not final["failed"]
    # a pull that fails (no such tag) ends with one failed report; the display says so
    from swe_debug.images import ImagePullFailed

    events.clear()
    add_pull_listener(listen)
    missing = f"{registry.url}/progress/blob:no-such-tag"
    try:
        with SWEDisplay(Console(file=out, width=200)), pytest.raises(ImagePullFailed):
            await ImageBuilder(auth=_auth(registry)).ensure(inst.model_copy(update={"image_name": missing}))
    finally:
        remove_pull_listener(listen)
    assert [e for e in events if e["finished"]] == [events[-1]] and events[-1]["failed"], events
    assert f"pull of {missing} failed" in out.getvalue()
