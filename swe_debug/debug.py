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

from envs.sandbox_env import _spec_field
from sandboxes import InfraError, Sandbox, SandboxBackend, UsageError
from sandboxes.group_setup import PreparedGroup
from sandboxes.rollouts import RolloutSandboxes
from sandboxes.spec import SandboxSpec

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
    """SandboxSpec's `field` (type, constraints, description: `_spec_field`, as
    SandboxEnvSettings takes them) as an override: None keeps the task set's value."""
    annotation, info = _spec_field(field)
    return Optional[annotation], Field(None, description=info.description)


def _spec_typed(field: str, default: Any, description: str) -> tuple[Any, Any]:
    """SandboxSpec's `field` (type and constraints) with a default and meaning of the debug run's."""
    annotation, _ = _spec_field(field)
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
    lifecycle = backend if isinstance(backend, RolloutSandboxes) else None
    step = step or opts.debug_step
    start = time.perf_counter()
    out = DebugOutcome(instance_id=taskset.instance_id(inst), step=step, valid=False, reason="sandbox_error")
    iid = out.instance_id
    clock = _Clock()
    if prepared is None:
        try:
            prepared = await taskset.prepare(inst)
        except UsageError as exc:  # the image cannot be built: the instance is broken, not the sandbox
            out.reason, out.detail = "setup_failed", f"image: {exc}"
            out.timings.image_s = clock.lap()
            out.timings.total_s = round(time.perf_counter() - start, 4)
            log.info("%s: image failed: %s", iid, exc)
            return out
        out.timings.image_s = clock.lap()
    if prepared is not None and hasattr(prepared, "tag"):
        out.image, out.images_built = prepared.tag, list(getattr(prepared, "built", []))
    log.info("%s: image %s ready%s", iid, getattr(prepared, "tag", "?"),
             f" (built {', '.join(out.images_built)})" if out.images_built else "")
    spec = debug_spec(taskset, inst, prepared, opts)
    clock.lap()
    sandbox: Sandbox | None = None
    forked = False
    try:
        try:
            if group is not None and lifecycle is not None:
                sandbox, forked = await group.acquire()
                out.forked = forked
            else:
                sandbox = await (lifecycle.acquire(spec) if lifecycle is not None else backend.create(spec))
        except UsageError as exc:  # ImageNotFound / ConfigError: the instance cannot run here
            out.reason, out.detail = "setup_failed", f"sandbox: {type(exc).__name__}: {exc}"[:4000]
            return out
        if live is not None:
            live[sandbox.id] = sandbox
        out.timings.create_s = clock.lap()
        log.info("%s: sandbox %s created (%.2fs); step %s", iid, sandbox.id, out.timings.create_s, step)
        try:
            async with asyncio.timeout(opts.timeout_seconds):
                await _body(taskset, inst, sandbox, opts, step, out, clock, skip_setup=forked)
        except asyncio.TimeoutError:
            out.valid, out.reason = False, "timeout"
            out.detail = f"rollout exceeded timeout_seconds={opts.timeout_seconds:g}"
    finally:
        if sandbox is not None:
            clock.lap()
            try:
                await asyncio.shield(lifecycle.release(sandbox) if lifecycle is not None else sandbox.delete())
                if live is not None:
                    live.pop(sandbox.id, None)
            except InfraError:
                pass  # the owner's teardown (or the reaper) removes it; the verdict stands
            out.timings.delete_s = clock.lap()
        out.timings.total_s = round(time.perf_counter() - start, 4)
    log.info("%s: verdict %s (%s)%s in %.2fs", iid, "valid" if out.valid else "invalid", out.reason,
             f": {out.detail}" if out.detail and not out.valid else "", out.timings.total_s)
    return out


async def _body(taskset: SandboxTaskSet, inst: Any, sb: Sandbox, opts: DebugOptions, step: DebugStep,
                out: DebugOutcome, clock: _Clock, skip_setup: bool = False) -> None:
    n = opts.output_tail_chars
    workdir = taskset.workdir(inst)
    if opts.run_setup and not skip_setup:
        r = await taskset.setup(sb, inst, opts.setup_timeout)
        out.timings.setup_s = clock.lap()
        log.info("%s: setup %s (%.2fs)", out.instance_id, "ok" if r.ok else f"failed, exit {r.exit_code}",
                 out.timings.setup_s)
        if not r.ok:
            out.reason = "timeout" if r.timed_out else "setup_failed"
            out.detail = f"setup {'timed out' if r.timed_out else f'exited {r.exit_code}'}{_last_line(r.stderr)}"
            out.stdout_tail, out.stderr_tail = _tail(r.stdout, n), _tail(r.stderr, n)
            return
    if step == "gold_patch":
        ap: ApplyResult = await taskset.apply_gold_patch(sb, inst)
        out.timings.debug_s = clock.lap()
        out.apply_method = ap.method
        log.info("%s: debug step gold_patch: %s (%.2fs)", out.instance_id,
                 f"applied ({ap.method})" if ap.applied else "did not apply", out.timings.debug_s)
        if not ap.applied:
            out.reason, out.detail = "gold_apply_failed", "no rung of the apply ladder applied the gold patch"
            out.stdout_tail = _tail(ap.log(), n)
            return
    elif step in ("command", "script"):
        if step == "command":
            cmd = ["bash", "-c", opts.debug_command or ""]
        else:
            await sb.write_file(SCRIPT_PATH, opts.script_text() or "", mode=0o755)
            cmd = ["bash", SCRIPT_PATH]
        timeout = opts.debug_timeout or opts.test_timeout
        r = await sb.exec(cmd, cwd=workdir, timeout=timeout, output_limit=opts.output_limit_bytes)
        out.timings.debug_s = clock.lap()
        out.debug_exit_code = r.exit_code
        log.info("%s: debug step %s: exit %s%s (%.2fs)", out.instance_id, step, r.exit_code,
                 ", timed out" if r.timed_out else "", out.timings.debug_s)
        out.stdout_tail, out.stderr_tail = _tail(r.stdout, n), _tail(r.stderr, n)
        if r.timed_out:
            out.reason, out.detail = "timeout", f"debug {step} exceeded {timeout:g}s"
            return
        if not r.ok:
            out.reason, out.detail = "debug_command_failed", f"debug {step} exited {r.exit_code}"
            return
    if not opts.run_tests:
        out.valid, out.reason = True, "pass"
        return
    tr, tp = await taskset.run_tests(sb, inst, opts.test_timeout, opts.output_limit_bytes)
    out.timings.tests_s = round(tr.seconds, 4)
    out.timings.test_patch_s = round(max(0.0, clock.lap() - tr.seconds), 4)
    log.info("%s: tests: exit %s%s (%.2fs)", out.instance_id, tr.exit_code, ", timed out" if tr.timed_out else "",
             out.timings.tests_s)
    if not tp.applied:
        out.reason, out.detail = "setup_failed", "the test patch does not apply"
        out.stdout_tail = _tail(tp.log(), n)
        return
    out.test_exit_code = tr.exit_code
    out.stdout_tail, out.stderr_tail = _tail(tr.stdout, n), _tail(tr.stderr, n)
    if tr.timed_out:
        out.reason, out.detail = "timeout", f"tests exceeded test_timeout={opts.test_timeout:g}s"
        return
    parse = taskset.parse_log(inst, tr.stdout)
    g: Grade = taskset.grade(inst, parse, tr.exit_code)
    out.grade, out.valid, out.reason, out.detail = g, g.valid, g.reason, g.detail
    out.parsed = {k: v.value for k, v in parse.statuses.items()}


def verdict(row: dict[str, Any]) -> dict[str, Any]:
    """A results row's verdict (`info.verdict`), with the instance id."""
    info = row.get("info") or {}
    return {"instance_id": info.get("instance_id"), **(info.get("verdict") or {})}
