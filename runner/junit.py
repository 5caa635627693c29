"""JUnit XML for CI: a view of an eval's results, made from its rows and its
metadata only (so it can be written for any eval, during or after the run).

One test case per row:
- name: `info.instance_id` when the dataset has one, else `example <id>`
  (with `#k` for the k-th rollout when an example has several);
- classname: `info.repo`, else the env id;
- `<error>` when the row was not scored (its verdict is a model / sandbox /
  env / usage error: the rollout never reached a result), `<failure>` when
  its reward is below the run's `pass_threshold` (a scored task failure, e.g.
  a bad tool call or the sandbox's own OOM, is a failure).

The suite's `<properties>` hold the scored / errored counts (`scored_rollouts`,
`errored_rollouts`, `errors_<kind>`) and the run's `status`.

An environment may explain its outcome in `info["verdict"]` (a dict with
`reason`, `detail`, `stdout_tail`, `stderr_tail`, `timings.total_s`, as
SWEDebugEnv does): the failure's type and message are then the reason and
detail, its body the log tails. Entries of the metadata's `input_errors`
(`name`, `type`, `message`: inputs that could not be loaded) are failing
cases too.

A case's time is the row's own duration (the verdict's `timings.total_s`,
which for SWE includes the image and set-up, else the rollout's timing); the
suite's time is the run's wall time (`metadata.time_ms`), which also covers
what happens before and between rollouts (env load, image builds, queueing),
falling back to the sum of the cases when the metadata has none.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from envs.outputs import ERROR_VERDICTS, is_scored, verdict_counts
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_XML_BAD = re.compile(r"[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(s: Any) -> str:
    """Text XML 1.0 can hold: ANSI sequences and control characters removed."""
    return _XML_BAD.sub("", _ANSI.sub("", str(s or "")))


def _error_text(row: dict[str, Any]) -> str:
    err = row.get("error")
    if isinstance(err, dict):
        return f"{err.get('type', 'error')}: {err.get('message', '')}"
    return str(err or "")


def _float(x: Any) -> float:
    try:
        return float(x or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _case_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    per_example: dict[Any, int] = {}
    for r in rows:
        per_example[r.get("example_id")] = per_example.get(r.get("example_id"), 0) + 1
    seen: dict[Any, int] = {}
    names = []
    for r in rows:
        ex = r.get("example_id")
        info = r.get("info") if isinstance(r.get("info"), dict) else {}
        name = str(info.get("instance_id") or f"example {ex}")
        if per_example[ex] > 1:
            seen[ex] = seen.get(ex, 0) + 1
            name += f"#{seen[ex]}"
        names.append(name)
    return names


def render_junit(rows: Sequence[dict[str, Any]], metadata: dict[str, Any], suite: str | None = None) -> ET.Element:
    """The `<testsuites>` element of this run (see the module docstring)."""
    suite = suite or str(metadata.get("name") or metadata.get("env_id") or "eval")
    threshold = _float(metadata.get("pass_threshold", 0.5))
    cases = []
    failures = errors = 0
    total_time = 0.0
    for r, name in zip(rows, _case_names(rows)):
        tc, t, outcome = _row_case(r, name, metadata, suite, threshold)
        total_time += t
        if outcome == "error":
            errors += 1
        elif outcome == "failure":
            failures += 1
        cases.append(tc)
    for e in metadata.get("input_errors") or []:
        cases.append(_input_error_case(e, suite))
        failures += 1
    wall = _float(metadata.get("time_ms")) / 1000
    if wall > 0:
        total_time = wall
    ts = ET.Element("testsuite", name=suite, tests=str(len(cases)), failures=str(failures), errors=str(errors),
                    skipped="0", time=f"{total_time:.3f}")
    _add_properties(ts, rows, metadata)
    ts.extend(cases)
    root = ET.Element("testsuites", name=suite, tests=str(len(cases)), failures=str(failures), errors=str(errors),
                      time=f"{total_time:.3f}")
    root.append(ts)
    ET.indent(root)
    return root


def _row_case(r: dict[str, Any], name: str, metadata: dict[str, Any], suite: str,
              threshold: float) -> tuple[ET.Element, float, str | None]:
    """(`<testcase>` of one row, its time in seconds, "error" / "failure" / None: the outcome it reports).

    Not scored: an `<error>`; reward below `threshold`: a `<failure>`; either carries the verdict's
    reason and detail (else the row's error or reward) and the log tails."""
    info = r.get("info") if isinstance(r.get("info"), dict) else {}
    verdict = info.get("verdict") if isinstance(info.get("verdict"), dict) else {}
    t = _float((verdict.get("timings") or {}).get("total_s") or (r.get("timing") or {}).get("total"))
    tc = ET.Element("testcase", classname=_clean(info.get("repo") or metadata.get("env_id") or suite),
                    name=_clean(name), time=f"{t:.3f}")
    failed = _float(r.get("reward")) < threshold
    errored = not is_scored(r)
    if not (errored or failed):
        return tc, t, None
    reason = verdict.get("reason") or ("error" if r.get("error") else "reward")
    detail = verdict.get("detail") or (_error_text(r) if r.get("error") else
                                       f"reward {_float(r.get('reward')):g} < pass_threshold {threshold:g}")
    head = _clean(f"{reason}: {detail}".strip(": "))[:1000]
    tail = _clean("\n".join(x for x in (verdict.get("stdout_tail"), verdict.get("stderr_tail")) if x))
    msg = head + (f"\n{tail[-500:]}" if tail else "")  # reason + log tail; the body has the whole tail
    tag = "error" if errored else "failure"
    el = ET.SubElement(tc, tag, message=msg, type=_clean(reason))
    el.text = tail or _clean(_error_text(r)) or head
    return tc, t, tag


def _input_error_case(e: dict[str, Any], suite: str) -> ET.Element:
    """The failing `<testcase>` of one of the metadata's `input_errors` (an input that could not be loaded)."""
    tc = ET.Element("testcase", classname=suite, name=_clean(e.get("name")), time="0")
    el = ET.SubElement(tc, "failure", message=_clean(e.get("message")), type=_clean(e.get("type") or "input_error"))
    el.text = _clean(e.get("message"))
    return tc


def _add_properties(ts: ET.Element, rows: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> None:
    """The suite's `<properties>`: scored / errored counts, errors by kind, the run's status."""
    counts = verdict_counts(list(rows))
    props = ET.SubElement(ts, "properties")
    for name, value in [("scored_rollouts", counts["scored"]), ("errored_rollouts", counts["errored"]),
                        *((f"errors_{k}", counts[k]) for k in ERROR_VERDICTS if counts[k]),
                        *((("status", metadata["status"]),) if metadata.get("status") else ())]:
        ET.SubElement(props, "property", name=name, value=_clean(value))


def write_junit(path: str | Path, rows: Sequence[dict[str, Any]], metadata: dict[str, Any], suite: str | None = None) -> Path:
    """Write the JUnit report atomically (temp file + replace)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    ET.ElementTree(render_junit(rows, metadata, suite)).write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(p)
    return p
