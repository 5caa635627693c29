"""Every `VF_*` environment variable vf-sandbox reads, in one place, and how the
values reach the code that uses them.

Read once, at the start: `ProcessSettings.from_env()` reads the variables (and
nothing else) from the process environment. Only a process's entry calls it (the
`vf-sandbox` CLI, `vf-swe-debug`, a `-w` worker, a hosted job's driver and its Ray
actors, ...; `tests/test_settings_passed_down.py` lists them); no module reads the
environment when it is imported (`tests/test_settings.py`) or where a value is used.

Passed down:
- across process and machine boundaries inside the run definition
  (`EvalConfig.settings`, with the run's ids in `EvalConfig.run_id` /
  `sandbox_run_id` / `runs_db`): a `-w` worker or Ray actor uses the definition's,
  whatever its own environment says. Never recorded (`public_args` leaves them out).
  The registry credentials are never serialised (`CREDENTIALS`, excluded from every
  dump): like the model API keys they are secrets by name; a `-w` worker gets its
  runner's beside the definition (its start arguments), a Ray actor's entry reads its
  environment, a hosted job gets them as job environment variables with the model keys;
- inside a process explicitly (backend options, image builders, run registry
  functions take them as arguments) or through one scope: `use(settings)` makes
  them `current()` for the code it runs (a `contextvars.ContextVar`: it follows
  asyncio tasks and `asyncio.to_thread`), for code the runner does not call
  directly (environments loaded by name, their package images and wheelhouse).
  The scope also fixes the sandboxes' run label (`sandbox_run_id`, a fresh id when
  the settings name none): `sandboxes.labels.run_id()` is `current().sandbox_run_id`.

Outside any scope (library use from Python, no entry) `current()` reads the
environment on each call, so a value a caller sets in `os.environ` before a call
applies to it; the run label there is `$VF_SANDBOX_RUN_ID`, else one fresh id per
process.

The field's description is the variable's documentation: `docs/settings.md` is
rendered from this module (`reference_markdown()`; a test keeps it current).
Variables vf-sandbox *sets* for the programs it starts are listed in
`SET_FOR_PROGRAMS`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

PREFIX = "VF_"


def _var(field: str) -> str:
    return PREFIX + field.upper()


class ProcessSettings(BaseModel):
    """What the process environment says, read once by `from_env()`. A field is the
    variable `VF_<FIELD NAME IN UPPER CASE>`; None (or an empty value) means unset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # -- runs and the run registry
    sandbox_run_id: str | None = Field(None, description="The run id this process labels its sandboxes with (`vf-sandbox.run-id`), so `runs stop` and the reaper find them. `vf-sandbox eval` / `vf-swe-debug` read it once at start into the run definition (`EvalConfig.sandbox_run_id`), which carries it to their `-w` workers and Ray actors (`sandboxes.labels.run_id()` is the running settings scope's). Default: a fresh 12-hex id per scope (per process outside any).")
    run_id: str | None = Field(None, description="The registry id the first new run of a `vf-sandbox eval` / `vf-swe-debug` takes (set by the dashboard when it starts one); read once at start into the run definition (`EvalConfig.run_id`).")
    runs_db: str | None = Field(None, description="The run registry's SQLite file (`vf-sandbox eval` / `vf-swe-debug` read it once at start into the run definition, `EvalConfig.runs_db`; `vf-sandbox runs --db` overrides it for its command). Default: `runs.db` in the state directory.")
    state_dir: str | None = Field(None, description="The state directory (run registry). Default: `$XDG_STATE_HOME/vf-sandbox`, else `~/.local/state/vf-sandbox`.")
    log_level: str | None = Field(None, description="Level of the `envs` logger when `setup_logging` is given none. Default: INFO.")
    # -- images and caches
    sandbox_images: str | None = Field(None, description="Directory of the image recipes (`recipes.toml`). Default: the repository's `images/`.")
    sandbox_cache: str | None = Field(None, description="The one cache root: downloaded wheels in `<root>/wheelhouse/<key>` (`sandboxes/wheels.py`), for derived Python images (PythonEnv packages), image recipes, OpenEnv dependency images and SWE environment layers. Default: `~/.cache/vf-sandbox`.")
    sandbox_wheelhouse: str | None = Field(None, description="The wheelhouse directory itself (overrides `<VF_SANDBOX_CACHE>/wheelhouse`; `vf-sandbox openenv build --wheelhouse` overrides both for that build).")
    openenv_base_image: str | None = Field(None, description="Base image of OpenEnv dependency images. Default: `vf-sandbox/base:bookworm`.")
    swe_base_image: str | None = Field(None, description="Base image of SWE environment layers. Default: `vf-sandbox/base:bookworm`.")
    swe_cache: str | None = Field(None, description="When set, SWE environment layers' wheels go to `<dir>/wheels/<key>` instead of the one wheelhouse (as `ImageBuilder(cache_dir=...)` does). Default: unset.")
    swe_examples: str | None = Field(None, description="Where `python -m swe_debug.examples build` writes the example taskset (and where SWEDebugEnv looks for it). Default: the repository's `.cache/swe-examples`.")
    swe_pip: str | None = Field(None, description="The pip command (split on spaces) that downloads wheels on the host, for every wheelhouse download (`sandboxes/wheels.py`). Default: this interpreter's pip, else python3/python -m pip, else pip3/pip on PATH, else `uvx pip`.")
    # -- backends
    local_sandbox_dir: str | None = Field(None, description="Where the local backend makes its sandboxes' directories (its `base_dir` option wins). Default: `<tmp>/vf-sandbox-local`.")
    local_no_bwrap: str | None = Field(None, description="`1`: the local backend runs plain processes even where bubblewrap works.")
    k8s_context: str | None = Field(None, description="kubeconfig context of the Kubernetes backend (its `context` option wins). Default: the current context.")
    k8s_namespace: str | None = Field(None, description="Namespace of sandbox pods (its `namespace` option wins). Default: `default`.")
    k8s_runtime_class: str | None = Field(None, description="runtimeClassName of sandbox pods (its `runtime_class_name` option wins).")
    registry_username: str | None = Field(None, exclude=True, description="User name for image registry pushes/pulls (with VF_REGISTRY_PASSWORD). A credential: never serialised with the settings (a `-w` worker gets its runner's beside the definition; a Ray actor or hosted job reads its own environment).")
    registry_password: SecretStr | None = Field(None, exclude=True, description="Password for image registry pushes/pulls (a SecretStr: never printed, recorded or serialised; a `-w` worker gets its runner's beside the definition, a Ray actor reads its own environment, a hosted job gets it as a job environment variable).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProcessSettings:
        """The settings `environ` (default: `os.environ`, read now) holds; only `VF_*` keys are read."""
        env = os.environ if environ is None else environ
        return cls(**{name: env.get(_var(name)) or None for name in cls.model_fields})

    @staticmethod
    def variable(field: str) -> str:
        """The environment variable behind `field` (`sandbox_cache` -> `VF_SANDBOX_CACHE`)."""
        if field not in ProcessSettings.model_fields:
            raise KeyError(field)
        return _var(field)

    def with_credentials(self, source: ProcessSettings) -> ProcessSettings:
        """These settings with the credentials (`CREDENTIALS`) of `source` (a worker's entry:
        the definition's settings, its own environment's credentials)."""
        return self.model_copy(update={name: getattr(source, name) for name in CREDENTIALS})

    def credential_variables(self) -> dict[str, str]:
        """The credentials as environment variables (for a hosted job's runtime environment)."""
        out = {}
        if self.registry_username and self.registry_password:
            out[_var("registry_username")] = self.registry_username
            out[_var("registry_password")] = self.registry_password.get_secret_value()
        return out

    # -- resolved values (the defaults of the descriptions above)
    def cache_root(self) -> Path:
        return Path(self.sandbox_cache).expanduser() if self.sandbox_cache else Path.home() / ".cache" / "vf-sandbox"

    def wheelhouse_root(self) -> Path:
        return Path(self.sandbox_wheelhouse).expanduser() if self.sandbox_wheelhouse else self.cache_root() / "wheelhouse"


CREDENTIALS = ("registry_username", "registry_password")
"""Fields never serialised (`exclude=True`): they do not travel in a run definition."""

_SCOPE: contextvars.ContextVar[ProcessSettings | None] = contextvars.ContextVar("vf_process_settings", default=None)
_process_run_id: str | None = None
_process_run_id_lock = threading.Lock()


def fresh_run_id() -> str:
    """A new sandbox run label (12 hex)."""
    return uuid.uuid4().hex[:12]


def _own_run_id() -> str:
    """Outside any scope: one fresh label for the whole process, made on first use."""
    global _process_run_id
    with _process_run_id_lock:
        if _process_run_id is None:
            _process_run_id = fresh_run_id()
        return _process_run_id


def current() -> ProcessSettings:
    """The settings of the running scope (`use`); outside any, the process environment
    read now, labelled `$VF_SANDBOX_RUN_ID` or the process's own fresh id. Its
    `sandbox_run_id` is never None."""
    scoped = _SCOPE.get()
    if scoped is not None:
        return scoped
    env = ProcessSettings.from_env()
    return env if env.sandbox_run_id else env.model_copy(update={"sandbox_run_id": _own_run_id()})


@contextlib.contextmanager
def use(settings: ProcessSettings) -> Iterator[ProcessSettings]:
    """Make `settings` the `current()` ones for the code run inside (and the tasks and
    `to_thread` calls it starts); a fresh run label when they name none."""
    if not settings.sandbox_run_id:
        settings = settings.model_copy(update={"sandbox_run_id": fresh_run_id()})
    token = _SCOPE.set(settings)
    try:
        yield settings
    finally:
        _SCOPE.reset(token)


# Variables vf-sandbox sets for programs it starts (values for them, not settings of ours).
SET_FOR_PROGRAMS: dict[str, str] = {
    "VF_TASK_JSON": "The task (JSON) of a v1 harness command program (with OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL and ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY of the rollout's interception endpoint).",
    "VF_REPL_CWD": "Working directory of PythonEnv's in-sandbox REPL worker (read inside the sandbox by `sandboxes/programs/repl_worker.py`).",
    "VF_SANDBOX_MANAGED": "`1` in every Docker sandbox's environment: how `vf-sandbox sandboxes reap` recognises ours in containerd after an engine lost them.",
    "VF_RUN_ID, VF_RUNS_DB": "Set for the runs the dashboard starts (read by their command's entry as above; a hosted run's ids travel in its run definition instead).",
}


def reference_markdown() -> str:
    """The table of `docs/settings.md` (rendered from the field descriptions)."""
    rows = ["| variable | meaning |", "|---|---|"]
    rows += [f"| `{_var(name)}` | {f.description} |" for name, f in ProcessSettings.model_fields.items()]
    rows += ["", "Set by vf-sandbox for the programs it starts:", "", "| variable | meaning |", "|---|---|"]
    rows += [f"| `{name}` | {text} |" for name, text in SET_FOR_PROGRAMS.items()]
    return "\n".join(rows) + "\n"
