"""v1 harness sandboxes on Docker, each row against a baseline measured in the
same run: `Env(taskset, Harness(program=..., sandbox=...))` evaluated against
the local model server, `--rollouts` rollouts at `--concurrency`, every model
call delayed `--model-latency` seconds (a stand-in for a real model).

  base loop, one sandbox created per rollout (`pool_size=0`)     the baseline
  base loop, the warm pool (sized by the concurrency)
  command program in a sandbox (one model call through the relay)      the baseline of the next row
  fn program in a sandbox (the same call from Python, package uploaded, in-sandbox State)

Each base-loop rollout: one `bash` call, then an answer. Wall time and
rollouts/s per row; ratios against the row's baseline.

    .venv/bin/python benchmarks/bench_v1.py [--rollouts 32] [--concurrency 8] [--model-latency 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ASK = textwrap.dedent("""
    import json, os, urllib.request
    task = json.loads(os.environ["VF_TASK_JSON"])
    body = {"model": os.environ["OPENAI_MODEL"], "messages": task["prompt"]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    print(json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"])
""")

AGENT = textwrap.dedent("""
    async def run(task, state):
        resp = await state.get_client().chat.completions.create(messages=task["prompt"])
        state["completion"] = [{"role": "assistant", "content": resp.choices[0].message.content}]
""")


async def one_row(name: str, harness_kwargs: dict, policy, args, backend, label: dict) -> dict:
    from openai import AsyncOpenAI

    from testmodel.model_server import ModelServer
    from envs.v1 import Env, Harness, Taskset

    rows = [{"prompt": f"What is {i} + 1?"} for i in range(args.rollouts)]
    sandbox = {"image": args.image, "labels": label, **harness_kwargs.pop("sandbox_extra", {})}
    env = Env(Taskset(source=rows), Harness(sandbox=sandbox, **harness_kwargs))
    env.set_backend(backend)
    env.set_concurrency(args.concurrency)
    try:
        async with ModelServer(policy) as srv:
            t0 = time.perf_counter()
            out = await env.evaluate(AsyncOpenAI(base_url=srv.base_url, api_key="x"), "m",
                                     num_examples=args.rollouts, max_concurrent=args.concurrency)
            wall = time.perf_counter() - t0
        pool = env.harness._pool
        stats = f"{pool.stats['warm']} warm / {pool.stats['cold']} cold" if pool is not None else "-"
    finally:
        await env.teardown()
    errors = [r["error"] for r in out["outputs"] if r["error"]]
    if errors:
        raise SystemExit(f"{name}: {len(errors)} rollouts failed, e.g. {errors[0]}")
    return {"name": name, "seconds": wall, "rps": args.rollouts / wall, "pool": stats}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--model-latency", type=float, default=0.3)
    ap.add_argument("--image", default="vf-sandbox/python:3.11")
    args = ap.parse_args()

    from backends.docker import DockerBackend
    from testmodel.model_server import PolicyRequest, compute, tool_then_answer

    def slow(inner):
        async def policy(req: PolicyRequest):
            await asyncio.sleep(args.model_latency)
            return inner(req)

        return policy

    pkg_root = Path(tempfile.mkdtemp(prefix="vf-bench-v1-"))
    (pkg_root / "vfbenchagent").mkdir()
    (pkg_root / "vfbenchagent" / "__init__.py").write_text("")
    (pkg_root / "vfbenchagent" / "agent.py").write_text(AGENT)
    sys.path.insert(0, str(pkg_root))
    label = {"vf-bench": "v1-" + uuid.uuid4().hex[:8]}
    backend = DockerBackend()
    try:
        bash = slow(tool_then_answer("bash", {"command": "echo hi"}))
        results = [
            await one_row("base loop, pool_size=0 (baseline)", {"program": {"base": True}, "sandbox_extra": {"pool_size": 0}},
                          bash, args, backend, label),
            await one_row("base loop, warm pool", {"program": {"base": True}}, bash, args, backend, label),
            await one_row("command program in a sandbox (baseline)",
                          {"program": {"command": ["python3", "/opt/ask.py"], "files": {"/opt/ask.py": ASK}}},
                          slow(compute()), args, backend, label),
            await one_row("fn program in a sandbox", {"program": {"fn": "vfbenchagent.agent:run"}}, slow(compute()),
                          args, backend, label),
        ]
    finally:
        await backend.delete_many(labels=label)
        await backend.close()
    print(f"\n{args.rollouts} rollouts at concurrency {args.concurrency}, model latency {args.model_latency:g}s")
    print(f"{'row':44} {'seconds':>8} {'rollouts/s':>11} {'x baseline':>11}  pool acquisitions")
    for i, r in enumerate(results):
        base = results[i - i % 2]
        print(f"{r['name']:44} {r['seconds']:8.2f} {r['rps']:11.2f} {r['rps'] / base['rps']:11.2f}  {r['pool']}")


if __name__ == "__main__":
    asyncio.run(main())
