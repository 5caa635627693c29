"""DockerBackend on the real engine: exec semantics, timeouts, bounded output,
files, limits and isolation checked from inside the container, lifetime,
idempotent creation, failures typed as InfraError, the no-python fallback."""

from __future__ import annotations

import asyncio
import io
import os
import time
import tracemalloc
import uuid

import aiodocker
import pytest

from sandboxes import (
    AgentError,
    ConfigError,
    ImageNotFound,
    InfraError,
    PathError,
    RetryPolicy,
    SandboxSpec,
    get_backend,
)

pytestmark = pytest.mark.docker


async def container_exists(backend, cid: str) -> bool:
    docker = await backend._client()
    try:
        await docker.containers.get(cid)
        return True
    except aiodocker.DockerError as exc:
        assert exc.status == 404
        return False


async def test_registry_gives_docker_backend(docker_backend):
    be = get_backend("docker")
    assert type(be).__name__ == "DockerBackend" and be.name == "docker"
    await be.close()


async def test_exec_results_stdin_env_cwd(docker_backend, docker_spec):
    spec = docker_spec.model_copy(update={"environment_vars": {"SPEC_VAR": "from-spec"}, "workdir": "/tmp"})
    async with await docker_backend.create(spec) as sb:
        r = await sb.exec("echo out; echo err >&2; exit 7")
        assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 7, False)
        r = await sb.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"])
        assert r.ok and r.stdout == "['a b', 'c']\n"
        r = await sb.exec("cat | wc -c", stdin=b"x" * 100_000)
        assert r.stdout.strip() == "100000"
        r = await sb.exec("echo $SPEC_VAR $MINE; pwd", env={"MINE": "mine"})
        assert r.stdout == "from-spec mine\n/tmp\n"
        r = await sb.exec("pwd", cwd="/usr")
        assert r.stdout == "/usr\n"
        r = await sb.exec("printf '\\377\\000ok\\n'; head -c 64 /dev/urandom")
        assert r.ok and "ok" in r.stdout
        assert (await sb.exec("which python python3 pip pytest")).ok


async def test_timeout_kills_group_sandbox_usable(docker_sandbox):
    sb = docker_sandbox
    t0 = time.monotonic()
    r = await sb.exec("sleep 300 & sleep 301 & sleep 302", timeout=1)
    assert r.timed_out and r.exit_code is None and r.signal == 9
    assert time.monotonic() - t0 < 5
    ps = await sb.exec("ps -eo pid,pgid,stat,args")
    assert "sleep 30" not in ps.stdout, ps.stdout
    r = await sb.exec("echo alive")
    assert r.ok and r.stdout == "alive\n"


async def test_five_mib_output_capped_head_tail(docker_sandbox):
    total = 5 * 1024 * 1024
    limit = 1024 * 1024
    code = f"import sys; sys.stdout.write('A'*1000 + 'm'*({total}-2000) + 'Z'*1000); sys.stderr.write('e'*{total})"
    r = await docker_sandbox.exec(["python3", "-c", code])
    assert r.ok and r.truncated
    assert r.stdout_dropped_bytes == total - limit and r.stderr_dropped_bytes == total - limit
    assert r.stdout.startswith("A" * 1000) and r.stdout.endswith("Z" * 1000)
    kept = r.stdout.replace(f"\n[... {total - limit} bytes dropped ...]\n", "")
    assert len(kept) == limit


async def test_host_memory_bounded_for_huge_output(docker_sandbox):
    await docker_sandbox.exec("true")
    tracemalloc.start()
    try:
        r = await docker_sandbox.exec("head -c 50000000 /dev/zero | tr '\\0' x", timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ok and r.stdout_dropped_bytes == 50_000_000 - 1024 * 1024
    assert peak < 12 * 1024 * 1024, f"host peak {peak} bytes for 50 MB of output"


async def test_exec_stream(docker_sandbox):
    items = [x async for x in docker_sandbox.exec_stream("for i in 1 2 3; do echo $i; sleep 0.1; done")]
    assert [c.text for c in items[:-1]] == ["1\n", "2\n", "3\n"]
    assert items[-1].ok and items[-1].stdout == "1\n2\n3\n"


async def test_background_process(docker_sandbox):
    p = await docker_sandbox.start_process(["python3", "-u", "-c", "print('ready'); import sys; print(sys.stdin.readline().upper())"])
    out, _ = await p.read_output(until="ready", timeout=10)
    assert out == "ready"
    await p.write_stdin("hello\n")
    st = await p.wait(10)
    assert st.exit_code == 0
    out, _ = await p.read_output()
    assert out == "\nHELLO\n\n"


async def test_files_and_directories_round_trip(docker_sandbox, tmp_path):
    sb = docker_sandbox
    await sb.write_file("/work/deep/file.bin", bytes(range(256)) * 10, mode=0o700)
    assert await sb.read_file("/work/deep/file.bin") == bytes(range(256)) * 10
    assert (await sb.exec("stat -c %a /work/deep/file.bin")).stdout.strip() == "700"
    with pytest.raises(PathError):
        await sb.read_file("/no/such/file")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg/tool.sh").write_text("#!/bin/sh\necho tool\n")
    (src / "pkg/tool.sh").chmod(0o755)
    (src / "secret").write_text("s")
    (src / "secret").chmod(0o600)
    (src / "tool").symlink_to("pkg/tool.sh")
    await sb.upload(src, "/up")
    r = await sb.exec("/up/tool && stat -c '%a %N' /up/secret /up/tool")
    assert r.stdout.splitlines() == ["tool", "600 '/up/secret'", "777 '/up/tool' -> 'pkg/tool.sh'"]
    back = tmp_path / "back"
    await sb.download("/up", back)
    assert (back / "pkg/tool.sh").stat().st_mode & 0o777 == 0o755
    assert (back / "secret").stat().st_mode & 0o777 == 0o600
    assert os.readlink(back / "tool") == "pkg/tool.sh"


async def test_download_refuses_traversal(docker_sandbox, tmp_path):
    sb = docker_sandbox
    await sb.exec("mkdir -p /evil && ln -s /etc/shadow /evil/shadow && ln -s ../../../../tmp /evil/up")
    with pytest.raises(PathError):
        await sb.download("/evil", tmp_path / "out")
    assert not (tmp_path / "out" / "up").exists()


async def test_spec_limits_applied_inside(docker_backend, docker_spec):
    spec = docker_spec.model_copy(update={"memory_gb": 0.25, "cpu_cores": 0.5, "pids_limit": 64})
    async with await docker_backend.create(spec) as sb:
        script = r"""
import os
def read(*paths):
    for p in paths:
        try:
            return open(p).read().strip()
        except OSError:
            pass
    return "missing"
print("mem", read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"))
print("swap", read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes", "/sys/fs/cgroup/memory.swap.max"))
print("pids", read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"))
q = read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); p = read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
print("cpu", q + "/" + p if q != "missing" else read("/sys/fs/cgroup/cpu.max").replace(" ", "/"))
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print("capeff", status["CapEff"].strip()); print("capbnd", status["CapBnd"].strip())
print("nnp", status["NoNewPrivs"].strip())
print("net", ",".join(sorted(os.listdir("/sys/class/net"))))
"""
        r = await sb.exec(["python3", "-c", script])
        got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert int(got["mem"]) == 256 * 1024 * 1024
        assert got["swap"] in (str(256 * 1024 * 1024), "0", "missing")  # swap = memory (v1) / 0 (v2)
        assert got["pids"] == "64"
        quota, period = got["cpu"].split("/")
        assert int(quota) / int(period) == pytest.approx(0.5)
        assert got["capeff"] == "0000000000000000" and got["capbnd"] == "0000000000000000"
        assert got["nnp"] == "1"
        assert got["net"] == "lo"
        # the memory limit bites: the command is OOM-killed, the sandbox lives on
        r = await sb.exec(["python3", "-c", "x = b'x' * (600 * 1024 * 1024); print(len(x))"], timeout=60)
        assert r.signal == 9 and r.oom_killed and not r.timed_out
        assert (await sb.exec("echo ok")).stdout == "ok\n"
        # the pids limit bites
        r = await sb.exec(["python3", "-c", "import subprocess\nps=[subprocess.Popen(['sleep','3']) for _ in range(100)]"])
        assert r.exit_code != 0 and ("BlockingIOError" in r.stderr or "Resource temporarily unavailable" in r.stderr)


async def test_network_really_off(docker_sandbox):
    code = (
        "import socket\n"
        "for addr in [('1.1.1.1', 53), ('10.0.0.1', 80), ('172.17.0.1', 2375)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=2); print('CONNECTED', addr)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    r = await docker_sandbox.exec(["python3", "-c", code])
    assert "CONNECTED" not in r.stdout and r.stdout.count("refused") == 3


async def test_user_option(docker_backend, docker_spec):
    async with await docker_backend.create(docker_spec.model_copy(update={"user": "1234:1234"})) as sb:
        assert (await sb.exec("id -u; id -g")).stdout == "1234\n1234\n"


async def test_delete_idempotent_and_list(docker_backend, docker_spec):
    tag = uuid.uuid4().hex[:8]
    spec = docker_spec.model_copy(update={"labels": {**docker_spec.labels, "case": tag}})
    sb = await docker_backend.create(spec)
    listed = await docker_backend.list({"case": tag})
    assert [i.id for i in listed] == [sb.id] and listed[0].status == "running"
    await sb.delete()
    await sb.delete()
    await docker_backend.delete(sb.id)
    assert not await container_exists(docker_backend, sb.id)
    assert await docker_backend.list({"case": tag}) == []
    assert not await sb.alive()


async def test_get_reattaches(docker_backend, docker_sandbox):
    other = await docker_backend.get(docker_sandbox.id)
    await docker_sandbox.write_file("/tmp/shared", "x")
    assert await other.read_file("/tmp/shared") == b"x"
    await other.connection.close()


async def test_lifetime_enforced_without_owner(docker_backend, docker_spec):
    sb = await docker_backend.create(docker_spec.model_copy(update={"timeout_minutes": 0.05}))  # 3 s
    cid = sb.id
    for _ in range(60):
        if not await container_exists(docker_backend, cid):
            break
        await asyncio.sleep(0.25)
    assert not await container_exists(docker_backend, cid)
    with pytest.raises(InfraError):
        await sb.exec("true")
    await sb.delete()


async def test_deadline_deletes_from_outside_and_delete_cancels_it(docker_backend, docker_spec, monkeypatch):
    """The creating process deletes a container at its labelled deadline + slack even when
    the in-container `timeout` is stopped; a deleted sandbox's timer is cancelled."""
    from backends.docker import backend as docker_mod

    monkeypatch.setattr(docker_mod, "DEADLINE_SLACK_SECONDS", 0.0)
    kept = await docker_backend.create(docker_spec)
    assert kept.id in docker_backend._deadlines
    await kept.delete()
    assert kept.id not in docker_backend._deadlines
    sb = await docker_backend.create(docker_spec.model_copy(update={"timeout_minutes": 0.1, "user": "root"}))
    stopped = await sb.exec("for p in /proc/[0-9]*; do grep -qx timeout $p/comm 2>/dev/null && "
                            "kill -STOP ${p#/proc/} && sleep 0.2 && cut -d' ' -f3 $p/stat; done")
    assert stopped.stdout.split() == ["T"], stopped  # the in-container timer is stopped: only the owner's is left
    for _ in range(80):
        if not await container_exists(docker_backend, sb.id):
            break
        await asyncio.sleep(0.25)
    assert not await container_exists(docker_backend, sb.id)
    assert sb.id not in docker_backend._deadlines
    await sb.delete()


async def test_idempotency_key_one_container(docker_backend, docker_spec):
    tag = uuid.uuid4().hex[:8]
    spec = docker_spec.model_copy(update={"labels": {**docker_spec.labels, "case": tag}})
    a = await docker_backend.create(spec, idempotency_key=f"k-{tag}")
    b = await docker_backend.create(spec, idempotency_key=f"k-{tag}")
    assert a.id == b.id
    assert len(await docker_backend.list({"case": tag})) == 1
    await b.connection.close()
    await a.delete()


async def test_create_retry_after_lost_response_makes_one_container(docker_backend, docker_spec, monkeypatch):
    from sandboxes.errors import BackendUnavailable

    tag = uuid.uuid4().hex[:8]
    spec = docker_spec.model_copy(update={"labels": {**docker_spec.labels, "case": tag}})
    docker_backend.retry = RetryPolicy(attempts=3, initial_delay=0.05, jitter=0)
    docker = await docker_backend._client()
    real_create = docker.containers.create
    calls = []

    async def flaky_create(config, name=None):
        calls.append(name)
        container = await real_create(config, name=name)
        if len(calls) == 1:
            raise BackendUnavailable("response lost after the container was made")
        return container

    monkeypatch.setattr(docker.containers, "create", flaky_create)
    sb = await docker_backend.create(spec)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert [i.id for i in await docker_backend.list({"case": tag})] == [sb.id]
    assert (await sb.exec("echo ok")).ok
    await sb.delete()


async def test_agent_killed_is_agent_error(docker_backend, docker_sandbox):
    sb = docker_sandbox
    pending = asyncio.create_task(sb.exec("sleep 30"))
    await asyncio.sleep(0.3)
    docker = await docker_backend._client()
    ex = await docker.containers.container(sb.id).exec(["kill", "-9", str(sb.connection.hello["pid"])])
    await ex.start(detach=True)
    with pytest.raises(AgentError):
        await asyncio.wait_for(pending, 10)
    with pytest.raises(AgentError):
        await sb.exec("true")
    assert await docker_backend._running(sb.id)  # the container itself is fine


async def test_container_killed_is_infra_error(docker_backend, docker_sandbox):
    sb = docker_sandbox
    pending = asyncio.create_task(sb.exec("sleep 30"))
    await asyncio.sleep(0.3)
    docker = await docker_backend._client()
    await docker.containers.container(sb.id).kill()
    with pytest.raises(InfraError):
        await asyncio.wait_for(pending, 10)
    assert not await sb.alive()
    await sb.delete()  # still idempotent


async def test_missing_image_without_recipe(docker_backend, docker_spec):
    with pytest.raises(ImageNotFound) as info:
        await docker_backend.create(docker_spec.model_copy(update={"image": "vf-sandbox-test/nothing-here:1"}))
    assert "docker load" in str(info.value) and "docker build" in str(info.value)


async def test_default_image_alias_resolves_to_recipe(docker_backend, python_image):
    assert await docker_backend.resolve_image("python:3.11-slim") in ("python:3.11-slim", python_image)


@pytest.fixture(scope="module")
def nopython_image(python_image):
    import docker

    name = "vf-sandbox-test/nopython:1"
    api = docker.from_env(version="1.41").api
    dockerfile = b"FROM vf-sandbox/base:bookworm\nRUN rm -f /usr/bin/python3*\n"
    for _ in api.build(fileobj=io.BytesIO(dockerfile), tag=name, network_mode="none", rm=True, decode=True):
        pass
    return name


async def test_fallback_without_python(docker_backend, docker_spec, nopython_image, tmp_path):
    async with await docker_backend.create(docker_spec.model_copy(update={"image": nopython_image})) as sb:
        assert type(sb).__name__ == "ExecSandbox"
        r = await sb.exec("echo hi; exit 3")
        assert r.stdout == "hi\n" and r.exit_code == 3
        r = await sb.exec("cat", stdin="piped")
        assert r.stdout == "piped"
        r = await sb.exec("sleep 30", timeout=1)
        assert r.timed_out
        r = await sb.exec("head -c 3000000 /dev/zero", output_limit=1000)
        assert r.stdout_dropped_bytes == 3_000_000 - 1000
        await sb.write_file("/data/x.txt", "content", mode=0o640)
        assert await sb.read_file("/data/x.txt") == b"content"
        src = tmp_path / "d"
        src.mkdir()
        (src / "f").write_text("f")
        (src / "l").symlink_to("f")
        await sb.upload(src, "/tree")
        await sb.download("/tree", tmp_path / "back")
        assert (tmp_path / "back/f").read_text() == "f" and os.readlink(tmp_path / "back/l") == "f"
        with pytest.raises(ConfigError):
            await sb.start_process("sleep 1")


def test_spec_default_is_secure():
    spec = SandboxSpec()
    assert spec.network is False and spec.pids_limit > 0


async def test_cancelled_create_leaves_nothing(docker_backend, docker_spec):
    tag = uuid.uuid4().hex[:8]
    spec = docker_spec.model_copy(update={"labels": {**docker_spec.labels, "case": tag}})
    for delay in (0.0, 0.01, 0.05, 0.15, 0.3):
        task = asyncio.create_task(docker_backend.create(spec))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            sb = await task
            await sb.delete()  # finished before the cancel landed
        except asyncio.CancelledError:
            pass
    for _ in range(40):
        if not await docker_backend.list({"case": tag}):
            break
        await asyncio.sleep(0.25)
    assert await docker_backend.list({"case": tag}) == []


def test_lost_sandbox_reaper_finds_the_containerd_of_a_local_dockerd_only(tmp_path):
    """The reaper of sandboxes a crashed engine lost drives the engine's own containerd: found
    for the machine's dockerd (through its socket's peer), never for a TCP engine or a socket
    some other program serves. (Removal itself: tests/test_faults.py, on the suite's own engine.)"""
    import socket

    from backends.docker import orphans
    from backends.docker.engine import resolve_url

    address = orphans.containerd_address(resolve_url())
    assert address is not None and address.endswith(".sock") and os.path.exists(address)
    assert orphans.containerd_address("tcp://127.0.0.1:9") is None
    with socket.socket(socket.AF_UNIX) as s:  # this pytest process listens here: not a dockerd
        s.bind(str(tmp_path / "fake.sock"))
        s.listen(1)
        assert orphans.containerd_address(f"unix://{tmp_path}/fake.sock") is None
    assert orphans.containerd_address(f"unix://{tmp_path}/none.sock") is None


def test_a_slow_lost_sandbox_pass_never_holds_a_cli_exit():
    """The start-up reaper's containerd pass runs `ctr` off the loop; a slow one must not
    keep a CLI from exiting (a SIGTERMed run once did not end while it ran)."""
    import subprocess
    import sys

    from conftest import require_docker

    require_docker()
    script = (
        "import time\n"
        "from backends.docker import orphans\n"
        "orphans.containerd_address = lambda url: '/run/vf-test-no-containerd.sock'\n"
        "orphans.held = lambda address: time.sleep(30) or set()  # a containerd that answers slowly\n"
        "from sandboxes.lifecycle import reap_in_background\n"
        "reap_in_background('docker')\n"
        "time.sleep(1.5)\n"
        "print('main done', flush=True)\n"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 0 and "main done" in out.stdout, out.stderr[-2000:]
    assert took < 15, f"the process took {took:.1f}s to exit (the reaper's pass held it)"
