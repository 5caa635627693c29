"""gVisor cost: the same operations with isolation="gvisor" (the engine's runsc runtime,
ptrace platform) and with runc (the baseline), measured in the same run, interleaved so
both see the same machine load.

Rows:
  exec round trip p50 `echo hi`   through the persistent agent (one round trip per command)
  fork+exec x20 in one command    `for i in 1..20; do /bin/true; done` (process creation cost)
  create -> ready -> delete p50   a sandbox with its agent answering
  PythonEnv cell `1+1` p50        the python tool of a PythonEnv (persistent worker), each in a
                                  container (rollout_isolation="container": "auto" would pick a
                                  namespace cell under runc and a container under gVisor)
  SWE instance (idna) total/tests one gold run of the example instance through run_debug

    .venv/bin/python benchmarks/bench_gvisor.py [--quick] [--json]
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

from backends.docker import DockerBackend  # noqa: E402
from backends.docker.images import ensure_image  # noqa: E402
from sandboxes import SandboxSpec  # noqa: E402

LABELS = {"vf-sandbox.bench": "1", "vf-bench": "gvisor"}
ISOLATIONS = ("runc", "gvisor")
IDNA = "kjd__idna-3.4"


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(fn) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def bench_exec(backend: DockerBackend, image: str, n: int) -> dict:
    sbs = {iso: await backend.create(SandboxSpec(image=image, isolation=iso, labels=LABELS)) for iso in ISOLATIONS}
    fork20 = "i=0; while [ $i -lt 20 ]; do /bin/true; i=$((i+1)); done"
    echo: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}
    forks: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}
    try:
        for sb in sbs.values():
            for _ in range(10):
                await sb.exec(["echo", "hi"])
        for i in range(n):
            for iso, sb in sbs.items():
                echo[iso].append(await timed(lambda: sb.exec(["echo", "hi"])))
                if i % 5 == 0:
                    forks[iso].append(await timed(lambda: sb.exec(fork20)))
    finally:
        for sb in sbs.values():
            await sb.delete()
    return {"exec_p50_ms": {k: p50(v) for k, v in echo.items()},
            "fork20_p50_ms": {k: p50(v) for k, v in forks.items()}, "n": n}


async def bench_lifecycle(backend: DockerBackend, image: str, n: int) -> dict:
    out: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}

    async def cycle(iso: str) -> None:
        sb = await backend.create(SandboxSpec(image=image, isolation=iso, labels=LABELS))
        await sb.delete()

    for _ in range(n):
        for iso in ISOLATIONS:
            out[iso].append(await timed(lambda: cycle(iso)))
    return {"lifecycle_p50_ms": {k: p50(v) for k, v in out.items()}, "n": n}


async def bench_python_cell(n: int) -> dict:
    import envs as vf

    out: dict[str, float] = {}
    envs_states = {}
    for iso in ISOLATIONS:
        env = vf.PythonEnv(dataset=[{"question": "q", "answer": "a"}], pip_install_packages="", labels=LABELS,
                           isolation=iso, pool_size=0, rollout_isolation="container")
        state = await env.init_state({"prompt": [], "example_id": 0, "answer": "a", "task": "bench"}, None, "m")
        state = await env.setup_state(state)
        envs_states[iso] = (env, state)
    samples: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}
    try:
        for env, state in envs_states.values():
            assert "2" in await env.python("1+1", state["sandbox_id"])
        for _ in range(n):
            for iso, (env, state) in envs_states.items():
                samples[iso].append(await timed(lambda: env.python("1+1", state["sandbox_id"])))
    finally:
        for env, state in envs_states.values():
            await env.cleanup(state)
            await env.teardown()
    out = {k: p50(v) for k, v in samples.items()}
    return {"python_cell_p50_ms": out, "n": n}


async def bench_swe(reps: int) -> dict:
    from sandboxes import get_backend
    from swe_debug.debug import DebugOptions, run_debug
    from swe_debug.examples.builder import build_dataset, build_images
    from swe_debug.instances import load_instances
    from swe_debug.taskset import SWETaskSet

    dataset = build_dataset()
    await build_images(dataset)
    inst = next(i for i in load_instances(dataset).instances if i.instance_id == IDNA)
    ts = SWETaskSet([inst])
    backend = get_backend("docker")
    total: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}
    tests: dict[str, list[float]] = {iso: [] for iso in ISOLATIONS}
    try:
        for _ in range(reps):
            for iso in ISOLATIONS:
                o = await run_debug(ts, inst, backend, DebugOptions(isolation=iso, labels=dict(LABELS)))
                if not o.valid:
                    raise RuntimeError(f"{IDNA} under {iso}: {o.reason} {o.detail}")
                total[iso].append(o.timings.total_s)
                tests[iso].append(o.timings.tests_s)
    finally:
        await backend.close()
    return {"swe_total_s": {k: statistics.median(v) for k, v in total.items()},
            "swe_tests_s": {k: statistics.median(v) for k, v in tests.items()}, "reps": reps}


def table(r: dict) -> str:
    rows = [("metric", "runc", "gvisor", "gvisor/runc")]

    def add(name: str, d: dict, fmt: str) -> None:
        rows.append((name, format(d["runc"], fmt), format(d["gvisor"], fmt), f"{d['gvisor'] / d['runc']:.1f}x"))

    add("exec round trip p50 `echo hi` (ms)", r["exec"]["exec_p50_ms"], ".2f")
    add("20 fork+exec in one command p50 (ms)", r["exec"]["fork20_p50_ms"], ".1f")
    add("create->ready->delete p50 (ms)", r["lifecycle"]["lifecycle_p50_ms"], ".0f")
    add("PythonEnv cell `1+1` p50 (ms)", r["python"]["python_cell_p50_ms"], ".2f")
    if "swe" in r:
        add(f"SWE {IDNA} gold run total (s)", r["swe"]["swe_total_s"], ".2f")
        add("  of which the test run (s)", r["swe"]["swe_tests_s"], ".2f")
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"load average at start / end: {r['load_start']} / {r['load_end']} (2 cores, shared with other jobs)")
    return "\n".join(lines)


async def main(args) -> dict:
    import subprocess

    runtimes = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True).stdout
    if '"runsc"' not in runtimes:
        raise SystemExit("bench_gvisor: the engine has no 'runsc' runtime (scripts/setup.sh registers it)")
    image = ensure_image(args.image)
    q = args.quick
    res: dict = {"load_start": Path("/proc/loadavg").read_text().split()[0], "image": image}
    backend = DockerBackend()
    try:
        res["exec"] = await bench_exec(backend, image, n=60 if q else 300)
        res["lifecycle"] = await bench_lifecycle(backend, image, n=3 if q else 8)
    finally:
        await backend.close()
    res["python"] = await bench_python_cell(n=30 if q else 200)
    if not args.skip_swe:
        res["swe"] = await bench_swe(reps=1 if q else 2)
    res["load_end"] = Path("/proc/loadavg").read_text().split()[0]
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--skip-swe", action="store_true")
    ap.add_argument("--image", default="vf-sandbox/python:3.11")
    a = ap.parse_args()
    out = asyncio.run(main(a))
    print(json.dumps(out, indent=2) if a.json else table(out))
