"""The `swebench` package (the SWE-bench harness, 4.x layout) used as a library:
per-repo test commands and test directives from `MAP_REPO_VERSION_TO_SPECS`, and its
log parsers (`MAP_REPO_TO_PARSER`, by repo or by function name) under our stricter
grading. Imported lazily: `import swebench` costs seconds, so only rows that need it
pay (install it with the `swe` extra; `scripts/setup.sh` does).

Parser names a row may give as `log_parser`:
- `swebench:<owner/repo>` — the harness's parser for that repo (e.g. `swebench:django/django`);
- `parse_log_<name>` — a harness parser function by name (SWE-rebench's `install_config.log_parser`).
The harness's parser yields the statuses; our pytest/unittest parsers read the same log
(ANSI colour removed first) for the evidence the harness does not look at: collection
errors, interruption and the runner's own counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from .parsers import ParseResult, TestStatus, parse_pytest, parse_unittest, strip_ansi

SWEBENCH_PREFIX = "swebench:"
CONDA_ACTIVATE = "source /opt/miniconda3/bin/activate && conda activate testbed"
"""What the harness's eval script does before the tests in its images."""


class SwebenchMissing(RuntimeError):
    """The `swebench` package is not installed (the `swe` extra)."""


def _require() -> Any:
    try:
        import swebench  # noqa: F401
        from swebench.harness import constants, log_parsers
    except ImportError as exc:  # pragma: no cover - installed by setup.sh
        raise SwebenchMissing(f"the `swebench` package is needed for this row ({exc}); install the `swe` extra: "
                              "uv pip install -e '.[swe]' (scripts/setup.sh does)") from None
    return constants, log_parsers


def is_harness_parser_name(name: str) -> bool:
    return name.startswith(SWEBENCH_PREFIX) or name.startswith("parse_log_")


@functools.cache
def _parser_functions() -> dict[str, Callable[..., dict[str, str]]]:
    """Every harness parser function by name, plus `swebench:<repo>` for each repo."""
    _, log_parsers = _require()
    by_name: dict[str, Callable[..., dict[str, str]]] = {}
    for repo, fn in log_parsers.MAP_REPO_TO_PARSER.items():
        by_name[SWEBENCH_PREFIX + repo] = fn
        by_name.setdefault(fn.__name__, fn)
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(log_parsers.__path__):
        m = importlib.import_module(f"{log_parsers.__name__}.{mod.name}")
        for attr, fn in vars(m).items():
            if attr.startswith("parse_log_") and callable(fn):
                by_name.setdefault(attr, fn)
    return by_name


def harness_parser_names() -> frozenset[str]:
    return frozenset(_parser_functions())


def harness_parser(name: str) -> Callable[[str], ParseResult] | None:
    """Our parser for a harness parser name, or None when the harness has none of that name."""
    fn = _parser_functions().get(name)
    if fn is None:
        return None

    def parse(log: str) -> ParseResult:
        clean = strip_ansi(log)
        try:
            raw = fn(clean, None)  # the python parsers never read their test_spec argument
        except Exception:  # noqa: BLE001 - a parser crash means: nothing parsed
            raw = {}
        res = ParseResult(parser=name)
        for tid, st in (raw or {}).items():
            try:
                res.statuses[tid] = TestStatus(st)
            except ValueError:
                continue
        # the evidence the harness ignores, read from the same log by the runner's own format
        evidence = parse_unittest(clean) if "Ran " in clean and "::" not in clean else parse_pytest(clean)
        res.collection_errors = evidence.collection_errors
        res.interrupted = evidence.interrupted
        res.summary = evidence.summary
        return res

    return parse


@functools.cache
def _specs() -> Mapping[str, Mapping[str, Any]]:
    constants, _ = _require()
    return constants.MAP_REPO_VERSION_TO_SPECS


def repo_spec(repo: str, version: Any) -> Mapping[str, Any] | None:
    """The harness's install/test spec for `repo` at `version`, when it has one."""
    try:
        return _specs().get(repo, {}).get(str(version)) if repo and version is not None else None
    except SwebenchMissing:
        return None


def test_directives(row: Mapping[str, Any]) -> list[str]:
    """What the harness passes its test command: the test files of the test patch
    (Django: dotted test modules)."""
    from swebench.harness.test_spec.python import get_test_directives

    return list(get_test_directives({"repo": row.get("repo", ""), "test_patch": row.get("test_patch", "")}))


def apply_repo_spec(row: dict[str, Any]) -> dict[str, Any]:
    """Fill a SWE-bench-shaped row's test command, directives and parser from the
    harness's per-repo specs, unless the row gives its own (`test_cmd` / `log_parser`)."""
    spec = repo_spec(str(row.get("repo") or ""), row.get("version"))
    if not spec or not spec.get("test_cmd"):
        return row
    out = dict(row)
    if "test_cmd" not in row:
        test_cmd = spec["test_cmd"]
        test_cmd = " && ".join(test_cmd) if isinstance(test_cmd, list) else test_cmd
        # the harness's eval script: activate the env, its eval_commands, re-install the
        # package (the gold patch may change compiled code), then the tests; like the
        # harness's (no `set -e`) a failed step does not stop the tests
        pre = [CONDA_ACTIVATE, *spec.get("eval_commands", []), *([spec["install"]] if spec.get("install") else [])]
        out["test_cmd"] = "; ".join([*pre, test_cmd])
        if "test_directives" not in row:
            out["test_directives"] = test_directives(row)
    if "log_parser" not in row:
        out["log_parser"] = SWEBENCH_PREFIX + str(row["repo"])
    return out
