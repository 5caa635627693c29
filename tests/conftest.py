"""Shared test fixtures.

Docker: a test marked `@pytest.mark.docker` (or using `docker_backend`,
`python_image`, `docker_sandbox`) runs against the real engine. When no engine
answers it is skipped, except with VF_REQUIRE_DOCKER=1 (CI), where it FAILS
with the reason. Call `require_docker()` yourself for the same behaviour.

    async def test_x(docker_backend, docker_spec):
        async with await docker_backend.create(docker_spec) as sb:
            ...

Every sandbox a test leaves behind is removed at teardown (the fixtures delete
what this process still tracks), and containers carry the label
`vf-sandbox.test=1` so a stray one is easy to find.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from functools import lru_cache
from pathlib import Path

import pytest

# A suite started in the background by a non-interactive shell (`make test &`, `nohup ... &`)
# inherits SIGINT ignored, and every process the tests start inherits that too: bash
# then cannot interrupt a timed-out command and Ctrl-C-like tests see no
# KeyboardInterrupt. Give the suite the disposition an interactive run has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

DEFAULT_TEST_IMAGE = "vf-sandbox/python:3.11"
TEST_LABELS = {"vf-sandbox.test": "1"}
ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def one_at_a_time(name: str):
    """An exclusive lock of this checkout named `name` (.cache/NAME.lock), held for the block.
    `make test` runs the suite on parallel workers (pytest-xdist), each with its own session
    fixtures: a fixture that fills a cache shared by every process (downloads, a dataset file)
    takes it, so the first worker fills the cache and the others wait, then find it filled."""
    lock_dir = ROOT / ".cache"
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def leftover_containers(label: dict[str, str], wait: float = 20.0) -> list[str]:
    """Ids of the containers carrying `label` (one key=value) still there after up to `wait`
    seconds (a removal at a process's exit may still be finishing in the engine)."""
    import subprocess
    import time

    (key, value), = label.items()
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={key}={value}"], capture_output=True,
                             text=True, timeout=60).stdout.split()
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def docker_required() -> bool:
    return os.environ.get("VF_REQUIRE_DOCKER") == "1"


@lru_cache(maxsize=1)
def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        from backends.docker import ping_sync
    except ImportError as exc:  # pragma: no cover - broken checkout
        return f"backends.docker cannot be imported: {exc}"
    return ping_sync()


def require_docker() -> None:
    """Skip the calling test without Docker; FAIL instead when VF_REQUIRE_DOCKER=1."""
    reason = docker_unavailable_reason()
    if reason is None:
        return
    if docker_required():
        pytest.fail(f"Docker is required (VF_REQUIRE_DOCKER=1) but {reason}", pytrace=False)
    pytest.skip(f"no Docker engine: {reason}")


def gvisor_unavailable_reason(runtime: str = "runsc") -> str | None:
    """None when the engine lists the gVisor runtime `runtime`, else why not."""
    import json
    import subprocess

    try:
        out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True,
                             timeout=30)
        runtimes = json.loads(out.stdout or "{}")
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return f"cannot read the engine's runtimes: {exc}"
    return None if runtime in runtimes else f"the engine has no {runtime!r} runtime (scripts/setup.sh registers it)"


def require_gvisor() -> None:
    """Skip without the engine's gVisor runtime; FAIL instead when VF_REQUIRE_DOCKER=1."""
    reason = gvisor_unavailable_reason()
    if reason is None:
        return
    if docker_required():
        pytest.fail(f"gVisor is required (VF_REQUIRE_DOCKER=1) but {reason}", pytrace=False)
    pytest.skip(f"no gVisor: {reason}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs pytest-xdist with --dist loadgroup: tests marked
    `@pytest.mark.xdist_group(name)` run on one worker, in file order. xdist tells its scheduler
    the group by appending `@name` to the test's node id, but writes the attribute pytest 9.2
    no longer reads (pytest-dev/pytest-xdist#1386): the groups were silently ignored. Until
    xdist sets it, this sets the node id the same way xdist does (`<nodeid>@<names>`)."""
    if not getattr(config.option, "loadgroup", False):  # set in xdist workers under --dist loadgroup
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)  # JUnit names these tests `...@name` too


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None:
        require_docker()


@pytest.fixture(scope="session")
def python_image() -> str:
    """The default Python sandbox image, built from images/ if missing (cached afterwards)."""
    require_docker()
    from backends.docker.images import ensure_image

    return ensure_image(DEFAULT_TEST_IMAGE)


@pytest.fixture
def docker_spec(python_image):
    """A small spec for tests: default image, 1 GiB, 10 min lifetime, test label."""
    from sandboxes import SandboxSpec

    return SandboxSpec(image=python_image, memory_gb=1, timeout_minutes=10, labels=dict(TEST_LABELS))


@pytest.fixture
async def docker_backend(python_image):
    """A DockerBackend; sandboxes still tracked at teardown are removed."""
    from backends.docker import DockerBackend
    from sandboxes import lifecycle

    backend = DockerBackend()
    before = set(lifecycle.live())
    yield backend
    leftovers = [i for i in lifecycle.live() if i not in before]
    if leftovers:
        await backend.delete_many(ids=leftovers)
    await backend.close()


@pytest.fixture
async def docker_sandbox(docker_backend, docker_spec):
    """One running sandbox of `docker_spec`, deleted after the test."""
    sb = await docker_backend.create(docker_spec)
    yield sb
    await sb.delete()


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory):
    """The per-user run registry of every run a test starts (in this process or a
    subprocess) goes to a session temp dir, never the real user's state directory.
    Tests that need their own registry set VF_RUNS_DB; tests of the default unset both."""
    old = os.environ.get("VF_STATE_DIR")
    os.environ["VF_STATE_DIR"] = str(tmp_path_factory.mktemp("vf-state"))
    yield
    if old is None:
        os.environ.pop("VF_STATE_DIR", None)
    else:
        os.environ["VF_STATE_DIR"] = old
