"""One declaration per run setting: a pydantic field carrying an `Opt` marker
(`Annotated[int, Opt("--num-examples", "-n", help=...)]`). The CLI flags of
`vf-sandbox eval`, the keys a TOML eval config takes, the built-in defaults, what
resume's definition diff compares and the configuration reference
(docs/configuration.md) are all derived from these fields (`declared`), so a
setting is added in one place.

`-x` keys are not here: they are the fields of each environment's `Settings`
model (`Environment.settable_kwargs()`).
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class Opt:
    """How a field is reached from outside. `flag`/`short`: its `vf-sandbox eval` option
    (None: no flag); `toml`: a key of TOML eval configs; `result`: a different value may
    change a rollout's result (`--resume` refuses to continue a run whose definition
    differs in such a setting); `run_control`: the flag still applies on top of a TOML
    config or a recorded run (`--from-run`, `--resume RUN`); `cli_type` / `cli_default`:
    the flag's own type and default where they are not the field's (JSON text, `-w auto`);
    `dest`: the flag's parameter name where it is not the field's; `aliases`: more long
    forms of the flag."""

    flag: str | None = None
    short: str | None = None
    help: str = ""
    toml: bool = True
    result: bool = True
    run_control: bool = False
    cli_type: Any = None
    cli_default: Any = None
    dest: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Declared:
    name: str
    opt: Opt
    annotation: Any
    default: Any  # PydanticUndefined when required or a factory
    model: type[BaseModel]
    description: str = ""
    factory: Any = None

    @property
    def param(self) -> str:
        return self.opt.dest or self.name

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in (self.opt.flag, *self.opt.aliases, self.opt.short) if f)


def declared(*models: type[BaseModel]) -> Iterator[Declared]:
    """The fields of `models` that carry an `Opt` marker, in declaration order."""
    for model in models:
        for name, info in model.model_fields.items():
            opt = next((m for m in info.metadata if isinstance(m, Opt)), None)
            if opt is not None:
                yield Declared(name, opt, info.annotation, info.default, model, info.description or "", info.default_factory)


def toml_keys(*models: type[BaseModel]) -> frozenset[str]:
    return frozenset(d.name for d in declared(*models) if d.opt.toml)


def defaults(*models: type[BaseModel]) -> dict[str, Any]:
    """The built-in default of every declared setting that has a plain (non-None) one."""
    return {d.name: d.default for d in declared(*models)
            if d.default is not PydanticUndefined and d.default is not None and not isinstance(d.default, bool)}


def without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def cli_parameter(d: Declared, show_default: bool = False) -> inspect.Parameter:
    """The typer parameter of a declared flag: a bool field is an on-flag (default False);
    any other is Optional (None: not given) unless the flag has its own default, or
    (`show_default`) the field's plain default is the flag's (shown in --help)."""
    import typer

    kind = d.opt.cli_type if d.opt.cli_type is not None else without_none(d.annotation)
    if kind is bool:
        annotation, default = bool, False
    elif d.opt.cli_default is not None:
        annotation, default = kind, d.opt.cli_default
    elif show_default and d.default is not PydanticUndefined and d.default is not None:
        annotation, default = kind, d.default
    else:
        annotation, default = typing.Optional[kind], None
    return inspect.Parameter(d.param, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, *d.flags, help=d.opt.help))


def flags(*models: type[BaseModel]) -> list[Declared]:
    """The declared settings that have a flag."""
    return [d for d in declared(*models) if d.opt.flag]


class DeclaredCommand:
    """A command function as typer sees it: the `positionals()` (typer Arguments), then one
    option per declared flag of `models()` (flag, short form, help, default; `cli_parameter`).
    The signature is built on first use (when typer builds the click command), so that
    mounting a CLI does not import what declares its settings. The function receives every
    parameter by name (None / False: not given)."""

    def __init__(self, func: Any, models: Any, positionals: Any = list, show_defaults: bool = False):
        self.func, self.models, self.positionals, self.show_defaults = func, models, positionals, show_defaults
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__
        self._signature: inspect.Signature | None = None

    @property
    def __signature__(self) -> inspect.Signature:
        if self._signature is None:
            params = [cli_parameter(d, self.show_defaults) for d in flags(*self.models())]
            self._signature = inspect.Signature([*self.positionals(), *params])
        return self._signature

    @property
    def __annotations__(self) -> dict[str, Any]:  # type: ignore[override]
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **options: Any) -> Any:
        return self.func(**options)


def reference_markdown(*sections: tuple[str, type[BaseModel]]) -> str:
    """The configuration reference: one table per model (setting, flag, TOML, default,
    changes results, meaning), rendered from the declarations."""
    out: list[str] = []
    for title, model in sections:
        out += [f"## {title}", "", "| setting | flag | TOML | default | resume compares | meaning |",
                "|---|---|---|---|---|---|"]
        for d in declared(model):
            flag = " / ".join(f"`{f}`" for f in d.flags) or "-"
            default = f"`{d.factory()!r}`" if d.factory is not None else (
                "" if d.default is PydanticUndefined else f"`{d.default!r}`")
            text = (d.opt.help or d.description).replace("\\[", "[").replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{d.name}` | {flag} | {'yes' if d.opt.toml else '-'} | {default} | "
                       f"{'yes' if d.opt.result else '-'} | {text} |")
        out.append("")
    return "\n".join(out)
