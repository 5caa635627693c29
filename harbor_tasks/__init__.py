"""Harbor tasks in our stack: Harbor-format task directories (task.toml,
instruction.md, environment/Dockerfile, tests/test.sh, solution/solve.sh) read
(`task`, `config`), their image and sandbox (`sandbox`), Harbor's oracle and
verifier phases with its reward parsing (`phases`), the agent eval (`env`:
`HarborEnv`), the oracle gate (`gate`: `HarborGateEnv`, what vf-swe-debug runs
for `harbor:<dir>`) and the verdicts as JSON for comparison with Harbor's own
run (`verdicts`). Depends on envs and sandboxes only. See docs/harbor-tasks.md.

    vf-sandbox eval harbor-tasks -a '{"dataset": "examples/harbor_tasks"}' -m MODEL   # an agent
    vf-swe-debug harbor:examples/harbor_tasks                                         # the oracle gate
"""

from __future__ import annotations

from typing import Any

PREFIX = "harbor:"


def tasks_path(dataset: str) -> str:
    """The directory of a `harbor:<dir>` dataset (the prefix is optional here)."""
    return dataset[len(PREFIX):] if dataset.startswith(PREFIX) else dataset


def load_environment(dataset: str | None = None, task_names: list[str] | str | None = None,
                     debug_step: str | None = None, **kwargs: Any) -> Any:
    """`vf-sandbox eval harbor-tasks -a '{"dataset": DIR}'`: `HarborEnv` (an agent on the
    tasks under DIR: one task directory or a directory of them). With `debug_step`
    ("oracle" or "none"), the no-model gate `HarborGateEnv` instead (vf-swe-debug's
    `harbor:DIR`). `task_names`: only these tasks (directory names). Tasks whose
    task.toml cannot be read are the run's `input_errors`."""
    from sandboxes import UsageError

    from .task import load_tasks

    if not dataset:
        raise UsageError("harbor-tasks needs a dataset: a Harbor task directory or a directory of them")
    names = task_names.replace(",", " ").split() if isinstance(task_names, str) else task_names
    try:
        tasks, errors = load_tasks(tasks_path(dataset), names or None)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    input_errors = [{"name": e.name, "type": "malformed_task", "message": f"{e.type}: {e.message}"} for e in errors]
    if debug_step is not None:
        from .gate import HarborGateEnv

        gate_keys = ("rollout_isolation", "isolation", "output_tail_chars", "backend", "backend_options")
        return HarborGateEnv(tasks, debug_step=debug_step, input_errors=input_errors,  # type: ignore[arg-type]
                             **{k: v for k, v in kwargs.items() if k in gate_keys})
    from .env import HarborEnv

    return HarborEnv(tasks, input_errors=input_errors, **kwargs)
