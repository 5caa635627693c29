"""The run definition (`EvalConfig`): resolved once, serialisable, recorded in
metadata.json and the run registry, and enough to run the run again.

Checked here: defaults and bounds, `backend` per [[eval]] in TOML, `-x`
keys honoured or refused, `--from-run` reproducing a definition exactly, and
`runs stop` cleaning up on the backend the run recorded (local here, where
the old code asked Docker). The evals run `vf-sandbox eval` as a subprocess
against the local scripted model server, in real Docker / local sandboxes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import envs as vf
from runner.config import EvalConfig, configs_from_cli, configs_from_toml
from runs import registry
from testmodel.model_server import ModelServer, stall
from sandboxes import get_backend
from sandboxes.errors import ConfigError
from sandboxes.labels import MANAGED, RUN_ID
from test_sandbox_env import container_of, containers_with, wait_gone

REPO = Path(__file__).resolve().parents[1]
ENVS = REPO / "environments"
KEY = "VF_RUNDEF_TEST_KEY"


def bash_files_policy():
    sys.path.insert(0, str(ENVS / "bash_files"))
    import bash_files

    return bash_files.scripted_policy()


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, KEY: "k", "VF_RUNS_DB": str(tmp_path / "runs.db")}
    env.pop("VF_RUN_ID", None)
    return env


def vf_cli(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vfcli.app", *args], cwd=tmp_path, env=cli_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)


def toml_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(x)}' for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)


def write_toml(tmp_path: Path, base_url: str, evals: list[dict], **top) -> Path:
    (tmp_path / "no-endpoints.toml").write_text("")
    lines = [f'model = "test-model"', f'api_base_url = "{base_url}"', f'api_key_var = "{KEY}"',
             f'endpoints_path = "{tmp_path / "no-endpoints.toml"}"', f'env_dir_path = "{ENVS}"']
    lines += [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for e in evals:
        lines.append("\n[[eval]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in e.items()]
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- resolution (no engine)


def test_defaults_bounds_and_round_trip(tmp_path):
    (tmp_path / "none.toml").write_text("")
    (cfg,) = configs_from_cli(["math-single"], {"endpoints_path": str(tmp_path / "none.toml"), "env_dir_path": str(ENVS)})
    assert cfg.timeout_minutes == 120 and cfg.backend == "docker" and cfg.num_workers == 1
    assert cfg.retry_policy().attempts == cfg.max_retries + 1 == 1
    assert EvalConfig.model_validate_json(cfg.model_dump_json()) == cfg  # one serialisable object
    for bad, match in [({"timeout_minutes": 1441}, "timeout_minutes"), ({"backend": "nope"}, "unknown sandbox backend 'nope'"),
                       ({"num_workers": 0}, "num_workers"), ({"max_retries": -1}, "max_retries")]:
        with pytest.raises(ConfigError, match=match):
            configs_from_cli(["math-single"], {"endpoints_path": str(tmp_path / "none.toml"), "env_dir_path": str(ENVS), **bad})


def test_backend_per_eval_in_toml(tmp_path):
    path = write_toml(tmp_path, "http://127.0.0.1:9/v1", [
        {"env_id": "bash-files", "backend": "local", "backend_options": {"base_dir": str(tmp_path / "sb")}},
        {"env_id": "bash-files"},
    ], backend="docker")
    local, docker = configs_from_toml(path)
    assert (local.backend, local.backend_options) == ("local", {"base_dir": str(tmp_path / "sb")})
    assert (docker.backend, docker.backend_options) == ("docker", {})
    path.write_text(path.read_text().replace('backend = "local"', 'backend = "lcoal"'))
    with pytest.raises(ConfigError, match="'lcoal'"):
        configs_from_toml(path)


def test_extra_env_kwargs_reach_the_sandbox_spec_or_are_refused():
    env = vf.SandboxEnv(dataset=[{"question": "q", "answer": "a"}])
    env.set_kwargs(docker_image="vf-sandbox/python:3.11", cpu_cores=2, memory_gb=3, timeout_per_command_seconds=7)
    spec = env.sandbox_spec
    assert (spec.image, spec.cpu_cores, spec.memory_gb, spec.timeout_per_command_seconds) == ("vf-sandbox/python:3.11", 2, 3, 7)
    with pytest.raises(ConfigError, match="'dockr_image'"):
        env.set_kwargs(dockr_image="x")
    with pytest.raises(ConfigError, match="memory_gb"):
        env.set_kwargs(memory_gb=-1)
    assert env.sandbox_spec.memory_gb == 3  # a refused setting changes nothing


def test_isolation_from_x_toml_and_the_run_definition(tmp_path):
    """`isolation` is one field of the run definition, whichever way it is given: `-x
    isolation=gvisor` (lifted out of the env settings), TOML top level or per [[eval]];
    unset it is None (the env's own choice); a bad value or two different ones are refused."""
    from runner.config import parse_kwargs

    base = {"endpoints_path": str(tmp_path / "none.toml"), "env_dir_path": str(ENVS)}
    (tmp_path / "none.toml").write_text("")
    assert parse_kwargs("isolation=gvisor", "-x") == {"isolation": "gvisor"}
    assert parse_kwargs("isolation=gvisor,memory_gb=2,labels={\"a\": \"b,c\"}", "-x") == {
        "isolation": "gvisor", "memory_gb": 2, "labels": {"a": "b,c"}}
    assert parse_kwargs('{"isolation": "gvisor"}', "-x") == {"isolation": "gvisor"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_kwargs("gvisor", "-x")
    (plain,) = configs_from_cli(["bash-files"], base)
    assert plain.isolation is None
    (cfg,) = configs_from_cli(["bash-files"], {**base, "extra_env_kwargs": parse_kwargs("isolation=gvisor,memory_gb=2", "-x")})
    assert cfg.isolation == "gvisor" and cfg.extra_env_kwargs == {"memory_gb": 2}
    assert cfg.public_args()["isolation"] == "gvisor"
    assert EvalConfig.model_validate_json(cfg.model_dump_json()) == cfg
    for bad, match in [({"isolation": "kata"}, "isolation must be one of runc, gvisor"),
                       ({"isolation": "runc", "extra_env_kwargs": {"isolation": "gvisor"}}, "isolation is set twice")]:
        with pytest.raises(ConfigError, match=match):
            configs_from_cli(["bash-files"], {**base, **bad})
    path = write_toml(tmp_path, "http://127.0.0.1:9/v1", [{"env_id": "bash-files"},
                                                            {"env_id": "bash-files", "isolation": "runc"}], isolation="gvisor")
    assert [c.isolation for c in configs_from_toml(path)] == ["gvisor", "runc"]


def test_the_run_isolation_reaches_every_kind_of_sandbox_env(tmp_path):
    """load_run_env puts the run's isolation on the sandbox spec of SandboxEnv/PythonEnv
    examples and on SWE debug options; None leaves the env's own choice (never weaker)."""
    from runner.setup import load_run_env

    (tmp_path / "none.toml").write_text("")
    base = {"endpoints_path": str(tmp_path / "none.toml"), "env_dir_path": str(ENVS)}
    for env_id in ("bash-files", "python-math"):
        (cfg,) = configs_from_cli([env_id], {**base, "isolation": "gvisor"})
        env = load_run_env(cfg)
        assert env.sandbox_spec.isolation == "gvisor" and env.isolation_in_use() == "gvisor"
        (cfg,) = configs_from_cli([env_id], base)
        assert load_run_env(cfg).sandbox_spec.isolation == "runc"
    asked = vf.SandboxEnv(dataset=[{"question": "q", "answer": "a"}], isolation="gvisor")
    (cfg,) = configs_from_cli(["bash-files"], base)
    assert cfg.isolation is None and asked.isolation_in_use() == "gvisor"  # no run setting: not downgraded
    with pytest.raises(ConfigError, match="isolation must be one of"):
        asked.set_isolation("kata")


def test_backend_comes_from_the_run_not_the_environment_variable(monkeypatch):
    monkeypatch.setenv("VF_SANDBOX_BACKEND", "local")  # the old channel: must have no effect
    env = vf.SandboxEnv(dataset=[{"question": "q", "answer": "a"}])
    assert type(env.backend).__name__ == "DockerBackend"
    env2 = vf.SandboxEnv(dataset=[{"question": "q", "answer": "a"}])
    env2.set_backend("local", {})
    assert type(env2.backend).__name__ == "LocalBackend"
    asyncio.run(env.backend.close())
    asyncio.run(env2.backend.close())


# --------------------------------------------------------------------------- end to end


@pytest.mark.docker
def test_toml_backends_recorded_and_from_run_reproduces(tmp_path):
    """One example eval with the backend set in TOML to local and to docker: each runs on
    its backend, metadata.json and the registry record the definition, and
    `--from-run ID` runs it again with exactly the same definition."""
    label = uuid.uuid4().hex[:12]
    with ModelServer(bash_files_policy()).run_in_thread() as srv:
        path = write_toml(tmp_path, srv.base_url, [
            {"env_id": "bash-files", "name": "on-local", "backend": "local", "num_examples": 1, "rollouts_per_example": 1},
            {"env_id": "bash-files", "name": "on-docker", "backend": "docker", "num_examples": 1, "rollouts_per_example": 1,
             "env_args": {"labels": {"vf-sandbox.test": "1", "vf-test-case": label}}},
        ], state_columns=["sandbox_id"])
        res = vf_cli(tmp_path, "eval", str(path), "-d")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        runs = {r.name: r for r in registry.list_runs(path=tmp_path / "runs.db")}
        assert set(runs) == {"on-local", "on-docker"}
        for name, backend in (("on-local", "local"), ("on-docker", "docker")):
            rec = runs[name]
            assert rec.args["backend"] == backend
            meta = json.loads((Path(rec.output_dir) / "metadata.json").read_text())
            assert meta["eval_config"] == rec.args  # one definition, written to both places
            (row,) = [json.loads(x) for x in (Path(rec.output_dir) / "results.jsonl").read_text().splitlines()]
            assert row["reward"] == 1.0
            # local ids are "<name>-<hex10>", Docker's are 64-hex container ids
            # a Docker container id (a cell's: its host container's), not a local sandbox's
            assert (len(container_of(row["sandbox_id"])) == 64) == (backend == "docker"), row["sandbox_id"]
            assert f"vf-sandbox runs show {rec.id}" in res.stdout
        # run it again from the record alone
        again = vf_cli(tmp_path, "eval", "--from-run", runs["on-local"].id, "-d")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    new = [r for r in registry.list_runs(path=tmp_path / "runs.db") if r.id not in {x.id for x in runs.values()}]
    assert len(new) == 1
    assert new[0].args == runs["on-local"].args
    assert new[0].output_dir != runs["on-local"].output_dir
    assert wait_gone({"vf-test-case": label}) == []


@pytest.mark.docker
def test_runs_stop_cleans_up_on_the_recorded_backend(tmp_path):
    """A run on the local backend is SIGKILLed with sandboxes alive; `runs stop` removes
    them on the local backend (the backend the run definition recorded)."""
    base_dir = tmp_path / "local-sandboxes"
    with ModelServer(stall(30, then=bash_files_policy())).run_in_thread() as srv:
        path = write_toml(tmp_path, srv.base_url, [
            {"env_id": "bash-files", "backend": "local", "backend_options": {"base_dir": str(base_dir)},
             "num_examples": 2, "rollouts_per_example": 1},
        ])
        proc = subprocess.Popen([sys.executable, "-m", "vfcli.app", "eval", str(path), "-d"], cwd=tmp_path,
                                env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        backend = get_backend("local", base_dir=str(base_dir))
        try:
            deadline = time.time() + 60
            rec, live = None, []
            while time.time() < deadline:
                runs = registry.list_runs(path=tmp_path / "runs.db")
                if runs and runs[0].sandbox_run_id:
                    rec = runs[0]
                    live = asyncio.run(backend.list({MANAGED: "true", RUN_ID: rec.sandbox_run_id}))
                    if len(live) >= 2:  # the two rollouts' sandboxes (and warm-pool spares)
                        break
                time.sleep(0.2)
            assert rec is not None and len(live) >= 2, (live, proc.stderr.read() if proc.poll() is not None else "")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            out = vf_cli(tmp_path, "runs", "stop", rec.id, timeout=120)
            assert "sandbox(es) the run left behind" in out.stdout, out.stdout + out.stderr
            assert asyncio.run(backend.list({MANAGED: "true", RUN_ID: rec.sandbox_run_id})) == []
        finally:
            if proc.poll() is None:
                proc.kill()
            asyncio.run(backend.delete_many(labels={MANAGED: "true"}))


@pytest.mark.docker
@pytest.mark.parametrize("sig,workers,mode", [(signal.SIGINT, 1, "auto"), (signal.SIGTERM, 1, "container"),
                                              (signal.SIGTERM, 2, "auto")])
def test_signal_mid_run_of_a_sandbox_eval_leaves_nothing(tmp_path, sig, workers, mode):
    """SIGINT / SIGTERM at -c 8 mid-run of a SandboxEnv eval (in one process, and with two
    worker processes; a cell per rollout, the default here, and a container per rollout):
    in-flight rollouts are cancelled, finished groups are saved, every sandbox is deleted,
    status `stopped`."""
    label = uuid.uuid4().hex[:12]
    from testmodel.model_server import PolicyRequest

    solver = bash_files_policy()
    hanging: list[int] = []  # rollouts in their model call, each holding its sandbox

    async def slow_after_first(req: PolicyRequest):
        # the first examples finish quickly, the rest hang in a model call with their sandbox alive
        if int(req.headers.get("X-Session-ID", "0")) >= 2:  # the eval sends example_id there by default
            hanging.append(1)
            await asyncio.sleep(600)
        return solver(req)

    with ModelServer(slow_after_first).run_in_thread() as srv:
        path = write_toml(tmp_path, srv.base_url, [
            {"env_id": "bash-files", "num_examples": 12, "rollouts_per_example": 1, "max_concurrent": 8,
             "env_args": {"labels": {"vf-sandbox.test": "1", "vf-test-case": label}, "rollout_isolation": mode}},
        ])
        proc = subprocess.Popen([sys.executable, "-m", "vfcli.app", "eval", str(path), "-d", "-w", str(workers)],
                                cwd=tmp_path, env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.time() + 300  # sandbox starts on a loaded 2-core machine can be slow
            rec = None
            while time.time() < deadline:
                runs = registry.list_runs(path=tmp_path / "runs.db")
                saved = list((tmp_path / "outputs").glob("evals/*/*/results.jsonl"))
                if (runs and saved and len(saved[0].read_text().splitlines()) >= 2 and len(hanging) >= 6
                        and len(containers_with({"vf-test-case": label})) >= (6 if mode == "container" else 1)):
                    rec = runs[0]
                    break
                time.sleep(0.2)
            assert rec is not None, proc.stderr.read() if proc.poll() is not None else registry.list_runs(path=tmp_path / "runs.db")
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 128 + int(sig), err[-3000:]
    assert containers_with({"vf-test-case": label}) == []  # gone before the process exited, no waiting
    (rec,) = registry.list_runs(path=tmp_path / "runs.db")
    assert rec.status == "stopped"
    rows = [json.loads(x) for x in (Path(rec.output_dir) / "results.jsonl").read_text().splitlines()]
    assert sorted(r["example_id"] for r in rows) == [0, 1] and all(r["reward"] == 1.0 for r in rows)
    assert json.loads((Path(rec.output_dir) / "metadata.json").read_text())["status"] == "stopped"
