"""Snapshots and forks of cells (issue 28, kind "layer"), on the real engine under runc
and gVisor: a cell's writable layer frozen into a read-only layer of its cell host, new
cells stacking it over the image.

What is checked: forks carry the source's files (deletions and replaced directories
too), environment, working directory, user and limits, never its processes; a write in
one fork is seen by no sibling and not by the source, which keeps running and whose
later writes are in no fork; a fork of a fork stacks both layers; hard links stay links
(no copy amplification); a deleted snapshot makes no more cells and its layer is freed
once no cell stacks it; nothing is left after close. A cell cannot have the host stack
or freeze a layer for it (a forged request on its own channel ends it; a layer is named
by the host's id, never by a path).
"""

from __future__ import annotations

import asyncio
import errno
import json

import pytest

from conftest import DEFAULT_TEST_IMAGE, require_docker, require_gvisor
from sandboxes import ConfigError, ImageNotFound, InfraError, SandboxNotRunning
from sandboxes.labels import SNAPSHOT_OF
from test_cells import RUNTIMES, backend, cell_spec  # noqa: F401  (backend: the cells suite's fixture, runc + gVisor)
from test_hostile import assert_refused, attack, lines_b64

pytestmark = pytest.mark.docker

LAYERS = "/run/.vf-layers"


async def _backend(isolation: str):
    require_docker()
    if isolation == "gvisor":
        require_gvisor()
    from backends.docker import DockerBackend
    from backends.docker.images import ensure_image

    await asyncio.to_thread(ensure_image, DEFAULT_TEST_IMAGE)
    be = DockerBackend()
    be.test_isolation = isolation
    return be


async def py(sb, code: str):
    """Run Python in `sb` and return what it printed as JSON (coreutils' ls/stat fail under gVisor)."""
    r = await sb.exec(["python3", "-c", "import json, os, stat, sys\n" + code])
    assert r.exit_code == 0, r
    return json.loads(r.stdout.strip().splitlines()[-1])


async def layer_dirs(cell) -> list[str]:
    return await py(cell.host.sandbox, f"print(json.dumps(sorted(os.listdir({LAYERS!r}))))")


SETUP = """
mkdir -p proj/sub && echo setup > proj/sub/f && echo keep > proj/keep
rm /etc/issue.net
rm -rf /usr/share/common-licenses && mkdir /usr/share/common-licenses && echo only > /usr/share/common-licenses/mine
ln -s sub/f proj/link
ln proj/sub/f proj/hard
echo tmp > /tmp/t
chmod 751 proj/sub && chmod 640 proj/keep && mkfifo proj/fifo
"""

VIEW = """
def read(p):
    try:
        with open(p, "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""
def mode(p):
    return oct(os.stat(p).st_mode & 0o7777) if os.path.exists(p) else None
def kind(p):
    try:
        m = os.lstat(p).st_mode
    except FileNotFoundError:
        return None
    return "link" if stat.S_ISLNK(m) else "dir" if stat.S_ISDIR(m) else "file"
out = {
    "cwd": os.getcwd(), "env": os.environ.get("SETUP_VAR"), "user": os.getuid(),
    "f": open("proj/sub/f").read(), "issue_net": kind("/etc/issue.net"),
    "licenses": sorted(os.listdir("/usr/share/common-licenses")),
    "tmp": read("/tmp/t"), "link": os.readlink("proj/link"), "fifo": stat.S_ISFIFO(os.lstat("proj/fifo").st_mode),
    "modes": [mode(p) for p in ("proj/sub", "proj/keep", "proj/sub/f")],
    "hard_nlink": os.stat("proj/hard").st_nlink,
    "marks": sorted(n for n in os.listdir("proj") if n.startswith("mark")),
    "pids": read("/sys/fs/cgroup/pids/pids.max"), "memory": read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "sleepers": [p for p in os.listdir("/proc")
                 if p.isdigit() and read("/proc/%s/cmdline" % p).split(chr(0))[:2] == ["sleep", "4251"]],
}
print(json.dumps(out))
"""


async def test_forks_are_independent_of_each_other_and_of_the_source(backend):
    spec = cell_spec(backend, environment_vars={"SETUP_VAR": "from-spec"}, workdir="/work", pids_limit=77)
    source = await backend.create(spec)
    assert (await source.exec(SETUP)).ok
    await source.exec("sleep 4251 >/dev/null 2>&1 &")  # a process: not carried
    before = await py(source, VIEW)
    forks = await source.fork(3)
    assert len(forks) == 3 and len({f.id for f in forks} | {source.id}) == 4
    # the source keeps running (its process too) and writes on: no fork sees it
    assert (await source.exec("echo later > proj/mark-source; rm proj/keep")).ok
    for i, fork in enumerate(forks):
        assert (await fork.exec(f"echo {i} > proj/mark-{i}")).ok
    for i, fork in enumerate(forks):
        view = await py(fork, VIEW)
        assert view["marks"] == [f"mark-{i}"], view  # its own write only: no sibling's, not the source's later one
        assert (await fork.exec("cat proj/keep")).stdout == "keep\n"  # deleted in the source after the fork
        assert view["sleepers"] == [] and before["sleepers"], (view, before)  # processes are not carried
        for k in ("cwd", "env", "user", "f", "issue_net", "licenses", "tmp", "link", "fifo", "modes", "hard_nlink",
                  "pids", "memory"):
            assert view[k] == before[k], (k, view, before)
    assert before["cwd"] == "/work" and before["env"] == "from-spec" and before["issue_net"] is None
    assert before["modes"] == ["0o751", "0o640", "0o644"] and before["fifo"], before
    assert before["licenses"] == ["mine"] and before["tmp"] == "tmp"
    assert before["link"] == "sub/f" and before["hard_nlink"] == 2
    if backend.test_isolation == "runc":  # limits are the source's (gVisor shows a cell no cgroup files)
        assert (before["pids"], before["memory"]) == ("77", str(512 * 1024**2)), before
    after = await py(source, VIEW)
    assert after["marks"] == ["mark-source"] and after["sleepers"] == before["sleepers"]
    assert not (await source.exec("test -e proj/keep")).ok
    # a write in a fork to a file the layer holds is the fork's own (a copy-up), not its siblings'
    assert (await forks[0].exec("echo changed > proj/sub/f")).ok
    assert (await forks[1].exec("cat proj/sub/f")).stdout == "setup\n"
    assert (await source.exec("cat proj/sub/f")).stdout == "setup\n"
    await asyncio.gather(*(f.delete() for f in forks))
    assert (await source.exec("cat proj/mark-source")).stdout == "later\n"
    assert await layer_dirs(source) == []  # fork()'s snapshot was freed with its last fork
    await source.delete()


async def test_a_fork_of_a_fork_stacks_both_layers_and_the_users_files_stay_its(backend):
    spec = cell_spec(backend, user="nobody", workdir="/var/tmp")  # 1777: the user may write there
    source = await backend.create(spec)
    assert (await source.exec("echo one > a && echo gone > b && mkdir d && echo x > d/x")).ok
    (child,) = await source.fork(1)
    assert (await child.exec("echo two > c && rm b && rm -r d && mkdir d && echo y > d/y && echo more >> a")).ok
    (grandchild,) = await child.fork(1)
    view = await py(grandchild, "print(json.dumps([sorted(os.listdir('.')), sorted(os.listdir('d')), "
                                "open('a').read(), os.stat('a').st_uid, os.getuid()]))")
    assert view[:3] == [["a", "c", "d"], ["y"], "one\nmore\n"], view
    assert view[3] == view[4] != 0  # the user's files stay the user's: it may change them in the fork
    assert (await grandchild.exec("echo three >> a && chmod 600 a && cat a")).stdout == "one\nmore\nthree\n"
    assert (await source.exec("cat a b d/x")).stdout == "one\ngone\nx\n"  # the source is untouched
    for sb in (grandchild, child, source):
        await sb.delete()


async def test_a_deleted_snapshot_makes_no_cell_and_its_layer_goes_with_its_last_cell(backend):
    source = await backend.create(cell_spec(backend))
    await source.exec("echo base > /base")
    snap = await source.snapshot()
    assert snap.kind == "layer" and snap.source_id == source.id and snap.spec == source.spec
    assert [s.id for s in await backend.list_snapshots({SNAPSHOT_OF: source.id})] == [snap.id]
    fork = await backend.create_from_snapshot(snap)
    assert (await fork.exec("cat /base")).stdout == "base\n"
    (grand,) = await fork.fork(1)  # a layer of fork's, stacked on snap's, held by grand
    nested = await fork.snapshot()  # another, held by its snapshot
    dirs = set(await layer_dirs(source))
    assert len(dirs) == 3 and {snap.id, nested.id} < dirs
    await backend.delete_snapshot(snap)
    with pytest.raises(ImageNotFound):
        await backend.create_from_snapshot(snap)
    await fork.delete()
    assert set(await layer_dirs(source)) == dirs  # snap's is under grand's and nested's: still needed
    assert (await grand.exec("cat /base")).stdout == "base\n"
    await grand.delete()
    assert set(await layer_dirs(source)) == {snap.id, nested.id}  # grand's freed with grand
    await backend.delete_snapshot(nested)
    assert await layer_dirs(source) == []
    assert await backend.list_snapshots({SNAPSHOT_OF: source.id}) == []
    await backend.delete_snapshot(nested)  # idempotent
    await source.delete()


async def test_hard_links_are_carried_as_links_not_copies(backend):
    source = await backend.create(cell_spec(backend, memory_gb=1))
    r = await source.exec("head -c 8388608 /dev/urandom > /big && for i in $(seq 1 100); do ln /big /big$i; done")
    assert r.ok, r
    snap = await source.snapshot()
    inodes = await py(source.host.sandbox, f"""
seen = {{}}
for top, dirs, files in os.walk({LAYERS!r} + "/" + {snap.id!r}):
    for f in files:
        st = os.lstat(os.path.join(top, f))
        seen[st.st_ino] = st.st_size
print(json.dumps(list(seen.values())))""")
    assert inodes == [8 << 20]  # one 8 MiB inode in the layer, not 101 copies of it
    fork = await backend.create_from_snapshot(snap)
    assert await py(fork, "print(json.dumps(os.stat('/big77').st_nlink))") == 101
    await fork.delete()
    await backend.delete_snapshot(snap)
    await source.delete()


@pytest.mark.parametrize("isolation", RUNTIMES)
async def test_nothing_is_left_after_close(isolation):
    be = await _backend(isolation)
    try:
        source = await be.create(cell_spec(be))
        await source.exec("echo x > /x")
        forks = await source.fork(2)
        kept = await source.snapshot(keep=True)
        assert kept.keep
        host_id = source.host.sandbox.id
        assert len(await layer_dirs(source)) == 2  # fork()'s (held by the forks) and the kept one
    finally:
        await be.close()
    for _ in range(20):  # the engine may list a container it is still removing for a moment (seen at load ~100)
        proc = await asyncio.create_subprocess_exec("docker", "ps", "-aq", "--no-trunc", "--filter", f"id={host_id}",
                                                    stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        if not out.strip():
            break
        await asyncio.sleep(0.5)
    assert out.decode().strip() == ""  # the host, and with it every cell and layer, is gone within 10 s
    for fork in forks:
        with pytest.raises(InfraError):
            await fork.exec("true")


# ------------------------------------------------------------------ a cell naming layers
@pytest.fixture
async def compromised(monkeypatch):
    """Cell hosts whose root holds CAP_SYS_PTRACE, so the test plays a compromised cell
    agent from the host container (as tests/test_hostile.py does)."""
    import backends.docker.backend as docker_backend

    monkeypatch.setattr(docker_backend, "CELL_HOST_CAPS", [*docker_backend.CELL_HOST_CAPS, "SYS_PTRACE"])
    be = await _backend("runc")
    try:
        yield be
    finally:
        await be.close()


async def test_a_cell_cannot_stack_or_freeze_a_layer_it_was_not_given(compromised):
    be = compromised
    spec = cell_spec(be)
    victim = await be.create(spec)
    await victim.exec("echo victim-secret > /secret")
    snap = await victim.snapshot()
    attacker = await be.create(spec)
    host = victim.host.sandbox
    held = (await host._call({"op": "cell_layers"}))["layers"]
    forged = [
        {"id": 1, "op": "cell_open", "cell_id": 999, "layer": snap.id,
         "conf": {"hostname": "x", "env": {}, "user": None, "workdir": "/", "pids_limit": 64,
                  "memory_bytes": 1 << 28, "cpu_cores": 1, "disk_bytes": 1 << 28, "shm_bytes": 1 << 20,
                  "lifetime": 60}},
        {"id": 2, "op": "cell_snapshot", "cell_id": victim.cell_id},
        {"id": 3, "op": "cell_layer_drop", "layer": snap.id},
    ]
    payload = lines_b64(*forged)
    # as the cell's own code: its agent cannot be made to write anything (layer 1)
    assert_refused(await attack(attacker, "inject", 1, payload), "injection")
    # as a compromised cell agent, on the cell's real channel: the host ends the sender (layer 2)
    done = await attack(host, "inject", attacker.init_pid, payload)
    # ESRCH: the host ended the cell (killing its agent) before the injector had restored it;
    # that the lines were delivered is what the next check proves
    assert done["ok"] or done["errno"] == errno.ESRCH, done
    with pytest.raises(SandboxNotRunning, match="broke the agent protocol"):
        for _ in range(50):
            await attacker.exec("true")
            await asyncio.sleep(0.1)
    assert (await host._call({"op": "cell_layers"}))["layers"] == held  # no hold taken, none dropped, none made
    # the client names a layer by the host's id only: a path, or a lower dir in the cell's
    # configuration, stacks nothing
    for name in ("../../etc", f"{LAYERS}/{snap.id}", snap.id + "/..", 7):
        with pytest.raises(ConfigError, match="no layer"):
            await host._call({"op": "cell_open", "cell_id": 1000, "layer": name, "conf": forged[0]["conf"]})
    plain = await be.create(spec)
    assert not (await plain.exec("test -e /secret")).ok
    assert (await victim.exec("cat /secret")).stdout == "victim-secret\n"
    fork = await be.create_from_snapshot(snap)
    assert (await fork.exec("cat /secret")).stdout == "victim-secret\n"
    # and from inside a cell, the layers are not in reach
    assert await py(fork, f"print(json.dumps(os.listdir({LAYERS!r})))") == []
    for sb in (fork, plain, victim):
        await sb.delete()
    await be.delete_snapshot(snap)


async def test_a_non_root_fork_ends_at_delete_and_at_its_lifetime(backend):
    """The watcher kills a cell's init running as the spec's user (the host holds CAP_KILL):
    a delete is immediate and the lifetime holds, for a fork as for its source."""
    spec = cell_spec(backend, user="nobody", workdir="/var/tmp", timeout_minutes=3 / 60)
    source = await backend.create(spec)
    (fork,) = await source.fork(1)
    await fork.exec("sleep 4252 >/dev/null 2>&1 &")
    started = asyncio.get_running_loop().time()
    await fork.delete()
    assert asyncio.get_running_loop().time() - started < 5
    await asyncio.sleep(3.5)  # past the source's 3 s lifetime
    with pytest.raises(InfraError):
        await asyncio.wait_for(source.exec("true"), 30)
    procs = await py(source.host.sandbox, "print(json.dumps([open('/proc/%s/cmdline' % p, 'rb').read().decode() "
                     "for p in os.listdir('/proc') if p.isdigit() and os.path.exists('/proc/%s/cmdline' % p)]))")
    assert not [p for p in procs if "4252" in p and "python3" not in p]
    await source.delete()


async def test_a_deleted_cell_cannot_be_snapshotted_and_fork_needs_n(backend):
    cell = await backend.create(cell_spec(backend))
    for n in (0, -1, True, 1.5):
        with pytest.raises(ConfigError):
            await cell.fork(n)
    await cell.delete()
    with pytest.raises(SandboxNotRunning):
        await cell.snapshot()
    with pytest.raises(SandboxNotRunning):
        await cell.fork(1)
