"""ONE conformance suite every backend must pass, parametrised over backends:
docker (real engine), local (bubblewrap and plain), kubernetes and prime
(against CONTRACT FAKES that speak the real wire protocols; see
tests/fakes/). `tests/test_k8s_real.py` runs the same tests on a real
cluster (`VF_K8S_CONTEXT=... pytest -m k8s`).

The tests only use the `Sandbox` / `SandboxBackend` contract and paths made
inside the sandbox with `mktemp -d`, so they mean the same on every backend.
"""

from __future__ import annotations

import asyncio
import os
import stat
import uuid

import pytest

from backend_harness import open_backend
from sandboxes import ExecResult, InfraError, OutputChunk, PathError, SandboxNotRunning, UsageError, is_infra_error

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("docker-gvisor", marks=pytest.mark.docker),
    pytest.param("docker-cells", marks=pytest.mark.docker),
    pytest.param("docker-gvisor-cells", marks=pytest.mark.docker),
    "local",
    "local-nobwrap",
    "kubernetes",
    "prime",
]
LIMIT = 64 * 1024


@pytest.fixture(params=BACKENDS)
async def backend_env(request):
    async with open_backend(request.param) as env:
        yield env


@pytest.fixture
def run_label():
    return {"vf-conformance": uuid.uuid4().hex[:12]}


@pytest.fixture
async def backend(backend_env, run_label):
    """The backend; whatever a test left behind with its run label is removed afterwards."""
    yield backend_env[0]
    await backend_env[0].delete_many(labels=run_label)


@pytest.fixture
def spec(backend_env, run_label):
    base = backend_env[1]
    return base.model_copy(update={
        "labels": {**base.labels, **run_label},
        "environment_vars": {"SPEC_VAR": "from-spec"},
        "output_limit_bytes": LIMIT,
        "timeout_per_command_seconds": 20,
    })


@pytest.fixture
async def sb(backend, spec):
    sandbox = await backend.create(spec)
    try:
        yield sandbox
    finally:
        await sandbox.delete()


async def tmpdir(sb) -> str:
    r = await sb.exec("mktemp -d")
    assert r.ok, r
    return r.stdout.strip()


# -- exec -----------------------------------------------------------------------

async def test_exec_shell_and_argv(sb):
    r = await sb.exec("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 0, False)
    assert r.ok
    r = await sb.exec(["printf", "%s|", "a b", "c"])
    assert r.stdout == "a b|c|" and r.ok


async def test_exit_codes(sb):
    assert (await sb.exec("exit 3")).exit_code == 3
    r = await sb.exec(["false"])
    assert r.exit_code == 1 and not r.ok
    assert (await sb.exec("no-such-command-xyz")).exit_code == 127
    r = await sb.exec("kill -TERM $$")
    assert not r.ok and (r.signal == 15 or r.exit_code in (143, -15))


async def test_timeout_kills_process_group_and_sandbox_survives(sb):
    d = await tmpdir(sb)
    r = await sb.exec(f"sleep 300 & echo $! > {d}/child; echo started; sleep 300", timeout=1.5)
    assert r.timed_out and not r.ok
    assert "started" in r.stdout  # partial output is kept
    child = (await sb.read_file(f"{d}/child")).decode().strip()
    check = (f"for i in 1 2 3 4 5 6 7 8 9 10; do s=$(cut -d' ' -f3 /proc/{child}/stat 2>/dev/null); "
             f"if [ -z \"$s\" ] || [ \"$s\" = Z ]; then echo dead; exit 0; fi; sleep 0.3; done; echo alive")
    assert (await sb.exec(check)).stdout.strip() == "dead"
    assert (await sb.exec("echo still-usable")).stdout == "still-usable\n"


async def test_output_cap_keeps_head_and_tail(sb):
    r = await sb.exec("printf START; head -c 1000000 /dev/zero | tr '\\0' x; printf END")
    assert r.ok and r.truncated
    assert r.stdout.startswith("START") and r.stdout.endswith("END")
    # at most LIMIT bytes of output are kept (plus a short "bytes dropped" marker between head and tail)
    assert len(r.stdout.encode()) <= LIMIT + 64
    assert r.stdout_dropped_bytes >= 1000000 + 8 - LIMIT
    assert r.stdout.count("x") + r.stdout_dropped_bytes == 1000000
    r = await sb.exec("head -c 100000 /dev/zero | tr '\\0' q", output_limit=1000)
    assert r.stdout.count("q") <= 1000 and r.stdout.count("q") + r.stdout_dropped_bytes == 100000


async def test_binary_output_never_raises(sb):
    r = await sb.exec("printf '\\377\\376abc\\000def'")
    assert r.ok and "abc" in r.stdout and "def" in r.stdout and "\ufffd" in r.stdout


async def test_env_cwd_stdin(sb):
    d = await tmpdir(sb)
    r = await sb.exec('echo "$SPEC_VAR $FOO"; pwd', env={"FOO": "bar"}, cwd=d)
    assert r.stdout == f"from-spec bar\n{d}\n"
    r = await sb.exec(["cat"], stdin="hello\nworld")
    assert r.stdout == "hello\nworld"
    r = await sb.exec("wc -c", stdin=b"\x00\x01" * 100000)
    assert r.stdout.strip() == "200000"


async def test_exec_stream(sb):
    items = [i async for i in sb.exec_stream("echo one; sleep 0.2; echo two >&2; echo three")]
    assert isinstance(items[-1], ExecResult) and items[-1].ok
    chunks = [i for i in items[:-1] if isinstance(i, OutputChunk)]
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"one\nthree\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"two\n"


async def test_concurrent_execs(sb):
    results = await asyncio.gather(*(sb.exec(f"sleep 0.3; echo {i}") for i in range(8)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(8)]


async def test_background_process(sb):
    p = await sb.start_process("echo ready; cat; echo bye")
    out, _ = await p.read_output(until="ready", timeout=10)
    assert "ready" in out
    assert (await p.poll()).running
    await p.write_stdin("ping\n")
    out, _ = await p.read_output(until="ping", timeout=10)
    assert "ping" in out
    await p.kill()
    status = await p.wait(timeout=10)
    assert not status.running
    await p.kill()  # idempotent after exit


@pytest.mark.parametrize("keep", ["newest", "head_tail"])
async def test_background_output_overflow_keeps_what_was_asked(sb, keep):
    """A full buffer drops the oldest bytes ("newest") or the middle ("head_tail": the
    head and the newest bytes stay); the count and the cut's place are reported."""
    p = await sb.start_process("printf HEAD; head -c 50000 /dev/zero | tr '\\0' m; echo TAIL; cat",
                               output_limit=1000, keep=keep)
    out, _ = await p.read_output(until="TAIL", timeout=20)
    assert out.endswith("TAIL") and p.dropped_bytes[0] == 4 + 50000 + 5 - 1000  # "TAIL\n": the \n stays buffered
    assert len(out) == 1000 - 1
    if keep == "head_tail":
        assert out.startswith("HEAD" + "m" * 496) and p.gap_at[0] == 500
    else:
        assert "HEAD" not in out and p.gap_at[0] == 0
    assert p.total_dropped_bytes[0] == p.dropped_bytes[0]
    await p.write_stdin("again\n")
    out, _ = await p.read_output(until="again", timeout=10)
    assert "again" in out and p.dropped_bytes == (0, 0) and p.gap_at == (None, None)
    await p.kill()
    await p.wait(timeout=10)


# -- files ------------------------------------------------------------------------

async def test_write_read_file(sb):
    d = await tmpdir(sb)
    path = f"{d}/a/b/c.bin"
    data = bytes(range(256)) * 10
    await sb.write_file(path, data, mode=0o755)
    assert await sb.read_file(path) == data
    assert await sb.read_file(path, max_bytes=10) == data[:10]
    assert (await sb.exec(f"test -x {path}")).ok
    await sb.write_file(path, "replaced")
    assert await sb.read_file(path) == b"replaced"
    big = os.urandom(3 * 1024 * 1024)
    await sb.write_file(f"{d}/big", big)
    assert await sb.read_file(f"{d}/big") == big


async def test_read_file_errors_are_path_errors(sb):
    d = await tmpdir(sb)
    with pytest.raises(PathError):
        await sb.read_file(f"{d}/missing")
    with pytest.raises(PathError):
        await sb.read_file(d)
    with pytest.raises(UsageError):
        await sb.read_file("")


async def test_upload_download_tree(sb, tmp_path):
    src = tmp_path / "src"
    (src / "sub" / "empty").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "sub" / "run.sh").chmod(0o755)
    (src / "link").symlink_to("a.txt")
    d = await tmpdir(sb)
    await sb.upload(src, f"{d}/up")
    assert (await sb.exec(f"{d}/up/sub/run.sh")).stdout == "ran\n"
    assert (await sb.exec(f"readlink {d}/up/link; cat {d}/up/link; test -d {d}/up/sub/empty")).stdout == "a.txt\nalpha"
    await sb.upload(src / "a.txt", f"{d}/single.txt")
    assert await sb.read_file(f"{d}/single.txt") == b"alpha"
    out = tmp_path / "down"
    await sb.download(f"{d}/up", out)
    assert (out / "a.txt").read_text() == "alpha"
    assert os.readlink(out / "link") == "a.txt"
    assert stat.S_IMODE((out / "sub" / "run.sh").stat().st_mode) & 0o100
    assert (out / "sub" / "empty").is_dir()
    await sb.download(f"{d}/single.txt", tmp_path / "one.txt")
    assert (tmp_path / "one.txt").read_text() == "alpha"


async def test_large_tree_round_trip(sb, tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    payload = os.urandom(12 * 1024 * 1024)
    (src / "blob").write_bytes(payload)
    for i in range(200):
        (src / f"f{i:03d}.txt").write_text(f"file {i}\n")
    d = await tmpdir(sb)
    await sb.upload(src, f"{d}/big")
    # find, not ls: coreutils >= 9 `ls` fails under Debian's runsc 20221219 (statx AT_NO_AUTOMOUNT -> EINVAL;
    # pinned in test_gvisor.py), and this test is about the transfer, not about ls
    r = await sb.exec(f"find {d}/big -mindepth 1 -maxdepth 1 | wc -l; wc -c < {d}/big/blob")
    assert r.stdout.split() == ["201", str(len(payload))]
    await sb.download(f"{d}/big", tmp_path / "back")
    assert (tmp_path / "back" / "blob").read_bytes() == payload
    assert (tmp_path / "back" / "f199.txt").read_text() == "file 199\n"


async def test_download_refuses_links_out_of_destination(sb, tmp_path):
    d = await tmpdir(sb)
    assert (await sb.exec(f"mkdir {d}/evil && ln -s ../../../../../../etc/passwd {d}/evil/pw")).ok
    with pytest.raises(PathError):
        await sb.download(f"{d}/evil", tmp_path / "evil")
    assert not (tmp_path / "evil" / "pw").exists()


# -- lifecycle --------------------------------------------------------------------

async def test_alive_and_delete_idempotent(backend, spec):
    sandbox = await backend.create(spec)
    assert await sandbox.alive()
    await sandbox.delete()
    await sandbox.delete()
    await backend.delete(sandbox.id)  # already gone: no error
    assert not await sandbox.alive()
    with pytest.raises(InfraError):
        await sandbox.exec("echo after-delete")
    with pytest.raises(SandboxNotRunning):
        await backend.get(sandbox.id)


async def test_sandbox_removed_behind_the_handle_raises_infra_error(backend, spec):
    """Removed by someone else (a reaper, another process): the next call fails fast and typed."""
    sandbox = await backend.create(spec)
    try:
        await backend.delete(sandbox.id)
        with pytest.raises(InfraError):
            await asyncio.wait_for(sandbox.exec("echo ghost"), 30)
        assert not await sandbox.alive()
    finally:
        await sandbox.delete()


async def test_get_attaches_to_existing_sandbox(backend, spec):
    async with await backend.create(spec) as first:
        d = await tmpdir(first)
        await first.write_file(f"{d}/mark", "here")
        second = await backend.get(first.id)
        assert second.id == first.id
        assert await second.read_file(f"{d}/mark") == b"here"
        await second.connection.close()  # drop the second handle without deleting the sandbox
        assert (await first.exec("echo ok")).ok


async def test_list_and_bulk_delete_by_label(backend, spec, run_label):
    made = await asyncio.gather(*(backend.create(spec) for _ in range(2)))
    try:
        listed = await backend.list(run_label)
        assert {i.id for i in listed} == {s.id for s in made}
        assert all(i.labels.get("vf-conformance") == run_label["vf-conformance"] for i in listed)
        assert all(i.labels.get("vf-sandbox.managed") == "true" for i in listed)
        assert await backend.list({"vf-conformance": "no-such-run"}) == []
        assert await backend.delete_many(labels=run_label) == 2
        assert await backend.list(run_label) == []
    finally:
        for s in made:
            await s.delete()


async def test_delete_many_by_ids(backend, spec, run_label):
    a, b = await asyncio.gather(backend.create(spec), backend.create(spec))
    try:
        assert await backend.delete_many(ids=[a.id]) == 1
        assert [i.id for i in await backend.list(run_label)] == [b.id]
    finally:
        await a.delete()
        await b.delete()


async def test_delete_many_contract_mixed_ids(backend, spec, run_label):
    """ids: live ones removed and counted; unknown and already deleted ones skipped
    silently; [] removes nothing; labels + ids = both must match."""
    live, other, gone = await asyncio.gather(*(backend.create(spec) for _ in range(3)))
    try:
        await gone.delete()
        assert await backend.delete_many(ids=[]) == 0
        assert {i.id for i in await backend.list(run_label)} == {live.id, other.id}
        assert await backend.delete_many(ids=[live.id, "vf-no-such-sandbox-0000", gone.id]) == 1
        assert [i.id for i in await backend.list(run_label)] == [other.id]
        assert await backend.delete_many(ids=[live.id, gone.id]) == 0  # all gone by now: no error
        assert await backend.delete_many(labels={"vf-conformance": "not-this-run"}, ids=[other.id]) == 0
        assert [i.id for i in await backend.list(run_label)] == [other.id]
        assert await backend.delete_many(labels=run_label, ids=[other.id]) == 1
        assert await backend.list(run_label) == []
    finally:
        for s in (live, other, gone):
            await s.delete()


async def test_file_errors_are_typed(sb):
    """Missing file, a directory, no permission: typed PathErrors that name the path and
    their builtin (what `inspect_ai`'s provider and other callers raise instead)."""
    from sandboxes import FileNotFound, IsADirectory, PermissionDenied

    d = await tmpdir(sb)
    with pytest.raises(FileNotFound) as e:
        await sb.read_file(f"{d}/missing")
    assert e.value.builtin is FileNotFoundError and f"{d}/missing" in str(e.value)
    with pytest.raises(IsADirectory) as e:
        await sb.read_file(d)
    assert e.value.builtin is IsADirectoryError and "directory" in str(e.value)
    with pytest.raises(IsADirectory):
        await sb.write_file(d, b"cannot replace a directory")
    await sb.write_file(f"{d}/locked", b"secret")
    assert (await sb.exec(["chmod", "000", f"{d}/locked"])).ok
    try:  # a user holding CAP_DAC_OVERRIDE (local backend run as root) may read it anyway
        assert await sb.read_file(f"{d}/locked") == b"secret"
    except PermissionDenied as exc:
        assert exc.builtin is PermissionError and f"{d}/locked" in str(exc)
    try:
        await sb.write_file(f"{d}/locked", b"overwritten")
    except PermissionDenied:
        pass


async def test_start_error_says_why(sb):
    """A command that cannot start is a result (127 / 126, as a shell says) whose
    `start_error` names the errno: callers tell "no such program" from "not executable"."""
    r = await sb.exec(["/no/such/program"])
    assert r.exit_code == 127 and r.start_error == "ENOENT", r
    d = await tmpdir(sb)
    await sb.write_file(f"{d}/plain", b"not a program", mode=0o644)
    r = await sb.exec([f"{d}/plain"])
    assert r.exit_code == 126 and r.start_error == "EACCES", r
    assert (await sb.exec("true")).start_error is None


async def test_exec_as_user(sb):
    """exec(user=): the sandbox's own user always works (by uid or name); an unknown user
    is UnknownUser; another user runs the command as that user, or raises
    UserSwitchUnsupported where the sandbox cannot switch users (capabilities dropped)."""
    from sandboxes import UnknownUser, UserSwitchUnsupported

    uid = (await sb.exec(["id", "-u"])).stdout.strip()
    same = await sb.exec(["id", "-u"], user=uid)
    assert same.ok and same.stdout.strip() == uid, same
    with pytest.raises(UnknownUser) as e:
        await sb.exec(["id"], user="no-such-user-vf")
    assert "no-such-user-vf" in str(e.value)
    other = "65534" if uid != "65534" else "0"
    try:
        r = await sb.exec(["id", "-u"], user=other)
    except UserSwitchUnsupported:
        return
    assert r.ok and r.stdout.strip() == other, r


async def test_read_file_contract(sb):
    """Exact bytes (binary too); max_bytes returns the first max_bytes of a longer file
    without error; missing file / directory / empty path are PathError; a negative
    limit is a ConfigError; none of them is an InfraError."""
    from sandboxes import ConfigError

    d = await tmpdir(sb)
    blob = bytes(range(256)) * 4 + b"\x00\xff\xfe\r\n"
    await sb.write_file(f"{d}/bin", blob)
    assert await sb.read_file(f"{d}/bin") == blob
    assert await sb.read_file(f"{d}/bin", max_bytes=len(blob)) == blob
    assert await sb.read_file(f"{d}/bin", max_bytes=len(blob) + 100) == blob
    assert await sb.read_file(f"{d}/bin", max_bytes=300) == blob[:300]  # over the limit: cut, no error
    assert await sb.read_file(f"{d}/bin", max_bytes=0) == b""
    await sb.write_file(f"{d}/empty", b"")
    assert await sb.read_file(f"{d}/empty") == b""
    for bad in (f"{d}/missing", d, f"{d}/bin/below-a-file", ""):
        with pytest.raises(PathError) as e:
            await sb.read_file(bad)
        assert not is_infra_error(e.value), bad
    with pytest.raises(ConfigError):
        await sb.read_file(f"{d}/bin", max_bytes=-1)


async def test_operation_errors_on_a_deleted_sandbox(backend, spec):
    """After delete: every operation on the handle is an InfraError, get() is
    SandboxNotRunning, delete()/delete_many() stay silent."""
    sandbox = await backend.create(spec)
    await sandbox.delete()
    for op in (lambda: sandbox.exec("true"), lambda: sandbox.read_file("/etc/hostname"),
               lambda: sandbox.write_file("/tmp/x", b"x"), lambda: sandbox.start_process("sleep 1")):
        with pytest.raises(InfraError):
            await asyncio.wait_for(op(), 30)
    with pytest.raises(SandboxNotRunning):
        await backend.get(sandbox.id)
    await backend.delete(sandbox.id)
    await backend.delete("vf-no-such-sandbox-0000")
    assert await backend.delete_many(ids=[sandbox.id, "vf-no-such-sandbox-0000"]) == 0


async def test_errors_are_classified(backend, spec):
    with pytest.raises(SandboxNotRunning) as exc:
        await backend.get("vf-no-such-sandbox-0000")
    assert is_infra_error(exc.value)
    async with await backend.create(spec) as s:
        with pytest.raises(PathError) as perr:
            await s.read_file("/definitely/not/here")
        assert not is_infra_error(perr.value)


# -- the layers above run unchanged -----------------------------------------------------

async def test_sandbox_env_runs_unchanged(backend, backend_env, run_label):
    """SandboxEnv (persistent shell, per-rollout sandbox, cleanup) on this backend, as a user would."""
    from envs.sandbox_env import SandboxEnv

    env = SandboxEnv(backend=backend, docker_image=backend_env[1].image, labels=dict(run_label))
    state = await env.setup_state({"prompt": [], "info": {}})
    try:
        sid = state["sandbox_id"]
        await env.bash("cd /tmp && export X=41", sandbox_id=sid)
        assert (await env.bash("echo $((X + 1)); pwd", sandbox_id=sid)) == "42\n/tmp"
    finally:
        await env.destroy_sandbox(state)
    assert await backend.list(run_label) == []


async def test_python_env_runs_unchanged(backend, backend_env, run_label):
    """PythonEnv's persistent interpreter (a background process of the agent) on this backend."""
    from envs.python_env import PythonEnv

    env = PythonEnv(pip_install_packages="", backend=backend, docker_image=backend_env[1].image, labels=dict(run_label))
    state = await env.setup_state({"prompt": [], "info": {}})
    try:
        sid = state["sandbox_id"]
        await env.python("x = 6 * 7", sandbox_id=sid)
        assert "42" in await env.python("print(x)", sandbox_id=sid)
    finally:
        await env.destroy_sandbox(state)
    assert await backend.list(run_label) == []
