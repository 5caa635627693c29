"""SWE instances from a registry (issue 14): 20 instances at -c 4 whose images are
pulled from a real local registry (Debian's registry:2 server with htpasswd, started
here), cold (the instance layer only in the registry) vs warm (pulled before), and
the same 20 instances from the locally built image (the same-run baseline: no
registry at all). Reports wall time, pull time (image_s) and the per-instance
overhead beyond the tests (total - tests) with a warm image: target <= 0.5 s.

All 20 rows are the idna example instance under 20 SWE-bench names (`__` spelled
`_1776_`), pushed once; a salted build gives the cold run layers no other image shares.

    .venv/bin/python benchmarks/bench_swe_registry.py [--instances 20] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from registry_server import start_registry, stop_registry  # noqa: E402
from sandboxes import get_backend  # noqa: E402
from sandboxes.images import RegistryAuth, image_builder  # noqa: E402
from swe_debug.debug import DebugOptions, run_debug  # noqa: E402
from swe_debug.examples.builder import build_dataset  # noqa: E402
from swe_debug.images import ImageBuilder, swebench_image_name  # noqa: E402
from swe_debug.instances import SWEInstance, load_instances  # noqa: E402
from swe_debug.taskset import SWETaskSet  # noqa: E402

IDNA = "kjd__idna-3.4"


async def run_batch(ts: SWETaskSet, insts: list[SWEInstance], concurrency: int) -> tuple[float, list[dict]]:
    backend = get_backend("docker")
    sem = asyncio.Semaphore(concurrency)

    async def one(inst):
        async with sem:
            o = await run_debug(ts, inst, backend, DebugOptions())
            if not o.valid:
                raise RuntimeError(f"{inst.instance_id}: {o.reason} {o.detail}")
            return {**o.timings.model_dump(), "overhead_s": o.timings.overhead_s()}

    try:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(one(i) for i in insts))
        return time.perf_counter() - t0, list(rows)
    finally:
        await backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    a = ap.parse_args()
    load0 = Path("/proc/loadavg").read_text().split()[0]
    idna = next(i for i in load_instances(build_dataset()).instances if i.instance_id == IDNA)
    engine = image_builder("docker")
    with tempfile.TemporaryDirectory() as tmp:
        reg = start_registry(Path(tmp))
        try:
            auth = RegistryAuth(username=reg.username, password=reg.password)
            ns = f"{reg.url}/bench-{uuid.uuid4().hex[:6]}"
            local = asyncio.run(ImageBuilder().ensure(idna)).tag  # the baseline's image (shared cache)
            salted = asyncio.run(ImageBuilder(salt=f"bench-{uuid.uuid4().hex[:8]}").ensure(idna)).tag
            ids = [f"bench__reg-{n}" for n in range(a.instances)]
            names = [swebench_image_name(ns, i) for i in ids]
            for name in names:
                asyncio.run(engine.push_image(salted, name, auth))
            for img in [*names, salted]:
                asyncio.run(engine.remove_image(img))  # the instance layer now lives in the registry only
            bare = idna.model_dump(exclude={"source", "environment", "image_name"})
            rows = [SWEInstance.model_validate({**bare, "instance_id": i}, context={"named_images": True}) for i in ids]
            pulled = ImageBuilder(namespace=ns, auth=auth)
            cold_wall, cold = asyncio.run(run_batch(SWETaskSet(rows, builder=pulled), rows, a.concurrency))
            warm_wall, warm = asyncio.run(run_batch(SWETaskSet(rows, builder=ImageBuilder(namespace=ns, auth=auth)),
                                                    rows, a.concurrency))
            base_rows = [idna.model_copy(update={"instance_id": i, "image_name": local}) for i in ids]
            base_wall, base = asyncio.run(run_batch(SWETaskSet(base_rows), base_rows, a.concurrency))
            for img in names:
                asyncio.run(engine.remove_image(img))
        finally:
            stop_registry(reg)

    def med(rs, k):
        return statistics.median(r[k] for r in rs)

    n = a.instances
    print(f"\n{n} SWE instances (idna gold patch + tests) at -c {a.concurrency}, images from a local registry:2 "
          f"(load average {load0} at start)")
    print(f"{'variant':34s}{'wall s':>9}{'inst/s':>8}{'pull/image p50 s':>18}{'tests p50 s':>13}{'overhead p50 s':>16}")
    for label, wall, rs in (("cold (pulled from the registry)", cold_wall, cold), ("warm (pulled before)", warm_wall, warm),
                            ("baseline: local image, no registry", base_wall, base)):
        print(f"{label:34s}{wall:>9.2f}{n / wall:>8.2f}{med(rs, 'image_s'):>18.3f}{med(rs, 'tests_s'):>13.3f}"
              f"{med(rs, 'overhead_s'):>16.3f}")
    print(f"\ncold vs warm wall: {cold_wall / warm_wall:.2f}x; warm vs local baseline: {warm_wall / base_wall:.2f}x; "
          f"warm overhead beyond the tests p50 {med(warm, 'overhead_s'):.3f} s (target <= 0.5 s)")


if __name__ == "__main__":
    main()
