"""ResultsWriter: every group is readable by another process as soon as it is
appended (flushed), fsyncs are batched (at most one per interval, plus one at
close), and a torn last line left by a killed writer is cut before appending."""

from __future__ import annotations

import json

from envs import results_file
from envs.results_file import ResultsWriter


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_groups_are_visible_at_once_and_fsyncs_are_batched(tmp_path, monkeypatch):
    synced = []
    real_fsync = results_file.os.fsync
    monkeypatch.setattr(results_file.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    w = ResultsWriter(tmp_path, fsync_interval=3600)
    for i in range(10):
        w.append([{"example_id": i, "reward": 1.0}])
        assert [r["example_id"] for r in read_rows(w.results_path)] == list(range(i + 1))  # flushed per group
    assert len(synced) == 1  # the first group; the rest fall inside the interval
    w.close()
    assert len(synced) == 2  # the pending groups are synced on close
    assert w.rows_written == 10


def test_interval_zero_syncs_every_group(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(results_file.os, "fsync", synced.append)
    w = ResultsWriter(tmp_path, fsync_interval=0)
    for i in range(3):
        w.append([{"i": i}])
    w.close()
    assert len(synced) == 3  # nothing left pending at close


def test_torn_tail_is_cut_before_appending(tmp_path):
    path = tmp_path / results_file.RESULTS
    path.write_text('{"example_id": 0}\n{"example_id": 1, "rew')
    w = ResultsWriter(tmp_path)
    w.append([{"example_id": 2}])
    w.close()
    assert [r["example_id"] for r in read_rows(path)] == [0, 2]
