"""Backends by name. Built-in backends are named by import path so that
`sandboxes` imports no backend module until one is asked for; third parties
call `register_backend`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .errors import BackendNotFound
from .interface import SandboxBackend

BackendFactory = Callable[..., SandboxBackend]

_BUILTIN: dict[str, str] = {
    "docker": "backends.docker:DockerBackend",
    "local": "backends.local:LocalBackend",
    "kubernetes": "backends.kubernetes:KubernetesBackend",
    "prime": "backends.prime:PrimeBackend",
}
_registered: dict[str, BackendFactory | str] = dict(_BUILTIN)

DEFAULT_BACKEND = "docker"


def register_backend(name: str, factory: BackendFactory | str) -> None:
    """Register a factory (or a "module:attr" path) under `name`."""
    _registered[name] = factory


def backend_names() -> list[str]:
    return sorted(_registered)


def _resolve(factory: BackendFactory | str) -> BackendFactory:
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        return getattr(importlib.import_module(module), attr)
    return factory


def get_backend(backend: str | SandboxBackend | None = None, **options: Any) -> SandboxBackend:
    """A backend instance: pass one through, or build the one registered under the name
    (default: docker). `options` go to its constructor. The choice always arrives as an
    argument (from the run definition); no environment variable selects a backend."""
    if backend is not None and not isinstance(backend, str):
        return backend
    name = backend or DEFAULT_BACKEND
    try:
        factory = _registered[name]
    except KeyError:
        raise BackendNotFound(f"unknown sandbox backend {name!r}; known: {', '.join(backend_names())}") from None
    return _resolve(factory)(**options)
