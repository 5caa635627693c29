"""`vf-sandbox sandboxes ls|reap`: list vf-sandbox's sandboxes (and snapshots, on
backends that have them) on a backend and remove those whose owner process died,
whose lifetime expired, or that the backend lost (a crashed engine's containers
only containerd still holds); snapshots go when their owner died, unless kept."""

from __future__ import annotations

import time

import typer

app = typer.Typer(help="List and reap sandboxes.", no_args_is_help=True)

BackendOpt = typer.Option(None, "--backend", "-b", help="Backend name \\[default: docker].")


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if abs(seconds) < 120:
        return f"{seconds}s"
    if abs(seconds) < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


@app.command("ls")
def ls(backend: str = BackendOpt, run: str = typer.Option(None, "--run", help="Only this run id.")) -> None:
    """List sandboxes (id, status, owner, whether the owner is alive, age, time left), then
    snapshots where the backend has them (id, source, owner, age, kept)."""
    import asyncio

    from . import labels as L
    from .errors import Error
    from .interface import SupportsSnapshots
    from .registry import get_backend

    async def go():
        be = get_backend(backend)
        try:
            wanted = {L.RUN_ID: run} if run else None
            snaps = await be.list_snapshots(wanted) if isinstance(be, SupportsSnapshots) else None
            return await be.list(wanted), snaps
        finally:
            await be.close()

    try:
        infos, snaps = asyncio.run(go())
    except Error as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    now = time.time()
    rows = [("ID", "NAME", "STATUS", "OWNER", "OWNER-ALIVE", "AGE", "LEFT", "RUN")]
    for i in sorted(infos, key=lambda x: x.created_at or 0):
        lab = i.labels
        created = float(lab.get(L.CREATED_AT) or i.created_at or now)
        expires = lab.get(L.EXPIRES_AT)
        rows.append((
            i.id[:12], i.name, i.status, f"{lab.get(L.OWNER_PID, '?')}@{lab.get(L.OWNER_HOST, '?')}",
            "yes" if L.owner_alive(lab) else "no", _age(now - created),
            _age(float(expires) - now) if expires else "-", lab.get(L.RUN_ID, "-"),
        ))
    _table(rows)
    typer.echo(f"{len(infos)} sandbox(es)")
    if snaps is None:
        return
    rows = [("SNAPSHOT", "KIND", "SOURCE", "OWNER", "OWNER-ALIVE", "AGE", "KEPT", "RUN")]
    for s in sorted(snaps, key=lambda x: x.created_at):
        lab = s.labels
        rows.append((s.id, s.kind, s.source_id[:12], f"{lab.get(L.OWNER_PID, '?')}@{lab.get(L.OWNER_HOST, '?')}",
                     "yes" if L.owner_alive(lab) else "no", _age(now - s.created_at), "yes" if s.keep else "no",
                     lab.get(L.RUN_ID, "-")))
    if snaps:
        _table(rows)
    typer.echo(f"{len(snaps)} snapshot(s)")


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


@app.command("reap")
def reap(backend: str = BackendOpt,
         dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be removed."),
         expired: bool = typer.Option(True, "--expired/--no-expired", help="Also remove sandboxes past their lifetime.")) -> None:
    """Remove sandboxes whose owner process is dead (e.g. SIGKILLed) or that expired, and
    those a crashed engine lost (still running, no longer listed by it); and snapshots
    whose owner process is dead (not those made with keep=True)."""
    import asyncio

    from .errors import Error
    from .lifecycle import reap as do_reap

    try:
        doomed = asyncio.run(do_reap(backend, dry_run=dry_run, include_expired=expired))
    except Error as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    verb = "would remove" if dry_run else "removed"
    for info, why in doomed:
        typer.echo(f"{verb} {info.id[:12]} {info.name} ({why})")
    n_snaps = sum(1 for info, _ in doomed if info.status == "snapshot")
    typer.echo(f"{verb} {len(doomed) - n_snaps} sandbox(es)" + (f" and {n_snaps} snapshot(s)" if n_snaps else ""))
