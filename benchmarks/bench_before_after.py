"""Before/after issue 25's restructuring: the eval and SandboxEnv benchmarks of the tree before it
(commit e499213, the parent of 998f526 where it began) and of the current tree, in the same run.

Each tree runs its OWN scripts (benchmarks/bench_eval.py, which writes its figures to
<tree>/benchmarks/results/bench_eval.json, and bench_sandbox_env.py --json) with its own
packages, image recipes and in-sandbox agent: the before tree is a `git worktree add --detach`
in a temporary directory (byte-compiled before the first run; bench_eval's verifiers venv linked
from this checkout's .cache; its bench_eval.py given the floor's connect timeout of 2ea12e6, a
fix to a row not compared; removed at the end, also on Ctrl-C or SIGTERM), and every child
runs with PYTHONPATH=<tree> and cwd=<tree>, so the tree's top-level packages win over the
.venv's editable install (a meta-path finder appended after the path finder). A probe checks
it before the first run: a child of each tree imports envs, sandboxes, backends, the agent and
the tree's model server, and every module of either tree it loaded must be that tree's.

Runs interleave the trees in rounds, ABBA (round 1 before then after, round 2 after then
before, ...), so load that drifts during the run moves both sides alike. Reported: each figure
per round and tree, the medians, and after/before as a speed ratio (rollouts/s after / before;
for latencies p50 before / after), so > 1 is faster. Headline rows (*): eval rollouts/s,
SandboxEnv's default and container-per-rollout rollouts/s, the python and bash tool p50s.
Verdict per headline row: "not slower" when the ratio of medians is >= --band (0.90); below it,
"SLOWER" when after was slower in every round's pair (each round's after / before, listed) or
the ratio is below the spread this run saw (the worst min/max of one tree's rounds: the same
code measured again), else "within noise". Control rows run the same program
in both trees (the bare openai client; a raw Docker exec; verifiers 0.3.1 when --eval-args
drops --skip-verifiers): their ratio is what the machine's load alone moved.

    .venv/bin/python benchmarks/bench_before_after.py [--rounds 2] [--before e499213] [--after working|REV]
        [--eval-args "--rollouts 1000 --concurrency 256 --repeat 3 --skip-verifiers"]
        [--env-args "--rollouts 32 --samples 200 --raw-samples 40"] [--only eval|sandbox_env] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "e499213"  # the tree before issue 25 (998f526 is its first commit)
EVAL_ARGS = "--rollouts 1000 --concurrency 256 --repeat 3 --skip-verifiers"
ENV_ARGS = "--rollouts 32 --samples 200 --raw-samples 40"
RUN_TIMEOUT = 900  # seconds one benchmark run of one tree may take
DEFAULT_ROW = "env default (auto), default pool"
BASE_ROW = "container per rollout, no pool"
PROBE = """
import importlib, json, sys
for name in ("envs", "sandboxes", "backends", "sandboxes.agent", sys.argv[1]):
    importlib.import_module(name)
files = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}
print(json.dumps({"envs": sys.modules["envs"].__file__, "files": {n: f for n, f in files.items() if f}}))
"""


@dataclass(frozen=True)
class Metric:
    """One compared figure: where it is in a benchmark's JSON, whether higher is better, and
    whether it counts for the verdict (headline) or is shown for context."""

    name: str
    bench: str
    get: Callable[[dict], float]
    higher_is_better: bool
    headline: bool


def _eval_row(variant: str, key: str) -> Callable[[dict], float]:
    return lambda d: d["results"][variant][key]


def _env_row(name: str, latency: bool = False) -> Callable[[dict], float]:
    """An eval row's rollouts/s (the median of its `--repeat` copies, `<name> #<n>`); the
    model-latency rows carry the latency in their name."""
    def get(d: dict) -> float:
        rows = [r for k, r in d["eval"].items()
                if (k.startswith(name + ", model") if latency else k == name or k.startswith(name + " #"))]
        if not rows:
            raise KeyError(name)
        return statistics.median(r["rollouts_per_s"] for r in rows)
    return get


def _trip(path: str) -> Callable[[dict], float]:
    return lambda d: d["round_trips"]["paths"][path]["p50_ms"]


UP, DOWN = True, False  # higher is better (rollouts/s), lower is better (ms)
HEAD, INFO = True, False  # counts for the verdict, or shown for context
METRICS = [
    Metric("eval: vf-sandbox rollouts/s", "eval", _eval_row("vf-sandbox", "rollouts_per_s"), UP, HEAD),
    Metric("eval: vf-sandbox CPU ms/rollout", "eval", _eval_row("vf-sandbox", "work_cpu_ms_per_rollout"), DOWN, INFO),
    Metric("eval: vf-sandbox peak RSS MiB", "eval", _eval_row("vf-sandbox", "peak_rss_mib"), DOWN, INFO),
    Metric("eval: bare openai client rollouts/s (control)", "eval", _eval_row("floor-aiohttp", "rollouts_per_s"),
           UP, INFO),
    Metric("eval: verifiers 0.3.1 rollouts/s (control)", "eval", _eval_row("verifiers", "rollouts_per_s"), UP, INFO),
    Metric("SandboxEnv default rollouts/s", "sandbox_env", _env_row(DEFAULT_ROW), UP, HEAD),
    Metric("SandboxEnv container per rollout rollouts/s", "sandbox_env", _env_row(BASE_ROW), UP, HEAD),
    Metric("SandboxEnv default, model latency rollouts/s", "sandbox_env", _env_row(DEFAULT_ROW, True), UP, INFO),
    Metric("SandboxEnv container/rollout, latency rollouts/s", "sandbox_env", _env_row(BASE_ROW, True), UP, INFO),
    Metric("SandboxEnv container warm pool rollouts/s", "sandbox_env", _env_row("container warm pool (from -c)"),
           UP, INFO),
    Metric("SandboxEnv namespace cells runc rollouts/s", "sandbox_env", _env_row("namespace cells, runc"), UP, INFO),
    Metric("SandboxEnv namespace cells runc warm rollouts/s", "sandbox_env",
           _env_row("namespace cells, runc, warm"), UP, INFO),
    Metric("SandboxEnv namespace cells gvisor rollouts/s", "sandbox_env", _env_row("namespace cells, gvisor"),
           UP, INFO),
    Metric("python tool `1+1` p50 ms", "sandbox_env", _trip("python tool `1+1`"), DOWN, HEAD),
    Metric("bash tool `echo hi` p50 ms", "sandbox_env", _trip("bash tool `echo hi`"), DOWN, HEAD),
    Metric("agent exec `echo hi` p50 ms", "sandbox_env", _trip("agent exec `echo hi`"), DOWN, INFO),
    Metric("raw docker exec p50 ms (control: the engine)", "sandbox_env", _trip("raw docker exec `echo hi`"),
           DOWN, INFO),
]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def add_worktree(rev: str, parent: Path, name: str) -> Path:
    """A detached worktree of `rev` under `parent`; the verifiers venv bench_eval keeps under
    .cache (gitignored, so absent from a worktree) linked from this checkout's."""
    path = parent / name
    git("worktree", "add", "--detach", "--quiet", str(path), rev)
    venv = ROOT / ".cache" / "bench-verifiers-venv"
    if venv.exists():
        (path / ".cache").mkdir(exist_ok=True)
        (path / ".cache" / "bench-verifiers-venv").symlink_to(venv)
    backport_floor_timeout(path / "benchmarks" / "bench_eval.py")
    # byte-compiled now, not inside the first run's clock (a fresh checkout has no __pycache__)
    skip = r"/(\.|tests/|environments/)"
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", skip, str(path)], capture_output=True)
    return path


FLOOR_CLIENT = 'client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, http_client=http_client)'
FLOOR_FIX = FLOOR_CLIENT[:-1] + ", timeout=openai.Timeout(600, connect=60))"


def backport_floor_timeout(script: Path) -> None:
    """Give an older bench_eval.py's bare-openai floor the 60 s connect timeout of 2ea12e6: with
    openai's 5 s one, its default-transport variant ends the whole script on a loaded machine
    (ConnectTimeout at load average ~40, twice in a row). The floor is no compared row: the
    vf-sandbox worker and everything it imports stay the tree's own."""
    text = script.read_text() if script.exists() else ""
    if FLOOR_CLIENT in text:
        script.write_text(text.replace(FLOOR_CLIENT, FLOOR_FIX))


def child_env(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}


def probe(tree: Path, others: list[Path]) -> str:
    """Check that a child of `tree` imports the project's packages from `tree` alone."""
    server = "testmodel.model_server" if (tree / "testmodel").is_dir() else "envs.testing.model_server"  # moved by 25
    out = subprocess.run([sys.executable, "-c", PROBE, server], cwd=tree, env=child_env(tree), capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"probe of {tree} failed:\n{out.stderr[-2000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    venv = Path(sys.prefix)  # the .venv (inside this checkout) holds installed packages, not a tree's
    strays = {n: f for n, f in found["files"].items() if not Path(f).is_relative_to(venv)
              and any(Path(f).is_relative_to(o) for o in others) and not Path(f).is_relative_to(tree)}
    if strays or not Path(found["envs"]).is_relative_to(tree):
        raise SystemExit(f"a child of {tree} imports another tree's modules: {dict(list(strays.items())[:8])}")
    return found["envs"]


class Child:
    """The one benchmark process running now (interrupted on Ctrl-C so it cleans up its sandboxes)."""

    proc: subprocess.Popen | None = None


def run_bench(tree: Path, bench: str, extra: str, log: Path) -> dict:
    """Run the tree's benchmarks/bench_<bench>.py and return its JSON figures."""
    script = tree / "benchmarks" / f"bench_{bench}.py"
    argv = [sys.executable, str(script), *shlex.split(extra)] + (["--json"] if bench == "sandbox_env" else [])
    started = time.time()
    with log.open("w") as err:
        Child.proc = subprocess.Popen(argv, cwd=tree, env=child_env(tree), stdout=subprocess.PIPE, stderr=err,
                                      text=True, preexec_fn=default_sigint)
        try:
            stdout, _ = Child.proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            stop_child()
            raise RuntimeError(f"{script} did not finish within {RUN_TIMEOUT} s (stderr: {log})") from None
        code, Child.proc = Child.proc.returncode, None
    if code != 0:
        raise RuntimeError(f"{script} exited {code}:\n{log.read_text()[-3000:]}")
    if bench == "eval":  # bench_eval has no --json: it writes its figures to a file of its tree
        path = tree / "benchmarks" / "results" / "bench_eval.json"
        if not path.exists() or path.stat().st_mtime < started:
            raise RuntimeError(f"{script} wrote no {path}")
        return json.loads(path.read_text())
    start = stdout.rfind("\n{")
    return json.loads(stdout[start + 1 if start >= 0 else 0:])


def run_with_retry(tree: Path, bench: str, extra: str, log: Path) -> dict | None:
    """run_bench, once more if it fails (a benchmark's own request timing out on a loaded machine
    should cost one round's figure, not the comparison); None when both attempts fail."""
    for attempt in (1, 2):
        try:
            return run_bench(tree, bench, extra, log)
        except RuntimeError as exc:
            tail = str(exc).strip().splitlines()
            print(f"  {tree.name} {bench} failed (attempt {attempt}): {tail[0]} ... {tail[-1][:200]}", flush=True)
    return None


def default_sigint() -> None:
    """In the child before exec: SIGINT raises KeyboardInterrupt there even when this process was
    started with SIGINT ignored (a background job of a non-interactive shell), so stop_child works."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_child() -> None:
    proc, Child.proc = Child.proc, None
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)  # the script's finally blocks delete its sandboxes
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def context(bench: str, data: dict) -> str:
    """What a run's progress line adds beyond the figures: SandboxEnv's isolation and errors."""
    if bench != "sandbox_env":
        return ""
    errors = sum(r.get("errors", 0) for r in data.get("eval", {}).values())
    used = data.get("eval", {}).get(DEFAULT_ROW, {}).get("rollout_isolation")
    return f"; default isolation {used}, errors {errors}"


def figure(metric: Metric, data: dict | None) -> float | None:
    try:
        return float(metric.get(data)) if data is not None else None
    except (KeyError, IndexError, TypeError):
        return None


def speed(metric: Metric, before: float, after: float) -> float:
    return after / before if metric.higher_is_better else before / after


def compare(runs: dict, band: float) -> list[dict]:
    """Per metric: each tree's figures by round, medians, the speed ratio and the verdict."""
    rows = []
    for m in (m for m in METRICS if m.bench in runs["before"]):
        vals = {side: [figure(m, d) for d in runs[side][m.bench]] for side in ("before", "after")}
        clean = {side: [v for v in vs if v] for side, vs in vals.items()}  # a 0 figure has no ratio
        row = {"metric": m.name, "headline": m.headline, "higher_is_better": m.higher_is_better, **vals}
        if clean["before"] and clean["after"]:
            med = {side: statistics.median(vs) for side, vs in clean.items()}
            spreads = [min(vs) / max(vs) for vs in clean.values() if len(vs) > 1]
            ratio = speed(m, med["before"], med["after"])
            spread = min(spreads) if spreads else None
            pairs = [speed(m, b, a) for b, a in zip(vals["before"], vals["after"]) if b and a]  # same round
            every_pair = len(pairs) > 1 and all(p < 1 for p in pairs)
            verdict = ("not slower" if ratio >= band else
                       "SLOWER" if every_pair or spread is None or ratio < spread else "within noise")
            row.update(median_before=med["before"], median_after=med["after"], ratio=ratio, spread=spread,
                       pairs=pairs, verdict=verdict)
        else:
            row.update(ratio=None, verdict="no figure")
        rows.append(row)
    return rows


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}" if v < 10 else f"{v:.1f}"


def report(rows: list[dict], band: float, rounds: int) -> str:
    cols = "  ".join([f"b{i + 1:<6}" for i in range(rounds)] + [f"a{i + 1:<6}" for i in range(rounds)])
    lines = [f"{'metric':50} {cols}  {'b med':>7} {'a med':>7} {'after/before':>12} {'spread':>6}  "
             f"{'each round':{6 * rounds}}  verdict"]
    for r in rows:
        figs = "  ".join(f"{fmt(v):7}" for v in r["before"] + r["after"])
        mark = "*" if r["headline"] else " "
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        verdict = r["verdict"] if r["headline"] else f"({r['verdict']})"
        pairs = " ".join(f"{p:.2f}" for p in r.get("pairs", []))
        lines.append(f"{mark}{r['metric']:49} {figs}  {fmt(r.get('median_before')):>7} {fmt(r.get('median_after')):>7} "
                     f"{ratio:>12} {fmt(r.get('spread')):>6}  {pairs:{6 * rounds}}  {verdict}")
    head = [r for r in rows if r["headline"]]
    overall = "NOT SLOWER" if all(r["verdict"] == "not slower" for r in head) else (
        "SLOWER" if any(r["verdict"] in ("SLOWER", "no figure") for r in head) else "UNCLEAR (within noise)")
    lines.append(f"\n* headline rows; after/before is a speed ratio (> 1 faster); band >= {band:.2f}x. "
                 f"Verdict on the headline rows: {overall}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each runs both benchmarks in both trees")
    ap.add_argument("--before", default=BEFORE, help="the before commit")
    ap.add_argument("--after", default="working", help="'working' (this checkout as it is) or a commit")
    ap.add_argument("--eval-args", default=EVAL_ARGS, help="arguments for bench_eval.py")
    ap.add_argument("--env-args", default=ENV_ARGS, help="arguments for bench_sandbox_env.py (--json added)")
    ap.add_argument("--band", type=float, default=0.90, help="after/before speed ratio counted as not slower")
    ap.add_argument("--only", choices=["eval", "sandbox_env"], help="one benchmark only")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args()

    for sig in (signal.SIGTERM, signal.SIGHUP):  # cleaned up like a Ctrl-C
        signal.signal(sig, interrupt)
    benches = [(b, a) for b, a in (("eval", args.eval_args), ("sandbox_env", args.env_args)) if args.only in (None, b)]
    tmp = Path(tempfile.mkdtemp(prefix="vf-before-after-"))
    worktrees: list[Path] = []
    load0 = os.getloadavg()
    try:
        trees = {"before": add_worktree(args.before, tmp, "before")}
        worktrees.append(trees["before"])
        if args.after == "working":
            trees["after"] = ROOT
        else:
            trees["after"] = add_worktree(args.after, tmp, "after")
            worktrees.append(trees["after"])
        revs = {side: git("-C", str(t), "rev-parse", "--short", "HEAD") + ("+working" if t == ROOT else "")
                for side, t in trees.items()}
        for side, tree in trees.items():
            others = [ROOT] + [t for t in trees.values() if t != tree]
            print(f"{side:6} {revs[side]:16} {tree}  envs from {probe(tree, others)}", flush=True)
        print(f"load average at start {load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} on {os.cpu_count()} CPUs",
              flush=True)
        runs: dict = {side: {b: [] for b, _ in benches} for side in trees}
        t_all = time.perf_counter()
        for rnd in range(args.rounds):
            order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
            for bench, extra in benches:
                for side in order:
                    t0, load = time.perf_counter(), os.getloadavg()[0]
                    data = run_with_retry(trees[side], bench, extra, tmp / f"{side}-{bench}-{rnd + 1}.stderr")
                    if data is None:
                        print(f"round {rnd + 1} {side:6} {bench:11} FAILED twice: no figures this round", flush=True)
                        runs[side][bench].append(None)
                        continue
                    runs[side][bench].append(data)
                    head = [f"{m.name.split(': ')[-1]} {fmt(figure(m, data))}" for m in METRICS
                            if m.bench == bench and m.headline]
                    print(f"round {rnd + 1} {side:6} {bench:11} {time.perf_counter() - t0:6.1f} s (load {load:.1f})  "
                          + ", ".join(head) + context(bench, data), flush=True)
        load1 = os.getloadavg()
        rows = compare(runs, args.band)
        summary = {"before": revs["before"], "after": revs["after"], "rounds": args.rounds, "band": args.band,
                   "eval_args": args.eval_args, "env_args": args.env_args, "seconds": time.perf_counter() - t_all,
                   "load_start": load0, "load_end": load1, "rows": rows}
        out = ROOT / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_before_after.json").write_text(json.dumps({**summary, "runs": runs}, indent=2))
        if args.json:
            print(json.dumps(summary, indent=2))
            return
        print(f"\nbefore {revs['before']} vs after {revs['after']}, {args.rounds} round(s) ABBA, "
              f"{summary['seconds'] / 60:.1f} min; load average start {load0[0]:.1f}, end {load1[0]:.1f} "
              f"on {os.cpu_count()} CPUs\n  bench_eval {args.eval_args}\n  bench_sandbox_env {args.env_args} --json\n")
        print(report(rows, args.band, args.rounds))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the running benchmark and removing the worktree", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the clean-up finish
        stop_child()
        for wt in worktrees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
