"""What a row's `log_parser` names: one of ours (`swe_debug.parsers`: pytest, unittest,
r2e-pytest, or registered) or one of the `swebench` package's (`swebench:<owner/repo>`,
`parse_log_<name>`: `swe_debug.harness_lib`, imported only for those names).
"""

from __future__ import annotations

from .parsers import Parser, known_parsers
from .parsers import get_parser as _ours


def _lookup(name: str) -> Parser | None:
    if name in known_parsers():
        return _ours(name)
    from .harness_lib import harness_parser, is_harness_parser_name

    return harness_parser(name) if is_harness_parser_name(name) else None


def has_parser(name: str) -> bool:
    """Whether `log_parser: name` resolves (raises harness_lib.SwebenchMissing for one of
    the harness's names when the `swebench` package is not installed)."""
    return _lookup(name) is not None


def get_parser(name: str) -> Parser:
    """The parser `name` names (ConfigError when none)."""
    parser = _lookup(name)
    if parser is None:
        from sandboxes.errors import ConfigError

        raise ConfigError(f"unknown log parser {name!r}; known: {', '.join(sorted(known_parsers()))} "
                          "and the swebench package's (swebench:<owner/repo>, parse_log_<name>)")
    return parser
