"""Hosted runs (`vf-sandbox eval --hosted`) seen from any machine that reaches
the cluster: their status, logs, results and stop, through Ray's HTTP APIs
only (the Jobs API and the log API of the dashboard address); no Ray Client
connection, no shared file system.

A hosted run is a registry row (kind eval / swe-debug, `args.hosted` true,
`args.address` the cluster) plus a Ray job per attempt: `vf-<run id>` for the
first, `vf-<run id>-<n>` for the n-th (`--resume`). Its sandboxes carry the
run-id label `vf-<run id>` on every node.

- `refresh(rec)`: the row's status and progress from the job (and the pulled
  metadata); called by `vf-sandbox runs ...` before showing a hosted run.
- `pull(rec)`: the job's results.jsonl / metadata.json (on the head node, in
  `<Ray logs dir>/vf-sandbox/<job id>/`, served by Ray's log API) and its log
  into the row's local output dir and log file.
- `sync(rec)`: pull a running run's rows, log and progress now (the dashboard).
- `follow(rec)`: stream the job's log (polling every `poll_interval` s),
  pull the results as they come, until the job ends; the final row. A
  cluster that stops answering is retried for `reconnect_for` s (default 60),
  then `ClusterUnreachable` says how to reattach.
- `stop(rec)`: stop the Ray job (SIGTERM: the run keeps finished groups and
  its actors delete their sandboxes), then delete any sandbox of the run
  left on any node (a short cleanup job: a task per alive node), pull.

Needs the optional `ray` package (`pip install 'vf-sandbox[ray]'`).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from sandboxes.errors import BackendUnavailable, UsageError

from runs import registry
from runs.registry import RunRecord

INSTALL_HINT = "hosted runs need Ray on this machine: pip install 'vf-sandbox[ray]'"
RESULTS_SUBDIR = "vf-sandbox"
RESULT_FILES = ("results.jsonl", "metadata.json")
CLEANUP_ENTRYPOINT = "python -m hosted.cleanup"
ENDING_POLL = 0.1  # s between status polls once the job has printed its last line
RECONNECT_FOR = 60.0  # s a follower keeps retrying a cluster that stopped answering before it gives up


class ClusterUnreachable(BackendUnavailable):
    """The Ray cluster does not answer (or stopped answering a follower for longer
    than it waits); a run there may still be running."""


def address_of(rec: RunRecord) -> str:
    return str(rec.args.get("address") or "")


def job_id(rec: RunRecord, attempt: int | None = None) -> str:
    n = attempt or rec.attempts
    return f"vf-{rec.id}" if n <= 1 else f"vf-{rec.id}-{n}"


def sandbox_label(run_id: str) -> str:
    """The sandbox run-id label of every sandbox a hosted run creates."""
    return f"vf-{run_id}"


def jobs_client(address: str) -> Any:
    """A Ray JobSubmissionClient for `address`; UsageError when Ray is missing or the
    cluster does not answer."""
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, OSError) as exc:
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address} ({exc}); is it running? "
                         "(--address / RAY_ADDRESS is the dashboard's http://HOST:8265)") from None


def _status_name(status: Any) -> str:
    return str(getattr(status, "value", status))


# ------------------------------------------------------------------ results


def _http_get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.pull")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _job_log_text(client: Any, rec: RunRecord) -> str:
    parts = []
    for n in range(1, rec.attempts + 1):
        try:
            text = client.get_job_logs(job_id(rec, n))
        except Exception:  # noqa: BLE001 - an attempt whose job is gone (cluster restarted)
            continue
        parts.append(f"===== Ray job {job_id(rec, n)} on {address_of(rec)} =====\n{text}")
    return "".join(parts)


def pull(rec: RunRecord, client: Any | None = None, logs: bool = True) -> dict[str, Any]:
    """Copy the run's results (and log) from the cluster into its local output dir;
    returns the pulled metadata ({} when the job has written none yet)."""
    address = address_of(rec)
    client = client or jobs_client(address)
    jid = job_id(rec)
    info = client.get_job_info(jid)
    node = getattr(info, "driver_node_id", None)
    meta: dict[str, Any] = {}
    if node:
        query = urllib.parse.urlencode({"node_id": node, "glob": f"{RESULTS_SUBDIR}/{jid}/evals/*/*/*"})
        try:
            listing = json.loads(_http_get(f"{address}/api/v0/logs?{query}"))
            files = [f for group in (listing.get("data", {}).get("result") or {}).values() for f in group]
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot list the results of run {rec.id} on {address}: {exc}") from None
        wanted = {Path(f).name: f for f in files if Path(f).name in RESULT_FILES}
        out = Path(rec.output_dir)
        for name in RESULT_FILES:  # results first: metadata then never counts rows the local copy lacks
            if name not in wanted:
                continue
            q = urllib.parse.urlencode({"node_id": node, "filename": wanted[name], "lines": -1})
            data = _http_get(f"{address}/api/v0/logs/file?{q}", timeout=300)
            if name == "results.jsonl" and data and not data.endswith(b"\n"):
                data = data[: data.rfind(b"\n") + 1]  # a group being written: keep whole lines
            _write_atomic(out / name, data)
            if name == "metadata.json":
                try:
                    meta = json.loads(data)
                except ValueError:
                    meta = {}
    if logs:
        _write_atomic(Path(rec.log_path), _job_log_text(client, rec).encode())
    return meta


# ------------------------------------------------------------------ status


def _end_state(job_status: str, meta: dict[str, Any], message: str | None, log_text: str = "") -> tuple[str, str | None]:
    """The run's end state from its job's (SUCCEEDED / FAILED / STOPPED) and its metadata."""
    status = meta.get("status") if meta.get("status") in registry.END_STATES else None
    error = meta.get("error")
    if job_status == "STOPPED":
        return "stopped", error or "stopped (ray job stop / vf-sandbox runs stop)"
    if job_status == "SUCCEEDED":
        return status or "completed", error
    if not error:
        lines = [ln.strip() for ln in log_text.splitlines() if ln.strip().startswith("error:")]
        error = lines[-1][len("error:"):].strip() if lines else (message or "the Ray job failed")
    return (status if status in ("failed", "stopped") else "failed"), error


def _record(rec: RunRecord, meta: dict[str, Any]) -> None:
    if meta:
        total = int(meta.get("num_examples") or 0) * int(meta.get("rollouts_per_example") or 0)
        done = int(meta.get("completed_rollouts") or 0)
        by_kind = meta.get("errors_by_kind") if isinstance(meta.get("errors_by_kind"), dict) else None
        registry.set_progress(rec.id, done, max(total, done), int(meta.get("errored_rollouts", rec.errors)),
                              scored=meta.get("scored_rollouts"), errors_by_kind=by_kind)


def refresh(rec: RunRecord, client: Any | None = None) -> RunRecord:
    """Bring a running hosted run's row up to date with its Ray job (pulling its
    results when the job has ended). Unreachable clusters leave the row as it is."""
    if not registry.is_hosted(rec) or rec.status != "running":
        return rec
    try:
        client = client or jobs_client(address_of(rec))
        info = client.get_job_info(job_id(rec))
    except Exception:  # noqa: BLE001 - the cluster is away: show what we know
        return rec
    state = _status_name(info.status)
    if state in ("SUCCEEDED", "FAILED", "STOPPED"):
        try:
            meta = pull(rec, client)
        except Exception:  # noqa: BLE001 - the end state is known anyway
            meta = {}
        _record(rec, meta)
        log_text = Path(rec.log_path).read_text(errors="replace") if Path(rec.log_path).exists() else ""
        status, error = _end_state(state, meta, info.message, log_text)
        registry.mark_status(rec.id, status, error)  # type: ignore[arg-type]
    return registry.get_run(rec.id) or rec


def sync(rec: RunRecord) -> RunRecord:
    """A running hosted run brought up to date now: its rows, log and progress pulled
    while it runs (its end recorded once the job has ended). For watchers that do not
    follow (the dashboard); an unreachable cluster leaves the row as it is."""
    if not registry.is_hosted(rec) or rec.status != "running":
        return rec
    try:
        client = jobs_client(address_of(rec))
        state = _status_name(client.get_job_status(job_id(rec)))
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            return refresh(rec, client)
        _record(rec, pull(rec, client))
    except Exception:  # noqa: BLE001 - the cluster is away or has written nothing yet
        return rec
    return registry.get_run(rec.id) or rec


def refresh_all(recs: list[RunRecord]) -> list[RunRecord]:
    return [refresh(r) if registry.is_hosted(r) and r.status == "running" else r for r in recs]


# ------------------------------------------------------------------ follow


def follow(rec: RunRecord, poll_interval: float = 2.0, out: IO[str] | None = None,
           pull_every: float = 5.0, reconnect_for: float = RECONNECT_FOR) -> RunRecord:
    """Stream the run's job log to `out` until the job ends, pulling results as
    they come; returns the final row. A cluster that stops answering (head
    restarting, network) is retried for `reconnect_for` s, said once on `out`;
    then ClusterUnreachable (the row stays `running`: the run may go on)."""
    out = out or sys.stdout
    client = jobs_client(address_of(rec))
    jid = job_id(rec)
    shown = 0
    last_pull = 0.0
    lost_since: float | None = None
    while True:
        try:
            state = _status_name(client.get_job_status(jid))
            text = client.get_job_logs(jid)
        except Exception as exc:  # noqa: BLE001 - requests' errors, Ray's RuntimeError for HTTP errors
            lost_since = _lost_contact(rec, exc, lost_since, reconnect_for, out)
            time.sleep(min(max(poll_interval, 0.5), 5.0))
            continue
        if lost_since is not None:
            lost_since = None
            out.write(f"[vf-sandbox] reconnected to {address_of(rec)}\n")
        if len(text) > shown:
            out.write(text[shown:])
            out.flush()
            shown = len(text)
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        if time.monotonic() - last_pull >= pull_every:
            last_pull = time.monotonic()
            _pull_results(rec, client)
        # the job's last line ("run ID: status") is out: its process is exiting, the end is a moment away
        ending = f"\nrun {rec.id}: " in text[-2000:]
        time.sleep(min(poll_interval, ENDING_POLL) if ending else poll_interval)
    return refresh(registry.get_run(rec.id) or rec, client)


def _short(exc: BaseException) -> str:
    """An error's first line, bounded (requests' connection errors run to hundreds of characters)."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {text[:160]}"


def _lost_contact(rec: RunRecord, exc: BaseException, lost_since: float | None, reconnect_for: float,
                  out: IO[str]) -> float:
    """When contact was lost (monotonic): now on the first failure, said once on `out`; ClusterUnreachable
    once the cluster has not answered for `reconnect_for` s."""
    now = time.monotonic()
    if lost_since is None:
        out.write(f"[vf-sandbox] lost contact with the Ray cluster at {address_of(rec)} ({_short(exc)}); "
                  f"retrying for up to {reconnect_for:g} s\n")
        out.flush()
        return now
    if now - lost_since >= reconnect_for:
        raise ClusterUnreachable(
            f"lost contact with the Ray cluster at {address_of(rec)} for {reconnect_for:g} s "
            f"({_short(exc)}); run {rec.id} may still be running there: reattach with "
            f"`vf-sandbox runs logs {rec.id} --follow`, or `vf-sandbox runs show {rec.id}`") from None
    return lost_since


def _pull_results(rec: RunRecord, client: Any) -> None:
    """Pull the run's results so far into the registry; nothing yet or a transient error is ignored."""
    try:
        _record(rec, pull(rec, client, logs=False))
    except Exception:  # noqa: BLE001 - results not written yet / a transient error
        pass


def follow_log(rec: RunRecord, poll_interval: float = 2.0, out: IO[str] | None = None,
               reconnect_for: float = RECONNECT_FOR) -> RunRecord:
    """`vf-sandbox runs logs ID` of a hosted run: print (and with follow, stream) its
    job log; an ended run whose cluster is gone prints the pulled copy."""
    out = out or sys.stdout
    if rec.status == "running":
        return follow(rec, poll_interval, out, reconnect_for=reconnect_for)
    path = Path(rec.log_path)
    if path.exists() and path.stat().st_size:
        out.write(path.read_text(errors="replace"))
    else:
        out.write(_job_log_text(jobs_client(address_of(rec)), rec))
    out.flush()
    return rec


# ------------------------------------------------------------------ stop


def stop(rec: RunRecord, timeout: float = 120.0) -> tuple[RunRecord, int]:
    """Stop the run's Ray job, delete its sandboxes on every node, pull its results.
    Returns the final row and the number of sandboxes the cleanup removed."""
    client = jobs_client(address_of(rec))
    jid = job_id(rec)
    registry.request_stop(rec.id)
    client.stop_job(jid)
    deadline = time.monotonic() + timeout
    while _status_name(client.get_job_status(jid)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            raise UsageError(f"Ray job {jid} did not stop within {timeout:.0f}s")
        time.sleep(0.5)
    removed = delete_sandboxes(rec, client)
    final = refresh(registry.get_run(rec.id) or rec, client)
    if final.status == "running":  # the cluster answered the stop but not the refresh
        registry.mark_status(rec.id, "stopped", "stopped (vf-sandbox runs stop)")
        final = registry.get_run(rec.id) or final
    return final, removed


def delete_sandboxes(rec: RunRecord, client: Any | None = None, timeout: float = 120.0) -> int:
    """Delete every sandbox labelled with the run on every alive node of the cluster
    (a short Ray job: one task per node, each using its node's backend)."""
    client = client or jobs_client(address_of(rec))
    backend = str(rec.args.get("backend") or "docker")
    options = {k: v for k, v in (rec.args.get("backend_options") or {}).items() if v != "***"}
    entry = f"{CLEANUP_ENTRYPOINT} {sandbox_label(rec.id)} {shlex.quote(backend)} {shlex.quote(json.dumps(options))}"
    jid = client.submit_job(entrypoint=entry, submission_id=f"{job_id(rec)}-cleanup-{int(time.time())}",
                            metadata={"vf_run_id": rec.id, "vf_cleanup": "1"})
    deadline = time.monotonic() + timeout
    while _status_name(client.get_job_status(jid)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            client.stop_job(jid)
            raise UsageError(f"the sandbox cleanup job {jid} did not finish within {timeout:.0f}s")
        time.sleep(0.5)
    text = client.get_job_logs(jid)
    removed = [int(line.split()[1]) for line in text.splitlines() if line.startswith("removed ")]
    if _status_name(client.get_job_status(jid)) != "SUCCEEDED":
        raise UsageError(f"the sandbox cleanup job {jid} failed:\n{text[-2000:]}")
    return sum(removed)
