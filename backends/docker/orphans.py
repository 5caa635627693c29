"""Sandboxes a crashed Docker engine lost: containers that containerd still holds
in the engine's `moby` namespace (often with their shim, sometimes with the
sandbox's processes still running) after a SIGKILLed dockerd restarts and its
Engine API no longer lists them. No Engine API call can reach them; this module
finds and removes them through containerd itself.

- Which containerd: the one serving the engine at a local unix socket (the
  socket's peer is dockerd; its `--containerd`, else `<exec-root>/containerd/
  containerd.sock`, from its argv or its daemon.json). A remote engine, or one
  whose daemon this process cannot see, has none: nothing is done.
- What is lost: a container id containerd (`ctr -n moby containers ls`) or a
  shim process (`containerd-shim* -namespace moby -id <id> -address <it>`)
  knows, that the engine does not list, seen on both sides of the engine's
  listing (the engine drops a container only after containerd does, so a
  removal in progress is never taken for a loss).
- What is ours: Docker 20.10 does not hand container labels to containerd, so
  every sandbox carries `MARK_ENV` in its environment (the OCI spec containerd
  keeps); only those are touched.
- Removal: `ctr tasks delete --force` (a task containerd still knows: killed,
  its shim exits); a shim containerd lost: its children (each a sandbox's PID 1,
  so the whole PID namespace) and then the shim SIGKILLed; then `ctr containers
  delete`. Needs root on the engine's host and `ctr` (Debian's containerd).

`reap` is the whole pass (`DockerBackend.reap_orphans`); the rest blocks
(subprocess, /proc) and runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NAMESPACE = "moby"
MARK_ENV = "VF_SANDBOX_MANAGED=1"
"""In every Docker sandbox's environment: how a container only containerd knows is recognised as ours."""

_warned: list[str] = []
_SHIM = re.compile(r"containerd-shim\S*\s.*-namespace\s+(\S+)\s.*-id\s+([0-9a-f]{64})\s.*-address\s+(\S+)")


# ---------------------------------------------------------------- where containerd is


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1:]
    return None


def _socket_peer(path: str) -> int | None:
    """Pid of the process listening on the unix socket `path` (SO_PEERCRED)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(path)
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _, _ = struct.unpack("3i", creds)
    return pid or None


def containerd_address(url: str) -> str | None:
    """The containerd socket of the Docker engine at `url`, or None (not a local unix
    socket, its daemon not visible from here, not dockerd, or a socket this user cannot use)."""
    if not url.startswith("unix://"):
        return None
    pid = _socket_peer(url[len("unix://"):])
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if pid else []
    except OSError:
        return None
    if not argv or os.path.basename(argv[0]) != "dockerd":
        return None
    try:
        conf = json.loads(Path(_flag(argv, "--config-file") or "/etc/docker/daemon.json").read_text())
    except (OSError, ValueError):
        conf = {}
    address = _flag(argv, "--containerd") or conf.get("containerd")
    if not address:
        exec_root = _flag(argv, "--exec-root") or conf.get("exec-root") or "/var/run/docker"
        address = f"{exec_root}/containerd/containerd.sock"
    return address if os.access(address, os.R_OK | os.W_OK) else None  # missing, or not ours to drive (not root)


# ---------------------------------------------------------------- what containerd holds


def _ctr(address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "-a", address, "-n", NAMESPACE, *args], capture_output=True, text=True,
                          timeout=timeout)


def shims(address: str) -> dict[str, int]:
    """Container id -> pid of each shim serving the `moby` namespace of the containerd at `address`."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        m = _SHIM.search(args)
        if m and m.group(1) == NAMESPACE and m.group(3) == address:
            found[m.group(2)] = int(pid)
    return found


def held(address: str) -> set[str]:
    """Ids of every container containerd holds in `moby` or a shim serves there.
    OSError when `ctr` is missing or containerd refuses it."""
    out = _ctr(address, "containers", "ls", "-q")
    if out.returncode != 0:
        raise OSError(f"ctr containers ls: {out.stderr.strip()}")
    return set(out.stdout.split()) | set(shims(address))


def _spec(address: str, cid: str) -> dict:
    """The container's OCI spec: containerd's copy, else the bundle of its shim (its cwd)."""
    out = _ctr(address, "containers", "info", cid)
    if out.returncode == 0:
        try:
            return json.loads(out.stdout).get("Spec") or {}
        except ValueError:
            pass
    pid = shims(address).get(cid)
    try:
        return json.loads(Path(f"/proc/{pid}/cwd/config.json").read_text()) if pid else {}
    except (OSError, ValueError):
        return {}


def is_ours(address: str, cid: str) -> bool:
    return MARK_ENV in ((_spec(address, cid).get("process") or {}).get("env") or [])


# ---------------------------------------------------------------- removal


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid`, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def _children(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and (st := _stat(int(p))) and st[1] == pid]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Until every pid has exited (a zombie counts as gone) or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any((st := _stat(p)) and st[0] != "Z" for p in pids):
        time.sleep(0.05)


def remove(address: str, cid: str) -> None:
    """Kill and forget container `cid` of containerd's `moby` namespace (see the module doc)."""
    _ctr(address, "tasks", "delete", "--force", cid)  # fails harmlessly when containerd lost the task too
    pid = shims(address).get(cid)
    if pid is not None:
        kids = _children(pid)
        for kid in kids:  # each a sandbox's PID 1: its PID namespace dies with it
            _kill(kid)
        _wait_gone(kids, 10)
        _kill(pid)
        _wait_gone([pid], 10)
    out = _ctr(address, "containers", "delete", cid)
    if out.returncode != 0 and "not found" not in out.stderr:
        log.warning("containerd kept lost sandbox %s: %s", cid[:12], out.stderr.strip())


# ---------------------------------------------------------------- the whole pass


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a daemon thread. Not asyncio.to_thread: the default executor's
    threads are joined at interpreter exit, so a slow `ctr` in the start-up reaper's
    background pass would hold a CLI's exit (seen: a SIGTERMed run that did not end)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not fut.done():
            setter(value)

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(settle, fut.set_exception, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, fut.set_result, result)

    threading.Thread(target=run, name="vf-orphans", daemon=True).start()
    return await fut


async def reap(url: str, engine_ids: Callable[[], Awaitable[set[str]]], *, dry_run: bool = False) -> list[str]:
    """Remove (unless `dry_run`) our sandboxes the engine at `url` lost; their ids.
    `engine_ids` lists every container id the engine knows (any label, any state)."""
    address = await _off_loop(containerd_address, url)
    if address is None:
        return []
    try:
        before = await _off_loop(held, address)
        if not before:
            return []
        listed = await engine_ids()
        if not before - listed:
            return []
        after = await _off_loop(held, address)
    except (OSError, subprocess.TimeoutExpired) as exc:  # e.g. no `ctr` installed: said once per process
        (log.debug if _warned else log.warning)(
            "cannot look for sandboxes the Docker engine at %s lost (containerd %s): %s", url, address, exc)
        _warned.append(url)
        return []
    lost = [cid for cid in sorted((before & after) - listed) if await _off_loop(is_ours, address, cid)]
    if not dry_run:
        for cid in lost:
            await _off_loop(remove, address, cid)
    return lost
