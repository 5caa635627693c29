"""The run registry: one row per `vf-sandbox eval` / `vf-swe-debug` run, with
its config, pid, status, progress counts and start/end times.

Write side: `RunRecorder` (used by the processes doing the run).
Read side: `list_runs`, `get_run`, `reconcile`, `request_stop`, `mark_status`
(used by `vf-sandbox runs ...` and the dashboard).

Why SQLite (in WAL mode) rather than one JSON file per run:
- Crash safety: every update is an atomic transaction; a process killed in the
  middle of a write leaves the previous row intact (a half-written JSON file
  would be unreadable or need a write-temp-then-rename dance per update).
- Concurrency: several runs (and the dashboard, and the CLI) read and write
  the same store at once. WAL lets readers proceed while one writer commits,
  and `busy_timeout` serialises writers without lost updates; per-run JSON
  files would need locking to make "list with filters" consistent.
- Queries: `runs list --status running --env X` is one indexed SELECT.
- `synchronous=NORMAL` in WAL mode skips the fsync on each commit (a power
  loss may lose the last few progress ticks, never corrupt the file), which
  keeps `progress()` cheap enough to call per completed group.
There is one registry per user, in a state directory (`$VF_STATE_DIR`, else
`$XDG_STATE_HOME/vf-sandbox`, else `~/.local/state/vf-sandbox`), so every run
is found whatever `-o` and the working directory were; `$VF_RUNS_DB` or a
command's `--db` names another file. SQLite's locking needs a local file
system (not NFS).

A run whose process vanished (SIGKILL, OOM, machine reboot) cannot record its
own end; `reconcile()` — run by every read — checks each `running` row's pid
AND the pid's start time (so a reused pid is not mistaken for the run) and
marks dead ones `incomplete` with `vanished=1` (or `stopped` when a stop had been
requested), so no run stays stuck on `running`: its saved rows are kept and
`vf-sandbox eval --resume ID` continues it. The run's metadata.json, left at
`running` by the dead process, is brought to the same status.

A run has one id: the registry row's id is also the name of its results
directory (`new_run_id`), and every verb takes either (`find_run`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import sys
import threading
import time
import traceback
import uuid
from contextlib import closing
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sandboxes.labels import pid_exists, process_start_time, run_id as sandbox_run_id
from sandboxes.settings import current as current_settings

log = logging.getLogger("envs." + __name__)  # under the package logger `envs`

# The run whose code is executing: set by RunRecorder.start in the caller's
# context, so it follows asyncio tasks and to_thread calls spawned from there.
# Several runs in one process (an eval TOML with many [[eval]]s, each in its own
# task) thereby get only their own log lines; lines logged outside any run's
# context go to every run's log.
_CURRENT_RUN: ContextVar[str | None] = ContextVar("vf_current_run", default=None)

RunKind = Literal["eval", "swe-debug"]
RunStatus = Literal["running", "completed", "incomplete", "failed", "stopped"]
END_STATES = ("completed", "incomplete", "failed", "stopped")  # incomplete: infra-error rollouts left (--resume)
SCHEMA_VERSION = 3  # 2: error_kind; 3: scored_rollouts, errored_rollouts, errors_by_kind

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    name            TEXT,
    env_id          TEXT NOT NULL,
    model           TEXT,
    args            TEXT NOT NULL DEFAULT '{}',
    output_dir      TEXT NOT NULL,
    log_path        TEXT NOT NULL,
    host            TEXT NOT NULL,
    pid             INTEGER NOT NULL,
    pid_start       TEXT NOT NULL DEFAULT '',
    sandbox_run_id  TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL,
    vanished        INTEGER NOT NULL DEFAULT 0,
    error           TEXT,
    error_kind      TEXT,
    completed       INTEGER NOT NULL DEFAULT 0,
    total           INTEGER NOT NULL DEFAULT 0,
    errors          INTEGER NOT NULL DEFAULT 0,
    scored_rollouts INTEGER NOT NULL DEFAULT 0,
    errored_rollouts INTEGER NOT NULL DEFAULT 0,
    errors_by_kind  TEXT NOT NULL DEFAULT '{}',
    attempts        INTEGER NOT NULL DEFAULT 1,
    started_at      REAL NOT NULL,
    first_started_at REAL NOT NULL,
    updated_at      REAL NOT NULL,
    ended_at        REAL,
    stop_requested_at REAL
);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
CREATE INDEX IF NOT EXISTS runs_started ON runs(started_at);
CREATE INDEX IF NOT EXISTS runs_output_dir ON runs(output_dir);
"""
_MIGRATIONS = {  # version -> statements bringing a registry to it
    2: ("ALTER TABLE runs ADD COLUMN error_kind TEXT",),
    3: ("ALTER TABLE runs ADD COLUMN scored_rollouts INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN errored_rollouts INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN errors_by_kind TEXT NOT NULL DEFAULT '{}'"),
}


class RunRecord(BaseModel):
    """One row of the registry, as the read side sees it."""

    id: str
    kind: str
    name: str | None = None
    env_id: str
    model: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    output_dir: str
    log_path: str
    host: str
    pid: int
    pid_start: str = ""
    sandbox_run_id: str = ""
    status: str
    vanished: bool = False
    """True when the process died without recording an end state (SIGKILL, OOM...)."""
    error: str | None = None
    error_kind: str | None = None
    """What kind of failure ended the run: "usage" (bad flags, config, unknown endpoint or image:
    retrying cannot help; exit 2), else None."""
    completed: int = 0
    total: int = 0
    errors: int = 0
    """Rollouts that ended in an error verdict (= errored_rollouts; before schema 3 it also
    counted scored rows carrying an error text, e.g. a task's failing tool call)."""
    scored_rollouts: int = 0
    errored_rollouts: int = 0
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    """Errored rollouts by verdict kind: {"model": 3, "sandbox": 1} (envs.outputs.VERDICTS)."""
    attempts: int = 1
    """1 + the number of times the run was resumed into the same output dir."""
    started_at: float
    first_started_at: float
    updated_at: float
    ended_at: float | None = None
    stop_requested_at: float | None = None

    @property
    def duration(self) -> float:
        return (self.ended_at or time.time()) - self.started_at

    @property
    def display_status(self) -> str:
        return f"{self.status} (vanished)" if self.vanished else self.status


# --------------------------------------------------------------------- storage


def state_dir() -> Path:
    """The user's vf-sandbox state directory: the running settings' `$VF_STATE_DIR`
    (`sandboxes.settings.current()`), else `$XDG_STATE_HOME/vf-sandbox`, else
    `~/.local/state/vf-sandbox`."""
    configured = current_settings().state_dir
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "vf-sandbox"


def db_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The registry file: `path` (a run's: its definition's `runs_db`), else the running
    settings' `$VF_RUNS_DB` (`vf-sandbox runs --db` sets it for its command), else
    `runs.db` in `state_dir()`."""
    return Path(path or current_settings().runs_db or state_dir() / "runs.db").expanduser().resolve()


def connect(path: str | os.PathLike[str] | None = None) -> sqlite3.Connection:
    """Open (creating if needed) the registry in WAL mode."""
    p = db_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(p, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout=30000")
    if (conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"
            or conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION):
        _initialise(conn, p)
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _initialise(conn: sqlite3.Connection, p: Path) -> None:
    """Switch a new registry to WAL and create its schema, one process at a time (a
    file lock beside it). SQLite's busy handler does not cover a journal-mode switch:
    two processes opening a fresh registry at once got "database is locked" at
    once, so the switch is also retried for up to the busy timeout."""
    import fcntl

    with open(p.with_name(p.name + ".init-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deadline = time.monotonic() + 30.0
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    fresh = conn.execute("SELECT 1 FROM sqlite_master WHERE name='runs'").fetchone() is None
                    conn.executescript(_SCHEMA)
                    for v in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
                        if not fresh:
                            for statement in _MIGRATIONS[v]:
                                conn.execute(statement)
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _row(r: sqlite3.Row) -> RunRecord:
    d = dict(r)
    try:
        d["args"] = json.loads(d.get("args") or "{}")
    except ValueError:
        d["args"] = {}
    try:
        d["errors_by_kind"] = json.loads(d.get("errors_by_kind") or "{}")
    except ValueError:
        d["errors_by_kind"] = {}
    return RunRecord.model_validate(d)


def logs_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Where run logs go: `runs-logs/` beside the registry file."""
    return db_path(path).parent / "runs-logs"


# ------------------------------------------------------------------ liveness


def pid_alive(pid: int, start: str = "") -> bool:
    """True when `pid` runs and (if `start` is known) is the same process that
    started at `start` (clock ticks since boot): a reused pid is not alive.
    Zombies count as dead."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): fall back to a signal probe
        return pid_exists(pid)
    if fields and fields[0] in ("Z", "X"):
        return False
    return not start or (len(fields) > 19 and fields[19] == start)


def is_hosted(rec: RunRecord) -> bool:
    """A run submitted to a Ray cluster (`--hosted`): no local process to watch."""
    return rec.args.get("hosted") is True


def is_alive(rec: RunRecord) -> bool:
    """Whether the run's process is alive; runs on other hosts are assumed alive."""
    if rec.host != socket.gethostname():
        return True
    return pid_alive(rec.pid, rec.pid_start)


# ---------------------------------------------------------------- read side


def reconcile(path: str | os.PathLike[str] | None = None) -> list[str]:
    """Mark `running` rows whose process vanished: `stopped` if a stop was
    requested, else `failed` with `vanished=1`. Returns the ids changed."""
    changed: list[str] = []
    with closing(connect(path)) as conn:
        rows = conn.execute("SELECT * FROM runs WHERE status='running'").fetchall()
        for r in rows:
            rec = _row(r)
            if is_hosted(rec) or is_alive(rec):  # a hosted run's state is its Ray job's (hosted.jobs)
                continue
            now = time.time()
            if rec.stop_requested_at is not None:
                status, err = "stopped", rec.error
            else:
                status = "incomplete"  # its saved rows are kept: a resume continues it
                err = rec.error or (
                    f"process vanished: pid {rec.pid} exited without recording an end state "
                    f"(killed, crashed or out of memory); continue it: {resume_command(rec)}"
                )
            cur = conn.execute(
                "UPDATE runs SET status=?, vanished=1, error=?, ended_at=?, updated_at=? "
                "WHERE id=? AND status='running' AND pid=? AND pid_start=?",
                (status, err, now, now, rec.id, rec.pid, rec.pid_start),
            )
            if cur.rowcount:
                changed.append(rec.id)
                _append_log(rec.log_path, f"run {rec.id} marked {status}: {err or 'process gone'}")
                _settle_metadata(rec.output_dir, status, err)
    return changed


def resume_command(rec: RunRecord) -> str:
    """The command that continues a run."""
    if rec.kind == "swe-debug":
        return f"vf-swe-debug {rec.args.get('env_args', {}).get('dataset', 'DATASET')} --resume {rec.id}"
    return f"vf-sandbox eval --resume {rec.id}"


def _settle_metadata(output_dir: str, status: str, error: str | None) -> None:
    """A vanished run's metadata.json still says `running`: give it the registry's verdict
    (atomically; best-effort, the registry is what `runs` reads)."""
    meta = Path(output_dir) / "metadata.json"
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("status") != "running":
            return
        data.update(status=status, error=error)
        tmp = meta.with_name(f".metadata.json.settle{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, meta)
    except (OSError, ValueError):
        pass


def list_runs(
    *,
    status: str | None = None,
    env_id: str | None = None,
    model: str | None = None,
    kind: str | None = None,
    limit: int | None = None,
    path: str | os.PathLike[str] | None = None,
) -> list[RunRecord]:
    """Runs, newest first, filtered by exact status/kind and substring env/model."""
    reconcile(path)
    where, params = [], []
    if status:
        where.append("status=?")
        params.append(status)
    if kind:
        where.append("kind=?")
        params.append(kind)
    if env_id:
        where.append("env_id LIKE ?")
        params.append(f"%{env_id}%")
    if model:
        where.append("model LIKE ?")
        params.append(f"%{model}%")
    sql = "SELECT * FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY started_at DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    with closing(connect(path)) as conn:
        return [_row(r) for r in conn.execute(sql, params).fetchall()]


class AmbiguousRunId(LookupError):
    """The id prefix matches several runs."""


def get_run(run_id: str, path: str | os.PathLike[str] | None = None) -> RunRecord | None:
    """The run with this id (or unique id prefix); None when unknown.
    Raises AmbiguousRunId when a prefix matches several runs."""
    reconcile(path)
    with closing(connect(path)) as conn:
        r = conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if r is None:
            rows = conn.execute(
                "SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY started_at DESC LIMIT 3",
                (run_id.replace("%", "").replace("_", "\\_") + "%",),
            ).fetchall()
            if len(rows) > 1:
                raise AmbiguousRunId(f"{run_id!r} matches several runs: {[x['id'] for x in rows]}")
            r = rows[0] if rows else None
    return _row(r) if r is not None else None


def find_run(ref: str | os.PathLike[str], path: str | os.PathLike[str] | None = None) -> RunRecord | None:
    """The run named by `ref`: a run id (or unique prefix), or a path — its results
    directory (or a file in it, e.g. results.jsonl). None when unknown.
    Raises AmbiguousRunId when an id prefix matches several runs."""
    p = Path(ref).expanduser()
    if p.exists() or os.sep in str(ref):
        cands = [p.resolve()]
        if p.is_file():
            cands.append(p.resolve().parent)
        reconcile(path)
        with closing(connect(path)) as conn:
            for c in cands:
                r = conn.execute("SELECT * FROM runs WHERE output_dir=? ORDER BY started_at DESC LIMIT 1",
                                 (str(c),)).fetchone()
                if r is not None:
                    return _row(r)
        return None
    return get_run(str(ref), path)


def request_stop(run_id: str, path: str | os.PathLike[str] | None = None) -> None:
    """Note that a stop was asked for (so a vanished process counts as stopped)."""
    with closing(connect(path)) as conn:
        conn.execute(
            "UPDATE runs SET stop_requested_at=? WHERE id=? AND status='running'",
            (time.time(), run_id),
        )


def mark_status(
    run_id: str, status: RunStatus, error: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> bool:
    """Force a running run's end state (used by `runs stop` after the process is gone)."""
    now = time.time()
    with closing(connect(path)) as conn:
        cur = conn.execute(
            "UPDATE runs SET status=?, error=COALESCE(?, error), ended_at=?, updated_at=? "
            "WHERE id=? AND status='running'",
            (status, error, now, now, run_id),
        )
        return bool(cur.rowcount)


_PROGRESS_SQL = ("UPDATE runs SET completed=?, total=?, errors=?, scored_rollouts=?, errored_rollouts=?, "
                 "errors_by_kind=?, updated_at=? WHERE id=?")


def _progress_values(completed: int, total: int, errors: int, scored: int | None,
                     by_kind: dict[str, int] | None) -> tuple[Any, ...]:
    kinds = {k: int(v) for k, v in (by_kind or {}).items() if v}
    errored = sum(kinds.values()) if by_kind is not None else int(errors)
    scored = int(completed) - errored if scored is None else int(scored)
    return (int(completed), int(total), errored, max(0, scored), errored, json.dumps(kinds, sort_keys=True))


def set_progress(run_id: str, completed: int, total: int, errors: int = 0,
                 path: str | os.PathLike[str] | None = None, scored: int | None = None,
                 errors_by_kind: dict[str, int] | None = None) -> None:
    """Progress counts of a run recorded by another process (a hosted run's, from its pulled results)."""
    with closing(connect(path)) as conn:
        conn.execute(_PROGRESS_SQL, (*_progress_values(completed, total, errors, scored, errors_by_kind),
                                     time.time(), run_id))


def _append_log(log_path: str, line: str) -> None:
    try:
        with open(log_path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [vf-sandbox.runs] {line}\n")
    except OSError:
        pass


# --------------------------------------------------------------- write side


class RunRecorder:
    """Records one run in the registry. Use from the process doing the run:

        rec = RunRecorder.start(kind="eval", name=None, env_id="gsm8k", model="m",
                                args={...}, output_dir=run_dir)
        ...  rec.progress(completed=3, total=10, errors=0)  # per finished group
        rec.finish("completed")        # or "failed", error="..." / "stopped"

    or as a context manager, which finishes `failed` (with the exception) on an
    exception, `stopped` on KeyboardInterrupt, else `completed`:

        with RunRecorder.start(...) as rec: ...

    `start` also attaches a `logging` file handler writing to `rec.log_path`
    (pass `capture_logging=False` to manage logs yourself); `finish` removes it.
    Starting a recorder on an output dir that already holds a finished run's
    results (a `--resume`) continues that run's row (same id, `attempts`+1).
    """

    def __init__(self, rec: RunRecord, path: Path) -> None:
        self._rec = rec
        self._path = path
        self._conn = connect(path)
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._pending: tuple[int, int, int] | None = None
        self._finished = False
        self._handler: logging.Handler | None = None
        self._extra_handler: logging.Handler | None = None

    # -- public attributes
    @property
    def id(self) -> str:
        return self._rec.id

    @property
    def log_path(self) -> str:
        return self._rec.log_path

    @property
    def output_dir(self) -> str:
        return self._rec.output_dir

    @property
    def finished(self) -> bool:
        return self._finished

    @classmethod
    def start(
        cls,
        *,
        kind: RunKind,
        env_id: str,
        output_dir: str | os.PathLike[str],
        name: str | None = None,
        model: str | None = None,
        args: dict[str, Any] | None = None,
        resume: bool | None = None,
        run_id: str | None = None,
        db: str | os.PathLike[str] | None = None,
        capture_logging: bool = True,
        sandbox_label: str | None = None,
    ) -> "RunRecorder":
        """Record a run as `running` with this process's pid and start time.

        `output_dir` is the run's own directory (eval: the folder that holds
        results.jsonl + metadata.json; swe-debug: its output directory or
        JSONL file). `resume=None` auto-detects a resume: an existing, not
        running row for the same output dir whose dir already holds results.
        `run_id` defaults to a fresh 12-hex id; `sandbox_label` (the label the run's
        sandboxes carry) to this process's (`sandboxes.labels.run_id()`)."""
        path = db_path(db)
        out = str(Path(output_dir).expanduser().resolve())
        pid = os.getpid()
        owner = _Owner(pid=pid, pid_start=process_start_time(pid), host=socket.gethostname(),
                       label=sandbox_label or sandbox_run_id(), now=time.time(),
                       args_json=json.dumps(args or {}, default=str, sort_keys=True))
        row = _claim_row(path, owner, kind=kind, env_id=env_id, out=out, name=name, model=model, resume=resume,
                         run_id=run_id)
        rid = row["id"]
        self = cls(_row(row), path)
        verb = "resumed" if self._rec.attempts > 1 else "started"
        _append_log(
            self.log_path,
            f"run {rid} {verb}: kind={kind} env={env_id} model={model} pid={pid} output_dir={out}",
        )
        _CURRENT_RUN.set(self.id)
        if capture_logging:
            self._attach_logging()
        return self

    # -- updates
    def progress(self, completed: int, total: int, errors: int = 0, scored: int | None = None,
                 errors_by_kind: dict[str, int] | None = None) -> None:
        """Record progress counts: rollouts done, scored and errored (`errors_by_kind`, whose sum
        is the errored count; without it `errors`). Cheap: writes at most ~4 times a second
        (the last values are always flushed by `finish`)."""
        if self._finished:
            return
        now = time.monotonic()
        with self._lock:
            self._pending = _progress_values(completed, total, errors, scored, errors_by_kind)
            if now - self._last_write < 0.25 and completed < total:
                return
            self._flush_locked()
            self._last_write = now

    def _flush_locked(self) -> None:
        if self._pending is None:
            return
        values = self._pending
        self._pending = None
        try:
            self._conn.execute(_PROGRESS_SQL, (*values, time.time(), self.id))
        except sqlite3.Error as exc:  # progress is best-effort; never kill the run over it
            log.warning("run registry: progress update failed: %s", exc)

    def finish(self, status: RunStatus = "completed", error: str | None = None,
               error_kind: str | None = None) -> None:
        """Record the end state (idempotent: only the first call counts); `error_kind`
        "usage" marks a run refused for bad usage."""
        if status not in END_STATES:
            raise ValueError(f"finish status must be one of {END_STATES}, not {status!r}")
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._flush_locked()
            now = time.time()
            for attempt in range(3):  # busy_timeout already waited 30 s per attempt
                try:
                    self._conn.execute(
                        "UPDATE runs SET status=?, error=?, error_kind=?, ended_at=?, updated_at=?, vanished=0 "
                        "WHERE id=?",
                        (status, error, error_kind, now, now, self.id),
                    )
                    break
                except sqlite3.Error as exc:  # never mask the run's own outcome
                    log.warning("run registry: cannot record the end of run %s (%s)", self.id, exc)
                    time.sleep(0.5 * (attempt + 1))
        self._detach_logging()
        if _CURRENT_RUN.get() == self.id:
            _CURRENT_RUN.set(None)
        _append_log(self.log_path, f"run {self.id} {status}" + (f": {error}" if error else ""))
        self._conn.close()

    def detach(self) -> None:
        """Stop recording from this process and leave the run `running`: it goes on
        elsewhere (a hosted run's Ray job) and its end is recorded from there."""
        with self._lock:
            self._flush_locked()
            self._finished = True
        self._detach_logging()
        if _CURRENT_RUN.get() == self.id:
            _CURRENT_RUN.set(None)
        self._conn.close()

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._finished:
            return False
        if exc is None:
            self.finish("completed")
        elif isinstance(exc, KeyboardInterrupt):
            self.finish("stopped", error="interrupted")
        else:
            _append_log(self.log_path, "".join(traceback.format_exception(exc_type, exc, tb)).rstrip())
            self.finish("failed", error=f"{exc_type.__name__}: {exc}")
        return False

    # -- logging
    def _attach_logging(self) -> None:
        root = logging.getLogger()
        h = logging.FileHandler(self.log_path, encoding="utf-8")
        h.setLevel(logging.INFO)
        h.addFilter(_quiet_libraries)
        rid = self.id
        h.addFilter(lambda record: _CURRENT_RUN.get() in (None, rid))
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(name)s] %(message)s",
                                         "%Y-%m-%d %H:%M:%S"))
        if not root.handlers:
            # Adding a handler would silence logging's last-resort stderr output.
            self._extra_handler = logging.StreamHandler(sys.stderr)
            self._extra_handler.setLevel(logging.WARNING)
            # records of `envs.*` have their own console handler (envs.logging_utils.setup_logging)
            self._extra_handler.addFilter(lambda record: not getattr(record, "run_log_only", False) and not (
                record.name.startswith("envs") and logging.getLogger("envs").handlers))
            root.addHandler(self._extra_handler)
        self._restore: list[tuple[logging.Logger | logging.Handler, int]] = []
        if root.level > logging.INFO:
            # Let INFO reach our file without making existing handlers (the
            # console) chattier: pin those at the old root level first.
            for other in root.handlers:
                if other.level == logging.NOTSET:
                    self._restore.append((other, other.level))
                    other.setLevel(root.level)
            self._restore.append((root, root.level))
            root.setLevel(logging.INFO)
        root.addHandler(h)
        self._handler = h

    def _detach_logging(self) -> None:
        root = logging.getLogger()
        for h in (self._handler, self._extra_handler):
            if h is not None:
                root.removeHandler(h)
                h.close()
        self._handler = self._extra_handler = None
        for obj, level in getattr(self, "_restore", []):
            obj.setLevel(level)
        self._restore = []


# Libraries that log every request at INFO: only their warnings reach a run's log.
_CHATTY = ("httpx", "httpcore", "openai", "anthropic", "urllib3", "aiohttp", "asyncio", "hpack",
           "websockets", "docker", "kubernetes", "filelock", "datasets", "fsspec")


class _Owner(BaseModel):
    """Who runs a run now: this process (pid, its start time, host), the label its
    sandboxes carry, when, and the run's arguments (JSON)."""

    pid: int
    pid_start: str
    host: str
    label: str
    now: float
    args_json: str


def _claim_row(path: Path, owner: _Owner, *, kind: str, env_id: str, out: str, name: str | None,
               model: str | None, resume: bool | None, run_id: str | None) -> sqlite3.Row:
    """In one transaction: reopen the run `out` resumes (`_resumable`; never when `resume` is False) for
    `owner`, else insert a new one (id `run_id` or a fresh one); the run's row as stored."""
    with closing(connect(path)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            prior = None if resume is False else _resumable(conn, out, kind, resume)
            if prior is not None:
                rid = prior["id"]
                _reopen(conn, rid, owner, name, model)
            else:
                rid = run_id or new_run_id()
                _insert(conn, rid, owner, path, kind=kind, name=name, env_id=env_id, model=model, out=out)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return conn.execute("SELECT * FROM runs WHERE id=?", (rid,)).fetchone()


def _resumable(conn: sqlite3.Connection, out: str, kind: str, resume: bool | None) -> sqlite3.Row | None:
    """The row a start in `out` continues: the newest of that directory and kind, unless it
    is still running (alive), or `resume` is None (auto) and the directory holds no results."""
    prior = conn.execute("SELECT * FROM runs WHERE output_dir=? AND kind=? ORDER BY started_at DESC LIMIT 1",
                         (out, kind)).fetchone()
    if prior is None:
        return None
    p = _row(prior)
    if (p.status == "running" and is_alive(p)) or (resume is None and not _has_results(out)):
        return None
    return prior


def _reopen(conn: sqlite3.Connection, rid: str, owner: _Owner, name: str | None, model: str | None) -> None:
    """A resumed run is `running` again, owned by this process (started_at stays its first start)."""
    conn.execute(
        "UPDATE runs SET status='running', vanished=0, error=NULL, error_kind=NULL, ended_at=NULL, "
        "stop_requested_at=NULL, pid=?, pid_start=?, host=?, sandbox_run_id=?, "
        "attempts=attempts+1, updated_at=?, args=?, "
        "name=COALESCE(?, name), model=COALESCE(?, model) WHERE id=?",
        (owner.pid, owner.pid_start, owner.host, owner.label, owner.now, owner.args_json, name, model, rid),
    )


def _insert(conn: sqlite3.Connection, rid: str, owner: _Owner, path: Path, *, kind: str, name: str | None,
            env_id: str, model: str | None, out: str) -> None:
    """A new run's row (`running`), its log file beside the registry."""
    ldir = logs_dir(path)
    ldir.mkdir(parents=True, exist_ok=True)
    conn.execute(
        "INSERT INTO runs (id, kind, name, env_id, model, args, output_dir, log_path, "
        "host, pid, pid_start, sandbox_run_id, status, started_at, first_started_at, "
        "updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,'running',?,?,?)",
        (rid, kind, name, env_id, model, owner.args_json, out, str(ldir / f"{rid}.log"), owner.host, owner.pid,
         owner.pid_start, owner.label, owner.now, owner.now, owner.now),
    )


def _quiet_libraries(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not record.name.startswith(_CHATTY)


def _has_results(out: str) -> bool:
    p = Path(out)
    if p.is_file():
        return p.stat().st_size > 0
    return (p / "results.jsonl").exists() or (p / "metadata.json").exists()


def new_run_id() -> str:
    """A fresh run id (12 hex digits): the registry row's id and the name of the run's
    results directory. (A chosen id, such as the dashboard's `$VF_RUN_ID`, travels in the
    run definition: `EvalConfig.run_id`.)"""
    return uuid.uuid4().hex[:12]
