"""`vf-swe-debug DATASET ...`: validate SWE instances (does the gold patch make the
FAIL_TO_PASS tests pass, keep PASS_TO_PASS passing, with a suite that really
ran?) and gate CI on it: exit 0 only when every selected instance is valid.

A run is an eval of `SWEDebugEnv` (env id `swe-debug`): this module only turns
the flags into an `EvalConfig` and hands it to the eval runner, which writes
OUTPUT_DIR/evals/swe-debug--none/<run>/results.jsonl (a row per instance, its
verdict in `info.verdict`) and metadata.json, records the run in the registry
(kind `swe-debug`), resumes (`--resume`) and writes the JUnit report
(`--junit-xml`) like for every other eval. What this module adds is the view:
a line per finished instance, a progress bar and the summary table.

Exit codes (the same table as `vf-sandbox eval`, runner/exit_codes.py): 0 all
valid · 1 some instance invalid or a row malformed · 2 bad usage (unknown ids,
missing files) · 3 incomplete: instances ended in sandbox / env errors or were not
run (Docker down, stopped) -- `--resume` continues · 130 Ctrl-C · 143 SIGTERM
(finished rows kept; --resume).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from runner import exit_codes
from runner.options import DeclaredCommand

from vfcli.eval_cmd import AUTO_RESUME, OptionalResumeCommand

from .debug import verdict
from .options import Step, SWEDebugOptions

__all__ = ["Step", "SWEDebugOptions", "app", "env_args", "eval_config", "run"]

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]})

ENV_ID = "swe-debug"
MODEL = "none"  # no model is called; the name only appears in the output path and metadata


HARBOR_ENV_ID = "harbor-tasks"  # `harbor:<dir>` datasets: Harbor task directories (harbor_tasks.gate)


def _is_harbor(dataset: str) -> bool:
    from harbor_tasks import PREFIX

    return dataset.startswith(PREFIX)


def _harbor_env_args(a: dict[str, Any]) -> dict[str, Any]:
    """The `harbor-tasks` gate's arguments: the step (gold_patch means the oracle) and the
    options that apply to it; the SWE-only flags do not."""
    step = "oracle" if a["debug_step"] in (Step.gold_patch, Step.oracle) else a["debug_step"].value
    out = {"dataset": a["dataset"], "task_names": _split_ids(a["instance_ids"]) or None, "debug_step": step,
           "output_tail_chars": a["output_tail_chars"], "rollout_isolation": a.get("rollout_isolation")}
    return {k: v for k, v in out.items() if v is not None}


def _split_ids(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


def _dataset_argument() -> list[inspect.Parameter]:
    desc = SWEDebugOptions.model_fields["dataset"].description
    return [inspect.Parameter("dataset", inspect.Parameter.KEYWORD_ONLY, annotation=str, default=typer.Argument(..., help=desc))]


def _options(o: dict[str, Any]) -> dict[str, Any] | None:
    """The flags given, validated by their declarations (None: refused, the reason printed)."""
    from pydantic import ValidationError

    from runner.options import flags

    try:
        opts = SWEDebugOptions.model_validate({k: v for k, v in o.items() if v is not None})
    except ValidationError as exc:
        by_name = {d.name: "/".join(d.flags) for d in flags(SWEDebugOptions)}
        for e in exc.errors():
            where = by_name.get(str(e["loc"][0]), str(e["loc"][0])) if e["loc"] else "?"
            typer.secho(f"error: {where}: {e['msg']}", fg=typer.colors.RED, err=True)
        return None
    return dict(opts)  # the fields as declared (Step, Path values kept)


def run(**o: Any) -> None:
    """Run the debug step and the tests for every selected instance and report which are valid.

    Exit codes: 0 every instance valid · 1 some instance invalid (or a row malformed) · 2 usage error ·
    3 incomplete: instances ended in sandbox / env errors or were not run (Docker down, stopped;
    continue with --resume) · 130 / 143 interrupted (SIGINT / SIGTERM). The same codes as
    `vf-sandbox eval`."""
    a = _options(o)
    if a is None:
        raise typer.Exit(2)
    raise typer.Exit(exit_codes.run_with_signal_codes(lambda: _main(**a)))


# the flags are SWEDebugOptions' declared fields (swe_debug/options.py), generated, never listed here
app.command(cls=OptionalResumeCommand)(DeclaredCommand(run, lambda: (SWEDebugOptions,), _dataset_argument,
                                                       show_defaults=True))


def env_args(a: dict[str, Any]) -> dict[str, Any]:
    """The `swe-debug` environment's arguments for these flags."""
    out = {
        "dataset": a["dataset"], "split": a["split"], "instance_ids": _split_ids(a["instance_ids"]) or None,
        "debug_step": a["debug_step"].value, "debug_command": a["debug_command"],
        "debug_script_path": str(a["debug_script_path"]) if a["debug_script_path"] else None,
        "debug_timeout": a["debug_timeout"], "test_timeout": a["test_timeout"], "timeout_seconds": a["timeout_seconds"],
        "check_fails_before": a["check_fails_before"], "repeat": a["repeat"], "run_setup": not a["no_setup"],
        "run_tests": not a["no_tests"], "output_tail_chars": a["output_tail_chars"], "cpu_cores": a["cpu_cores"],
        "memory_gb": a["memory_gb"], "namespace": a["namespace"], "registry": a.get("registry"), "push_to": a["push_to"],
        "keep_images": a["keep_images"], "dataset_format": a.get("dataset_format"),
        "rollout_isolation": a.get("rollout_isolation"), "setup_scope": a.get("setup_scope"),
    }
    return {k: v for k, v in out.items() if v is not None}


def run_name(dataset: str, step: str) -> str:
    """The default name of a run: "<dataset name> <debug step>" (e.g. "tasks gold_patch")."""
    p = Path(dataset)
    base = p.stem if p.suffix in (".json", ".jsonl", ".parquet") else (p.name or dataset)
    return f"{base} {step}"


def eval_config(a: dict[str, Any]):
    """The run definition of these flags (raises ConfigError)."""
    from runner.config import configs_from_cli

    cli = {
        "env_args": env_args(a), "model": MODEL, "api_key_var": "EMPTY", "num_examples": -1, "rollouts_per_example": 1,
        "max_concurrent": a["concurrency"], "max_retries": a["max_retries"], "save_results": True,
        "output_dir": str(a["output_dir"]) if a["output_dir"] else None,
        # --resume: absent (None; False from older callers), bare (AUTO_RESUME; True) or a run id / directory
        "resume": a["resume"] not in (None, False) or None,
        "resume_path": a["resume"] if isinstance(a["resume"], str) and a["resume"] != AUTO_RESUME else None,
        "name": a["name"] or run_name(a["dataset"], a["debug_step"].value), "kind": "swe-debug", "junit_xml": str(a["junit_xml"]) if a["junit_xml"] else None,
        "backend": a["backend"], "timeout_minutes": a["timeout_minutes"], "isolation": a["isolation"],
        "num_workers": a.get("num_workers", 1),
        # hosted: sandboxes are what vf-swe-debug is for, so their permission is implied
        "hosted": a.get("hosted") or None, "address": a.get("address"), "allow_sandbox_access": a.get("hosted") or None,
    }
    if _is_harbor(a["dataset"]):
        cli["env_args"] = _harbor_env_args(a)
        cli["name"] = a["name"] or run_name(a["dataset"], cli["env_args"]["debug_step"])
    (cfg,) = configs_from_cli([HARBOR_ENV_ID if _is_harbor(a["dataset"]) else ENV_ID], cli)
    return cfg


def _main(**a: Any) -> int:
    """The entry of vf-swe-debug: the process environment, read once, is the settings
    scope of the run (`sandboxes.settings.use`), carried by its definition."""
    from sandboxes import settings

    with settings.use(settings.ProcessSettings.from_env()):
        return _run_main(**a)


def _run_main(**a: Any) -> int:
    import asyncio

    from rich.console import Console

    from runner.config import with_process_settings
    from runner.runner import run_evals
    from sandboxes import ConfigError, UsageError
    from sandboxes.settings import current as current_settings
    from sandboxes.lifecycle import reap_in_background

    from .env import load_environment

    if _is_harbor(a["dataset"]):
        from harbor_tasks import load_environment
    console = Console(stderr=True)
    try:
        (cfg,) = with_process_settings([eval_config(a)], current_settings())  # the entry's (`_main`)
        # load once here so that bad usage (a missing file, unknown ids, a step without its
        # command) exits 2 before any run is recorded; the runner loads it again
        probe = load_environment(**cfg.env_args)
    except (FileNotFoundError, ValueError, UsageError, ConfigError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    for e in probe.input_errors:
        console.print(f"[yellow]malformed[/] {e['name']}: {e['message']}", highlight=False)

    if cfg.hosted:
        return _main_hosted(cfg, a, console)
    reap_in_background(a["backend"])  # sandboxes of runs that were SIGKILLed or expired
    display = SWEDisplay(console, quiet=a["quiet"])
    with display:
        (res,) = asyncio.run(run_evals([cfg], display))
    signals = getattr(run_evals, "signals", [])
    if res.run_id:  # one id: the registry's and the results directory's name
        console.print(f"run {res.run_id}: vf-sandbox runs show {res.run_id} (continue: --resume {res.run_id})",
                      highlight=False)
    rows = sorted(res.rows, key=lambda r: r.get("example_id") or 0)
    if res.run_dir is not None and rows:
        _print_table(console, rows, display.elapsed(), res.run_dir)
    if signals:
        console.print(f"[yellow]interrupted[/]: finished rows are in {res.run_dir} (use --resume)")
        return exit_codes.for_signal(signals) or exit_codes.VERDICTS_FAILED
    if res.status != "completed":
        console.print(f"[red]{res.status}[/]: {res.error}")
    all_valid = bool(rows) and all(verdict(r).get("valid") for r in rows)
    return exit_codes.for_swe(res.status, res.usage_error, all_valid and not res.metadata.get("input_errors"))


def _main_hosted(cfg: Any, a: dict[str, Any], console: Any) -> int:
    """--hosted: submit the run as a Ray job; unless --detach, stream its log (not with -q),
    pull the rows and report and exit exactly as a local run does."""
    import io
    import sys
    import time

    from hosted.submit import submit
    from runner.writer import load_existing
    from hosted import jobs as hosted
    from sandboxes.errors import Error

    try:
        row = submit(cfg, {})
    except Error as exc:  # a bad definition, or the cluster does not answer
        console.print(f"[red]error:[/] {exc}")
        return 2
    console.print(f"run {row.id}: submitted to {row.args.get('address')} as Ray job {hosted.job_id(row)} "
                  f"(follow: vf-sandbox runs logs {row.id} --follow)", highlight=False)
    if a["detach"]:
        return 0
    t0 = time.perf_counter()
    try:
        final = hosted.follow(row, poll_interval=1.0, out=io.StringIO() if a["quiet"] else sys.stderr)
    except Error as exc:  # the cluster stopped answering: the run may go on there
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    rows, meta = load_existing(final.output_dir) if (Path(final.output_dir) / "metadata.json").exists() else ([], {})
    rows = sorted(rows, key=lambda r: r.get("example_id") or 0)
    if rows:
        _print_table(console, rows, time.perf_counter() - t0, Path(final.output_dir))
    if final.status != "completed":
        console.print(f"[red]{final.status}[/]: {final.error}")
    all_valid = bool(rows) and all(verdict(r).get("valid") for r in rows)
    return exit_codes.for_swe(final.status, False, all_valid and not meta.get("input_errors"))


class SWEDisplay:
    """The eval runner's display for vf-swe-debug: a line per finished instance, a
    progress bar counting valid / invalid / errored ones, and one per image being
    pulled (none with quiet; display only: results, metadata and JUnit are unchanged)."""

    def __init__(self, console: Any, quiet: bool = False):
        import time

        self.console, self.quiet = console, quiet
        self.evals: list[Any] = []
        self.counts = {"valid": 0, "invalid": 0, "errors": 0}
        self._bar: Any = None
        self._task: Any = None
        self._pulls: dict[str, Any] = {}  # image -> its progress task
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        import time

        return time.perf_counter() - self._t0

    def __enter__(self) -> "SWEDisplay":
        if not self.quiet:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from .images import add_pull_listener

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[amount]}"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task("starting", total=None, amount="")
            add_pull_listener(self.on_pull)
        return self

    def __exit__(self, *exc: Any) -> None:
        from .images import remove_pull_listener

        remove_pull_listener(self.on_pull)
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def on_pull(self, p: Any) -> None:
        """A bar per image being pulled (MB downloaded of the layers announced so far);
        a line when it is done. Called from the pull's worker thread (rich locks)."""
        if self._bar is None:
            return
        mb = f"{p['done'] / 1e6:.1f}/{p['total'] / 1e6:.1f} MB"
        task = self._pulls.get(p["image"])
        if task is None and not p["finished"]:
            task = self._pulls[p["image"]] = self._bar.add_task(f"[cyan]pull[/] {p['image']}", total=p["total"] or None,
                                                                amount=mb)
        if task is not None:
            self._bar.update(task, total=p["total"] or None, completed=p["done"], amount=mb)
        if p["finished"]:
            if task is not None:
                self._bar.remove_task(task)
                self._pulls.pop(p["image"], None)
            if p.get("failed"):
                self._bar.console.print(f"[yellow]![/] pull of {p['image']} failed", highlight=False)
            else:
                self._bar.console.print(f"[cyan]↓[/] pulled {p['image']} ({p['total'] / 1e6:.1f} MB)", highlight=False)

    def add(self, progress: Any) -> int:
        self.evals.append(progress)
        return len(self.evals) - 1

    def add_log(self, line: str) -> None:
        pass

    def add_rows(self, idx: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            v = verdict(row)
            kind = "valid" if v.get("valid") else "errors" if row.get("error") else "invalid"
            self.counts[kind] += 1
            if self._bar is not None:
                mark = {"valid": "[green]✓[/]", "errors": "[yellow]![/]", "invalid": "[red]✗[/]"}[kind]
                total_s = float((v.get("timings") or {}).get("total_s") or 0)
                self._bar.console.print(f"{mark} {v.get('instance_id')}  {v.get('reason')}  {total_s:.1f}s", highlight=False)

    def update(self, idx: int) -> None:
        if self._bar is None:
            return
        p, c = self.evals[idx], self.counts
        self._bar.update(self._task, total=p.total or None, completed=p.done, amount=f"{p.done}/{p.total or '?'}",
                         description=f"[green]{c['valid']} valid[/] [red]{c['invalid']} invalid[/] [yellow]{c['errors']} errors[/]")


def _print_table(console: Any, rows: list[dict[str, Any]], elapsed: float, run_dir: Path) -> None:
    import sys
    from collections import Counter

    from rich.table import Table

    views = [verdict(r) for r in rows]
    n_valid = sum(1 for v in views if v.get("valid"))
    t = Table(title=f"vf-swe-debug: {n_valid}/{len(views)} valid in {elapsed:.1f}s", show_lines=False)
    t.add_column("instance", overflow="fold")
    t.add_column("valid", no_wrap=True)
    t.add_column("reason", no_wrap=True)
    t.add_column("tests s", justify="right", no_wrap=True)
    t.add_column("total s", justify="right", no_wrap=True)
    t.add_column("detail", overflow="fold", ratio=1)
    for v in views:
        tm = v.get("timings") or {}
        t.add_row(str(v.get("instance_id")), "[green]yes[/]" if v.get("valid") else "[red]no[/]", str(v.get("reason")),
                  f"{tm.get('tests_s', 0):.1f}", f"{tm.get('total_s', 0):.1f}", (v.get("detail") or "")[:160])
    Console = type(console)
    Console(stderr=False, width=None if sys.stdout.isatty() else 160).print(t)
    reasons = dict(Counter(str(v.get("reason")) for v in views))
    console.print(f"results: {run_dir / 'results.jsonl'}  reasons: {reasons}", highlight=False)


def main() -> None:
    from vfcli.errors import exit_on_error

    with exit_on_error():
        app()


if __name__ == "__main__":
    main()
