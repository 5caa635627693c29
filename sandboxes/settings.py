"""Every `VF_*` environment variable vf-sandbox reads, in one place.

`ProcessSettings.from_env()` reads them (and nothing else) from the process
environment when it is called; no module of the package reads the environment
when it is imported (`tests/test_settings.py` imports them all with a spying
`os.environ`). Code that needs one of these values calls `from_env()` where the
value is used (or is handed a `ProcessSettings` made once by its caller), and
the field's description is the variable's documentation: `docs/settings.md` is
rendered from this module (`reference_markdown()`; a test keeps it current).

Variables vf-sandbox *sets* for the programs it starts (never read back from our
own process environment, except where noted) are listed in `SET_FOR_PROGRAMS`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
    sandbox_run_id: str | None = Field(None, description="The run id this process labels its sandboxes with (`vf-sandbox.run-id`), so `runs stop` and the reaper find them. `vf-sandbox eval` / `vf-swe-debug` read it once at start into the run definition (`EvalConfig.sandbox_run_id`), which carries it to their `-w` workers and Ray actors. Default: a fresh 12-hex id per process.")
    run_id: str | None = Field(None, description="The registry id the first new run of a `vf-sandbox eval` / `vf-swe-debug` takes (set by the dashboard when it starts one); read once at start into the run definition (`EvalConfig.run_id`).")
    runs_db: str | None = Field(None, description="The run registry's SQLite file (`vf-sandbox eval` / `vf-swe-debug` read it once at start into the run definition, `EvalConfig.runs_db`). Default: `runs.db` in the state directory.")
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
    registry_username: str | None = Field(None, description="User name for image registry pushes/pulls (with VF_REGISTRY_PASSWORD).")
    registry_password: SecretStr | None = Field(None, description="Password for image registry pushes/pulls (a SecretStr: never printed or recorded).")

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

    # -- resolved values (the defaults of the descriptions above)
    def cache_root(self) -> Path:
        return Path(self.sandbox_cache).expanduser() if self.sandbox_cache else Path.home() / ".cache" / "vf-sandbox"

    def wheelhouse_root(self) -> Path:
        return Path(self.sandbox_wheelhouse).expanduser() if self.sandbox_wheelhouse else self.cache_root() / "wheelhouse"


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
