"""The run's ids and its registry file travel in the run definition (issue 25): the
command's entry reads the process environment once (`ProcessSettings`) and puts what it
says into `EvalConfig` (`run_id`, `sandbox_run_id`, `runs_db`); the runner, its `-w N`
worker processes and a hosted job's Ray actors take them from the definition they are
handed, never from `os.environ`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from runner import config as C
from sandboxes.settings import ProcessSettings

ROOT = Path(__file__).resolve().parents[1]

# A model-free env whose rollouts write, per process, the label its sandboxes would carry
# and what the process environment says.
PROBE_ENV = textwrap.dedent('''
    import json
    import os
    from pathlib import Path

    import envs as vf
    from sandboxes import labels


    def load_environment(out: str = ""):
        class Env(vf.MultiTurnEnv):
            requires_model = False

            async def env_response(self, messages, state, **kw):
                return []

            async def setup_state(self, state):
                Path(out, str(os.getpid())).write_text(json.dumps(
                    {"label": labels.run_id(), "environ": os.environ.get("VF_SANDBOX_RUN_ID")}))
                state["final_env_response"] = [{"role": "user", "content": "done"}]
                return state

        rows = [{"question": f"q{i}", "answer": "a"} for i in range(8)]
        return Env(dataset=rows, rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
''')

# Runs in a fresh interpreter whose environment names another label: the workers
# (forked from a fresh fork server, so they hold that environment too) must use the
# definition's.
WORKERS = textwrap.dedent('''
    import asyncio, json, sys
    from runner.config import build_eval_config
    from runner.setup import load_run_env
    from runner.workers import generate_in_workers

    envdir, out = sys.argv[1], sys.argv[2]
    cfg = build_eval_config({"env_id": "label_probe", "env_dir_path": envdir, "env_args": {"out": out},
                             "model": "openai/none", "num_workers": 2, "max_concurrent": 2})
    cfg = cfg.model_copy(update={"sandbox_run_id": "fromdefinition"})
    inputs = load_run_env(cfg).get_eval_inputs(8, 1, False, None)
    rows = []

    async def on_group(group):
        rows.extend(group)

    asyncio.run(generate_in_workers(cfg, inputs, on_group))
    print(json.dumps({"rows": len(rows), "errors": [r.get("error") for r in rows if r.get("error")],
                      "pid": __import__("os").getpid()}))
''')


def probe_env(tmp_path: Path) -> tuple[Path, Path]:
    envdir = tmp_path / "environments"
    (envdir / "label_probe").mkdir(parents=True)
    (envdir / "label_probe" / "label_probe.py").write_text(PROBE_ENV)
    out = tmp_path / "seen"
    out.mkdir()
    return envdir, out


def seen(out: Path) -> dict[int, dict]:
    return {int(p.name): json.loads(p.read_text()) for p in out.iterdir()}


def test_a_worker_takes_the_sandbox_label_from_the_definition_not_the_environment(tmp_path):
    envdir, out = probe_env(tmp_path)
    env = {**os.environ, "VF_SANDBOX_RUN_ID": "fromenviron", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", WORKERS, str(envdir), str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["rows"], result["errors"]) == (8, [])
    workers = seen(out)
    assert workers and result["pid"] not in workers  # the rollouts ran in the worker processes
    for pid, what in workers.items():
        assert what["environ"] == "fromenviron", what  # the environment said otherwise ...
        assert what["label"] == "fromdefinition", what  # ... the definition won


def test_the_entry_puts_the_process_environment_into_the_definitions():
    settings = ProcessSettings.from_env({"VF_RUN_ID": "0123456789ab", "VF_RUNS_DB": "/r/runs.db",
                                         "VF_SANDBOX_RUN_ID": "lbl"})
    base = C.build_eval_config({"env_id": "gsm8k", "model": "openai/x"})
    resumed = base.model_copy(update={"resume": True})
    first, second, third = C.with_process_settings([resumed, base, base], settings)
    assert (first.run_id, second.run_id, third.run_id) == (None, "0123456789ab", None)  # one new run takes it
    assert {c.runs_db for c in (first, second, third)} == {"/r/runs.db"}
    assert {c.sandbox_run_id for c in (first, second, third)} == {"lbl"}
    # where a process runs it is not part of the recorded definition, nor of resume's comparison
    assert not {"runs_db", "sandbox_run_id", "settings"} & set(second.public_args())
    assert second.definition_diff(base) == []
    # an empty environment changes nothing but the settings the definition carries
    (same,) = C.with_process_settings([base], ProcessSettings.from_env({}))
    assert same.model_copy(update={"settings": None}) == base and same.settings == ProcessSettings()


def test_the_runner_records_the_run_in_the_definitions_registry(tmp_path, monkeypatch):
    """The registry file named by the definition is used, whatever $VF_RUNS_DB says."""
    import asyncio

    import uuid

    from runner.display import make_display
    from runner.runner import run_evals
    from runs import registry
    from sandboxes import labels

    envdir, out = probe_env(tmp_path)
    monkeypatch.setenv("VF_RUNS_DB", str(tmp_path / "environ.db"))
    cfg = C.build_eval_config({"env_id": "label_probe", "env_dir_path": str(envdir), "env_args": {"out": str(out)},
                               "model": "openai/none", "num_examples": 2, "rollouts_per_example": 1,
                               "output_dir": str(tmp_path / "o"), "save_results": True})
    label = "def" + uuid.uuid4().hex[:9]
    cfg = cfg.model_copy(update={"runs_db": str(tmp_path / "def.db"), "run_id": "abcabcabcabc",
                                 "sandbox_run_id": label})
    own = labels.run_id()
    with make_display(True, False) as display:
        (res,) = asyncio.run(run_evals([cfg], display))
    assert labels.run_id() == own  # the run's label lived in the run's scope only
    assert res.status == "completed", res.error
    (rec,) = registry.list_runs(path=tmp_path / "def.db")
    assert (rec.id, rec.sandbox_run_id, rec.status) == ("abcabcabcabc", label, "completed")
    assert not (tmp_path / "environ.db").exists()
    assert {w["label"] for w in seen(out).values()} == {label}  # this process labels with the definition's


def test_a_hosted_job_gets_its_ids_in_the_definition_not_its_environment(tmp_path, monkeypatch):
    from hosted import submit
    from hosted.driver import SPEC_FILE, HostedJobSpec, prepare

    monkeypatch.setenv("VF_TEST_KEY", "k")
    cfg = C.build_eval_config({"env_id": "gsm8k", "model": "openai/x", "api_key_var": "VF_TEST_KEY"})
    cfg = cfg.model_copy(update={"runs_db": str(tmp_path / "submitter.db")})
    staging = submit.stage(cfg, "0123456789ab", "job1", None)
    try:
        spec = HostedJobSpec.model_validate_json((staging / SPEC_FILE).read_text())
    finally:
        import shutil

        shutil.rmtree(staging)
    assert (spec.config.run_id, spec.config.sandbox_run_id, spec.config.runs_db) == (
        "0123456789ab", "vf-0123456789ab", None)  # the submitter's registry file stays here
    env_vars = submit.job_env_vars(cfg, {"S": "v"})
    assert not {"VF_RUN_ID", "VF_SANDBOX_RUN_ID", "VF_RUNS_DB"} & set(env_vars)
    assert env_vars["VF_TEST_KEY"] == "k" and env_vars["S"] == "v"
    job = prepare(spec, tmp_path / "logs")
    assert job.run_id == "0123456789ab" and job.sandbox_run_id == "vf-0123456789ab"
    assert job.runs_db == str(tmp_path / "logs" / "job1" / "runs.db")  # the cluster side's own record
