"""Agent extension, appended to `program.py`'s source when the agent starts with
`--cells`: per-rollout *cells* inside one pooled "cell host" sandbox.

A cell is as fresh and isolated from other cells as a new container, made in
milliseconds: its own mount namespace whose root is a private overlay of the
host sandbox's image (writes go to a tmpfs of the cell and vanish with it,
fresh /dev, /dev/shm and /proc), its own PID, IPC, UTS and network namespaces
(loopback only), its own cgroup (pids, memory, cpu limits), its own
environment. Its processes hold no capability, run with no-new-privileges and
a seccomp filter that refuses namespace and mount syscalls, and run as the
sandbox's user. Inside, a copy of the agent serves the cell over a socket; the
host agent forwards every message tagged `"cell": N` to it.

Processes (all stdlib, Python 3.7+; every one of them non-dumpable, see
`not_dumpable` in program.py):

    host agent (root, the host container's capabilities)
      zygote       forked before any thread: single-threaded, so it can fork and
                   unshare safely; owns the cgroup mounts
        watcher    the cell init's parent (outside the cell): kills it on request and
                   at the cell's lifetime (its own alarm, out of the cell's reach)
          cell agent   PID 1 of the cell's PID namespace: a fork of the watcher (so of the
                       zygote), `main()` of program.py over the cell's socket, reaping the
                       cell's orphans; when it ends the kernel kills every process of the cell

Only the host agent and the zygote hold privilege; it is dropped in the cell
before the cell agent runs.

A cell starts clean by construction, at the price of a fork (not a fresh interpreter):
the zygote never reads a request body. The host agent hands it the cell's socket and
the cell's limits only (pids, memory, cpu, disk, shm, lifetime: `ZYGOTE_KEYS`); the
zygote names the cell by a serial of its own (never the host's cell id) and keeps only
{serial: (watcher pid, cgroup dirs)} of live cells, which the forked child clears. The
cell's own configuration (hostname, user, workdir, `environment_vars` with its secrets)
travels host agent -> that cell's socket only, and is read by the cell's init after the
fork, inside the cell (`read_own_conf`). So no process's memory that a cell inherits
ever held another cell's request; the host agent, which holds them all, is never
forked after it has read one (the zygote is forked before `main()`). The host agent trusts nothing a cell sends (`Cell`,
`Pump`): each line is parsed, checked against the requests it forwarded to that
cell, re-serialised with the id of the channel it came from and size-capped; a
cell that breaks the protocol is ended alone.

The threat model (what a cell's code can and cannot do, which layer holds each
attack, what is still weaker than a container): CELLS_THREAT_MODEL.md beside this
file; docs/isolation.md compares a cell with a container row by row.
"""

import array
import ctypes
import gc
import errno
import stat
import selectors
import fcntl
import pwd
import grp
import platform
import socket
import struct

HARDENING = 1
"""The hardening level this runtime reports in the host agent's hello ("hardening"), which
`rollout_isolation="auto"` requires (sandboxes.cells.AUTO_HARDENING) before it picks cells.
1: issue 24's defences (agents not dumpable, a cell's agent holding no other cell's request
(a fresh agent, since: a fork of a zygote that never reads a request body), identity from the
channel and every cell line checked, lifetime enforced by the watcher, siblings hidden).
Raise it with a defence the hostile suite proves (and the requirement with it)."""
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NS_FLAGS = 0x7E020000  # every CLONE_NEW* flag (as Docker's seccomp profile masks them)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 0x4000, 0x40000
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG, PR_CAP_AMBIENT = 38, 24, 1, 47
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
STAGE = "/run/.vf-cells"  # holds each cell's mount point <zygote serial> (its tmpfs lives in the cell's namespace)
CGROUP_BASE = "/run/.vf-cgroup"  # the zygote's writable cgroup mounts (private to the zygote's namespace)
LAYERS = "/run/.vf-layers"  # frozen cell layers (snapshots): a tmpfs of the host's, mounted before the zygote forks
CONTROLLERS = ("pids", "memory", "cpu", "cpuacct")  # cpuacct: the cell's CPU counters are its own
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "timer_stats", "acpi", "scsi")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class CellSetupError(Exception):
    kind = "internal"


class CellsUnsupported(Exception):
    """This sandbox cannot host cells (no capability, no cgroup): a usage error."""
    kind = "usage"


def _enc(text):
    return None if text is None else text.encode()


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def mount(src, target, fstype, flags=0, data=None):
    _check(_libc.mount(_enc(src), _enc(target), _enc(fstype), flags, _enc(data)),
           "mount %s on %s" % (fstype or src, target))


def prctl(option, arg2=0, arg3=0, arg4=0, arg5=0):
    _check(_libc.prctl(option, arg2, arg3, arg4, arg5), "prctl(%d)" % option)


def unshare(flags):
    _check(_libc.unshare(flags), "unshare(%#x)" % flags)


def make_private():
    """Stop mount events propagating between this namespace and the host sandbox's
    (gVisor has no recursive propagation change; its mounts are private already)."""
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError:
        mount(None, "/", None, MS_PRIVATE)


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


# ------------------------------------------------------------------ cgroups
def setup_cgroups():
    """Writable mounts of the host sandbox's own cgroup per controller, in the
    zygote's private mount namespace: {controller: dir}. runc bind-mounts each
    controller read-only (our own cgroup as root); gVisor mounts none, so a fresh
    cgroupfs is mounted there."""
    paths = {}
    for ctl in CONTROLLERS:
        target = os.path.join(CGROUP_BASE, ctl)
        os.makedirs(target, exist_ok=True)
        source = "/sys/fs/cgroup/" + ctl
        try:
            if os.path.isfile(os.path.join(source, "cgroup.procs")):
                mount(source, target, None, MS_BIND)
                mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            else:
                mount("cgroup", target, "cgroup", MS_NOSUID | MS_NODEV | MS_NOEXEC, ctl)
            paths[ctl] = target
        except OSError as exc:
            log("cells: no %s cgroup (%s)" % (ctl, exc))
    return paths


def make_cgroup(cgroups, name):
    """The cell's cgroup in each controller, no limit yet (`limit_cgroup`): {controller: dir}."""
    made = {}
    for ctl, base in cgroups.items():
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except FileExistsError:  # controllers co-mounted (cpu,cpuacct): one directory
            pass
        made[ctl] = path
    return made


def limit_cgroup(made, conf):
    """Write the cell's limits into its cgroup dirs (`make_cgroup`), before any code of the
    cell runs."""
    for ctl, path in made.items():
        if ctl == "pids":
            write_text(path + "/pids.max", str(int(conf["pids_limit"])))
        elif ctl == "memory":
            limit = str(int(conf["memory_bytes"]))
            write_text(path + "/memory.limit_in_bytes", limit)
            if os.path.exists(path + "/memory.memsw.limit_in_bytes"):
                try:
                    write_text(path + "/memory.memsw.limit_in_bytes", limit)
                except OSError:
                    pass
        elif ctl == "cpu" and conf.get("cpu_cores"):
            try:
                write_text(path + "/cpu.cfs_period_us", "100000")
                write_text(path + "/cpu.cfs_quota_us", str(max(1000, int(conf["cpu_cores"] * 100000))))
            except OSError:
                pass  # gVisor's cpu controller has no CFS files


def join_cgroups(paths):
    for path in paths:
        write_text(path + "/cgroup.procs", str(os.getpid()))


def remove_cgroups(paths, within=5.0):
    end = time.monotonic() + within
    for path in paths:
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > end:
                    log("cells: cannot remove cgroup %s" % path)
                    break
                time.sleep(0.005)


# ------------------------------------------------------------------ filesystem
def build_root(conf):
    """The cell's root: an overlay of the host sandbox's root filesystem whose writes
    go to a tmpfs of the cell; fresh /dev, /dev/shm and /dev/mqueue; /sys read-only."""
    root = _mount_overlay_root(conf)
    _mount_dev(root + "/dev", conf)
    sys_dir = root + "/sys"
    _mount_sys(sys_dir, conf)
    for path in (STAGE, CGROUP_BASE, LAYERS):  # siblings' cell ids (mount points), cgroup mounts, frozen layers
        if os.path.isdir(root + path):
            hide(root + path)
    return root


def _mount_overlay_root(conf):
    """The overlay (frozen layers, newest first, over the image; writes to the cell's
    tmpfs at its own stage) the cell's root is; a fresh /tmp where gVisor cannot list it."""
    # a mount point of its own: gVisor has no recursive propagation change, so mounts made
    # while cells are set up side by side must never meet at one path
    stage = conf["stage"]
    mount("tmpfs", stage, "tmpfs", MS_NOSUID, "mode=755,size=%d" % int(conf["disk_bytes"]))
    for d in ("upper", "work", "root"):
        os.mkdir(os.path.join(stage, d))
    root = stage + "/root"
    lower = ":".join(list(reversed(conf.get("lower") or [])) + ["/"])  # frozen layers (newest first) over the image
    mount("overlay", root, "overlay", 0,
          "lowerdir=%s,upperdir=%s/upper,workdir=%s/work" % (lower, stage, stage))
    try:
        os.listdir(root + "/tmp")
    except FileNotFoundError:
        pass
    except OSError:  # gVisor's overlay cannot list the image's /tmp (an opaque directory): a fresh one
        mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=1777,size=%d" % int(conf["disk_bytes"]))
    return root


def _mount_dev(dev, conf):
    """A fresh /dev: a small tmpfs with the DEVICES bound from the host sandbox's, /dev/shm,
    a new devpts instance where the kernel allows it, and the fd / stdio links."""
    os.makedirs(dev, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(dev + "/" + name, "w").close()
            mount("/dev/" + name, dev + "/" + name, None, MS_BIND)
    os.mkdir(dev + "/shm", 0o1777)
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV,
          "mode=1777,size=%d" % int(conf["shm_bytes"]))
    os.mkdir(dev + "/pts")
    try:
        mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        os.symlink("pts/ptmx", dev + "/ptmx")
    except OSError:
        pass
    os.symlink("/proc/self/fd", dev + "/fd")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink("/proc/self/fd/%d" % i, dev + "/" + name)


def _mount_sys(sys_dir, conf):
    """/sys read-only; in its cgroup tree the cell sees its own cgroups (limits, OOM
    counter), read-only, and every other controller of the host sandbox hidden."""
    os.makedirs(sys_dir, exist_ok=True)
    try:
        mount("/sys", sys_dir, None, MS_BIND | MS_REC)  # runc: keeps its read-only mounts and masks
    except OSError:
        mount("sysfs", sys_dir, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    own = set()
    for path in conf["cgroups"]:  # the cell sees its own cgroup (limits, OOM counter), read-only
        ctl = os.path.basename(os.path.dirname(path))
        target = sys_dir + "/fs/cgroup/" + ctl
        if os.path.isdir(target):
            readonly_bind(path, target)
            own.add(ctl)
    cg_dir = sys_dir + "/fs/cgroup"
    try:
        others = [n for n in os.listdir(cg_dir) if n not in own and os.path.isdir(cg_dir + "/" + n)]
    except OSError:
        others = []
    for name in others:  # the host sandbox's counters (blkio, cpuset, ...): not the cell's to read
        hide(cg_dir + "/" + name)


def hide(path):
    """An empty read-only tmpfs over `path` (in the cell's mount namespace only)."""
    try:
        mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=555")
    except OSError as exc:
        log("cells: cannot hide %s (%s)" % (path, exc))


def readonly_bind(path, target=None):
    target = target or path
    try:
        mount(path, target, None, MS_BIND | MS_REC)
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass  # gVisor: its /proc/sys is the sandbox kernel's, not the host's, and mostly read-only


def mount_proc(root):
    """A /proc showing only the cell's processes, with the host sandbox's protections
    (read-only /proc/sys and friends, masked kernel files)."""
    proc = root + "/proc"
    os.makedirs(proc, exist_ok=True)
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READONLY:
        if os.path.exists(proc + "/" + name):
            readonly_bind(proc + "/" + name)
    for name in PROC_MASKED:
        path = proc + "/" + name
        if os.path.isdir(path):
            try:
                mount("tmpfs", path, "tmpfs", MS_RDONLY, "size=0")
            except OSError:
                pass
        elif os.path.exists(path):
            try:
                mount("/dev/null", path, None, MS_BIND)
            except OSError:
                pass


def enter_root(root):
    """Make `root` the cell's `/`: move it over the old root and chroot (runc: Docker's
    seccomp profile refuses pivot_root), or just chroot where the move is refused
    (gVisor). Either way no process of the cell holds a descriptor or has a working
    directory outside it, and none has the capability (or the syscall, see
    seccomp_program) to chroot or mount again, so the old root is unreachable."""
    os.chdir(root)
    try:
        mount(root, "/", None, MS_MOVE)
    except OSError:
        pass
    os.chroot(".")
    os.chdir("/")


def loopback_up():
    """Bring `lo` up in the cell's network namespace (a container with no network has it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
    except OSError as exc:
        log("cells: loopback stays down (%s)" % exc)
    finally:
        s.close()


# ------------------------------------------------------------------ privileges
# syscalls a cell may not make (the host sandbox's seccomp profile allows them
# because the host holds CAP_SYS_ADMIN; a container without it is refused them)
_DENY = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
               "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
                "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
                "userfaultfd": 282},
}
_NEW_MOUNT_API = (428, 429, 430, 431, 432, 433, 442)  # open_tree .. fspick, mount_setattr (every arch)
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
_RET_ALLOW, _RET_KILL, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def seccomp_program():
    """A classic-BPF seccomp filter: namespace, mount, keyring and bpf syscalls → EPERM,
    clone with a CLONE_NEW* flag → EPERM, clone3 → ENOSYS (libc falls back to clone)."""
    arch = platform.machine()
    if arch not in _DENY:
        raise CellSetupError("cells need an x86_64 or aarch64 sandbox (this one is %s)" % arch)
    deny = sorted(set(_DENY[arch].values()) | set(_NEW_MOUNT_API))
    ins = []

    def op(code, k, jt=0, jf=0):
        ins.append((code, jt, jf, k))

    op(_BPF_LD_W_ABS, 4)  # seccomp_data.arch
    op(_BPF_JEQ_K, _AUDIT_ARCH[arch], 1, 0)
    op(_BPF_RET_K, _RET_KILL)
    op(_BPF_LD_W_ABS, 0)  # seccomp_data.nr
    if arch == "x86_64":  # the x32 ABI's numbers
        op(_BPF_JGE_K, 0x40000000, 0, 1)
        op(_BPF_RET_K, _RET_ERRNO | _EPERM)
    for nr in deny:
        op(_BPF_JEQ_K, nr, 0, 1)
        op(_BPF_RET_K, _RET_ERRNO | _EPERM)
    op(_BPF_JEQ_K, _CLONE3, 0, 1)
    op(_BPF_RET_K, _RET_ERRNO | _ENOSYS)
    op(_BPF_JEQ_K, _CLONE[arch], 0, 3)
    op(_BPF_LD_W_ABS, 16)  # args[0], low 32 bits (little endian): the clone flags
    op(_BPF_JSET_K, CLONE_NS_FLAGS, 0, 1)
    op(_BPF_RET_K, _RET_ERRNO | _EPERM)
    op(_BPF_RET_K, _RET_ALLOW)
    return ins


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_seccomp = []  # [the filter's instructions as bytes, their count]: `prepare_seccomp`


def prepare_seccomp():
    """Build the filter (`seccomp_program`) into the bytes the kernel takes. The zygote does
    it once, before any cell: every cell installs the same filter, and building it (~0.4 ms
    of Python in a fresh fork) is then off each cell's path. Where there is no filter (an
    unsupported architecture) nothing is kept and each cell's `install_seccomp` fails."""
    ins = seccomp_program()
    buf = (ctypes.c_ubyte * (8 * len(ins)))()
    for i, (code, jt, jf, k) in enumerate(ins):
        struct.pack_into("HBBI", buf, 8 * i, code, jt, jf, k)
    _seccomp[:] = [buf, len(ins)]


def install_seccomp():
    if not _seccomp:
        prepare_seccomp()
    buf, count = _seccomp
    prog = SockFprog(count, ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp filter")


def resolve_user(user):
    """(uid, gid, groups) for "name", "uid" or "uid:gid", read in the cell's own /etc."""
    name, _, group = str(user).partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid, home, uname = entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_name
    except KeyError:
        if not name.isdigit():
            raise CellSetupError("user %r does not exist in the image" % name)
        uid, gid, home, uname = int(name), int(name), "/", None
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    groups = [gid]
    if uname:
        groups += [g.gr_gid for g in grp.getgrall() if uname in g.gr_mem and g.gr_gid != gid]
    return uid, gid, groups, home


def drop_privileges(user):
    """Become `user` (if given), then hold no capability at all (bounding, ambient,
    effective, permitted, inheritable), set no-new-privileges and the seccomp filter."""
    for cap in range(64):  # first, while still root with CAP_SETPCAP
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == 22:
                break  # EINVAL: past the last capability the kernel knows
            raise CellSetupError("cannot empty the capability bounding set (the host needs CAP_SETPCAP)")
    if user:
        uid, gid, groups, home = resolve_user(user)
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
        os.environ.setdefault("HOME", home)
    else:
        try:
            os.environ.setdefault("HOME", pwd.getpwuid(os.getuid()).pw_dir)
        except KeyError:
            os.environ.setdefault("HOME", "/")
    _libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL; old kernels lack it
    header = struct.pack("Ii", 0x20080522, 0)
    data = ctypes.create_string_buffer(24)  # two zeroed __user_cap_data_struct
    _check(_libc.capset(ctypes.c_char_p(header), data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    install_seccomp()


# ------------------------------------------------------------------ one cell
def keep_only_fds(keep):
    """Close every descriptor but `keep`; 0-2 point at /dev/null (the zygote's are the
    host agent's channel: a cell must never hold them)."""
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted(set(keep) | {0, 1, 2})
    for lo, hi in zip(keep, keep[1:] + [65536]):
        os.closerange(lo + 1, hi)


def spare_child(paths, stage, ctl, report, alive, inherited):
    """A cell's first child forked before its request (`_make_spare`): it forgets the
    zygote's bookkeeping of the live cells (`inherited`), joins the cell's cgroup (its
    limits are written by the zygote before the request reaches it: no code of the cell
    runs before), then waits on `ctl` for the cell's limits and socket. Joining a cgroup
    waits for an RCU grace period on cgroup v1 (~10 ms on a quiet machine): done here, it
    is off the path of the next `cell_open`. EOF on `ctl`: no cell for it, it exits."""
    inherited.clear()
    keep_only_fds([ctl, report, alive])
    join_cgroups(paths)
    chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, ctl)
    try:
        conf, fds = _recv(chan)
    finally:
        chan.close()
    if conf is None or len(fds) != 1:
        os._exit(0)
    conf["cgroups"], conf["stage"] = paths, stage
    cell_first_child(conf, fds[0], report, alive)


def cell_first_child(conf, sock_fd, report, alive):
    """Runs in the cell's spare child of the zygote, in the cell's cgroup: namespaces,
    filesystem; then forks the cell's PID 1 and reports its pid (as seen by the host agent)
    with a descriptor of the cell's upper layer (what `cell_snapshot` freezes; the cell's
    tmpfs lives in the cell's mount namespace only). It holds `alive` open until the cell is
    gone (EOF there tells the host agent so)."""
    keep_only_fds([sock_fd, report, alive])
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET)
    make_private()
    root = build_root(conf)
    upper = os.open(conf["stage"] + "/upper", os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid:
        watch_cell(pid, sock_fd, report, conf["lifetime"], upper)
    os.close(upper)  # outside the cell's root: never held by a process of the cell
    os.close(alive)
    cell_init(conf, sock_fd, report, root)


def watch_cell(init, sock_fd, report, lifetime, upper):
    """The zygote's child stays as the cell init's parent: SIGTERM (from the zygote, or
    when the zygote dies) or the cell's lifetime (an alarm of the watcher: outside the
    cell's PID namespace, so nothing in the cell can see, trace or cancel it) kills the
    init, which takes the cell down; then it exits. Only a parent can kill by pid
    without racing pid reuse. It reports the init's pid with the `upper` descriptor."""
    line = ("pid %d\n" % init).encode()
    report_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, report)
    try:
        report_sock.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [upper]))])
    finally:
        report_sock.detach()
    os.close(upper)
    os.close(report)
    os.close(sock_fd)

    def kill_init(*_):
        try:
            os.kill(init, signal.SIGKILL)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, kill_init)
    signal.signal(signal.SIGALRM, kill_init)
    signal.alarm(max(1, int(lifetime)))
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    if os.getppid() == 1:  # the zygote died before the line above
        kill_init()
    while True:
        try:
            os.waitpid(init, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        break
    os._exit(0)


def read_own_conf(sock_fd):
    """The cell's own configuration (hostname, user, workdir, env): one line the host agent
    writes on the cell's socket, and nothing follows it before the agent's hello."""
    data = b""
    while not data.endswith(b"\n"):
        piece = os.read(sock_fd, 65536)
        if not piece:
            raise CellSetupError("the host agent sent no configuration for the cell")
        data += piece
    return json.loads(data)


def cell_init(conf, sock_fd, report, root):
    """PID 1 of the cell: finish the filesystem, read the cell's own configuration from
    its socket (the zygote never held it), drop privilege, then serve as the cell's agent.
    Its memory is the zygote's (which never read a request body: limits and its own
    bookkeeping, cleared in `cell_first_child`) plus its own configuration. When the agent
    ends, for whatever reason, the whole cell ends; its lifetime is the watcher's."""
    mount_proc(root)
    enter_root(root)
    own = read_own_conf(sock_fd)
    socket.sethostname(own["hostname"])
    loopback_up()
    workdir = own.get("workdir") or "/"
    os.makedirs(workdir, exist_ok=True)  # as Docker does for a container's working directory
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "HOSTNAME")}
    env["HOSTNAME"] = own["hostname"]
    env.update(own["env"])
    os.environ.clear()
    os.environ.update(env)
    drop_privileges(own.get("user"))
    os.chdir(workdir)
    os.write(report, b"ok\n")
    os.close(report)
    os.dup2(sock_fd, 0)
    os.dup2(sock_fd, 1)
    os.closerange(3, 65536)
    del own, env
    threading.Thread(target=reap_orphans, daemon=True).start()
    try:
        main()  # non-dumpable again (main): setuid reset the flag
    finally:
        os._exit(0)


def agent_children():
    """Pids the agent itself waits for (its commands and background processes)."""
    with _procs_lock:
        pids = set(_procs)
    return pids | set(_groups)


def reap_orphans(interval=0.2):
    """As the cell's PID 1 the agent inherits every orphan of the cell: reap the zombies
    that are not its own children (peeked at with WNOWAIT, so a command's status is never
    taken from the code that waits for it)."""
    while True:
        time.sleep(interval)
        with _spawn_lock:  # a command between its fork and its registration: next round (program.py)
            if _spawning[0]:
                continue
            while True:
                try:
                    info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:
                    break
                if info is None or info.si_pid in agent_children():
                    break  # none, or the agent's own: reaped where it is waited for
                try:
                    os.waitpid(info.si_pid, 0)
                except ChildProcessError:
                    pass


# ------------------------------------------------------------------ zygote
def _recv(sock):
    """One message line and the fds passed with it: (message, [fd, ...]); (None, []) at EOF."""
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        msg, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(4 * fds.itemsize))
        if not msg:
            return None, []
        data += msg
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _send(sock, msg, fds=()):
    data = (json.dumps(msg) + "\n").encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", list(fds)))])
    else:
        sock.sendall(data)


def _reap(cells, spares):
    """Reap watchers whose cell ended by itself (lifetime, agent exit) and free their cgroups;
    a spare that died is marked so (its pid is never signalled again)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for spare in spares:
            if spare["pid"] == pid:
                spare["pid"] = None
        for cell, (watcher, paths) in list(cells.items()):
            if watcher == pid:
                del cells[cell]
                _free(cell, paths)


def zygote_main(sock):
    """Serve open/close requests from the host agent, one at a time."""
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)  # the host agent's channel: never inherited by a cell
    os.dup2(null, 1)
    os.close(null)
    cgroups, problem = _zygote_prepare()
    cells = {}  # the zygote's serial of a live cell -> (watcher pid, cgroup dirs): nothing else
    spares = []  # at most one `_make_spare` while cells are live (none left once all are closed)
    while True:
        ready, _, _ = select.select([sock], [], [], 0.1)
        _reap(cells, spares)
        if spares and not cells:
            _discard(spares.pop())
        if not ready:
            continue
        try:
            req, fds = _recv(sock)
        except (OSError, ValueError):
            req, fds = None, []
        if req is None:
            break
        _serve_request(sock, req, fds, problem, cgroups, cells, spares)
        if not problem and cells and not spares:  # the next open's first child, ahead of its request
            try:
                spares.append(_make_spare(cgroups, cells, spares))
            except Exception as exc:
                log("cells: no spare cell child (%r)" % exc)
    while spares:
        _discard(spares.pop())
    for cell, (watcher, paths) in list(cells.items()):  # the host agent is gone: so are its cells
        _kill_wait(watcher)
        _free(cell, paths)
    os._exit(0)


def _zygote_prepare():
    """The zygote's own mount namespace, the cells' cgroups and seccomp filter: (cgroups,
    why no cell can be opened or None); a filter that cannot be made is reported by each cell."""
    cgroups = {}
    problem = None
    try:
        unshare(CLONE_NEWNS)
        make_private()
        cgroups = setup_cgroups()
        missing = [c for c in ("pids", "memory") if c not in cgroups]
        if missing:
            problem = "no writable %s cgroup for cell limits" % " / ".join(missing)
    except OSError as exc:
        problem = "cannot prepare cells: %s (the host sandbox needs CAP_SYS_ADMIN)" % exc
    try:
        prepare_seccomp()
    except CellSetupError:
        pass  # each cell reports it (install_seccomp)
    return cgroups, problem


def _serve_request(sock, req, fds, problem, cgroups, cells, spares):
    """Answer one request of the host agent (open, freeze / drop, close); any failure is
    its reply. The fd it came with is closed, the fds sent with the reply too."""
    fd = fds[0] if fds else None
    out_fds = []
    try:
        if req["op"] == "open":
            if problem:
                raise CellsUnsupported(problem)
            reply, out_fds = _open_cell(req, fd, cgroups, cells, spares)
        elif req["op"] in ("freeze", "drop"):
            reply, out_fds = _layer_job(req, fd)
        else:
            reply = _close_cell(req["handle"], cells)
    except Exception as exc:
        reply = {"error": "%s: %s" % (type(exc).__name__, exc), "kind": getattr(exc, "kind", "internal")}
    finally:
        if fd is not None:
            os.close(fd)
    _send(sock, reply, out_fds)
    for out_fd in out_fds:
        os.close(out_fd)


_serial = [0]


def _make_spare(cgroups, cells, spares):
    """Fork a cell's first child ahead of its request (`spare_child`): its serial, cgroup
    dirs (no limit yet) and stage, and the zygote's ends of its channels."""
    _serial[0] += 1
    cell = _serial[0]
    made = make_cgroup(cgroups, "vf-cell-%d" % cell)
    stage = "%s/%d" % (STAGE, cell)
    os.makedirs(stage, exist_ok=True)
    ctl, ctl_child = socket.socketpair()
    r, w = (s.detach() for s in socket.socketpair())  # a socket: the watcher passes the upper layer's fd on it
    alive_r, alive_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        ctl.close()
        for x in (ctl_child.detach(), r, w, alive_r, alive_w):
            os.close(x)
        _free(cell, list(made.values()))
        raise
    if pid == 0:
        try:
            ctl.close()
            os.close(r)
            os.close(alive_r)
            del spares[:]
            spare_child(list(made.values()), stage, ctl_child.detach(), w, alive_w, cells)
        except BaseException as exc:
            report_failure(w, exc)
        finally:
            os._exit(1)
    ctl_child.close()
    os.close(w)
    os.close(alive_w)
    return {"serial": cell, "pid": pid, "made": made, "ctl": ctl, "report": r, "alive": alive_r}


def _discard(spare):
    """End a spare no cell took (SIGKILL: it runs no code of a cell) and free what it held."""
    spare["ctl"].close()
    os.close(spare["report"])
    os.close(spare["alive"])
    if spare["pid"] is not None:
        _kill_wait(spare["pid"], signal.SIGKILL)
    _free(spare["serial"], list(spare["made"].values()))


def _open_cell(req, fd, cgroups, cells, spares):
    """Hand the cell to a spare first child (`_make_spare`: made now when none is ready)
    and return at once: ({"watcher": pid, "handle": serial}, [the read end of its report
    socket, the read end of a pipe the watcher holds until the cell is gone]). The host
    agent's request threads read them (cells are built and torn down in parallel; the
    zygote only forks and signals). `req` holds the cell's limits only (ZYGOTE_KEYS); the
    cell is named by the zygote's own serial."""
    conf = {k: req["conf"][k] for k in ZYGOTE_KEYS}
    conf["lower"] = [str(d) for d in req["conf"].get("lower") or []]
    for d in conf["lower"]:
        if os.path.dirname(d) != LAYERS or not os.path.basename(d).isalnum():
            raise CellSetupError("not a layer directory: %r" % d)
    spare = spares.pop() if spares else None
    if spare is None or spare["pid"] is None:  # none ready, or it died: a fresh one
        if spare is not None:
            _discard(spare)
        spare = _make_spare(cgroups, cells, spares)
    try:
        limit_cgroup(spare["made"], conf)  # before the child reads its request: no code of the cell ran yet
        _send(spare["ctl"], conf, [fd])
    except BaseException:
        _discard(spare)
        raise
    spare["ctl"].close()
    paths = list(spare["made"].values())
    cells[spare["serial"]] = (spare["pid"], paths)
    return {"watcher": spare["pid"], "handle": spare["serial"]}, [spare["report"], spare["alive"]]


def report_failure(fd, exc):
    """A forked child's last word on its report channel: "error <Type>: <message>"."""
    try:
        os.write(fd, ("error %s: %s\n" % (type(exc).__name__, exc)).encode())
    except OSError:
        pass


def read_until_eof(fd, timeout, what):
    """Everything written on `fd` (a socket; closed here) until EOF, and the descriptors
    passed with it: (lines, [fd, ...]). CellSetupError after `timeout` seconds."""
    out, fds = b"", array.array("i")
    end = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise CellSetupError("%s was not ready within %.0fs" % (what, timeout))
            piece, anc, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(4 * fds.itemsize))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            if not piece:
                break
            out += piece
    except BaseException:
        for x in fds:
            os.close(x)
        raise
    finally:
        sock.close()
    return out.decode("utf-8", "replace").splitlines(), list(fds)


def report_error(lines):
    """The error a child reported ("error <Type>: <message>"), or None."""
    errors = [x[6:] for x in lines if x.startswith("error ")]
    return errors[0].split(": ", 1)[-1] if errors else None


def read_report(fd, timeout):
    """The cell's setup report: (its init's pid, a descriptor of its upper layer) once every
    step succeeded (CellSetupError otherwise)."""
    lines, fds = read_until_eof(fd, timeout, "the cell")
    error = report_error(lines)
    if error or "ok" not in lines or len(fds) != 1:
        for x in fds:
            os.close(x)
        raise CellSetupError(error or "the cell did not start (%r)" % lines[-3:])
    return next((int(x.split()[1]) for x in lines if x.startswith("pid ")), None), fds[0]


def _kill_wait(watcher, sig=signal.SIGTERM):
    """Take a cell down through its watcher (the zygote's own child: no pid reuse race);
    the watcher returns once the cell's init, and with it every process of the cell, is gone."""
    try:
        os.kill(watcher, sig)
        os.waitpid(watcher, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _close_cell(cell, cells):
    """Signal the cell's watcher and answer at once (the host agent waits for the cell
    to be gone on its own pipe; `_reap` frees what is left once the watcher exits)."""
    entry = cells.get(int(cell))
    if entry is None:
        return {"closed": False}
    try:
        os.kill(entry[0], signal.SIGTERM)  # not reaped yet: the pid is still the watcher's
    except ProcessLookupError:
        pass
    return {"closed": True}


def _free(cell, paths):
    """What a gone cell leaves in the host sandbox: its cgroups and its mount point."""
    remove_cgroups(paths)
    try:
        os.rmdir("%s/%d" % (STAGE, int(cell)))
    except OSError:
        pass


# ------------------------------------------------------------------ layers (snapshots of cells)
LAYER_XATTRS = ("trusted.overlay.opaque", "trusted.overlay.redirect")
"""The overlay's own marks a frozen directory keeps (opaque, renamed); with whiteouts (0/0
character devices, copied as such) a layer stacked as a lowerdir means what the cell's
upper layer meant over the image."""
MAX_DEPTH = 400  # directory levels a frozen layer may hold (the copy recurses)
MAX_CHAIN = 32  # layers a cell may stack (a fork of a fork of ...)
LAYER_JOB_SECONDS = 600  # a freeze or drop still running after this is killed


class LayerTooLarge(Exception):
    kind = "too_large"


def _xattrs(fd, is_dir):
    """The extended attributes a frozen copy keeps: user.* and, on a directory, LAYER_XATTRS."""
    try:
        names = os.listxattr(fd)
    except OSError:
        return []
    out = []
    for name in names:
        if name.startswith("user.") or (is_dir and name in LAYER_XATTRS):
            try:
                out.append((name, os.getxattr(fd, name)))
            except OSError:
                pass
    return out


SMALL_FILE = 1 << 20  # a file this small is copied in one go (its holes, if any, are not worth a lookup)


def _copy_data(src, dst, size, budget):
    """Copy a file's data, holes kept where the filesystem reports them (SEEK_DATA; gVisor's
    tmpfs does not, and charges a hole as data: all of it is copied); bytes copied."""
    if size <= SMALL_FILE:
        if size > budget:
            raise LayerTooLarge("the cell's files exceed its disk limit")
        done = 0
        while done < size:
            n = os.sendfile(dst, src, done, size - done)
            if n == 0:
                break  # the file shrank while it was read
            done += n
        return done
    os.ftruncate(dst, size)
    done, pos = 0, 0
    while pos < size:
        try:
            start = os.lseek(src, pos, os.SEEK_DATA)
            stop = min(size, os.lseek(src, start, os.SEEK_HOLE))
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole after pos
            start, stop = pos, size
        if done + stop - start > budget:
            raise LayerTooLarge("the cell's files exceed its disk limit")
        os.lseek(dst, start, os.SEEK_SET)
        while start < stop:
            n = os.sendfile(dst, src, start, stop - start)
            if n == 0:
                return done  # the file shrank while it was read
            start += n
            done += n
        pos = stop
    return done


def _freeze_dir(dfd, here, seen, left, depth):
    """Copy the entries of the directory open at `dfd` into `here` (made by the caller);
    bytes of data copied. Each entry is looked at without following a link and opened
    relative to `dfd` with O_NOFOLLOW, its kind checked on what was opened."""
    if depth > MAX_DEPTH:
        raise LayerTooLarge("the cell's files are nested more than %d directories deep" % MAX_DEPTH)
    used = 0
    with os.scandir(dfd) as it:
        entries = list(it)
    for entry in entries:
        name, dst = entry.name, os.path.join(here, entry.name)
        try:
            mode, st = _entry_kind(entry)
        except FileNotFoundError:
            continue  # removed while it was read
        if stat.S_ISDIR(mode):
            used += _freeze_subdir(dfd, name, dst, seen, left - used, depth)
        elif stat.S_ISREG(mode):
            used += _freeze_file(dfd, name, dst, seen, left - used)
        else:
            _freeze_special(dfd, name, dst, mode, st)
    return used


def _entry_kind(entry):
    """(mode, lstat or None): a directory or a file is told by the entry's type (no lstat),
    then fstat'd once opened; anything else is lstat'ed here."""
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR, None
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG, None
    st = entry.stat(follow_symlinks=False)
    return st.st_mode, st


def _freeze_subdir(dfd, name, dst, seen, left, depth):
    """Copy the directory `name` of `dfd` (opened with O_NOFOLLOW) to the new `dst`, its
    xattrs, owner, mode and times; bytes of data copied (0 if it was replaced meanwhile)."""
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError:
        return 0  # replaced by something else while it was read
    try:
        st = os.fstat(sub)
        os.mkdir(dst, 0o700)
        for key, value in _xattrs(sub, True):
            os.setxattr(dst, key, value)
        used = _freeze_dir(sub, dst, seen, left, depth + 1)
    finally:
        os.close(sub)
    os.chown(dst, st.st_uid, st.st_gid)
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    return used


def _freeze_file(dfd, name, dst, seen, left):
    """Copy the regular file `name` of `dfd` (opened with O_NOFOLLOW, checked regular once
    open) to the new `dst`, or link it to its copy when it is a hard link `seen` already;
    bytes of data copied."""
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dfd)
    except OSError:
        return 0
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return 0
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in seen:  # a hard link stays one (never copied twice)
            os.link(seen[key], dst)
            return 0
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            used = _copy_data(src, out, st.st_size, left)
            for k, value in _xattrs(src, False):
                os.setxattr(out, k, value)
            if st.st_uid or st.st_gid:  # the copy is root's already
                os.fchown(out, st.st_uid, st.st_gid)
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
        if st.st_nlink > 1:
            seen[key] = dst
        return used
    finally:
        os.close(src)


def _freeze_special(dfd, name, dst, mode, st):
    """Copy a symbolic link (its target, never followed), a whiteout or a FIFO to `dst`;
    sockets, and device nodes (which nothing in a cell can make), are not carried."""
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(name, dir_fd=dfd)
        except OSError:
            return
        os.symlink(target, dst)
        os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    elif stat.S_ISCHR(mode) and st.st_rdev == 0:  # a whiteout: the file is deleted in this layer
        os.mknod(dst, stat.S_IFCHR, 0)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(dst, 0o600)
        os.chown(dst, st.st_uid, st.st_gid)
        os.chmod(dst, stat.S_IMODE(mode))


def freeze(upper, dest, budget):
    """Copy a cell's upper layer (the directory open at `upper`: the cell's writes, its
    whiteouts and opaque directories) into the new directory `dest`, never changed again:
    bytes of data copied. The tree is the cell's and may change while it is read: no link
    is followed, hard links stay links, holes stay holes (where the filesystem says where
    they are), and more than `budget` bytes of data (the cell's disk limit) fail the copy."""
    os.mkdir(dest, 0o755)
    return _freeze_dir(upper, dest, {}, budget, 0)


def drop_tree(path):
    """Remove a layer directory (the host's own copy: no link in it is followed)."""
    def empty(dfd):
        with os.scandir(dfd) as it:
            entries = list(it)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                try:
                    empty(sub)
                finally:
                    os.close(sub)
                os.rmdir(entry.name, dir_fd=dfd)
            else:
                os.unlink(entry.name, dir_fd=dfd)

    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        empty(top)
    finally:
        os.close(top)
    os.rmdir(path)


def _layer_job(req, fd):
    """Fork a child of the zygote (single-threaded, holding no request body, outside every
    cell, in the namespace where the layers tmpfs is mounted) to freeze a cell's upper layer
    (`fd`) into `req["dest"]` or drop a layer directory, so the copy costs the host agent no
    CPU; returns its report socket: "ok <bytes>" or "error <Type>: <message>" at its end."""
    dest = req["dest"]
    if os.path.dirname(dest) != LAYERS or not os.path.basename(dest).isalnum():
        raise CellSetupError("not a layer directory: %r" % dest)
    r, w = (x.detach() for x in socket.socketpair())
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            keep_only_fds([w] + ([fd] if fd is not None else []))
            os.umask(0)  # modes are copied as they are
            signal.alarm(LAYER_JOB_SECONDS)
            if req["op"] == "freeze":
                try:
                    done = freeze(fd, dest, int(req["budget"]))
                except BaseException:
                    drop_tree(dest)
                    raise
            else:
                drop_tree(dest)
                done = 0
            os.write(w, ("ok %d\n" % done).encode())
        except BaseException as exc:
            report_failure(w, exc)
        finally:
            os._exit(0)
    os.close(w)
    return {"pid": pid}, [r]


# ------------------------------------------------------------------ host agent side
_zygote = {}  # "sock", "lock"
_cells = {}  # cell id -> Cell
_handles = {}  # cell id -> the zygote's serial for it (from open until close)
_cells_lock = threading.Lock()
ZYGOTE_KEYS = ("pids_limit", "memory_bytes", "cpu_cores", "disk_bytes", "shm_bytes", "lifetime")
"""All of a cell_open request the zygote gets: limits, none secret, nothing naming the cell."""
OWN_KEYS = ("hostname", "user", "workdir", "env")
"""What only the cell's init reads, from the cell's own socket after the fork (secrets: env)."""


SEND_TIMEOUT = 5  # seconds
CELL_EVENTS = ("result", "chunk", "error")  # all a cell's agent may send once it said hello
LINE_MIN = 4 << 20  # bytes a cell's line may hold at least (a 1 MiB data chunk is 1.4 MB of JSON)
CHUNK_BUDGET = WINDOW + 2 * CHUNK  # unacknowledged chunk bytes per request an honest agent never exceeds


class CellViolation(Exception):
    """A cell's agent sent what the protocol does not allow: the host ends that cell."""


SAFE_INT = 1 << 53  # integers every JSON reader holds exactly


def plain_line(line, msg):
    """True when `line`, which json.loads read as `msg`, reads one way only in any JSON
    reader, as msg: then `{"cell":N,` + line[1:] is msg re-serialised with the cell's id
    (without re-encoding megabytes of base64 the agent already wrote in this form). Such
    a line starts with `{"`; it is ASCII with no whitespace and no escape, so every `"`
    delimits a string; it holds exactly the strings msg holds (keys and string values,
    two quotes each: a duplicate key would add at least one); every value is a string, a
    bool, null, an int below 2**53 or a finite float (no nesting, no NaN). The agent's
    exec, read and write replies and its chunks are such lines; anything else is
    re-serialised from msg."""
    if line[:2] != b'{"' or not line.isascii() or b"\\" in line or b" " in line or b"\t" in line or b"\r" in line:
        return False
    strings = len(msg)
    for value in msg.values():
        kind = type(value)
        if kind is str:
            strings += 1
        elif kind is int:
            if not -SAFE_INT < value < SAFE_INT:
                return False
        elif kind is float:
            if value - value != 0:  # inf, nan
                return False
        elif not (kind is bool or value is None):
            return False
    return line.count(b'"') == 2 * strings


class Pieces(object):
    """The start of a cell's line not yet complete, as the pieces it came in, joined once
    at the line's end (a bytearray grown piece by piece is copied again and again as it
    grows: ~5 ms for a 1.4 MB line in 64 KiB pieces). len() is the bytes held plus
    PIECE_COST per piece, more than a piece costs besides its bytes: a flood of 1-byte
    pieces is bounded like a flood of bytes. `del buf[:]` empties it."""

    PIECE_COST = 64

    def __init__(self):
        self.parts = []
        self.size = 0

    def __len__(self):
        return self.size

    def __delitem__(self, _everything):
        self.parts = []
        self.size = 0

    def add(self, data):
        self.parts.append(data)
        self.size += len(data) + self.PIECE_COST

    def take(self, last):
        """The line: the pieces held and `last` (then empty)."""
        parts = self.parts
        parts.append(last)
        self.parts = []
        self.size = 0
        return b"".join(parts)


class Cell(object):
    """A cell as the host agent sees it. Nothing the cell sends is trusted: the host
    knows which requests it forwarded (`pending`), how much chunk data each may still
    send (flow control, counted as the client counts its acks) and how long a line may
    be (`max_line`, from the output limits of the requests it forwarded)."""

    def __init__(self, cid, sock, alive):
        self.cid = cid
        self.sock = sock
        self.alive = alive  # EOF once every process of the cell is gone
        self.closing = False
        self.buf = Pieces()  # the start of a line not yet complete
        self.max_line = LINE_MIN
        self.pending = {}  # request id -> chunk bytes sent and not yet acknowledged
        self.lock = threading.Lock()
        self.upper = None  # a descriptor of the cell's upper layer (what cell_snapshot freezes)
        self.layer = None  # the Layer the cell stacks over the image (its hold on it), or None
        self.disk = 0  # the cell's disk limit: the most a freeze of its upper layer copies

    def expect(self, req):
        """Account a message the host forwards to the cell (before it is sent)."""
        op = req.get("op")
        rid = req.get("id")
        with self.lock:
            if op == "ack":
                if rid in self.pending:
                    try:
                        self.pending[rid] = max(0, self.pending[rid] - int(req.get("bytes", 0)))
                    except (TypeError, ValueError):
                        pass
            elif op not in ("data", "cancel"):
                self.pending[rid] = 0
                limit = req.get("limit")
                if op in ("exec", "start") and isinstance(limit, int):  # head + tail of two streams, base64
                    self.max_line = max(self.max_line, 3 * limit + 65536)

    def check(self, line):
        """One line from the cell, parsed, checked against the protocol and re-serialised
        with the cell's id (CellViolation otherwise): identity comes from the channel."""
        try:
            msg = json.loads(line)
        except ValueError:
            raise CellViolation("a line that is not JSON: %r" % line[:100])
        if not isinstance(msg, dict):
            raise CellViolation("a line that is not a JSON object: %r" % line[:100])
        ev, rid = msg.get("ev"), msg.get("id")
        if ev not in CELL_EVENTS or type(rid) is not int or "cell" in msg:
            raise CellViolation("a message that is no reply (ev %r, id %r%s)"
                                % (ev, rid, ", a cell key" if "cell" in msg else ""))
        with self.lock:
            if rid not in self.pending:
                raise CellViolation("a %s for request %d, which is not pending" % (ev, rid))
            if ev == "chunk":
                data = msg.get("data")
                if not isinstance(data, str):
                    raise CellViolation("a chunk without data")
                self.pending[rid] += len(data) * 3 // 4
                if self.pending[rid] > CHUNK_BUDGET:
                    raise CellViolation("%d unacknowledged bytes for request %d (flow control ignored)"
                                        % (self.pending[rid], rid))
            else:
                del self.pending[rid]
        if plain_line(line, msg):  # already the one serialisation of msg: prefix the id, no re-encoding
            return b"".join((b'{"cell":%d,' % self.cid, memoryview(line)[1:], b"\n"))
        out = {"cell": self.cid}
        out.update(msg)
        return json.dumps(out, separators=(",", ":")).encode() + b"\n"

    def lines(self, data):
        """Complete lines of `data` after what is buffered, each byte copied a bounded number
        of times (no re-scan, no re-copy of a growing buffer); the buffer never holds more
        than max_line (its pieces' overhead counted)."""
        cut = data.find(b"\n")
        if cut < 0:
            if len(self.buf) + len(data) > self.max_line:
                raise CellViolation("a line over %d bytes" % self.max_line)
            self.buf.add(data)
            return []
        first = self.buf.take(data[:cut]) if self.buf else data[:cut]
        parts = data[cut + 1:].split(b"\n")
        tail = parts.pop()
        out = [first] + parts
        if len(tail) > self.max_line or any(len(x) > self.max_line for x in out):
            raise CellViolation("a line over %d bytes" % self.max_line)
        if tail:
            self.buf.add(tail)
        return out

    def wait_gone(self, timeout=30.0):
        """Block until the cell's watcher (and so every process of the cell) is gone."""
        with self.lock:
            fd, self.alive = self.alive, None
        if fd is None:
            return
        try:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if select.select([fd], [], [], max(0.0, end - time.monotonic()))[0] and not os.read(fd, 64):
                    return
            log("cells: cell %s still winding down after %.0fs" % (self.cid, timeout))
        finally:
            os.close(fd)


def end_cell(cell):
    """Take down a cell the host ended (a protocol violation): forget it, kill it, wait."""
    with _cells_lock:
        if _cells.get(cell.cid) is cell:
            del _cells[cell.cid]
    try:
        close_in_zygote(cell.cid)
        cell.wait_gone()
        release_cell(cell)
    except Exception as exc:
        log("cells: ending cell %s: %r" % (cell.cid, exc))
    finally:
        try:
            cell.sock.close()
        except OSError:
            pass


class Pump(object):
    """One thread forwards every cell's replies to the host, each line parsed, checked,
    re-serialised and tagged with the cell it came from (a selector over the cells'
    sockets: no thread per cell contending for the GIL). A cell that breaks the protocol
    (a line that is no reply to a pending request, too long, flow control ignored) is
    ended with a `gone` event saying why; its siblings and the host channel carry on."""

    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.added = queue.SimpleQueue()
        threading.Thread(target=self.run, daemon=True).start()

    def add(self, cell, pending=b""):
        self.added.put((cell, pending))
        os.write(self.wake_w, b"x")

    def forward(self, cell, data):
        """Forward the complete lines of `data`; False once the cell was ended."""
        out = []
        try:
            for line in cell.lines(data):
                if line:
                    out.append(cell.check(line))
        except CellViolation as exc:
            self.end(cell, "cell %d broke the agent protocol: %s; the host ended it" % (cell.cid, exc), out)
            return False
        if out:
            with _out_lock:
                write_all(_out, b"".join(out))
        return True

    def end(self, cell, reason, out=()):
        log("cells: " + reason)
        try:
            self.sel.unregister(cell.sock)
        except (KeyError, ValueError):
            pass
        del cell.buf[:]
        cell.closing = True
        gone = json.dumps({"cell": cell.cid, "id": 0, "ev": "gone", "message": reason}).encode() + b"\n"
        with _out_lock:
            write_all(_out, b"".join(out) + gone)
        try:
            threading.Thread(target=end_cell, args=(cell,), daemon=True).start()
        except RuntimeError:  # no thread to spare: end it here
            end_cell(cell)

    def run(self):
        while True:
            for key, _ in self.sel.select():
                cell = key.data
                if cell is None:
                    os.read(self.wake_r, 4096)
                    while True:
                        try:
                            cell, pending = self.added.get_nowait()
                        except queue.Empty:
                            break
                        self.sel.register(cell.sock, selectors.EVENT_READ, cell)
                        if pending:
                            self.forward(cell, pending)
                    continue
                try:
                    data = cell.sock.recv(65536)  # ready: does not block
                except OSError:
                    data = b""
                if data:
                    self.forward(cell, data)
                    continue
                self.sel.unregister(cell.sock)
                del cell.buf[:]
                cell.sock.close()
                if not cell.closing:
                    send({"cell": cell.cid, "id": 0, "ev": "gone"})


_pump = []


def pump():
    if not _pump:
        _pump.append(Pump())
    return _pump[0]


def read_hello(sock, timeout):
    """The cell agent's hello line and whatever followed it (b"" at EOF or timeout)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\n" not in data and len(data) < 65536:
            piece = sock.recv(4096)
            if not piece:
                return b"", b""
            data += piece
    except OSError:
        return b"", b""
    finally:
        sock.settimeout(None)
    line, _, rest = data.partition(b"\n")
    return line, rest


def zygote_call(req, fd=None):
    """One request to the zygote (one at a time): (reply, [the fds it passed back])."""
    z = _zygote
    with z["lock"]:
        _send(z["sock"], req, [fd] if fd is not None else ())
        reply, passed = _recv(z["sock"])
    if reply is None:
        raise CellSetupError("the cell zygote died")
    if "error" in reply:
        raise (CellsUnsupported if reply.get("kind") == "usage" else CellSetupError)(reply["error"].split(": ", 1)[-1])
    return reply, passed


def close_in_zygote(cid):
    """Ask the zygote to end cell `cid` (by the zygote's own handle for it)."""
    with _cells_lock:
        handle = _handles.pop(cid, None)
    if handle is None:
        return {"closed": False}
    reply, _ = zygote_call({"op": "close", "handle": handle})
    return reply


def op_cell_open(req, ctx):
    """Open cell `cell_id` of `conf`; with `layer` (a layer this host froze, named by its id),
    the cell's root stacks that layer's chain over the image."""
    cid = int(req["cell_id"])
    conf = req["conf"]
    limits = {k: conf.get(k) for k in ZYGOTE_KEYS}
    layer = hold_layer(req["layer"]) if req.get("layer") is not None else None
    limits["lower"] = list(layer.chain) if layer is not None else []  # the host's own dirs, never the request's
    own = (json.dumps({k: conf.get(k) for k in OWN_KEYS}, separators=(",", ":")) + "\n").encode()
    ours, theirs = socket.socketpair()
    timeout = float(req.get("hello_timeout") or 30)
    try:
        reply, (report, alive) = zygote_call({"op": "open", "conf": limits}, theirs.fileno())
    except Exception:
        ours.close()
        release_layer(layer)
        raise
    finally:
        theirs.close()
    with _cells_lock:
        _handles[cid] = reply["handle"]
    cell = Cell(cid, ours, alive)
    cell.layer, cell.disk = layer, int(limits["disk_bytes"])
    try:
        # the cell's own configuration, secrets included, on its own channel only
        ours.settimeout(timeout)
        ours.sendall(own)
        ours.settimeout(None)
        init, cell.upper = read_report(report, timeout)
    except Exception:
        ours.close()
        close_in_zygote(cid)
        cell.wait_gone()
        release_cell(cell)
        raise
    # a cell whose agent stops reading holds the host's forwarding for at most this long
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT, 0))
    hello, pending = read_hello(ours, timeout)
    if not hello:
        ours.close()
        close_in_zygote(cid)
        cell.wait_gone()
        release_cell(cell)
        raise CellSetupError("the cell's agent did not start")
    with _cells_lock:
        _cells[cid] = cell
    pump().add(cell, pending)
    return {"pid": init, "hello": json.loads(hello)}


def op_cell_close(req, ctx):
    cid = int(req["cell_id"])
    with _cells_lock:
        cell = _cells.pop(cid, None)
    if cell is not None:
        cell.closing = True
    reply = close_in_zygote(cid)
    if cell is not None:
        cell.wait_gone()
        release_cell(cell)
        try:
            cell.sock.shutdown(socket.SHUT_RDWR)  # the pump sees EOF, forgets the cell, closes its socket
        except OSError:
            pass
    return reply


class Layer(object):
    """A frozen cell layer as the host agent keeps it: its directory (named by the host, never
    by a request), the chain of layer directories it stacks over the image (oldest first, its
    own last) and how many hold it: its snapshot (until dropped), the cells stacking it, the
    layers frozen over it. Nobody holding it, its directory is removed."""

    def __init__(self, lid, parent):
        self.id = lid
        self.dir = LAYERS + "/" + lid
        self.parent = parent
        self.chain = (parent.chain if parent is not None else []) + [self.dir]
        self.holders = 1  # the snapshot's own hold (op_cell_layer_drop releases it)
        self.dropped = False


_layers = {}  # layer id -> Layer (under _cells_lock)
_layers_ready = []  # [True] once the layers tmpfs is mounted (cells_main)


def hold_layer(lid):
    """A hold on the layer a request names: a live layer this host froze, by its id (a name,
    never a path); AgentUsageError for anything else."""
    with _cells_lock:
        layer = _layers.get(lid) if isinstance(lid, str) else None
        if layer is None or layer.dropped:
            raise AgentUsageError("no layer %r in this cell host (none was frozen by that name, or it was "
                                  "deleted)" % (lid,))
        layer.holders += 1
        return layer


def release_layer(layer):
    """Drop one hold on `layer` (None: nothing); a layer nobody holds any more is removed,
    and its hold on the layer under it dropped in turn."""
    while layer is not None:
        with _cells_lock:
            layer.holders -= 1
            if layer.holders > 0:
                return
            _layers.pop(layer.id, None)
        try:
            layer_job({"op": "drop", "dest": layer.dir})
        except Exception as exc:
            log("cells: removing layer %s: %r" % (layer.id, exc))
        layer = layer.parent


def release_cell(cell):
    """What a gone cell held in the host: its upper layer's descriptor, its hold on a layer."""
    with _cells_lock:
        upper, cell.upper = cell.upper, None
        layer, cell.layer = cell.layer, None
    if upper is not None:
        os.close(upper)
    release_layer(layer)


def layer_job(req, fd=None):
    """Run a freeze or a drop in a child of the zygote and wait for its end: bytes copied."""
    _, (report,) = zygote_call(req, fd)
    lines, fds = read_until_eof(report, LAYER_JOB_SECONDS + 10, "the layer " + req["op"])
    for x in fds:
        os.close(x)
    errors = [x[6:] for x in lines if x.startswith("error ")]
    if errors:
        kind, _, message = errors[0].partition(": ")
        raise (AgentTooLarge if kind == "LayerTooLarge" else CellSetupError)(message)
    done = [x for x in lines if x.startswith("ok ")]
    if not done:
        raise CellSetupError("the layer %s ended without a report" % req["op"])
    return int(done[0].split()[1])


def op_cell_snapshot(req, ctx):
    """Freeze cell `cell_id`'s upper layer (its writes, whiteouts, opaque directories) into a
    new layer of this host, a copy made now: what the cell writes afterwards is not in it.
    The cell is the one the client names (never a cell's own say); the new layer stacks over
    the layers the cell stacks. {"layer": id, "bytes": data copied, "depth": layers stacked}."""
    if not _layers_ready:
        raise AgentUsageError("this cell host has no tmpfs for frozen layers (see its log): its cells cannot be "
                              "snapshotted")
    cid = int(req["cell_id"])
    with _cells_lock:
        cell = _cells.get(cid)
        if cell is None or cell.upper is None:
            raise AgentUsageError("cell %s is not open in this host" % cid)
        parent = cell.layer
        if parent is not None and len(parent.chain) >= MAX_CHAIN:
            raise AgentUsageError("cell %s already stacks %d layers (a fork of a fork ...): at most %d"
                                  % (cid, len(parent.chain), MAX_CHAIN))
        upper = os.dup(cell.upper)
        if parent is not None:
            parent.holders += 1  # the new layer's hold on the one under it
        layer = Layer(os.urandom(8).hex(), parent)
    try:
        done = layer_job({"op": "freeze", "dest": layer.dir, "budget": cell.disk}, upper)
    except BaseException:
        release_layer(parent)
        raise
    finally:
        os.close(upper)
    with _cells_lock:
        _layers[layer.id] = layer
    return {"layer": layer.id, "bytes": done, "depth": len(layer.chain)}


def op_cell_layer_drop(req, ctx):
    """Delete a layer (idempotent): no cell opens on it again; its directory is removed once
    no cell stacks it and no layer was frozen over it. {"dropped": bool, "freed": bool}."""
    lid = req.get("layer")
    with _cells_lock:
        layer = _layers.get(lid) if isinstance(lid, str) else None
        if layer is None or layer.dropped:
            return {"dropped": False, "freed": layer is None}
        layer.dropped = True
    release_layer(layer)
    with _cells_lock:
        return {"dropped": True, "freed": _layers.get(lid) is not layer}


def op_cell_layers(req, ctx):
    """The live layers of this host: {"layers": {id: {"holders": n, "dropped": bool, "depth": n}}}."""
    with _cells_lock:
        return {"layers": {k: {"holders": v.holders, "dropped": v.dropped, "depth": len(v.chain)}
                           for k, v in _layers.items()}}


def forward_to_cell(req):
    """Hand a message tagged `cell` to that cell's agent (an unknown cell's requests
    get an error reply, its control messages are dropped)."""
    cid = req.pop("cell")
    with _cells_lock:
        cell = _cells.get(cid)
    if cell is not None:
        cell.expect(req)
        try:
            cell.sock.sendall((json.dumps(req, separators=(",", ":")) + "\n").encode())
            return
        except OSError as exc:  # gone, or not reading for SEND_TIMEOUT: the pump sees EOF and says so
            log("cells: cell %s does not take its requests (%s): ending it" % (cid, exc))
            try:
                cell.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    if req.get("op") not in ("data", "ack", "cancel"):
        send({"cell": cid, "id": req.get("id"), "ev": "error", "kind": "internal",
              "message": "cell %s is gone" % cid})


def compact_before_fork():
    """Shrink what every cell process is forked from: heap the compiler freed but that
    stays mapped goes back to the kernel (the host agent under Python 3.11: 13.3 -> 8.8 MB
    of anonymous memory), and the objects alive now move to the collector's permanent
    generation, so no collection in a fork writes to their pages. Each cell costs two
    forks of the zygote and their exits, whose page-table copies and unmapping scale with
    the pages mapped."""
    gc.collect()
    gc.freeze()
    try:
        _libc.malloc_trim(0)
    except AttributeError:  # not glibc (musl has none): the pages stay mapped
        pass


def cells_main():
    """Start the zygote while still single-threaded, then serve as the host agent."""
    global forward_cell
    not_dumpable()  # before the fork: the zygote and every watcher inherit it
    try:  # before the fork: the zygote's mount namespace (and every cell's) has this tmpfs too
        os.makedirs(LAYERS, exist_ok=True)
        mount("tmpfs", LAYERS, "tmpfs", MS_NOSUID | MS_NODEV, "mode=700")
        _layers_ready.append(True)
    except OSError as exc:
        log("cells: no tmpfs for frozen layers (%s): cells cannot be snapshotted" % exc)
    compact_before_fork()
    # the zygote is forked before main() reads any request: its memory never holds one
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            zygote_main(child)
        except BaseException as exc:
            log("cell zygote failed: %r" % exc)
        finally:
            os._exit(0)
    child.close()
    _zygote.update(sock=parent, lock=threading.Lock(), pid=pid)
    OPS["cell_open"] = op_cell_open
    OPS["cell_close"] = op_cell_close
    OPS["cell_snapshot"] = op_cell_snapshot
    OPS["cell_layer_drop"] = op_cell_layer_drop
    OPS["cell_layers"] = op_cell_layers
    forward_cell = forward_to_cell
    HELLO["hardening"] = HARDENING
    main()


if __name__ == "__main__" and "--cells" in sys.argv:
    try:
        cells_main()
    except KeyboardInterrupt:
        shutdown()
