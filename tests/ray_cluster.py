"""A real, throw-away Ray cluster on this machine for tests and benchmarks: a
head and N more nodes, each a separate `ray start` with its own temp dir and
disjoint ports (every component's port and a worker-port range of its own:
the head's default worker range would swallow fixed ports picked inside it).

Teardown is by pid: every process whose command line, working directory or
environment names this cluster's temp dirs (raylets, GCS, dashboard, agents,
workers, job drivers) is SIGTERMed, then SIGKILLed; nothing else on the
machine is touched (`ray stop` would stop every Ray process of the machine).

    with RayCluster(nodes=2, cpus=(2, 1)) as cluster:
        cluster.dashboard_url  # http://127.0.0.1:PORT, for JobSubmissionClient
        cluster.kill_raylet(1) # node 1's raylet, by pid
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
NODE_MARK = "VF_TEST_RAY_NODE"  # in the environment of every process of a node: its temp dir


class RayStartError(RuntimeError):
    """`ray start` failed (the output is in the message)."""


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_base(span: int) -> int:
    for _ in range(200):
        base = random.randrange(30000, 60000 - span, 10)
        if all(_free(base + i) for i in range(0, span, 7)) and all(_free(base + i) for i in range(20)):
            return base
    raise RayStartError("no free port range for a Ray cluster")


class RayCluster:
    def __init__(self, nodes: int = 2, cpus: tuple[int, ...] = (2, 1), env: dict[str, str] | None = None):
        self.n = nodes
        self.cpus = cpus + (1,) * (nodes - len(cpus))
        self.root = Path(tempfile.mkdtemp(prefix="vfray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 chars
        self.base = _pick_base(100 * (nodes + 1))
        self.env = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0",
                    "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        self.gcs = f"127.0.0.1:{self.base}"
        self.dashboard_url = f"http://127.0.0.1:{self.base + 1}"

    # ports of node i: a block of 10 fixed ports + a worker range of 100 (disjoint per node)
    def _node_args(self, i: int) -> list[str]:
        b = self.base + 10 * (i + 1)
        w = self.base + 100 * (i + 1)
        return [f"--node-manager-port={b}", f"--object-manager-port={b + 1}", f"--dashboard-agent-grpc-port={b + 2}",
                f"--dashboard-agent-listen-port={b + 3}", f"--metrics-export-port={b + 4}",
                f"--runtime-env-agent-port={b + 5}", f"--min-worker-port={w}", f"--max-worker-port={w + 99}",
                f"--num-cpus={self.cpus[i]}", f"--temp-dir={self.root / f'n{i}'}", "--disable-usage-stats"]

    def start(self) -> "RayCluster":
        try:
            self._run([RAY, "start", "--head", f"--port={self.base}", "--node-ip-address=127.0.0.1",
                       f"--dashboard-port={self.base + 1}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
                       f"--ray-client-server-port={self.base + 2}", *self._node_args(0)], node=0)
            for i in range(1, self.n):
                self._start_worker_node(i)
            if self.n > 1:
                self.wait_schedulable()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_worker_node(self, i: int, attempts: int = 2) -> None:
        """`ray start --address` for node i, until the cluster shows it alive. On a loaded
        machine `ray start` may give up (it gives a raylet 30 s, hard-coded, to register)
        while the raylet still registers later; if it never does, node i's processes are
        killed and it is started once more."""
        errors: list[str] = []
        for _ in range(attempts):
            try:
                self._run([RAY, "start", f"--address={self.gcs}", "--node-ip-address=127.0.0.1", *self._node_args(i)], node=i)
            except RayStartError as exc:
                errors.append(str(exc))
            try:
                self.wait_nodes(i + 1, timeout=90)
                return
            except RayStartError as exc:
                errors.append(str(exc))
            self._kill(self.pids(i))
            shutil.rmtree(self.root / f"n{i}", ignore_errors=True)
        raise RayStartError("\n".join(errors))

    def _kill(self, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _run(self, argv: list[str], node: int) -> None:
        # every process of node i inherits this marker (Ray's renamed processes and the dashboard's
        # forkserver children show no temp dir in their command line): how pids() finds them all
        env = {**self.env, NODE_MARK: str(self.root / f"n{node}")}
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        if p.returncode != 0:
            raise RayStartError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")

    def wait_nodes(self, n: int, timeout: float = 60) -> None:
        import json
        import urllib.request

        deadline = time.time() + timeout
        alive = -1
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/nodes?view=summary", timeout=5) as r:
                    data = json.loads(r.read())
                alive = sum(1 for x in data["data"]["summary"] if x.get("raylet", {}).get("state") == "ALIVE")
                if alive >= n:
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise RayStartError(f"the Ray cluster did not show {n} alive nodes within {timeout:.0f}s (saw {alive})")

    def wait_schedulable(self, timeout: float = 120) -> None:
        """Until a task pinned (hard node affinity) to each node runs: a node the GCS shows
        alive is not yet in the head's scheduler view for a moment after it joined (an actor
        meant for it would be placed elsewhere)."""
        code = (
            "import sys, time, ray\n"
            "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "f = ray.remote(num_cpus=0, max_retries=0)(lambda: ray.get_runtime_context().get_node_id())\n"
            "todo = [n['NodeID'] for n in ray.nodes() if n['Alive']]\n"
            "deadline = time.time() + float(sys.argv[2])\n"
            "while todo and time.time() < deadline:\n"
            "    try:\n"
            "        ray.get(f.options(scheduling_strategy=A(todo[0], soft=False)).remote(), timeout=30)\n"
            "        todo.pop(0)\n"
            "    except Exception:\n"
            "        time.sleep(0.5)\n"
            "sys.exit(1 if todo else 0)\n")
        p = subprocess.run([sys.executable, "-c", code, self.gcs, str(timeout)], env=self.env, capture_output=True,
                           text=True, timeout=timeout + 60)
        if p.returncode != 0:
            raise RayStartError(f"a node of the cluster never took a task within {timeout:.0f}s:\n{p.stderr[-3000:]}")

    # -- processes, by pid
    def pids(self, node: int | None = None) -> list[int]:
        """Pids of this cluster's processes (of one node when given): those with the node's
        marker in their environment, temp dir in their command line or working directory;
        the agents of their raylets (RAY_RAYLET_PID); and all their descendants (the
        dashboard's forkserver children carry none of these marks)."""
        root = str(self.root / f"n{node}") if node is not None else str(self.root)
        mark = f"{NODE_MARK}={root}".encode()
        procs: dict[int, tuple[int, str, list[bytes]]] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                stat = (d / "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(d / "cwd")
                env = (d / "environ").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            procs[int(d.name)] = (ppid, cmd if root not in cwd else root, env)
        ours = {pid for pid, (_, cmd, env) in procs.items() if root in cmd or any(v.startswith(mark) for v in env)}
        raylets = {f"RAY_RAYLET_PID={pid}".encode() for pid in ours if "raylet" in procs[pid][1]}
        ours |= {pid for pid, (_, _, env) in procs.items() if raylets.intersection(env)}
        while True:  # descendants
            more = {pid for pid, (ppid, _, _) in procs.items() if ppid in ours} - ours
            if not more:
                return sorted(ours)
            ours |= more

    def raylet_pid(self, node: int) -> int:
        for pid in self.pids(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"/raylet"):
                return pid
        raise LookupError(f"no raylet of node {node}")

    def kill_raylet(self, node: int) -> int:
        pid = self.raylet_pid(node)
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        seen: set[int] = set()  # found before any is killed: orphans lose the parent that links them to us
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            seen |= set(self.pids())
            pids = [p for p in seen if _alive(p)]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while time.time() < deadline and any(_alive(p) for p in seen):
                time.sleep(0.2)
            if not any(_alive(p) for p in seen) and not self.pids():
                break
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
