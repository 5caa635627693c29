"""`SWEDebugEnv`: SWE verification as an environment. One rollout = one
instance, and no model is ever called: `rollout()` builds the instance image,
optionally runs the tests without the patch (`check_fails_before`), runs the
debug step plus the tests (`repeat` times; mixed verdicts are `flaky`) and
grades them (`swe_debug.debug.run_debug`). The rubric's reward is 1 for a
valid instance.

Every outcome about the *instance* is a verdict in the row's
`info["verdict"]` (`valid`, `reason`, `detail`, `apply_method`, `timings`,
`counts`, `fails_before`, `repeats`, log tails...). A failure of the sandbox
itself (an `InfraError`) is left in `state["error"]`, so the environment's
rollout retry re-runs the whole rollout on a fresh sandbox; when the retries
are spent the row carries that infra error (and the verdict reason
`sandbox_error`), and an eval `--resume` runs it again.

pass@k runs (`-r k`: k attempts per instance) can pay an instance's setup (and
install) once: `setup_scope="group"` (`-x setup_scope=group`) runs it in one sandbox
of the instance before its attempts start, and each attempt (each `repeat`, the
`check_fails_before` run) gets a fork of that sandbox (`sandboxes.group_setup`), its
verdict saying `forked: true`. A setup that fails there is run again by each attempt
(so each verdict says why); where the backend has no snapshots every attempt sets up
its own sandbox (warned once).

`vf-swe-debug` is an eval of this environment (`swe_debug.cli`); so is
`vf-sandbox eval swe-debug -a '{"dataset": ...}'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import create_model

from envs.decorators import teardown
from envs.environment import EnvSettings
from envs.verdict_env import VerdictEnv, VerdictRubric
from envs.types import RolloutInput, SamplingArgs
from sandboxes import UsageError
from sandboxes.rollouts import RolloutSandboxes
from sandboxes.spec import SandboxSpec

from sandboxes.group_setup import PreparedGroup

from .debug import DebugOptions, DebugOutcome, debug_spec, group_setup, run_debug, with_fails_before
from .taskset import SandboxTaskSet

if TYPE_CHECKING:
    from .images import ImageBuilder

log = logging.getLogger("swe_debug.env")

_GROUP: contextvars.ContextVar[tuple[str, PreparedGroup] | None] = contextvars.ContextVar("vf_swe_group", default=None)


class SWEDebugRubric(VerdictRubric):
    """Reward 1 for a valid instance (the reference's name)."""


SETTINGS = ("cpu_cores", "memory_gb", "disk_size_gb", "rollout_isolation", "timeout_seconds", "setup_scope")
"""The `DebugOptions` fields `-x` reaches (beside every env's keys; `isolation` is one of those)."""

SWEDebugSettings = create_model(
    "SWEDebugSettings",
    __base__=EnvSettings,
    __module__=__name__,
    __doc__="SWEDebugEnv's `-x` keys: every env's and the `SETTINGS` of its DebugOptions, declared there "
            "(the sandbox ones SandboxSpec's, None = the instance's; the image is the instance's own).",
    **{name: (DebugOptions.model_fields[name].annotation, DebugOptions.model_fields[name]) for name in SETTINGS},
)


class SWEDebugEnv(VerdictEnv):
    """No-agent debugger for SWE-style SandboxTaskSet instances. Per rollout it creates
    the task sandbox, optionally runs task setup, runs one debug step (none,
    gold_patch, command, or script), and optionally runs tests and grades them."""


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
        debug_timeout: float | None = None,
        test_timeout: float = 900,
        cpu_cores: float | None = None,
        memory_gb: float | None = None,
        disk_size_gb: float | None = None,
        isolation: str | None = None,
        rollout_isolation: str | None = None,
        labels: list[str] | dict[str, str] | None = None,
        timeout_seconds: float = 1800.0,
        output_tail_chars: int = 2000,
        check_fails_before: bool = False,
        repeat: int = 1,
        setup_scope: Literal["rollout", "group"] = "rollout",
        backend: Any = None,
        backend_options: dict[str, Any] | None = None,
        input_errors: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ):
        self.taskset = taskset
        self.options = DebugOptions(
            run_setup=run_setup, debug_step=debug_step, run_tests=run_tests, debug_command=debug_command,
            debug_script=debug_script, debug_script_path=debug_script_path, debug_timeout=debug_timeout,
            test_timeout=test_timeout, cpu_cores=cpu_cores, memory_gb=memory_gb, disk_size_gb=disk_size_gb, isolation=isolation,
            rollout_isolation=rollout_isolation, labels=labels, timeout_seconds=timeout_seconds, output_tail_chars=output_tail_chars,
            setup_scope=setup_scope,
        )
        self.options.check()
        if repeat < 1:
            raise UsageError(f"repeat must be >= 1, got {repeat}")
        self.check_fails_before = check_fails_before
        self.repeat = repeat
        self.input_errors = list(input_errors or [])
        # the run's sandboxes come from the one lifecycle: each instance's own spec (its image),
        # created per rollout (no warm pool), held until deleted, what is left deleted at teardown
        self.sandboxes = RolloutSandboxes(SandboxSpec(name="swe-debug"), pool_size=0)
        self._backend_seen: Any = None  # the backend the taskset was told about
        self._by_id = self.items = {taskset.instance_id(i): i for i in taskset.instances()}
        if dataset is None:
            dataset = [self._row(i) for i in taskset.instances()]
        super().__init__(dataset=dataset, rubric=SWEDebugRubric(), **kwargs)
        self.set_backend(backend, backend_options)

    def _row(self, inst: Any) -> dict[str, Any]:
        iid = self.taskset.instance_id(inst)
        text = getattr(inst, "problem_statement", None) or f"Validate SWE instance {iid}"
        return {"prompt": [{"role": "user", "content": str(text)}], "answer": "", "task": "swe-debug",
                "info": self.taskset.info(inst)}

    # ------------------------------------------------------------------ configuration
    def set_backend(self, name: Any, options: dict[str, Any] | None = None) -> None:
        """Use this sandbox backend (a registered name or an instance): applies before the first
        sandbox, refused with a different one after (`RolloutSandboxes.set_backend`)."""
        self.sandboxes.set_backend(name, options)
        super().set_backend(name, options)

    @property
    def backend(self) -> Any:
        backend = self.sandboxes.backend
        if backend is not self._backend_seen:
            self._backend_seen = backend
            self.taskset.use_backend(backend)  # e.g. whether its images are this engine's
        return backend

    # sandbox settings (`-x` / extra_env_kwargs); the image is the instance's own
    Settings = SWEDebugSettings

    def apply_settings(self, values: dict[str, Any]) -> None:
        """The `SETTINGS` given (validated by set_kwargs) are applied to the options as one
        change, validated again by DebugOptions; every env's keys go to their setters."""
        own = {k: v for k, v in values.items() if k in SETTINGS}
        if own:
            self._update_options(own)
        super().apply_settings({k: v for k, v in values.items() if k not in SETTINGS})

    def _update_options(self, update: dict[str, Any]) -> None:
        self.options = DebugOptions.model_validate({**self.options.model_dump(), **update})

    def set_isolation(self, isolation: str) -> None:
        super().set_isolation(isolation)
        self._update_options({"isolation": isolation})

    def isolation_in_use(self) -> str | None:
        return self.options.isolation or "runc"

    # ------------------------------------------------------------------ group setup (pass@k)
    @contextlib.asynccontextmanager
    async def group_setup(self, group_inputs: list[RolloutInput], client: Any, model: str,
                          sampling_args: SamplingArgs | None, sem: asyncio.Semaphore | None) -> AsyncIterator[None]:
        """With `setup_scope="group"`, setup on and more than one attempt: the instance's
        image and setup once (under one concurrency slot), each attempt a fork of it."""
        opts = self.options
        iid = (group_inputs[0].get("info") or {}).get("instance_id") if group_inputs else None
        if opts.setup_scope != "group" or not opts.run_setup or len(group_inputs) < 2 or iid not in self._by_id:
            yield
            return
        inst = self._by_id[iid]
        group: PreparedGroup | None = None
        prepared: Any = None
        try:
            async with (sem if sem is not None else contextlib.nullcontext()):
                self._admit()
                self.backend  # made first: prepare depends on it (taskset.use_backend)
                try:
                    prepared = await self.taskset.prepare(inst)
                    group = await self.sandboxes.prepare_group(
                        lambda sb: group_setup(self.taskset, inst, sb, opts), debug_spec(self.taskset, inst, prepared, opts))
                except Exception as exc:  # each attempt runs (and reports) its own image / setup
                    log.warning("%s: group setup failed (%s: %s); each attempt sets up its own sandbox",
                                iid, type(exc).__name__, exc)
            token = _GROUP.set((iid, group) if group is not None else None)
            try:
                yield
            finally:
                _GROUP.reset(token)
        finally:
            if group is not None:
                await asyncio.shield(group.close())
            if prepared is not None:
                await asyncio.shield(self.taskset.release(inst, prepared))

    async def verify(self, inst: Any) -> dict[str, Any]:
        """The verdict on one instance: image, optional run without the patch, then
        `repeat` runs of the debug step and tests. Raises InfraError (sandbox trouble)."""
        self.backend  # made first: prepare depends on it (taskset.use_backend)
        opts, sandboxes = self.options, self.sandboxes
        t_img = time.perf_counter()
        try:  # the image (host side) once per rollout; a broken build is the instance's fault
            prepared = await self.taskset.prepare(inst)
        except UsageError as exc:
            o = DebugOutcome(instance_id=self.taskset.instance_id(inst), step=opts.debug_step, valid=False,
                             reason="setup_failed", detail=f"image: {exc}"[:4000])
            o.timings.image_s = o.timings.total_s = round(time.perf_counter() - t_img, 4)
            return o.summary()
        image_s = round(time.perf_counter() - t_img, 4)
        before: DebugOutcome | None = None
        share = _GROUP.get()
        group = share[1] if share is not None and share[0] == self.taskset.instance_id(inst) else None
        try:
            if self.check_fails_before:
                before = await run_debug(self.taskset, inst, sandboxes, opts, step="none", prepared=prepared,
                                         group=group)
            outcomes = [await run_debug(self.taskset, inst, sandboxes, opts, prepared=prepared, group=group)
                        for _ in range(self.repeat)]
        finally:
            await asyncio.shield(self.taskset.release(inst, prepared))  # the image may go (keep_images)
        final = outcomes[0]
        if len({o.valid for o in outcomes}) > 1:  # valid only sometimes: flaky, shown by a failing run
            bad = next(o for o in outcomes if not o.valid)
            n_ok = sum(o.valid for o in outcomes)
            final = bad.model_copy(update={"reason": "flaky", "detail": f"valid in {n_ok}/{len(outcomes)} runs; {bad.detail}"})
        fb = None
        if before is not None:
            final, fb = with_fails_before(final, before, self.taskset.fail_to_pass(inst))
        final.timings.image_s = image_s
        verdict = final.summary()
        if getattr(prepared, "pushed", None):
            verdict["image_pushed"] = prepared.pushed
        if before is not None and fb is not None:
            verdict["fails_before"] = {"ok": fb.ok, "passing_before": fb.passing_before[:50], "reason": before.reason,
                                       "test_exit_code": before.test_exit_code, "timings": before.timings.model_dump()}
        if len(outcomes) > 1:
            verdict["repeats"] = [{"valid": o.valid, "reason": o.reason, "tests_s": o.timings.tests_s} for o in outcomes]
        return verdict

    # ------------------------------------------------------------------ results and teardown
    def build_metadata(self, outputs: list[Any], **fields: Any) -> dict[str, Any]:
        """The eval metadata, plus the dataset rows that could not be loaded (`input_errors`:
        they fail a JUnit report as much as an invalid instance does)."""
        meta = super().build_metadata(outputs, **fields)
        meta["input_errors"] = self.input_errors
        return meta

    @teardown
    async def close_backend(self) -> None:
        """Delete the sandboxes of interrupted rollouts, then close the backend
        (`RolloutSandboxes.close`)."""
        await self.sandboxes.close()
        self._backend_seen = None


def load_environment(
    dataset: str | None = None, instance_ids: list[str] | str | None = None, split: str = "test",
    debug_step: Literal["none", "gold_patch", "command", "script"] = "gold_patch", debug_command: str | None = None,
    debug_script: str | None = None, debug_script_path: str | None = None, debug_timeout: float | None = None,
    test_timeout: float = 900, timeout_seconds: float = 1800.0, check_fails_before: bool = False, repeat: int = 1,
    setup_scope: Literal["rollout", "group"] = "rollout", run_setup: bool = True, run_tests: bool = True,
    output_tail_chars: int = 2000, cpu_cores: float | None = None, memory_gb: float | None = None,
    isolation: str | None = None, rollout_isolation: str | None = None, backend: str | None = None,
    namespace: str | None = None, registry: str | None = None, push_to: str | None = None,
    keep_images: int | None = None, dataset_format: str | None = None,
) -> SWEDebugEnv:
    """The `swe-debug` environment: `vf-sandbox eval swe-debug -a '{"dataset": "d.jsonl"}'`.
    Reward 1 per valid instance. Without `dataset`, the example taskset (built on first use).
    Malformed dataset rows are skipped and listed in the metadata's `input_errors`
    (unless `instance_ids` selects the instances to run).

    Images: a row's `image_name` (pulled when absent), else with `namespace` the
    SWE-bench name `{namespace}/sweb.eval.{arch}.{id}` (pulled; built from `source`
    when it cannot be), else built from `source`; `registry` (host[:port]) puts that name
    on a registry: `{registry}/{namespace}/sweb.eval...`, namespace default `swebench`; `push_to` pushes built images to that
    registry. Registry credentials come from VF_REGISTRY_USERNAME / VF_REGISTRY_PASSWORD
    or the Docker config, never from arguments (so never from results or metadata).
    `keep_images`: of the images this run pulled or built, keep only that many (least
    recently used go first, never one in use, never one the run did not make).
    `dataset_format`: the published shape of the rows (swe-bench, swe-bench-v5, swe-gym, swe-smith,
    r2e-gym, swe-rebench, native; swe_debug.published); default: recognised per row."""
    from .instances import dataset_name
    from .taskset import SWETaskSet

    dataset = dataset if dataset is not None else _example_dataset()
    ids = instance_ids.replace(",", " ").split() if isinstance(instance_ids, str) else instance_ids
    selected, input_errors = _select_instances(dataset, split, ids, bool(namespace or registry), dataset_format)
    if debug_step == "gold_patch":  # a row without its gold patch is malformed, not an instance whose patch fails
        selected = _with_gold_patch(selected, ids, input_errors)
    taskset = SWETaskSet(selected, name=dataset_name(dataset),
                         builder=_image_builder(namespace, registry, push_to, keep_images))
    return SWEDebugEnv(
        taskset, debug_step=debug_step, debug_command=debug_command, debug_script=debug_script,
        debug_script_path=debug_script_path, debug_timeout=debug_timeout, test_timeout=test_timeout,
        timeout_seconds=timeout_seconds, check_fails_before=check_fails_before, repeat=repeat, setup_scope=setup_scope,
        run_setup=run_setup, run_tests=run_tests, output_tail_chars=output_tail_chars, cpu_cores=cpu_cores,
        memory_gb=memory_gb, isolation=isolation, rollout_isolation=rollout_isolation, backend=backend,
        input_errors=input_errors,
    )


def _example_dataset() -> str:
    """The example taskset's rows (built on first use)."""
    from .examples.builder import build_dataset, default_out

    path = default_out() / "examples.jsonl"
    return str(path if path.exists() else build_dataset())


def _select_instances(dataset: str, split: str, ids: list[str] | None, named_images: bool,
                      dataset_format: str | None) -> tuple[list[Any], list[dict[str, Any]]]:
    """The instances to run (`ids`, else every well-formed row) and the malformed rows as
    `input_errors` (none when `ids` selects the instances). UsageError: an unknown format or id."""
    from .instances import load_instances

    try:
        report = load_instances(dataset, split=split, named_images=named_images, dataset_format=dataset_format)
    except ValueError as exc:  # an unknown --dataset-format
        raise UsageError(str(exc)) from None
    try:
        selected = report.select(ids)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    input_errors = [] if ids else [
        {"name": f"row {e.index}" + (f" ({e.instance_id})" if e.instance_id else ""), "type": "malformed_row",
         "message": f"{e.field}: {e.message}"}
        for e in report.errors
    ]
    return selected, input_errors


def _with_gold_patch(selected: list[Any], ids: list[str] | None, input_errors: list[dict[str, Any]]) -> list[Any]:
    """The instances that have a gold patch (the gold_patch step's): the others are malformed
    rows (added to `input_errors`), or a UsageError when `ids` selected them."""
    patchless = [i for i in selected if not i.patch.strip()]
    if patchless and ids:
        raise UsageError(f"instance(s) without a gold patch (`patch` is empty or missing), needed by debug step "
                         f"gold_patch: {', '.join(i.instance_id for i in patchless)}")
    input_errors += [{"name": i.instance_id, "type": "malformed_row",
                      "message": "patch: missing or empty (the gold patch the gold_patch debug step applies)"}
                     for i in patchless]
    return [i for i in selected if i.patch.strip()]


def _image_builder(namespace: str | None, registry: str | None, push_to: str | None,
                   keep_images: int | None) -> ImageBuilder | None:
    """The ImageBuilder for registry images, pushes or a disk bound (None: the task set's default)."""
    if not (namespace or registry or push_to or keep_images is not None):
        return None
    from .images import ImageBuilder

    # registry credentials: the running settings' (ImageBuilder reads them when no auth is given)
    return ImageBuilder(namespace=namespace, registry=registry, push_to=push_to, keep_images=keep_images)
