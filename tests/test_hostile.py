"""A hostile rollout, for real, on the real engine (issue 24): each attack a model's code
could make on its own grader or on the rollouts beside it, performed from inside the
sandbox as the sandbox's user and as root, against a cell (rollout_isolation="namespace")
and against a container per rollout. Each test asserts the victim is unaffected: its
real exit code and output, its secret not found, its siblings still answering.

Two layers hold a cell, and each is tested alone:

1. Nothing in a sandbox can control its agent: the agent is not dumpable, so ptrace,
   /proc/<agent>/mem, environ and fd are refused to the sandbox's code (which holds no
   CAP_SYS_PTRACE); the code may still trace its own children.
2. The host agent never trusts a cell's bytes. To test this layer without the first,
   `compromised` cell hosts are given CAP_SYS_PTRACE (never held inside a cell) and the
   test plays a compromised cell agent from the host container: it injects syscalls into
   the cell's agent (the very ptrace injection layer 1 refuses to the cell's code) so the
   agent writes forged, garbage, `gone` and endless lines on the cell's real channel.

The attacks themselves are in tests/hostile_attack.py (run in the sandbox with python3).
VF_HOSTILE_FLOOD_SECONDS shortens the flood (CI: 60 s, the acceptance figure).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import statistics
import time
from pathlib import Path

import pytest

from conftest import DEFAULT_TEST_IMAGE, TEST_LABELS, require_docker, require_gvisor
from sandboxes import SandboxNotRunning, SandboxSpec

pytestmark = pytest.mark.docker

ATTACK = Path(__file__).with_name("hostile_attack.py").read_text()
FLOOD_SECONDS = float(os.environ.get("VF_HOSTILE_FLOOD_SECONDS", "60"))
REFUSED = (errno.EPERM, errno.EACCES)
NOT_REOPENED = (*REFUSED, errno.ENXIO)  # a socket (a cell's channel) cannot be reopened through /proc at all
MODES = ["cell", "container"]
USERS = {"root": None, "user": "nobody"}
RUNTIMES = ["runc", "gvisor"]  # layer 1 is tested under both (gVisor's /proc differs: `seal_channel`)


def hostile_spec(mode: str, user: str = "root", **kw) -> SandboxSpec:
    base = dict(image=DEFAULT_TEST_IMAGE, labels=dict(TEST_LABELS), memory_gb=0.5, timeout_minutes=10,
                pids_limit=128, user=USERS[user],
                rollout_isolation="namespace" if mode == "cell" else "container")
    return SandboxSpec(**{**base, **kw})


def runtime_spec(runtime: str, mode: str, user: str) -> SandboxSpec:
    if runtime == "runc":
        return hostile_spec(mode, user)
    require_gvisor()
    # the default pids limit: a gVisor container's engine limit also counts the gVisor kernel's own host
    # threads, and at 128 an ordinary background loop beside a command took the whole sandbox down
    return hostile_spec(mode, user, isolation=runtime, pids_limit=SandboxSpec().pids_limit)


async def _backend(caps: list[str] | None = None):
    require_docker()
    from backends.docker import DockerBackend
    from backends.docker.images import ensure_image

    await asyncio.to_thread(ensure_image, DEFAULT_TEST_IMAGE)
    return DockerBackend()


@pytest.fixture
async def backend():
    be = await _backend()
    try:
        yield be
    finally:
        await be.close()


@pytest.fixture
async def compromised(monkeypatch):
    """A backend whose cell hosts' root holds CAP_SYS_PTRACE, so the test can act as a
    compromised cell agent from the host container (layer 1 bypassed on purpose)."""
    import backends.docker.backend as docker_backend

    monkeypatch.setattr(docker_backend, "CELL_HOST_CAPS", [*docker_backend.CELL_HOST_CAPS, "SYS_PTRACE"])
    be = await _backend()
    try:
        yield be
    finally:
        await be.close()


async def attack(sb, *args, timeout: float = 120) -> dict:
    """Run one attack in `sb` (as the sandbox's code) and return what it reports."""
    r = await sb.exec(["python3", "-c", ATTACK, *map(str, args)], timeout=timeout)
    assert r.exit_code == 0 and r.stdout.strip(), r
    return json.loads(r.stdout.strip().splitlines()[-1])


def agent_pid(sb, mode: str) -> int:
    """The sandbox's agent as the sandbox's code sees it (a cell's agent is its PID 1)."""
    return 1 if mode == "cell" else int(sb.connection.hello["pid"])


def forged_result(rid: int, cell: int | None = None, text: str = "all tests passed\n") -> dict:
    msg = {"id": rid, "ev": "result", "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False,
           "duration": 0.1, "stdout_head": base64.b64encode(text.encode()).decode(), "stdout_tail": "",
           "stdout_dropped": 0, "stderr_head": "", "stderr_tail": "", "stderr_dropped": 0}
    return msg if cell is None else {"cell": cell, **msg}


def lines_b64(*msgs) -> str:
    data = b"".join(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n" for m in msgs)
    return base64.b64encode(data).decode()


def assert_refused(out: dict, what: str, errnos: tuple[int, ...] = REFUSED) -> None:
    assert not out["ok"] and out["errno"] in errnos, (what, out)


async def assert_victim_unaffected(task) -> None:
    r = await task
    assert (r.exit_code, r.stdout) == (3, "REAL\n"), r


VICTIM = "sleep 3; echo REAL; exit 3"


# ------------------------------------------------------------------ layer 1: the agent
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("user", list(USERS))
@pytest.mark.parametrize("mode", MODES)
async def test_the_agent_cannot_be_traced_or_read_but_own_children_can(backend, mode, user, runtime):
    sb = await backend.create(runtime_spec(runtime, mode, user))
    pid = agent_pid(sb, mode)
    if mode == "container":  # the code finds its agent by its command line
        assert pid in await attack(sb, "find_agent")
    out = await attack(sb, "probe", pid)
    # gVisor lets the code read a non-dumpable agent's environ (the sandbox's own environment, which
    # the code has: a cell's agent is forked from a zygote that never read a request) and fd links
    for what in ("seize", "attach", "mem") + (("environ", "fd1") if runtime == "runc" else ()):
        assert_refused(out[what], what)
    for what in ("reopen0_w", "reopen1_w", "reopen0_r"):  # the channel itself: never reopened (seal_channel)
        assert_refused(out[what], what, NOT_REOPENED)
    for tries in (await attack(sb, "inject", pid, lines_b64(b"x\n")), await attack(sb, "alarm0", pid)):
        assert_refused(tries, "injection")
    # what the sandbox's code may still trace: its own children (a debugger in a SWE task)...
    child = await attack(sb, "own_child")
    assert child["inject"]["ok"] and child["child_stdout"] == "INJECTED-INTO-CHILD\n", child
    traced = await attack(sb, "traceme")
    assert traced["ok"] and traced["value"] == {"stopped_at_exec": True, "exit": 0}, traced
    # ...and the commands the agent starts, which are ordinary dumpable processes (gdb -p), where
    # the kernel lets a process trace a non-descendant at all (no Yama scope >= 1: gVisor has scope 1)
    r = await sb.exec(["sh", "-c", 'sleep 60 & python3 -c "$0" probe $!; kill $!', ATTACK])
    started = json.loads(r.stdout.strip().splitlines()[-1])
    scope = (await sb.exec("cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0")).stdout.strip()
    if scope == "0":
        assert started["seize"]["ok"] and started["mem"]["ok"], started
    else:
        assert not started["seize"]["ok"] and started["seize"]["errno"] in REFUSED, (scope, started)
    await sb.delete()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("user", list(USERS))
@pytest.mark.parametrize("mode", MODES)
async def test_a_leftover_process_cannot_forge_the_next_result(backend, mode, user, runtime):
    """A process the model leaves behind keeps trying to make the agent write a forged
    result for the next (grading) command, its own or a sibling cell's: by ptrace, and by
    writing onto the agent's channel reopened through /proc (what gVisor's /proc allowed)."""
    spec = runtime_spec(runtime, mode, user)
    sb = await backend.create(spec)
    sibling = await backend.create(spec) if mode == "cell" else None
    pid = agent_pid(sb, mode)
    forged = [forged_result(k) for k in range(1, 40)]
    if sibling is not None:
        forged += [forged_result(k, cell=sibling.cell_id) for k in range(1, 40)]
    await sb.write_file("/tmp/attack.py", ATTACK)
    await sb.exec(f"nohup sh -c 'for i in $(seq 20); do for how in inject reopen_write; do "  # one whole line each
                  f"r=$(python3 /tmp/attack.py $how {pid} {lines_b64(*forged)} 2>&1); echo \"$how $r\"; done; "
                  f"sleep 0.1; done' > /tmp/attack.log 2>&1 &")
    victims = [asyncio.ensure_future(sb.exec(VICTIM))]
    if sibling is not None:
        victims.append(asyncio.ensure_future(sibling.exec(VICTIM)))
    for task in victims:
        await assert_victim_unaffected(task)
    log = (await sb.exec("cat /tmp/attack.log")).stdout.splitlines()
    assert log, "the leftover never ran"
    for line in log:  # ptrace refused; the channel not reopened (EACCES: a sealed pipe; ENXIO: a cell's socket)
        how, _, out = line.partition(" ")
        assert_refused(json.loads(out), f"leftover {how}", REFUSED if how == "inject" else NOT_REOPENED)
    await sb.exec("pkill -f attack.py; true")
    for x in (sb, sibling):
        if x is not None:
            await x.delete()


@pytest.mark.parametrize("user", list(USERS))
@pytest.mark.parametrize("mode", MODES)
async def test_no_sibling_secret_in_reach(backend, compromised, mode, user):
    """The agent's memory is out of the code's reach (layer 1) and, in a cell, holds no
    sibling's request either (layer 2, read from outside as a compromised agent would):
    the cell's agent is a fork of the zygote, so the zygote (what every later cell
    inherits) and the cell's watcher must hold no request's secret at all, its own
    included (it travels host agent -> the cell's socket only, read after the fork)."""
    be = compromised if mode == "cell" else backend
    secrets = {}
    others = []
    for i in range(3):
        secrets[i] = f"sk-sibling-{i}-{os.urandom(6).hex()}"
        others.append(await be.create(hostile_spec(mode, "user" if i % 2 else "root",
                                                   environment_vars={"API_KEY": secrets[i]})))
    await others.pop(0).delete()  # one of them already gone
    own = f"sk-own-{os.urandom(6).hex()}"
    sb = await be.create(hostile_spec(mode, user, environment_vars={"API_KEY": own}))
    if mode == "cell":  # first: the attack below hands its agent the needles (its command line)
        host = sb.host.sandbox
        found = await attack(host, "readmem", sb.init_pid, own, *secrets.values())
        assert found["ok"] and found["value"] == [own], found  # its own request only
        watcher = await attack(host, "ppid", sb.init_pid)
        zygote = await attack(host, "ppid", watcher["value"])
        assert watcher["ok"] and zygote["ok"], (watcher, zygote)
        for pid in (watcher["value"], zygote["value"]):
            found = await attack(host, "readmem", pid, own, *secrets.values())
            assert found["ok"] and found["value"] == [], (pid, found)  # never read a request body
    assert_refused(await attack(sb, "readmem", agent_pid(sb, mode), "API_KEY"), "read /proc/<agent>/mem")
    for x in [sb, *others]:
        await x.delete()


# ------------------------------------------------------------------ layer 2: the host's checks
def protocol_attacks(victim_cell: int) -> dict[str, str]:
    return {
        "forged_for_sibling": lines_b64(*[forged_result(k, cell=victim_cell) for k in range(1, 30)]),
        "gone_for_sibling": lines_b64({"cell": victim_cell, "id": 0, "ev": "gone"}),
        "garbage": lines_b64(b"\x00\xffnot json {{\n"),
        "unsolicited_result": lines_b64(forged_result(9999)),
    }


@pytest.mark.parametrize("kind", ["forged_for_sibling", "gone_for_sibling", "garbage", "unsolicited_result"])
@pytest.mark.parametrize("mode", MODES)
async def test_bad_lines_end_only_their_sender(backend, compromised, mode, kind):
    be = compromised if mode == "cell" else backend
    spec = hostile_spec(mode)
    attacker, victim = await be.create(spec), await be.create(spec)
    running = asyncio.ensure_future(victim.exec(VICTIM))
    await asyncio.sleep(0.5)
    payload = protocol_attacks(getattr(victim, "cell_id", 0))[kind]
    # as the sandbox's code: refused (layer 1)
    assert_refused(await attack(attacker, "inject", agent_pid(attacker, mode), payload), "injection")
    if mode == "cell":  # as a compromised agent, on the cell's real channel (layer 2)
        done = await attack(attacker.host.sandbox, "inject", attacker.init_pid, payload)
        # ESRCH: the host ended the cell for the injected lines before the injector had restored
        # its agent (seen under parallel load); that the lines arrived is what the next check proves
        assert done["ok"] or done.get("errno") == errno.ESRCH, done
        with pytest.raises(SandboxNotRunning, match="broke the agent protocol"):
            for _ in range(50):
                await attacker.exec("true")
                await asyncio.sleep(0.1)
    else:
        assert (await attacker.exec("echo own")).stdout == "own\n"
    await assert_victim_unaffected(running)
    assert (await victim.exec("echo still-here")).stdout == "still-here\n"
    fresh = await be.create(spec)  # the host (or engine) still makes sandboxes
    assert (await fresh.exec("echo fresh")).stdout == "fresh\n"
    for x in (attacker, victim, fresh):
        await x.delete()


async def _rss_kb(host, pid: int) -> int:
    r = await host.exec(f"grep VmRSS /proc/{pid}/status")
    return int(r.stdout.split()[1])


@pytest.mark.serial  # a latency / deadline bound: run alone, not beside parallel workers
@pytest.mark.parametrize("mode", MODES)
async def test_a_flood_costs_the_host_bounded_memory_and_siblings_no_latency(backend, compromised, mode):
    """An endless line without a newline for FLOOD_SECONDS: a flooding cell is ended at its
    line limit and the test starts another, so the host sees a flood the whole time."""
    be = compromised if mode == "cell" else backend
    spec = hostile_spec(mode)
    victim = await be.create(spec)
    host = victim.host.sandbox if mode == "cell" else None
    host_pid = int(host.connection.hello["pid"]) if host else None
    before = await _rss_kb(host, host_pid) if host else 0
    peak, times, attackers, ended = before, [], 0, 0
    end = time.monotonic() + FLOOD_SECONDS
    while time.monotonic() < end:
        attacker = await be.create(spec)
        attackers += 1
        left = max(1.0, end - time.monotonic())
        if mode == "cell":
            flood = await host.start_process(["python3", "-c", ATTACK, "flood", str(attacker.init_pid), str(left)])
        else:  # a leftover of the rollout, trying to flood through its agent the whole time
            await attacker.write_file("/tmp/attack.py", ATTACK)
            flood = await attacker.start_process(
                f"end=$(($(date +%s) + {int(left)})); while [ $(date +%s) -lt $end ]; do "
                f"python3 /tmp/attack.py flood {agent_pid(attacker, mode)} 1 >> /tmp/flood.log; sleep 0.2; done")
        samples = len(times)
        while (await flood.poll()).running and (time.monotonic() < end or len(times) < samples + 20):
            t0 = time.perf_counter()
            r = await victim.exec("true")
            times.append(time.perf_counter() - t0)
            assert r.ok, r
            if host and len(times) % 20 == 0:
                peak = max(peak, await _rss_kb(host, host_pid))
            await asyncio.sleep(0.01)
        if mode == "cell":
            with pytest.raises(SandboxNotRunning, match="broke the agent protocol: a line over"):
                for _ in range(50):
                    await attacker.exec("true")
                    await asyncio.sleep(0.1)
            ended += 1
        else:
            await flood.wait(timeout=left + 60)
            tries = (await attacker.exec("cat /tmp/flood.log")).stdout.splitlines()
            assert tries, "the leftover never tried"
            for line in tries:
                assert_refused(json.loads(line), "flood injection")
            assert (await attacker.exec("echo own")).stdout == "own\n"
        await attacker.delete()
    if host:
        peak = max(peak, await _rss_kb(host, host_pid))
    p50 = statistics.median(times)
    print(f"flood {mode}: {FLOOD_SECONDS:.0f}s, {attackers} attackers ({ended} ended by the host), sibling exec "
          f"true p50 {p50 * 1000:.1f} ms max {max(times) * 1000:.0f} ms over {len(times)}, host agent RSS "
          f"{before // 1024} -> peak {peak // 1024} MiB")
    assert (peak - before) < 64 * 1024, (before, peak)
    assert p50 < 0.020, p50
    assert (await victim.exec("echo still-here")).stdout == "still-here\n"
    await victim.delete()


# ------------------------------------------------------------------ lifetime and what a cell sees
@pytest.mark.serial  # a latency / deadline bound: run alone, not beside parallel workers
@pytest.mark.parametrize("mode", MODES)
async def test_lifetime_holds_against_the_code(backend, compromised, mode):
    # a container's `timeout -s KILL` is within reach of its root code (SIGSTOP): the creating
    # process deletes the container at its labelled deadline + slack, from outside it
    lifetime = 15.0
    be = compromised if mode == "cell" else backend
    sb = await be.create(hostile_spec(mode, timeout_minutes=lifetime / 60))
    born = time.monotonic()
    assert_refused(await attack(sb, "alarm0", agent_pid(sb, mode)), "alarm(0) in the agent")
    # what the code can reach: stop every process it may signal, cancel timers where it can
    pid = agent_pid(sb, mode)
    await sb.exec(f"for p in $(ls /proc | grep -E '^[0-9]+$'); do [ $p != $$ ] && [ $p != {pid} ] && "
                  "kill -STOP $p; done 2>/dev/null; true", timeout=30)
    if mode == "cell":  # a compromised agent cancels any timer of its own: the watcher's is out of reach
        done = await attack(sb.host.sandbox, "alarm0", sb.init_pid)
        assert done["ok"], done
    while True:
        try:
            await asyncio.wait_for(sb.exec("true"), 10)
        except (SandboxNotRunning, Exception) as exc:  # noqa: BLE001 - any failure: the sandbox is gone
            if not isinstance(exc, asyncio.TimeoutError):
                break
        assert time.monotonic() - born < lifetime + 30, "the sandbox outlived its lifetime + 30 s"
        await asyncio.sleep(1)
    await sb.delete()


@pytest.mark.parametrize("mode", MODES)
async def test_no_sibling_ids_or_host_counters(backend, mode):
    spec = hostile_spec(mode)
    a, b = await backend.create(spec), await backend.create(spec)
    for path in ("/run/.vf-cells", "/run/.vf-cgroup"):
        assert (await a.exec(f"ls -A {path} 2>/dev/null; true")).stdout.strip() == "", path
    usage = "cat /sys/fs/cgroup/cpuacct/cpuacct.usage"
    burn = "python3 -c 'import time; e=time.time()+1.5\nwhile time.time()<e: pass\nprint(int(time.process_time()*1e9))'"
    a0 = int((await a.exec(usage)).stdout)
    b_cpu = int((await b.exec(burn)).stdout)
    a1 = int((await a.exec(usage)).stdout)
    assert a1 - a0 < 0.5 * b_cpu, ("a sibling's CPU time shows in this sandbox's counter", a1 - a0, b_cpu)
    a_cpu = int((await a.exec(burn)).stdout)
    assert int((await a.exec(usage)).stdout) - a1 >= 0.9 * a_cpu  # its own does
    await a.delete()
    await b.delete()
