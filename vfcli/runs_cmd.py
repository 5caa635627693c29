"""`vf-sandbox runs list|show|logs|stop` and `vf-sandbox dashboard`.

Merged at the top level of the `vf-sandbox` app (see `vfcli/app.py`).
Cheap to import: the registry, result readers and the server load inside
the commands.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Optional

import typer

from runs.registry import END_STATES, is_hosted, resume_command

if TYPE_CHECKING:
    from runs.registry import RunRecord

app = typer.Typer(pretty_exceptions_enable=False)
runs_app = typer.Typer(
    help="List, inspect, follow and stop eval / swe-debug runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
STATUSES = ("running", *END_STATES)
KINDS = ("eval", "swe-debug")
app.add_typer(runs_app, name="runs")

DbOpt = typer.Option(None, "--db", help="Run registry file \\[default: $VF_RUNS_DB, else runs.db in $VF_STATE_DIR or ~/.local/state/vf-sandbox]")


def _use_db(ctx: typer.Context, db: Optional[str]) -> None:
    """`--db`: the registry file of this command, passed down in its settings scope (the
    registry, dashboard/stop, hosted.jobs and the dashboard server take it from there:
    `sandboxes.settings.current().runs_db`); never written to os.environ."""
    if db:
        from sandboxes import settings

        ctx.with_resource(settings.use(settings.current().model_copy(update={"runs_db": db})))  # until the command ends


@runs_app.callback()
def _runs(ctx: typer.Context, db: Optional[str] = DbOpt) -> None:
    """List, inspect, follow and stop eval / swe-debug runs (`--db` here or on the command)."""
    _use_db(ctx, db)


def _get(run_id: str) -> "RunRecord":
    """The run named by a run id (or unique prefix) or by its results directory."""
    from runs.registry import AmbiguousRunId, find_run

    try:
        rec = find_run(run_id)
    except AmbiguousRunId as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if rec is None:
        typer.echo(f"error: no run {run_id!r} in the run registry (by id or results directory); "
                   "list the runs: vf-sandbox runs list", err=True)
        raise typer.Exit(2)
    return rec


def _where(rec: "RunRecord") -> str:
    """LOCAL, or HOSTED with the cluster address."""
    return f"HOSTED {rec.args.get('address') or ''}".strip() if is_hosted(rec) else "LOCAL"


def _refresh_hosted(runs: list["RunRecord"]) -> list["RunRecord"]:
    """Running hosted runs' rows brought up to date from their Ray jobs (when Ray is installed)."""
    if not any(is_hosted(r) and r.status == "running" for r in runs):
        return runs
    from hosted.jobs import refresh_all

    return refresh_all(runs)


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _dur(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@runs_app.command("list")
def list_cmd(
    ctx: typer.Context,
    status: Optional[str] = typer.Option(None, "--status", "-s", help="running|completed|failed|stopped"),
    env: Optional[str] = typer.Option(None, "--env", "-e", help="Env id (substring)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (substring)."),
    kind: Optional[str] = typer.Option(None, "--kind", help="eval|swe-debug"),
    limit: int = typer.Option(50, "--limit", "-n", help="At most this many runs (newest first)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    db: Optional[str] = DbOpt,
) -> None:
    """List runs, newest first."""
    for flag, value, allowed in (("--status/-s", status, STATUSES), ("--kind", kind, KINDS)):
        if value is not None and value not in allowed:
            typer.echo(f"error: {flag}: unknown value {value!r}; one of {', '.join(allowed)}", err=True)
            raise typer.Exit(2)
    _use_db(ctx, db)
    from runs.registry import list_runs
    from runs.results import outputs_state

    runs = list_runs(status=status, env_id=env, model=model, kind=kind, limit=limit)
    runs = _refresh_hosted(runs)
    if as_json:
        typer.echo(json.dumps([{**r.model_dump(), "outputs": outputs_state(r)} for r in runs], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in ("ID", "NAME", "KIND", "WHERE", "ENV", "MODEL", "STATUS", "PROGRESS", "SCORED", "ERRORED", "STARTED",
                "DURATION"):
        t.add_column(col, no_wrap=col in ("ID", "STATUS", "STARTED", "PROGRESS"))
    colors = {"running": "cyan", "completed": "green", "incomplete": "yellow", "failed": "red", "stopped": "yellow"}
    for r in runs:
        prog = f"{r.completed}/{r.total}" if r.total else str(r.completed)
        t.add_row(r.id, r.name or "", r.kind, _where(r), r.env_id, r.model or "",
                  f"[{colors.get(r.status, 'white')}]{_status_text(r, outputs_state(r))}[/]", prog, str(r.scored_rollouts),
                  _errored_text(r),
                  _ago(r.started_at)[5:], _dur(r.duration))
    Console(width=None if sys.stdout.isatty() else 200).print(t if runs else "no runs")


def _errored_text(rec: "RunRecord") -> str:
    """The errored count with its kinds: "3 (model 2, sandbox 1)"."""
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(rec.errors_by_kind.items()))
    return f"{rec.errored_rollouts} ({kinds})" if kinds else str(rec.errored_rollouts)


def _status_text(rec: "RunRecord", outputs: str) -> str:
    """The status with what became of the results: "completed (outputs deleted)"."""
    note = {"deleted": "outputs deleted", "not saved": "results not saved"}.get(outputs)
    return f"{rec.display_status} ({note})" if note else rec.display_status


@runs_app.command("show")
def show_cmd(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix), or its results directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    db: Optional[str] = DbOpt,
) -> None:
    """Config, progress, aggregate metrics, pass@k, errors by type and timing of a run."""
    _use_db(ctx, db)
    from runs.diagnose import diagnose
    from runs.results import outputs_state, summarize_run

    rec = _refresh_hosted([_get(run_id)])[0]
    summary = summarize_run(rec)
    outputs = outputs_state(rec)
    diagnosis = diagnose(rec, summary)
    if as_json:
        typer.echo(json.dumps({"run": rec.model_dump(), "summary": summary, "outputs": outputs,
                               "diagnosis": diagnosis.model_dump() if diagnosis else None}, indent=2, default=str))
        return
    from rich.console import Console

    c = Console()
    c.print(f"[bold]run {rec.id}[/]  {rec.name or ''}")
    rows = [
        ("kind", rec.kind), ("status", _status_text(rec, outputs)), ("env", rec.env_id),
        ("model", rec.model or "-"), ("output dir", f"{rec.output_dir} ({outputs})"), ("log", rec.log_path),
        ("where", _where(rec) + (f" (Ray job {_job_id(rec)})" if is_hosted(rec) else "")),
        ("pid", f"{rec.pid} on {rec.host}"), ("progress", f"{rec.completed}/{rec.total}"),
        ("rollouts", f"{rec.scored_rollouts} scored, {_errored_text(rec)} errored"),
        ("started", _ago(rec.started_at)), ("ended", _ago(rec.ended_at)), ("duration", _dur(rec.duration)),
        ("attempts", str(rec.attempts)),
    ]
    if rec.error:
        rows.append(("error", rec.error))
    if diagnosis is not None:
        rows += [("category", diagnosis.category), ("next", diagnosis.hint)]
    for k, v in rows:
        c.print(f"  [dim]{k:<11}[/] {v}", highlight=False)
    c.print("[bold]config[/]")
    for k, v in sorted(rec.args.items()):
        c.print(f"  [dim]{k:<11}[/] {json.dumps(v, default=str)}", highlight=False)
    if rec.kind == "eval" and rec.args.get("client_config"):
        if rec.status not in ("completed", "running"):
            c.print(f"  [dim]{'continue':<11}[/] {resume_command(rec)}", highlight=False)
        c.print(f"  [dim]{'rerun':<11}[/] vf-sandbox eval --from-run {rec.id}  (a new run, same definition)",
                highlight=False)
    _print_summary(c, summary, rec, outputs)


def _print_summary(c, s: dict, rec: "RunRecord", outputs: str) -> None:
    if s.get("kind") == "swe-debug":
        c.print(f"[bold]instances[/] {s.get('n', 0)}  valid {s.get('valid', 0)}")
        for reason, n in sorted(s.get("reasons", {}).items(), key=lambda kv: -kv[1]):
            c.print(f"  {reason:<30} {n}")
        for phase, p in s.get("phase_timings", {}).items():
            c.print(f"  [dim]{phase:<16}[/] p50 {p['p50']:.2f}s  p90 {p['p90']:.2f}s  max {p['max']:.2f}s")
        return
    if not s.get("n_rollouts"):
        c.print("[dim]" + {"not saved": f"{rec.status}, results not saved (the eval ran without -s)",
                            "deleted": f"{rec.status}, outputs deleted ({rec.output_dir} is gone)",
                            "none yet": "no results yet"}.get(outputs, f"{rec.status}, no results") + "[/]")
        return
    c.print(f"[bold]results[/] {s['n_rollouts']} rollouts over {s['n_examples']} examples")
    r = s["reward"]
    c.print(f"  reward      avg {r['mean']:.4f}  std {r['std']:.4f}  min {r['min']:.4f}  max {r['max']:.4f}")
    for name, m in s.get("metrics", {}).items():
        c.print(f"  {name:<11} avg {m['mean']:.4f}  std {m['std']:.4f}", highlight=False)
    if s.get("pass_at_k"):
        c.print("  pass@k      " + "  ".join(f"@{k}: {v:.3f}" for k, v in s["pass_at_k"].items()))
    if s.get("errors_by_type"):
        c.print("[bold]errors by type[/]")
        for et, n in sorted(s["errors_by_type"].items(), key=lambda kv: -kv[1]):
            c.print(f"  {et:<30} {n}", highlight=False)
    if s.get("errors_by_kind"):
        c.print("  by kind: " + ", ".join(f"{k} {n}" for k, n in s["errors_by_kind"].items()), highlight=False)
    if s.get("avg_token_usage"):
        c.print("[bold]avg token usage[/] " + "  ".join(f"{k} {v:.1f}" for k, v in s["avg_token_usage"].items()))
    if s.get("timing"):
        c.print("[bold]timing (s)[/]")
    for name, p in s.get("timing", {}).items():
        c.print(f"  [dim]{name:<16}[/] p50 {p['p50']:.2f}s  p90 {p['p90']:.2f}s  p99 {p['p99']:.2f}s  max {p['max']:.2f}s")


@runs_app.command("logs")
def logs_cmd(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix), or its results directory."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the run ends."),
    tail: int = typer.Option(0, "--tail", help="Only the last N lines (0: all)."),
    poll: float = typer.Option(0.3, "--poll-interval", help="Seconds between reads with --follow."),
    reconnect_for: float = typer.Option(60.0, "--reconnect-for", min=0,
                                        help="Hosted runs: seconds --follow keeps retrying a cluster that stopped answering."),
    db: Optional[str] = DbOpt,
) -> None:
    """Print a run's log; with --follow, stream it until the run ends."""
    _use_db(ctx, db)
    rec = _get(run_id)
    out = sys.stdout
    if is_hosted(rec):
        from hosted.jobs import follow_log as follow_hosted

        rec = _refresh_hosted([rec])[0]
        if follow or rec.status != "running":
            follow_hosted(rec, poll_interval=max(poll, 0.5), out=out, reconnect_for=reconnect_for)
        else:
            from hosted.jobs import jobs_client, job_id

            out.write(jobs_client(rec.args["address"]).get_job_logs(job_id(rec)))
        return
    for chunk in follow_log(rec.id, follow=follow, tail=tail, poll=poll):
        out.write(chunk)
        out.flush()


def follow_log(run_id: str, *, follow: bool, tail: int = 0, poll: float = 0.3):
    """Yield the log's text; with `follow`, keep yielding new text until the run
    is no longer running (then drain what is left)."""
    from runs.registry import get_run

    rec = get_run(run_id)
    assert rec is not None
    pos = 0
    if tail > 0:
        try:
            with open(rec.log_path, "rb") as f:
                lines = f.read().splitlines(keepends=True)
                pos = sum(len(x) for x in lines[:-tail]) if len(lines) > tail else 0
        except OSError:
            pass
    while True:
        ended = get_run(run_id).status != "running" if follow else True
        try:
            with open(rec.log_path, "rb") as f:
                f.seek(pos)
                data = f.read()
        except OSError:
            data = b""
        if data:
            # never split a line in the middle while the run is still writing
            cut = len(data) if ended else data.rfind(b"\n") + 1
            if cut:
                pos += cut
                yield data[:cut].decode("utf-8", "replace")
        if ended:
            return
        time.sleep(poll)


@runs_app.command("stop")
def stop_cmd(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix), or its results directory."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for a graceful stop."),
    force: bool = typer.Option(False, "--force", help="SIGKILL the run if it has not stopped in time."),
    keep_sandboxes: bool = typer.Option(False, "--keep-sandboxes",
                                        help="When the process died without cleaning up, leave its sandboxes."),
    db: Optional[str] = DbOpt,
) -> None:
    """Stop a run gracefully: SIGTERM (the run saves finished groups, tears down
    its sandboxes and records `stopped`), wait, verify."""
    from dashboard.stop import StopError, stop_run

    _use_db(ctx, db)
    rec = _get(run_id)
    finished = rec.status != "running"
    if is_hosted(rec) and not finished:
        from hosted.jobs import stop as stop_hosted

        rec, removed = stop_hosted(rec, timeout=max(timeout, 120.0))
        typer.echo(f"run {rec.id}: {rec.display_status}" + (f" ({rec.error})" if rec.error else ""))
        typer.echo(f"removed {removed} sandbox(es) of the run on the cluster's nodes; results in {rec.output_dir}")
        raise typer.Exit(0 if rec.status in ("stopped", "completed", "failed") else 1)
    if finished:  # nothing to stop: say so (exit 0), but still clean up after a vanished process
        typer.echo(f"run {rec.id} already finished: {rec.display_status}" + (f" ({rec.error})" if rec.error else ""))
    else:
        try:
            rec = stop_run(rec.id, timeout=timeout, force=force)
        except StopError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1)
        typer.echo(f"run {rec.id}: {rec.display_status}" + (f" ({rec.error})" if rec.error else ""))
    if rec.vanished and not keep_sandboxes:  # it died without its own teardown
        try:
            n = remove_orphaned_sandboxes(rec)
        except Exception as exc:  # noqa: BLE001 - report, the stop itself succeeded
            typer.echo(f"could not check for sandboxes it left ({exc}); try `vf-sandbox sandboxes reap`", err=True)
        else:
            if n:
                typer.echo(f"removed {n} sandbox(es) the run left behind")
    if rec.status != "stopped" and not finished:
        raise typer.Exit(1)


def remove_orphaned_sandboxes(rec: "RunRecord", backend: str | None = None) -> int:
    """Delete the sandboxes this run created whose owner process is gone (found
    by the run-id label every sandbox carries). Live owners' sandboxes are kept."""
    import asyncio
    import socket

    from sandboxes.labels import OWNER_HOST, OWNER_PID, OWNER_START

    from runs.registry import pid_alive

    def orphaned(labels: dict[str, str]) -> bool:
        # like sandboxes.labels.owner_alive, but a zombie owner counts as dead
        if labels.get(OWNER_HOST) != socket.gethostname():
            return False
        try:
            return not pid_alive(int(labels.get(OWNER_PID, "")), labels.get(OWNER_START, ""))
        except ValueError:
            return True

    if not rec.sandbox_run_id:
        return 0
    # the backend the run definition recorded (options whose values were redacted are left out)
    recorded = rec.args.get("backend") if isinstance(rec.args.get("backend"), str) else None
    name = backend or recorded
    options = rec.args.get("backend_options") if name == recorded and isinstance(rec.args.get("backend_options"), dict) else {}
    options = {k: v for k, v in options.items() if v != "***"}

    from sandboxes.lifecycle import delete_run_sandboxes

    return asyncio.run(delete_run_sandboxes(name, options, rec.sandbox_run_id, only=lambda i: orphaned(i.labels)))


def _job_id(rec: "RunRecord") -> str:
    from hosted.jobs import job_id

    return job_id(rec)


@runs_app.command("pull")
def pull_cmd(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix) of a hosted run."),
    db: Optional[str] = DbOpt,
) -> None:
    """Copy a hosted run's results and log from the cluster into its local output dir."""
    _use_db(ctx, db)
    from hosted.jobs import pull

    rec = _get(run_id)
    if not is_hosted(rec):
        typer.echo(f"error: run {rec.id} ran here (not --hosted); its results are in {rec.output_dir}", err=True)
        raise typer.Exit(2)
    rec = _refresh_hosted([rec])[0]
    meta = pull(rec)
    typer.echo(f"run {rec.id}: {meta.get('completed_rollouts', 0)} rollout(s), status {meta.get('status', rec.status)} "
               f"-> {rec.output_dir}")


@app.command("dashboard")
def dashboard_cmd(
    ctx: typer.Context,
    port: int = typer.Option(8787, "--port", "-p", help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (loopback by default)."),
    endpoints: str = typer.Option("configs/endpoints.toml", "--endpoints-path",
                                  help="Endpoint registry offered when starting a run from the page."),
    allow_launch: bool = typer.Option(True, "--allow-launch/--no-launch",
                                      help="Allow starting `vf-sandbox eval` runs from the page."),
    db: Optional[str] = DbOpt,
) -> None:
    """Serve the local results dashboard (runs, metrics, samples, logs)."""
    _use_db(ctx, db)
    from dashboard.server import serve

    try:
        serve(host=host, port=port, endpoints_path=endpoints, allow_launch=allow_launch)
    except OSError as exc:  # the port is taken (or not ours to bind)
        typer.echo(f"error: cannot serve the dashboard on {host}:{port}: {exc.strerror or exc} "
                   f"(another dashboard running? try --port {port + 1})", err=True)
        raise typer.Exit(2)
