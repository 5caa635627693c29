"""Running resolved evals: load the env, check the endpoint, pick or resume the
run directory, drive `env.generate` with per-group writing and progress,
record the run in the registry, and stop cleanly on SIGTERM / Ctrl-C /
`--timeout-minutes` (groups already written are kept, in-flight rollouts are
cancelled, teardown handlers run, metadata says `stopped`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.errors import UsageError

from envs.clients.base import ModelAuthError
from envs.errors import MissingKeyError
from envs.logging_utils import RUN_LOG_ONLY
from envs.outputs import is_scored, verdict_counts, verdict_of
from runner.config import EvalConfig, redact_secrets
from runner.display import EvalProgress, PlainDisplay, RichDisplay
from runner.setup import load_run_env, make_run_clients
from runner.junit import write_junit
from runner.resume import plan_run
from runner.writer import (
    ResultsWriter,
    check_same_inputs,
    missing_inputs,
    now_iso,
)

log = logging.getLogger("envs.runner")


@dataclass
class EvalResult:
    config: EvalConfig
    status: str = "pending"  # completed | incomplete (infra-error rollouts, --resume reruns them) | failed | stopped
    error: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None
    run_id: str | None = None
    usage_error: bool = False  # failed on bad usage (unknown env, missing key, ...): the CLI exits 2


class StopRequested(Exception):
    """The run was asked to stop (signal or timeout)."""


def _recorder(cfg: EvalConfig, run_dir: Path, run_id: str | None = None) -> Any:
    try:
        from runs.registry import RunRecorder
    except ImportError:
        return None
    try:
        return RunRecorder.start(
            kind=cfg.kind, name=cfg.name, env_id=cfg.env_id, model=cfg.model, args=cfg.public_args(),
            output_dir=str(run_dir), run_id=run_id, resume=None if run_id is None else False,
            db=cfg.runs_db, sandbox_label=cfg.sandbox_run_id,
        )
    except Exception as exc:  # the registry is best-effort; never block an eval on it
        log.warning("run registry unavailable: %s", exc)
        return None


def _build_metadata(env: Any, cfg: EvalConfig, rows: list[dict[str, Any]], run_dir: Path | None, started: float, status: str, base_url: str, prior_ms: float, planned_examples: int = 0, first_date: str | None = None) -> dict[str, Any]:
    n_examples = max(len({r.get("example_id") for r in rows}), planned_examples)
    meta = env.build_metadata(
        rows,
        model=cfg.model,
        base_url=base_url,
        # what really ran: -n larger than the dataset runs the whole dataset, and says so
        num_examples=n_examples if planned_examples or cfg.num_examples < 0 else cfg.num_examples,
        rollouts_per_example=cfg.rollouts_per_example,
        sampling_args=cfg.sampling_args,
        time_ms=prior_ms + (time.time() - started) * 1000,
        state_columns=cfg.state_columns,
        path_to_save=str(run_dir) if run_dir else "",
    )
    meta["env_id"] = cfg.env_id
    if first_date:  # a resumed run keeps its start date
        meta["date"] = first_date
    meta["env_args"] = redact_secrets(cfg.env_args)
    if planned_examples and 0 <= planned_examples < cfg.num_examples:
        meta["num_examples_requested"] = cfg.num_examples
    if cfg.name:
        meta["name"] = cfg.name
    meta["status"] = status
    meta["completed_rollouts"] = len(rows)
    meta["shuffle"] = cfg.shuffle
    meta["shuffle_seed"] = cfg.shuffle_seed
    meta["updated"] = now_iso()
    meta["isolation"] = env.isolation_in_use()  # what the sandboxes ran under (cfg.isolation None = env's own)
    rollout_isolation = env.rollout_isolation_in_use()  # a container or a cell per rollout
    if rollout_isolation:
        meta["rollout_isolation"] = rollout_isolation
    meta["eval_config"] = cfg.public_args()  # the run definition: enough to run it again (--from-run)
    return meta


class EndpointWatch:
    """Counts rollouts in a row that could not connect to the model endpoint; after
    `limit` of them (0: never) the endpoint is down: `event` is set and the run stops."""

    def __init__(self, limit: int):
        self.limit = limit
        self.streak = 0
        self.started: str | None = None
        self.down_since: str | None = None
        self.last_error = ""
        self.event = asyncio.Event()

    def see(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            text = str(r.get("error") or "")
            if r.get("error_kind") == "model" and "model endpoint unreachable" in text and "timed out" not in text:
                if self.streak == 0:
                    self.started = now_iso()
                self.streak += 1
                self.last_error = text.splitlines()[0][:300]
            else:
                self.streak = 0
        if self.limit and self.streak >= self.limit and self.down_since is None:
            self.down_since = self.started
            log.error("model endpoint down since %s: %d rollouts in a row could not connect (%s); stopping the run: "
                      "no new rollouts start", self.started, self.streak, self.last_error)
            self.event.set()


END_GRACE = 0.0  # seconds the groups finishing right then get once the endpoint is down (a refused
# connection fails a rollout in milliseconds: any grace lets the run start and fail many more)


async def run_until_endpoint_down(gen: Any, watch: EndpointWatch) -> None:
    """Hosted runs (whose rollouts run on Ray actors): await the run's rollouts
    (`gen`), or -- the endpoint is down -- stop: groups finishing within END_GRACE are kept,
    the rest is cancelled like a stopped run's (those rollouts could not reach the model
    either: they are "not run", and `--resume` runs them). A longer grace would let the run
    start new rollouts that fail at once, burning the dataset. A local run instead closes
    its env's `start_gate` (-w N: no group is sent to a worker any more): nothing new
    starts, the rollouts in flight finish."""
    task = asyncio.ensure_future(gen)
    down = asyncio.ensure_future(watch.event.wait())
    try:
        await asyncio.wait([task, down], return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and END_GRACE > 0:
            await asyncio.wait([task], timeout=END_GRACE)
        if task.done():
            task.result()
    finally:
        down.cancel()
        if not task.done():
            from sandboxes.cancel import cancel_and_settle

            await cancel_and_settle([task])  # never swallows this task's own cancel (Ctrl-C)


def run_verdict(rows: list[dict[str, Any]], asked: int, cfg: EvalConfig, ref: str) -> tuple[str, str | None]:
    """(status, error) of a run that went through its rollouts: `completed` only when every
    rollout asked for was scored (or the errored share is within --max-error-rate), else
    `incomplete`, saying what failed and the command that continues the run (`ref`: its id)."""
    counts = verdict_counts(rows)
    missing = max(0, asked - len(rows))
    errored = counts["errored"]
    if not errored and not missing:
        return "completed", None
    if not missing and asked and errored / asked <= cfg.max_error_rate:
        log.warning("%s: %d of %d rollout(s) not scored, accepted by --max-error-rate %g", cfg.env_id, errored,
                    asked, cfg.max_error_rate)
        return "completed", None
    parts = [f"{counts[k]} {k}" for k in ("model", "sandbox", "env", "usage") if counts[k]]
    what = f"{errored} of {asked} rollout(s) not scored ({', '.join(parts)} error(s))" if errored else ""
    if missing:
        what += ("; " if what else "") + f"{missing} of {asked} not run"
    cause = all_failed_cause(rows)
    if cause and not missing:  # nothing was evaluated: the run failed, whatever the individual rows say
        return "failed", f"{cause} (continue with: vf-sandbox eval --resume {ref})"
    return "incomplete", f"{what}: left out of the averages; continue with: vf-sandbox eval --resume {ref}"


def all_failed_cause(rows: list[dict[str, Any]]) -> str | None:
    """When no rollout was scored (nothing was evaluated), the one-line cause; else None."""
    if not rows or any(is_scored(r) for r in rows):
        return None
    from envs.outputs import verdict_of

    texts = collections.Counter(str(r.get("error") or "").splitlines()[0] for r in rows)
    kinds = collections.Counter(verdict_of(r) for r in rows)
    names = {"sandbox": "infrastructure", "model": "model API", "env": "environment code", "usage": "usage"}
    what = " and ".join(names[k] for k in sorted(kinds))
    text, _ = texts.most_common(1)[0]
    return f"all {len(rows)} rollouts failed ({what} errors): {text}"


def push_to_hub(rows: list[dict[str, Any]], cfg: EvalConfig) -> None:
    """-H: push the results as a dataset (needs `huggingface_hub` login and network)."""
    from datasets import Dataset

    from runner.writer import dumps

    name = cfg.hf_hub_dataset_name or f"{cfg.env_id}--{cfg.model.replace('/', '--')}"
    flat = [{k: (v if isinstance(v, (int, float, str, bool)) or v is None else dumps(v)) for k, v in r.items()} for r in rows]
    try:
        Dataset.from_list(flat).push_to_hub(name)
        log.info("pushed %d rows to the HF Hub as %s", len(rows), name)
    except Exception as exc:  # results are on disk already; the push is extra
        log.error("push to the HF Hub failed: %s: %s", type(exc).__name__, exc)


MODEL_WAIT_REPORT = 15.0  # seconds a model request runs before the log names the rollouts waiting on it


async def report_model_waits(env: Any, cfg: EvalConfig, every: float = 5.0) -> None:
    """Every `every` seconds, while rollouts wait on the model longer than MODEL_WAIT_REPORT,
    say which and for how long, and when they give up (a hanging endpoint is never silence)."""
    from runner.setup import DEFAULT_MODEL_REQUEST_TIMEOUT

    replicas = cfg.client_config.replicas()
    request = min((c.timeout if "timeout" in c.model_fields_set else DEFAULT_MODEL_REQUEST_TIMEOUT) for c in replicas) \
        if replicas else DEFAULT_MODEL_REQUEST_TIMEOUT
    limit = (f"--rollout-timeout {cfg.rollout_timeout:g}s ends each rollout" if cfg.rollout_timeout else
             f"a request gives up after {request:g}s, then {cfg.client_config.max_retries} client retr(ies); "
             "--rollout-timeout bounds a whole rollout")
    while True:
        await asyncio.sleep(every)
        waits = [(ex, t) for ex, t in env.model_waits() if t >= MODEL_WAIT_REPORT]
        if waits:
            shown = ", ".join(f"example {ex}: {t:.0f}s" for ex, t in waits[:6]) + (" ..." if len(waits) > 6 else "")
            log.warning("%s: %d rollout(s) waiting on the model at %s (%s); %s", cfg.env_id, len(waits),
                        cfg.client_config.base_urls(), shown, limit)


async def heartbeat(url: str, interval: float = 30.0) -> None:
    """GET `url` every `interval` seconds until cancelled (failures are logged)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status >= 400:
                        log.warning("heartbeat %s answered %d", url, resp.status)
            except Exception as exc:
                log.warning("heartbeat %s failed: %s", url, exc)
            await asyncio.sleep(interval)


async def run_eval(cfg: EvalConfig, display: PlainDisplay | RichDisplay, idx: int, loaded_env: Any = None) -> EvalResult:
    """Run one eval to completion (or until cancelled); never raises except CancelledError.
    `loaded_env`: the run's environment when the caller already loaded it (`load_run_env`).
    Its code runs in the run's settings scope (`sandboxes.settings.use`): its sandboxes
    carry its label, its environment finds its wheelhouse, ... as its definition says."""
    from runner.config import with_running_settings
    from sandboxes import settings

    cfg = with_running_settings(cfg)
    with settings.use(cfg.process_settings()):
        return await _run_eval(cfg, display, idx, loaded_env)


async def _run_eval(cfg: EvalConfig, display: PlainDisplay | RichDisplay, idx: int, loaded_env: Any) -> EvalResult:
    run = _EvalRun(cfg, display, idx)
    try:
        run.plan()
        run.load(loaded_env)
        run.take_inputs()
        run.open()
        await run.generate()
        run.settle()
    except asyncio.CancelledError:  # SIGINT / SIGTERM: this task is the top of the eval, so finish cleanly
        run.status, run.error = "stopped", "interrupted"
    except StopRequested as exc:
        run.status, run.error = "stopped", str(exc)
    except (UsageError, MissingKeyError, ModelAuthError) as exc:  # the key is refused: fix it, as a usage error
        run.status, run.error = "failed", str(exc)
        run.result.usage_error = True
    except Exception as exc:
        run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
        log.info("%s: run failed with %s", cfg.env_id, run.error, exc_info=True, extra=RUN_LOG_ONLY)
    finally:
        await run.finish()
    return run.result


class _EvalRun:
    """One eval while `run_eval` drives it: the state its steps share (plan, load, inputs,
    open, generate, settle, finish)."""

    def __init__(self, cfg: EvalConfig, display: PlainDisplay | RichDisplay, idx: int):
        self.cfg, self.display, self.idx = cfg, display, idx
        self.result = EvalResult(config=cfg)
        self.progress = display.evals[idx]
        self.env: Any = None
        self.writer: ResultsWriter | None = None
        self.rec: Any = None
        self.rows: list[dict[str, Any]] = []
        self.started = time.time()
        self.prior_ms = 0.0
        self.base_url = cfg.client_config.base_urls()
        self.run_dir: Path | None = None
        self.status = "failed"
        self.error: str | None = None
        self.clients: list[Any] = []
        self.beats: list[asyncio.Future[Any]] = []
        self.planned = 0  # examples this run covers (metadata num_examples, also with -n -1)
        self.first_date: str | None = None
        self.todo: list[Any] = []
        self.kinds: collections.Counter[str] = collections.Counter()  # the registry's scored / errored counts
        self.save = cfg.save_results or cfg.resume
        self.resumed = False
        self.rewrite = False
        self.watch = EndpointWatch(cfg.endpoint_down_after)
        self.last_meta = time.monotonic()

    def metadata(self, status: str, run_dir: Path | None) -> dict[str, Any]:
        return _build_metadata(self.env, self.cfg, self.rows, run_dir, self.started, status, self.base_url,
                               self.prior_ms, self.planned, self.first_date)

    def plan(self) -> None:
        """Where the run goes is settled first, so that the registry records even a run
        that dies while loading its environment or checking its endpoint.
        (runner.resume: a new run's id names its directory; a resume continues a registry run)"""
        cfg = self.cfg
        plan = plan_run(cfg)
        self.run_dir, self.rows, self.resumed, self.prior_ms = plan.run_dir, plan.rows, plan.resumed, plan.prior_ms
        self.first_date, self.rewrite = plan.first_date, plan.rewrite
        self.result.run_dir = self.run_dir
        if not self.resumed:  # a resume is recorded once it passed its checks: a refused one leaves the run as it was
            self.rec = _recorder(cfg, self.run_dir, plan.run_id)
            self.result.run_id = self.rec.id if self.rec is not None else plan.run_id
            if self.rec is not None:
                log.info("%s: run %s started (follow: vf-sandbox runs logs %s --follow)", cfg.env_id, self.rec.id,
                         self.rec.id)

    def load(self, loaded_env: Any) -> None:
        """The run's environment and model clients."""
        cfg = self.cfg
        if cfg.num_workers > 1 and not cfg.hosted:  # hosted: the workers are Ray actors
            from runner.workers import warm_up_workers

            warm_up_workers(cfg)  # the workers' start-up overlaps this process loading its env
        self.env = loaded_env if loaded_env is not None else load_run_env(cfg)
        self.clients = make_run_clients(cfg, self.env)
        if self.env.requires_model:
            log.info("%s: model %s at %s (client retries per request: %d, --client-max-retries; "
                     "rollout retries: %d, --max-retries)", cfg.env_id, cfg.model, self.base_url,
                     cfg.client_config.max_retries, cfg.rollout_retries())

    def take_inputs(self) -> None:
        """The rollouts to run: the dataset's, less those a resumed run has scored."""
        cfg, rows, run_dir = self.cfg, self.rows, self.run_dir
        inputs = self.env.get_eval_inputs(cfg.num_examples, cfg.rollouts_per_example, cfg.shuffle, cfg.shuffle_seed)
        self.planned = len({i.get("example_id") for i in inputs})
        if 0 <= self.planned < cfg.num_examples:
            log.warning("%s: -n %d asked for more examples than the dataset has: running all %d example(s) "
                        "(x %d rollouts = %d)", cfg.env_id, cfg.num_examples, self.planned, cfg.rollouts_per_example,
                        len(inputs))
        self.todo = inputs
        if self.resumed:  # rows not scored were dropped by plan_run: they run again with the missing ones
            check_same_inputs(inputs, rows, run_dir)
            self.todo = missing_inputs(inputs, rows, cfg.rollouts_per_example)
            self.rec = _recorder(cfg, run_dir)
            self.result.run_id = self.rec.id if self.rec is not None else None
            log.info("%s: resuming run %s (%s): %d rollouts saved, %d to run", cfg.env_id,
                     self.result.run_id or run_dir, run_dir, len(rows), len(self.todo))

    def open(self) -> None:
        """The progress display and (with -s) the results file and metadata.json."""
        progress, rows = self.progress, self.rows
        progress.total = len(rows) + len(self.todo)
        progress.done = progress.resumed = len(rows)
        progress.reward_sum = sum(float(r.get("reward") or 0.0) for r in rows if is_scored(r))
        progress.errors = sum(1 for r in rows if r.get("error"))
        progress.infra = 0
        self.kinds = collections.Counter(verdict_of(r) for r in rows)
        progress.output = str(self.run_dir) if self.save else ""
        progress.status = "running"
        progress.started = time.time()
        self.display.update(self.idx)
        if self.save:
            self.writer = ResultsWriter(self.run_dir)
            if self.rewrite:
                self.writer.rewrite(rows)
            self.writer.open()
            self.writer.write_metadata(self.metadata("running", self.run_dir))
        self.last_meta = time.monotonic()

    async def on_group(self, group_rows: list[dict[str, Any]]) -> None:
        cfg, progress, writer = self.cfg, self.progress, self.writer
        self.watch.see(group_rows)
        if writer is not None:
            writer.append(group_rows)  # one write + flush + fsync per group, on the loop (no torn groups)
        self.rows.extend(group_rows)
        progress.done += len(group_rows)
        progress.reward_sum += sum(float(r.get("reward") or 0.0) for r in group_rows if is_scored(r))
        progress.infra += sum(1 for r in group_rows if not is_scored(r))
        progress.errors += sum(1 for r in group_rows if r.get("error"))
        self.kinds.update(verdict_of(r) for r in group_rows)
        for r in group_rows:
            if r.get("error"):
                log.warning(
                    "%s: rollout example_id=%s failed after %s attempt(s): %s",
                    cfg.env_id, r.get("example_id"), r.get("attempts"), r["error"],
                )
                tb = (r.get("error_info") or {}).get("traceback") if isinstance(r.get("error_info"), dict) else None
                if tb:  # the whole traceback goes to the run log (the console keeps one line)
                    log.info("%s: traceback of rollout example_id=%s:\n%s", cfg.env_id, r.get("example_id"),
                             tb.rstrip(), extra=RUN_LOG_ONLY)
        self.display.add_rows(self.idx, group_rows)
        self.display.update(self.idx)
        if self.rec is not None:
            self.rec.progress(completed=progress.done, total=progress.total, scored=self.kinds["scored"],
                              errors_by_kind={k: n for k, n in self.kinds.items() if k != "scored"})
        if writer is not None and time.monotonic() - self.last_meta > 1.0:
            self.last_meta = time.monotonic()
            writer.write_metadata(self.metadata("running", self.run_dir))

    def rollouts(self) -> Any:
        """The awaitable that runs `todo`: on Ray actors (hosted), in worker processes (-w N)
        or in this process's env."""
        cfg, env, clients, todo, watch = self.cfg, self.env, self.clients, self.todo, self.watch
        if cfg.hosted:  # this process is the Ray job of a hosted run: groups go to actors
            from runner.group_runner import GroupRunner
            from runner.ray_workers import generate_on_ray

            # this process runs groups on its own environment until the actors are ready
            return generate_on_ray(cfg, todo, self.on_group, local=GroupRunner(cfg, env, clients, 1, owned=False))
        if cfg.num_workers > 1:
            from runner.workers import generate_in_workers

            return generate_in_workers(cfg, todo, self.on_group, stop_starting=watch.event.is_set)
        # the endpoint down: no new rollout starts, those in flight finish (they fail fast if it
        # is still down, or succeed if it came back) and are recorded with their real verdicts
        env.start_gate = lambda: not watch.event.is_set()
        return env.generate(
            todo,
            clients[0] if len(clients) == 1 else clients,
            cfg.model,
            sampling_args=cfg.sampling_args,
            max_concurrent=cfg.max_concurrent_generation or cfg.max_concurrent,
            max_concurrent_scoring=cfg.max_concurrent_scoring or cfg.max_concurrent,
            interleave_scoring=not cfg.no_interleave_scoring,
            state_columns=cfg.state_columns,
            independent_scoring=cfg.independent_scoring,
            max_retries=cfg.rollout_retries(),
            on_group=self.on_group,
        )

    async def generate(self) -> None:
        """Run the rollouts (with the heartbeat and model-wait reports beside them) within
        --timeout-minutes; the endpoint down stops a hosted run at once."""
        cfg = self.cfg
        if cfg.heartbeat_url:
            self.beats.append(asyncio.ensure_future(heartbeat(cfg.heartbeat_url)))
        if not self.todo:
            return
        if not cfg.hosted and cfg.num_workers <= 1 and hasattr(self.env, "model_waits"):
            self.beats.append(asyncio.ensure_future(report_model_waits(self.env, cfg)))
        gen = self.rollouts()
        try:
            async with asyncio.timeout(cfg.timeout_minutes * 60):
                if cfg.hosted:
                    await run_until_endpoint_down(gen, self.watch)
                else:
                    await gen
        except asyncio.TimeoutError:
            raise StopRequested(f"timeout after {cfg.timeout_minutes:g} minute(s)") from None

    def settle(self) -> None:
        """The run's status and error once its rollouts ran (and -H's push)."""
        cfg, rows, watch = self.cfg, self.rows, self.watch
        ref = self.result.run_id or self.run_dir
        self.status, self.error = run_verdict(rows, self.progress.total, cfg, self.result.run_id or str(self.run_dir))
        if watch.down_since is not None and self.status != "completed":
            self.status, self.error = "incomplete", (
                f"the model endpoint {self.base_url} is down since {watch.down_since} ({watch.streak} rollouts in a "
                f"row could not connect: {watch.last_error}); stopped early: no rollout started after that, those "
                f"in flight finished: {len(rows)} of {self.progress.total} rollouts ran, "
                f"{verdict_counts(rows)['scored']} scored. When the endpoint is back, continue with: "
                f"vf-sandbox eval --resume {ref}")
        if cfg.save_to_hf_hub:
            push_to_hub(rows, cfg)

    async def finish(self) -> None:
        """Always: stop the side tasks, tear the env down, write the final metadata (and JUnit),
        close the clients and the results file, record the end in the registry."""
        cfg, result, rows, status, error = self.cfg, self.result, self.rows, self.status, self.error
        for b in self.beats:
            b.cancel()
        self.progress.status = status
        result.status, result.error, result.rows = status, error, rows
        if self.env is not None:
            await _teardown(self.env)
        if self.env is not None and self.run_dir is not None:
            result.metadata = self.metadata(status, self.run_dir if self.writer else None)
            if error:
                result.metadata["error"] = error
            if cfg.junit_xml:
                try:
                    write_junit(cfg.junit_xml, rows, result.metadata)
                except OSError as exc:
                    log.warning("cannot write the JUnit report %s: %s", cfg.junit_xml, exc)
        for c in self.clients:
            try:
                await asyncio.shield(c.close())
            except BaseException:  # noqa: BLE001
                pass
        self.close_writer()
        if self.rec is not None:
            final = collections.Counter(verdict_of(r) for r in rows)
            self.rec.progress(completed=len(rows), total=self.progress.total, scored=final["scored"],
                              errors_by_kind={k: n for k, n in final.items() if k != "scored"})
            self.rec.finish(status=status, error=error, error_kind="usage" if result.usage_error else None)
        self.display.update(self.idx)
        if error and status == "failed":  # the console gets it once, from the CLI's last line
            log.error("%s: %s", cfg.env_id, error, extra=RUN_LOG_ONLY)

    def close_writer(self) -> None:
        if self.writer is None:
            return
        try:  # a full disk must not keep the run's end out of metadata.json and the registry below
            self.writer.close()
        except OSError as exc:
            log.warning("%s", exc)
        try:
            self.writer.write_metadata(self.result.metadata)
        except OSError as exc:
            log.warning("cannot write metadata: %s", exc)


async def _teardown(env: Any) -> None:
    """Tear the env down (its sandboxes, cell hosts, pool) to the end: a second or third
    Ctrl-C while it runs does not abandon it (that leaked the cell host); a failure is
    logged with its reason and never masks the run's outcome."""
    task = asyncio.ensure_future(env.teardown())
    while True:
        try:
            await asyncio.shield(task)
            return
        except asyncio.CancelledError:
            if task.cancelled():  # the teardown itself was cancelled (the loop is closing)
                log.warning("teardown cancelled: sandboxes may be left behind (the reaper removes them)")
                return
            log.warning("interrupted again: still removing the run's sandboxes, waiting for that to finish")
        except BaseException as exc:  # noqa: BLE001 - teardown must not mask the outcome
            log.warning("teardown failed: %r", exc)
            return


async def run_evals(configs: list[EvalConfig], display: PlainDisplay | RichDisplay,
                    loaded_envs: list[Any] | None = None) -> list[EvalResult]:
    """Run every eval concurrently; SIGINT / SIGTERM stop them all gracefully.
    `loaded_envs`: their environments, when the caller already loaded them."""
    for cfg in configs:
        label = cfg.name or cfg.env_id
        display.add(EvalProgress(label=label, model=cfg.model))
    loop = asyncio.get_running_loop()
    envs = loaded_envs or [None] * len(configs)
    tasks = [asyncio.ensure_future(run_eval(cfg, display, i, envs[i])) for i, cfg in enumerate(configs)]
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        log.warning("received %s: stopping (keeping the groups already written)", signal.Signals(signum).name)
        for t in tasks:
            t.cancel()

    installed: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous = signal.getsignal(sig)
            loop.add_signal_handler(sig, on_signal, sig)
            installed[sig] = previous
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for sig, previous in installed.items():
            loop.remove_signal_handler(sig)
            if previous is not None:  # the CLI's own (a signal after teardown: exit 130 / 143, not -2 / -15)
                with contextlib.suppress(ValueError, TypeError, OSError):
                    signal.signal(sig, previous)
    results = []
    for cfg, out in zip(configs, outcomes):
        if isinstance(out, EvalResult):
            results.append(out)
        elif isinstance(out, asyncio.CancelledError):
            results.append(EvalResult(config=cfg, status="stopped", error="interrupted"))
        else:
            results.append(EvalResult(config=cfg, status="failed", error=f"{type(out).__name__}: {out}"))
    run_evals.signals = received  # type: ignore[attr-defined]
    return results
