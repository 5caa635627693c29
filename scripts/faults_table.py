#!/usr/bin/env python3
"""Print the "Faults we test" table of docs/testing.md from a test run's JUnit report.

    .venv/bin/pytest -m faults --junitxml=test-artifacts/faults.xml   # or `make test` (test-artifacts/junit.xml)
    .venv/bin/python scripts/faults_table.py [JUNIT_XML ...]

Rows come from two places: every test of tests/test_faults.py records its
`fault`, `outcome` and (where it measures one) `figure` as JUnit properties;
rows that tests in other modules already cover are listed in `ELSEWHERE`
below and looked up in the same report(s). Each row says whether its test(s)
passed in that run; a row whose test did not run says "not run". Exit 1 when
a row failed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_REPORTS = ["test-artifacts/junit.xml"]
SUITE = "tests.test_faults"

# (fault, outcome asserted, JUnit classname, test name or name prefix ending in "[")
ELSEWHERE: list[tuple[str, str, str, str]] = [
    ("runner SIGINT / SIGTERM mid-eval (SandboxEnv, -c 8, 1 and 2 workers)",
     "0 containers when the process exits; finished groups saved; run `stopped`",
     "tests.test_run_definition", "test_signal_mid_run_of_a_sandbox_eval_leaves_nothing["),
    ("runner SIGINT / SIGTERM mid-eval, then `--resume`",
     "resume completes: every rollout exactly once",
     "tests.test_eval_cli", "test_signal_stops_gracefully_then_resume_completes["),
    ("runner SIGINT / SIGTERM mid `vf-swe-debug` at -c 8",
     "0 containers, finished rows kept, run `stopped`",
     "tests.test_swe_docker", "test_signal_mid_run_at_c8_stops_cleanly["),
    ("runner SIGKILLed mid `vf-swe-debug`, then `--resume`",
     "0 lost, 0 duplicated; finished rows kept byte for byte",
     "tests.test_swe_docker", "test_resume_after_sigkill"),
    ("SWE patches that do not apply", "`gold_apply_failed` with the patch output, exit 1, JUnit failure",
     "tests.test_swe_docker", "test_cli_exit_code_and_junit"),
]


@dataclass
class Case:
    classname: str
    name: str
    outcome: str  # passed | failed | skipped
    seconds: float
    props: dict[str, str] = field(default_factory=dict)
    line: int = 0  # where the test is defined (the table's row order)


def read_cases(paths: list[str]) -> list[Case]:
    cases = []
    for path in paths:
        for tc in ET.parse(path).getroot().iter("testcase"):
            if tc.find("failure") is not None or tc.find("error") is not None:
                outcome = "failed"
            elif tc.find("skipped") is not None:
                outcome = "skipped"
            else:
                outcome = "passed"
            props = {p.get("name"): p.get("value") for p in tc.iter("property")}
            cases.append(Case(tc.get("classname", ""), tc.get("name", ""), outcome, float(tc.get("time") or 0), props,
                              int(tc.get("line") or 0)))
    return cases


def verdict(found: list[Case]) -> str:
    if not found:
        return "not run"
    bad = [c for c in found if c.outcome != "passed"]
    if not bad:
        return "pass" + (f" ({len(found)} cases)" if len(found) > 1 else "")
    return "**FAIL**" if any(c.outcome == "failed" for c in bad) else "skipped"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(cases: list[Case]) -> tuple[str, bool]:
    lines = ["| Fault injected | Outcome asserted | Result | Figure (same run) | Test |", "|---|---|---|---|---|"]
    ok = True
    # rows in the order of the tests in the file: a report of parallel workers lists them as they finished
    for c in sorted(cases, key=lambda c: (c.line, c.name)):
        if c.classname != SUITE or "fault" not in c.props:
            continue
        v = verdict([c])
        ok &= v.startswith("pass")
        lines.append(f"| {cell(c.props['fault'])} | {cell(c.props.get('outcome', ''))} | {v} | "
                     f"{cell(c.props.get('figure', '') or f'{c.seconds:.1f} s')} | `test_faults.py::{c.name}` |")
    for fault, outcome, classname, name in ELSEWHERE:
        found = [c for c in cases if c.classname == classname
                 and (c.name.startswith(name) if name.endswith("[") else c.name == name)]
        v = verdict(found)
        ok &= v.startswith("pass") or v == "not run"
        secs = sum(c.seconds for c in found)
        module = classname.split(".")[-1]
        lines.append(f"| {cell(fault)} | {cell(outcome)} | {v} | {f'{secs:.1f} s' if found else ''} | "
                     f"`{module}.py::{name.rstrip('[')}` |")
    return "\n".join(lines), ok


def main(argv: list[str]) -> int:
    paths = argv or DEFAULT_REPORTS
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        print(f"no JUnit report at {', '.join(missing)}: run `make test` or "
              "`pytest -m faults --junitxml=test-artifacts/faults.xml` first", file=sys.stderr)
        return 2
    text, ok = table(read_cases(paths))
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
