"""Log parsers and grading, on output captured from real pytest 7.4 / unittest
(Python 3.11) runs of tests/data/swe/samples/ inside the SWE env image, plus
the edge cases the SWE-bench parsers got wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from swe_debug.grading import check_fails_before, grade, suite_ran
from swe_debug.parsers import ParseResult, TestStatus, get_parser, parse_pytest, parse_unittest, strip_ansi

DATA = Path(__file__).parent / "data" / "swe"
P = TestStatus


def log(name: str) -> str:
    return (DATA / name).read_text()


EXPECTED_PYTEST = {
    "test_sample_pytest.py::test_param[a b]": P.PASSED,
    "test_sample_pytest.py::test_param[x - y]": P.FAILED,
    "test_sample_pytest.py::test_param[plain]": P.PASSED,
    "test_sample_pytest.py::test_param[[nested] ok]": P.PASSED,
    "test_sample_pytest.py::test_ids[one item]": P.PASSED,
    "test_sample_pytest.py::test_ids[two - items]": P.FAILED,
    "test_sample_pytest.py::test_setup_error": P.ERROR,
    "test_sample_pytest.py::TestClass::test_method": P.PASSED,
    "test_sample_pytest.py::test_xfail": P.XFAIL,
    "test_sample_pytest.py::test_skip": P.SKIPPED,  # only the -v line names a skipped test
}


@pytest.mark.parametrize("name", ["pytest_sample.log", "pytest_sample_color.log"])
def test_pytest_real_log_statuses_with_spaces_and_colour(name):
    text = log(name)
    if "color" in name:
        assert "\x1b[" in text  # really coloured
    res = parse_pytest(text)
    assert res.statuses == EXPECTED_PYTEST
    assert res.summary == {"failed": 2, "passed": 5, "skipped": 1, "xfailed": 1, "errors": 1}
    assert not res.collection_errors and not res.interrupted


def test_pytest_summary_only_and_verbose_only_agree():
    text = log("pytest_sample.log")
    head, _, summary = text.partition("short test summary info")
    verbose_only = parse_pytest(head)  # the -v lines alone
    summary_only = parse_pytest("=== short test summary info ===" + summary)
    assert verbose_only.statuses == EXPECTED_PYTEST
    # the summary cannot name skipped tests ("SKIPPED [1] file:line"), everything else matches
    assert summary_only.statuses == {k: v for k, v in EXPECTED_PYTEST.items() if v is not P.SKIPPED}


def test_pytest_collection_error_is_never_a_pass():
    res = parse_pytest(log("pytest_collect_error.log"))
    assert res.collection_errors == ["test_sample_collect_error.py"]
    assert res.interrupted
    assert res.statuses == {}  # collection stopped the run: nothing ran
    g = grade(res, 2, ["test_sample_pytest.py::test_param[a b]"], [])
    assert not g.valid and g.reason == "no_tests_ran"


def test_unittest_real_log():
    res = parse_unittest(log("unittest_sample.log"))
    m = "ut.test_sample_unittest.SampleTests."
    assert res.statuses[m + "test_ok"] is P.PASSED
    assert res.statuses[m + "test_docstring"] is P.PASSED  # name line, docstring line, then "... ok"
    assert res.statuses[m + "test_prints"] is P.PASSED  # stderr noise between "..." and "ok"
    assert res.statuses[m + "test_fail"] is P.FAILED
    assert res.statuses[m + "test_error"] is P.ERROR
    assert res.statuses[m + "test_skip"] is P.SKIPPED
    assert res.statuses[m + "test_expected_failure"] is P.XFAIL
    assert res.statuses["ut.test_sample_unittest.BrokenSetupClass"] is P.ERROR
    assert "ut.test_sample_unittest.BrokenSetupClass.test_never" not in res.statuses
    assert res.summary["ran"] == 7 and res.summary["failures"] == 1 and res.summary["errors"] == 2


def test_unittest_import_error_is_a_collection_error():
    res = parse_unittest(log("unittest_import_error.log"))
    assert res.collection_errors == ["test_sample_import_error"]
    ok, why = suite_ran(res, 1)
    assert not ok and "collection" in why


def test_unittest_pre311_form_and_custom_parser_registry():
    text = "test_a (pkg.mod.Case) ... ok\ntest_b (pkg.mod.Case) ... FAIL\n\nRan 2 tests in 0.1s\n\nFAILED (failures=1)\n"
    res = get_parser("unittest")(text)
    assert res.statuses == {"pkg.mod.Case.test_a": P.PASSED, "pkg.mod.Case.test_b": P.FAILED}


def test_strip_ansi_and_crlf():
    assert strip_ansi("\x1b[32mPASSED\x1b[0m a::b\r\n") == "PASSED a::b\n"
    res = parse_pytest("\x1b[32mPASSED\x1b[0m t.py::test_x[a b]\r\n\x1b[1m== 1 passed in 0.1s ==\x1b[0m\r\n")
    assert res.statuses == {"t.py::test_x[a b]": P.PASSED}


def test_unknown_parser_is_a_config_error():
    from sandboxes import ConfigError

    with pytest.raises(ConfigError):
        get_parser("nope")


# ---------------------------------------------------------------------------- grading

def _res(**statuses) -> ParseResult:
    return ParseResult(parser="pytest", statuses={k.replace("__", "::"): P[v] for k, v in statuses.items()})


def test_grade_valid_needs_every_list_entry_present_and_passing():
    res = _res(t__a="PASSED", t__b="PASSED", t__c="SKIPPED")
    assert grade(res, 0, ["t::a"], ["t::b", "t::c"]).valid  # a skipped P2P is maintained
    g = grade(res, 0, ["t::a", "t::missing"], ["t::b"])
    assert not g.valid and g.reason == "test_failed" and g.fail_to_pass.missing == ["t::missing"]
    g = grade(res, 0, ["t::c"], [])  # a skipped F2P is not a pass (SWE-bench 4.x got this wrong)
    assert not g.valid and g.fail_to_pass.failure == ["t::c"]


def test_grade_empty_fail_to_pass_is_not_valid():
    g = grade(_res(t__a="PASSED"), 0, [], ["t::a"])
    assert not g.valid and g.reason == "test_failed" and "empty" in g.detail


def test_grade_suite_must_have_run():
    empty = ParseResult(parser="pytest")
    assert grade(empty, 0, ["t::a"], []).reason == "no_tests_ran"
    assert grade(_res(t__a="PASSED"), None, ["t::a"], []).reason == "no_tests_ran"  # killed
    assert grade(_res(t__a="PASSED"), 4, ["t::a"], []).reason == "no_tests_ran"  # usage error
    interrupted = _res(t__a="PASSED")
    interrupted.interrupted = True
    assert grade(interrupted, 0, ["t::a"], []).reason == "no_tests_ran"


def test_grade_forged_pass_lines_with_failing_exit_code():
    # the log says everything passed but the runner exited 1: do not trust the log (SWE-bench PR #620)
    g = grade(_res(t__a="PASSED"), 1, ["t::a"], [])
    assert not g.valid and g.reason == "no_tests_ran" and "disagree" in g.detail


def test_check_fails_before():
    assert check_fails_before({"t::a": "FAILED"}, ["t::a"]).ok
    assert check_fails_before({}, ["t::a"]).ok  # absent before = not passing
    assert not check_fails_before({"t::a": "XFAIL"}, ["t::a"]).ok
    fb = check_fails_before({"t::a": "PASSED", "t::b": "ERROR"}, ["t::a", "t::b"])
    assert not fb.ok and fb.passing_before == ["t::a"]
