"""`HarborGateEnv`: the oracle gate for Harbor tasks, as `SWEDebugEnv` is for SWE rows.
One rollout = one task, no model. Two fresh sandboxes of the task's image, run at once:

    untouched   the tests only                       (must NOT pass: no vacuous pass)
    oracle      solution/solve.sh, then the tests    (must pass)

each with the task's timeouts, users and network policy (`harbor_tasks.phases`,
`harbor_tasks.sandbox`). "Pass" is Harbor's reward `reward` >= 1 read from
/logs/verifier/reward.json or reward.txt exactly as Harbor's verifier reads them.

The verdict is in the row's `info["verdict"]` with the keys vf-swe-debug's view,
the JUnit report, the run registry and the dashboard read (`instance_id`, `valid`,
`reason`, `detail`, `timings`, `stdout_tail`, `stderr_tail`) plus the rewards of
both runs (`reward_before`, `reward_after`, `rewards_*`, `error_*`). Reasons:

    pass            valid
    vacuous         the tests pass on the untouched task
    oracle_failed   the tests do not pass after the oracle (reward below 1)
    no_reward       after the oracle, no reward file, an empty or unparsable one
    timeout         solve.sh past [agent].timeout_sec, or test.sh past [verifier].timeout_sec
    unsupported     the task asks for what this stack / backend cannot honour
                    (allowlist network, a user switch the sandbox cannot make, steps, ...)
    setup_failed    the image does not build, or the sandbox cannot start
    sandbox_error   infrastructure (retried on fresh sandboxes; then left for --resume)

A task directory that cannot be read (task.toml Harbor would refuse, no
instruction.md or tests/test.sh) is an `input_errors` entry of the run, as a
malformed SWE row is.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from envs.decorators import teardown
from envs.verdict_env import VerdictEnv, VerdictRubric
from sandboxes import Sandbox, SandboxSpec, UsageError, UserSwitchUnsupported
from sandboxes.rollouts import RolloutSandboxes

from .phases import PhaseResult, VerifierOutcome, run_oracle, run_verifier
from .sandbox import build_image, sandbox_spec
from .task import HarborTask, TaskUnsupported

GateStep = Literal["oracle", "none"]


def judge(after: VerifierOutcome, oracle: PhaseResult | None, before: VerifierOutcome | None) -> tuple[bool, str, str]:
    """(valid, reason, detail) from the runs' outcomes (module docstring)."""
    if after.error == "verifier_timeout":
        return False, "timeout", after.detail
    if after.error is not None:
        return False, "no_reward", after.detail
    if oracle is not None and oracle.timed_out:
        return False, "timeout", f"solution/solve.sh did not finish within the agent timeout_sec ({oracle.timeout_s:g}s)"
    if not after.passed:
        what = "after the oracle" if oracle is not None else "on the untouched task"
        return False, "oracle_failed", f"the tests do not pass {what}: rewards {after.rewards}"
    if before is not None and before.passed:
        return False, "vacuous", f"the tests already pass on the untouched task: rewards {before.rewards}"
    return True, "pass", ""


class _Decided(Exception):
    """A verdict reached before the tests could run (`HarborGateEnv.verify`): its reason and detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class HarborGateEnv(VerdictEnv):
    """No-model gate over Harbor tasks (module docstring)."""

    item_kind = "task"

    def __init__(self, tasks: list[HarborTask], *, debug_step: GateStep = "oracle", input_errors: list[dict[str, Any]] | None = None,
                 rollout_isolation: str | None = None, isolation: str | None = None, output_tail_chars: int = 2000,
                 backend: Any = None, backend_options: dict[str, Any] | None = None, **kwargs: Any):
        if debug_step not in ("oracle", "none"):
            raise UsageError(f"Harbor tasks have the debug steps 'oracle' (solve.sh, the default) and 'none' "
                             f"(the tests only); not {debug_step!r}")
        self.tasks = self.items = {t.name: t for t in tasks}
        self.debug_step = debug_step
        self.input_errors = list(input_errors or [])
        self.rollout_isolation = rollout_isolation
        self.isolation_name = isolation
        self.output_tail_chars = output_tail_chars
        self.sandboxes = RolloutSandboxes(SandboxSpec(name="harbor-gate"), pool_size=0)
        dataset = [{"prompt": [{"role": "user", "content": t.instruction}], "answer": "", "task": "harbor-gate",
                    "info": {"instance_id": t.name, "repo": "harbor", "task_path": str(t.path)}} for t in tasks]
        super().__init__(dataset=dataset, rubric=VerdictRubric(), **kwargs)
        self.set_backend(backend, backend_options)

    def set_backend(self, name: Any, options: dict[str, Any] | None = None) -> None:
        self.sandboxes.set_backend(name, options)
        super().set_backend(name, options)

    def set_isolation(self, isolation: str) -> None:
        super().set_isolation(isolation)
        self.isolation_name = isolation

    def isolation_in_use(self) -> str | None:
        return self.isolation_name or "runc"

    async def verify(self, task: HarborTask) -> dict[str, Any]:
        """The verdict on one task. Raises InfraError (sandbox trouble) only."""
        t0 = time.perf_counter()
        out: dict[str, Any] = {"instance_id": task.name, "task_path": str(task.path), "step": self.debug_step,
                               "valid": False, "timings": {}}
        try:
            spec = await self._spec_with_image(task, out)
            before, after, oracle = await self._runs(task, spec)
        except _Decided as decided:
            reason, detail = decided.reason, decided.detail
        else:
            out["valid"], reason, detail = judge(after, oracle, before)
            self._record(out, before, after, oracle)
        out.update(reason=reason, detail=detail[:4000])
        out["timings"]["total_s"] = round(time.perf_counter() - t0, 4)
        return out

    async def _spec_with_image(self, task: HarborTask, out: dict[str, Any]) -> SandboxSpec:
        """The task's sandbox spec, its image built (`image`, `timings.image_s` in `out`).
        _Decided: the task is unsupported here, or its spec or image cannot be made."""
        why = task.unsupported()
        if why:
            raise _Decided("unsupported", why)
        backend = self.sandboxes.backend
        backend_name = getattr(backend, "name", type(backend).__name__)
        try:  # the spec first (its image filled in below): a refused task costs no image build
            spec = sandbox_spec(task, "pending", backend_name, rollout_isolation=self.rollout_isolation,
                                isolation=self.isolation_name)
        except TaskUnsupported as exc:
            raise _Decided("unsupported", str(exc)) from None
        except ValueError as exc:  # a ${VAR} the host does not set, a bad limit
            raise _Decided("setup_failed", f"sandbox: {exc}") from None
        t_img = time.perf_counter()
        try:
            image = await build_image(task, backend)
        except UsageError as exc:
            raise _Decided("setup_failed", f"image: {exc}") from None
        finally:
            out["timings"]["image_s"] = round(time.perf_counter() - t_img, 4)
        out["image"] = image.name
        return spec.model_copy(update={"image": image.name})

    async def _runs(self, task: HarborTask, spec: SandboxSpec
                    ) -> tuple[VerifierOutcome | None, VerifierOutcome, PhaseResult | None]:
        """(before, after, oracle): the untouched run and the oracle run at once (step `oracle`),
        or the tests only (step `none`). _Decided: this sandbox cannot run the task."""
        try:
            if self.debug_step == "oracle":
                (before, _), (after, oracle) = await asyncio.gather(self._run(task, spec, oracle=False),
                                                                    self._run(task, spec, oracle=True))
                return before, after, oracle
            after, _ = await self._run(task, spec, oracle=False)
            return None, after, None
        except UserSwitchUnsupported as exc:
            raise _Decided("unsupported", f"task {task.name}: agent user {task.config.agent.user!r}, verifier user "
                                          f"{task.config.verifier.user!r}: {exc}") from None
        except (TaskUnsupported, FileNotFoundError) as exc:
            raise _Decided("unsupported" if isinstance(exc, TaskUnsupported) else "setup_failed", str(exc)) from None
        except UsageError as exc:  # the sandbox cannot be made for this task (unknown user, bad image)
            raise _Decided("setup_failed", f"sandbox: {type(exc).__name__}: {exc}") from None

    def _record(self, out: dict[str, Any], before: VerifierOutcome | None, after: VerifierOutcome,
                oracle: PhaseResult | None) -> None:
        """The runs' rewards, exit codes, timings and log tails, into the verdict `out`."""
        n = self.output_tail_chars
        out["reward_after"], out["rewards_after"], out["error_after"] = after.reward, after.rewards, after.error
        out["test_exit_code"] = after.run.exit_code
        out["timings"]["tests_s"] = after.run.seconds
        out["stdout_tail"] = after.run.log_tail[-n:] if n > 0 else ""
        if before is not None:
            out["reward_before"], out["rewards_before"], out["error_before"] = before.reward, before.rewards, before.error
            out["timings"]["before_s"] = before.run.seconds
        if oracle is not None:
            out["oracle_exit_code"], out["oracle_timed_out"] = oracle.exit_code, oracle.timed_out
            out["timings"]["oracle_s"] = oracle.seconds
            out["stderr_tail"] = oracle.log_tail[-n:] if n > 0 else ""

    async def _run(self, task: HarborTask, spec: SandboxSpec, *, oracle: bool) -> tuple[VerifierOutcome, PhaseResult | None]:
        """One fresh sandbox: (the oracle, then) the tests; the sandbox is deleted after."""
        sb: Sandbox = await self.sandboxes.acquire(spec)
        try:
            phase = await run_oracle(sb, task) if oracle else None
            return await run_verifier(sb, task), phase
        finally:
            await asyncio.shield(self.sandboxes.release(sb))

    def build_metadata(self, outputs: list[Any], **fields: Any) -> dict[str, Any]:
        meta = super().build_metadata(outputs, **fields)
        meta["input_errors"] = self.input_errors
        return meta

    @teardown
    async def close_backend(self) -> None:
        await self.sandboxes.close()
