"""Secrets never land in results, metadata, the run registry or logs: an eval
run with a distinctive API key and a header carrying a token, verbose logging
on, leaves neither value in any file it wrote nor in its console output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from testmodel.model_server import ModelServer, compute

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-vf-secret-4f1c0de9a7"
TOKEN = "tok-vf-header-93be21"


def test_api_key_and_header_values_never_written(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "VF_SECRET_KEY": KEY, "VF_RUNS_DB": str(tmp_path / "runs.db")}
    with ModelServer(compute()).run_in_thread() as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "vfcli.app", "eval", "math-single", "-m", "toy", "-b", srv.base_url,
             "-k", "VF_SECRET_KEY", "--header", f"X-Team-Token: {TOKEN}", "-n", "3", "-r", "2", "-s", "-v", "-d",
             "-o", str(out), "-e", str(tmp_path / "none.toml")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )
        received = list(srv.requests)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the secrets were really in play: the server got both with every request
    assert received and all(r.headers.get("Authorization") == f"Bearer {KEY}" for r in received)
    assert all(r.headers.get("X-Team-Token") == TOKEN for r in received)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "results.jsonl" for p in written) and any(p.suffix == ".log" for p in written)
    for p in written:
        data = p.read_bytes()
        assert KEY.encode() not in data, f"API key written to {p}"
        assert TOKEN.encode() not in data, f"header token written to {p}"
    console = proc.stdout + proc.stderr
    assert KEY not in console and TOKEN not in console
    assert b"VF_SECRET_KEY" in (tmp_path / "runs.db").read_bytes()  # the key is recorded by its variable's name
