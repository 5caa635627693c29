"""The batch runner behind `vf-swe-debug`: runs every selected instance with a
concurrency cap, retries a rollout only on `InfraError` (with backoff, on a
fresh sandbox), optionally checks that FAIL_TO_PASS fails without the patch
and repeats the gold run K times to catch flaky instances, and writes one
JSONL row per instance the moment it completes (flush + fsync, so a crash
loses at most the rows still running). `resume` skips instances that already
have a verdict in the file (a `sandbox_error` row is not a verdict: it is
run again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandboxes import RetryPolicy, SandboxBackend, UsageError, find_infra_error, retry_infra

from .debug import DebugOptions, DebugOutcome, run_debug, with_fails_before
from .taskset import SandboxTaskSet

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"


class RunConfig(BaseModel):
    """How a batch runs (as opposed to what one rollout does: DebugOptions)."""

    concurrency: int = Field(4, ge=1)
    max_retries: int = Field(2, ge=0, description="Extra tries of a rollout that hit an InfraError.")
    retry_initial_delay: float = 1.0
    check_fails_before: bool = False
    repeat: int = Field(1, ge=1, description="Gold runs per instance; mixed verdicts → flaky.")
    output_dir: str | None = None
    resume: bool = False


def _list_summary(rep) -> dict[str, Any]:
    return {"passed": len(rep.success), "failing": rep.failure[:50], "missing": rep.missing[:50]}


def outcome_row(index: int, info: dict[str, Any], o: DebugOutcome) -> dict[str, Any]:
    """A compact, JSON-able row for one outcome (lists of passing ids counted, not listed)."""
    row: dict[str, Any] = {
        "index": index,
        **info,
        "valid": o.valid,
        "reason": o.reason,
        "detail": o.detail,
        "step": o.step,
        "image": o.image,
        "images_built": o.images_built,
        "apply_method": o.apply_method,
        "debug_exit_code": o.debug_exit_code,
        "test_exit_code": o.test_exit_code,
        "timings": o.timings.model_dump(),
        "stdout_tail": o.stdout_tail,
        "stderr_tail": o.stderr_tail,
    }
    if o.grade is not None:
        row["counts"] = o.grade.counts
        row["fail_to_pass"] = _list_summary(o.grade.fail_to_pass)
        row["pass_to_pass"] = _list_summary(o.grade.pass_to_pass)
    return row


class ResultsWriter:
    """Append-only JSONL; every row is flushed and fsynced before `write` returns."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_partial_line(path)
        self._fh = path.open("a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(json.dumps(row, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def _truncate_partial_line(path: Path) -> None:
    """Drop a half-written last line (the process was killed mid-write)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    with path.open("r+b") as fh:
        fh.truncate(cut)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Complete rows of a results file (a torn last line is ignored)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def latest_rows(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last row per instance id."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out[r["instance_id"]] = r
    return out


def finished_ids(path: Path) -> set[str]:
    return {iid for iid, r in latest_rows(read_rows(path)).items() if r.get("reason") != "sandbox_error"}


class Progress(BaseModel):
    total: int = 0
    done: int = 0
    valid: int = 0
    invalid: int = 0
    errors: int = 0


RowCallback = Callable[[dict[str, Any], Progress], None]


class BatchRunner:
    """Runs a taskset's instances; see the module docstring."""

    def __init__(self, taskset: SandboxTaskSet, backend: SandboxBackend, opts: DebugOptions, cfg: RunConfig):
        opts.check()
        self.taskset, self.backend, self.opts, self.cfg = taskset, backend, opts, cfg
        self.policy = RetryPolicy(attempts=cfg.max_retries + 1, initial_delay=cfg.retry_initial_delay)

    async def _rollout(self, inst: Any, step, prepared: Any) -> tuple[DebugOutcome, int]:
        return await retry_infra(lambda: run_debug(self.taskset, inst, self.backend, self.opts, step=step, prepared=prepared),
                                 self.policy)

    async def run_one(self, index: int, inst: Any) -> dict[str, Any]:
        info = self.taskset.info(inst)
        t0 = time.perf_counter()
        attempts_total = 0
        try:
            # image (host side) once per instance; a broken build is the instance's fault
            t_img = time.perf_counter()
            try:
                prepared = await self.taskset.prepare(inst)
            except UsageError as exc:
                o = DebugOutcome(instance_id=info["instance_id"], step=self.opts.debug_step, valid=False,
                                 reason="setup_failed", detail=f"image: {exc}"[:4000])
                o.timings.image_s = o.timings.total_s = round(time.perf_counter() - t_img, 4)
                row = outcome_row(index, info, o)
                row["attempts"] = 1
                return row
            image_s = round(time.perf_counter() - t_img, 4)
            before: DebugOutcome | None = None
            if self.cfg.check_fails_before:
                before, n = await self._rollout(inst, "none", prepared)
                attempts_total += n
            outcomes: list[DebugOutcome] = []
            for _ in range(self.cfg.repeat):
                o, n = await self._rollout(inst, None, prepared)
                attempts_total += n
                outcomes.append(o)
            final = outcomes[0]
            if len({o.valid for o in outcomes}) > 1:  # valid only sometimes: flaky, shown by a failing run
                bad = next(o for o in outcomes if not o.valid)
                n_ok = sum(o.valid for o in outcomes)
                final = bad.model_copy(update={"reason": "flaky", "detail": f"valid in {n_ok}/{len(outcomes)} runs; {bad.detail}"})
            fb = None
            if before is not None:
                final, fb = with_fails_before(final, before, self.taskset.fail_to_pass(inst))
            final.timings.image_s = image_s
            row = outcome_row(index, info, final)
            row["attempts"] = attempts_total
            if before is not None and fb is not None:
                row["fails_before"] = {"ok": fb.ok, "passing_before": fb.passing_before[:50], "reason": before.reason,
                                       "test_exit_code": before.test_exit_code, "timings": before.timings.model_dump()}
            if len(outcomes) > 1:
                row["repeats"] = [{"valid": o.valid, "reason": o.reason, "tests_s": o.timings.tests_s} for o in outcomes]
            return row
        except Exception as exc:  # noqa: BLE001 - one instance never stops the batch
            # An InfraError left after the retries, or a bug of ours / of a custom taskset:
            # either way no verdict on the instance, so `sandbox_error` (re-run by --resume).
            infra = find_infra_error(exc)
            culprit = infra or exc
            detail = str(infra) if infra else f"internal error: {type(exc).__name__}: {exc}"
            log.warning("%s: %s", info.get("instance_id"), detail, exc_info=infra is None)
            return {"index": index, **info, "valid": False, "reason": "sandbox_error", "detail": detail[:2000],
                    "error": str(exc)[:2000], "error_type": type(culprit).__name__,
                    "attempts": max(attempts_total, self.cfg.max_retries + 1 if infra else 1),
                    "timings": {"total_s": round(time.perf_counter() - t0, 4)}}

    async def run(self, instances: Sequence[Any], on_row: RowCallback | None = None) -> list[dict[str, Any]]:
        """Run `instances`; returns the rows of this run plus, with resume, the earlier ones."""
        writer: ResultsWriter | None = None
        earlier: dict[str, dict[str, Any]] = {}
        if self.cfg.output_dir:
            path = Path(self.cfg.output_dir) / RESULTS_FILE
            if self.cfg.resume:
                done = finished_ids(path)
                earlier = {k: v for k, v in latest_rows(read_rows(path)).items() if k in done}
            elif path.exists():
                path.unlink()
            writer = ResultsWriter(path)
        indexed = [(i, inst) for i, inst in enumerate(instances)]
        selected = {self.taskset.instance_id(x) for _, x in indexed}
        earlier = {k: v for k, v in earlier.items() if k in selected}
        todo = [(i, inst) for i, inst in indexed if self.taskset.instance_id(inst) not in earlier]
        prog = Progress(total=len(indexed), done=len(indexed) - len(todo))
        for r in earlier.values():
            _count(prog, r)
        sem = asyncio.Semaphore(self.cfg.concurrency)
        rows: list[dict[str, Any]] = []

        async def worker(i: int, inst: Any) -> None:
            async with sem:
                row = await self.run_one(i, inst)
            row["finished_at"] = time.time()
            if writer:
                writer.write(row)
            rows.append(row)
            prog.done += 1
            _count(prog, row)
            if on_row:
                on_row(row, prog)

        try:
            await asyncio.gather(*(worker(i, inst) for i, inst in todo))
        finally:
            if writer:
                writer.close()
        all_rows = list(earlier.values()) + rows
        all_rows.sort(key=lambda r: r.get("index", 0))
        if self.cfg.output_dir:
            write_summary(Path(self.cfg.output_dir) / SUMMARY_FILE, all_rows)
        return all_rows


def _count(prog: Progress, row: dict[str, Any]) -> None:
    if row.get("valid"):
        prog.valid += 1
    elif row.get("reason") == "sandbox_error":
        prog.errors += 1
    else:
        prog.invalid += 1


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    reasons = Counter(r["reason"] for r in rows)
    valid = sum(1 for r in rows if r.get("valid"))
    return {
        "total": len(rows),
        "valid": valid,
        "invalid": len(rows) - valid - reasons.get("sandbox_error", 0),
        "errors": reasons.get("sandbox_error", 0),
        "valid_rate": (valid / len(rows)) if rows else 0.0,
        "reasons": dict(reasons),
        "all_valid": bool(rows) and valid == len(rows),
    }


def write_summary(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summarize(rows), indent=2))
    os.replace(tmp, path)
