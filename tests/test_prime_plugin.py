"""The Prime CLI plugin contract: the commands it builds run our CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vfcli.plugins.prime import PRIME_PLUGIN_API_VERSION, PrimeCLIPlugin, get_plugin, plugin
from testmodel.model_server import ModelServer, compute
from sandboxes.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


def test_contract_shape():
    p = get_plugin()
    assert PRIME_PLUGIN_API_VERSION == 1 and p.api_version == 1 and plugin() == p
    assert p.build_module_command(p.eval_module, ["x"]) == [sys.executable, "-m", "vfcli.commands.eval", "x"]
    with pytest.raises(UsageError, match="not provided"):
        p.build_module_command(p.gepa_module, [])
    with pytest.raises(Exception):
        p.eval_module = "other"  # frozen
    assert isinstance(p, PrimeCLIPlugin)


def test_built_eval_command_runs_an_eval(tmp_path):
    p = get_plugin()
    env = {**os.environ, "VF_E2E_KEY": "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
    env.pop("VF_RUN_ID", None)
    with ModelServer(compute()).run_in_thread() as srv:
        cmd = p.build_module_command(p.eval_module, [
            "math-single", "-p", str(ROOT / "environments"), "-e", str(tmp_path / "none.toml"), "-m", "local-model",
            "-b", srv.base_url, "-k", "VF_E2E_KEY", "-n", "2", "-r", "1", "-s", "-d"])
        res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        assert srv.count == 2
    run_dir = next((tmp_path / "outputs" / "evals" / "math-single--local-model").iterdir())
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["reward"] == 1.0 for r in rows)


def test_built_install_command_reaches_env_install(tmp_path):
    p = get_plugin()
    res = subprocess.run(p.build_module_command(p.install_module, ["--help"]), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "install" in res.stdout.lower()
    res = subprocess.run(p.build_module_command(p.install_module, ["no-such-env-xyz", "-p", str(tmp_path)]),
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode != 0 and "no-such-env-xyz" in (res.stderr + res.stdout)
