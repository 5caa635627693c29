"""Stopping a running run: SIGTERM its process (only if it is this host's and
still the same process) and wait until the registry shows it ended; a hosted
run's Ray job is stopped instead (`hosted.jobs.stop`). Used by
`vf-sandbox runs stop` and the dashboard's stop button."""

from __future__ import annotations

import os
import signal
import socket
import time

from runs.registry import RunRecord, get_run, is_hosted, pid_alive, request_stop


class StopError(RuntimeError):
    """The run could not be stopped (other host, or it ignored SIGTERM)."""


def stop_run(run_id: str, *, timeout: float = 60.0, force: bool = False) -> RunRecord:
    """SIGTERM the run's process and wait until the registry shows it ended."""
    rec = get_run(run_id)
    if rec is None:
        raise StopError(f"no run {run_id!r}")
    if rec.status != "running":
        return rec
    if is_hosted(rec):
        from sandboxes.errors import UsageError

        from hosted.jobs import stop

        try:
            return stop(rec, timeout=max(timeout, 120.0))[0]
        except UsageError as exc:
            raise StopError(str(exc)) from None
    if rec.host != socket.gethostname():
        raise StopError(f"run {rec.id} runs on host {rec.host}; stop it there")
    request_stop(rec.id)
    if pid_alive(rec.pid, rec.pid_start):  # never signal a recycled pid
        try:
            os.kill(rec.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cur = get_run(rec.id)  # reconciles: a process that died after SIGTERM shows `stopped`
        if cur.status != "running":
            return cur
        time.sleep(0.1)
    if force and pid_alive(rec.pid, rec.pid_start):
        os.kill(rec.pid, signal.SIGKILL)
        for _ in range(50):
            cur = get_run(rec.id)
            if cur.status != "running":
                return cur
            time.sleep(0.1)
    raise StopError(f"run {rec.id} (pid {rec.pid}) did not stop within {timeout:.0f}s; "
                    "retry with --force to SIGKILL it")
