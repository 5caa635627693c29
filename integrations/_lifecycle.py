"""What every framework integration starts once: removal at exit of the sandboxes this
process still tracks (frameworks keep their own signal handlers), and, once per backend,
the reaper for sandboxes of killed earlier runs (in the background)."""

from __future__ import annotations

import atexit
import threading

from sandboxes import lifecycle

_started = threading.Lock()
_reaped: set[str] = set()


def start_lifecycle(backend: str) -> None:
    """Once per process: `atexit` removes what is still tracked; once per backend: reap
    what killed runs left (owner-pid labels, lifetimes), in the background."""
    with _started:
        if not _reaped:
            atexit.register(lifecycle.cleanup_all)
        if backend not in _reaped:
            _reaped.add(backend)
            lifecycle.reap_in_background(backend)
