"""JUnit XML for CI: one test case per instance (and per malformed dataset row).
An invalid instance is a <failure> whose message is its reason and detail and
whose body is the log tail; an infrastructure error is an <error>."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .parsers import strip_ansi

_XML_BAD = re.compile(r"[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(s: Any) -> str:
    """Text XML 1.0 can hold: ANSI sequences and control characters removed."""
    return _XML_BAD.sub("", strip_ansi(str(s or "")))


def write_junit(path: str | Path, rows: Sequence[dict[str, Any]], suite: str = "vf-swe-debug",
                row_errors: Sequence[Any] = ()) -> Path:
    cases = []
    failures = errors = 0
    total_time = 0.0
    for r in rows:
        t = float((r.get("timings") or {}).get("total_s") or 0.0)
        total_time += t
        tc = ET.Element("testcase", classname=_clean(r.get("repo") or suite), name=_clean(r["instance_id"]), time=f"{t:.3f}")
        if not r.get("valid"):
            head = _clean(f"{r.get('reason')}: {r.get('detail', '')}".strip(": "))[:1000]
            tail = _clean("\n".join(x for x in (r.get("stdout_tail"), r.get("stderr_tail")) if x))
            msg = head + (f"\n{tail[-500:]}" if tail else "")  # reason + log tail; the body has the whole tail
            tag = "error" if r.get("reason") == "sandbox_error" else "failure"
            el = ET.SubElement(tc, tag, message=msg, type=_clean(r.get("reason")))
            el.text = tail or _clean(r.get("error")) or head
            if tag == "error":
                errors += 1
            else:
                failures += 1
        cases.append(tc)
    for e in row_errors:
        tc = ET.Element("testcase", classname=suite, name=_clean(f"row {e.index}" + (f" ({e.instance_id})" if e.instance_id else "")), time="0")
        el = ET.SubElement(tc, "failure", message=_clean(f"malformed row: {e.field}: {e.message}"), type="malformed_row")
        el.text = _clean(str(e))
        failures += 1
        cases.append(tc)
    ts = ET.Element("testsuite", name=suite, tests=str(len(cases)), failures=str(failures), errors=str(errors),
                    skipped="0", time=f"{total_time:.3f}")
    ts.extend(cases)
    root = ET.Element("testsuites", name=suite, tests=str(len(cases)), failures=str(failures), errors=str(errors),
                      time=f"{total_time:.3f}")
    root.append(ts)
    ET.indent(root)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(p)
    return p
