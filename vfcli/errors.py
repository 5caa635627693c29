"""The CLIs' last word on an error vf-sandbox raised on purpose: one line on stderr
(`error: ...`) and an exit code, instead of a traceback. Infrastructure that does
not answer (a Ray cluster, a backend's daemon) exits 1, like a failed run; a wrong
request exits 2, like a bad flag."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from sandboxes.errors import Error, InfraError


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    try:
        yield
    except Error as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1 if isinstance(exc, InfraError) else 2) from None
