"""OpenEnv step round trip: through the sandbox's command channel (the relay)
vs a direct HTTP call to the same server from the host, in the same run.

    .venv/bin/python benchmarks/bench_openenv.py            # table
    .venv/bin/python benchmarks/bench_openenv.py --n 500    # more samples
    .venv/bin/python benchmarks/bench_openenv.py --json

The server is the `openenv init` template (environments/openenv_echo), run
by uvicorn on the host. Paths, each timing one `step`:

  direct              host client (aiohttp) -> host server
  relay (host proc)   host -> relay as a host subprocess (pipes) -> same server
  relay (docker, in-sandbox server)
                      the production set-up: server and relay both inside a
                      network-less sandbox (a different process; same code)

The row "relay (docker)" of earlier runs (a sandbox with host networking reaching
the same host server) is gone: `network=True` now joins the egress-only bridge,
which by design reaches nothing on the host (docs/sandboxes.md), and host
networking is refused, so no sandbox can reach the host's server any more.

Two step kinds: `POST /step` (stateless HTTP) and a `/ws` session step (what
OpenEnvEnv uses per turn). Target (issue 7): relay (docker) <= 2x direct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.openenv.build import ensure_built  # noqa: E402
from envs.openenv.forwarder import DirectTransport, Forwarder, ServerUnreachable  # noqa: E402
from sandboxes import SandboxSpec  # noqa: E402
from sandboxes.registry import get_backend  # noqa: E402

ECHO = ROOT / "environments/openenv_echo/openenv_echo/echo_env"
LABELS = {"vf-sandbox.bench": "1"}
STEP = {"action": {"message": "hello bench"}}
WS_STEP = json.dumps({"type": "step", "data": {"message": "hello bench"}})


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_health(t, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (await t.request("GET", "/health", timeout=5)).status == 200:
                return
        except ServerUnreachable:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("server did not become healthy")


class Path_:
    """One transport under test. The template server allows one /ws session at a
    time (max_concurrent_envs=1), so each run opens its own (not timed)."""

    def __init__(self, name: str, t):
        self.name, self.t = name, t
        self.lat: dict[str, list[float]] = {"http": [], "ws": []}

    async def run(self, n: int, record: bool = True) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            r = await self.t.request("POST", "/step", json=STEP)
            dt = (time.perf_counter() - t0) * 1000
            assert r.status == 200, r.text
            if record:
                self.lat["http"].append(dt)
        sid = await self.t.ws_open("/ws")
        await self.t.ws_send(sid, json.dumps({"type": "reset", "data": {}}))
        for _ in range(n):
            t0 = time.perf_counter()
            reply = await self.t.ws_send(sid, WS_STEP)
            dt = (time.perf_counter() - t0) * 1000
            assert '"observation"' in reply, reply
            if record:
                self.lat["ws"].append(dt)
        await self.t.ws_close(sid)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300, help="samples per path and step kind")
    ap.add_argument("--rounds", type=int, default=10, help="paths are interleaved in this many rounds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    manifest = ensure_built(ECHO)
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("uvicorn")), manifest.app, "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=ECHO, env=dict(os.environ, ENABLE_WEB_INTERFACE="false"),
    )
    backend = get_backend("docker")
    paths: list[Path_] = []
    sandboxes = []
    try:
        direct = DirectTransport(f"http://127.0.0.1:{port}")
        await wait_health(direct)
        paths.append(Path_("direct", direct))
        paths.append(Path_("relay (host proc)", await Forwarder.start_local(port)))
        # Production set-up: server and relay inside a network-less sandbox.
        sb = await backend.create(SandboxSpec(image=manifest.image, name="bench-openenv", labels=LABELS,
                                              cpu_cores=2, memory_gb=4))
        sandboxes.append(sb)
        await sb.start_process(["/bin/sh", "-c", f"({manifest.start_command}) >/tmp/server.log 2>&1"])
        fwd = await Forwarder.start_in_sandbox(sb, manifest.port)
        await wait_health(fwd)
        paths.append(Path_("relay (docker, in-sandbox server)", fwd))
        for p in paths:
            await p.run(20, record=False)  # warm-up
        per_round = max(1, args.n // args.rounds)
        for _ in range(args.rounds):
            for p in paths:
                await p.run(per_round)
        for p in paths:
            await p.t.close()
    finally:
        for sb in sandboxes:
            await sb.delete()
        server.terminate()
        server.wait(10)
        await backend.close()

    base = {k: pct(v, 0.5) for k, v in paths[0].lat.items()}
    table = []
    for p in paths:
        for kind in ("http", "ws"):
            p50, p95 = pct(p.lat[kind], 0.5), pct(p.lat[kind], 0.95)
            table.append({"path": p.name, "step": "POST /step" if kind == "http" else "/ws step",
                          "p50_ms": round(p50, 3), "p95_ms": round(p95, 3), "x_direct": round(p50 / base[kind], 2)})
    prod_ws = pct(paths[-1].lat["ws"], 0.5)
    target = {"openenv_step_ms": round(prod_ws, 3), "direct_http_step_ms": round(base["http"], 3),
              "ratio": round(prod_ws / base["http"], 2)}
    if args.json:
        print(json.dumps({"n": per_round * args.rounds, "rows": table, "target": target}, indent=2))
        return
    print(f"OpenEnv step round trip, n={per_round * args.rounds} per row, paths interleaved in {args.rounds} rounds"
          " (x direct = p50 / p50 of the direct call of the same kind)\n")
    print(f"| {'path':34} | {'step':10} | {'p50 ms':>7} | {'p95 ms':>7} | {'x direct':>8} |")
    print(f"|{'-' * 36}|{'-' * 12}|{'-' * 9}|{'-' * 9}|{'-' * 10}|")
    for r in table:
        print(f"| {r['path']:34} | {r['step']:10} | {r['p50_ms']:7.3f} | {r['p95_ms']:7.3f} | {r['x_direct']:8.2f} |")
    print(f"\nTarget (issue 7): an OpenEnvEnv step (in-sandbox server, /ws through the relay) "
          f"{target['openenv_step_ms']} ms vs a direct HTTP step call {target['direct_http_step_ms']} ms "
          f"= {target['ratio']}x (<= 2x)")


if __name__ == "__main__":
    asyncio.run(main())
