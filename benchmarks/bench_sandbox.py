"""Sandbox benchmark: the Docker backend (agent over one attached exec) against
the raw Docker API way (one exec per command), measured in the same run.

    .venv/bin/python benchmarks/bench_sandbox.py            # table
    .venv/bin/python benchmarks/bench_sandbox.py --json     # machine-readable
    .venv/bin/python benchmarks/bench_sandbox.py --quick    # fewer samples

Rows (targets from issue 2):
  exec round trip p50/p95      ours vs raw aiodocker exec per command (p50 <= 3 ms, >= 20x faster)
  create -> ready -> delete    ours vs raw create+start+remove (<= 1.2x)
  warm pool acquire p50        (<= 10 ms)
  32 sandboxes x 20 commands   wall time ours vs raw (<= 0.5x, 0 errors)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.docker import DockerBackend  # noqa: E402
from backends.docker.images import ensure_image  # noqa: E402
from sandboxes import SandboxSpec  # noqa: E402
from sandboxes.pool import SandboxPool  # noqa: E402

BENCH_LABEL = {"vf-sandbox.bench": "1"}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


# ---------------------------------------------------------------- raw baseline


async def raw_create(docker, image: str):
    config = {"Image": image, "Cmd": ["tail", "-f", "/dev/null"], "Labels": BENCH_LABEL,
              "HostConfig": {"NetworkMode": "none", "AutoRemove": True}}
    c = await docker.containers.create(config)
    await c.start()
    return c


async def raw_exec(container, argv: list[str]) -> tuple[int, bytes]:
    """One command the raw way: exec create + attached start + read all + inspect for the exit code."""
    ex = await container.exec(argv, stdout=True, stderr=True, stdin=False, tty=False)
    out = bytearray()
    async with ex.start(detach=False) as stream:
        while (msg := await stream.read_out()) is not None:
            out += msg.data
    info = await ex.inspect()
    return info["ExitCode"], bytes(out)


async def raw_delete(container) -> None:
    import aiodocker

    try:
        await container.delete(force=True)
    except aiodocker.DockerError as exc:
        if exc.status not in (404, 409):
            raise


# ---------------------------------------------------------------- measurements


async def bench_exec(backend: DockerBackend, spec: SandboxSpec, n_ours: int, n_raw: int) -> dict:
    docker = await backend._client()
    sb = await backend.create(spec)
    raw = await raw_create(docker, spec.image)
    try:
        for _ in range(20):  # warm up both paths
            await sb.exec(["echo", "hi"])
        for _ in range(3):
            await raw_exec(raw, ["echo", "hi"])
        ours, base = [], []
        for i in range(max(n_ours, n_raw)):  # interleaved so both see the same machine load
            if i < n_ours:
                t = time.perf_counter()
                r = await sb.exec(["echo", "hi"])
                ours.append(time.perf_counter() - t)
                assert r.stdout == "hi\n"
            if i < n_raw:
                t = time.perf_counter()
                code, out = await raw_exec(raw, ["echo", "hi"])
                base.append(time.perf_counter() - t)
                assert code == 0 and out == b"hi\n"
    finally:
        await sb.delete()
        await raw_delete(raw)
    return {"ours_p50_ms": pct(ours, 0.5) * 1e3, "ours_p95_ms": pct(ours, 0.95) * 1e3,
            "raw_p50_ms": pct(base, 0.5) * 1e3, "raw_p95_ms": pct(base, 0.95) * 1e3,
            "speedup_p50": pct(base, 0.5) / pct(ours, 0.5), "n_ours": len(ours), "n_raw": len(base)}


async def bench_lifecycle(backend: DockerBackend, spec: SandboxSpec, n: int) -> dict:
    docker = await backend._client()
    ours, base = [], []
    for _ in range(n):
        t = time.perf_counter()
        sb = await backend.create(spec)
        await sb.delete()
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        c = await raw_create(docker, spec.image)
        await raw_delete(c)
        base.append(time.perf_counter() - t)
    return {"ours_p50_ms": pct(ours, 0.5) * 1e3, "raw_p50_ms": pct(base, 0.5) * 1e3,
            "ratio_p50": pct(ours, 0.5) / pct(base, 0.5), "n": n}


async def bench_pool(backend: DockerBackend, spec: SandboxSpec, n: int, size: int = 4) -> dict:
    times = []
    async with SandboxPool(spec, size=size, backend=backend) as pool:
        for _ in range(n):
            await pool.start(wait=True, timeout=120)  # warm: the pool is full
            t = time.perf_counter()
            sb = await pool.acquire()
            times.append(time.perf_counter() - t)
            await pool.release(sb)
        warm = pool.stats["warm"]
    return {"acquire_p50_ms": pct(times, 0.5) * 1e3, "acquire_p95_ms": pct(times, 0.95) * 1e3, "n": n, "warm": warm}


async def bench_fleet(backend: DockerBackend, spec: SandboxSpec, sandboxes: int, commands: int) -> dict:
    docker = await backend._client()

    async def ours_one(i: int) -> int:
        errors = 0
        sb = await backend.create(spec)
        try:
            for j in range(commands):
                r = await sb.exec(["echo", f"{i}-{j}"])
                errors += r.stdout != f"{i}-{j}\n"
        finally:
            await sb.delete()
        return errors

    async def raw_one(i: int) -> int:
        errors = 0
        c = await raw_create(docker, spec.image)
        try:
            for j in range(commands):
                code, out = await raw_exec(c, ["echo", f"{i}-{j}"])
                errors += code != 0 or out != f"{i}-{j}\n".encode()
        finally:
            await raw_delete(c)
        return errors

    async def run(fn) -> tuple[float, int]:
        t = time.perf_counter()
        results = await asyncio.gather(*(fn(i) for i in range(sandboxes)), return_exceptions=True)
        wall = time.perf_counter() - t
        errors = sum(1 if isinstance(r, BaseException) else r for r in results)
        return wall, errors

    ours_wall, ours_err = await run(ours_one)
    raw_wall, raw_err = await run(raw_one)
    return {"ours_wall_s": ours_wall, "raw_wall_s": raw_wall, "ratio": ours_wall / raw_wall,
            "ours_errors": ours_err, "raw_errors": raw_err, "sandboxes": sandboxes, "commands": commands}


# ---------------------------------------------------------------- report


def table(r: dict) -> str:
    e, lc, p, f = r["exec"], r["lifecycle"], r["pool"], r["fleet"]
    rows = [
        ("metric", "ours", "raw", "ratio", "target", "ok"),
        ("exec round trip p50 (ms)", f"{e['ours_p50_ms']:.2f}", f"{e['raw_p50_ms']:.2f}",
         f"{e['speedup_p50']:.1f}x faster", "<= 3 ms, >= 20x", _ok(e["ours_p50_ms"] <= 3 and e["speedup_p50"] >= 20)),
        ("exec round trip p95 (ms)", f"{e['ours_p95_ms']:.2f}", f"{e['raw_p95_ms']:.2f}",
         f"{e['raw_p95_ms'] / e['ours_p95_ms']:.1f}x faster", "-", "-"),
        ("create->ready->delete p50 (ms)", f"{lc['ours_p50_ms']:.0f}", f"{lc['raw_p50_ms']:.0f}",
         f"{lc['ratio_p50']:.2f}x", "<= 1.2x", _ok(lc["ratio_p50"] <= 1.2)),
        ("warm pool acquire p50 (ms)", f"{p['acquire_p50_ms']:.3f}", "-", "-", "<= 10 ms", _ok(p["acquire_p50_ms"] <= 10)),
        (f"{f['sandboxes']} sandboxes x {f['commands']} cmds wall (s)", f"{f['ours_wall_s']:.1f}", f"{f['raw_wall_s']:.1f}",
         f"{f['ratio']:.2f}x", "<= 0.5x, 0 errors", _ok(f["ratio"] <= 0.5 and f["ours_errors"] == 0)),
        ("  errors", str(f["ours_errors"]), str(f["raw_errors"]), "-", "0", _ok(f["ours_errors"] == 0)),
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _ok(cond: bool) -> str:
    return "yes" if cond else "NO"


async def main(args) -> dict:
    image = ensure_image(args.image)
    spec = SandboxSpec(image=image, memory_gb=1, timeout_minutes=30, labels=dict(BENCH_LABEL))
    backend = DockerBackend()
    q = args.quick
    try:
        results = {"image": image}
        results["exec"] = await bench_exec(backend, spec, n_ours=200 if q else 1000, n_raw=30 if q else 100)
        results["lifecycle"] = await bench_lifecycle(backend, spec, n=5 if q else 15)
        results["pool"] = await bench_pool(backend, spec, n=5 if q else 15)
        results["fleet"] = await bench_fleet(backend, spec, sandboxes=args.sandboxes, commands=args.commands)
        return results
    finally:
        docker = await backend._client()
        for c in await docker.containers.list(all=True, filters={"label": ["vf-sandbox.bench=1"]}):
            await raw_delete(c)
        await backend.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--image", default="vf-sandbox/python:3.11")
    ap.add_argument("--sandboxes", type=int, default=32)
    ap.add_argument("--commands", type=int, default=20)
    a = ap.parse_args()
    res = asyncio.run(main(a))
    print(json.dumps(res, indent=2) if a.json else table(res))
