"""The reference's (`verifiers` 0.3.1) own tests, run against `envs`.

Porting an environment from the reference should mean changing an import; this
suite measures it with the reference's test files, kept as they are (MIT
licence, LICENSE.verifiers). `verifiers` and the submodules they import are
aliased to our modules here; the fixtures are the reference conftest's ones
these files use. Each test file copied here passes in full."""

from __future__ import annotations

import importlib
import re
import sys
import types

import pytest

import envs

_ALIASES = {
    "verifiers": "envs",
    "verifiers.types": "envs.types",
    "verifiers.errors": "envs.errors",
    "verifiers.utils.tool_utils": "envs.tool_schema",
    "verifiers.utils.logging_utils": "envs.logging_utils",
    "verifiers.clients": "envs.clients",
    "verifiers.clients.client": "envs.clients.base",
    "verifiers.envs.env_group": "envs.env_group",
}


def _install_aliases() -> None:
    for alias, target in _ALIASES.items():
        sys.modules[alias] = importlib.import_module(target)
    for alias in list(_ALIASES):  # parents of aliased submodules that have no twin
        parts = alias.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in sys.modules:
                sys.modules[parent] = types.ModuleType(parent)


_install_aliases()


@pytest.fixture
def basic_parser():
    return envs.Parser()


@pytest.fixture
def xml_parser():
    return envs.XMLParser(fields=["reasoning", "answer"], answer_field="answer")


@pytest.fixture
def xml_parser_with_alternatives():
    return envs.XMLParser(fields=["reasoning", ("code", "answer")], answer_field="answer")


@pytest.fixture
def maybe_think_parser():
    return envs.MaybeThinkParser()


@pytest.fixture
def think_parser():
    return envs.ThinkParser()


@pytest.fixture
def think_parser_with_extractor():
    def extract_boxed(text):
        match = re.search(r"\\boxed\{([^}]+)\}", text)
        return match.group(1) if match else text

    return envs.ThinkParser(extract_fn=extract_boxed)
