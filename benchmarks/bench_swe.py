"""SWE debugging benchmark: per-instance wall time split by phase for the example
taskset (idna, python-dateutil, more-itertools gold runs), cold (images built
from scratch under fresh keys) vs warm (cached), at concurrency 1 and 4.

Baseline, measured in the same run: one plain `docker run --rm --network none`
per instance on the same image doing the same work (apply the gold patch and
the test patch, run the same test command) — what a minimal harness costs.
The target: warm per-instance overhead beyond the test run itself ≤ 1 s.

    .venv/bin/python benchmarks/bench_swe.py [--reps 3] [--skip-cold]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandboxes import get_backend  # noqa: E402
from swe_debug.debug import DebugOptions, run_debug  # noqa: E402
from swe_debug.examples.builder import build_dataset  # noqa: E402
from swe_debug.images import ImageBuilder  # noqa: E402
from swe_debug.instances import load_instances  # noqa: E402
from swe_debug.taskset import SWETaskSet  # noqa: E402

VALID = ["kjd__idna-3.4", "dateutil__dateutil-2.8.2", "more-itertools__more-itertools-10.2.0"]
PHASES = ["create_s", "setup_s", "debug_s", "test_patch_s", "tests_s", "delete_s", "total_s"]


def baseline_run(inst, image: str) -> float:
    """Wall seconds of one `docker run --rm` doing apply gold + test patch + tests."""
    ts = SWETaskSet([inst])
    script = (
        f"cd {inst.workdir} && printf %s {shlex.quote(inst.patch)} > /tmp/g.diff && git apply /tmp/g.diff"
        f" && printf %s {shlex.quote(inst.test_patch)} > /tmp/t.diff && git apply /tmp/t.diff"
        f" ; {ts.test_command(inst)} > /tmp/log 2>&1; echo $?"
    )
    env = [x for k, v in inst.run_env().items() for x in ("-e", f"{k}={v}")]
    t0 = time.perf_counter()
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", *env, image, "bash", "-c", script],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0 or r.stdout.strip() not in ("0", "1"):
        raise RuntimeError(f"baseline run failed for {inst.instance_id}: {r.stdout[-500:]} {r.stderr[-500:]}")
    return dt


async def gold_runs(ts: SWETaskSet, insts, concurrency: int, reps: int) -> list[dict]:
    backend = get_backend("docker")
    sem = asyncio.Semaphore(concurrency)
    opts = DebugOptions()

    async def one(inst):
        async with sem:
            o = await run_debug(ts, inst, backend, opts)
            if not o.valid:
                raise RuntimeError(f"{inst.instance_id}: {o.reason} {o.detail}")
            return {"instance_id": inst.instance_id, **o.timings.model_dump(), "overhead_s": o.timings.overhead_s(),
                    "built": o.images_built}

    try:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(one(i) for _ in range(reps) for i in insts))
        wall = time.perf_counter() - t0
    finally:
        await backend.close()
    for r in rows:
        r["batch_wall_s"] = wall
    return list(rows)


def med(rows, key):
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="warm gold runs per instance at each concurrency")
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_swe.json"))
    args = ap.parse_args()

    load0 = Path("/proc/loadavg").read_text().split()[0]
    dataset = build_dataset()
    insts = {i.instance_id: i for i in load_instances(dataset).instances}
    chosen = [insts[i] for i in VALID]
    results: dict = {"cold": [], "warm": {}, "baseline": {}}

    # warm images (the shared cache) for the baseline and the warm runs
    warm_builder = ImageBuilder()
    tags = {i.instance_id: asyncio.run(warm_builder.ensure(i)).tag for i in chosen}

    cold_tags: list[str] = []
    if not args.skip_cold:
        salt = f"bench-{uuid.uuid4().hex[:8]}"
        cold_builder = ImageBuilder(salt=salt, no_cache=True)
        ts = SWETaskSet(chosen, builder=cold_builder)
        rows = asyncio.run(gold_runs(ts, chosen, 1, 1))  # image build included (image_s)
        results["cold"] = rows
        for inst in chosen:
            ref = asyncio.run(cold_builder.ensure(inst))
            cold_tags += [ref.tag, ref.env_tag]
        subprocess.run(["docker", "rmi", "-f", *dict.fromkeys(cold_tags)], capture_output=True)

    ts = SWETaskSet(chosen, builder=warm_builder)
    # c=1 interleaved with the baseline (same instance, back to back) so that load drift hits both
    results["warm"][1] = []
    for _ in range(args.reps):
        for inst in chosen:
            results["warm"][1] += asyncio.run(gold_runs(ts, [inst], 1, 1))
            results["baseline"].setdefault(inst.instance_id, []).append(baseline_run(inst, tags[inst.instance_id]))
    for r in results["warm"][1]:
        r["batch_wall_s"] = sum(x["total_s"] for x in results["warm"][1])
    results["warm"][4] = asyncio.run(gold_runs(ts, chosen, 4, args.reps))

    # ------------------------------------------------------------------ report
    print("\nper-instance phases, seconds (median over runs)")
    hdr = f"{'instance':40s} {'mode':8s} " + " ".join(f"{p[:-2]:>10s}" for p in ["image_s", *PHASES]) + f" {'overhead':>9s}"
    print(hdr)
    print("-" * len(hdr))
    for inst in chosen:
        iid = inst.instance_id
        sets = [("cold", [r for r in results["cold"] if r["instance_id"] == iid])]
        sets += [(f"warm c={c}", [r for r in results["warm"][c] if r["instance_id"] == iid]) for c in (1, 4)]
        for mode, rows in sets:
            if not rows:
                continue
            vals = " ".join(f"{med(rows, p):10.3f}" for p in ["image_s", *PHASES])
            print(f"{iid:40s} {mode:8s} {vals} {med(rows, 'overhead_s'):9.3f}")

    print("\nagainst the baseline (plain `docker run --rm` doing the same apply + tests, same image)")
    print(f"{'instance':40s} {'baseline s':>10s} {'ours c=1 s':>10s} {'ratio':>6s} {'tests s':>8s} {'overhead s':>10s} {'≤1s':>4s}")
    worst = 0.0
    for inst in chosen:
        iid = inst.instance_id
        rows = [r for r in results["warm"][1] if r["instance_id"] == iid]
        base = statistics.median(results["baseline"][iid])
        ours = med(rows, "total_s")
        ov = med(rows, "overhead_s")
        worst = max(worst, ov)
        print(f"{iid:40s} {base:10.3f} {ours:10.3f} {ours / base:6.2f} {med(rows, 'tests_s'):8.3f} {ov:10.3f} {'yes' if ov <= 1 else 'NO':>4s}")
    for c in (1, 4):
        rows = results["warm"][c]
        wall = rows[0]["batch_wall_s"]
        print(f"warm c={c}: {len(rows)} rollouts in {wall:.1f}s = {wall / len(rows):.2f} s/instance")
    if results["cold"]:
        cold_img = sum(r["image_s"] for r in results["cold"])
        print(f"cold: image builds {cold_img:.1f}s in total (layers built: "
              f"{', '.join(r['instance_id'].split('__')[0] + '=' + '+'.join(r['built']) for r in results['cold'])})")
    print(f"worst warm overhead beyond the test run: {worst:.3f}s (target ≤ 1 s: {'met' if worst <= 1 else 'NOT met'})")
    load1 = Path("/proc/loadavg").read_text().split()[0]
    print(f"1-min load average at start / end: {load0} / {load1} on {os.cpu_count()} cores (other work inflates every figure)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
