"""Test-log parsers: turn a test run's output into {test id: status} plus the
evidence that the suite really ran (collection errors, interruption, the
runner's own summary counts). Pluggable per task by name (`get_parser`).

pytest: the verbose `id STATUS [ nn%]` lines and the `-rA` short summary
(`STATUS id[ - message]`); ids may contain spaces and ` - ` inside their
parametrisation brackets. unittest: `-v` lines `name (module.Class[.name]) ... ok`
including docstring second lines and results printed after test output.
ANSI colour is stripped first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum

from pydantic import BaseModel, Field


class TestStatus(str, Enum):
    __test__ = False  # not a pytest test class
    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


PASSING = frozenset({TestStatus.PASSED, TestStatus.XFAIL})
FAILING = frozenset({TestStatus.FAILED, TestStatus.ERROR, TestStatus.XPASS})


class ParseResult(BaseModel):
    """What a log says about a run."""

    parser: str
    statuses: dict[str, TestStatus] = Field(default_factory=dict)
    collection_errors: list[str] = Field(default_factory=list, description="Files/modules that failed to import or collect.")
    interrupted: bool = Field(False, description="The runner says it stopped early (collection error, Ctrl-C, internal error).")
    summary: dict[str, int] = Field(default_factory=dict, description="The runner's own final counts, when printed.")
    ran_exit_codes: tuple[int, ...] = Field((0, 1), description="Exit codes that mean 'the tests ran'.")

    @property
    def empty(self) -> bool:
        return not self.statuses

    def count(self, *statuses: TestStatus) -> int:
        return sum(1 for s in self.statuses.values() if s in statuses)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CTRL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences and stray control characters; normalise CRLF."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CTRL.sub("", _ANSI.sub("", text))


# ---------------------------------------------------------------------------- pytest

_STATUS_WORDS = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
_PY_VERBOSE = re.compile(rf"^(?P<id>\S.*?::.+?) (?P<st>{_STATUS_WORDS})(?: \(.*\))?(?:\s+\[\s*\d+%\])?\s*$")
_PY_VERBOSE_XDIST = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] (?P<st>{_STATUS_WORDS}) (?P<id>\S.*?::.+?)\s*$")
_PY_SUMMARY = re.compile(rf"^(?P<st>{_STATUS_WORDS}) (?P<rest>.+?)\s*$")
_PY_FINAL = re.compile(r"^=+ (?P<body>.*?\b(?:passed|failed|error|errors|skipped|xfailed|xpassed|deselected|no tests ran)\b.*?) =+$")
_PY_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")
_PY_INTERRUPTED = re.compile(r"^!+ .*(Interrupted|KeyboardInterrupt|_pytest\.outcomes\.Exit|stopping after).* !+$")
_PY_INTERNAL = re.compile(r"^INTERNALERROR>")


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _summary_id(rest: str) -> str:
    """The node id of a short-summary line: the shortest bracket-balanced prefix
    that ends at ` - ` (the message separator) or at the end of the line."""
    start = 0
    while True:
        pos = rest.find(" - ", start)
        if pos < 0:
            return rest
        head = rest[:pos]
        if _balanced(head) and ("[" not in head or head.endswith("]")):
            return head
        start = pos + 1


def parse_pytest(log: str) -> ParseResult:
    """Parse `pytest -rA [-v]` output."""
    res = ParseResult(parser="pytest")
    in_summary = False
    for raw in strip_ansi(log).split("\n"):
        line = raw.rstrip()
        if not line:
            continue
        if line.startswith("=") and "short test summary info" in line:
            in_summary = True
            continue
        if _PY_INTERRUPTED.match(line) or _PY_INTERNAL.match(line):
            res.interrupted = True
            continue
        m = _PY_FINAL.match(line)
        if m and line.startswith("="):
            in_summary = False
            body = m.group("body")
            for n, word in _PY_COUNT.findall(body):
                key = {"error": "errors", "warning": "warnings"}.get(word, word)
                res.summary[key] = int(n)
            if "no tests ran" in body:
                res.summary.setdefault("passed", 0)
            continue
        if in_summary or line.startswith(tuple(_STATUS_WORDS.split("|"))):
            ms = _PY_SUMMARY.match(line)
            if ms:
                st, rest = TestStatus(ms.group("st")), ms.group("rest")
                if st is TestStatus.SKIPPED and rest.startswith("["):
                    continue  # "SKIPPED [1] file.py:12: reason" names no test
                if st is TestStatus.PASSED:
                    test_id = rest
                else:
                    test_id = _summary_id(rest)
                if "::" not in test_id:
                    # "ERROR tests/test_x.py - ImportError": the module did not collect
                    if st is TestStatus.ERROR and test_id not in res.collection_errors:
                        res.collection_errors.append(test_id)
                    continue
                _set(res, test_id, st)
                continue
        mv = _PY_VERBOSE.match(line) or _PY_VERBOSE_XDIST.match(line)
        if mv:
            _set(res, mv.group("id"), TestStatus(mv.group("st")))
    if "errors" in res.summary and "error during collection" in log:
        res.interrupted = True
    return res


def _set(res: ParseResult, test_id: str, st: TestStatus) -> None:
    """Record a status; an ERROR at teardown after a PASS (two lines for one id) keeps the worse one."""
    prev = res.statuses.get(test_id)
    if prev is None or st in FAILING or (prev not in FAILING and st is not TestStatus.PASSED):
        res.statuses[test_id] = st


# ---------------------------------------------------------------------------- unittest

_UT_HEAD = re.compile(r"^(?P<name>[A-Za-z_]\w*) \((?P<where>[\w.]+)\)(?P<rest>.*)$")
_UT_RESULT_TAIL = re.compile(
    r"(?:^|\.\.\. ?)(?P<st>ok|FAIL|ERROR|skipped(?: .*)?|expected failure|unexpected success)\s*$"
)
_UT_HEADER = re.compile(r"^(?P<st>FAIL|ERROR): (?P<name>[A-Za-z_]\w*) \((?P<where>[\w.]+)\)")
_UT_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s$")
_UT_FINAL = re.compile(r"^(OK|FAILED)(?: \((?P<body>.*)\))?$")
_UT_STATUS = {
    "ok": TestStatus.PASSED,
    "FAIL": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "expected failure": TestStatus.XFAIL,
    "unexpected success": TestStatus.XPASS,
}


def _ut_id(name: str, where: str) -> str:
    """`module.Class.test` whether Python printed `(module.Class)` (<3.11) or `(module.Class.test)`."""
    return where if where.endswith("." + name) else f"{where}.{name}"


def parse_unittest(log: str) -> ParseResult:
    """Parse `python -m unittest -v` output (results usually on stderr: run with 2>&1)."""
    res = ParseResult(parser="unittest")
    pending: str | None = None  # a test whose result is on a later line
    for raw in strip_ansi(log).split("\n"):
        line = raw.rstrip()
        if not line:
            continue
        mh = _UT_HEADER.match(line)
        if mh:
            _record_ut_header(res, mh)
            pending = None
            continue
        m = _UT_HEAD.match(line)
        if m:
            pending = _record_ut_head(res, m)
            continue
        if pending is not None:
            mr = _UT_RESULT_TAIL.search(line)
            if mr:
                _record_ut(res, pending, mr.group("st"))
                pending = None
                continue
        _record_ut_ending(res, line)
    return res


def _record_ut_header(res: ParseResult, mh: re.Match[str]) -> None:
    """A `FAIL: name (where)` / `ERROR: ...` section header: a class/module fixture error marks its
    class or module, a loader failure is a collection error, else the test's status."""
    name, where = mh.group("name"), mh.group("where")
    if name in ("setUpClass", "tearDownClass", "setUpModule", "tearDownModule"):
        res.statuses[where] = TestStatus.ERROR
    elif where.startswith("unittest.loader"):
        if name not in res.collection_errors:
            res.collection_errors.append(name)
    else:
        _set(res, _ut_id(name, where), TestStatus(mh.group("st").replace("FAIL", "FAILED")))


def _record_ut_head(res: ParseResult, m: re.Match[str]) -> str | None:
    """A verbose `name (where) ...` line: record its result when on the same line, else return the
    test id whose result is still to come. A loader `_FailedTest` is a collection error (None)."""
    name, where = m.group("name"), m.group("where")
    if where.startswith("unittest.loader"):  # _FailedTest: an import error
        if name not in res.collection_errors:
            res.collection_errors.append(name)
        return None
    tid = _ut_id(name, where)
    rest = m.group("rest")
    mr = _UT_RESULT_TAIL.search(rest) if "..." in rest else None
    if mr:
        _record_ut(res, tid, mr.group("st"))
        return None
    return tid


def _record_ut_ending(res: ParseResult, line: str) -> None:
    """The run's closing lines: `Ran N tests`, then `OK`/`FAILED (k=v, ...)` counts; a KeyboardInterrupt."""
    mran = _UT_RAN.match(line)
    if mran:
        res.summary["ran"] = int(mran.group(1))
        return
    mf = _UT_FINAL.match(line)
    if mf and "ran" in res.summary:
        for part in (mf.group("body") or "").split(","):
            k, _, v = part.strip().partition("=")
            if v.isdigit():
                res.summary[k] = int(v)
        return
    if line.startswith("KeyboardInterrupt"):
        res.interrupted = True


def _record_ut(res: ParseResult, tid: str, word: str) -> None:
    st = TestStatus.SKIPPED if word.startswith("skipped") else _UT_STATUS[word]
    _set(res, tid, st)


# ---------------------------------------------------------------------------- registry

def parse_r2e_pytest(log: str) -> ParseResult:
    """pytest output with ids in R2E-Gym's form: the node id without its file, `::` → `.`
    (`tests/test_x.py::TestA::test_b` → `TestA.test_b`), as in R2E's expected_output_json."""
    res = parse_pytest(log)
    res.parser = "r2e-pytest"
    res.statuses = {(".".join(tid.split("::")[1:]) or tid): st for tid, st in res.statuses.items()}
    return res


Parser = Callable[[str], ParseResult]
_PARSERS: dict[str, Parser] = {"pytest": parse_pytest, "unittest": parse_unittest, "r2e-pytest": parse_r2e_pytest}


def register_parser(name: str, parser: Parser) -> None:
    """Make a parser available to instances by `log_parser: name`."""
    _PARSERS[name] = parser


def known_parsers() -> frozenset[str]:
    """The names registered here (the `swebench` package's come on top: swe_debug.parser_names)."""
    return frozenset(_PARSERS)


def get_parser(name: str) -> Parser:
    try:
        return _PARSERS[name]
    except KeyError:
        from sandboxes.errors import ConfigError

        raise ConfigError(f"unknown log parser {name!r}; known: {', '.join(sorted(_PARSERS))}") from None
