"""Why a run failed, in the reference dashboard's terms: a failure category and
the next thing to try, read from the run's recorded error (and its rows' error
kinds). Shown by `vf-sandbox runs show` and the dashboard for `failed` runs
(and for runs stopped by their time limit).

Categories: environment code error, missing secret / API key, missing
permission, timeout, model API, sandbox infrastructure, configuration,
process vanished.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from runs.registry import RunRecord, resume_command


class Diagnosis(BaseModel):
    """A failed run's category and hint (crosses to the dashboard as JSON)."""

    category: str
    hint: str


_INFRA_NAMES = ("InfraError", "BackendUnavailable", "SandboxCreateError", "SandboxNotRunning", "AgentError",
                "ServerStartError")
_RULES: list[tuple[str, re.Pattern[str], str]] = [
    ("missing secret / API key",
     re.compile(r"missing environment variable|refused the API key \(401|\(not set\)|MissingKeyError", re.I),
     "set the variable named in the error (`export NAME=...`), or name another one with -k; "
     "then run again: vf-sandbox eval --from-run {id}"),
    ("missing permission",
     re.compile(r"refused the API key \(403|PermissionError|permission denied|PermissionDenied|not permitted", re.I),
     "the process lacks a permission: check access to the Docker socket (the docker group), file modes "
     "of the paths involved, or the API key's scope"),
    ("model API",
     re.compile(r"model API|model endpoint|TransientModelError|ModelError|ModelAuthError", re.I),
     "check that the model server is up at the URL in the error (`vf-sandbox runs logs {id}` shows every "
     "retry); for rate limits lower -c; retry with --max-retries N"),
    ("timeout",
     re.compile(r"timeout after [\d.]+ minute|TimeoutError", re.I),
     "the run hit its time limit: raise --timeout-minutes, evaluate fewer examples (-n/-r) or raise -c; "
     "finished groups are kept: vf-sandbox eval --resume {id}"),
    ("sandbox infrastructure",
     re.compile(r"infrastructure errors|" + "|".join(_INFRA_NAMES)),
     "check the sandbox backend (`docker info`, `vf-sandbox sandboxes ls`); transient failures pass with "
     "--max-retries N"),
    ("configuration",
     re.compile(r"unknown environment|EnvNotFoundError|ConfigError|UsageError|load_environment\(\) of|"
                r"not an http|ImageNotFound|BackendNotFound", re.I),
     "fix the command line or config named in the error (`vf-sandbox eval --help`)"),
]


_MODEL_HINT = next(h for c, _, h in _RULES if c == "model API")
_TIMEOUT, _TIMEOUT_HINT = next((p, h) for c, p, h in _RULES if c == "timeout")


def diagnose(rec: RunRecord, summary: dict[str, Any] | None = None) -> Diagnosis | None:
    """The failure category and hint of a failed run, or of a run stopped by its
    time limit (--timeout-minutes); None for other runs."""
    if rec.status == "stopped" and _TIMEOUT.search(rec.error or ""):
        return Diagnosis(category="timeout", hint=_TIMEOUT_HINT.format(id=rec.id))
    if rec.vanished and rec.status in ("failed", "incomplete"):
        return Diagnosis(category="process vanished",
                         hint="the run's process was killed (SIGKILL, out of memory, reboot); check memory "
                              f"limits, then continue it: {resume_command(rec)}")
    if rec.status != "failed":
        return None
    text = rec.error or ""
    for category, pattern, hint in _RULES:
        if pattern.search(text):
            return Diagnosis(category=category, hint=hint.format(id=rec.id))
    if rec.error_kind == "usage":  # refused for bad usage (an unknown image, endpoint, flag...): not the env's code
        return Diagnosis(category="configuration", hint=next(h for c, _, h in _RULES if c == "configuration"))
    kinds = (summary or {}).get("errors_by_kind") or {}
    if kinds.get("model") and kinds.get("model") >= max(kinds.values()):
        return Diagnosis(category="model API", hint=_MODEL_HINT.format(id=rec.id))
    return Diagnosis(category="environment code error",
                     hint=f"an exception in the environment's code: read its traceback with "
                          f"`vf-sandbox runs logs {rec.id}` (or the sample's error details), fix the "
                          f"environment, then run again: vf-sandbox eval --from-run {rec.id}")
