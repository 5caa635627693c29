"""Where the programs that run inside sandboxes live, and their source text.

They are standalone, stdlib-only scripts in `sandboxes/programs/` (not importable
modules: no `__init__.py`), shipped into a sandbox as source and run there by
the host code that drives them:

    relay.py          HTTP over the command channel, one wire format
                      (`sandboxes.relay_wire`) in both directions: forward
                      (an OpenEnv server's HTTP / WebSocket reached from the
                      host; envs.openenv.forwarder) and listen (a sandboxed
                      v1 program's model calls carried to the interception
                      endpoint; envs.v1.sandbox_relay)
    python_runner.py  one v1 Python program or sandboxed tool call
                      (envs.v1.sandbox_python)
    repl_worker.py    PythonEnv's persistent interpreter, `prelude.py` of
                      envs.sandbox_tools in front (envs.sandbox_tools.repl_session)

The in-sandbox agent (`sandboxes/agent/program.py`, `cells_program.py`) sits
beside them in `sandboxes/agent/`, with its client and wire protocol.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PROGRAMS_DIR = Path(__file__).with_name("programs")


def program_path(name: str) -> Path:
    """The file of the in-sandbox program `name` (e.g. "v1_relay.py"); KeyError when there is none."""
    path = PROGRAMS_DIR / name
    if path.parent != PROGRAMS_DIR or not path.is_file():
        raise KeyError(f"no in-sandbox program {name!r} in {PROGRAMS_DIR}")
    return path


@lru_cache(maxsize=None)
def program_source(name: str) -> str:
    """The source text of the in-sandbox program `name`."""
    return program_path(name).read_text(encoding="utf-8")
