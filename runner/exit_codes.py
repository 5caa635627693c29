"""The exit codes of `vf-sandbox eval` and `vf-swe-debug` (one table, both CLIs).

    0    every rollout asked for was scored (vf-swe-debug: every instance valid)
    1    the verdicts failed: vf-swe-debug: some instance invalid or malformed
         (vf-sandbox eval scores rewards, it has no pass/fail verdict: never 1)
    2    usage: bad flag, unknown env or endpoint, missing key, missing image
    3    incomplete: rollouts ended in model / sandbox / env errors (beyond
         --max-error-rate) or were never run (endpoint down, stopped by
         --timeout-minutes, the env or the backend failed before any rollout);
         `vf-sandbox eval --resume <run id>` continues it
    130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM (runs stay resumable)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable

OK = 0
VERDICTS_FAILED = 1
USAGE = 2
INCOMPLETE = 3

HELP = ("Exit codes: 0 every rollout scored (vf-swe-debug: every instance valid) · 1 verdicts failed "
        "(vf-swe-debug: some instance invalid) · 2 usage error · "
        "3 incomplete: model / sandbox / env errors or rollouts not run (continue with `vf-sandbox eval --resume "
        "<run id>`; accept some with --max-error-rate) · 130 / 143 interrupted (SIGINT / SIGTERM).")


def for_signal(signals: list[int]) -> int | None:
    """128 + the first signal received (SIGINT 130, SIGTERM 143); None without one."""
    if not signals:
        return None
    sig = int(signals[0])
    return 128 + sig if sig in (signal.SIGINT, signal.SIGTERM) else VERDICTS_FAILED


def for_statuses(statuses: Iterable[tuple[str, bool]]) -> int:
    """The code of runs with these (status, usage_error): any usage error 2, else any run
    not `completed` (incomplete, stopped, failed) 3, else 0."""
    items = list(statuses)
    if any(status == "failed" and usage for status, usage in items):
        return USAGE
    if any(status != "completed" for status, _ in items):
        return INCOMPLETE
    return OK


def for_swe(status: str, usage_error: bool, all_valid: bool) -> int:
    """vf-swe-debug: as `for_statuses`, and a completed run with an invalid (or malformed)
    instance 1."""
    code = for_statuses([(status, usage_error)])
    if code == OK and not all_valid:
        return VERDICTS_FAILED
    return code


class Terminated(BaseException):
    """SIGTERM outside the runner's own handlers (before a run or after its teardown)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def run_with_signal_codes(fn: Callable[[], int]) -> int:
    """`fn()`'s exit code, or 130 / 143 when a Ctrl-C (KeyboardInterrupt) or a SIGTERM
    arrives while the runner's own handlers are not installed (before the run, or after its
    teardown while the summary is printed): never a bare -2 / -15 or a traceback. The
    runner restores the SIGTERM handler installed here when it removes its own."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return fn()
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except Terminated as exc:
        return 128 + exc.signum
    finally:
        signal.signal(signal.SIGTERM, previous)
