"""The `vf-sandbox` typer app: the composition root that mounts each area's
sub-commands. Each mounted module must stay cheap to import (heavy imports
inside the command functions).

It is the entry of every `vf-sandbox` command: `_entry` reads the process
environment once (`sandboxes.settings.ProcessSettings.from_env()`) and runs the
command in that settings scope (`sandboxes.settings.use`); below it, code takes
them from the scope (`current()`) or from the run definition, never from
`os.environ`."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="vf-sandbox",
    help="Run untrusted, model-written code in sandboxes for LLM evaluation and RL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every sub-command
)

# (module, attribute, sub-command name or None to merge its commands at top level)
_MOUNTS: list[tuple[str, str, str | None]] = [
    ("vfcli.eval_cmd", "app", None),          # vf-sandbox eval, vf-sandbox env install
    ("sandboxes.cli", "app", "sandboxes"),       # vf-sandbox sandboxes ls|reap
    ("sandboxes.images_cli", "app", "images"),    # vf-sandbox images build|ls (any backend with recipes)
    ("vfcli.runs_cmd", "app", None),              # vf-sandbox runs ..., vf-sandbox dashboard
    ("vfcli.openenv_cmd", "app", "openenv"),      # vf-sandbox openenv build
]



@app.callback()
def _entry(ctx: typer.Context) -> None:
    from sandboxes import settings

    # the process environment, read once, is the settings of whatever the command runs
    ctx.with_resource(settings.use(settings.ProcessSettings.from_env()))


for _module, _attr, _name in _MOUNTS:
    try:
        _sub = getattr(importlib.import_module(_module), _attr)
    except ModuleNotFoundError as exc:  # an area not present in this checkout
        if exc.name != _module and not _module.startswith(str(exc.name)):
            raise
        continue
    if _name is None:
        app.registered_commands.extend(_sub.registered_commands)
        app.registered_groups.extend(_sub.registered_groups)
    else:
        app.add_typer(_sub, name=_name)


def main() -> None:
    from vfcli.errors import exit_on_error

    with exit_on_error():
        app()


if __name__ == "__main__":
    main()
