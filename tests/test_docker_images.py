"""Image recipes: alias lookup, the content-hashed build cache (an unchanged
recipe is a cache hit in well under seconds, a changed one rebuilds), builds
run offline, and the `vf-sandbox images` CLI."""

from __future__ import annotations

import time
import uuid

import pytest

from backends.docker.images import HASH_LABEL, ImageBuilder, find_recipe, load_recipes, missing_image_message

pytestmark = pytest.mark.docker


def test_recipes_index_and_aliases():
    names = {r.name for r in load_recipes()}
    assert {"vf-sandbox/base:bookworm", "vf-sandbox/python:3.11"} <= names
    assert find_recipe("python:3.11-slim").name == "vf-sandbox/python:3.11"
    assert find_recipe("vf-sandbox/python:3.11").dir == "python"
    assert find_recipe("nope:1") is None
    msg = missing_image_message("nope:1")
    assert "docker load" in msg and "vf-sandbox images build" in msg


def test_build_cache_hit_and_rebuild_on_change(tmp_path, python_image):
    tag = f"vf-sandbox-test/recipe-{uuid.uuid4().hex[:8]}:1"
    (tmp_path / "tiny").mkdir()
    dockerfile = tmp_path / "tiny" / "Dockerfile"
    dockerfile.write_text("FROM vf-sandbox/base:bookworm\nRUN echo one > /marker\n")
    (tmp_path / "recipes.toml").write_text(f'[[image]]\nname = "{tag}"\ndir = "tiny"\naliases = ["tiny:latest"]\n')
    builder = ImageBuilder(root=tmp_path)
    try:
        first = builder.ensure("tiny:latest")
        assert not first.cached and first.name == tag
        t0 = time.monotonic()
        again = builder.ensure(tag)
        assert again.cached and again.image_id == first.image_id
        assert time.monotonic() - t0 < 2.0
        assert builder.status(find_recipe(tag, tmp_path)) == "ok"
        dockerfile.write_text("FROM vf-sandbox/base:bookworm\nRUN echo two > /marker\n")
        assert builder.status(find_recipe(tag, tmp_path)) == "stale"
        changed = builder.ensure(tag)
        assert not changed.cached and changed.image_id != first.image_id
        labels = builder.image(tag)["Config"]["Labels"]
        assert labels[HASH_LABEL] and labels["vf-sandbox.recipe"] == tag
    finally:
        import docker

        client = docker.from_env(version="1.41").api
        # the tag, then the first build (untagged by the rebuild, so only its id names it)
        first_id = first.image_id if "first" in locals() else None
        for name in (tag, first_id) if first_id else (tag,):
            try:
                client.remove_image(name, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_build_runs_without_network(tmp_path, python_image):
    tag = f"vf-sandbox-test/netcheck-{uuid.uuid4().hex[:8]}:1"
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "Dockerfile").write_text(
        "FROM vf-sandbox/base:bookworm\nRUN ls /sys/class/net > /nets\n")
    (tmp_path / "recipes.toml").write_text(f'[[image]]\nname = "{tag}"\ndir = "net"\n')
    builder = ImageBuilder(root=tmp_path)
    import docker

    try:
        builder.ensure(tag)
        out = docker.from_env().containers.run(tag, ["cat", "/nets"], remove=True, network_mode="none")
        assert out.decode().split() == ["lo"]
    finally:
        docker.from_env(version="1.41").api.remove_image(tag, force=True)


def test_images_cli_ls():
    from typer.testing import CliRunner

    from sandboxes.images_cli import app

    out = CliRunner().invoke(app, ["ls"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("vf-sandbox/python:3.11"))
    assert "python:3.11-slim" in line and line.split()[1] in ("ok", "stale", "missing")


async def test_derive_image_builds_once_then_cache_hit_and_bad_package_is_clear(python_image):
    """`DockerBackend.derive_image` (the SupportsDerivedImages capability): a
    fresh base + package builds offline once; asking again is a tag lookup; an
    unknown package is an ImageNotFound (UsageError) naming it."""
    import docker

    from backends.docker import DockerBackend
    from backends.local import LocalBackend
    from sandboxes.errors import ImageNotFound, InfraError, UsageError
    from sandboxes.interface import SupportsDerivedImages

    api = docker.from_env(version="1.41").api
    base = f"vf-sandbox-test/derive-base-{uuid.uuid4().hex[:8]}:1"  # a new image id: the first derive must build
    for chunk in api.build(fileobj=__import__("io").BytesIO(f"FROM {python_image}\nLABEL t={base}\n".encode()),
                           tag=base, rm=True, decode=True, network_mode="none"):
        assert "error" not in chunk, chunk
    backend = DockerBackend()
    assert isinstance(backend, SupportsDerivedImages)
    assert getattr(LocalBackend(), "derive_image", None) is None
    tag = ""
    try:
        t0 = time.monotonic()
        tag = await backend.derive_image(base, ["six", "six"])
        built_in = time.monotonic() - t0
        assert tag.startswith("vf-sandbox/python-env:")
        info = api.inspect_image(tag)
        assert info["Config"]["Labels"]["vf-sandbox.python-env"] == "six"
        out = docker.from_env().containers.run(tag, ["python3", "-c", "import six; print(six.__name__)"],
                                               remove=True, network_mode="none", labels={"vf-sandbox.test": "1"})
        assert out.decode().strip() == "six"

        fresh = DockerBackend()  # no in-process memo: the hit is the content-hash tag
        t0 = time.monotonic()
        again = await fresh.derive_image(base, ["six"])
        hit_in = time.monotonic() - t0
        await fresh.close()
        assert again == tag and api.inspect_image(again)["Id"] == info["Id"]
        assert hit_in < 1.0 and hit_in < built_in / 3, (hit_in, built_in)

        with pytest.raises(ImageNotFound) as bad:
            await backend.derive_image(base, ["six", "vf-sandbox-no-such-package-xyz"])
        assert "vf-sandbox-no-such-package-xyz" in str(bad.value)
        assert isinstance(bad.value, UsageError) and not isinstance(bad.value, InfraError)

        with pytest.raises(ImageNotFound):
            await backend.derive_image("vf-sandbox-test/no-such-base:1", ["six"])
    finally:
        await backend.close()
        for name in (tag, base):
            if name:
                try:
                    api.remove_image(name, force=True)
                except docker.errors.ImageNotFound:
                    pass
