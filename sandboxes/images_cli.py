"""`vf-sandbox images build [NAME]` and `vf-sandbox images ls`: named image
recipes (images/recipes.toml) on whichever backend is named, through its
`SupportsImageRecipes` capability. Imports no backend: a backend that cannot
build images is refused with a message naming the capability."""

from __future__ import annotations

import typer

app = typer.Typer(help="Build and list sandbox images from images/ recipes.", no_args_is_help=True)

BackendOpt = typer.Option("docker", "--backend", "-b", help="Backend that builds the images.")
UrlOpt = typer.Option(None, "--url", help="The backend's API address (docker: $DOCKER_HOST or the local socket).")


def _recipes_backend(name: str, url: str | None):
    from .errors import UsageError
    from .interface import SupportsImageRecipes
    from .registry import get_backend

    be = get_backend(name, **({"url": url} if url else {}))
    if not isinstance(be, SupportsImageRecipes):
        raise UsageError(f"the {name!r} backend cannot build image recipes (it does not implement "
                         "SupportsImageRecipes); use --backend docker")
    return be


def _run(go) -> object:
    import asyncio

    from .errors import Error

    try:
        return asyncio.run(go())
    except Error as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("build")
def build(name: str = typer.Argument(None, help="Recipe name or alias (default: every recipe)."),
          force: bool = typer.Option(False, "--force", help="Rebuild even when the cached image is up to date."),
          backend: str = BackendOpt, url: str = UrlOpt) -> None:
    """Build an image (and the recipes it is FROM); an unchanged recipe is a cache hit."""

    async def go():
        be = _recipes_backend(backend, url)
        try:
            names = [name] if name else [r.name for r in await be.image_recipes()]
            for n in names:
                out = await be.build_recipe(n, force=force)
                short = out.image_id.split(":")[-1][:12]
                typer.echo(f"{out.name}: {'cached' if out.cached else 'built'} in {out.seconds:.1f}s ({short})")
        finally:
            await be.close()

    _run(go)


@app.command("ls")
def ls(backend: str = BackendOpt, url: str = UrlOpt) -> None:
    """List recipes, their aliases and whether their image is built and up to date."""

    async def go():
        be = _recipes_backend(backend, url)
        try:
            return await be.image_recipes()
        finally:
            await be.close()

    recipes = _run(go)
    rows = [("NAME", "STATUS", "RECIPE", "ALIASES")]
    rows += [(r.name, r.status, r.source, ", ".join(r.aliases)) for r in recipes]
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
