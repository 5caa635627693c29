"""The local results dashboard: an aiohttp server with a small JSON API over
the run registry and the runs' output dirs, plus one static page
(`static/index.html`, `app.js`, `style.css`; no build step).

API (all GET unless noted):
  /api/runs?status=&env=&model=&kind=   runs, newest first (live status/progress, avg reward, pass@k,
                                        what became of the outputs, failure category)
  /api/runs/{id}                        run record + summary (metrics, pass@k, errors, timing, histogram)
                                        + outputs state + diagnosis (failure category and hint)
  /api/runs/{id}/samples?offset=&limit= rollouts grouped by example
  /api/runs/{id}/rows                   the samples table: one compact entry per rollout, groups in example order
  /api/runs/{id}/rows/{idx}             one raw row (as written) with per-turn timing and error details
  /api/runs/{id}/instances              swe-debug rows (reason, timings, log tails)
  /api/runs/{id}/log?offset=            log text from a byte offset (tail when omitted)
  POST /api/runs/{id}/stop              graceful stop (same as `vf-sandbox runs stop`)
  /api/endpoints                        endpoint aliases from configs/endpoints.toml
  POST /api/launch                      start `vf-sandbox eval` as a subprocess

Hosted runs (`--hosted`) still running are synced from their Ray cluster every
few seconds (rows, log, progress: `hosted.jobs.sync`), so they show live.

Loopback by default. Requests whose Host header is not the bound address or
localhost are refused (DNS-rebinding guard) and POSTs must carry JSON (a
cross-site form cannot), since the page can start and stop processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

from aiohttp import web

from runs import registry, results

STATIC = Path(__file__).with_name("static")
CFG = web.AppKey("cfg", dict)
CHILDREN = web.AppKey("children", list)
LOG_CHUNK = 256 * 1024
MAX_SAMPLE_GROUPS = 200


def _run_json(rec: registry.RunRecord, overview: bool = False) -> dict:
    from runs.diagnose import diagnose

    d = rec.model_dump()
    d["display_status"] = rec.display_status
    d["duration"] = rec.duration
    d["outputs"] = results.outputs_state(rec)
    dx = diagnose(rec)
    d["failure_category"] = dx.category if dx else None
    d["verdicts"] = _verdicts(rec)
    if overview:
        d.update(results.run_overview(rec))
    return d


def _verdicts(rec: registry.RunRecord) -> dict | None:
    """The run's scored / errored counts and its scored-only average, as its metadata.json
    says (written by the runner at every group and at the end); None without one."""
    try:
        meta = json.loads((Path(rec.output_dir) / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(meta, dict) or "scored_rollouts" not in meta:
        return None
    return {"scored": meta.get("scored_rollouts", 0), "errored": meta.get("errored_rollouts", meta.get("infra_errors", 0)),
            "by_kind": meta.get("errors_by_kind") or {}, "avg_reward_scored": meta.get("avg_reward"),
            "status": meta.get("status")}


def _get(request: web.Request) -> registry.RunRecord:
    try:
        rec = registry.get_run(request.match_info["id"])
    except registry.AmbiguousRunId as exc:
        raise web.HTTPBadRequest(text=str(exc))
    if rec is None:
        raise web.HTTPNotFound(text="no such run")
    return rec


async def _thread(fn, *a, **kw):
    return await asyncio.to_thread(fn, *a, **kw)


async def list_runs(request: web.Request) -> web.Response:
    q = request.query
    request.app[CHILDREN][:] = [p for p in request.app[CHILDREN] if p.poll() is None]  # reap
    runs = await _thread(registry.list_runs, status=q.get("status") or None, env_id=q.get("env") or None,
                         model=q.get("model") or None, kind=q.get("kind") or None,
                         limit=int(q.get("limit", 500)))
    body = await _thread(lambda: [_run_json(r, overview=True) for r in runs])
    return web.json_response(body)


async def get_run(request: web.Request) -> web.Response:
    from runs.diagnose import diagnose

    rec = await _thread(_get, request)
    summary = await _thread(results.summarize_run, rec)
    dx = diagnose(rec, summary)
    return web.json_response({"run": _run_json(rec), "summary": summary,
                              "diagnosis": dx.model_dump() if dx else None},
                             dumps=lambda o: json.dumps(o, default=str))


async def rows_table(request: web.Request) -> web.Response:
    rec = await _thread(_get, request)
    rows = await _thread(results.read_rows, rec)
    return web.json_response(results.sample_table(rows), dumps=lambda o: json.dumps(o, default=str))


async def row_detail(request: web.Request) -> web.Response:
    rec = await _thread(_get, request)
    rows = await _thread(results.read_rows, rec)
    try:
        idx = int(request.match_info["idx"])
    except ValueError:
        raise web.HTTPBadRequest(text="row index must be an integer")
    d = results.sample_detail(rows, idx)
    if d is None:
        raise web.HTTPNotFound(text="no such row")
    return web.json_response(d, dumps=lambda o: json.dumps(o, default=str))


async def samples(request: web.Request) -> web.Response:
    rec = await _thread(_get, request)
    offset = max(0, int(request.query.get("offset", 0)))
    limit = min(MAX_SAMPLE_GROUPS, max(1, int(request.query.get("limit", 20))))
    rows = await _thread(results.read_rows, rec)
    return web.json_response(results.sample_groups(rows, offset, limit),
                             dumps=lambda o: json.dumps(o, default=str))


async def instances(request: web.Request) -> web.Response:
    rec = await _thread(_get, request)
    rows = await _thread(results.read_rows, rec)
    return web.json_response({"instances": results.swe_instances(rows)},
                             dumps=lambda o: json.dumps(o, default=str))


def _read_log(path: str, offset: int | None) -> dict:
    try:
        size = os.path.getsize(path)
    except OSError:
        return {"text": "", "offset": 0, "size": 0, "truncated": False}
    truncated = False
    if offset is None or offset < 0 or offset > size:
        offset = max(0, size - LOG_CHUNK)
        truncated = offset > 0
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(LOG_CHUNK)
    return {"text": data.decode("utf-8", "replace"), "offset": offset + len(data), "size": size,
            "truncated": truncated}


async def log(request: web.Request) -> web.Response:
    rec = await _thread(_get, request)
    off = request.query.get("offset")
    body = await _thread(_read_log, rec.log_path, int(off) if off not in (None, "") else None)
    body["running"] = rec.status == "running"
    return web.json_response(body)


async def _json_body(request: web.Request) -> dict:
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text="send application/json")
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="invalid JSON")
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


async def stop(request: web.Request) -> web.Response:
    from dashboard.stop import StopError, stop_run

    await _json_body(request)
    rec = await _thread(_get, request)
    try:
        rec = await _thread(stop_run, rec.id, timeout=float(request.query.get("timeout", 60)))
    except StopError as exc:
        return web.json_response({"ok": False, "error": str(exc)}, status=409)
    return web.json_response({"ok": True, "run": _run_json(rec)})


def read_endpoints(path: str) -> list[dict]:
    """Endpoint aliases (id, model, url; never the key) from an endpoints.toml."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return []
    seen: dict[str, dict] = {}
    for row in data.get("endpoint", []) or []:
        if isinstance(row, dict) and row.get("endpoint_id"):
            seen.setdefault(str(row["endpoint_id"]), {
                "endpoint_id": str(row["endpoint_id"]), "model": row.get("model"), "url": row.get("url")})
    return list(seen.values())


async def endpoints(request: web.Request) -> web.Response:
    cfg = request.app[CFG]
    return web.json_response({"endpoints": read_endpoints(cfg["endpoints_path"]),
                              "allow_launch": cfg["allow_launch"]})


def launch_argv(body: dict, endpoints_path: str) -> list[str]:
    """`vf-sandbox eval` argv for a launch request (validated)."""
    env = str(body.get("env") or "").strip()
    if not env or env.startswith("-"):
        raise ValueError("env is required")
    argv = [sys.executable, "-m", "vfcli.app", "eval", env, "-s", "-e", endpoints_path]
    endpoint = str(body.get("endpoint") or "").strip()
    if endpoint:
        if endpoint.startswith("-"):
            raise ValueError("bad endpoint")
        argv += ["-m", endpoint]
    for key, flag in (("n", "-n"), ("r", "-r")):
        if body.get(key) not in (None, ""):
            v = int(body[key])
            if v < 1:
                raise ValueError(f"{key} must be >= 1")
            argv += [flag, str(v)]
    env_args = body.get("env_args")
    if isinstance(env_args, str) and env_args.strip():
        env_args = json.loads(env_args)
    if env_args:
        if not isinstance(env_args, dict):
            raise ValueError("env_args must be a JSON object")
        argv += ["-a", json.dumps(env_args)]
    if body.get("name"):
        argv += ["--eval-name", str(body["name"])]
    return argv


async def launch(request: web.Request) -> web.Response:
    cfg = request.app[CFG]
    if not cfg["allow_launch"]:
        raise web.HTTPForbidden(text="launching is disabled (--no-launch)")
    body = await _json_body(request)
    try:
        argv = launch_argv(body, cfg["endpoints_path"])
    except (ValueError, TypeError) as exc:
        return web.json_response({"ok": False, "error": str(exc)}, status=400)
    run_id = uuid.uuid4().hex[:12]
    ldir = registry.logs_dir()
    ldir.mkdir(parents=True, exist_ok=True)
    console = ldir / f"{run_id}.console.log"
    envv = dict(os.environ, VF_RUN_ID=run_id, VF_RUNS_DB=str(registry.db_path()))
    with open(console, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=envv, cwd=cfg["cwd"], start_new_session=True)
    request.app[CHILDREN].append(proc)
    # Wait briefly for the run to register itself, so the page can open it.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if await _thread(registry.get_run, run_id) is not None:
            return web.json_response({"ok": True, "run_id": run_id, "pid": proc.pid})
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.2)
    text = console.read_text(errors="replace")[-4000:] if console.exists() else ""
    return web.json_response({"ok": False, "pid": proc.pid, "exit_code": proc.poll(),
                              "error": "the run did not register itself", "console": text}, status=502)


@web.middleware
async def guard(request: web.Request, handler):
    allowed = request.app[CFG]["allowed_hosts"]
    host = (request.host or "").rsplit(":", 1)[0].strip("[]")
    if allowed and host not in allowed:
        raise web.HTTPForbidden(text="unexpected Host header")
    resp = await handler(request)
    if request.path.startswith("/api/"):
        resp.headers["Cache-Control"] = "no-store"
    return resp


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


HOSTED_SYNC_SECONDS = 3.0


async def _sync_hosted(app: web.Application) -> None:
    """Keep running hosted runs' rows, logs and progress current (Ray installed or not:
    without it, or with the cluster away, they stay as recorded)."""
    from hosted.jobs import sync

    while True:
        try:
            running = await _thread(registry.list_runs, status="running")
            for rec in running:
                if registry.is_hosted(rec):
                    await _thread(sync, rec)
        except Exception:  # noqa: BLE001 - never take the dashboard down
            pass
        await asyncio.sleep(HOSTED_SYNC_SECONDS)


async def _hosted_sync_ctx(app: web.Application):
    task = asyncio.ensure_future(_sync_hosted(app))
    yield
    task.cancel()


def make_app(*, host: str = "127.0.0.1", endpoints_path: str = "configs/endpoints.toml",
             allow_launch: bool = True) -> web.Application:
    app = web.Application(middlewares=[guard])
    wildcard = host in ("0.0.0.0", "::", "")
    app[CFG] = {
        "endpoints_path": str(Path(endpoints_path).resolve()),
        "allow_launch": allow_launch,
        "cwd": os.getcwd(),
        "allowed_hosts": None if wildcard else {host, "localhost", "127.0.0.1", "::1"},
    }
    app[CHILDREN] = []
    app.cleanup_ctx.append(_hosted_sync_ctx)
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/api/runs", list_runs)
    app.router.add_get("/api/runs/{id}", get_run)
    app.router.add_get("/api/runs/{id}/samples", samples)
    app.router.add_get("/api/runs/{id}/instances", instances)
    app.router.add_get("/api/runs/{id}/rows", rows_table)
    app.router.add_get("/api/runs/{id}/rows/{idx}", row_detail)
    app.router.add_get("/api/runs/{id}/log", log)
    app.router.add_post("/api/runs/{id}/stop", stop)
    app.router.add_get("/api/endpoints", endpoints)
    app.router.add_post("/api/launch", launch)
    return app


def serve(*, host: str = "127.0.0.1", port: int = 8787, endpoints_path: str = "configs/endpoints.toml",
          allow_launch: bool = True) -> None:
    """Bind first (an OSError, e.g. the port is taken, reaches the caller before
    anything is printed), then say where the dashboard is and serve until Ctrl-C."""
    app = make_app(host=host, endpoints_path=endpoints_path, allow_launch=allow_launch)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            print(f"vf-sandbox dashboard on http://{host}:{port}/  (registry {registry.db_path()})", flush=True)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
