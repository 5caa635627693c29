"""The dashboard's JSON API (in-process aiohttp server) over a real registry."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dashboard import server as dashboard
from runs import registry


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("VF_RUNS_DB", str(tmp_path / "runs.db"))
    return tmp_path


@pytest.fixture
async def client(db):
    eps = db / "endpoints.toml"
    eps.write_text('[[endpoint]]\nendpoint_id = "local"\nmodel = "toy"\nurl = "http://127.0.0.1:9/v1"\n'
                   'key = "SECRET_VAR"\n[[endpoint]]\nendpoint_id = "local"\nmodel = "toy"\n'
                   'url = "http://127.0.0.1:10/v1"\nkey = "SECRET_VAR"\n')
    app = dashboard.make_app(endpoints_path=str(eps), allow_launch=False)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        yield c


def make_run(db, name="r", rows=()):
    out = db / name
    out.mkdir()
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write('{"example_id": 9, "rew')  # a partial last line, as mid-write
    rec = registry.RunRecorder.start(kind="eval", env_id="e", model="m", output_dir=out, capture_logging=False)
    return rec


async def test_runs_and_run_detail(client, db):
    rec = make_run(db, rows=[{"example_id": 0, "reward": 1.0}, {"example_id": 0, "reward": 0.0},
                             {"example_id": 1, "reward": 1.0}, {"example_id": 1, "reward": 1.0}])
    rec.progress(completed=2, total=2)
    runs = await (await client.get("/api/runs")).json()
    assert [r["id"] for r in runs] == [rec.id] and runs[0]["status"] == "running"
    d = await (await client.get(f"/api/runs/{rec.id}")).json()
    assert d["summary"]["n_rollouts"] == 4 and d["summary"]["pass_at_k"]["2"] == 1.0
    s = await (await client.get(f"/api/runs/{rec.id}/samples?limit=1")).json()
    assert s["total_groups"] == 2 and len(s["groups"]) == 1 and len(s["groups"][0]["rollouts"]) == 2
    assert s["groups"][0]["reward"]["std"] == 0.5
    assert (await client.get("/api/runs/nope")).status == 404
    rec.finish("completed")


async def test_log_is_read_incrementally(client, db):
    rec = make_run(db)
    first = await (await client.get(f"/api/runs/{rec.id}/log")).json()
    assert "started" in first["text"] and first["running"]
    with open(rec.log_path, "a") as f:
        f.write("new line\n")
    nxt = await (await client.get(f"/api/runs/{rec.id}/log?offset={first['offset']}")).json()
    assert nxt["text"] == "new line\n"
    rec.finish("failed", error="X: y")
    end = await (await client.get(f"/api/runs/{rec.id}/log?offset={nxt['offset']}")).json()
    assert "failed: X: y" in end["text"] and not end["running"]


async def test_guards(client, db):
    rec = make_run(db)
    # DNS rebinding: a foreign Host header is refused
    assert (await client.get("/api/runs", headers={"Host": "evil.example:80"})).status == 403
    # POSTs must be JSON (a cross-site form cannot start/stop processes)
    r = await client.post(f"/api/runs/{rec.id}/stop", data="x=1",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status == 415
    assert registry.get_run(rec.id).status == "running"
    # launching disabled
    r = await client.post("/api/launch", json={"env": "x"})
    assert r.status == 403
    rec.finish("completed")


async def test_endpoints_never_expose_keys(client):
    d = await (await client.get("/api/endpoints")).json()
    assert d["endpoints"] == [{"endpoint_id": "local", "model": "toy", "url": "http://127.0.0.1:9/v1"}]
    assert "SECRET" not in json.dumps(d)


def test_launch_argv_validation(tmp_path):
    argv = dashboard.launch_argv({"env": "toy-env", "endpoint": "local", "n": "4", "r": 2,
                                  "env_args": '{"split": "test"}'}, "eps.toml")
    assert argv[1:] == ["-m", "vfcli.app", "eval", "toy-env", "-s", "-e", "eps.toml", "-m", "local",
                        "-n", "4", "-r", "2", "-a", '{"split": "test"}']
    for bad in ({"env": ""}, {"env": "--evil"}, {"env": "x", "n": 0}, {"env": "x", "env_args": "[1]"},
                {"env": "x", "endpoint": "-b"}):
        with pytest.raises((ValueError, TypeError)):
            dashboard.launch_argv(bad, "eps.toml")
