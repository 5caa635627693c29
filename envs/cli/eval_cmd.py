"""`vf-sandbox eval` and `vf-sandbox env install`: the typer layer only.
Flags mirror the reference eval CLI (same short forms and defaults); the work
happens in `envs.eval` (imported inside the commands to keep startup cheap)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

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


@app.command("eval", cls=_EvalCommand)
def eval_command(
    env_id_or_path: Optional[list[str]] = typer.Argument(None, help="Environment ID(s) or path to a TOML config"),
    env_args: Optional[str] = typer.Option(None, "--env-args", "-a", help="JSON object passed to load_environment() \\[default: {}]"),
    extra_env_kwargs: Optional[list[str]] = typer.Option(None, "--extra-env-kwargs", "-x", help="Environment settings: a JSON object or key=value[,key=value] (e.g. isolation=gvisor); repeatable, merged \\[default: {}]"),
    env_dir_path: Optional[str] = typer.Option(None, "--env-dir-path", "-p", help="Base path of local environments \\[default: ./environments]"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model name or endpoint alias \\[default: openai/gpt-4.1-mini]"),
    api_base_url: Optional[str] = typer.Option(None, "--api-base-url", "-b", help="API base URL \\[default: https://api.pinference.ai/api/v1]"),
    api_key_var: Optional[str] = typer.Option(None, "--api-key-var", "-k", help="Environment variable holding the API key \\[default: PRIME_API_KEY]"),
    api_client_type: Optional[str] = typer.Option(None, "--api-client-type", help="openai_chat_completions | openai_completions | openai_responses | openai_chat_completions_token | "
                                                   "nemorl_chat_completions | renderer (its settings: eval TOML) | anthropic_messages"),
    endpoints_path: Optional[str] = typer.Option(None, "--endpoints-path", "-e", help="TOML endpoints registry \\[default: ./configs/endpoints.toml]"),
    header: Optional[list[str]] = typer.Option(None, "--header", help="Extra HTTP header 'Name: Value' (repeatable)"),
    header_from_state: Optional[list[str]] = typer.Option(None, "--header-from-state", help="Per-request header 'Name: state_key' (repeatable) \\[default: X-Session-ID: example_id]"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", "-t", help="Maximum tokens to generate"),
    temperature: Optional[float] = typer.Option(None, "--temperature", "-T", help="Sampling temperature"),
    sampling_args: Optional[str] = typer.Option(None, "--sampling-args", "-S", help="JSON object of extra sampling parameters"),
    num_examples: Optional[int] = typer.Option(None, "--num-examples", "-n", help="Number of dataset examples \\[default: 5]"),
    rollouts_per_example: Optional[int] = typer.Option(None, "--rollouts-per-example", "-r", help="Rollouts per example \\[default: 3]"),
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent", "-c", help="Maximum concurrent rollouts \\[default: 32]"),
    max_concurrent_generation: Optional[int] = typer.Option(None, "--max-concurrent-generation", help="Concurrent generation requests \\[default: same as -c]"),
    max_concurrent_scoring: Optional[int] = typer.Option(None, "--max-concurrent-scoring", help="Concurrent scoring requests \\[default: same as -c]"),
    no_interleave_scoring: bool = typer.Option(False, "--no-interleave-scoring", "-N", help="Score after generation instead of per group"),
    independent_scoring: bool = typer.Option(False, "--independent-scoring", "-i", help="Score each rollout individually"),
    max_retries: Optional[int] = typer.Option(None, "--max-retries", help="Retries of a rollout after an infrastructure or transient model-API error, each logged \\[default: 0]"),
    max_error_rate: Optional[float] = typer.Option(None, "--max-error-rate", help="Share of rollouts (0..1) that may end in a model / sandbox / env error and the run still be completed (exit 0) \\[default: 0]"),
    rollout_timeout: Optional[float] = typer.Option(None, "--rollout-timeout", help="Seconds a model request of a rollout may take (the request timeout; then: a model error, retried like one) \\[default: 3600]"),
    client_max_retries: Optional[int] = typer.Option(None, "--client-max-retries", help="The model API client's own quick retries of one request (SDK max_retries), each logged \\[default: 2]"),
    num_workers: str = typer.Option("auto", "--num-workers", "-w", help="Worker processes sharing the run (auto = 1)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging"),
    fullscreen: bool = typer.Option(False, "--fullscreen", "-f", help="Use the alternate screen for the live display"),
    disable_tui: bool = typer.Option(False, "--disable-tui", "-d", help="Plain logs instead of the live display"),
    abbreviated_summary: bool = typer.Option(False, "--abbreviated-summary", "-A", help="Summary without sample rollouts"),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o", help="Base output directory \\[default: ./outputs]"),
    save_results: bool = typer.Option(False, "--save-results", "-s", help="Save results to disk"),
    resume: Optional[str] = typer.Option(None, "--resume", "-R", help="Continue a run: its run id or results directory (alone, it needs no other flag), or, with no value, the newest incomplete run of this definition in the run registry; runs exactly its errored and missing rollouts"),
    extend: bool = typer.Option(False, "--extend", help="With --resume: allow a larger -n to add examples to a completed run"),
    state_columns: Optional[str] = typer.Option(None, "--state-columns", "-C", help="Extra state columns to save (comma-separated)"),
    save_to_hf_hub: bool = typer.Option(False, "--save-to-hf-hub", "-H", help="Push results to the Hugging Face Hub"),
    hf_hub_dataset_name: Optional[str] = typer.Option(None, "--hf-hub-dataset-name", "-D", help="Dataset name on the HF Hub"),
    heartbeat_url: Optional[str] = typer.Option(None, "--heartbeat-url", help="URL to GET every 30 s while the eval runs (uptime monitoring)"),
    eval_name: Optional[str] = typer.Option(None, "--eval-name", help="Name recorded for this run in the run registry"),
    timeout_minutes: Optional[float] = typer.Option(None, "--timeout-minutes", help="Stop cleanly after this many minutes \\[default: 120, max 1440]"),
    backend: Optional[str] = typer.Option(None, "--backend", help="Sandbox backend of sandbox-backed envs: docker | local | kubernetes | prime \\[default: docker]"),
    backend_options: Optional[str] = typer.Option(None, "--backend-options", help="JSON object passed to the sandbox backend's constructor"),
    junit_xml: Optional[str] = typer.Option(None, "--junit-xml", help="Also write the results as a JUnit XML report (a test case per rollout) for CI"),
    from_run: Optional[str] = typer.Option(None, "--from-run", help="Start a NEW run with the definition of a recorded run: a run id or a results directory (explicit flags override it; to continue that run use --resume ID)"),
    hosted: bool = typer.Option(False, "--hosted", help="Run as a Ray job on a cluster (see --address); needs vf-sandbox[ray]"),
    address: Optional[str] = typer.Option(None, "--address", help="Hosted: the Ray dashboard address http://HOST:8265 \\[default: $RAY_ADDRESS]"),
    follow: bool = typer.Option(False, "--follow", help="Hosted: stream the run's logs until it ends and exit with its status"),
    poll_interval: float = typer.Option(2.0, "--poll-interval", help="Hosted: seconds between status/log polls with --follow"),
    allow_sandbox_access: bool = typer.Option(False, "--allow-sandbox-access", help="Hosted: allow the run to create sandboxes"),
    allow_instances_access: bool = typer.Option(False, "--allow-instances-access", help="Hosted: allow the run to create instances/pods (kubernetes, prime backends)"),
    custom_secrets: Optional[str] = typer.Option(None, "--custom-secrets", help="Hosted: JSON object of secrets injected as environment variables of the run (never recorded)"),
) -> None:
    """Evaluate a model on one or more environments (or a TOML config).

    Exit codes: 0 every rollout scored · 2 usage error · 3 incomplete: rollouts ended in model /
    sandbox / env errors or were not run (continue with `vf-sandbox eval --resume <run id>`;
    accept some with --max-error-rate) · 130 / 143 interrupted (SIGINT / SIGTERM).
    vf-swe-debug uses the same codes (and 1: some instance invalid)."""
    import logging

    from sandboxes.errors import ConfigError, UsageError

    from ..errors import MissingKeyError
    from ..eval.config import config_from_run, configs_from_cli, configs_from_toml, parse_header_lines, parse_json_object, parse_kwargs_list
    from ..logging_utils import setup_logging

    setup_logging("DEBUG" if verbose else "INFO", log_format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                  date_format="%H:%M:%S")
    # the run's log file (envs.runs.registry) is a root handler: the CLI's records propagate to it
    logging.getLogger("envs").propagate = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
    resume_path = None if resume in (None, _AUTO) else resume
    env_ids = list(env_id_or_path or [])
    try:
        workers = _parse_workers(num_workers)
        run_control = {  # flags that still apply to a TOML config or a recorded run
            "resume": resume is not None or None,
            "resume_path": resume_path,
            "extend": extend or None,
            "output_dir": output_dir,
            "verbose": verbose or None,
            "timeout_minutes": timeout_minutes,
            "name": eval_name,
            "backend": backend,
            "backend_options": parse_json_object(backend_options, "--backend-options") or None,
            "num_workers": workers,
            "max_retries": max_retries,
            "client_max_retries": client_max_retries,
            "max_error_rate": max_error_rate,
            "rollout_timeout": rollout_timeout,
            "max_concurrent": max_concurrent,
            "save_results": save_results or None,
            "junit_xml": junit_xml,
            "hosted": hosted or None,
            "address": address,
            "allow_sandbox_access": allow_sandbox_access or None,
            "allow_instances_access": allow_instances_access or None,
        }
        secrets = {}
        if custom_secrets is not None:
            from ..eval.hosted import parse_secrets

            secrets = parse_secrets(parse_json_object(custom_secrets, "--custom-secrets"))
            run_control["custom_secret_names"] = sorted(secrets) or None
        content = {"-a": env_args, "-x": extra_env_kwargs, "-p": env_dir_path, "-m": model, "-b": api_base_url,
                   "-k": api_key_var, "--api-client-type": api_client_type, "-e": endpoints_path, "--header": header,
                   "--header-from-state": header_from_state, "-S": sampling_args, "-t": max_tokens,
                   "-T": temperature, "-C": state_columns, "-i": independent_scoring, "-N": no_interleave_scoring,
                   "--max-concurrent-generation": max_concurrent_generation,
                   "--max-concurrent-scoring": max_concurrent_scoring, "-H": save_to_hf_hub,
                   "-D": hf_hub_dataset_name, "--heartbeat-url": heartbeat_url}
        given = [flag for flag, value in content.items() if value not in (None, False, [], "")]
        is_toml = len(env_ids) == 1 and env_ids[0].endswith(".toml")
        if extend and resume is None:
            raise ConfigError("--extend only applies with --resume (it lets a resume add examples to a completed run)")
        resume_alone = resume_path is not None and not env_ids and from_run is None
        if resume_alone:  # `--resume ID`: the run's own recorded definition, continued
            from_run = resume_path
        if from_run is not None or is_toml:
            source = ("--resume RUN" if resume_alone else "--from-run") if from_run is not None else "a TOML config"
            if from_run is None and (num_examples is not None or rollouts_per_example is not None):
                given += [f for f, v in (("-n", num_examples), ("-r", rollouts_per_example)) if v is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} cannot be combined with {source}: it defines what is evaluated "
                                  "(edit the TOML config instead); run-control flags such as -c, -w, -o, -s, -R, "
                                  "--backend, --max-retries, --timeout-minutes do apply")
        if from_run is not None:
            if env_ids:
                raise ConfigError("--from-run replaces the environment ids / TOML config; pass one or the other")
            run_control.update({"num_examples": num_examples, "rollouts_per_example": rollouts_per_example})
            configs = [config_from_run(from_run, run_control, flag="--resume" if resume_alone else "--from-run")]
            if not resume_alone:
                typer.echo(f"--from-run {from_run}: a new run with the definition of {from_run} (to continue that "
                           f"run instead: vf-sandbox eval --resume {from_run})", err=True)
        elif not env_ids:
            raise ConfigError("give an environment id, a TOML config, --from-run RUN (a new run) or --resume RUN "
                              "(continue one)")
        elif is_toml:
            configs = configs_from_toml(env_ids[0], run_control)
        else:
            if any(x.endswith(".toml") for x in env_ids):
                raise ConfigError("pass either environment ids or one TOML config, not both")
            headers = parse_header_lines(header, "--header")
            from_state = parse_header_lines(header_from_state, "--header-from-state") if header_from_state else None
            cli = {
                **run_control,
                "env_args": parse_json_object(env_args, "--env-args/-a") or None,
                "extra_env_kwargs": parse_kwargs_list(extra_env_kwargs, "--extra-env-kwargs/-x") or None,
                "sampling_args": parse_json_object(sampling_args, "--sampling-args/-S") or None,
                "env_dir_path": env_dir_path,
                "model": model,
                "api_base_url": api_base_url,
                "api_key_var": api_key_var,
                "api_client_type": api_client_type,
                "endpoints_path": endpoints_path,
                "headers": headers or None,
                "headers_from_state": from_state,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "num_examples": num_examples,
                "rollouts_per_example": rollouts_per_example,
                "max_concurrent_generation": max_concurrent_generation,
                "max_concurrent_scoring": max_concurrent_scoring,
                "heartbeat_url": heartbeat_url,
                "no_interleave_scoring": no_interleave_scoring or None,
                "independent_scoring": independent_scoring or None,
                "state_columns": state_columns,
                "save_to_hf_hub": save_to_hf_hub or None,
                "hf_hub_dataset_name": hf_hub_dataset_name,
            }
            configs = configs_from_cli(env_ids, cli)
        if resume_path is not None and len(configs) != 1:
            raise ConfigError("--resume RUN applies to exactly one eval")
        if any(c.hosted for c in configs):
            if not all(c.hosted for c in configs):
                raise ConfigError("either every eval of the config is hosted or none is")
            from ..eval.hosted import run_hosted

            raise typer.Exit(run_hosted(configs, secrets, follow=follow, poll_interval=poll_interval))
        hosted_only = [f for f, v in (("--follow", follow), ("--custom-secrets", custom_secrets),
                                      ("--allow-sandbox-access", allow_sandbox_access),
                                      ("--allow-instances-access", allow_instances_access), ("--address", address))
                       if v]
        if hosted_only:
            raise ConfigError(f"{', '.join(hosted_only)} only apply to hosted runs (--hosted)")
    except (ConfigError, UsageError, MissingKeyError) as exc:
        _fail(str(exc))
        return
    from ..eval.exit_codes import run_with_signal_codes

    code = run_with_signal_codes(lambda: _run(configs, disable_tui=disable_tui, fullscreen=fullscreen,
                                              abbreviated=abbreviated_summary))
    raise typer.Exit(code)


def _run(configs, disable_tui: bool, fullscreen: bool, abbreviated: bool) -> int:
    import asyncio
    import signal

    from ..eval.display import make_display, print_summary
    from ..eval.runner import run_evals

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
    from ..eval import exit_codes

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
