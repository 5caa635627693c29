"""One run directory's files: `results.jsonl` (rows appended one group per
write and flushed, so a killed process loses nothing; fsynced at most once a
second and on close, so a machine crash loses at most the last second; a torn last line from a killed writer is cut
before appending) and `metadata.json` (rewritten atomically: temp file +
os.replace). Used by `Environment.generate(save_results=True)` and by the
eval run layer (`envs.eval.writer`, which adds the directory layout and
resume)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._truncate_torn_tail()
        self._fh = open(self.results_path, "a", encoding="utf-8")

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
        self._fh.write(text)
        self._fh.flush()
        self._unsynced = True
        if self.fsync and time.monotonic() - self._synced_at >= self.fsync_interval:
            self._sync()
        self.rows_written += text.count("\n")

    def _sync(self) -> None:
        os.fsync(self._fh.fileno())
        self._synced_at = time.monotonic()
        self._unsynced = False

    def rewrite(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace results.jsonl with `rows` (atomically: temp file + os.replace), e.g. a
        resumed run dropping the rows it will run again; appends continue after them."""
        self.close()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.results_path.with_suffix(f".jsonl.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("".join(dumps(r) + "\n" for r in rows))
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.results_path)

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.metadata_path.with_suffix(f".json.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(metadata, default=_json_default, indent=2, ensure_ascii=False))
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.metadata_path)

    def close(self) -> None:
        if self._fh is not None:
            if self.fsync and self._unsynced:
                self._sync()
            self._fh.close()
            self._fh = None
