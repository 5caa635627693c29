"""Grading a parsed test run against an instance's FAIL_TO_PASS / PASS_TO_PASS.

Valid means all of: FAIL_TO_PASS is non-empty and every listed test is
present and passing; every PASS_TO_PASS test is present and passing (or
skipped); the suite demonstrably ran — an exit code that means "tests ran",
a non-empty parse, no collection error, no interruption, and a log that agrees
with the exit code (a failing exit with no failure in the log is not trusted,
cf. forged PASSED lines). An empty parse is never a pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

from .parsers import FAILING, PASSING, ParseResult, TestStatus

Reason = Literal[
    "pass",
    "test_failed",
    "gold_apply_failed",
    "debug_command_failed",
    "setup_failed",
    "timeout",
    "no_tests_ran",
    "sandbox_error",
    "flaky",
]
REASONS: tuple[str, ...] = Reason.__args__  # type: ignore[attr-defined]


class ListReport(BaseModel):
    """How one list (F2P or P2P) fared."""

    success: list[str] = Field(default_factory=list)
    failure: list[str] = Field(default_factory=list, description="Present but failing (or skipped, for F2P).")
    missing: list[str] = Field(default_factory=list, description="Not in the parsed log at all.")

    @property
    def ok(self) -> bool:
        return not self.failure and not self.missing


class Grade(BaseModel):
    """The verdict on one test run."""

    valid: bool
    reason: Reason
    detail: str = ""
    suite_ran: bool = False
    fail_to_pass: ListReport = Field(default_factory=ListReport)
    pass_to_pass: ListReport = Field(default_factory=ListReport)
    counts: dict[str, int] = Field(default_factory=dict, description="Parsed statuses counted.")


def suite_ran(parse: ParseResult, exit_code: int | None) -> tuple[bool, str]:
    """Did the test suite demonstrably run? (ok, why not)."""
    if exit_code is None:
        return False, "the test command did not exit on its own"
    if exit_code not in parse.ran_exit_codes:
        return False, f"exit code {exit_code} does not mean 'tests ran' for {parse.parser}"
    if parse.collection_errors:
        shown = ", ".join(parse.collection_errors[:5])
        return False, f"collection errors in: {shown}"
    if parse.interrupted:
        return False, "the test run was interrupted"
    if parse.empty:
        return False, "no test results in the log"
    if exit_code != 0 and not parse.count(*FAILING):
        return False, f"exit code {exit_code} but no failing test in the log (log and exit code disagree)"
    return True, ""


def _check(ids: list[str], parse: ParseResult, ok: frozenset[TestStatus]) -> ListReport:
    rep = ListReport()
    for tid in ids:
        st = parse.statuses.get(tid)
        if st is None:
            rep.missing.append(tid)
        elif st in ok:
            rep.success.append(tid)
        else:
            rep.failure.append(tid)
    return rep


def grade(parse: ParseResult, exit_code: int | None, fail_to_pass: list[str], pass_to_pass: list[str]) -> Grade:
    """Grade one run after the debug step (normally the gold patch)."""
    counts = {s.value: parse.count(s) for s in TestStatus if parse.count(s)}
    f2p = _check(fail_to_pass, parse, PASSING)
    p2p = _check(pass_to_pass, parse, PASSING | {TestStatus.SKIPPED})
    ran, why = suite_ran(parse, exit_code)
    common = dict(fail_to_pass=f2p, pass_to_pass=p2p, counts=counts, suite_ran=ran)
    if not ran:
        return Grade(valid=False, reason="no_tests_ran", detail=why, **common)
    if not fail_to_pass:
        return Grade(valid=False, reason="test_failed", detail="FAIL_TO_PASS is empty: nothing shows the fix", **common)
    problems = []
    for name, rep in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)):
        if rep.failure:
            problems.append(f"{len(rep.failure)} {name} failing (e.g. {rep.failure[0]})")
        if rep.missing:
            problems.append(f"{len(rep.missing)} {name} missing from the log (e.g. {rep.missing[0]})")
    if problems:
        return Grade(valid=False, reason="test_failed", detail="; ".join(problems), **common)
    return Grade(valid=True, reason="pass", **common)


class FailsBefore(BaseModel):
    """Result of the `--check-fails-before` run (debug step `none`)."""

    ok: bool
    passing_before: list[str] = Field(default_factory=list, description="FAIL_TO_PASS tests that already pass without the patch.")
    detail: str = ""


def check_fails_before(statuses: Mapping[str, str], fail_to_pass: list[str]) -> FailsBefore:
    """Every FAIL_TO_PASS test must fail (or be absent: it may not even import) without the patch.
    `statuses`: the parsed log of that run (test id → status)."""
    passing = [t for t in fail_to_pass if t in statuses and TestStatus(statuses[t]) in PASSING]
    if passing:
        return FailsBefore(
            ok=False,
            passing_before=passing,
            detail=f"{len(passing)} FAIL_TO_PASS test(s) already pass without the patch (e.g. {passing[0]})",
        )
    return FailsBefore(ok=True)
