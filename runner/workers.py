"""`-w N`: N worker processes share one run.

The runner's process keeps everything a run has once: the run definition,
the results writer, the registry entry, the display. Each worker is a
process forked from a clean fork server (spawned where there is none) with
its own event loop and a `GroupRunner` (`runner.group_runner`, as a
hosted run's Ray actors): environment and model clients built from the same
run definition. The runner hands out
groups (one example's rollouts) a few at a time, so a fast worker takes more;
a worker sends back the finished rows of each group and the runner writes
them, so there is still one writer and no torn group. The hand-out, hold and
requeue rules are `runner.dispatch.GroupDispatcher`, shared with the Ray
actors of `--hosted` runs (`runner.ray_workers`).

A worker that dies loses nothing: the groups it held and had not returned go
back to the queue for the others (rows are only written when a group comes
back, so none is written twice); when no worker is left, the run fails with
the cause and `--resume` runs exactly what is missing. Stopping (SIGINT /
SIGTERM / timeout) cancels the runner's task: every worker gets SIGTERM,
cancels its rollouts, deletes its sandboxes (env teardown) and exits; groups
it finished meanwhile are still written.

Wire format: one JSON document per message on a duplex pipe.
  runner -> worker  {"group": id, "inputs": [...]}  |  {"stop": true}
  worker -> runner  {"ready": true}  |  {"group": id, "rows": [...]}  |  {"fatal": "..."}
                    |  {"log": {name, levelno, msg, exc_text, ...}}
A worker's log records (the run's own at INFO, every library's warnings) go
to the runner, which hands them to its loggers: they reach the console and
the run log as if the runner had logged them (retries, SWE phases...).
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from envs.results_file import dumps
from runner.config import EvalConfig, with_running_settings
from runner.dispatch import GroupDispatcher, WorkerFailed, per_worker_concurrency
from runner.group_runner import run_settings
from sandboxes import settings

__all__ = ["WorkerFailed", "generate_in_workers", "per_worker_concurrency", "worker_main"]

log = logging.getLogger("envs.runner.workers")

GroupSink = Callable[[list[dict[str, Any]]], Awaitable[None]]


# --------------------------------------------------------------------------- the worker process


_RUN_LOGGERS = ("envs", "swe_debug", "sandboxes", "backends")
"""Loggers whose INFO records a worker forwards (the run log's story); others: warnings only."""


class _LogToRunner(logging.Handler):
    """A worker's log handler: each record goes to the runner as a {"log": ...} message."""

    def __init__(self, conn: Connection, lock: threading.Lock):
        super().__init__(logging.INFO)
        self.conn, self.send_lock = conn, lock  # not `self.lock`: that is the Handler's own RLock
        self.addFilter(lambda r: r.levelno >= logging.WARNING or r.name.split(".")[0] in _RUN_LOGGERS)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc_text = self.formatException(record.exc_info) if record.exc_info else record.exc_text
            fields = {k: v for k, v in record.__dict__.items()
                      if k not in ("args", "exc_info", "exc_text", "msg", "stack_info") and _jsonable(v)}
            fields.update(msg=record.getMessage(), exc_text=exc_text)
            data = json.dumps({"log": fields}).encode()
            with self.send_lock:
                self.conn.send_bytes(data)
        except Exception:  # noqa: BLE001 - a log line must never break the worker
            self.handleError(record)

    def formatException(self, ei: Any) -> str:
        return logging.Formatter().formatException(ei)


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def relay_log(fields: dict[str, Any]) -> None:
    """The runner's side: hand a worker's record to this process's loggers."""
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if not logger.disabled:
        logger.handle(record)


def worker_main(cfg_json: str, conn: Connection, credentials: dict[str, str] | None = None) -> None:
    """Entry point of a worker process (spawned: nothing inherited but the arguments; the
    run definition carries everything it needs, its sandboxes' label and process settings
    included). Its code runs in the definition's settings scope; the registry credentials,
    never serialised in a definition, are the runner's, handed over beside it as
    `credentials` (their environment variables: a worker forks from a fork server that may
    have started before the runner's entry read them, so its own environment is no source)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the runner decides
    send_lock = threading.Lock()  # one writer at a time on the pipe (log records come from any thread)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(_LogToRunner(conn, send_lock))
    root.setLevel(logging.INFO)
    try:
        cfg = EvalConfig.model_validate_json(cfg_json)
        own = settings.ProcessSettings.from_env(credentials or {})  # the runner's credentials, nothing else
        with settings.use(run_settings(cfg, own)):
            asyncio.run(_serve(cfg, conn, send_lock))
    except BaseException:  # noqa: BLE001 - report, then exit non-zero
        try:
            with send_lock:
                conn.send_bytes(json.dumps({"fatal": traceback.format_exc()[-4000:]}).encode())
        except OSError:
            pass
        raise SystemExit(1) from None


async def _serve(cfg: EvalConfig, conn: Connection, send_lock: threading.Lock) -> None:
    from runner.group_runner import GroupRunner

    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    loop.add_signal_handler(signal.SIGTERM, me.cancel)  # type: ignore[union-attr]
    runner = GroupRunner.build(cfg, cfg.num_workers)
    inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def on_readable() -> None:
        try:
            while conn.poll():
                inbox.put_nowait(json.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            inbox.put_nowait(None)  # the runner is gone

    def send_locked(data: bytes) -> None:
        with send_lock:
            conn.send_bytes(data)

    async def send(msg: dict[str, Any]) -> None:
        await asyncio.to_thread(send_locked, dumps(msg).encode())

    async def run_group(gid: int, inputs: list[dict[str, Any]]) -> None:
        await send({"group": gid, "rows": await runner.run(gid, inputs)})

    tasks: set[asyncio.Task[None]] = set()
    loop.add_reader(conn.fileno(), on_readable)
    try:
        await send({"ready": True})
        while True:
            msg = await inbox.get()
            if msg is None or msg.get("stop"):
                break
            task = asyncio.ensure_future(run_group(int(msg["group"]), msg["inputs"]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        loop.remove_reader(conn.fileno())
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.shield(runner.close())  # deletes this worker's sandboxes before its clients close


# --------------------------------------------------------------------------- the runner's side


def worker_context(cfg: EvalConfig) -> Any:
    """How workers start: from a fork server (a clean, single-threaded process that
    imported the eval stack and the run's model client (the SDK: most of a worker's
    start-up) once, so each worker forks ready instead of importing it again), or
    spawned where fork servers do not exist. Never a plain fork of the runner, whose
    threads and event loop a child must not inherit."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        from envs.clients import client_module

        ctx = multiprocessing.get_context("forkserver")
        clients = sorted({client_module(c.client_type) for c in cfg.client_config.replicas()})
        ctx.set_forkserver_preload(["runner.workers", "runner.group_runner", "runner.setup", "envs.outputs", "envs.clients", *clients])
        return ctx
    return multiprocessing.get_context("spawn")


def warm_up_workers(cfg: EvalConfig) -> None:
    """Start the fork server now (it imports in the background while the runner loads
    its environment), so the workers are ready sooner."""
    if cfg.num_workers > 1:
        ctx = worker_context(cfg)
        if ctx.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()


class _Worker:
    def __init__(self, index: int, proc: Any, conn: Connection):
        self.index, self.proc, self.conn = index, proc, conn
        self.gone = False
        self.fatal: str | None = None


def _feed(w: _Worker, groups: GroupDispatcher, stopping: Callable[[], bool]) -> None:
    """Send worker `w` the groups it has room for, none once `stopping()`."""
    if stopping():
        return
    for gid, group in groups.take(w):
        if not _send(w, {"group": gid, "inputs": group}):
            return  # it died: its EOF arrives as an event, and its groups go back then


async def _handle_event(w: _Worker, msg: dict[str, Any] | None, groups: GroupDispatcher, on_group: GroupSink,
                        stopping: Callable[[], bool]) -> None:
    """Act on one event of worker `w`: its death (None: its groups go back and the live workers are fed),
    ready, a fatal error, or a finished group (handed to `on_group` unless already given to another)."""
    if msg is None:  # the worker died (or closed its pipe)
        if not w.gone:
            _worker_died(w, groups)  # its groups go back to the queue (WorkerFailed when none is left)
            for x in groups.alive:
                _feed(x, groups, stopping)
    elif msg.get("ready"):
        groups.ready(w)
        _feed(w, groups, stopping)
    elif "fatal" in msg:
        w.fatal = msg["fatal"]
    else:
        if not groups.finished(w, int(msg["group"])):
            return  # already handed to another worker after a presumed death: never written twice
        await on_group(msg["rows"])
        _feed(w, groups, stopping)


async def generate_in_workers(cfg: EvalConfig, inputs: list[dict[str, Any]], on_group: GroupSink,
                              stop_starting: Callable[[], bool] | None = None) -> None:
    """Run `inputs` (grouped by example_id) on `cfg.num_workers` worker processes,
    awaiting `on_group(rows)` in this process for every finished group. Once
    `stop_starting()` is true (the model endpoint is down) no group is sent any more: the
    groups the workers hold finish, and the run ends with the rest not run. The workers
    run with the definition's label and settings (the running ones where it names none)."""
    cfg = with_running_settings(cfg)
    stopping = stop_starting or (lambda: False)
    groups = GroupDispatcher(inputs, per_worker_concurrency(cfg))
    if not groups.remaining:
        return

    events: asyncio.Queue[tuple[_Worker, dict[str, Any] | None]] = asyncio.Queue()
    workers = _start_workers(cfg, groups, events)

    try:
        while groups.remaining and not (stopping() and not groups.holding):
            w, msg = await events.get()
            await _handle_event(w, msg, groups, on_group, stopping)
        for w in workers:
            if not w.gone:
                _send(w, {"stop": True})
    finally:
        killed = await _shut_down(workers, groups, events, on_group,  # endpoint down, nothing held: a plain stop
                                  stopping=groups.remaining > 0 and (groups.holding > 0 or not stopping()))
        if killed:  # a worker that did not stop could not delete its sandboxes: the runner does
            await asyncio.shield(_delete_left_behind(cfg))


def _start_workers(cfg: EvalConfig, groups: GroupDispatcher,
                   events: asyncio.Queue[tuple[_Worker, dict[str, Any] | None]]) -> list[_Worker]:
    """`cfg.num_workers` worker processes, each handed the run definition and registered with
    `groups`; what they send arrives on `events` (log records are relayed at once; None: the
    worker's pipe closed)."""
    ctx = worker_context(cfg)
    loop = asyncio.get_running_loop()
    workers: list[_Worker] = []
    cfg_json = cfg.model_dump_json()  # the settings travel in the definition, the credentials beside it
    credentials = settings.current().credential_variables()  # a local pipe, never written anywhere
    for i in range(cfg.num_workers):
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=worker_main, args=(cfg_json, child, credentials), name=f"vf-eval-worker-{i}",
                           daemon=True)  # never outlives the runner (multiprocessing terminates it at exit)
        proc.start()
        child.close()
        w = _Worker(i, proc, parent)
        workers.append(w)
        groups.add(w)

        def readable(w: _Worker = w) -> None:
            try:
                while w.conn.poll():
                    msg = json.loads(w.conn.recv_bytes())
                    if "log" in msg:  # at once, in order with the rows that follow it
                        relay_log(msg["log"])
                    else:
                        events.put_nowait((w, msg))
            except (EOFError, OSError):
                loop.remove_reader(w.conn.fileno())
                events.put_nowait((w, None))

        loop.add_reader(parent.fileno(), readable)
    return workers


def _worker_died(w: _Worker, groups: GroupDispatcher) -> None:
    """A worker is gone: its unfinished groups go back to the others; WorkerFailed when it was the last."""
    w.gone = True
    w.proc.join(timeout=5)
    lost = groups.lost(w)
    log.warning("worker %d exited (code %s)%s; %d unfinished group(s) go to the other workers",
                w.index, w.proc.exitcode, f": {w.fatal.strip().splitlines()[-1]}" if w.fatal else "", len(lost))
    if not groups.alive:
        raise WorkerFailed(f"every worker died; last: worker {w.index} exit {w.proc.exitcode}"
                           + (f"\n{w.fatal}" if w.fatal else ""))


def _send(w: _Worker, msg: dict[str, Any]) -> bool:
    """Send to a worker; False when its pipe is already broken (it is dying)."""
    try:
        w.conn.send_bytes(dumps(msg).encode())
        return True
    except (BrokenPipeError, ConnectionResetError, OSError):
        return False


async def _delete_left_behind(cfg: EvalConfig) -> None:
    from sandboxes.lifecycle import delete_run_sandboxes

    try:
        n = await delete_run_sandboxes(cfg.backend, cfg.backend_options, cfg.sandbox_run_id)
        if n:
            log.warning("deleted %d sandbox(es) a killed worker left behind", n)
    except Exception as exc:  # noqa: BLE001 - best effort: the reaper gets the rest
        log.warning("could not delete the sandboxes a killed worker left (the reaper will): %s", exc)


async def _shut_down(workers: list[_Worker], groups: GroupDispatcher, events: asyncio.Queue, on_group: GroupSink,
                     stopping: bool, stop_seconds: float = 60) -> bool:
    """Stop the workers (SIGTERM when the run is being stopped), write the groups they
    still finish, wait (up to `stop_seconds`) for their sandbox teardown, and never leave
    a process behind: True when a worker had to be killed (its sandboxes may remain)."""
    loop = asyncio.get_running_loop()
    if stopping:
        for w in workers:
            if w.proc.is_alive():
                os.kill(w.proc.pid, signal.SIGTERM)
    deadline = loop.time() + stop_seconds
    killed = False
    while any(not w.gone for w in workers) and loop.time() < deadline:
        try:
            async with asyncio.timeout(max(0.1, deadline - loop.time())):
                w, msg = await events.get()
        except asyncio.TimeoutError:
            break
        if msg is None:
            w.gone = True
        elif "rows" in msg and groups.finished(w, int(msg["group"])):
            await on_group(msg["rows"])
    for w in workers:
        try:
            loop.remove_reader(w.conn.fileno())
        except (ValueError, OSError):
            pass
        w.proc.join(timeout=1)
        if w.proc.is_alive():
            log.warning("worker %d did not stop; killing it", w.index)
            w.proc.kill()
            w.proc.join(timeout=5)
            killed = True
        w.conn.close()
    return killed
