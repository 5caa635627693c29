"""Find and load environment packages by id (`my-env` -> module `my_env`)."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import UsageError


class EnvNotFoundError(UsageError):
    """No importable module for an environment id."""


def module_name(env_id: str) -> str:
    return env_id.split("/")[-1].replace("-", "_")


_NOT_ENVIRONMENTS = frozenset({"envs"})  # the library itself defines load_environment(env_id)


def installed_environments(env_dir: str | Path | None = None) -> list[str]:
    """Ids of environments that can be loaded: installed distributions whose top-level
    module defines load_environment, plus packages under `env_dir` (./environments)."""
    found: set[str] = set()
    base = Path(env_dir or "environments")
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if (child / "pyproject.toml").exists():
                found.add(child.name.replace("_", "-"))
    for dist in metadata.distributions():
        try:
            text = dist.read_text("top_level.txt") or ""
        except Exception:
            text = ""
        names = text.split() or [str(dist.metadata.get("Name", "")).replace("-", "_")]
        for top in names:
            if top in _NOT_ENVIRONMENTS:
                continue
            path = _find_spec_path(top)
            if path and _mentions_load_environment(path):
                found.add(top.replace("_", "-"))
    return sorted(found)


def _find_spec_path(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    return Path(spec.origin)


def _mentions_load_environment(path: Path) -> bool:
    try:
        return path.suffix == ".py" and "def load_environment" in path.read_text(errors="ignore")[:200_000]
    except OSError:
        return False


def import_env_module(env_id: str, env_dir: str | Path | None = None) -> Any:
    """Import the module of `env_id`; falls back to ./environments/<name>/ when not installed."""
    name = module_name(env_id)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
    base = Path(env_dir or "environments")
    for candidate in (base / name, base / env_id):
        if (candidate / f"{name}.py").exists() or (candidate / name / "__init__.py").exists():
            sys.path.insert(0, str(candidate.resolve()))
            try:
                return importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name:
                    raise
    available = installed_environments(env_dir)
    close = difflib.get_close_matches(env_id.split("/")[-1].replace("_", "-"), available, n=1, cutoff=0.6)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    hint = ", ".join(available) if available else "none found"
    raise EnvNotFoundError(
        f"unknown environment {env_id!r}.{guess} Available: {hint}. "
        f"Install one with `vf-sandbox env install NAME` (from ./environments/NAME)."
    )


def load_environment(env_id: str, env_dir: str | Path | None = None, **env_args: Any) -> Any:
    """Import the env module and call its load_environment(**env_args)."""
    module = import_env_module(env_id, env_dir)
    fn = getattr(module, "load_environment", None)
    if fn is None:
        raise EnvNotFoundError(f"module {module.__name__!r} has no load_environment()")
    params = inspect.signature(fn).parameters
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in env_args if k not in params] if not accepts_kwargs else []
    if unknown:
        raise UsageError(
            f"load_environment() of {env_id!r} takes no argument(s) {unknown}; it accepts: "
            + ", ".join(p for p in params if params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,))
        )
    env = fn(**_typed_config_args(fn, env_args))
    if not getattr(env, "env_id", None):
        env.env_id = env_id
    env.env_args = dict(env_args)
    return env


def _typed_config_args(fn: Any, env_args: dict[str, Any]) -> dict[str, Any]:
    """A v1 env's `load_environment(config: SomeEnvConfig)` gets `config` (a table:
    eval TOML `[env.taskset]` / `[env.harness]`, or `-a '{"config": ...}'`) as that
    Config, validated: an unknown field is a ConfigError naming it."""
    raw = env_args.get("config")
    if not isinstance(raw, dict):
        return env_args
    import typing

    from pydantic import ValidationError

    from sandboxes.errors import ConfigError

    from .v1.config import Config

    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return env_args
    ann = hints.get("config")
    candidates = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, Config)]
    if not candidates:
        return env_args
    try:
        return {**env_args, "config": candidates[0](raw)}
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid env config for {getattr(fn, '__module__', '?')}: {problems}") from None


def env_package_dir(env_id: str, env_dir: str | Path | None = None) -> Path | None:
    """Directory holding the env's pyproject.toml (installed editable or ./environments)."""
    name = module_name(env_id)
    base = Path(env_dir or "environments")
    for candidate in (base / name, base / env_id):
        if (candidate / "pyproject.toml").exists():
            return candidate
    path = _find_spec_path(name)
    if path is not None:
        for parent in (path.parent, path.parent.parent):
            if (parent / "pyproject.toml").exists():
                return parent
    return None
