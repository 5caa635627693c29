"""Forks of a prepared sandbox (issue 28): what a rollout group saves by paying its setup
once, and the time to a first command when many rollouts start at once.

    .venv/bin/python benchmarks/bench_fork.py [--quick] [--only env,burst]
        [--examples 16 --rollouts 8 -c 16 --setup-seconds 10] [--burst 256]

(a) env: a SandboxEnv whose setup writes files and pip-installs packages from the local
    wheelhouse (`sandboxes.wheels`: no network), padded with an idle wait to
    `--setup-seconds` (the real work's share is printed), `--examples` x `--rollouts` at
    `-c`, each rollout one bash call (it imports the installed package) against the
    scripted model (kept cheap: it checks the install and the files, so the runs differ in
    their setups only). `setup_scope="group"` (setup once per example, each rollout a fork)
    vs `"rollout"` (the setup in every rollout's sandbox): wall time and the ratio, same
    run, the env's default isolation (`rollout_isolation="auto"`: cells where available).
(b) burst: `--burst` rollouts ask for a sandbox at the same moment; per rollout the time
    from the ask to its first command (`true`) returning, p50 / p99, for a container per
    rollout, a cell per rollout (no warm pool: the hosts are made in the burst), and forks
    of one prepared sandbox (cell forks: as many as the source's cell host has room for;
    container forks of its committed image). The published anchor: 0.11 s p50 for the
    fastest commercial provider.

`--quick`: a smoke run (2 x 4 rollouts, 2 s setup, a burst of 16).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import envs as vf  # noqa: E402
from sandboxes import SandboxSpec  # noqa: E402
from sandboxes.cells import RUNC_CELLS_PER_HOST  # noqa: E402
from sandboxes.rollouts import RolloutSandboxes  # noqa: E402

IMAGE = "vf-sandbox/python:3.11"
ANCHOR_P50 = 0.11  # s, the fastest commercial provider's published time to first command
PACKAGE = "pytest"
FILES = 200  # files the setup writes


def wheel_dir() -> Path:
    """A complete house of the wheelhouse holding PACKAGE and its dependencies (fetched once
    when none is there: the one wheelhouse, `sandboxes.wheels.fetch_wheels`)."""
    from sandboxes.wheels import COMPLETE, fetch_wheels, wheelhouse_root

    root = wheelhouse_root()
    for house in sorted(root.glob("*/")) if root.exists() else []:
        names = [p.name.lower() for p in house.glob("*.whl")]
        if (house / COMPLETE).exists() and any(n.startswith(f"{PACKAGE}-") for n in names) and \
                all(any(n.startswith(d) for n in names) for d in ("pluggy-", "iniconfig-", "packaging-")):
            return house
    return fetch_wheels([PACKAGE])


class SetupHeavyEnv(vf.SandboxEnv):
    """Setup: the wheels uploaded and installed (`pip install --no-index`), `files` files
    written, then an idle wait up to `setup_seconds` in all."""

    def __init__(self, wheels: Path, setup_seconds: float, files: int = FILES, **kwargs: Any):
        super().__init__(**kwargs)
        self.wheels, self.setup_seconds, self.files = wheels, setup_seconds, files
        self.setups: list[float] = []  # seconds of real work per setup

    async def post_sandbox_setup(self, state: Any) -> None:
        t0 = time.monotonic()
        sb = self.get_sandbox(state)
        await sb.upload(self.wheels, "/tmp/wheels")
        r = await sb.exec(["python3", "-m", "pip", "install", "-q", "--no-index", "--find-links", "/tmp/wheels",
                           "--target", "/tmp/pkgs", "--no-compile", PACKAGE], timeout=300)
        if not r.ok:
            raise RuntimeError(f"pip install failed (exit {r.exit_code}): {r.output[-400:]}")
        script = (f"mkdir -p /tmp/tree && for i in $(seq 1 {self.files}); do "
                  "echo \"line $i of the seeded tree\" > /tmp/tree/f$i.txt; done")
        r = await sb.exec(["sh", "-c", script], timeout=120)
        if not r.ok:
            raise RuntimeError(f"writing files failed: {r.output[-400:]}")
        work = time.monotonic() - t0
        self.setups.append(work)
        await asyncio.sleep(max(0.0, self.setup_seconds - work))


def env_policy():
    from testmodel.model_server import Reply, ToolCallSpec

    command = "ls -d /tmp/pkgs/pytest | wc -l; ls /tmp/tree | wc -l"  # the package installed, the files there

    def policy(req):
        if req.n_tool_turns() == 0:
            return Reply(tool_calls=[ToolCallSpec("bash", {"command": command})])
        return Reply(content="done")

    return policy


def installed_and_seeded(completion, state) -> float:
    tool = [m["content"] for m in completion if m.get("role") == "tool"]
    return float(bool(tool) and tool[0].split() == ["1", str(FILES)])


async def run_env(scope: str, args: argparse.Namespace, wheels: Path, labels: dict[str, str]) -> dict[str, Any]:
    from openai import AsyncOpenAI

    from testmodel.model_server import ModelServer

    rows = [{"question": f"example {i}", "answer": ""} for i in range(args.examples)]
    env = SetupHeavyEnv(wheels, args.setup_seconds, dataset=rows, docker_image=IMAGE, labels=labels,
                        rubric=vf.Rubric(funcs=[installed_and_seeded]), max_turns=3, timeout_per_command_seconds=120,
                        setup_scope=scope, sandbox_name="bench-fork")
    async with ModelServer(env_policy()) as srv:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=srv.base_url, api_key="x"))
        t0 = time.perf_counter()
        try:
            out = await env.evaluate(client, "test-model", num_examples=args.examples,
                                     rollouts_per_example=args.rollouts, max_concurrent=args.concurrency)
            wall = time.perf_counter() - t0
        finally:
            await env.teardown()
    outs = out["outputs"]
    return {"scope": scope, "wall": wall, "rollouts": len(outs), "setups": len(env.setups),
            "work_p50": statistics.median(env.setups) if env.setups else 0.0,
            "errors": sum(1 for r in outs if r.get("error")), "reward": sum(r["reward"] for r in outs) / max(1, len(outs)),
            "forked": sum((r.get("metrics") or {}).get("sandbox_forked", 0.0) for r in outs),
            "isolation": env.rollout_isolation_in_use()}


async def bench_env(args: argparse.Namespace) -> None:
    wheels = wheel_dir()
    labels = {"vf-bench": "fork-" + uuid.uuid4().hex[:8]}
    print(f"\n(a) env setup: {args.examples} examples x {args.rollouts} rollouts, -c {args.concurrency}, setup "
          f"{args.setup_seconds:g} s (pip install {PACKAGE} from {wheels.name} + 200 files, idle wait to the target)")
    results = {}
    for scope in ("rollout", "group"):
        results[scope] = res = await run_env(scope, args, wheels, labels)
        print(f"  setup_scope={scope:<8} wall {res['wall']:7.1f} s  setups {res['setups']:4d} (real work p50 "
              f"{res['work_p50']:.1f} s)  forked {res['forked']:.0f}/{res['rollouts']}  errors {res['errors']}  "
              f"reward {res['reward']:.2f}  ({res['isolation']})")
    ratio = results["rollout"]["wall"] / results["group"]["wall"]
    print(f"  group setup with forks vs setup per rollout: {ratio:.2f}x faster (target >= 5x)")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))]


async def burst(sandboxes: RolloutSandboxes, n: int, ask: Any) -> tuple[list[float], int]:
    """`n` tasks ask at once (`ask()` -> a held sandbox); seconds from the ask to `true`
    returning in it, and how many failed. Everything is deleted after."""
    start = asyncio.Event()

    async def one() -> float:
        await start.wait()
        t0 = time.perf_counter()
        sb = await ask()
        r = await sb.exec(["true"])
        assert r.ok, r
        return time.perf_counter() - t0

    tasks = [asyncio.ensure_future(one()) for _ in range(n)]
    await asyncio.sleep(0.05)
    start.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    times = [d for d in done if isinstance(d, float)]
    errors = [d for d in done if not isinstance(d, float)]
    if errors:
        print(f"    {len(errors)} failed, e.g. {type(errors[0]).__name__}: {str(errors[0])[:200]}")
    return times, len(errors)


async def bench_burst(args: argparse.Namespace) -> None:
    n = args.burst
    labels = {"vf-bench": "burst-" + uuid.uuid4().hex[:8]}
    print(f"\n(b) burst of {n}: ask for a sandbox -> first command returned (published anchor: {ANCHOR_P50:.2f} s p50)")
    rows: list[tuple[str, int, list[float], int]] = []

    def spec(mode: str) -> SandboxSpec:
        return SandboxSpec(image=IMAGE, memory_gb=0.5, timeout_minutes=15, labels=labels, rollout_isolation=mode)

    for name, mode in (("container per rollout", "container"), ("cell per rollout", "namespace")):
        sandboxes = RolloutSandboxes(spec(mode), "docker", rollout_isolation=mode, pool_size=0)
        try:
            times, failed = await burst(sandboxes, n, sandboxes.acquire)
        finally:
            await sandboxes.close()
        rows.append((name, n, times, failed))

    async def seed(sb: Any) -> None:
        await sb.write_file("/tmp/seed.txt", "prepared\n")

    for name, mode, count in (("cell forks", "namespace", min(n, RUNC_CELLS_PER_HOST - 1)),
                              ("container forks", "container", n)):
        sandboxes = RolloutSandboxes(spec(mode), "docker", rollout_isolation=mode, pool_size=0)
        try:
            group = await sandboxes.prepare_group(seed)
            if group.mode != "fork":
                print(f"    {name}: no forks here ({group.reason})")
                continue

            async def ask() -> Any:
                sb, prepared = await group.acquire()
                if not prepared:
                    raise RuntimeError("a fresh sandbox instead of a fork")
                return sb

            times, failed = await burst(sandboxes, count, ask)
            await group.close()
        finally:
            await sandboxes.close()
        rows.append((f"{name} (of one prepared {'cell' if mode == 'namespace' else 'container'})", count, times, failed))

    base = statistics.median(rows[0][2]) if rows[0][2] else float("nan")
    print(f"  {'what':<40} {'n':>4} {'p50':>8} {'p99':>8} {'vs containers p50':>18} {'vs anchor':>10} failed")
    for name, count, times, failed in rows:
        if not times:
            print(f"  {name:<40} {count:>4}  (none measured) failed {failed}")
            continue
        p50, p99 = statistics.median(times), pct(times, 0.99)
        print(f"  {name:<40} {count:>4} {p50:7.3f}s {p99:7.3f}s {base / p50:17.1f}x {ANCHOR_P50 / p50:9.2f}x {failed}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="env,burst")
    ap.add_argument("--examples", type=int, default=16)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--setup-seconds", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=256)
    args = ap.parse_args()
    if args.quick:
        args.examples, args.rollouts, args.concurrency, args.setup_seconds, args.burst = 2, 4, 8, 2.0, 16
    from backends.docker.images import ensure_image

    ensure_image(IMAGE)
    print(f"bench_fork on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    only = set(args.only.split(","))
    if "env" in only:
        await bench_env(args)
    if "burst" in only:
        await bench_burst(args)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        asyncio.run(main())
