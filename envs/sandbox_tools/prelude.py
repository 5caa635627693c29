"""Stdlib-only code shared by the programs that run INSIDE a sandbox
(`repl_worker.py`; Python 3.7+; `OOM_FILES` also names the files the
persistent shell reads). It is put in
front of their source by `common.in_sandbox_source`, so each still runs as one
`python3 -c <source>` string."""

import os

OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills():
    """The sandbox cgroup's oom_kill counter (cgroup v2 or v1), None where not exposed."""
    for path in OOM_FILES:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _write_all(fd, data):
    """os.write until all of `data` is written (retrying on EINTR)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]
