"""Where v1 user code runs: a sync callable (reward, metric, tool, setup /
cleanup / stop handler, a callable program) runs in a `SyncPool` thread so it
never blocks the event loop, an async one on the loop, exactly as in the
classic stack (envs/sync_pool.py).

Under `Env(taskset, harness)` every part uses the env's own pool (sized by
the run's concurrency, shut down by `env.teardown()`); a part used on its
own falls back to one process-wide pool."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..sync_pool import SyncPool

DEFAULT_POOL_SIZE = 16

_default: SyncPool | None = None
_lock = threading.Lock()


def default_pool() -> SyncPool:
    """The process-wide pool of v1 parts used outside an Env."""
    global _default
    with _lock:
        if _default is None:
            _default = SyncPool(DEFAULT_POOL_SIZE, name="vf-v1")
        return _default


async def call_user(pool: SyncPool | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` off the loop when sync (in `pool`, else the default pool)."""
    return await (pool or default_pool()).call(fn, *args, **kwargs)
