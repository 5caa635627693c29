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

        client = docker.APIClient(version="1.41")
        for _ in range(2):
            try:
                client.remove_image(tag, force=True)
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
        docker.APIClient(version="1.41").remove_image(tag, force=True)


def test_images_cli_ls():
    from typer.testing import CliRunner

    from backends.docker.images_cli import app

    out = CliRunner().invoke(app, ["ls"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("vf-sandbox/python:3.11"))
    assert "python:3.11-slim" in line and line.split()[1] in ("ok", "stale", "missing")
