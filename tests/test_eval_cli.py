"""`vf-sandbox eval` end to end: the CLI as a subprocess against the local
model server (in this process, real sockets), env packages in a temp dir."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from testmodel.model_server import ModelServer, PolicyRequest, Reply, compute, fail

ENV_SOURCES = {
    "e2e_nomodel": '''
        import envs as vf

        def load_environment():
            class Env(vf.MultiTurnEnv):
                requires_model = False

                async def env_response(self, messages, state, **kw):
                    return []

                async def setup_state(self, state):
                    state["final_env_response"] = [{"role": "user", "content": "done without a model"}]
                    return state

            return Env(dataset=[{"question": "q", "answer": "a"}], rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
    ''',
    "e2e_basic": '''
        import os
        import envs as vf

        def load_environment(n: int = 20, marker: str = "", fail_every: int = 0):
            rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
            parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

            def correct(completion, answer, parser) -> float:
                return 1.0 if parser.parse_answer(completion) == answer else 0.0

            class Env(vf.SingleTurnEnv):
                async def setup_state(self, state):
                    if fail_every and state["example_id"] % fail_every == 0:
                        raise ValueError(f"broken example {state['example_id']}")
                    return state

                @vf.cleanup
                async def note_cleanup(self, state):
                    if marker:
                        with open(marker + ".cleanup", "a") as fh:
                            fh.write(f"{state['example_id']}\\n")

                @vf.teardown
                async def note_teardown(self):
                    if marker:
                        with open(marker + ".teardown", "a") as fh:
                            fh.write("teardown\\n")

            return Env(dataset=rows, rubric=vf.Rubric(funcs=[correct], parser=parser), parser=parser)
    ''',
    "e2e_flaky": '''
        import envs as vf

        def load_environment(fail_times: int = 1):
            seen = {}
            rows = [{"question": f"What is {i} * 2?", "answer": str(i * 2)} for i in range(10)]

            class Env(vf.SingleTurnEnv):
                async def setup_state(self, state):
                    key = (state["example_id"], id(state["input"]))
                    seen[key] = seen.get(key, 0) + 1
                    if seen[key] <= fail_times:
                        try:
                            raise vf.InfraError("sandbox vanished")
                        except vf.InfraError as exc:
                            raise RuntimeError("bash tool failed") from exc
                    return state

            env = Env(dataset=rows, rubric=vf.Rubric(funcs=[lambda completion, answer: float(answer in str(completion))]))
            env.retry_policy = env.retry_policy.model_copy(update={"initial_delay": 0.05, "jitter": 0.0})
            return env
    ''',
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    envs_dir = tmp_path / "environments"
    for name, src in ENV_SOURCES.items():
        pkg = envs_dir / name
        pkg.mkdir(parents=True)
        (pkg / f"{name}.py").write_text(textwrap.dedent(src))
        (pkg / "pyproject.toml").write_text(f'[project]\nname = "{name.replace("_", "-")}"\nversion = "0.1.0"\n')
    return tmp_path


def slow_compute(delay: float):
    inner = compute()

    async def policy(req: PolicyRequest) -> Reply:
        await asyncio.sleep(delay)
        return inner(req)

    return policy


def cli_env(workdir: Path) -> dict[str, str]:
    env = {**os.environ, "VF_E2E_KEY": "k", "VF_RUNS_DB": str(workdir / "runs.db"), "COLUMNS": "160"}
    env.pop("VF_RUN_ID", None)
    return env


def eval_cmd(workdir: Path, *args: str, base_url: str | None = None, key: str = "VF_E2E_KEY") -> list[str]:
    cmd = [sys.executable, "-m", "vfcli.app", "eval", *args, "-p", str(workdir / "environments"),
           "-e", str(workdir / "no-endpoints.toml"), "-k", key, "-m", "test-model"]
    if base_url:
        cmd += ["-b", base_url]
    return cmd


def run_cli(workdir: Path, *args: str, base_url: str | None = None, key: str = "VF_E2E_KEY", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(eval_cmd(workdir, *args, base_url=base_url, key=key), cwd=workdir, env=cli_env(workdir),
                          capture_output=True, text=True, timeout=timeout)


def run_dirs(workdir: Path, env_id: str) -> list[Path]:
    base = workdir / "outputs" / "evals" / f"{env_id}--test-model"
    return sorted(base.iterdir()) if base.exists() else []


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]


def wait_rows(run_root: Path, at_least: int, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dirs = sorted(run_root.iterdir()) if run_root.exists() else []
        if dirs and (dirs[0] / "results.jsonl").exists():
            lines = (dirs[0] / "results.jsonl").read_text().count("\n")
            if lines >= at_least:
                return dirs[0]
        time.sleep(0.05)
    raise AssertionError(f"no {at_least} rows under {run_root} in {timeout}s")


def registry_rows(workdir: Path):
    from runs.registry import list_runs

    return list_runs(path=workdir / "runs.db")


# --------------------------------------------------------------------------- happy path


def test_eval_saves_results_metadata_and_registers_run(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "3", "-r", "2", "-s", "-d", "-a", '{"n": 5}', base_url=srv.base_url)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(workdir, "e2e-basic")
    rows = read_rows(run_dir)
    assert len(rows) == 6 and Counter(r["example_id"] for r in rows) == {0: 2, 1: 2, 2: 2}
    assert all(r["reward"] == 1.0 and r["attempts"] == 1 for r in rows)
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed" and meta["avg_reward"] == 1.0 and meta["env_args"] == {"n": 5}
    assert meta["num_examples"] == 3 and meta["rollouts_per_example"] == 2 and meta["pass_at_k"]["2"] == 1.0
    assert "avg reward" in res.stdout and "samples" in res.stdout  # summary with example rollouts
    recs = [r for r in registry_rows(workdir) if r.env_id == "e2e-basic"]
    assert recs and recs[0].status == "completed" and recs[0].completed == 6 and recs[0].total == 6
    args_text = json.dumps(recs[0].args)
    assert recs[0].args["client_config"]["api_key_var"] == "VF_E2E_KEY"  # the variable's name, never its value
    assert '"k"' not in args_text


def test_rollout_errors_do_not_kill_the_run(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "6", "-r", "1", "-s", "-d", "-A", "-a", '{"fail_every": 3}', base_url=srv.base_url)
    assert res.returncode == 3, res.stderr  # the env's own errors: those rollouts are not scored (issue 26)
    rows = read_rows(run_dirs(workdir, "e2e-basic")[0])
    errs = [r for r in rows if r["error"]]
    assert len(rows) == 6 and sorted(r["example_id"] for r in errs) == [0, 3]
    assert all(r["error_type"] == "ValueError" and r["error_kind"] == "task" and r["verdict"] == "env" for r in errs)
    assert "2 of 6 rollout(s) not scored (2 env error(s))" in res.stderr
    assert "broken example" in res.stderr
    assert "samples" not in res.stdout  # -A
    rec = [r for r in registry_rows(workdir) if r.env_id == "e2e-basic"][0]
    assert rec.errors == 2 and "broken example" in Path(rec.log_path).read_text()  # the run's log file


def test_toml_config_runs_several_envs(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        cfg = workdir / "suite.toml"
        cfg.write_text(textwrap.dedent(f"""
            model = "test-model"
            api_base_url = "{srv.base_url}"
            api_key_var = "VF_E2E_KEY"
            endpoints_path = "{workdir / 'none.toml'}"
            env_dir_path = "{workdir / 'environments'}"
            num_examples = 2
            [[eval]]
            env_id = "e2e-basic"
            rollouts_per_example = 2
            [[eval]]
            env_id = "e2e-flaky"
            rollouts_per_example = 1
            max_retries = 2
        """))
        res = subprocess.run([sys.executable, "-m", "vfcli.app", "eval", str(cfg), "-d"], cwd=workdir,
                             env=cli_env(workdir), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(read_rows(run_dirs(workdir, "e2e-basic")[0])) == 4  # TOML saves by default
    flaky = read_rows(run_dirs(workdir, "e2e-flaky")[0])
    assert [r["attempts"] for r in flaky] == [2, 2]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args,expected",
    [
        (["nope-env"], "unknown environment 'nope-env'"),
        (["e2e-basic", "-a", "{bad json"], "--env-args/-a: invalid JSON"),
        (["e2e-basic", "-x", "[1]"], "--extra-env-kwargs/-x: expected a JSON object"),
        (["e2e-basic", "-S", '{"temperature": }'], "--sampling-args/-S: invalid JSON"),
        (["e2e-basic", "--header", "NoColon"], "expected 'Name: Value'"),
        (["e2e-basic", "-a", '{"unknown_arg": 1}'], "takes no argument(s) ['unknown_arg']"),
    ],
)
def test_bad_input_clear_errors(workdir, args, expected):
    res = run_cli(workdir, *args, "-d", base_url="http://127.0.0.1:9/v1")
    assert res.returncode != 0
    assert expected in res.stderr + res.stdout
    assert "Traceback" not in res.stderr


def test_unknown_env_lists_installed(workdir):
    res = run_cli(workdir, "nope-env", "-d", base_url="http://127.0.0.1:9/v1")
    assert "e2e-basic" in res.stderr and "e2e-flaky" in res.stderr


def test_toml_syntax_error_names_file_and_line(workdir):
    cfg = workdir / "broken.toml"
    cfg.write_text('[[eval]]\nenv_id = "e2e-basic"\nnum_examples = = 2\n')
    res = subprocess.run([sys.executable, "-m", "vfcli.app", "eval", str(cfg)], cwd=workdir, env=cli_env(workdir),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and str(cfg) in res.stderr and "line 3" in res.stderr


def test_toml_unknown_key(workdir):
    cfg = workdir / "typo.toml"
    cfg.write_text('[[eval]]\nenv_id = "e2e-basic"\nrollouts_per_exmple = 2\n')
    res = subprocess.run([sys.executable, "-m", "vfcli.app", "eval", str(cfg)], cwd=workdir, env=cli_env(workdir),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "'rollouts_per_exmple'" in res.stderr


def test_missing_api_key_names_variable(workdir):
    res = run_cli(workdir, "e2e-basic", "-d", key="VF_E2E_UNSET_KEY", base_url="http://127.0.0.1:9/v1")
    assert res.returncode == 2 and "VF_E2E_UNSET_KEY" in res.stderr  # a usage error


def test_model_endpoint_down(workdir):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli(workdir, "e2e-basic", "-d", "-s", base_url=f"http://127.0.0.1:{port}/v1")
    assert res.returncode == 2 and "not reachable" in res.stderr and f"127.0.0.1:{port}" in res.stderr
    assert "Connection refused" in res.stderr and "is the server running?" in res.stderr
    assert "$VF_E2E_KEY (set)" in res.stderr  # the variable its key is read from


def test_env_without_model_needs_no_key_or_endpoint(workdir):
    res = run_cli(workdir, "e2e-nomodel", "-n", "1", "-r", "1", "-s", "-d", key="VF_E2E_UNSET_KEY", base_url="http://127.0.0.1:9/v1")
    assert res.returncode == 0, res.stderr
    (row,) = read_rows(run_dirs(workdir, "e2e-nomodel")[0])
    assert row["reward"] == 1.0 and row["stop_condition"] == "has_final_env_response"


def test_auth_error_fails_fast(workdir):
    with ModelServer(fail(401)).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-d", "-n", "5", "-r", "3", "-c", "1", base_url=srv.base_url)
        assert res.returncode == 2 and "refused the API key" in res.stderr  # a refused key is a usage error
        assert srv.count <= 2  # did not grind through every rollout


# --------------------------------------------------------------------------- retries


def test_max_retries_infra_error_attempts_in_output(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-flaky", "-n", "3", "-r", "1", "-s", "-d", "--max-retries", "2", base_url=srv.base_url)
        assert res.returncode == 0, res.stderr
        rows = read_rows(run_dirs(workdir, "e2e-flaky")[0])
        assert [r["attempts"] for r in rows] == [2, 2, 2] and all(r["error"] is None for r in rows)
        assert "retried rollouts" in res.stdout
        res = run_cli(workdir, "e2e-flaky", "-n", "2", "-r", "1", "-s", "-d", base_url=srv.base_url)
    # without retries every rollout ends in the infra error: nothing was evaluated, so the run failed (issue 16);
    # exit 3: incomplete because of sandbox errors, resumable (issue 26)
    assert res.returncode == 3
    assert res.stderr.strip().splitlines()[-1].startswith(
        "e2e-flaky: failed: all 2 rollouts failed (infrastructure errors): RuntimeError: bash tool failed "
        "(continue with: vf-sandbox eval --resume ")
    newest = max(run_dirs(workdir, "e2e-flaky"), key=lambda d: d.stat().st_mtime)
    rows = read_rows(newest)
    assert all(r["attempts"] == 1 and r["error_kind"] == "infra" and "InfraError" in r["error_info"]["chain"] for r in rows)


# --------------------------------------------------------------------------- interruption and resume


def test_resume_after_sigkill_runs_exactly_the_missing_rollouts(workdir):
    with ModelServer(slow_compute(0.15)).run_in_thread() as srv:
        proc = subprocess.Popen(eval_cmd(workdir, "e2e-basic", "-n", "12", "-r", "2", "-c", "4", "-s", "-d", base_url=srv.base_url),
                                cwd=workdir, env=cli_env(workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            run_dir = wait_rows(workdir / "outputs" / "evals" / "e2e-basic--test-model", 4)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        before = read_rows(run_dir)
        assert 4 <= len(before) < 24 and len(before) % 2 == 0  # whole groups only
        srv.policy = compute()
        count0 = srv.count
        res = run_cli(workdir, "e2e-basic", "-n", "12", "-r", "2", "-s", "-d", "--resume", base_url=srv.base_url)
        assert res.returncode == 0, res.stderr
        assert srv.count - count0 == 24 - len(before)
    assert run_dirs(workdir, "e2e-basic") == [run_dir]  # continued the same run
    after = read_rows(run_dir)
    assert after[: len(before)] == before
    assert Counter(r["example_id"] for r in after) == {i: 2 for i in range(12)}
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed" and meta["completed_rollouts"] == 24
    # nothing left to do: a further --resume PATH runs nothing
    with ModelServer(compute()).run_in_thread() as srv:
        res = run_cli(workdir, "e2e-basic", "-n", "12", "-r", "2", "-d", "--resume", str(run_dir), base_url=srv.base_url)
        assert res.returncode == 0 and srv.count == 0
    assert len(read_rows(run_dir)) == 24


def test_resume_rejects_incompatible_run(workdir):
    with ModelServer(compute()).run_in_thread() as srv:
        assert run_cli(workdir, "e2e-basic", "-n", "2", "-r", "2", "-s", "-d", base_url=srv.base_url).returncode == 0
        (run_dir,) = run_dirs(workdir, "e2e-basic")
        res = run_cli(workdir, "e2e-basic", "-n", "2", "-r", "3", "-d", "--resume", str(run_dir), base_url=srv.base_url)
        assert res.returncode == 2 and "rollouts_per_example 2 != 3" in res.stderr
        res = run_cli(workdir, "e2e-basic", "-d", "--resume", str(workdir), base_url=srv.base_url)
    assert res.returncode != 0 and "not an eval results directory" in res.stderr + res.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_gracefully_then_resume_completes(workdir, sig):
    marker = str(workdir / "marker")
    with ModelServer(slow_compute(0.2)).run_in_thread() as srv:
        proc = subprocess.Popen(
            eval_cmd(workdir, "e2e-basic", "-n", "10", "-r", "2", "-c", "2", "-s", "-d", "-a", json.dumps({"marker": marker}), base_url=srv.base_url),
            cwd=workdir, env=cli_env(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        run_dir = wait_rows(workdir / "outputs" / "evals" / "e2e-basic--test-model", 2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + int(sig), err
        meta = json.loads((run_dir / "metadata.json").read_text())
        saved = read_rows(run_dir)
        assert meta["status"] == "stopped" and meta["completed_rollouts"] == len(saved) < 20
        assert Path(marker + ".teardown").read_text() == "teardown\n"
        cleaned = Path(marker + ".cleanup").read_text().split()
        assert len(cleaned) >= len(saved)  # cleanup ran for finished and cancelled rollouts
        rec = [r for r in registry_rows(workdir) if r.env_id == "e2e-basic"][0]
        assert rec.status == "stopped"
        srv.policy = compute()
        count0 = srv.count
        res = run_cli(workdir, "e2e-basic", "-n", "10", "-r", "2", "-s", "-d", "--resume", str(run_dir),
                      "-a", json.dumps({"marker": marker}), base_url=srv.base_url)
        assert res.returncode == 0, res.stderr
        assert srv.count - count0 == 20 - len(saved)
    assert Counter(r["example_id"] for r in read_rows(run_dir)) == {i: 2 for i in range(10)}
    rec = [r for r in registry_rows(workdir) if r.env_id == "e2e-basic"][0]
    assert rec.status == "completed" and rec.attempts == 2


def test_timeout_minutes_stops_cleanly(workdir):
    with ModelServer(slow_compute(0.3)).run_in_thread() as srv:
        t0 = time.monotonic()
        res = run_cli(workdir, "e2e-basic", "-n", "20", "-r", "2", "-c", "2", "-s", "-d", "--timeout-minutes", "0.02",
                      "--eval-name", "short-run", base_url=srv.base_url)
        assert time.monotonic() - t0 < 30
    assert res.returncode == 3 and "timeout after 0.02 minute" in res.stderr  # stopped: incomplete
    (run_dir,) = run_dirs(workdir, "e2e-basic")
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "stopped" and meta["name"] == "short-run"
    rec = [r for r in registry_rows(workdir) if r.env_id == "e2e-basic"][0]
    assert rec.status == "stopped" and rec.name == "short-run"


def test_env_install(workdir, tmp_path):
    pkg = workdir / "environments" / "vf_probe_env"
    pkg.mkdir()
    (pkg / "vf_probe_env.py").write_text("def load_environment():\n    return None\n")
    (pkg / "pyproject.toml").write_text(
        '[project]\nname = "vf-probe-env"\nversion = "0.0.1"\n[build-system]\nrequires = ["setuptools>=68"]\n'
        'build-backend = "setuptools.build_meta"\n[tool.setuptools]\npy-modules = ["vf_probe_env"]\n'
    )
    cmd = [sys.executable, "-m", "vfcli.app", "env", "install", "vf-probe-env", "-p", str(workdir / "environments")]
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=180)
    try:
        assert res.returncode == 0, res.stderr + res.stdout
        check = subprocess.run([sys.executable, "-c", "import vf_probe_env; print(vf_probe_env.__file__)"], cwd="/", capture_output=True, text=True)
        assert check.returncode == 0 and "vf_probe_env.py" in check.stdout
    finally:
        subprocess.run(["uv", "pip", "uninstall", "--python", sys.executable, "vf-probe-env"], capture_output=True)
    res = subprocess.run([sys.executable, "-m", "vfcli.app", "env", "install", "absent", "-p", str(workdir / "environments")],
                         cwd=workdir, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "e2e_basic" in res.stderr


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("env_id,client_type", [("math-single", "openai_chat_completions"), ("tool-calc", "openai_chat_completions"),
                                                ("tool-calc", "anthropic_messages"), ("math-single", "openai_completions")])
def test_example_environments_end_to_end(workdir, env_id, client_type):
    from testmodel.model_server import auto

    with ModelServer(auto()).run_in_thread() as srv:
        cmd = [sys.executable, "-m", "vfcli.app", "eval", env_id, "-p", str(ROOT / "environments"), "-e", str(workdir / "none.toml"),
               "-m", "local-model", "-b", srv.base_url, "-k", "VF_E2E_KEY", "--api-client-type", client_type,
               "-n", "3", "-r", "2", "-s", "-d", "-A"]
        if client_type == "openai_completions":
            cmd += ["-x", '{"message_type": "completion"}']
        res = subprocess.run(cmd, cwd=workdir, env=cli_env(workdir), capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        apis = {r.api for r in srv.requests}
    expected_api = {"openai_chat_completions": "chat", "anthropic_messages": "anthropic", "openai_completions": "completions"}[client_type]
    assert apis == {expected_api}
    rows = read_rows(next((workdir / "outputs" / "evals" / f"{env_id}--local-model").iterdir()))
    assert len(rows) == 6 and all(r["error"] is None for r in rows)
    if client_type != "openai_completions":
        assert all(r["reward"] == 1.0 for r in rows)
    if env_id == "tool-calc":
        assert all(r["metrics"]["calculator_calls"] == 1.0 for r in rows)


def test_eval_with_the_renderer_client_from_a_toml(workdir):
    """api_client_type "renderer" end to end: the TOML's renderer settings reach the CLI's
    client, which tokenizes with a local tokenizer (never the hub) and records each step's
    token ids and logprobs in the results."""
    import renderers
    from renderers.base import load_tokenizer

    from testmodel.tokenizer import build_chatml_tokenizer

    tok_dir = build_chatml_tokenizer(workdir / "tokenizer")
    tokenizer = load_tokenizer(str(tok_dir))
    renderer = renderers.create_renderer(tokenizer, renderers.Qwen3RendererConfig())
    with ModelServer(compute(), renderer=renderer, tokenizer=tokenizer).run_in_thread() as srv:
        cfg = workdir / "renderer.toml"
        cfg.write_text(textwrap.dedent(f"""
            model = "test-model"
            api_base_url = "{srv.base_url}"
            api_key_var = "VF_E2E_KEY"
            endpoints_path = "{workdir / 'none.toml'}"
            env_dir_path = "{workdir / 'environments'}"
            [[eval]]
            env_id = "e2e-basic"
            num_examples = 2
            rollouts_per_example = 1
            state_columns = ["trajectory"]
            api_client_type = "renderer"
            renderer_model_name = "{tok_dir}"
            renderer_config = {{ name = "qwen3" }}
        """))
        res = subprocess.run([sys.executable, "-m", "vfcli.app", "eval", str(cfg), "-d"], cwd=workdir,
                             env={**cli_env(workdir), "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = read_rows(run_dirs(workdir, "e2e-basic")[0])
    assert len(rows) == 2 and all(r["error"] is None and r["reward"] == 1.0 for r in rows)
    assert [r.api for r in srv.requests] == ["generate", "generate"]
    sent = sorted(g["token_ids"] for g in srv.generated)
    assert sorted(r["trajectory"][0]["tokens"]["prompt_ids"] for r in rows) == sent
    for r in rows:
        tokens = r["trajectory"][0]["tokens"]
        assert len(tokens["completion_logprobs"]) == len(tokens["completion_ids"]) > 0
        assert tokenizer.decode(tokens["completion_ids"]).endswith("<|im_end|>")
    [rec] = [r for r in registry_rows(workdir) if r.env_id == "e2e-basic"]  # the run definition records them
    cc = rec.args["client_config"]
    assert (cc["client_type"], cc["renderer_model_name"], cc["renderer_config"]) == ("renderer", str(tok_dir),
                                                                                   {"name": "qwen3"})
