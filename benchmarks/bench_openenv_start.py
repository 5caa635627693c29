"""OpenEnv server start at concurrency: C rollouts of the echo project started at
once (what `vf-sandbox eval openenv-echo -c C` does), C = 1, 12, 32, each rollout
one turn against the local scripted model server, real Docker sandboxes.

Per C: wall time until every server answered reset, the time one start takes once
admitted (p50 / max), how long starts waited to be admitted (p50 / max), errors.
Baseline in the same run: C = 12 with every start admitted at once
(max_concurrent_starts=12, what the code did before the StartGate). An OpenEnv
server start is CPU-bound (~5 s of CPU: openenv-core imports FastAPI, gradio),
so on 2 cores the ungated starts all crawl together and each takes ~C/2 times
longer; the gate (default: one start per core) keeps each start short and the
start timeout (which counts from admission) out of reach.

    .venv/bin/python benchmarks/bench_openenv_start.py [--concurrency 1 12 32] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openai import AsyncOpenAI  # noqa: E402

from envs.clients.openai_clients import OpenAIChatCompletionsClient  # noqa: E402
from envs.openenv.build import ensure_built  # noqa: E402
from envs.openenv.env import OpenEnvEnv  # noqa: E402
from testmodel.model_server import ModelServer, fixed  # noqa: E402

ECHO = ROOT / "environments/openenv_echo/openenv_echo/echo_env"
LABELS = {"vf-sandbox.bench": "1", "vf-bench": "openenv-start"}


def render(observation, context, reward=None):
    return [{"role": "user", "content": f"{context}: {observation.get('echoed_message', '')}"}]


async def run(concurrency: int, max_starts: int | None, base_url: str) -> dict:
    env = OpenEnvEnv(ECHO, prompt_renderer=render, max_turns=1, max_concurrent_starts=max_starts, labels=LABELS,
                     num_eval_examples=concurrency)
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x"))
    rows = env._eval_rows_all()[:concurrency]
    t0 = time.perf_counter()
    try:
        states = await asyncio.gather(*(env.rollout(env._to_input(r), client, "m") for r in rows))
    finally:
        await env.teardown()
    wall = time.perf_counter() - t0
    gate = env.server_gate  # its StartGate (Environment.start_gate is the run's stop gate since d828cc1)
    errors = [type(s.get("error")).__name__ for s in states if s.get("error") is not None]
    return {"concurrency": concurrency, "gate_limit": gate.limit, "wall_s": wall, "errors": len(errors),
            "error_types": sorted(set(errors)),
            "start_p50_s": statistics.median(gate.starts), "start_max_s": max(gate.starts),
            "wait_p50_s": statistics.median(gate.waits), "wait_max_s": max(gate.waits), "starts": len(gate.starts)}


def table(res: dict) -> str:
    head = ("C", "admitted at once", "wall (s)", "start p50 / max (s)", "wait p50 / max (s)", "errors")
    rows = [head]
    for r in res["runs"]:
        rows.append((str(r["concurrency"]), str(r["gate_limit"]) + (" (baseline)" if r.get("baseline") else ""),
                     f"{r['wall_s']:.1f}", f"{r['start_p50_s']:.1f} / {r['start_max_s']:.1f}",
                     f"{r['wait_p50_s']:.1f} / {r['wait_max_s']:.1f}",
                     str(r["errors"]) + (f" {r['error_types']}" if r["errors"] else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"load average at start / end: {res['load_start']} / {res['load_end']} (2 cores, shared)")
    return "\n".join(lines)


async def main(args) -> dict:
    ensure_built(ECHO)
    res: dict = {"load_start": Path("/proc/loadavg").read_text().split()[0], "runs": []}
    async with ModelServer(fixed('{"message": "hi"}')) as srv:
        for c in args.concurrency:
            res["runs"].append(await run(c, None, srv.base_url))
            if c == args.baseline_at:
                base = await run(c, c, srv.base_url)
                base["baseline"] = True
                res["runs"].append(base)
    res["load_end"] = Path("/proc/loadavg").read_text().split()[0]
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 12, 32])
    ap.add_argument("--baseline-at", type=int, default=12, help="also run this C with every start admitted at once")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = asyncio.run(main(a))
    print(json.dumps(out, indent=2) if a.json else table(out))
