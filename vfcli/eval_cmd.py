"""`vf-sandbox eval` and `vf-sandbox env install`: the typer layer only.
Flags mirror the reference eval CLI (same short forms and defaults); the work
happens in `runner` (imported inside the commands to keep startup cheap)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from typer.core import TyperCommand

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
env_app = typer.Typer(help="Manage environment packages.", add_completion=False, no_args_is_help=True)
app.add_typer(env_app, name="env")

AUTO_RESUME = _AUTO = "__auto__"


class OptionalResumeCommand(TyperCommand):
    """Lets `--resume/-R` take an optional value: a bare `--resume` (last, or
    followed by another option) means "the newest incomplete run of this definition"
    (AUTO_RESUME). Used by `vf-sandbox eval` and `vf-swe-debug`."""

    def parse_args(self, ctx, args):  # type: ignore[no-untyped-def]
        fixed = []
        for i, arg in enumerate(args):
            if arg in ("--resume", "-R") and (i + 1 == len(args) or args[i + 1].startswith("-")):
                fixed.append(f"--resume={_AUTO}")
            else:
                fixed.append(arg)
        return super().parse_args(ctx, fixed)


_EvalCommand = OptionalResumeCommand


def _parse_workers(value: str) -> int | None:
    """`-w N` or `-w auto` (one process; None = not given)."""
    from sandboxes.errors import ConfigError

    if value == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--num-workers/-w: expected a positive integer or 'auto', got {value!r}") from None
    if n < 1:
        raise ConfigError(f"--num-workers/-w: expected a positive integer or 'auto', got {value!r}")
    return n


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _eval_models() -> tuple[Any, ...]:
    from runner.config import SETTING_MODELS

    return SETTING_MODELS


def _env_ids() -> list[inspect.Parameter]:
    return [inspect.Parameter("env_id_or_path", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[list[str]],
                              default=typer.Argument(None, help="Environment ID(s) or path to a TOML config"))]


def _DeclaredCommand(func: Callable[..., None]) -> Any:
    """`eval_command` as typer sees it: the positional environment ids, then one option per
    declared setting (`runner.config.SETTING_MODELS`: flag, short form, help, default)."""
    from runner.options import DeclaredCommand

    return DeclaredCommand(func, _eval_models, _env_ids)


RERUN_SIZE = ("num_examples", "rollouts_per_example")
"""Settings of what is evaluated that a rerun of a recorded run (--from-run) may still change."""


def _flag_value(d: Any, raw: Any) -> Any:
    """The setting a flag's value gives (None: not given); JSON and key=value text parsed,
    errors naming the flag."""
    from runner.config import parse_header_lines, parse_json_object, parse_kwargs_list

    label = "/".join(d.flags)
    if raw is None or raw is False:
        return None
    if d.name == "num_workers":
        return _parse_workers(raw)
    if d.name == "resume_path":
        return None if raw == _AUTO else raw
    if d.name == "extra_env_kwargs":
        return parse_kwargs_list(raw, label) or None
    if d.name in ("env_args", "sampling_args", "backend_options"):
        return parse_json_object(raw, label) or None
    if d.name in ("header", "header_from_state"):
        parse_header_lines(raw, label)  # errors name the flag
        return raw or None
    return raw


def _given(o: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """(run-control settings given, flags given that define what is evaluated): the former
    still apply to a TOML config or a recorded run, the latter do not."""
    from runner.config import EvalConfig, ClientSettings
    from runner.options import flags

    run_control = {d.name: _flag_value(d, o[d.param]) for d in flags(EvalConfig, ClientSettings) if d.opt.run_control}
    run_control["resume"] = o["resume"] is not None or None
    content = [d for d in flags(EvalConfig, ClientSettings) if not d.opt.run_control]
    return run_control, content


def _check_source(o: dict[str, Any], env_ids: list[str], content: list[Any], from_run: str | None,
                  resume_alone: bool) -> None:
    """Flags that define what is evaluated cannot be added to a TOML config or a recorded run."""
    from sandboxes.errors import ConfigError

    is_toml = len(env_ids) == 1 and env_ids[0].endswith(".toml")
    if from_run is None and not is_toml:
        return
    source = ("--resume RUN" if resume_alone else "--from-run") if from_run is not None else "a TOML config"
    given = [d.opt.short or d.opt.flag for d in content if o[d.param] not in (None, False, [], "")
             and (from_run is None or d.name not in RERUN_SIZE)]
    if given:
        raise ConfigError(f"{', '.join(given)} cannot be combined with {source}: it defines what is evaluated "
                          "(edit the TOML config instead); run-control flags such as -c, -w, -o, -s, -R, "
                          "--backend, --max-retries, --timeout-minutes do apply")


def _resolve(o: dict[str, Any]) -> tuple[list[Any], dict[str, str]]:
    """The run definitions the flags describe (environment ids, a TOML config, or a recorded
    run) and the hosted secrets (--custom-secrets, never recorded)."""
    from sandboxes.errors import ConfigError

    from runner.config import config_from_run, configs_from_cli, configs_from_toml, parse_json_object

    env_ids = list(o["env_id_or_path"] or [])
    run_control, content = _given(o)
    secrets = {}
    if o["custom_secrets"] is not None:
        from hosted.submit import parse_secrets

        secrets = parse_secrets(parse_json_object(o["custom_secrets"], "--custom-secrets"))
        run_control["custom_secret_names"] = sorted(secrets) or None
    if o["extend"] and o["resume"] is None:
        raise ConfigError("--extend only applies with --resume (it lets a resume add examples to a completed run)")
    resume_path, from_run = run_control["resume_path"], o["from_run"]
    resume_alone = resume_path is not None and not env_ids and from_run is None
    if resume_alone:  # `--resume ID`: the run's own recorded definition, continued
        from_run = resume_path
    _check_source(o, env_ids, content, from_run, resume_alone)
    if from_run is not None:
        if env_ids:
            raise ConfigError("--from-run replaces the environment ids / TOML config; pass one or the other")
        run_control.update({k: o[k] for k in RERUN_SIZE})
        configs = [config_from_run(from_run, run_control, flag="--resume" if resume_alone else "--from-run")]
        if not resume_alone:
            typer.echo(f"--from-run {from_run}: a new run with the definition of {from_run} (to continue that "
                       f"run instead: vf-sandbox eval --resume {from_run})", err=True)
    elif not env_ids:
        raise ConfigError("give an environment id, a TOML config, --from-run RUN (a new run) or --resume RUN "
                          "(continue one)")
    elif len(env_ids) == 1 and env_ids[0].endswith(".toml"):
        configs = configs_from_toml(env_ids[0], run_control)
    else:
        if any(x.endswith(".toml") for x in env_ids):
            raise ConfigError("pass either environment ids or one TOML config, not both")
        cli = {**run_control, **{d.name: _flag_value(d, o[d.param]) for d in content}}
        configs = configs_from_cli(env_ids, cli)
    if resume_path is not None and len(configs) != 1:
        raise ConfigError("--resume RUN applies to exactly one eval")
    return configs, secrets


def _hosted_or_refused(o: dict[str, Any], configs: list[Any], secrets: dict[str, str]) -> None:
    """Submit a hosted run (exits with its code); refuse hosted-only flags on a local run."""
    from sandboxes.errors import ConfigError

    if any(c.hosted for c in configs):
        if not all(c.hosted for c in configs):
            raise ConfigError("either every eval of the config is hosted or none is")
        from hosted.submit import run_hosted

        raise typer.Exit(run_hosted(configs, secrets, follow=o["follow"], poll_interval=o["poll_interval"]))
    hosted_only = [f for f, v in (("--follow", o["follow"]), ("--custom-secrets", o["custom_secrets"]),
                                  ("--allow-sandbox-access", o["allow_sandbox_access"]),
                                  ("--allow-instances-access", o["allow_instances_access"]),
                                  ("--address", o["address"])) if v]
    if hosted_only:
        raise ConfigError(f"{', '.join(hosted_only)} only apply to hosted runs (--hosted)")


@app.command("eval", cls=_EvalCommand)
@_DeclaredCommand
def eval_command(**o: Any) -> None:
    """Evaluate a model on one or more environments (or a TOML config).

    Exit codes: 0 every rollout scored · 2 usage error · 3 incomplete: rollouts ended in model /
    sandbox / env errors or were not run (continue with `vf-sandbox eval --resume <run id>`;
    accept some with --max-error-rate) · 130 / 143 interrupted (SIGINT / SIGTERM).
    vf-swe-debug uses the same codes (and 1: some instance invalid)."""
    import logging

    from sandboxes.errors import ConfigError, UsageError

    from sandboxes import settings

    from envs.errors import MissingKeyError
    from envs.logging_utils import setup_logging
    from runner.config import with_process_settings

    setup_logging("DEBUG" if o["verbose"] else "INFO", log_format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                  date_format="%H:%M:%S")
    # the run's log file (runs.registry) is a root handler: the CLI's records propagate to it
    logging.getLogger("envs").propagate = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        configs, secrets = _resolve(o)
        # what the entry (vfcli.app) read from the process environment, carried by the definitions
        configs = with_process_settings(configs, settings.current())
        _hosted_or_refused(o, configs, secrets)
    except (ConfigError, UsageError, MissingKeyError) as exc:
        _fail(str(exc))
        return
    from runner.exit_codes import run_with_signal_codes

    code = run_with_signal_codes(lambda: _run(configs, disable_tui=o["disable_tui"], fullscreen=o["fullscreen"],
                                              abbreviated=o["abbreviated_summary"]))
    raise typer.Exit(code)


def _run(configs, disable_tui: bool, fullscreen: bool, abbreviated: bool) -> int:
    import asyncio
    import signal

    from runner.display import make_display, print_summary
    from runner.runner import run_evals

    from sandboxes.lifecycle import reap_in_background

    for name in sorted({c.backend for c in configs}):
        reap_in_background(name)  # sandboxes of runs that were SIGKILLed or expired
    plain = disable_tui or not sys.stdout.isatty()
    display = make_display(plain, fullscreen)
    with display:
        results = asyncio.run(run_evals(configs, display))
    for res in results:
        if res.metadata:
            print_summary(res.metadata, res.rows, abbreviated=abbreviated, plain=plain)
        if res.status != "completed":
            typer.secho(f"{res.config.env_id}: {res.status}" + (f": {res.error}" if res.error else ""),
                        fg=typer.colors.RED if res.status == "failed" else typer.colors.YELLOW, err=True)
        if res.run_dir is not None and res.metadata.get("path_to_save"):
            typer.echo(f"results: {res.run_dir}")
        elif res.rows:
            typer.echo("results not saved (add -s to save them)")
        if res.run_id:
            typer.echo(f"run {res.run_id}: vf-sandbox runs show {res.run_id} · dashboard: vf-sandbox dashboard "
                       f"(http://127.0.0.1:8787/#/run/{res.run_id})")
    from runner import exit_codes

    code = exit_codes.for_signal(getattr(run_evals, "signals", []))
    if code is not None:
        return code
    return exit_codes.for_statuses((r.status, r.usage_error) for r in results)


@env_app.command("install")
def env_install(
    name: str = typer.Argument(..., help="Environment name (./environments/NAME)"),
    path: str = typer.Option("./environments", "--path", "-p", help="Directory holding environment packages"),
    editable: bool = typer.Option(True, "--editable/--no-editable", help="Install in editable mode"),
) -> None:
    """Install ./environments/NAME as a Python package into this interpreter."""
    import shutil
    import subprocess

    base = Path(path)
    candidates = [base / name, base / name.replace("-", "_"), base / name.replace("_", "-")]
    pkg = next((c for c in candidates if (c / "pyproject.toml").exists()), None)
    if pkg is None:
        have = sorted(p.name for p in base.iterdir() if (p / "pyproject.toml").exists()) if base.is_dir() else []
        _fail(f"no environment package {name!r} under {base} (looked for {candidates[1]}/pyproject.toml); available: {', '.join(have) or 'none'}")
    target = ["-e", str(pkg.resolve())] if editable else [str(pkg.resolve())]
    uv = shutil.which("uv")
    cmd = [uv, "pip", "install", "--python", sys.executable, *target] if uv else [sys.executable, "-m", "pip", "install", *target]
    typer.echo(f"installing {pkg} ...")
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        _fail(f"installation of {pkg} failed (exit {proc.returncode})", code=proc.returncode)
    typer.echo(f"installed {pkg.name}")
