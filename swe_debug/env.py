"""`SWEDebugEnv`: the no-agent debugger as an environment. One rollout = one
instance, and no model is ever called: `setup_state` runs the whole debug
rollout (`swe_debug.debug.run_debug`), a stop condition ends the turn loop
before the first model turn, and the rubric's reward is 1 for a valid
instance. A sandbox failure (InfraError) is left in `state["error"]`, so the
environment's rollout retry re-runs it on a fresh sandbox; every other
outcome is a `reason` in `state["info"]["swe_debug"]`.
"""

from __future__ import annotations

from typing import Any, Literal

from envs.decorators import stop, teardown
from envs.multi_turn import MultiTurnEnv
from envs.rubrics.rubric import Rubric
from envs.types import Messages, State
from sandboxes import InfraError, find_infra_error, get_backend

from .debug import DebugOptions, run_debug, with_fails_before
from .runner import outcome_row
from .taskset import SandboxTaskSet


def _valid(state: State) -> float:
    return 1.0 if (state.get("info") or {}).get("swe_debug", {}).get("valid") else 0.0


class SWEDebugRubric(Rubric):
    """Reward 1 for a valid instance; phase timings as metrics (weight 0)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)

        def valid(state: State) -> float:
            return _valid(state)

        self.add_reward_func(valid, weight=1.0)


class SWEDebugEnv(MultiTurnEnv):
    """No-agent debugger for SWE-style SandboxTaskSet instances. It creates the task
    sandbox, optionally runs task setup, runs one debug step (none, gold_patch,
    command, or script), and optionally runs tests and scores the result."""

    requires_model = False  # for runners: no model endpoint is needed (nothing is ever sent to one)

    def __init__(
        self,
        taskset: SandboxTaskSet,
        dataset: Any = None,
        *,
        run_setup: bool = True,
        debug_step: Literal["none", "gold_patch", "command", "script"] = "gold_patch",
        run_tests: bool = True,
        debug_command: str | None = None,
        debug_script: str | None = None,
        debug_script_path: str | None = None,
        debug_timeout: int | None = None,
        test_timeout: int = 900,
        cpu_cores: int | None = None,
        memory_gb: int | None = None,
        disk_size_gb: int | None = None,
        labels: list[str] | None = None,
        timeout_seconds: float = 1800.0,
        output_tail_chars: int = 2000,
        backend: Any = None,
        check_fails_before: bool = False,
        **sandbox_kwargs: Any,
    ):
        self.taskset = taskset
        self.options = DebugOptions(
            run_setup=run_setup, debug_step=debug_step, run_tests=run_tests, debug_command=debug_command,
            debug_script=debug_script, debug_script_path=debug_script_path, debug_timeout=debug_timeout,
            test_timeout=test_timeout, cpu_cores=cpu_cores, memory_gb=memory_gb, disk_size_gb=disk_size_gb,
            labels=labels, timeout_seconds=timeout_seconds, output_tail_chars=output_tail_chars,
        )
        self.options.check()
        self.check_fails_before = check_fails_before
        self._backend_arg = backend
        self._backend = None
        self._by_id = {taskset.instance_id(i): i for i in taskset.instances()}
        if dataset is None:
            dataset = [self._row(i) for i in taskset.instances()]
        sandbox_kwargs.pop("timeout_seconds", None)
        super().__init__(dataset=dataset, rubric=SWEDebugRubric(), max_turns=1,
                         timeout_seconds=None, **sandbox_kwargs)
        # the rollout's own budget is enforced inside run_debug (a timeout is a reason, not a crash)
        self.rollout_timeout_seconds = timeout_seconds

    def _row(self, inst: Any) -> dict[str, Any]:
        iid = self.taskset.instance_id(inst)
        text = getattr(inst, "problem_statement", None) or f"Validate SWE instance {iid}"
        return {"prompt": [{"role": "user", "content": str(text)}], "answer": "", "task": "swe-debug",
                "info": self.taskset.info(inst)}

    @property
    def backend(self):
        if self._backend is None:
            self._backend = get_backend(self._backend_arg)
        return self._backend

    async def setup_state(self, state: State) -> State:
        info = dict(state.get("info") or {})
        iid = info.get("instance_id")
        if iid not in self._by_id:
            raise KeyError(f"instance {iid!r} is not in the taskset")
        inst = self._by_id[iid]
        state["info"] = info
        try:
            before = None
            if self.check_fails_before:
                before = await run_debug(self.taskset, inst, self.backend, self.options, step="none")
            out = await run_debug(self.taskset, inst, self.backend, self.options)
            if before is not None:
                out, _ = with_fails_before(out, before, self.taskset.fail_to_pass(inst))
        except Exception as exc:
            if find_infra_error(exc) is not None:
                info["swe_debug"] = {"instance_id": iid, "valid": False, "reason": "sandbox_error", "detail": str(exc)[:2000]}
            raise
        row = outcome_row(0, self.taskset.info(inst), out)
        row.pop("index", None)
        info["swe_debug"] = row
        for k, v in out.timings.model_dump().items():
            self.record_metric(state, k, v)
        self.record_metric(state, "overhead_s", out.timings.overhead_s())
        self.record_metric(state, "valid", 1.0 if out.valid else 0.0)
        return state

    @stop(priority=50)
    async def debug_completed(self, state: State) -> bool:
        """The debug rollout ran in setup_state: never take a model turn."""
        return True

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        raise NotImplementedError("SWEDebugEnv makes no model call")

    @teardown
    async def close_backend(self) -> None:
        if self._backend is not None:
            try:
                await self._backend.close()
            except InfraError:
                pass
            self._backend = None


def load_environment(
    dataset: str | None = None,
    instance_ids: list[str] | str | None = None,
    debug_step: Literal["none", "gold_patch", "command", "script"] = "gold_patch",
    debug_command: str | None = None,
    debug_script: str | None = None,
    debug_script_path: str | None = None,
    debug_timeout: int | None = None,
    test_timeout: int = 900,
    timeout_seconds: float = 1800.0,
    check_fails_before: bool = False,
    run_setup: bool = True,
    run_tests: bool = True,
    output_tail_chars: int = 2000,
    backend: str | None = None,
) -> SWEDebugEnv:
    """The `swe-debug` environment: `vf-sandbox eval swe-debug -a '{"dataset": "d.jsonl"}'`.
    Reward 1 per valid instance. Without `dataset`, the example taskset (built on first use)."""
    from .instances import dataset_name, load_instances
    from .taskset import SWETaskSet

    if dataset is None:
        from .examples.builder import DEFAULT_OUT, build_dataset

        path = DEFAULT_OUT / "examples.jsonl"
        dataset = str(path if path.exists() else build_dataset())
    report = load_instances(dataset)
    ids = instance_ids.replace(",", " ").split() if isinstance(instance_ids, str) else instance_ids
    taskset = SWETaskSet(report.select(ids), name=dataset_name(dataset))
    return SWEDebugEnv(
        taskset, debug_step=debug_step, debug_command=debug_command, debug_script=debug_script,
        debug_script_path=debug_script_path, debug_timeout=debug_timeout, test_timeout=test_timeout,
        timeout_seconds=timeout_seconds, check_fails_before=check_fails_before, run_setup=run_setup,
        run_tests=run_tests, output_tail_chars=output_tail_chars, backend=backend,
    )
