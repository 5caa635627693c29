"""`--hosted` overhead: the same 1000-rollout eval against the local instant
model server (its own process), run local and through a one-machine Ray
cluster (a head started for the benchmark, stopped by pid at the end), in
one run, `--repeats` times interleaved (medians):

- local `vf-sandbox eval` (one process): the baseline;
- `vf-sandbox eval --hosted --follow` with one worker actor, and with `-w 2`
  (two actors on this machine's cores).

For each: wall time of the whole command (the hosted one includes the Ray
job's start-up and pulling the results back), submit-to-first-row (the
command's start to the first row's end, from the rows' own timings, which
the job's process and the actors stamp on the same clock), and the
generation span (first row start to last row end). The hosted run's fixed
costs are split into: submission (the command until Ray accepted the job),
job start (until the job's process logged the run), the hand-over (every
actor ready: until then the job's process runs groups itself), and the
pull-back after the last row. Ray's own floor is measured too: an empty job
(`python -c pass`) from submission to SUCCEEDED as a client sees it.

2 actors vs 1 is measured where the actors do the work: a run of
`--scale-examples` x 10 rollouts against a model server in this process
that answers only once every actor is ready (the job's process holds its
groups until then), throughput over the rows that end 0.5 s after that.

Targets (issue 13): submit-to-first-row <= 5 s; hosted throughput >= 0.8x
local; 2 workers vs 1 >= 1.6x.

    .venv/bin/python benchmarks/bench_hosted.py [--examples 100] [--rollouts-per-example 10] [--concurrency 256]
        [--repeats 3] [--scale-examples 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
VF = [sys.executable, "-m", "vfcli.app"]
# a log line of the job (any format with an HH:MM:SS time before the logger name): envs.hosted and
# envs.runner.ray_workers since issue 25's layout, envs.eval.hosted / envs.eval.ray_workers before it
LOG_TIME = re.compile(r"(\d\d:\d\d:\d\d(?:[.,]\d+)?)\s.*\b(?:envs\.)?(?:eval\.|runner\.)?(hosted|ray_workers)\b.*?"
                      r"(hosted run|worker actor \d+ ready|runs no more groups)")
HANDOVER_WAIT = 300  # seconds a gated run waits for the hand-over line before it is failed, not hung
MARKS = {"hosted run": "job_started", "runs no more groups": "handover"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clock(hms: str, near: float) -> float:
    """An HH:MM:SS[.mmm] log time (this machine's local time) as an epoch time near `near`."""
    day = datetime.fromtimestamp(near)
    t = datetime.strptime(hms[:8], "%H:%M:%S").replace(year=day.year, month=day.month, day=day.day)
    return t.timestamp() + (float("0." + hms[9:]) if len(hms) > 9 else 0.0)


def run_eval(base_url: str, out: Path, n: int, r: int, c: int, *extra: str, gate: threading.Event | None = None) -> dict:
    e = {**os.environ, "VF_BENCH_KEY": "x", "VF_RUNS_DB": str(out / "runs.db")}
    argv = [*VF, "eval", "math-single", "-m", "bench", "-b", base_url, "-k", "VF_BENCH_KEY", "-n", str(n), "-r", str(r),
            "-c", str(c), "-s", "-d", "-A", "-o", str(out), *extra]
    marks: dict[str, float] = {}
    lines: list[str] = []
    t0 = time.time()
    p = subprocess.Popen(argv, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if "submitted to" in line and "submitted" not in marks:
                marks["submitted"] = time.time()
            m = LOG_TIME.search(line)
            if m:
                key = MARKS.get(m.group(3), "actors_ready")  # the last actor's for actors_ready
                marks[key] = _clock(m.group(1), t0)
                if key == "handover" and gate is not None:  # the model answers from now on
                    gate.set()
                    marks["gate"] = time.time()

    def no_handover() -> None:  # the gated model would never answer: open it, fail the run below
        if gate is not None and not gate.is_set():
            marks["no_handover"] = time.time()
            gate.set()

    timer = threading.Timer(HANDOVER_WAIT, no_handover)
    timer.daemon = True  # neither thread keeps an interrupted benchmark from exiting
    if gate is not None:
        timer.start()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    p.wait()
    reader.join()
    timer.cancel()
    wall = time.time() - t0
    if "no_handover" in marks:  # a renamed logger or message (the run itself hung on the closed gate)
        raise SystemExit(f"eval {' '.join(extra)}: no hand-over line matching {LOG_TIME.pattern!r} within "
                         f"{HANDOVER_WAIT} s; the job's log:\n{''.join(lines)[-4000:]}")
    if p.returncode != 0:
        raise SystemExit(f"eval {' '.join(extra)} failed:\n{''.join(lines)[-4000:]}")
    (res,) = sorted(out.glob("evals/*/*/results.jsonl"), key=lambda x: x.stat().st_mtime)[-1:]
    rows = [json.loads(line) for line in res.read_text().splitlines() if line.strip()]
    if len(rows) != n * r:  # e.g. a dataset smaller than -n: the figures would be for another run size
        raise SystemExit(f"eval {' '.join(extra)} wrote {len(rows)} rows, not {n} x {r}")
    ends = [row["timing"]["start_time"] + row["timing"]["total"] for row in rows]
    first_start = min(row["timing"]["start_time"] for row in rows)
    out = {"wall": wall, "rollouts": len(rows), "first_row": min(ends) - t0, "span": max(ends) - first_start,
           "after_last": t0 + wall - max(ends), "reward": sum(row["reward"] for row in rows) / len(rows),
           **{k: v - t0 for k, v in marks.items()}}
    if "gate" in marks:  # the actors alone: rows ending after the hand-over (+0.5 s)
        since = marks["gate"] + 0.5
        after = [e for e in ends if e >= since]
        out["actors_rate"] = len(after) / (max(ends) - since) if len(after) > 100 else float("nan")
    return out


def gated(gate: threading.Event, then: Any) -> Any:
    """A model policy that answers (with `then`) only once `gate` is set."""
    import asyncio

    from testmodel.model_server import PolicyRequest, Reply

    async def policy(req: PolicyRequest) -> Reply:
        while not gate.is_set():
            await asyncio.sleep(0.02)
        return then(req)

    return policy


def empty_job(address: str) -> float:
    """Ray's floor: an empty job from submission to SUCCEEDED, as a polling client sees it."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    t0 = time.time()
    jid = client.submit_job(entrypoint="python -c pass")
    while str(client.get_job_status(jid).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        time.sleep(0.05)
    return time.time() - t0


def median(xs: list[float]) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def main() -> None:
    from ray_cluster import RayCluster

    from testmodel.model_server import ModelServer, compute

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--rollouts-per-example", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale-examples", type=int, default=1000)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "testmodel.model_server", "--port", str(port), "--policy", "compute"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    cores = os.cpu_count() or 2
    cluster = RayCluster(nodes=1, cpus=(cores,))
    names = ["local (baseline)", "--hosted --follow", "--hosted --follow -w 2"]
    runs: dict[str, list[dict]] = {k: [] for k in names}
    scale: dict[str, list[dict]] = {"-w 1": [], "-w 2": []}
    floor: list[float] = []
    loads: list[float] = []
    n, r, c = a.examples, a.rollouts_per_example, a.concurrency
    # the 2-vs-1 runs' model (in this process) answers nothing until every actor is ready (the
    # job's process runs groups until then): the actors, not the job's process, do the work measured
    gate = threading.Event()
    gated_server = ModelServer(gated(gate, compute())).run_in_thread()
    gated_url = gated_server.__enter__().base_url
    try:
        t0 = time.perf_counter()
        cluster.start()
        cluster_up = time.perf_counter() - t0
        hosted = ["--hosted", "--address", cluster.dashboard_url, "--follow", "--poll-interval", "0.5"]
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            run_eval(base_url, base / "warm", 1, 1, 1)  # page cache, server
            run_eval(base_url, base / "warm-hosted", 1, 1, 1, *hosted)  # the cluster's first job
            for i in range(a.repeats):
                loads.append(os.getloadavg()[0])
                floor.append(empty_job(cluster.dashboard_url))
                runs[names[0]].append(run_eval(base_url, base / f"local{i}", n, r, c))
                runs[names[1]].append(run_eval(base_url, base / f"hosted{i}", n, r, c, *hosted))
                runs[names[2]].append(run_eval(base_url, base / f"hosted2-{i}", n, r, c, *hosted, "-w", "2"))
                for w in ("1", "2"):
                    gate.clear()
                    # math-single has 100 eval examples unless told otherwise: -n alone would run 1000 rollouts
                    scale[f"-w {w}"].append(run_eval(gated_url, base / f"scale{w}-{i}", a.scale_examples, 10, c,
                                                     *hosted, "-w", w, "-a", json.dumps({"num_eval": a.scale_examples}),
                                                     gate=gate))
    finally:
        gate.set()
        gated_server.__exit__(None, None, None)
        cluster.stop()
        server.terminate()
        server.wait(timeout=10)

    def med(name: str, key: str, src: dict[str, list[dict]] = runs) -> float:
        return median([x.get(key, float("nan")) for x in src[name]])

    local, one, two = names
    print(f"\n{n * r} single-turn rollouts (math-single), -c {c}, {cores} cores, instant local model server; one-machine "
          f"Ray cluster up in {cluster_up:.1f} s; medians of {a.repeats} interleaved repeats; load average "
          f"{min(loads):.1f}-{max(loads):.1f} (the machine is shared with other agents: noisy)")
    print(f"{'variant':<26}{'wall s':>8}{'rollouts/s':>11}{'first row s':>12}{'gen span s':>11}{'gen rollouts/s':>15}")
    for name in names:
        print(f"{name:<26}{med(name, 'wall'):>8.2f}{n * r / med(name, 'wall'):>11.0f}{med(name, 'first_row'):>12.2f}"
              f"{med(name, 'span'):>11.2f}{n * r / med(name, 'span'):>15.0f}")
    print(f"\nhosted fixed costs (median s from the command's start): submitted {med(one, 'submitted'):.2f}, job's "
          f"process running {med(one, 'job_started'):.2f}, every actor ready (hand-over) {med(one, 'handover'):.2f}, "
          f"first row {med(one, 'first_row'):.2f}; after the last row: {med(one, 'after_last'):.2f} (job end, results "
          f"pulled back; local: {med(local, 'after_last'):.2f}). Ray's floor, an empty job submitted to SUCCEEDED: "
          f"{median(floor):.2f} s")
    ratio = [lo["wall"] / h["wall"] for lo, h in zip(runs[local], runs[one])]
    print(f"hosted vs local throughput, whole command: {median(ratio):.2f}x (repeats: "
          f"{', '.join(f'{x:.2f}' for x in ratio)})   (target >= 0.8x)")
    firsts = ", ".join(f"{x['first_row']:.2f}" for x in runs[one])
    print(f"hosted submit -> first row: {med(one, 'first_row'):.2f} s (repeats: {firsts})   (target <= 5 s); "
          f"local: {med(local, 'first_row'):.2f} s")
    nan = float("nan")
    sr = [b.get("actors_rate", nan) / o.get("actors_rate", nan) for o, b in zip(scale["-w 1"], scale["-w 2"])]
    print(f"\n2 actors vs 1 ({a.scale_examples * 10} rollouts, the model answering once every actor is ready; rows "
          f"ending 0.5 s after that): {median([x.get('actors_rate', nan) for x in scale['-w 2']]):.0f} "
          f"vs {median([x.get('actors_rate', nan) for x in scale['-w 1']]):.0f}"
          f" rollouts/s = {median(sr):.2f}x (repeats: {', '.join(f'{x:.2f}' for x in sr)})   (target >= 1.6x); "
          f"whole command {median([o['wall'] / b['wall'] for o, b in zip(scale['-w 1'], scale['-w 2'])]):.2f}x")


if __name__ == "__main__":
    main()
