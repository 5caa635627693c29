"""The CLIs' last word on an error vf-sandbox raised on purpose: one line on stderr
(`error: ...`) and an exit code, instead of a traceback. Infrastructure that does
not answer (a Ray cluster, a backend's daemon) exits 1, like a failed run; a wrong
request exits 2, like a bad flag."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

from sandboxes.errors import Error, InfraError


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    """Around a console script's whole run: a vf-sandbox error is one line and exit 1 / 2; a
    Ctrl-C that reaches this far (e.g. between the run's end and the exit) is exit 130, and
    once the command is done a later Ctrl-C is ignored, so the exit handlers run and the exit
    code stays what the run said (never -2)."""
    try:
        yield
    except Error as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1 if isinstance(exc, InfraError) else 2) from None
    except KeyboardInterrupt:
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
