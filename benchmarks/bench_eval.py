"""Eval-stack throughput: 1000 single-turn rollouts at concurrency 256 against
the local model server (its own process), in the same run:

- vf-sandbox    `SingleTurnEnv.evaluate` (this project; openai SDK on its aiohttp transport)
- verifiers     0.3.1 `SingleTurnEnv.evaluate` (installed into a separate venv,
                .cache/bench-verifiers-venv, never into the project venv), given a
                ClientConfig so it builds its client as shipped (the baseline of the
                target), and "verifiers-wrapped": handed a plain AsyncOpenAI instead
- floor         the same 1000 requests with the bare AsyncOpenAI client, no
                framework (aiohttp transport, and openai's default transport)

Each variant runs in a fresh subprocess; we report rollouts/s, CPU seconds
(user+sys of that process) and peak RSS, and the ratios against verifiers.
Target: >= 5x verifiers' rollouts/s and <= 1/2 its peak RSS.

    .venv/bin/python benchmarks/bench_eval.py [--rollouts 1000] [--concurrency 256] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "bench-verifiers-venv"
VERIFIERS_PIN = "verifiers==0.3.1"
SYSTEM = "Give the final answer in \\boxed{}."


def rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + {i % 97}?", "answer": str(i + i % 97)} for i in range(n)]


_CPU0 = [0.0]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def start_clock() -> float:
    """Start the timed region (wall clock and this process's CPU)."""
    _CPU0[0] = _cpu()
    return time.perf_counter()


def usage_report(t0: float, n: int, rewards: list[float]) -> dict:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": time.perf_counter() - t0,
        "rollouts": n,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "work_cpu_s": _cpu() - _CPU0[0],
        "peak_rss_mib": ru.ru_maxrss / 1024,
        "avg_reward": sum(rewards) / len(rewards) if rewards else 0.0,
    }


# --------------------------------------------------------------------------- workers (run in subprocesses)


def worker_vf_sandbox(base_url: str, n: int, conc: int) -> dict:
    import asyncio

    sys.path.insert(0, str(ROOT))
    import envs as vf

    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct(completion, answer, parser) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    env = vf.SingleTurnEnv(dataset=rows(n), system_prompt=SYSTEM, parser=parser, rubric=vf.Rubric(funcs=[correct], parser=parser))
    config = vf.ClientConfig(api_base_url=base_url, api_key_var="BENCH_KEY", max_retries=0)
    client = vf.OpenAIChatCompletionsClient(config)  # built before the clock starts, like the others

    async def main():
        try:
            return await env.evaluate(client, "bench", num_examples=n, rollouts_per_example=1, max_concurrent=conc)
        finally:
            await client.close()

    t0 = start_clock()
    out = asyncio.run(main())
    return usage_report(t0, len(out["outputs"]), [o["reward"] for o in out["outputs"]])


def worker_verifiers(base_url: str, n: int, conc: int, how: str = "config") -> dict:
    """how="config": verifiers builds its own client from a ClientConfig (what
    `vf-eval` does: httpx pool sized 28000); "wrapped": a plain AsyncOpenAI on
    openai's default transport wrapped in vf.OpenAIChatCompletionsClient."""
    import asyncio

    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI

    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def correct(completion, answer, parser) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows(n)), system_prompt=SYSTEM, parser=parser, rubric=vf.Rubric(funcs=[correct], parser=parser)
    )
    if how == "config":
        client = vf.ClientConfig(api_base_url=base_url, api_key_var="BENCH_KEY", max_retries=0)
    else:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0))

    async def main():
        return await env.evaluate(client, "bench", num_examples=n, rollouts_per_example=1, max_concurrent=conc)

    t0 = start_clock()
    out = asyncio.run(main())
    outputs = out["outputs"] if isinstance(out, dict) else out.outputs
    return usage_report(t0, len(outputs), [float(o["reward"]) for o in outputs])


def worker_floor(base_url: str, n: int, conc: int, transport: str) -> dict:
    import asyncio

    import openai

    async def main() -> list[float]:
        http_client = openai.DefaultAioHttpClient() if transport == "aiohttp" else None
        # connect timeout 60 s, not openai's 5 s: 256 connections opened at once on a loaded 2-core machine
        # took longer (ConnectTimeout at load average ~38); with max_retries=0 one such request ended the run
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, http_client=http_client,
                                    timeout=openai.Timeout(600, connect=60))
        sem = asyncio.Semaphore(conc)

        async def one(row: dict) -> float:
            async with sem:
                r = await client.chat.completions.create(
                    model="bench",
                    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}],
                )
            return 1.0 if f"\\boxed{{{row['answer']}}}" in (r.choices[0].message.content or "") else 0.0

        try:
            return list(await asyncio.gather(*(one(r) for r in rows(n))))
        finally:
            await client.close()

    t0 = start_clock()
    rewards = asyncio.run(main())
    return usage_report(t0, len(rewards), rewards)


# --------------------------------------------------------------------------- orchestration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_verifiers_venv() -> Path:
    py = VENV / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import verifiers, datasets, openai"], capture_output=True).returncode == 0
    if not ok:
        print(f"creating {VENV} with {VERIFIERS_PIN} ...", flush=True)
        subprocess.run(["uv", "venv", "-q", "-p", "3.11", str(VENV)], check=True)
        subprocess.run(["uv", "pip", "install", "-q", "--python", str(py), VERIFIERS_PIN], check=True)
    return py


def run_variant(python: str, mode: str, base_url: str, n: int, conc: int) -> dict:
    env = {**os.environ, "BENCH_KEY": "x", "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}
    proc = subprocess.run(
        [python, __file__, "--worker", mode, "--base-url", base_url, "--rollouts", str(n), "--concurrency", str(conc)],
        capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=1800,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=1, help="runs per variant (best rollouts/s kept)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--skip-verifiers", action="store_true")
    args = ap.parse_args()

    if args.worker:
        fn = {
            "vf-sandbox": lambda: worker_vf_sandbox(args.base_url, args.rollouts, args.concurrency),
            "verifiers": lambda: worker_verifiers(args.base_url, args.rollouts, args.concurrency, "config"),
            "verifiers-wrapped": lambda: worker_verifiers(args.base_url, args.rollouts, args.concurrency, "wrapped"),
            "floor-aiohttp": lambda: worker_floor(args.base_url, args.rollouts, args.concurrency, "aiohttp"),
            "floor-default": lambda: worker_floor(args.base_url, args.rollouts, args.concurrency, "default"),
        }[args.worker]
        print(json.dumps(fn()), flush=True)
        return

    project_py = sys.executable
    variants = [("vf-sandbox", project_py), ("floor-aiohttp", project_py), ("floor-default", project_py)]
    if not args.skip_verifiers:
        vpy = str(ensure_verifiers_venv())
        variants[1:1] = [("verifiers", vpy), ("verifiers-wrapped", vpy)]
    port = free_port()
    server = subprocess.Popen(
        [project_py, "-m", "testmodel.model_server", "--port", str(port), "--policy", "compute"],
        cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        server.stdout.readline()  # "model server on ..."
        base_url = f"http://127.0.0.1:{port}/v1"
        runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
        for rep in range(args.repeat):
            for name, py in variants:  # interleaved, so load changes hit every variant alike
                res = run_variant(py, name, base_url, args.rollouts, args.concurrency)
                res["rollouts_per_s"] = res["rollouts"] / res["seconds"]
                runs[name].append(res)
                print(f"  run {rep + 1} {name:14s} {res['rollouts_per_s']:8.1f} rollouts/s  work cpu {res['work_cpu_s']:6.2f} s  "
                      f"process cpu {res['cpu_s']:6.2f} s  rss {res['peak_rss_mib']:6.1f} MiB  reward {res['avg_reward']:.3f}", flush=True)
    finally:
        server.terminate()
        server.wait(10)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    results = {
        name: {
            "rollouts_per_s": median(name, "rollouts_per_s"),
            "work_cpu_ms_per_rollout": 1000 * median(name, "work_cpu_s") / args.rollouts,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs[name]),
            "runs": runs[name],
        }
        for name, _ in variants
    }
    base = results.get("verifiers")
    print(f"\n{args.rollouts} single-turn rollouts, concurrency {args.concurrency}, local model server in its own process, "
          f"median of {args.repeat} interleaved run(s); load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'variant':16s} {'rollouts/s':>11s} {'CPU ms/rollout':>15s} {'peak RSS MiB':>13s} {'x verifiers/s':>14s} {'x verifiers CPU eff.':>21s} {'RSS / verifiers':>16s}")
    for name, _ in variants:
        r = results[name]
        speed = f"{r['rollouts_per_s'] / base['rollouts_per_s']:.2f}x" if base else "-"
        eff = f"{base['work_cpu_ms_per_rollout'] / r['work_cpu_ms_per_rollout']:.2f}x" if base else "-"
        mem = f"{r['peak_rss_mib'] / base['peak_rss_mib']:.2f}" if base else "-"
        print(f"{name:16s} {r['rollouts_per_s']:11.1f} {r['work_cpu_ms_per_rollout']:15.2f} {r['peak_rss_mib']:13.1f} {speed:>14s} {eff:>21s} {mem:>16s}")
    if base:
        ours = results["vf-sandbox"]
        ok = ours["rollouts_per_s"] >= 5 * base["rollouts_per_s"] and ours["peak_rss_mib"] <= 0.5 * base["peak_rss_mib"]
        print(f"\ntarget (>= 5x verifiers' rollouts/s and <= 1/2 its peak RSS, verifiers as shipped): {'MET' if ok else 'NOT MET'}")
        wrapped = results.get("verifiers-wrapped")
        if wrapped:
            print(f"vs verifiers-wrapped (its fastest client setup): {ours['rollouts_per_s'] / wrapped['rollouts_per_s']:.2f}x rollouts/s, "
                  f"{wrapped['work_cpu_ms_per_rollout'] / ours['work_cpu_ms_per_rollout']:.2f}x CPU efficiency")
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_eval.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
