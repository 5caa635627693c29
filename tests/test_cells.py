"""rollout_isolation="namespace": a cell must be as fresh and as isolated from other
rollouts as a new container. Each test runs on the real Docker engine under runc
and under gVisor; the conformance suite (docker-cells, docker-gvisor-cells) covers
the rest of the Sandbox contract.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from conftest import DEFAULT_TEST_IMAGE, TEST_LABELS, require_docker, require_gvisor
from sandboxes import ConfigError, InfraError, SandboxSpec

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", "gvisor"]


@pytest.fixture(params=RUNTIMES)
async def backend(request):
    require_docker()
    if request.param == "gvisor":
        require_gvisor()
    from backends.docker import DockerBackend
    from backends.docker.images import ensure_image

    await asyncio.to_thread(ensure_image, DEFAULT_TEST_IMAGE)
    be = DockerBackend()
    be.test_isolation = request.param
    try:
        yield be
    finally:
        await be.close()


def cell_spec(backend, **kw) -> SandboxSpec:
    base = dict(image=DEFAULT_TEST_IMAGE, labels=dict(TEST_LABELS), rollout_isolation="namespace",
                isolation=backend.test_isolation, memory_gb=0.5, timeout_minutes=10, pids_limit=128)
    return SandboxSpec(**{**base, **kw})


def host_of(backend):
    (hosts,) = backend.cells._hosts.values()
    assert len(hosts) == 1
    return hosts[0].sandbox


async def test_files_are_private_and_gone_after_the_cell(backend):
    spec = cell_spec(backend)
    a, b = await asyncio.gather(backend.create(spec), backend.create(spec))
    marks = ["/tmp/mark", "/root/mark", "/dev/shm/mark", "/etc/mark", "/usr/local/mark"]
    r = await a.exec(" && ".join(f"echo a > {m}" for m in marks))
    assert r.ok, r
    assert (await a.exec("cat " + " ".join(marks))).stdout == "a\n" * len(marks)
    for m in marks:
        assert not (await b.exec(f"test -e {m}")).ok, m
    await a.delete()
    c = await backend.create(spec)
    for m in marks:
        assert not (await c.exec(f"test -e {m}")).ok, m
    host = host_of(backend)
    for m in marks:  # nor did a write reach the host container's own filesystem
        assert not (await host.exec(f"test -e {m}")).ok, m
    await b.delete()
    await c.delete()


async def test_processes_environment_and_network_are_private(backend):
    spec = cell_spec(backend, environment_vars={"SHARED": "spec"})
    a, b = await asyncio.gather(backend.create(spec), backend.create(spec))
    proc = await a.start_process("exec sleep 4242", env={"ROLLOUT_SECRET": "s3cr3t-a"})
    await a.exec("sleep 4243 >/dev/null 2>&1 &")
    server = await a.start_process(["python3", "-c", (
        "import socket,time\ns=socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen(); print('up', flush=True)\n"
        "while True: c,_=s.accept(); c.sendall(b'from-a'); c.close()")])
    out, _ = await server.read_output(until="up", timeout=20)
    assert "up" in out
    connect = ("python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', 8765), 2); "
               "print(s.recv(10).decode())\"")
    assert (await a.exec(connect)).stdout.strip() == "from-a"  # loopback works inside a cell
    rb = await b.exec(connect)
    assert not rb.ok and "from-a" not in rb.stdout
    ps = await b.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert "4242" not in ps.stdout and "4243" not in ps.stdout and "8765" not in ps.stdout
    assert (await b.exec("ls -d /proc/[0-9]* | wc -l")).stdout.strip() != ""
    env_b = await b.exec("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert "s3cr3t-a" not in env_b.stdout
    assert "SHARED=spec" in env_b.stdout
    ra = await a.exec("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert "ROLLOUT_SECRET=s3cr3t-a" in ra.stdout  # the probe itself can see what it should
    assert (await a.exec("hostname")).stdout.strip() != (await b.exec("hostname")).stdout.strip()
    await proc.kill()
    await a.delete()
    await b.delete()


async def test_leftovers_die_with_the_cell_even_when_it_is_killed(backend):
    spec = cell_spec(backend)
    a = await backend.create(spec)
    await a.exec("nohup sleep 4244 >/dev/null 2>&1 & setsid sleep 4245 >/dev/null 2>&1 &")
    host = host_of(backend)
    assert "4244" in (await host.exec("ps -eo args")).stdout
    assert a.init_pid
    if backend.test_isolation == "runc":
        # the cell's own code cannot kill its agent (the kernel protects a PID namespace's init)...
        await a.exec("kill -9 1; kill -9 1")
        assert (await a.exec("echo alive")).stdout.strip() == "alive"
        # ...but when the cell is killed from outside (an OOM kill, an operator), everything in it dies
        await host.exec(f"kill -9 {a.init_pid}")
    else:  # gVisor lets a cell kill its own PID 1: the cell ends, which must take everything with it
        with pytest.raises(InfraError):
            await asyncio.wait_for(a.exec("kill -9 1; sleep 5"), 30)
    with pytest.raises(InfraError):
        await asyncio.wait_for(a.exec("true"), 30)
    for _ in range(100):
        if "4244" not in (await host.exec("ps -eo args")).stdout:
            break
        await asyncio.sleep(0.1)
    left = (await host.exec("ps -eo args")).stdout
    assert "4244" not in left and "4245" not in left
    await a.delete()  # idempotent on a dead cell
    # a deleted cell leaves no process and no cgroup behind either
    b = await backend.create(spec)
    await b.exec("sleep 4246 >/dev/null 2>&1 &")
    await b.delete()
    left = (await host.exec("ps -eo args")).stdout
    assert "4246" not in left
    for _ in range(50):  # the zygote frees a cell killed from inside when it notices (within a second)
        stages = (await host.exec("ls -A /run/.vf-cells")).stdout.split()
        if not stages:
            break
        await asyncio.sleep(0.1)
    assert stages == []  # no mount point left behind, neither of the killed cell nor of the deleted one
    if backend.test_isolation == "runc":  # gVisor's cgroupfs is mounted only in the agent's namespace
        cgroups = (await host.exec("ls /sys/fs/cgroup/pids /sys/fs/cgroup/memory")).stdout
        assert "vf-cell-" not in cgroups


async def test_a_cell_dies_at_its_lifetime(backend):
    a = await backend.create(cell_spec(backend, timeout_minutes=1 / 60))  # one second
    await a.exec("sleep 4247 >/dev/null 2>&1 &")
    await asyncio.sleep(2.5)
    with pytest.raises(InfraError):
        await asyncio.wait_for(a.exec("true"), 30)
    assert "4247" not in (await host_of(backend).exec("ps -eo args")).stdout


@pytest.mark.serial  # a sibling's commands must answer during the bomb: run alone, not beside parallel workers
async def test_fork_bomb_and_memory_hog_stay_within_their_cell(backend, request):
    if backend.test_isolation == "gvisor":
        # gVisor enforces a cell's pids cgroup but only accounts its memory cgroup: the bomb's
        # and the hog's memory reaches the host container's limit, whose OOM kill ends every
        # cell of that host (InfraError), or, where the host has room for it (16 cells' memory),
        # the hog gets its 1 GiB (AssertionError; seen under -n 2). Strict: this test starts
        # failing the day gVisor enforces it.
        request.applymarker(pytest.mark.xfail(strict=True, raises=(InfraError, AssertionError),
                                              reason="gVisor does not enforce memory cgroup limits"))
    spec = cell_spec(backend, pids_limit=64, memory_gb=0.25)
    a, b = await asyncio.gather(backend.create(spec), backend.create(spec))
    running: list[asyncio.Future] = []
    try:
        bomb = asyncio.ensure_future(a.exec(
            "python3 -c \"import os,time\nwhile True:\n  try: os.fork()\n  except OSError: time.sleep(0.01)\"",
            timeout=6))
        running.append(bomb)
        await asyncio.sleep(2)
        # while A is at its pids limit, B still starts processes and threads freely
        r = await b.exec("for i in $(seq 1 40); do sh -c true || exit 1; done; echo fine")
        assert r.ok and r.stdout.strip() == "fine", r
        pids_a = (await bomb)
        assert pids_a.timed_out
        # A's memory hog is killed inside A; B, at the same time, allocates what it may
        hog = asyncio.ensure_future(a.exec("python3 -c \"x = bytearray(1024**3); print(len(x))\"", timeout=60))
        running.append(hog)
        rb = await b.exec("python3 -c \"x = bytearray(100 * 1024**2); print('ok', len(x))\"", timeout=60)
        assert rb.ok and rb.stdout.startswith("ok"), rb
        ra = await hog
        assert not ra.ok and "1073741824" not in ra.stdout, ra
        assert (await a.exec("echo still-here")).stdout.strip() == "still-here"
    finally:  # under gVisor (xfail) the host dies mid-way: the pending execs' errors are taken here, not
        # left to "Task exception was never retrieved" at the end of the session
        await asyncio.gather(*running, return_exceptions=True)
    await a.delete()
    await b.delete()


def status_fields(text: str) -> dict[str, str]:
    keep = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
    return {k: v.strip() for k, v in re.findall(r"^(\w+):\s*(.*)$", text, re.M) if k in keep}


async def test_capabilities_and_no_new_privileges_equal_a_containers(backend):
    cell = await backend.create(cell_spec(backend))
    container = await backend.create(cell_spec(backend, rollout_isolation="container"))
    got = status_fields((await cell.exec("cat /proc/self/status")).stdout)
    want = status_fields((await container.exec("cat /proc/self/status")).stdout)
    # a cell always has our seccomp filter; a container has Docker's under runc, none under gVisor
    assert got.pop("Seccomp") == "2" and want.pop("Seccomp") in ("0", "2")
    assert got == want and got["CapEff"] == "0000000000000000" and got["CapBnd"] == "0000000000000000", (got, want)
    # no way back to privilege: new namespaces, mounts and chroot are refused in a cell (and in
    # a runc container by Docker's seccomp profile; gVisor lets a container nest namespaces in it)
    for probe in ("unshare -U true", "unshare -m true", "mount -t tmpfs none /mnt", "chroot / true"):
        assert not (await cell.exec(probe)).ok, ("cell", probe)
        if backend.test_isolation == "runc":
            assert not (await container.exec(probe)).ok, ("container", probe)
    await cell.delete()
    await container.delete()


async def test_the_cell_runs_as_the_specs_user(backend):
    cell = await backend.create(cell_spec(backend, user="nobody", workdir="/tmp/work"))
    r = await cell.exec("id -un; pwd; echo $HOME; touch /root/x")
    lines = r.stdout.splitlines()
    assert lines[:2] == ["nobody", "/tmp/work"], r
    assert "Permission denied" in r.stderr
    # the overlay changes its upper layer with the mounter's credentials: chmod of the user's own file works
    await cell.write_file("/tmp/mine.sh", "echo mine\n", mode=0o755)
    assert (await cell.exec("/tmp/mine.sh")).stdout == "mine\n"  # its mode was set
    await cell.delete()


async def test_what_a_cell_cannot_give_is_refused():
    from backends.docker import DockerBackend

    be = DockerBackend(url="unix:///tmp/vf-no-engine-needed.sock")  # refused before any engine call
    for spec, what in ((SandboxSpec(rollout_isolation="namespace", network=True), "network=True"),
                       (SandboxSpec(rollout_isolation="namespace", gpu_count=1), "gpu_count")):
        with pytest.raises(ConfigError, match=what):
            await be.create(spec)
    await be.close()


async def test_other_backends_refuse_namespace_mode():
    from backends.local import LocalBackend

    be = LocalBackend()
    with pytest.raises(ConfigError, match="rollout_isolation='namespace'"):
        await be.create(SandboxSpec(rollout_isolation="namespace"))
    await be.close()
