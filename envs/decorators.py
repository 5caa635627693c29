"""Lifecycle decorators `@stop`, `@cleanup`, `@teardown` and their discovery.

Each decorator only marks the function (`fn.stop = True`, `fn.stop_priority =
p`); `discover(obj, kind)` finds the marked bound methods of an object and
sorts them by descending priority, then name. Usable bare or with
`priority=`:

    @vf.stop                    @vf.cleanup(priority=10)
    async def done(self, state): ...

`call_with_named_args(fn, pool, **available)` calls user code (reward
functions, handlers) with the arguments its signature names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .sync_pool import SyncPool

F = TypeVar("F", bound=Callable[..., Any])

KINDS = ("stop", "cleanup", "teardown")


def _marker(kind: str):
    def decorator(func: F | None = None, *, priority: int = 0, **extra: Any):
        def mark(fn: F) -> F:
            setattr(fn, kind, True)
            setattr(fn, f"{kind}_priority", priority)
            for key, value in extra.items():
                setattr(fn, f"{kind}_{key}", value)
            return fn

        return mark(func) if func is not None else mark

    decorator.__name__ = kind
    decorator.__doc__ = f"Mark a method as a {kind} handler (optionally `priority=`, higher runs first)."
    return decorator


stop = _marker("stop")
cleanup = _marker("cleanup")
teardown = _marker("teardown")


def discover(obj: object, kind: str) -> list[Callable[..., Any]]:
    """Bound methods of `obj` marked with `kind`, highest priority first, then by name.
    Cached per object (handlers are class members, fixed once the object exists)."""
    cache = getattr(obj, "__dict__", {}).get("_vf_handlers")
    if cache is not None and kind in cache:
        return cache[kind]
    result = _discover(obj, kind)
    if hasattr(obj, "__dict__"):
        obj.__dict__.setdefault("_vf_handlers", {})[kind] = result
    return result


def _discover(obj: object, kind: str) -> list[Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for klass in type(obj).__mro__:
        for name, attr in vars(klass).items():
            if name in found:
                continue
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            if callable(fn) and getattr(fn, kind, False) is True:
                found[name] = getattr(obj, name)
    return sorted(found.values(), key=lambda m: (-getattr(m, f"{kind}_priority", 0), m.__name__))


async def call_with_named_args(fn: Callable[..., Any], pool: SyncPool | None = None, /, **available: Any) -> Any:
    """Call `fn` with the subset of `available` its signature names (all of
    them if it takes **kwargs); await the result if it is awaitable. With a
    `pool`, a sync `fn` runs in that thread pool instead of on the event loop
    (`pool` is positional-only, so `available` may hold a key named "pool")."""
    params = named_params(fn)
    if params is None:
        kwargs = available
    else:
        kwargs = {k: v for k, v in available.items() if k in params}
    if pool is not None:
        return await pool.call(fn, **kwargs)
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


_PARAM_CACHE: dict[Any, frozenset[str] | None] = {}


def named_params(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Named parameters of fn, or None when it accepts **kwargs (cached)."""
    key = getattr(fn, "__func__", fn)
    try:
        return _PARAM_CACHE[key]
    except (KeyError, TypeError):
        pass
    sig = inspect.signature(fn)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        result = None
    else:
        result = frozenset(
            n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )
    try:
        _PARAM_CACHE[key] = result
    except TypeError:
        pass
    return result
