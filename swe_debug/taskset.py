"""`SandboxTaskSet`: what an environment needs from a task family — the sandbox
spec per instance, setup, patch application, the test run, log parsing and
grading — and `SWETaskSet`, its implementation for SWE-bench-style instances.

Every method that touches a sandbox goes through the `Sandbox` contract only;
a command's failure comes back as a typed result, an `InfraError` propagates.
"""

from __future__ import annotations

import abc
import math
import re
import shlex
import time
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from sandboxes import ExecResult, Sandbox, SandboxSpec

from .grading import Grade, grade
from .images import ImageBuilder, ImageRef
from .instances import SWEInstance, patch_file_changes
from .parser_names import get_parser
from .parsers import ParseResult

T = TypeVar("T")

PATCH_PATH = "/tmp/vf_gold.diff"
TEST_PATCH_PATH = "/tmp/vf_test.diff"
SETUP_PATCH_PATH = "/tmp/vf_setup.diff"
EVAL_SCRIPT_PATH = "/tmp/vf_eval.sh"
START_TEST_OUTPUT, END_TEST_OUTPUT = ">>>>> Start Test Output", ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
"""The SWE-bench harness's eval-script markers (its 5.x records the test command's exit code
after the end marker: the script's own status is its last `git checkout`'s)."""


def record_test_exit_code(script: str) -> str:
    """`script` with the test command's exit status captured before the end marker and
    printed after it (as swebench 5.x does); unchanged when it has no end marker."""
    lines = script.split("\n")
    for i, line in enumerate(lines):
        if END_TEST_OUTPUT in line:
            return "\n".join([*lines[:i], "VF_TEST_EXIT_CODE=$?", line,
                              f'echo "{TEST_EXIT_CODE}: $VF_TEST_EXIT_CODE"', *lines[i + 1:]])
    return script


def between_markers(log: str) -> str:
    """The test output of an eval-script log: between the start and end markers when both
    are there (else the whole log)."""
    if START_TEST_OUTPUT in log and END_TEST_OUTPUT in log:
        return log.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    return log
APPLY_TIMEOUT = 60.0

SWE_SANDBOX = SandboxSpec().model_copy(update={
    "name": "swe-debug", "cpu_cores": 1, "memory_gb": 4, "disk_size_gb": 10,
    "timeout_per_command_seconds": APPLY_TIMEOUT, "labels": {"vf-swe-debug": "1"}, "network": False, "pids_limit": 4096,
})
"""The sandbox of a SWE instance before the instance and the run say more: `SandboxSpec`'s
defaults with what SWE instances need (more memory and disk, more processes, no network).
`SWETaskSet.sandbox_spec` adds the instance's image, environment and working directory, the
run's lifetime and its overrides (cores, memory, disk, labels)."""


class ApplyResult(BaseModel):
    """How a patch went in: the first ladder rung that worked, and every attempt's output."""

    applied: bool
    method: str | None = None
    attempts: list[dict[str, Any]] = Field(default_factory=list)

    def log(self) -> str:
        return "\n".join(f"$ {a['cmd']}  (exit {a['exit_code']})\n{a['output']}" for a in self.attempts)


class StepResult(BaseModel):
    """A shell step (setup, debug command/script, test run) as seen by the env."""

    ok: bool
    exit_code: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @classmethod
    def of(cls, r: ExecResult, seconds: float) -> "StepResult":
        return cls(ok=r.ok, exit_code=r.exit_code, timed_out=r.timed_out, stdout=r.stdout, stderr=r.stderr, seconds=seconds)


class SandboxTaskSet(abc.ABC, Generic[T]):
    """A family of sandboxed tasks. Override the hooks; the env drives them in order:
    `prepare` (host side, e.g. images) → `sandbox_spec` → `setup` → a debug step
    (`apply_gold_patch` or a command) → `run_tests` → `parse_log` → `grade`."""

    name: str = "taskset"

    @abc.abstractmethod
    def instances(self) -> Sequence[T]:
        """The instances, in dataset order."""

    @abc.abstractmethod
    def instance_id(self, inst: T) -> str: ...

    def info(self, inst: T) -> dict[str, Any]:
        """JSON-able per-instance metadata for result rows."""
        return {"instance_id": self.instance_id(inst)}

    def use_backend(self, backend: Any) -> None:
        """The run's sandboxes come from `backend` (an instance): host-side work may depend
        on it (e.g. whether images are local to it)."""

    async def prepare(self, inst: T) -> Any:
        """Host-side work before a sandbox can be created (build or check its image)."""
        return None

    async def release(self, inst: T, prepared: Any) -> None:
        """The rollout that `prepare`d `inst` is done with it (e.g. its image may go)."""

    @abc.abstractmethod
    def sandbox_spec(self, inst: T, prepared: Any = None, *, timeout_seconds: float = 1800,
                     cpu_cores: float | None = None, memory_gb: float | None = None,
                     disk_size_gb: float | None = None, labels: dict[str, str] | None = None) -> SandboxSpec:
        """The sandbox for `inst` (`prepared` is what `prepare` returned); the keyword
        arguments are the run's overrides (None = the taskset's default)."""

    def workdir(self, inst: T) -> str:
        return "/"

    def run_env(self, inst: T) -> dict[str, str]:
        return {}

    async def setup(self, sandbox: Sandbox, inst: T, timeout: float) -> StepResult:
        return StepResult(ok=True)

    @abc.abstractmethod
    async def apply_gold_patch(self, sandbox: Sandbox, inst: T) -> ApplyResult: ...

    @abc.abstractmethod
    async def run_tests(self, sandbox: Sandbox, inst: T, timeout: float, output_limit: int) -> tuple[StepResult, ApplyResult]:
        """Prepare the test files (apply the test patch) and run the tests."""

    @abc.abstractmethod
    def parse_log(self, inst: T, log: str) -> ParseResult: ...

    @abc.abstractmethod
    def grade(self, inst: T, parse: ParseResult, exit_code: int | None) -> Grade: ...

    def fail_to_pass(self, inst: T) -> list[str]:
        return []


APPLY_LADDER = (
    ("git apply", "git apply --verbose {p}"),
    ("git apply --reject", "git apply --verbose --reject {p}"),
    # --forward: a patch that looks reversed or already applied is refused (patch --batch
    # alone "assumes reversed" and un-applies it, so a reversed gold patch turned the
    # tree into the fixed one and graded valid)
    ("patch --fuzz", "patch --batch --forward --fuzz=5 -p1 --no-backup-if-mismatch -i {p}"),
)
RESET_TREE = "git checkout -q -- . && git clean -fdq"
"""Back to the base commit between rungs (a failed --reject leaves a half-patched tree)."""


async def apply_patch_ladder(sandbox: Sandbox, patch: str, workdir: str, path: str = PATCH_PATH) -> ApplyResult:
    """Apply `patch` trying `git apply`, `git apply --reject`, `patch --forward --fuzz=5`,
    resetting the tree between tries. No rung ever applies a patch in reverse: one that
    is already applied, or applies only reversed, fails to apply."""
    res = ApplyResult(applied=False)
    if not patch.strip():
        res.attempts.append({"cmd": "(empty patch)", "exit_code": None, "output": "the patch is empty"})
        return res
    await sandbox.write_file(path, patch if patch.endswith("\n") else patch + "\n")
    for i, (method, tmpl) in enumerate(APPLY_LADDER):
        cmd = tmpl.format(p=shlex.quote(path))
        if i:
            cmd = f"{RESET_TREE} && {cmd}"
        r = await sandbox.exec(["bash", "-c", cmd], cwd=workdir, timeout=APPLY_TIMEOUT)
        res.attempts.append({"cmd": cmd, "exit_code": r.exit_code, "output": r.output[-2000:]})
        if r.ok:
            # `patch` may leave .rej/.orig; git apply --reject exits non-zero on any rejected hunk
            res.applied, res.method = True, method
            return res
    await sandbox.exec(["bash", "-c", RESET_TREE], cwd=workdir, timeout=APPLY_TIMEOUT)
    return res


class SWETaskSet(SandboxTaskSet[SWEInstance]):
    """SWE-bench-style instances, run in layered per-instance images."""

    name = "swe"

    def __init__(
        self,
        instances: Sequence[SWEInstance],
        *,
        builder: ImageBuilder | None = None,
        name: str | None = None,
        sandbox: SandboxSpec = SWE_SANDBOX,
    ):
        """`sandbox`: the defaults of every instance's sandbox (one `SandboxSpec`; see SWE_SANDBOX)."""
        self._instances = list(instances)
        self.builder = builder or ImageBuilder()
        if name:
            self.name = name
        self.sandbox = sandbox

    def instances(self) -> list[SWEInstance]:
        return self._instances

    def instance_id(self, inst: SWEInstance) -> str:
        return inst.instance_id

    def info(self, inst: SWEInstance) -> dict[str, Any]:
        return {"instance_id": inst.instance_id, "repo": inst.repo}

    def fail_to_pass(self, inst: SWEInstance) -> list[str]:
        return inst.FAIL_TO_PASS

    def use_backend(self, backend: Any) -> None:
        self.builder.use_backend(backend)

    async def prepare(self, inst: SWEInstance) -> ImageRef:
        ref = await self.builder.ensure(inst)
        self.builder.hold(ref)
        return ref

    async def release(self, inst: SWEInstance, prepared: Any) -> None:
        if isinstance(prepared, ImageRef):
            await self.builder.release(prepared)

    def sandbox_spec(self, inst: SWEInstance, prepared: ImageRef | None = None, *, timeout_seconds: float = 1800,
                     cpu_cores: float | None = None, memory_gb: float | None = None,
                     disk_size_gb: float | None = None, labels: dict[str, str] | None = None) -> SandboxSpec:
        overrides = {k: v for k, v in (("cpu_cores", cpu_cores), ("memory_gb", memory_gb),
                                       ("disk_size_gb", disk_size_gb)) if v}
        return SandboxSpec.model_validate({  # validated again: the overrides come from the run's flags
            **self.sandbox.model_dump(), **overrides,
            "image": prepared.tag if prepared else (inst.image_name or ""),
            "timeout_minutes": math.ceil(timeout_seconds / 60) + 10,
            "environment_vars": {**self.sandbox.environment_vars, **self.run_env(inst)},
            "labels": {**self.sandbox.labels, **(labels or {})},
            "workdir": inst.workdir,
        })

    def workdir(self, inst: SWEInstance) -> str:
        return inst.workdir

    def run_env(self, inst: SWEInstance) -> dict[str, str]:
        return inst.run_env()

    async def setup(self, sandbox: Sandbox, inst: SWEInstance, timeout: float) -> StepResult:
        """Check the tree is the clean base snapshot, then run the instance's setup commands."""
        base = shlex.quote(inst.base_commit)
        script = "\n".join(
            [
                "set -euo pipefail",
                "git config --global --add safe.directory '*' 2>/dev/null || true",
                f"git rev-parse --is-inside-work-tree >/dev/null || {{ echo 'no git work tree in {inst.workdir}' >&2; exit 3; }}",
                f"test -z {base} || git rev-parse -q --verify {base}^{{commit}} >/dev/null"
                f" || {{ echo 'base_commit {inst.base_commit} is not in this repository' >&2; exit 3; }}",
                # a published image's own untracked files (run_tests.sh, a venv, build output) are
                # its state: excluded, so the clean check passes and resets between rungs keep them
                *(["mkdir -p .git/info && git status --porcelain --untracked-files=normal | sed -n 's|^?? |/|p' >> .git/info/exclude"]
                  if inst.keep_untracked else []),
                'status=$(git status --porcelain)',
                'test -z "$status" || { echo "working tree is not clean:" >&2; echo "$status" >&2; exit 3; }',
                # committed, so that resetting the tree between apply rungs keeps it
                *([f"git apply --verbose {SETUP_PATCH_PATH} || {{ echo 'setup_patch does not apply' >&2; exit 3; }}",
                   "git add -A && git -c user.name=vf-swe-debug -c user.email=vf-swe-debug@invalid "
                   "commit -q --no-verify -m 'vf-swe-debug: setup_patch'"]
                  if inst.setup_patch.strip() else []),
                *inst.setup_commands,
            ]
        )
        t0 = time.perf_counter()
        if inst.setup_patch.strip():
            await sandbox.write_file(SETUP_PATCH_PATH, inst.setup_patch if inst.setup_patch.endswith("\n") else inst.setup_patch + "\n")
        r = await sandbox.exec(["bash", "-c", script], cwd=inst.workdir, timeout=timeout)
        return StepResult.of(r, time.perf_counter() - t0)

    async def apply_gold_patch(self, sandbox: Sandbox, inst: SWEInstance) -> ApplyResult:
        return await apply_patch_ladder(sandbox, inst.patch, inst.workdir)

    async def apply_test_patch(self, sandbox: Sandbox, inst: SWEInstance) -> ApplyResult:
        """Reset every file the test patch touches — modified ones to the base, files it
        adds removed (SWE-bench forgets those: #538/#631) — then `git apply` it."""
        res = ApplyResult(applied=True, method="none")
        if not inst.test_patch.strip():
            return res
        cmds = []
        for path, kind in patch_file_changes(inst.test_patch):
            q = shlex.quote(path)
            cmds.append(f"rm -rf -- {q}" if kind == "added" else f"git checkout -q HEAD -- {q}")
        await sandbox.write_file(TEST_PATCH_PATH, inst.test_patch if inst.test_patch.endswith("\n") else inst.test_patch + "\n")
        cmd = " && ".join([*cmds, f"git apply --verbose {TEST_PATCH_PATH}"])
        r = await sandbox.exec(["bash", "-c", cmd], cwd=inst.workdir, timeout=APPLY_TIMEOUT)
        res.attempts.append({"cmd": cmd, "exit_code": r.exit_code, "output": r.output[-2000:]})
        res.applied, res.method = r.ok, ("git apply" if r.ok else None)
        return res

    def test_command(self, inst: SWEInstance) -> str:
        cmd = " ".join([inst.test_cmd, *map(shlex.quote, inst.directives())])
        if inst.test_path:
            cmd = f"export PATH={shlex.quote(':'.join(inst.test_path))}:\"$PATH\"; {cmd}"
        return cmd

    async def run_tests(self, sandbox: Sandbox, inst: SWEInstance, timeout: float, output_limit: int) -> tuple[StepResult, ApplyResult]:
        if inst.eval_script.strip():
            return await self._run_eval_script(sandbox, inst, timeout, output_limit)
        tp = await self.apply_test_patch(sandbox, inst)
        if not tp.applied:
            return StepResult(ok=False), tp
        t0 = time.perf_counter()
        r = await sandbox.exec(
            ["bash", "-c", f"{{ {self.test_command(inst)}\n}} 2>&1"], cwd=inst.workdir, timeout=timeout, output_limit=output_limit
        )
        return StepResult.of(r, time.perf_counter() - t0), tp

    async def _run_eval_script(self, sandbox: Sandbox, inst: SWEInstance, timeout: float,
                               output_limit: int) -> tuple[StepResult, ApplyResult]:
        """The row's own eval script (it applies the test patch itself); the exit code is
        the test command's, recorded after the end marker (None when the script never got
        there: the tests did not run to the end)."""
        await sandbox.write_file(EVAL_SCRIPT_PATH, record_test_exit_code(inst.eval_script))
        t0 = time.perf_counter()
        r = await sandbox.exec(["bash", "-c", f"{{ bash {EVAL_SCRIPT_PATH}\n}} 2>&1"], cwd=inst.workdir, timeout=timeout,
                               output_limit=output_limit)
        step = StepResult.of(r, time.perf_counter() - t0)
        m = re.search(rf"^{re.escape(TEST_EXIT_CODE)}: (-?\d+)\s*$", r.stdout, re.M)
        step.exit_code = int(m.group(1)) if m else (None if not r.timed_out else r.exit_code)
        step.ok = step.exit_code == 0
        return step, ApplyResult(applied=True, method="eval_script")

    def parse_log(self, inst: SWEInstance, log: str) -> ParseResult:
        return get_parser(inst.log_parser)(between_markers(log) if inst.eval_script.strip() else log)

    def grade(self, inst: SWEInstance, parse: ParseResult, exit_code: int | None) -> Grade:
        return grade(parse, exit_code, inst.FAIL_TO_PASS, inst.PASS_TO_PASS)
