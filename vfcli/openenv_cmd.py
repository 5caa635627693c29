"""`vf-sandbox openenv build PROJECT`: build an OpenEnv project's image locally
(offline: base image + host wheelhouse), detect its contract, write `.build.json`.
Cheap to import: the build module loads inside the command."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Run OpenEnv projects in sandboxes.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Run OpenEnv projects in sandboxes."""


@app.command("build")
def build_cmd(
    project: Path = typer.Argument(..., help="OpenEnv project directory (has openenv.yaml and server/app.py)."),
    force: bool = typer.Option(False, "--force", help="Rebuild the project image even if its content is unchanged."),
    wheelhouse: Path | None = typer.Option(
        None, "--wheelhouse", help="Wheelhouse root (default: the one wheelhouse, $VF_SANDBOX_WHEELHOUSE, else $VF_SANDBOX_CACHE/wheelhouse, else ~/.cache/vf-sandbox/wheelhouse)."
    ),
) -> None:
    """Build PROJECT's image and write PROJECT/.build.json."""
    from sandboxes.errors import Error

    from envs.openenv.build import build_project

    try:
        res = build_project(project, force=force, wheelhouse=wheelhouse, log=lambda s: typer.echo(s, err=True))
    except Error as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    m = res.manifest
    state = "built" if res.built else "up to date"
    typer.echo(f"{m.environment_id}: {state} in {res.seconds:.1f}s")
    typer.echo(f"  image     {m.image}")
    typer.echo(f"  contract  {m.contract}")
    typer.echo(f"  port      {m.port}  app {m.app}")
    typer.echo(f"  manifest  {Path(project) / '.build.json'}")
