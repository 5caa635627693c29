"""Cell fork benchmark (issue 28): how long `fork(n)` of a prepared cell takes, against the
same-run baselines of opening a fresh cell and of forking a container.

    .venv/bin/python benchmarks/bench_cell_fork.py            # runc and gVisor (when the engine has runsc)
    .venv/bin/python benchmarks/bench_cell_fork.py --quick    # fewer samples
    .venv/bin/python benchmarks/bench_cell_fork.py --json     # machine-readable too

The source cell is "prepared" (a project of SETUP_FILES files, SETUP_BYTES in all, plus a
deleted image file); each fork must see it. Rows, per runtime, samples interleaved (each round in
a random order) so machine load and teardowns hit every row alike:

  open a fresh cell          backend.create(rollout_isolation="namespace"): the baseline
  snapshot                   CellSandbox.snapshot(): the one copy of the source's writes
  fork(1)                    snapshot + one cell stacking it (target: p50 <= 20 ms under runc)
  fork(1) of a light source  the same of a cell that wrote 3 small files (the copy is O(what it wrote))
  cell of a snapshot         create_from_snapshot of a snapshot taken once: the O(1) part of a fork
  fork(8)                    snapshot + 8 cells at once; per cell = the call / 8
  8 fresh cells at once      8 x backend.create concurrently: fork(8)'s baseline
  container fork(1)          a container's fork (its filesystem committed to an image, a container
                             of it), and a fresh container: the other way to fork, for scale
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.docker import DockerBackend  # noqa: E402
from backends.docker.images import ensure_image  # noqa: E402
from sandboxes import ConfigError, SandboxSpec  # noqa: E402

IMAGE = "vf-sandbox/python:3.11"
LABELS = {"vf-sandbox.bench": "cell-fork"}
SETUP_FILES = 200
SETUP_BYTES = 4 << 20
TARGET_P50_MS = 20.0
SETTLE_S = 0.3  # a pause after each measured step: a row is not charged for the previous row's teardown
SETUP = (f"python3 -c \"import os\nos.makedirs('/work/proj/pkg', exist_ok=True)\n"
         f"for i in range({SETUP_FILES}):\n"
         f"    open('/work/proj/pkg/m%d.py' % i, 'wb').write(os.urandom({SETUP_BYTES // SETUP_FILES}))\" "
         "&& rm /etc/issue.net && echo ready > /work/proj/READY")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, object]:
    t = time.perf_counter()
    out = await fn()
    return (time.perf_counter() - t) * 1000, out


async def delete_all(sandboxes) -> None:
    await asyncio.gather(*(sb.delete() for sb in sandboxes))


async def check_fork(sb) -> None:
    r = await sb.exec("cat /work/proj/READY && test ! -e /etc/issue.net")
    if r.stdout != "ready\n":
        raise RuntimeError(f"a fork does not see the source's setup: {r}")


async def bench_cells(backend: DockerBackend, isolation: str, n: int) -> dict[str, list[float]]:
    spec = SandboxSpec(image=IMAGE, labels=LABELS, rollout_isolation="namespace", isolation=isolation,
                       memory_gb=0.5, timeout_minutes=30, workdir="/work")
    source, light = await backend.create(spec), await backend.create(spec)
    rows: dict[str, list[float]] = {k: [] for k in ("open", "snapshot", "from_snapshot", "fork1", "fork1_light",
                                                    "fork8", "open8")}
    try:
        r = await source.exec(SETUP, timeout=120)
        if not r.ok:
            raise RuntimeError(f"setup failed: {r}")
        r = await light.exec("mkdir -p proj && echo a > proj/a && echo b > proj/b && echo c > proj/c")
        if not r.ok:
            raise RuntimeError(f"light setup failed: {r}")
        forks = await source.fork(8)  # warm up (the host's zygote, the page cache) and check what a fork sees
        await asyncio.gather(*(check_fork(f) for f in forks))
        await delete_all(forks)

        async def open1() -> None:
            ms, sb = await timed(lambda: backend.create(spec))
            rows["open"].append(ms)
            await sb.delete()

        async def snapshot_and_cell() -> None:
            ms, snap = await timed(lambda: source.snapshot())
            rows["snapshot"].append(ms)
            ms, sb = await timed(lambda: backend.create_from_snapshot(snap))
            rows["from_snapshot"].append(ms)
            await sb.delete()
            await backend.delete_snapshot(snap)

        async def fork(k: int, row: str, of=source) -> None:
            ms, made = await timed(lambda: of.fork(k))
            rows[row].append(ms)
            await delete_all(made)

        async def open8() -> None:
            ms, fresh = await timed(lambda: asyncio.gather(*(backend.create(spec) for _ in range(8))))
            rows["open8"].append(ms)
            await delete_all(fresh)

        for _ in range(n):  # each round in a new order: what the previous row left to tear down hits every row
            steps = [open1, snapshot_and_cell, lambda: fork(1, "fork1"), lambda: fork(1, "fork1_light", light),
                     lambda: fork(8, "fork8"), open8]
            random.shuffle(steps)
            for step in steps:
                await step()
                await asyncio.sleep(SETTLE_S)  # the kernel's teardown of the cells just deleted (namespaces)
    finally:
        await delete_all([source, light])
    return rows


async def bench_containers(backend: DockerBackend, n: int) -> dict[str, list[float]]:
    spec = SandboxSpec(image=IMAGE, labels=LABELS, memory_gb=0.5, timeout_minutes=30, workdir="/work")
    source = await backend.create(spec)
    rows: dict[str, list[float]] = {"container_create": [], "container_fork1": []}
    try:
        r = await source.exec(SETUP, timeout=120)
        if not r.ok:
            raise RuntimeError(f"setup failed: {r}")
        for i in range(n):
            ms, sb = await timed(lambda: backend.create(spec))
            rows["container_create"].append(ms)
            await sb.delete()
            ms, forks = await timed(lambda: source.fork(1))
            rows["container_fork1"].append(ms)
            if i == 0:
                await check_fork(forks[0])
            await delete_all(forks)
    finally:
        await source.delete()
    return rows


def report(isolation: str, rows: dict[str, list[float]], containers: dict[str, list[float]] | None) -> dict:
    def p(name: str, q: float) -> float:
        return pct(rows[name], q)

    out = {k: {"p50_ms": round(pct(v, 0.5), 2), "p99_ms": round(pct(v, 0.99), 2), "n": len(v)}
           for k, v in {**rows, **(containers or {})}.items()}
    print(f"\n[{isolation}] cells of one host, {len(rows['open'])} samples per row (interleaved)")
    print(f"  {'what':<34} {'p50 ms':>8} {'p99 ms':>8}   ratio (p50)")
    lines = [
        ("open a fresh cell (baseline)", "open", ""),
        ("snapshot (copy of the writes)", "snapshot", ""),
        ("cell of a snapshot", "from_snapshot", f"{p('from_snapshot', .5) / p('open', .5):.2f}x a fresh cell"),
        ("fork(1)", "fork1", f"{p('fork1', .5) / p('open', .5):.2f}x a fresh cell"),
        ("fork(1) of a light source", "fork1_light", f"{p('fork1_light', .5) / p('open', .5):.2f}x a fresh cell"),
        ("fork(8), the call", "fork8", f"{p('fork8', .5) / p('open8', .5):.2f}x 8 fresh cells at once"),
        ("8 fresh cells at once (baseline)", "open8", ""),
    ]
    for label, key, ratio in lines:
        print(f"  {label:<34} {p(key, .5):8.1f} {p(key, .99):8.1f}   {ratio}")
    per_cell = p("fork8", .5) / 8
    print(f"  {'fork(8) per cell':<34} {per_cell:8.1f} {'':>8}   {per_cell / p('open', .5):.2f}x a fresh cell")
    out["fork8_per_cell_p50_ms"] = round(per_cell, 2)
    if containers:
        c_fork, c_create = pct(containers["container_fork1"], .5), pct(containers["container_create"], .5)
        print(f"  {'container fork(1)':<34} {c_fork:8.1f} {pct(containers['container_fork1'], .99):8.1f}   "
              f"cell fork(1) is {c_fork / p('fork1', .5):.0f}x faster")
        print(f"  {'fresh container (baseline)':<34} {c_create:8.1f} {pct(containers['container_create'], .99):8.1f}")
    if isolation == "runc":
        for key, what in (("fork1", f"{SETUP_FILES} files"), ("fork1_light", "3 files")):
            verdict = "PASS" if p(key, .5) <= TARGET_P50_MS else "FAIL"
            print(f"  target: cell fork(1) p50 <= {TARGET_P50_MS:.0f} ms, source wrote {what}: {verdict} "
                  f"({p(key, .5):.1f} ms)")
            out[f"target_{key}_p50_ms"] = {"target": TARGET_P50_MS, "pass": verdict == "PASS"}
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    ap.add_argument("--runtimes", default="runc,gvisor", help="comma-separated: runc, gvisor")
    args = ap.parse_args()
    await asyncio.to_thread(ensure_image, IMAGE)
    print(f"bench_cell_fork on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
          f"setup: {SETUP_FILES} files, {SETUP_BYTES >> 20} MiB")
    backend = DockerBackend()
    results: dict[str, dict] = {}
    try:
        for isolation in args.runtimes.split(","):
            n = (8 if args.quick else 30) if isolation == "runc" else (4 if args.quick else 12)
            try:
                rows = await bench_cells(backend, isolation, n)
            except ConfigError as exc:  # no runsc runtime in the engine
                print(f"\n[{isolation}] skipped: {exc}")
                continue
            containers = await bench_containers(backend, 3 if args.quick else 6) if isolation == "runc" else None
            results[isolation] = report(isolation, rows, containers)
    finally:
        await backend.close()
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end (p99 of a few dozen samples: about the worst one)")


if __name__ == "__main__":
    asyncio.run(main())
