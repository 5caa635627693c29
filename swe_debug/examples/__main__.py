"""`python -m swe_debug.examples build|check|derive` (see the package docstring)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..debug import verdict
from .builder import HANG_SCRIPT, METADATA, build_dataset, build_images, default_out

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def _entry(ctx: typer.Context) -> None:
    """Build, check and derive the SWE example taskset."""
    from sandboxes import settings

    # this program's entry: the process environment, read once, is the settings of its commands
    ctx.with_resource(settings.use(settings.ProcessSettings.from_env()))

VALID = ["kjd__idna-3.4", "dateutil__dateutil-2.8.2", "more-itertools__more-itertools-10.2.0"]

CHECKS: list[tuple[str, list[str], dict[str, str]]] = [
    # (name, vf-swe-debug arguments, expected reason per instance)
    ("gold", ["--check-fails-before"], {
        **{i: "pass" for i in VALID},
        "kjd__idna-3.4-passes-before": "test_failed",  # FAIL_TO_PASS already passes on the base
        "kjd__idna-3.4-bad-gold": "gold_apply_failed",
    }),
    ("no-op", ["--debug-step", "none", "--instance-ids", ",".join(VALID)], {i: "test_failed" for i in VALID}),
    ("hang", ["--debug-step", "script", "--debug-script-path", str(HANG_SCRIPT), "--debug-timeout", "5",
              "--instance-ids", "kjd__idna-3.4"], {"kjd__idna-3.4": "timeout"}),
]


@app.command()
def build(out: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: $VF_SWE_EXAMPLES or .cache/swe-examples")] = None,
          images: Annotated[bool, typer.Option("--images/--no-images")] = True) -> None:
    """Fetch the sdists, write OUT/examples.jsonl and build the instance images."""
    out = out or default_out()
    t0 = time.perf_counter()
    path = build_dataset(out)
    print(f"dataset: {path} ({time.perf_counter() - t0:.1f}s)")
    if images:
        for iid, tag, built, secs in asyncio.run(build_images(path)):
            print(f"  {iid:45s} {tag}  {'built ' + '+'.join(built) if built else 'cached'}  {secs:.1f}s")


@app.command()
def check(out: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: $VF_SWE_EXAMPLES or .cache/swe-examples")] = None,
          concurrency: Annotated[int, typer.Option("-c")] = 2,
          junit_dir: Annotated[Optional[Path], typer.Option("--junit-dir")] = None) -> None:
    """Build, then run every check with vf-swe-debug and compare each verdict with the expected one."""
    out = out or default_out()
    build(out, True)
    dataset = out / "examples.jsonl"
    bad = []
    for name, args, expect in CHECKS:
        run_dir = out / "runs" / name
        cmd = [sys.executable, "-m", "swe_debug.cli", str(dataset), *args, "-c", str(concurrency), "-o", str(run_dir), "-q"]
        if junit_dir:
            cmd += ["--junit-xml", str(junit_dir / f"swe-examples-{name}.xml")]
        print(f"\n== check {name}: vf-swe-debug {' '.join(cmd[3:])}", flush=True)
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a fresh run each time (its run dir is new anyway)
        proc = subprocess.run(cmd)
        rows = {}
        for path in run_dir.glob("evals/*/*/results.jsonl"):
            for line in path.read_text().splitlines():
                v = verdict(json.loads(line))
                rows[v["instance_id"]] = v
        for iid, want in expect.items():
            got = rows.get(iid, {}).get("reason", "<missing>")
            ok = got == want
            print(f"  {'ok ' if ok else 'BAD'} {iid:45s} expected {want:18s} got {got}")
            if not ok:
                bad.append((name, iid, want, got))
        want_exit = 0 if all(v == "pass" for v in expect.values()) else 1
        if proc.returncode != want_exit:
            bad.append((name, "<exit code>", str(want_exit), str(proc.returncode)))
            print(f"  BAD exit code {proc.returncode}, expected {want_exit}")
    print(f"\n{'all checks passed' if not bad else f'{len(bad)} check(s) failed'}")
    raise typer.Exit(1 if bad else 0)


@app.command()
def derive(out: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: $VF_SWE_EXAMPLES or .cache/swe-examples")] = None) -> None:
    """Maintainers only: run each real example without and with the gold patch and write
    FAIL_TO_PASS (fails → passes) and PASS_TO_PASS (passes → passes) into metadata.json."""
    from sandboxes import get_backend

    from ..debug import DebugOptions, run_debug
    from ..instances import load_instances
    from ..taskset import SWETaskSet

    path = build_dataset(out, with_metadata=False)
    insts = {i.instance_id: i for i in load_instances(path).instances}

    async def go() -> dict:
        be = get_backend("docker")
        ts = SWETaskSet(list(insts.values()))
        meta: dict = {}
        try:
            for iid in VALID:
                before = await run_debug(ts, insts[iid], be, DebugOptions(), step="none")
                after = await run_debug(ts, insts[iid], be, DebugOptions(), step="gold_patch")
                b, a = before.parsed, after.parsed
                ok = {"PASSED", "XFAIL"}
                meta[iid] = {
                    "FAIL_TO_PASS": sorted(t for t, s in a.items() if s in ok and b.get(t) not in ok),
                    "PASS_TO_PASS": sorted(t for t, s in a.items() if s in ok and b.get(t) in ok),
                }
                print(iid, {k: len(v) for k, v in meta[iid].items()})
        finally:
            await be.close()
        idna = meta["kjd__idna-3.4"]
        every = sorted(idna["FAIL_TO_PASS"] + idna["PASS_TO_PASS"])
        meta["kjd__idna-3.4-passes-before"] = {
            "FAIL_TO_PASS": ["tests/test_idna.py::IDNATests::test_encode"],
            "PASS_TO_PASS": [t for t in every if t != "tests/test_idna.py::IDNATests::test_encode"],
        }
        return meta

    meta = asyncio.run(go())
    from .builder import group_ids

    grouped = {iid: {k: group_ids(v) for k, v in lists.items()} for iid, lists in meta.items()}
    METADATA.write_text(json.dumps(grouped, indent=1, sort_keys=True) + "\n")
    print(f"wrote {METADATA}")


if __name__ == "__main__":
    app()
