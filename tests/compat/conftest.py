"""The reference's (`verifiers` 0.3.1) own tests, run against `envs`.

Porting an environment from the reference should mean changing an import; this
suite measures it with the reference's test files, kept as they are (MIT
licence, LICENSE.verifiers). `verifiers` and the submodules they import are
aliased to our modules here (before reference_conftest.py, the reference's
own conftest, is imported for its fixtures). Each test file copied here
passes in full; the reference files that do not are listed with the reason
in docs/porting.md."""

from __future__ import annotations

import importlib
import sys
import types



_ALIASES = {
    "verifiers": "envs",
    "verifiers.types": "envs.types",
    "verifiers.errors": "envs.errors",
    "verifiers.utils.tool_utils": "envs.tool_schema",
    "verifiers.utils.logging_utils": "envs.logging_utils",
    "verifiers.clients": "envs.clients",
    "verifiers.clients.client": "envs.clients.base",
    "verifiers.clients.openai_chat_completions_client": "envs.clients.openai_clients",
    "verifiers.clients.openai_chat_completions_token_client": "envs.clients.openai_token_client",
    "verifiers.envs.env_group": "envs.env_group",
    "verifiers.utils.save_utils": "envs.outputs",
    "verifiers.rubrics": "envs.rubrics",
    "verifiers.rubrics.math_rubric": "envs.rubrics.math_rubric",
    "verifiers.utils.error_utils": "envs.errors",
    "verifiers.envs.environment": "envs.environment",
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


from . import reference_conftest as _reference_conftest  # noqa: E402
from .reference_conftest import *  # noqa: E402,F401,F403  (the reference's fixtures, kept as they are)

# Reference tests that fail here on purpose, each with its reason (the documented
# differences; docs/compat.md says the same). They run as strict xfails: one that starts
# passing fails the suite, so this list stays true.
_ENV_DIFF_COMPLETION = ("completion mode: our completion is a string, as the spec's `Messages = str | list`; "
                        "the reference returns messages")
_DIFF_PRIVATE = "tests a private helper of the reference ({}) that we do not have under that name"
DIFFERENCES: dict[str, str] = {
    "test_singleturn_env.py::TestSingleTurnEnv::test_rollout_completion_format": _ENV_DIFF_COMPLETION,
    "test_singleturn_env.py::TestSingleTurnEnv::test_different_message_types_in_same_env": _ENV_DIFF_COMPLETION,
    "test_multiturn_env.py::TestMultiTurnEnv::test_completion_format_multiturn": _ENV_DIFF_COMPLETION,
    "test_environment.py::TestEnvironmentBase::test_environment_no_datasets_raises_error":
        "an env without datasets is allowed (a trainer gives generate() its own inputs); the reference raises",
    "test_environment.py::TestEnvironmentBase::test_init_state_rejects_plain_string_task":
        "`task` is a string label of the row (the spec's; EnvGroup's env name); the reference's newer "
        "JSON task payloads in `task` are not taken",
    "test_environment.py::TestEnvironmentBase::test_init_state_accepts_json_task_payload":
        "`task` is a string label of the row (the spec's); a JSON task payload is not unpacked",
    "test_environment.py::TestEnvironmentBase::test_generate_updates_metadata":
        "metadata has the spec's `time_ms`, not the reference's `time`",
    "test_environment.py::TestEnvironmentBase::test_generate_metadata_without_scoring":
        "metadata has the spec's `time_ms`, not the reference's `time`",
    "test_environment.py::TestRenderStopErrorHandling::test_render_stop_with_vf_error":
        _DIFF_PRIVATE.format("Environment._render_stop"),
    "test_environment.py::TestRenderStopErrorHandling::test_render_stop_with_regular_exception":
        _DIFF_PRIVATE.format("Environment._render_stop"),
    "test_environment.py::TestMaybeRetry::test_retry_after_retryable_error":
        _DIFF_PRIVATE.format("verifiers.utils.response_utils.parse_response_message, used in its rollout"),
    "test_environment.py::TestMaybeRetry::test_retries_serialized_infra_error_subclass":
        _DIFF_PRIVATE.format("verifiers.utils.async_utils.maybe_retry"),
    "test_environment.py::TestMaybeRetry::test_no_retry_after_non_retryable_error":
        "a row's `error` is the spec's `str | None` ('ToolError: ...'; typed details in `error_info`), "
        "not the reference's newer ErrorData dict",
    "test_environment.py::TestMaybeRetry::test_error_in_state_after_max_retries_exhausted":
        "a row's `error` is the spec's `str | None` ('InfraError: ...'; typed details in `error_info`), "
        "not the reference's newer ErrorData dict",
}


def pytest_collection_modifyitems(config, items):
    import pytest

    here = __file__.rsplit("/", 1)[0] + "/"
    for item in items:
        path = str(item.fspath)
        if not path.startswith(here):
            continue
        key = path[len(here):] + "::" + item.nodeid.split("::", 1)[1]
        if key in DIFFERENCES:
            item.add_marker(pytest.mark.xfail(reason=DIFFERENCES[key], strict=True))


# the reference's test files import helpers from their conftest as `tests.conftest`
sys.modules.setdefault("tests", types.ModuleType("tests"))
sys.modules.setdefault("tests.conftest", _reference_conftest)
