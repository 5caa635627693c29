"""The image-build capability (`SupportsImageBuild`, sandboxes/images.py) and
the three builders on it: content keys (same inputs → same tag → no second
build; a changed input → a new tag), the host's architecture in SWE image
names, a failing Dockerfile is a UsageError with the log's last lines, an
engine that does not answer is BackendUnavailable, backends without the
capability are refused by name, and nothing under envs/ or swe_debug/ runs
the docker CLI or imports a backend."""

from __future__ import annotations

import ast
import asyncio
import platform
import shutil
import uuid
from pathlib import Path

import pytest

from sandboxes.errors import BackendUnavailable, InfraError, UsageError
from sandboxes.images import (
    KEY_LABEL,
    ImageBuildFailed,
    ImageBuildRequest,
    host_arch,
    image_builder,
    normalise_arch,
)
from sandboxes.interface import SupportsImageBuild, SupportsImageRecipes

ROOT = Path(__file__).resolve().parents[1]
BASE = "vf-sandbox/base:bookworm"


# ---------------------------------------------------------------- no engine needed
def test_arch_names_from_the_host():
    assert normalise_arch("x86_64").model_dump() == {
        "machine": "x86_64", "docker": "amd64", "swebench": "x86_64", "platform": "linux/amd64"}
    assert normalise_arch("AMD64").docker == "amd64"
    arm = normalise_arch("aarch64")
    assert (arm.machine, arm.docker, arm.swebench, arm.platform) == ("aarch64", "arm64", "arm64", "linux/arm64")
    assert normalise_arch("arm64") == arm
    assert host_arch() == normalise_arch(platform.machine())
    assert ImageBuildRequest(repository="r", dockerfile="FROM x\n").platform == host_arch().platform


def test_request_key_follows_every_input(tmp_path):
    (tmp_path / "a.txt").write_text("one")
    req = ImageBuildRequest(repository="vf-test/k", dockerfile="ARG B=base:1\nFROM ${B}\nCOPY a.txt /\n",
                            context=tmp_path, files={"b": b"x"}, build_args={"X": "1"}, labels={"l": "1"})
    key = req.key(["sha256:p"])
    assert key == req.model_copy().key(["sha256:p"])  # same inputs, same key
    assert req.name(key) == f"vf-test/k:{key[:16]}"
    assert req.model_copy(update={"tag": "fixed"}).name(key) == "vf-test/k:fixed"
    changed = {
        "dockerfile": req.model_copy(update={"dockerfile": req.dockerfile + "RUN true\n"}).key(["sha256:p"]),
        "files": req.model_copy(update={"files": {"b": b"y"}}).key(["sha256:p"]),
        "args": req.model_copy(update={"build_args": {"X": "2"}}).key(["sha256:p"]),
        "labels": req.model_copy(update={"labels": {"l": "2"}}).key(["sha256:p"]),
        "platform": req.model_copy(update={"platform": "linux/arm64"}).key(["sha256:p"]),
        "parent": req.key(["sha256:q"]),
        "digest": req.model_copy(update={"context_digest": "abc"}).key(["sha256:p"]),
    }
    (tmp_path / "a.txt").write_text("two")
    changed["context"] = req.key(["sha256:p"])
    assert key not in changed.values() and len(set(changed.values())) == len(changed), changed
    assert req.parents() == ["base:1"]
    assert req.model_copy(update={"build_args": {"B": "other:2"}}).parents() == ["other:2"]
    multi = ImageBuildRequest(repository="r", dockerfile="FROM a:1 AS build\nFROM build\nFROM scratch\n")
    assert multi.parents() == ["a:1"]


def test_backends_without_the_capability_are_refused_by_name():
    from backends.kubernetes import KubernetesBackend
    from backends.local import LocalBackend
    from backends.prime import PrimeBackend

    with pytest.raises(UsageError, match="'local' backend cannot build images.*SupportsImageBuild"):
        image_builder("local")
    assert not isinstance(LocalBackend(), SupportsImageBuild)
    for cls in (KubernetesBackend, PrimeBackend):
        assert not any(hasattr(cls, m) for m in ("build_image", "find_image", "image_recipes")), cls


def test_images_cli_refuses_a_backend_without_recipes():
    from typer.testing import CliRunner

    from sandboxes.images_cli import app

    out = CliRunner().invoke(app, ["ls", "--backend", "local"])
    assert out.exit_code == 1 and "SupportsImageRecipes" in out.output


# ---------------------------------------------------------------- no docker CLI above sandboxes
_SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "create_subprocess_exec",
                     "create_subprocess_shell", "system", "_run", "getoutput", "getstatusoutput"}


def docker_cli_uses(source: str) -> list[str]:
    """Places in `source` that run the docker CLI or import a Docker SDK or a backend."""
    found = []
    tree = ast.parse(source)

    def is_docker(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
            node.value == "docker" or node.value.startswith("docker "))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0] if node.args else None
            argv0 = first.elts[0] if isinstance(first, (ast.List, ast.Tuple)) and first.elts else first
            if name in _SUBPROCESS_CALLS and argv0 is not None and is_docker(argv0):
                found.append(f"line {node.lineno}: {name}(docker ...)")
            if name == "which" and first is not None and is_docker(first):
                found.append(f"line {node.lineno}: which(docker)")
        elif isinstance(node, (ast.List, ast.Tuple)) and node.elts and is_docker(node.elts[0]):
            found.append(f"line {node.lineno}: argv starting with docker")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults
            defaults += node.args.kw_defaults
            for arg, default in zip(args, defaults):
                if default is not None and is_docker(default) and arg.arg != "backend":
                    found.append(f"line {node.lineno}: parameter {arg.arg}='docker' (a CLI path?)")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in ("docker", "aiodocker", "backends")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("docker", "aiodocker", "backends"):
                found.append(f"line {node.lineno}: from {node.module} import ...")
    return found


def test_the_checker_flags_docker_cli_uses():
    bad = {
        'import subprocess\nsubprocess.run(["docker", "build", "."])\n': "run(docker",
        'import asyncio\nasyncio.create_subprocess_exec("docker", "image", "inspect", "x")\n': "docker",
        'import shutil\nshutil.which("docker")\n': "which(docker)",
        'argv = ["docker", "build", "-t", "x", "."]\n': "argv starting with docker",
        'def f(docker: str = "docker"):\n    pass\n': "parameter docker",
        'import os\nos.system("docker build .")\n': "system(docker",
        "from backends.docker.images import ensure_image\n": "from backends.docker.images",
        "import docker\n": "import docker",
    }
    for src, what in bad.items():
        assert any(what in hit for hit in docker_cli_uses(src)), (src, docker_cli_uses(src))
    ok = 'def f(backend: str = "docker"):\n    return get_backend("docker")\nPKGS = ("websockets", "docker")\n'
    assert docker_cli_uses(ok) == []


def test_no_module_under_envs_or_swe_debug_runs_the_docker_cli():
    offenders = {}
    for pkg in ("envs", "runs", "runner", "hosted", "dashboard", "vfcli", "testmodel", "swe_debug"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            hits = docker_cli_uses(path.read_text())
            if hits:
                offenders[str(path.relative_to(ROOT))] = hits
    assert offenders == {}


# ---------------------------------------------------------------- the Docker backend's build capability
def _remove(*names: str) -> None:
    import docker

    api = docker.APIClient(version="1.41")
    try:
        for name in names:
            try:
                api.remove_image(name, force=True)
            except docker.errors.ImageNotFound:
                pass
    finally:
        api.close()


@pytest.fixture
def count_builds(monkeypatch):
    """How many times the engine was asked to build (every path goes through EngineImages._build)."""
    from backends.docker.build import EngineImages

    calls: list[str] = []
    real = EngineImages._build

    def counting(self, request, name, key, on_log):
        calls.append(name)
        return real(self, request, name, key, on_log)

    monkeypatch.setattr(EngineImages, "_build", counting)
    return calls


@pytest.mark.docker
async def test_same_inputs_same_tag_no_second_build_changed_input_new_tag(tmp_path, python_image, count_builds):
    from backends.docker import DockerBackend

    repo = f"vf-sandbox-test/build-{uuid.uuid4().hex[:8]}"
    (tmp_path / "payload.txt").write_text("one\n")
    req = ImageBuildRequest(repository=repo, context=tmp_path, labels={"vf-sandbox.test": "1"},
                            dockerfile=f"FROM {BASE}\nCOPY payload.txt /payload.txt\nRUN cat /payload.txt\n")
    backend = DockerBackend()
    assert isinstance(backend, SupportsImageBuild) and isinstance(backend, SupportsImageRecipes)
    names: list[str] = []
    try:
        assert await backend.find_image(req) is None
        logs: list[str] = []
        first = await backend.build_image(req, on_log=logs.append)
        names.append(first.name)
        assert not first.cached and first.name == f"{repo}:{first.key[:16]}" and count_builds == [first.name]
        assert any("one" in line for line in logs)  # the build log streamed to the caller
        info_arch = await asyncio.to_thread(backend._engine_images.inspect, first.name)
        assert info_arch["Architecture"] == host_arch().docker
        assert info_arch["Config"]["Labels"][KEY_LABEL] == first.key

        again = await DockerBackend().build_image(req.model_copy())  # a fresh backend: the tag is the cache
        assert again.cached and again.name == first.name and again.image_id == first.image_id
        assert (await backend.find_image(req)).image_id == first.image_id
        assert count_builds == [first.name]  # no second build

        (tmp_path / "payload.txt").write_text("two\n")
        changed = await backend.build_image(req)
        names.append(changed.name)
        assert not changed.cached and changed.name != first.name and changed.image_id != first.image_id
        assert len(count_builds) == 2

        forced = await backend.build_image(req, force=True)
        assert not forced.cached and forced.name == changed.name and len(count_builds) == 3
    finally:
        await backend.close()
        _remove(*names)


@pytest.mark.docker
async def test_fixed_tag_is_rebuilt_only_when_its_key_changes(python_image, count_builds):
    from backends.docker import DockerBackend

    repo = f"vf-sandbox-test/fixed-{uuid.uuid4().hex[:8]}"
    req = ImageBuildRequest(repository=repo, tag="v1", dockerfile=f"FROM {BASE}\nLABEL n=1\n")
    backend = DockerBackend()
    ids: list[str] = []
    try:
        first = await backend.build_image(req)
        ids.append(first.image_id)
        assert first.name == f"{repo}:v1" and not first.cached
        assert (await backend.build_image(req)).cached and len(count_builds) == 1
        second = await backend.build_image(req.model_copy(update={"dockerfile": f"FROM {BASE}\nLABEL n=2\n"}))
        assert second.name == f"{repo}:v1" and not second.cached and second.key != first.key
        assert await backend.find_image(req) is None  # the name now holds the other content
    finally:
        await backend.close()
        _remove(f"{repo}:v1", *ids)  # the first build lost its name: remove it by id


@pytest.mark.docker
async def test_failing_dockerfile_is_a_usage_error_with_the_log_tail(python_image):
    from backends.docker import DockerBackend

    repo = f"vf-sandbox-test/fail-{uuid.uuid4().hex[:8]}"
    req = ImageBuildRequest(repository=repo, dockerfile=(
        f"FROM {BASE}\nRUN echo vf-marker-before-failure && echo vf-marker-stderr >&2 && exit 3\n"))
    backend = DockerBackend()
    try:
        with pytest.raises(ImageBuildFailed) as err:
            await backend.build_image(req)
        exc = err.value
        assert isinstance(exc, UsageError) and not isinstance(exc, InfraError)
        assert repo in str(exc) and "vf-marker-before-failure" in str(exc) and "3" in exc.reason
        assert await backend.find_image(req) is None

        missing_parent = ImageBuildRequest(repository=repo, dockerfile="FROM vf-sandbox-test/no-such-parent:1\n")
        with pytest.raises(UsageError, match="no-such-parent"):
            await backend.build_image(missing_parent)
    finally:
        await backend.close()


async def test_an_engine_that_does_not_answer_is_backend_unavailable(tmp_path):
    from backends.docker import DockerBackend

    backend = DockerBackend(url=f"unix://{tmp_path}/no-engine.sock")
    req = ImageBuildRequest(repository="vf-sandbox-test/unreachable", dockerfile=f"FROM {BASE}\n")
    for call in (backend.image_id(BASE), backend.find_image(req), backend.build_image(req)):
        with pytest.raises(BackendUnavailable, match="no-engine.sock"):
            await call
    await backend.close()


# ---------------------------------------------------------------- the three builders on it
@pytest.mark.docker
async def test_swe_image_names_carry_the_host_arch_and_reuse_the_content_key(python_image, count_builds, monkeypatch):
    from swe_debug import images as swe_images
    from swe_debug.instances import EnvironmentSpec

    arch = host_arch().swebench
    assert swe_images.env_repository() == f"vf-swe/env.{arch}"
    assert swe_images.instance_repository("Org__Repo-1.0") == f"vf-swe/inst.{arch}.org__repo-1.0"
    builder = swe_images.ImageBuilder(salt=f"test-{uuid.uuid4().hex[:8]}")  # a tag of its own
    tag = ""
    try:
        tag, built = await builder.ensure_environment(EnvironmentSpec(packages=[], setup=["touch /opt/vf-test"]))
        assert built and tag.startswith(f"vf-swe/env.{arch}:") and len(count_builds) == 1
        fresh = swe_images.ImageBuilder(salt=builder.salt)
        assert await fresh.ensure_environment(EnvironmentSpec(packages=[], setup=["touch /opt/vf-test"])) == (tag, False)
        assert len(count_builds) == 1  # found by content key: no second build
        other, built = await fresh.ensure_environment(EnvironmentSpec(packages=[], setup=["touch /opt/vf-other"]))
        assert built and other != tag
        _remove(other)
    finally:
        if tag:
            _remove(tag)
    monkeypatch.setattr(swe_images, "host_arch", lambda: normalise_arch("aarch64"))
    assert swe_images.env_repository() == "vf-swe/env.arm64"


@pytest.mark.docker
@pytest.mark.xdist_group("openenv-probe")  # runs the probe: test_openenv_build.py says why
def test_openenv_project_builds_once_per_content(tmp_path, python_image, count_builds):
    from envs.openenv.build import build_project, content_hash

    src = ROOT / "environments/openenv_echo/openenv_echo/echo_env"
    proj = tmp_path / "echo"
    shutil.copytree(src, proj, ignore=shutil.ignore_patterns(".build.json", "__pycache__"))
    env_id = f"vf_test_echo_{uuid.uuid4().hex[:8]}"
    cfg = proj / "openenv.yaml"
    cfg.write_text(cfg.read_text().replace("name: echo_env", f"name: {env_id}"))
    images: list[str] = []
    try:
        first = build_project(proj)
        images.append(first.manifest.image)
        assert first.built and first.manifest.image == f"vf-openenv/{env_id}:{content_hash(proj)[:16]}"
        project_builds = [n for n in count_builds if n.startswith("vf-openenv/")]
        assert project_builds == [first.manifest.image]

        again = build_project(proj)
        assert not again.built and again.manifest.image == first.manifest.image
        assert [n for n in count_builds if n.startswith("vf-openenv/")] == project_builds

        (proj / "README.md").write_text("changed\n")
        changed = build_project(proj)
        images.append(changed.manifest.image)
        assert changed.built and changed.manifest.image != first.manifest.image
    finally:
        _remove(*images)
