"""Loading published SWE datasets at their real sizes (issue 14): N rows of each shape
(SWE-bench Verified-like with JSON-string test lists and the swebench package's
per-repo specs, SWE-smith with the bug reversed, R2E-Gym with the gold patch rebuilt
from parsed_commit_content, SWE-rebench with install_config) from parquet, against
the same-run baseline: the very same instances already in native shape (no mapping).
Also the one-off cost of importing the `swebench` package (paid only when a row needs it).

    .venv/bin/python benchmarks/bench_swe_published.py [--rows 5000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from swe_debug.instances import load_instances  # noqa: E402
from test_swe_published import R2E_ROW, REBENCH_ROW, SMITH_ROW, VERIFIED_ROW  # noqa: E402

REPOS = [("django/django", "3.0"), ("sympy/sympy", "1.1"), ("pytest-dev/pytest", "8.3"), ("astropy/astropy", "5.1")]


def rows_of(shape: str, n: int) -> list[dict]:
    out = []
    for i in range(n):
        if shape == "swe-bench":
            repo, version = REPOS[i % len(REPOS)]
            out.append({**VERIFIED_ROW, "instance_id": f"{repo.replace('/', '__')}-{i}", "repo": repo, "version": version})
        elif shape == "swe-smith":
            out.append({**SMITH_ROW, "instance_id": f"{SMITH_ROW['instance_id']}{i}"})
        elif shape == "r2e-gym":
            out.append({**R2E_ROW, "commit_hash": f"{i:040x}"})
        else:
            out.append({**REBENCH_ROW, "instance_id": f"org__repo-{i}",
                        "install_config": json.dumps(REBENCH_ROW["install_config"])})
    return out


def timed_load(path: Path, **kw) -> tuple[float, int]:
    t0 = time.perf_counter()
    rep = load_instances(path, named_images=True, **kw)
    dt = time.perf_counter() - t0
    assert not rep.errors, rep.errors[:3]
    return dt, len(rep.instances)


def import_cost(module: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5000)
    args = ap.parse_args()
    print("(the machine is shared with other agents: figures are indicative, ratios are same-run)")
    load_instances([VERIFIED_ROW], named_images=True)  # pay the swebench import outside the timings
    print(f"{'shape':<12} {'rows':>6} {'parquet s':>10} {'jsonl s':>8} {'rows/s':>8} {'native jsonl s':>15} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in ("swe-bench", "swe-smith", "r2e-gym", "swe-rebench"):
            rows = rows_of(shape, args.rows)
            published = Path(tmp) / f"{shape}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), published)
            dt_pq, n = timed_load(published)
            as_jsonl = Path(tmp) / f"{shape}.jsonl"
            as_jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
            dt, _ = timed_load(as_jsonl)
            # baseline: the same instances, already mapped, loaded as native rows
            native_rows = [i.model_dump(exclude={"dataset_format"}) | {"dataset_format": "native"}
                           for i in load_instances(published, named_images=True).instances]
            native = Path(tmp) / f"{shape}-native.jsonl"
            native.write_text("".join(json.dumps(r) + "\n" for r in native_rows))
            base, _ = timed_load(native, dataset_format="native")
            print(f"{shape:<12} {n:>6} {dt_pq:>10.2f} {dt:>8.2f} {n / dt:>8.0f} {base:>15.2f} {dt / base:>5.2f}x")
    sw, ours = import_cost("swebench"), import_cost("swe_debug.instances")
    print(f"import swebench: {sw:.2f} s (once per process, only when a row names a harness spec/parser); "
          f"import swe_debug.instances: {ours:.2f} s")


if __name__ == "__main__":
    main()
