"""How a local "sandbox" process is started on the host: a per-sandbox root
directory and, when bubblewrap (`bwrap`) is usable, a mount/pid/network
namespace in which that directory is `/` and the host's system directories
are mounted read-only on top of it.

This is a development convenience, **not a security boundary**: without
bwrap commands run as ordinary host processes with the caller's privileges;
with bwrap they still share the kernel, the user id and (read-only) the
host's /usr and /etc. Use Docker, Kubernetes or Prime for untrusted code.

Also used by the contract fakes in `tests/fakes/` to back a fake pod or a fake
Prime sandbox by a real process tree.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, Field


log = logging.getLogger(__name__)

# Host directories mounted read-only into the sandbox root (when they exist).
_RO_DIRS = ("usr", "etc", "opt")
# Top-level entries that are often symlinks into /usr (merged-usr systems).
_LINK_OR_DIR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Writable directories created in every sandbox root.
_ROOT_DIRS = {"tmp": 0o1777, "root": 0o700, "home": 0o755, "var": 0o755, "var/tmp": 0o1777, "run": 0o755}


class Isolation(BaseModel):
    """How one sandbox's processes are confined."""

    root: Path = Field(description="Host directory that is `/` inside the sandbox (or the workdir base without bwrap).")
    bwrap: str | None = Field(None, description="Path of the bwrap binary; None = plain host processes.")
    network: bool = Field(False, description="Keep the host network (bwrap only; without bwrap it is always on).")

    def path(self, sandbox_path: str) -> Path:
        """Host path of a sandbox path under the root directory (used for the start directory;
        without bwrap, paths that commands use are plain host paths)."""
        return self.root / sandbox_path.lstrip("/")

    def argv(self, argv: list[str], cwd: str = "/") -> list[str]:
        """The host argv that runs `argv` confined, starting in sandbox path `cwd`."""
        if self.bwrap is None:
            return list(argv)
        return [self.bwrap, *bwrap_args(self.root, network=self.network, cwd=cwd), "--", *argv]

    def host_cwd(self, cwd: str = "/") -> str | None:
        """cwd to give Popen: None with bwrap (it chdirs itself), the mapped dir otherwise."""
        return None if self.bwrap else str(self.path(cwd))


@functools.cache
def find_bwrap() -> str | None:
    """The bwrap binary when it exists AND can create namespaces here; None otherwise.

    (VF_LOCAL_NO_BWRAP=1 makes the backend not ask: `LocalBackend`.)
    """
    path = shutil.which("bwrap")
    if not path:
        return None
    try:
        probe = subprocess.run(
            [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
             "--unshare-net", "--die-with-parent", "--", "/bin/true"],
            capture_output=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if probe.returncode != 0:
        log.info("bwrap present but unusable here: %s", probe.stderr.decode(errors="replace").strip())
        return None
    return path


def prepare_root(root: Path) -> None:
    """Create the writable skeleton of a sandbox root directory."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for rel, mode in _ROOT_DIRS.items():
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(mode)


def bwrap_args(root: Path, *, network: bool, cwd: str = "/") -> list[str]:
    """bwrap options: `root` bound writable as `/`, system dirs read-only, fresh /dev, /proc, pid ns."""
    args = ["--bind", str(root), "/"]
    for name in _RO_DIRS:
        if os.path.isdir(f"/{name}"):
            args += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in _LINK_OR_DIR:
        host = f"/{name}"
        if os.path.islink(host):
            if not os.path.lexists(root / name):  # a second bwrap on the same root finds it made
                args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    args += ["--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--hostname", "sandbox", "--die-with-parent", "--chdir", cwd or "/"]
    if not network:
        args.append("--unshare-net")
    return args


_warned = False


def warn_unconfined_once() -> None:
    """Log, once per process, that local sandboxes are plain host processes."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "local backend without bubblewrap: sandbox commands run as plain host processes with your "
            "privileges; this is NOT a security boundary (install bubblewrap, or use docker/kubernetes/prime)"
        )
