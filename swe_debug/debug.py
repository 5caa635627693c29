"""One debug rollout of one instance, no model involved:

    create sandbox → setup → debug step (none | gold_patch | command | script)
    → test patch → tests (test_timeout) → parse → grade → delete sandbox

Everything that can go wrong with the *task* becomes a `reason` on the
`DebugOutcome`; only a failure of the sandbox itself (an `InfraError`)
propagates, so that the caller can retry the rollout on a fresh sandbox.
Failures are classified by type (ExecResult.timed_out, InfraError), never by
reading the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from sandboxes import InfraError, Sandbox, SandboxBackend, UsageError
from sandboxes.group_setup import PreparedGroup
from sandboxes.rollouts import RolloutSandboxes
from sandboxes.spec import SandboxSpec, spec_field

from .grading import FailsBefore, Grade, Reason, check_fails_before
from .taskset import ApplyResult, SandboxTaskSet

log = logging.getLogger("swe_debug.phases")  # one line per phase of each instance: the run log's story

DebugStep = Literal["none", "gold_patch", "command", "script"]
SCRIPT_PATH = "/tmp/sandbox_debug_script.sh"
DEFAULT_OUTPUT_LIMIT = 32 * 1024 * 1024  # bytes of test log kept per stream (head+tail)


class DebugKnobs(BaseModel):
    """The debug run's own knobs (what runs, and for how long); `DebugOptions` adds the
    sandbox settings a run may override."""

    model_config = ConfigDict(extra="forbid")

    run_setup: bool = True
    debug_step: DebugStep = "gold_patch"
    run_tests: bool = True
    debug_command: str | None = None
    debug_script: str | None = None
    debug_script_path: str | None = None
    debug_timeout: float | None = Field(None, description="Seconds for the command/script; default test_timeout.")
    test_timeout: float = 900
    timeout_seconds: float = Field(1800.0, gt=0, description="Seconds for one debug run of an instance (its "
                                   "sandbox's lifetime is that plus 10 minutes).")
    output_tail_chars: int = 2000
    setup_timeout: float = 600
    setup_scope: Literal["rollout", "group"] = Field(
        "rollout", description="An instance's setup per attempt, or once per group of attempts (-r k) with a fork each.")
    """"group": an instance's setup (and install) runs once per group of rollouts (`-r k`
    pass@k runs) in one sandbox; each attempt gets a fork of it (`sandboxes.group_setup`)."""

    def script_text(self) -> str | None:
        if self.debug_script is not None:
            return self.debug_script
        if self.debug_script_path:
            return Path(self.debug_script_path).read_text()
        return None

    def check(self) -> None:
        """Raise UsageError for combinations that cannot run."""
        if self.debug_step == "command" and not self.debug_command:
            raise UsageError("debug_step 'command' needs debug_command")
        if self.debug_step == "script" and self.debug_script is None and not self.debug_script_path:
            raise UsageError("debug_step 'script' needs debug_script or debug_script_path")
        if self.debug_script_path and not Path(self.debug_script_path).is_file():
            raise UsageError(f"debug script not found: {self.debug_script_path}")

    def label_dict(self) -> dict[str, str]:
        """The sandbox's labels (`DebugOptions.labels`; none given: `sandbox-debug`)."""
        labels = self.labels  # type: ignore[attr-defined]
        return dict(labels) if labels is not None else {"sandbox-debug": "true"}


SANDBOX_OVERRIDES = ("cpu_cores", "memory_gb", "disk_size_gb", "isolation", "rollout_isolation", "labels")
"""The `SandboxSpec` fields a debug run may override; None (the default) keeps the task
set's value for the instance (`SWETaskSet.sandbox_spec`; no labels: `sandbox-debug`)."""


def _spec_override(field: str) -> tuple[Any, Any]:
    """SandboxSpec's `field` (type, constraints, description: `spec_field`, as
    SandboxEnvSettings takes them) as an override: None keeps the task set's value."""
    annotation, info = spec_field(field)
    return Optional[annotation], Field(None, description=info.description)


def _spec_typed(field: str, default: Any, description: str) -> tuple[Any, Any]:
    """SandboxSpec's `field` (type and constraints) with a default and meaning of the debug run's."""
    annotation, _ = spec_field(field)
    return annotation, Field(default, description=description)


def _spec_validators(fields: tuple[str, ...]) -> dict[str, Any]:
    """SandboxSpec's own field validators (e.g. labels given as a list) for those of `fields` they check."""
    out = {}
    for name, dec in SandboxSpec.__pydantic_decorators__.field_validators.items():
        mine = [f for f in dec.info.fields if f in fields]
        if mine:
            out[name] = field_validator(*mine, mode=dec.info.mode)(dec.func.__func__)
    return out


DebugOptions = create_model(
    "DebugOptions",
    __base__=DebugKnobs,
    __module__=__name__,
    __validators__=_spec_validators(SANDBOX_OVERRIDES),
    __doc__="The knobs of a debug run (the reference SWEDebugEnv signature, minus the taskset): the run's own "
            "(`DebugKnobs`) and a view onto `SandboxSpec` (`SANDBOX_OVERRIDES`, typed and constrained as there; "
            "None = the task set's spec).",
    output_limit_bytes=_spec_typed("output_limit_bytes", DEFAULT_OUTPUT_LIMIT, "Bytes of the debug step's and the "
                                   "tests' output kept per stream (head+tail): a whole test log, more than a "
                                   "sandbox command's default."),
    **{name: _spec_override(name) for name in SANDBOX_OVERRIDES},
)


class Timings(BaseModel):
    """Seconds per phase (0 when the phase did not run)."""

    image_s: float = 0.0
    create_s: float = 0.0
    setup_s: float = 0.0
    debug_s: float = 0.0
    test_patch_s: float = 0.0
    tests_s: float = 0.0
    delete_s: float = 0.0
    total_s: float = 0.0

    def overhead_s(self) -> float:
        """Wall time beyond the test run itself (and beyond image builds)."""
        return max(0.0, self.total_s - self.tests_s - self.image_s)


class DebugOutcome(BaseModel):
    """What one debug rollout found."""

    instance_id: str
    step: DebugStep
    valid: bool
    reason: Reason
    detail: str = ""
    image: str = ""
    images_built: list[str] = Field(default_factory=list)
    apply_method: str | None = None
    debug_exit_code: int | None = None
    test_exit_code: int | None = None
    timings: Timings = Field(default_factory=Timings)
    stdout_tail: str = ""
    stderr_tail: str = ""
    grade: Grade | None = None
    parsed: dict[str, str] = Field(default_factory=dict, description="Parsed test statuses (id → status).")
    forked: bool = Field(False, description="The sandbox was a fork of the instance's group setup (setup skipped).")

    def summary(self) -> dict[str, Any]:
        """The compact, JSON-able verdict kept in a results row (passing test ids are
        counted, not listed; the parsed statuses are left out)."""
        out: dict[str, Any] = self.model_dump(exclude={"grade", "parsed"} | (set() if self.forked else {"forked"}))
        if self.grade is not None:
            out["counts"] = self.grade.counts
            out["fail_to_pass"] = _list_summary(self.grade.fail_to_pass)
            out["pass_to_pass"] = _list_summary(self.grade.pass_to_pass)
        return out


def _list_summary(rep: Any) -> dict[str, Any]:
    return {"passed": len(rep.success), "failing": rep.failure[:50], "missing": rep.missing[:50]}


def with_fails_before(out: DebugOutcome, before: DebugOutcome, fail_to_pass: list[str]) -> tuple[DebugOutcome, FailsBefore]:
    """Fold a run without the patch (`before`, step none) into the verdict: a valid
    outcome whose FAIL_TO_PASS tests already passed before becomes `test_failed`."""
    fb = check_fails_before(before.parsed, fail_to_pass)
    if not fb.ok and out.valid:
        out = out.model_copy(update={"valid": False, "reason": "test_failed", "detail": fb.detail})
    return out, fb


def debug_spec(taskset: SandboxTaskSet, inst: Any, prepared: Any, opts: DebugOptions) -> SandboxSpec:
    """The sandbox of one rollout of `inst`: the taskset's, with the run's overrides."""
    spec = taskset.sandbox_spec(inst, prepared, timeout_seconds=opts.timeout_seconds, cpu_cores=opts.cpu_cores,
                                memory_gb=opts.memory_gb, disk_size_gb=opts.disk_size_gb, labels=opts.label_dict())
    if opts.isolation is not None and opts.isolation != spec.isolation:
        spec = spec.model_copy(update={"isolation": opts.isolation})
    if opts.rollout_isolation is not None and opts.rollout_isolation != spec.rollout_isolation:
        spec = spec.model_copy(update={"rollout_isolation": opts.rollout_isolation})
    return spec


class SetupFailed(Exception):
    """An instance's setup did not succeed in a group's prepared sandbox (the rollouts then
    run their own setup, and each reports it)."""


async def group_setup(taskset: SandboxTaskSet, inst: Any, sandbox: Sandbox, opts: DebugOptions) -> None:
    """The setup a group's forks carry (`PreparedGroup`'s prepare): SetupFailed when it fails."""
    r = await taskset.setup(sandbox, inst, opts.setup_timeout)
    log.info("%s: group setup %s", taskset.instance_id(inst), "ok" if r.ok else f"failed, exit {r.exit_code}")
    if not r.ok:
        raise SetupFailed(f"setup {'timed out' if r.timed_out else f'exited {r.exit_code}'}{_last_line(r.stderr)}")


def _last_line(s: str) -> str:
    lines = [x for x in s.strip().splitlines() if x.strip()]
    return f": {lines[-1][:300]}" if lines else ""


def _tail(s: str, n: int) -> str:
    return s[-n:] if n > 0 else ""


class _Clock:
    def __init__(self) -> None:
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return round(dt, 4)


async def run_debug(
    taskset: SandboxTaskSet,
    inst: Any,
    backend: SandboxBackend | RolloutSandboxes,
    opts: DebugOptions,
    *,
    step: DebugStep | None = None,
    prepared: Any = None,
    live: dict[str, Sandbox] | None = None,
    group: PreparedGroup | None = None,
) -> DebugOutcome:
    """Run one rollout of `inst` with `opts` (or `step` overriding opts.debug_step).

    Raises InfraError (sandbox trouble: retry on a fresh sandbox) and
    UsageError (bad options); everything else is in the outcome. `backend` is the
    run's sandbox lifecycle (`RolloutSandboxes`: SWEDebugEnv's; it holds the sandbox
    until released and deletes what is left when closed) or a bare backend (the
    CLI's). `live`, when given, holds the sandbox from its creation until its delete
    has finished, so that an owner cancelled meanwhile (Ctrl-C) can delete what is left.
    `group`: the instance's group setup (`setup_scope="group"`): the rollout's sandbox is a
    fork of the sandbox its setup ran in (`forked` in the outcome), so setup is skipped.
    """
    run = _Rollout(taskset, inst, opts, step or opts.debug_step)
    if prepared is None:
        built, prepared = await run.prepare_image()
        if not built:
            return run.done()
    run.note_image(prepared)
    spec = debug_spec(taskset, inst, prepared, opts)
    run.clock.lap()
    sandbox: Sandbox | None = None
    try:
        sandbox = await run.acquire(backend, spec, group)
        if sandbox is None:
            return run.out
        if live is not None:
            live[sandbox.id] = sandbox
        run.created(sandbox)
        await run.within_timeout(sandbox)
    finally:
        if sandbox is not None:
            await run.release(backend, sandbox, live)
        run.done()
    run.log_verdict()
    return run.out


class _Rollout:
    """One debug rollout in progress (`run_debug`): what it runs, its clock, and what it
    found so far (`out`). The phases in the sandbox return False once the verdict is decided."""

    def __init__(self, taskset: SandboxTaskSet, inst: Any, opts: DebugOptions, step: DebugStep):
        self.taskset, self.inst, self.opts, self.step = taskset, inst, opts, step
        self.start = time.perf_counter()
        self.out = DebugOutcome(instance_id=taskset.instance_id(inst), step=step, valid=False, reason="sandbox_error")
        self.clock = _Clock()
        self.n = opts.output_tail_chars

    def done(self) -> DebugOutcome:
        self.out.timings.total_s = round(time.perf_counter() - self.start, 4)
        return self.out

    # ------------------------------------------------------------------ around the sandbox
    async def prepare_image(self) -> tuple[bool, Any]:
        """(True, the prepared image), or (False, None) with the reason in `out`."""
        try:
            prepared = await self.taskset.prepare(self.inst)
        except UsageError as exc:  # the image cannot be built: the instance is broken, not the sandbox
            self.out.reason, self.out.detail = "setup_failed", f"image: {exc}"
            self.out.timings.image_s = self.clock.lap()
            log.info("%s: image failed: %s", self.out.instance_id, exc)
            return False, None
        self.out.timings.image_s = self.clock.lap()
        return True, prepared

    def note_image(self, prepared: Any) -> None:
        out = self.out
        if prepared is not None and hasattr(prepared, "tag"):
            out.image, out.images_built = prepared.tag, list(getattr(prepared, "built", []))
        log.info("%s: image %s ready%s", out.instance_id, getattr(prepared, "tag", "?"),
                 f" (built {', '.join(out.images_built)})" if out.images_built else "")

    async def acquire(self, backend: SandboxBackend | RolloutSandboxes, spec: SandboxSpec,
                      group: PreparedGroup | None) -> Sandbox | None:
        """A fork of the group's prepared sandbox (`out.forked`) or a new one; None (the
        reason in `out`) when the instance's sandbox cannot be made here."""
        lifecycle = backend if isinstance(backend, RolloutSandboxes) else None
        try:
            if group is not None and lifecycle is not None:
                sandbox, self.out.forked = await group.acquire()
                return sandbox
            return await (lifecycle.acquire(spec) if lifecycle is not None else backend.create(spec))
        except UsageError as exc:  # ImageNotFound / ConfigError: the instance cannot run here
            self.out.reason, self.out.detail = "setup_failed", f"sandbox: {type(exc).__name__}: {exc}"[:4000]
            return None

    def created(self, sandbox: Sandbox) -> None:
        self.out.timings.create_s = self.clock.lap()
        log.info("%s: sandbox %s created (%.2fs); step %s", self.out.instance_id, sandbox.id,
                 self.out.timings.create_s, self.step)

    async def within_timeout(self, sb: Sandbox) -> None:
        """The phases in the sandbox, bounded by timeout_seconds (past it: a `timeout` verdict)."""
        try:
            async with asyncio.timeout(self.opts.timeout_seconds):
                await self.in_sandbox(sb)
        except asyncio.TimeoutError:
            self.out.valid, self.out.reason = False, "timeout"
            self.out.detail = f"rollout exceeded timeout_seconds={self.opts.timeout_seconds:g}"

    async def release(self, backend: SandboxBackend | RolloutSandboxes, sandbox: Sandbox,
                      live: dict[str, Sandbox] | None) -> None:
        self.clock.lap()
        try:
            await asyncio.shield(backend.release(sandbox) if isinstance(backend, RolloutSandboxes) else sandbox.delete())
            if live is not None:
                live.pop(sandbox.id, None)
        except InfraError:
            pass  # the owner's teardown (or the reaper) removes it; the verdict stands
        self.out.timings.delete_s = self.clock.lap()

    def log_verdict(self) -> None:
        out = self.out
        log.info("%s: verdict %s (%s)%s in %.2fs", out.instance_id, "valid" if out.valid else "invalid", out.reason,
                 f": {out.detail}" if out.detail and not out.valid else "", out.timings.total_s)

    # ------------------------------------------------------------------ in the sandbox
    async def in_sandbox(self, sb: Sandbox) -> None:
        """Setup (not in a fork of the group's), the debug step, then the tests and their grade."""
        if self.opts.run_setup and not self.out.forked and not await self.setup(sb):
            return
        if self.step == "gold_patch" and not await self.gold_patch(sb):
            return
        if self.step in ("command", "script") and not await self.debug_command(sb):
            return
        if not self.opts.run_tests:
            self.out.valid, self.out.reason = True, "pass"
            return
        await self.tests(sb)

    async def setup(self, sb: Sandbox) -> bool:
        out = self.out
        r = await self.taskset.setup(sb, self.inst, self.opts.setup_timeout)
        out.timings.setup_s = self.clock.lap()
        log.info("%s: setup %s (%.2fs)", out.instance_id, "ok" if r.ok else f"failed, exit {r.exit_code}",
                 out.timings.setup_s)
        if not r.ok:
            out.reason = "timeout" if r.timed_out else "setup_failed"
            out.detail = f"setup {'timed out' if r.timed_out else f'exited {r.exit_code}'}{_last_line(r.stderr)}"
            out.stdout_tail, out.stderr_tail = _tail(r.stdout, self.n), _tail(r.stderr, self.n)
        return r.ok

    async def gold_patch(self, sb: Sandbox) -> bool:
        out = self.out
        ap: ApplyResult = await self.taskset.apply_gold_patch(sb, self.inst)
        out.timings.debug_s = self.clock.lap()
        out.apply_method = ap.method
        log.info("%s: debug step gold_patch: %s (%.2fs)", out.instance_id,
                 f"applied ({ap.method})" if ap.applied else "did not apply", out.timings.debug_s)
        if not ap.applied:
            out.reason, out.detail = "gold_apply_failed", "no rung of the apply ladder applied the gold patch"
            out.stdout_tail = _tail(ap.log(), self.n)
        return ap.applied

    async def debug_command(self, sb: Sandbox) -> bool:
        """The `command` or `script` step (debug_timeout, default test_timeout)."""
        out, opts, step = self.out, self.opts, self.step
        if step == "command":
            cmd = ["bash", "-c", opts.debug_command or ""]
        else:
            await sb.write_file(SCRIPT_PATH, opts.script_text() or "", mode=0o755)
            cmd = ["bash", SCRIPT_PATH]
        timeout = opts.debug_timeout or opts.test_timeout
        r = await sb.exec(cmd, cwd=self.taskset.workdir(self.inst), timeout=timeout, output_limit=opts.output_limit_bytes)
        out.timings.debug_s = self.clock.lap()
        out.debug_exit_code = r.exit_code
        log.info("%s: debug step %s: exit %s%s (%.2fs)", out.instance_id, step, r.exit_code,
                 ", timed out" if r.timed_out else "", out.timings.debug_s)
        out.stdout_tail, out.stderr_tail = _tail(r.stdout, self.n), _tail(r.stderr, self.n)
        if r.timed_out:
            out.reason, out.detail = "timeout", f"debug {step} exceeded {timeout:g}s"
        elif not r.ok:
            out.reason, out.detail = "debug_command_failed", f"debug {step} exited {r.exit_code}"
        return r.ok and not r.timed_out

    async def tests(self, sb: Sandbox) -> None:
        """The test patch and the tests, then their grade."""
        out, opts = self.out, self.opts
        tr, tp = await self.taskset.run_tests(sb, self.inst, opts.test_timeout, opts.output_limit_bytes)
        out.timings.tests_s = round(tr.seconds, 4)
        out.timings.test_patch_s = round(max(0.0, self.clock.lap() - tr.seconds), 4)
        log.info("%s: tests: exit %s%s (%.2fs)", out.instance_id, tr.exit_code, ", timed out" if tr.timed_out else "",
                 out.timings.tests_s)
        if not tp.applied:
            out.reason, out.detail = "setup_failed", "the test patch does not apply"
            out.stdout_tail = _tail(tp.log(), self.n)
            return
        out.test_exit_code = tr.exit_code
        out.stdout_tail, out.stderr_tail = _tail(tr.stdout, self.n), _tail(tr.stderr, self.n)
        if tr.timed_out:
            out.reason, out.detail = "timeout", f"tests exceeded test_timeout={opts.test_timeout:g}s"
            return
        parse = self.taskset.parse_log(self.inst, tr.stdout)
        g: Grade = self.taskset.grade(self.inst, parse, tr.exit_code)
        out.grade, out.valid, out.reason, out.detail = g, g.valid, g.reason, g.detail
        out.parsed = {k: v.value for k, v in parse.statuses.items()}


def verdict(row: dict[str, Any]) -> dict[str, Any]:
    """A results row's verdict (`info.verdict`), with the instance id."""
    info = row.get("info") or {}
    return {"instance_id": info.get("instance_id"), **(info.get("verdict") or {})}
