"""Sync user code vs the event loop: four rollouts at concurrency 4 whose
scoring calls `time.sleep(1)` sync reward functions, run through the real env
stack (`SingleTurnEnv.evaluate`, `set_concurrency(4)` as the eval runner
calls it) against the local instant model server in its own process.

Variants, all measured in this run:

- pool       plain `def` reward functions: they run in the env's thread pool
             (sized by set_concurrency), the loop keeps serving the others
- inline     the same functions declared `async def` but still calling
             time.sleep: they block the event loop, i.e. sync code run on the
             loop (how every sync reward function ran before the pool)
- ideal      the sum of the sleeps one rollout does (funcs x 1 s): no
             scheduling can beat it while the functions of one rollout run in
             order

Scenarios: 1 function per rollout (four 1 s sync reward functions in the run:
target <= 1.3 s, i.e. <= 1.3x ideal) and 4 functions per rollout (16 calls:
pool ~ 4 s vs inline ~ 16 s).

    .venv/bin/python benchmarks/bench_concurrency.py [--sleep 1.0] [--funcs 1,4]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROLLOUTS = 4
CONCURRENCY = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_funcs(n: int, seconds: float, inline: bool) -> list:
    funcs = []
    for i in range(n):
        if inline:
            async def f(completion, answer) -> float:
                time.sleep(seconds)  # noqa: ASYNC251 - deliberately blocks the loop (the baseline)
                return 1.0
        else:
            def f(completion, answer) -> float:
                time.sleep(seconds)
                return 1.0
        f.__name__ = f"sleep_{i}"
        funcs.append(f)
    return funcs


async def run_once(base_url: str, n_funcs: int, seconds: float, inline: bool) -> float:
    import envs as vf

    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(ROLLOUTS)]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=make_funcs(n_funcs, seconds, inline)))
    env.set_concurrency(CONCURRENCY)
    client = vf.OpenAIChatCompletionsClient(vf.ClientConfig(api_base_url=base_url, api_key_var="BENCH_KEY", max_retries=0))
    try:
        t0 = time.perf_counter()
        out = await env.evaluate(client, "bench", num_examples=ROLLOUTS, rollouts_per_example=1, max_concurrent=CONCURRENCY)
        wall = time.perf_counter() - t0
    finally:
        await client.close()
        await env.teardown()
    rewards = [o["reward"] for o in out["outputs"]]
    if rewards != [float(n_funcs)] * ROLLOUTS:
        raise RuntimeError(f"unexpected rewards {rewards}: {[o.get('error') for o in out['outputs']]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sleep", type=float, default=1.0, help="seconds each reward function sleeps")
    ap.add_argument("--funcs", default="1,4", help="reward functions per rollout, comma-separated scenarios")
    args = ap.parse_args()
    os.environ.setdefault("BENCH_KEY", "x")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "testmodel.model_server", "--port", str(port), "--policy", "compute"],
        cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    results = []
    try:
        server.stdout.readline()  # "model server on ..."
        base_url = f"http://127.0.0.1:{port}/v1"
        asyncio.run(run_once(base_url, 1, 0.0, False))  # warm-up: imports, first connection
        for n in (int(x) for x in args.funcs.split(",")):
            pool = asyncio.run(run_once(base_url, n, args.sleep, inline=False))
            inline = asyncio.run(run_once(base_url, n, args.sleep, inline=True))
            ideal = n * args.sleep
            results.append({"funcs_per_rollout": n, "calls": n * ROLLOUTS, "pool_s": pool, "inline_s": inline, "ideal_s": ideal})
    finally:
        server.terminate()
        server.wait(10)

    print(f"\n{ROLLOUTS} rollouts at concurrency {CONCURRENCY}, each reward function time.sleep({args.sleep:g}); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'funcs/rollout':>13s} {'sleep calls':>11s} {'pool s':>8s} {'inline s':>9s} {'ideal s':>8s} "
          f"{'pool/ideal':>11s} {'inline/pool':>12s}")
    for r in results:
        print(f"{r['funcs_per_rollout']:13d} {r['calls']:11d} {r['pool_s']:8.2f} {r['inline_s']:9.2f} {r['ideal_s']:8.2f} "
              f"{r['pool_s'] / r['ideal_s']:10.2f}x {r['inline_s'] / r['pool_s']:11.2f}x")
    first = next((r for r in results if r["funcs_per_rollout"] == 1), None)
    if first is not None:
        ok = first["pool_s"] <= 1.3 * first["ideal_s"]
        print(f"\ntarget (four {args.sleep:g} s sync reward functions at -c {CONCURRENCY} in <= {1.3 * args.sleep:.2f} s): "
              f"{'MET' if ok else 'NOT MET'} ({first['pool_s']:.2f} s; inline {first['inline_s']:.2f} s)")
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_concurrency.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
