"""`vf-swe-debug DATASET ...`: validate SWE instances (does the gold patch make the
FAIL_TO_PASS tests pass, keep PASS_TO_PASS passing, with a suite that really
ran?) and gate CI on it: exit 0 only when every selected instance is valid.
Writes OUTPUT_DIR/results.jsonl (a row per instance as it completes),
OUTPUT_DIR/summary.json and, with --junit-xml, a JUnit report.

Exit codes: 0 all valid · 1 some instance invalid, errored or a row malformed ·
2 bad usage (unknown ids, missing files) · 130 Ctrl-C · 143 SIGTERM (finished rows kept; --resume).
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]})


class Step(str, Enum):
    none = "none"
    gold_patch = "gold_patch"
    command = "command"
    script = "script"


def _split_ids(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


@app.command()
def run(
    dataset: Annotated[str, typer.Argument(help="A .json/.jsonl/.parquet file, a `datasets` save_to_disk dir or a hub name.")],
    split: Annotated[str, typer.Option("--split", help="Split of a hub dataset or DatasetDict.")] = "test",
    instance_ids: Annotated[Optional[list[str]], typer.Option("--instance-ids", "-i", help="Only these ids (repeat or comma-separate).")] = None,
    debug_step: Annotated[Step, typer.Option("--debug-step", help="What to do before the tests.")] = Step.gold_patch,
    debug_command: Annotated[Optional[str], typer.Option("--debug-command", help="Shell command for --debug-step command.")] = None,
    debug_script_path: Annotated[Optional[Path], typer.Option("--debug-script-path", help="Script for --debug-step script.")] = None,
    debug_timeout: Annotated[Optional[float], typer.Option("--debug-timeout", help="Seconds for the debug command/script (default: --test-timeout).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Instances at once.")] = 4,
    max_retries: Annotated[int, typer.Option("--max-retries", min=0, help="Retries of a rollout after a sandbox (infra) error.")] = 2,
    test_timeout: Annotated[float, typer.Option("--test-timeout", help="Seconds for the test run.")] = 900,
    timeout_seconds: Annotated[float, typer.Option("--timeout-seconds", help="Seconds for a whole rollout.")] = 1800,
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Where results.jsonl/summary.json go (default outputs/swe-debug/<dataset>).")] = None,
    junit_xml: Annotated[Optional[Path], typer.Option("--junit-xml", help="Write a JUnit XML report here.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip instances that already have a verdict in OUTPUT_DIR.")] = False,
    backend: Annotated[str, typer.Option("--backend", help="Sandbox backend: docker, local, kubernetes, prime, ...")] = "docker",
    check_fails_before: Annotated[bool, typer.Option("--check-fails-before", help="Also run without the patch; every FAIL_TO_PASS test must fail there.")] = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Gold runs per instance; mixed verdicts are reported `flaky`.")] = 1,
    no_setup: Annotated[bool, typer.Option("--no-setup", help="Skip the setup step.")] = False,
    no_tests: Annotated[bool, typer.Option("--no-tests", help="Stop after the debug step.")] = False,
    output_tail_chars: Annotated[int, typer.Option("--output-tail-chars", help="Chars of stdout/stderr kept per row.")] = 2000,
    cpu_cores: Annotated[Optional[float], typer.Option("--cpu-cores")] = None,
    memory_gb: Annotated[Optional[float], typer.Option("--memory-gb")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Run name in the run registry.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Run the debug step and the tests for every selected instance and report which are valid."""
    raise typer.Exit(_main(**locals()))


def _main(**a) -> int:
    import asyncio

    from rich.console import Console

    from sandboxes import UsageError, get_backend

    from .debug import DebugOptions
    from .images import ImageBuilder
    from .instances import dataset_name, load_instances
    from .runner import BatchRunner, RunConfig, summarize
    from .taskset import SWETaskSet

    console = Console(stderr=True)
    try:
        report = load_instances(a["dataset"], split=a["split"])
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    for e in report.errors:
        console.print(f"[yellow]malformed[/] {e}")
    ids = _split_ids(a["instance_ids"])
    try:
        selected = report.select(ids)
    except KeyError as exc:
        console.print(f"[red]error:[/] {exc.args[0]}")
        return 2
    row_errors = [] if ids else report.errors
    ds_name = dataset_name(a["dataset"])
    out_dir = a["output_dir"] or Path("outputs") / "swe-debug" / ds_name
    try:
        opts = DebugOptions(
            run_setup=not a["no_setup"], debug_step=a["debug_step"].value, run_tests=not a["no_tests"],
            debug_command=a["debug_command"], debug_script_path=str(a["debug_script_path"]) if a["debug_script_path"] else None,
            debug_timeout=a["debug_timeout"], test_timeout=a["test_timeout"], timeout_seconds=a["timeout_seconds"],
            output_tail_chars=a["output_tail_chars"], cpu_cores=a["cpu_cores"], memory_gb=a["memory_gb"],
        )
        cfg = RunConfig(concurrency=a["concurrency"], max_retries=a["max_retries"], check_fails_before=a["check_fails_before"],
                        repeat=a["repeat"], output_dir=str(out_dir), resume=a["resume"])
        taskset = SWETaskSet(selected, builder=ImageBuilder(), name=ds_name)
        runner = BatchRunner(taskset, get_backend(a["backend"]), opts, cfg)
    except UsageError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2

    from sandboxes.lifecycle import reap_in_background

    reap_in_background(a["backend"])  # sandboxes of runs that were SIGKILLed or expired
    recorder = _start_recorder(a, ds_name, out_dir)
    t0 = time.perf_counter()
    status, err, rows = "failed", None, []
    try:
        rows = asyncio.run(_run(runner, selected, console, a["quiet"], recorder))
        status = "completed"
    except (KeyboardInterrupt, asyncio.CancelledError) as exc:
        status, err = "stopped", "interrupted"
        console.print("[yellow]interrupted[/]: finished rows are in " + str(out_dir / "results.jsonl") + " (use --resume)")
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    except BaseException as exc:
        err = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if recorder is not None:
            recorder.finish(status, error=err)
    summary = summarize(rows)
    _print_table(console, rows, summary, time.perf_counter() - t0, out_dir)
    if a["junit_xml"]:
        from .junit import write_junit

        write_junit(a["junit_xml"], rows, row_errors=row_errors)
    return 0 if summary["all_valid"] and not row_errors else 1


def _start_recorder(a: dict, ds_name: str, out_dir: Path):
    try:
        from envs.runs.registry import RunRecorder
    except ImportError:
        return None
    args = {k: (v.value if isinstance(v, Enum) else str(v) if isinstance(v, Path) else v) for k, v in a.items()}
    try:
        return RunRecorder.start(kind="swe-debug", name=a.get("name"), env_id=ds_name, model=None, args=args,
                                 output_dir=str(out_dir), resume=True if a.get("resume") else None)
    except Exception as exc:  # noqa: BLE001 - the registry is bookkeeping; never block the run on it
        import logging

        logging.getLogger(__name__).warning("run registry unavailable: %s", exc)
        return None


async def _run(runner, selected, console, quiet: bool, recorder):
    import asyncio
    import signal

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # SIGTERM cancels the run like Ctrl-C does: running rollouts delete their sandboxes,
    # finished rows are already on disk
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)

    def describe(p) -> str:
        return f"[green]{p.valid} valid[/] [red]{p.invalid} invalid[/] [yellow]{p.errors} errors[/]"

    try:
        if quiet:
            return await runner.run(selected, on_row=lambda row, p: recorder and recorder.progress(p.done, p.total, p.errors))
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as bar:
            task = bar.add_task("starting", total=len(selected))

            def on_row(row, p) -> None:
                mark = "[green]✓[/]" if row.get("valid") else ("[yellow]![/]" if row["reason"] == "sandbox_error" else "[red]✗[/]")
                bar.console.print(f"{mark} {row['instance_id']}  {row['reason']}  {(row.get('timings') or {}).get('total_s', 0):.1f}s")
                bar.update(task, completed=p.done, description=describe(p))
                if recorder is not None:
                    recorder.progress(p.done, p.total, p.errors)

            return await runner.run(selected, on_row=on_row)
    finally:
        await runner.backend.close()


def _print_table(console, rows, summary, elapsed: float, out_dir: Path) -> None:
    from rich.table import Table

    t = Table(title=f"vf-swe-debug: {summary['valid']}/{summary['total']} valid in {elapsed:.1f}s", show_lines=False)
    t.add_column("instance", overflow="fold")
    t.add_column("valid", no_wrap=True)
    t.add_column("reason", no_wrap=True)
    t.add_column("tests s", justify="right", no_wrap=True)
    t.add_column("total s", justify="right", no_wrap=True)
    t.add_column("detail", overflow="fold", ratio=1)
    for r in rows:
        tm = r.get("timings") or {}
        t.add_row(r["instance_id"], "[green]yes[/]" if r.get("valid") else "[red]no[/]", r["reason"],
                  f"{tm.get('tests_s', 0):.1f}", f"{tm.get('total_s', 0):.1f}", (r.get("detail") or "")[:160])
    import sys

    Console = type(console)
    Console(stderr=False, width=None if sys.stdout.isatty() else 160).print(t)
    console.print(f"results: {out_dir / 'results.jsonl'}  reasons: {summary['reasons']}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
