"""The agent's wire protocol, host side: message shapes as TypedDicts, the
JSON-lines codec and the agent's source text.

One JSON object per line, both ways; binary data is base64. The host numbers
its requests (`id` ≥ 1); the agent answers each with zero or more `chunk`
events and exactly one `result` or `error` event carrying the same id. The
agent greets with a `hello` event (id 0) as soon as it runs.

    host → agent   {"id": 7, "op": "exec", "shell": "ls", "timeout": 30, "limit": 1048576}
    agent → host   {"id": 7, "ev": "result", "exit_code": 0, "stdout_head": "...", ...}

Control messages that refer to an earlier request by its id and get no answer:
`data` (inbound bytes for write_file/put_tar; `eof: true` ends them), `ack`
(the host consumed `bytes` of chunk data: flow control, the agent stops
sending at 4 MiB unacknowledged) and `cancel` (kill a streaming exec / stop a
transfer).
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 1
ACK_EVERY = 1 << 20  # the host acknowledges chunk data in steps of this many bytes
INLINE_MAX = 1 << 20  # write_file sends data inline up to this size, as data messages beyond


class ExecRequest(TypedDict, total=False):
    id: int
    op: Literal["exec"]
    argv: list[str]
    shell: str
    env: dict[str, str]
    cwd: str
    stdin: str  # base64
    timeout: float
    limit: int  # bytes kept per stream (head + tail)
    stream: bool  # send chunk events as output arrives


class ExecReply(TypedDict):
    id: int
    ev: Literal["result"]
    exit_code: int | None
    signal: int | None
    timed_out: bool
    oom_killed: bool
    duration: float
    stdout_head: str
    stdout_tail: str
    stdout_dropped: int
    stderr_head: str
    stderr_tail: str
    stderr_dropped: int


class StartRequest(TypedDict, total=False):
    id: int
    op: Literal["start"]
    argv: list[str]
    shell: str
    env: dict[str, str]
    cwd: str
    limit: int


class ProcessRequest(TypedDict, total=False):
    """poll / read / write_stdin / kill / wait / forget on a background process."""

    id: int
    op: Literal["poll", "read", "write_stdin", "kill", "wait", "forget"]
    pid: int
    until: str  # read: wait for this stdout marker
    timeout: float  # read / wait
    data: str  # write_stdin, base64
    close: bool  # write_stdin: close stdin afterwards
    signal: int  # kill
    group: bool  # kill the process group


class ReadReply(TypedDict):
    id: int
    ev: Literal["result"]
    stdout: str
    stderr: str
    stdout_dropped: int
    stderr_dropped: int
    found: bool


class FileRequest(TypedDict, total=False):
    """write_file / read_file / put_tar / get_tar."""

    id: int
    op: Literal["write_file", "read_file", "put_tar", "get_tar"]
    path: str
    dest: str
    data: str  # write_file inline data, base64 (absent: data messages follow)
    mode: int
    max_bytes: int


class ChunkEvent(TypedDict):
    id: int
    ev: Literal["chunk"]
    stream: Literal["stdout", "stderr", "data"]
    data: str  # base64


class ErrorEvent(TypedDict):
    id: int
    ev: Literal["error"]
    kind: Literal["path", "usage", "internal"]
    message: str


class HelloEvent(TypedDict):
    id: int
    ev: Literal["hello"]
    version: int
    pid: int
    python: str


# ---------------------------------------------------------------- cells (a cell host's agent, --cells)
# Requests to the host agent itself (no "cell" key); messages tagged "cell": N go to that
# cell's own agent and are the ones above. See sandboxes/cells.py and cells_program.py.


class CellOpenRequest(TypedDict, total=False):
    """Open cell `cell_id` (the client's number for it) of `conf` (`sandboxes.cells.cell_conf`);
    with `layer`, the cell's root stacks that frozen layer (and the layers under it) over the
    image: an id `cell_snapshot` returned, never a path (anything else is refused)."""

    id: int
    op: Literal["cell_open"]
    cell_id: int
    conf: dict[str, Any]
    hello_timeout: float
    layer: str


class CellOpenReply(TypedDict):
    id: int
    ev: Literal["result"]
    pid: int | None  # the cell's PID 1 as the host sees it
    hello: dict[str, Any]  # the cell agent's hello


class CellCloseRequest(TypedDict):
    id: int
    op: Literal["cell_close"]
    cell_id: int


class CellSnapshotRequest(TypedDict):
    """Freeze cell `cell_id`'s writable layer into a new read-only layer of the host."""

    id: int
    op: Literal["cell_snapshot"]
    cell_id: int


class CellSnapshotReply(TypedDict):
    id: int
    ev: Literal["result"]
    layer: str  # the new layer's id (the Snapshot's id)
    bytes: int  # file data copied
    depth: int  # layers a cell of it stacks over the image


class CellLayerDropRequest(TypedDict):
    """Delete a layer: no cell opens on it again; freed once no cell stacks it."""

    id: int
    op: Literal["cell_layer_drop"]
    layer: str


class CellLayerDropReply(TypedDict):
    id: int
    ev: Literal["result"]
    dropped: bool  # False: unknown or already deleted (idempotent)
    freed: bool  # its directory is gone (no cell stacks it)


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


@lru_cache(maxsize=2)
def agent_source(cells: bool = False) -> str:
    """The agent program's source, to run as `python3 -u -c <source>`; with `cells`,
    followed by the cells extension (`cells_program.py`, started with `--cells`)."""
    here = Path(__file__)
    source = here.with_name("program.py").read_text()
    if cells:
        source += "\n\n" + here.with_name("cells_program.py").read_text()
    return source


ARGV_BOOT = "import sys;exec(compile(sys.argv.pop(1),'vf-sandbox-agent','exec'))"
"""`python3 -c` keeps the syntax tree of its command alive until the command returns, and
the agent's never does: ~6.5 MB of AST for the agent's source held for the agent's whole
life (and, in a cell host, mapped into every cell's processes, forks of it). Run
as this one-liner's argument instead, the source's tree is freed once compiled."""


def agent_argv(python: str = "python3", cells: bool = False) -> list[str]:
    """The command that starts the agent inside a sandbox (a cell host's with `cells`):
    the source is the argument of `ARGV_BOOT` (sys.argv is then as with `-c <source>`)."""
    return [python, "-u", "-c", ARGV_BOOT, agent_source(cells)] + (["--cells"] if cells else [])


# Backends whose exec URL or command line must stay short (pods/exec, remote APIs)
# start a tiny bootstrap and then send the agent's source on its stdin: it reads a
# length line then exactly that many bytes and runs them; the agent then keeps
# reading the same buffered stdin, so nothing is lost.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    "exec(compile(b.read(n),'vf-sandbox-agent','exec'))"
)


def bootstrap_argv(python: str = "python3") -> list[str]:
    """A short command that reads the agent from stdin (send `bootstrap_payload()` first)."""
    return [python, "-u", "-c", BOOTSTRAP]


def bootstrap_payload() -> bytes:
    """The agent source, length-prefixed, for `bootstrap_argv`."""
    src = agent_source().encode()
    return str(len(src)).encode() + b"\n" + src
