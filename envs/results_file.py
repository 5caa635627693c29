"""One run directory's files: `results.jsonl` (rows appended one group per
write and flushed, so a killed process loses nothing; fsynced at most once a
second and on close, so a machine crash loses at most the last second; a torn last line from a killed writer is cut
before appending) and `metadata.json` (rewritten atomically: temp file +
os.replace). Used by `Environment.generate(save_results=True)` and by the
eval run layer (`runner.writer`, which adds the directory layout and
resume).

A write that fails (a full disk, a read-only or vanished directory) raises
`ResultsWriteError` naming the file and the next step, never a bare
`OSError: [Errno 28]`. `read_rows` reads a results file back line by line and
reports every line it cannot use (garbage, binary junk, a torn tail) with the
file and line number instead of skipping it silently or failing on the first
undecodable byte."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = "results.jsonl"
METADATA = "metadata.json"


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    return str(obj)


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, ensure_ascii=False)


class ResultsWriteError(OSError):
    """A results file could not be written; the message names the path and what to do."""


def write_error(path: Path, exc: OSError) -> ResultsWriteError:
    what = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "the disk is full: free space there (or write elsewhere with -o), then continue the run with --resume"
    elif exc.errno == errno.EROFS or exc.errno == errno.EACCES:
        hint = "the directory is not writable: fix its permissions (or write elsewhere with -o)"
    else:
        hint = "check the output directory, then continue the run with --resume"
    err = ResultsWriteError(exc.errno or 0, f"cannot write {path}: {what} (errno {exc.errno}); {hint}")
    err.filename = str(path)
    return err


@dataclass
class ReadRows:
    """What `read_rows` found: the rows, and one message per line it could not use."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)
    """`FILE:LINE: why` for each unusable line (garbage, not UTF-8, not a JSON object)."""
    torn_tail: bool = False
    """The last line had no newline (a writer killed mid-write): dropped."""


def read_rows(path: str | Path) -> ReadRows:
    """The rows of a results file, line by line (bytes: binary junk is one bad line,
    not a UnicodeDecodeError for the whole file). A missing file has no rows."""
    out = ReadRows()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:  # no final newline: a torn last line
        out.torn_tail = True
        lines.pop()
    for no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            out.bad_lines.append(f"{path}:{no}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
            continue
        except ValueError as exc:
            out.bad_lines.append(f"{path}:{no}: not a JSON row ({exc})")
            continue
        if not isinstance(obj, dict):
            out.bad_lines.append(f"{path}:{no}: not a JSON object ({type(obj).__name__})")
            continue
        out.rows.append(obj)
    return out


class ResultsWriter:
    """Appends groups of rows to results.jsonl and keeps metadata.json current."""

    def __init__(self, run_dir: str | Path, fsync: bool = True, fsync_interval: float = 1.0):
        self.run_dir = Path(run_dir)
        self.fsync = fsync
        self.fsync_interval = fsync_interval  # seconds between fsyncs of results.jsonl (0 = every group)
        self._synced_at = float("-inf")  # never: the first group is synced (monotonic time starts near boot)
        self._unsynced = False
        self._fh: Any = None
        self.rows_written = 0

    @property
    def results_path(self) -> Path:
        return self.run_dir / RESULTS

    @property
    def metadata_path(self) -> Path:
        return self.run_dir / METADATA

    def open(self) -> None:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._truncate_torn_tail()
            self._fh = open(self.results_path, "a", encoding="utf-8")
        except OSError as exc:
            raise write_error(self.results_path, exc) from exc

    def _truncate_torn_tail(self) -> None:
        """Drop a partial last line left by a killed writer, so appends stay valid JSONL."""
        path = self.results_path
        if not path.exists() or path.stat().st_size == 0:
            return
        with open(path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) == b"\n":
                return
            data = fh.seek(0) or fh.read()
            cut = data.rfind(b"\n") + 1
            fh.truncate(cut)

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        """Write one group (one write call, then flush; fsync when the last one is
        `fsync_interval` old: an fsync per group would block the event loop for
        milliseconds per group on a busy disk)."""
        if self._fh is None:
            self.open()
        text = "".join(dumps(r) + "\n" for r in rows)
        if not text:
            return
        size = None
        try:
            size = os.fstat(self._fh.fileno()).st_size  # every earlier group is flushed: the file's end
            self._fh.write(text)
            self._fh.flush()
            self._unsynced = True
            if self.fsync and time.monotonic() - self._synced_at >= self.fsync_interval:
                self._sync()
        except OSError as exc:
            self._abandon()
            if size is not None:  # whole groups only: cut what part of this one reached the disk (frees its blocks)
                try:
                    os.truncate(self.results_path, size)
                except OSError:
                    pass
            raise write_error(self.results_path, exc) from exc
        self.rows_written += text.count("\n")

    def _abandon(self) -> None:
        """After a failed write: close without flushing what the disk refused (the
        partial group stays a torn tail, which a resume drops and runs again)."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            fh.close()  # the flush fails again, the descriptor is closed all the same
        except (OSError, ValueError):
            pass

    def _sync(self) -> None:
        os.fsync(self._fh.fileno())
        self._synced_at = time.monotonic()
        self._unsynced = False

    def rewrite(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace results.jsonl with `rows` (atomically: temp file + os.replace), e.g. a
        resumed run dropping the rows it will run again; appends continue after them."""
        self.close()
        self._replace(self.results_path, "".join(dumps(r) + "\n" for r in rows))

    def _replace(self, path: Path, text: str) -> None:
        """Write `path` atomically (temp file + os.replace); ResultsWriteError on failure."""
        tmp = path.with_suffix(f"{path.suffix}.tmp{os.getpid()}")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                if self.fsync:
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise write_error(path, exc) from exc

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        text = json.dumps(metadata, default=_json_default, indent=2, ensure_ascii=False)
        try:
            self._replace(self.metadata_path, text)
        except ResultsWriteError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._overwrite_in_place(text):
                raise

    def _overwrite_in_place(self, text: str) -> bool:
        """A full disk has no room for a second copy of metadata.json: overwrite the old
        one in place (its blocks are freed by the truncation, so the final status still
        fits). Not atomic, which is why it is only the fallback."""
        try:
            with open(self.metadata_path, "r+", encoding="utf-8") as fh:
                fh.truncate(0)
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self._fh is not None:
            try:
                if self.fsync and self._unsynced:
                    self._sync()
                self._fh.close()
            except OSError as exc:
                self._abandon()
                raise write_error(self.results_path, exc) from exc
            self._fh = None
