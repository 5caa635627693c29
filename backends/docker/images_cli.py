"""`vf-sandbox images build [NAME]` and `vf-sandbox images ls`: the image
recipes under images/ and their cached builds."""

from __future__ import annotations

import typer

app = typer.Typer(help="Build and list sandbox images from images/ recipes.", no_args_is_help=True)


@app.command("build")
def build(name: str = typer.Argument(None, help="Recipe name or alias (default: every recipe)."),
          force: bool = typer.Option(False, "--force", help="Rebuild even when the cached image is up to date."),
          url: str = typer.Option(None, "--url", help="Docker API address (default: $DOCKER_HOST or the local socket).")) -> None:
    """Build an image (and the recipes it is FROM); an unchanged recipe is a cache hit."""
    from sandboxes.errors import Error

    from .images import ImageBuilder, load_recipes

    builder = ImageBuilder(url)
    names = [name] if name else [r.name for r in load_recipes()]
    try:
        for n in names:
            out = builder.ensure(n, force=force)
            typer.echo(f"{out.name}: {'cached' if out.cached else 'built'} in {out.seconds:.1f}s ({out.image_id[7:19]})")
    except Error as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("ls")
def ls(url: str = typer.Option(None, "--url", help="Docker API address.")) -> None:
    """List recipes, their aliases and whether their image is built and up to date."""
    from sandboxes.errors import Error

    from .images import ImageBuilder, load_recipes

    builder = ImageBuilder(url)
    rows = [("NAME", "STATUS", "RECIPE", "ALIASES")]
    try:
        for r in load_recipes():
            rows.append((r.name, builder.status(r), r.dir or r.script or "", ", ".join(r.aliases)))
    except Error as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
