"""The process settings are read once, by a process's entry, and passed down (issue 25):
in the run definition across processes and machines (`EvalConfig.settings`), inside a
process as arguments or through the one scope (`sandboxes.settings.use` / `current()`).
Nothing else reads a `VF_*` setting from `os.environ`; `-w` workers and Ray actors use
the definition's settings whatever their own environment says; `vf-sandbox runs --db`
passes its file down without touching `os.environ`; credentials never land in what a run
records."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from sandboxes import labels, settings
from sandboxes.settings import ProcessSettings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sandboxes", "backends", "envs", "runs", "runner", "hosted", "dashboard", "vfcli", "testmodel", "swe_debug")

# The only modules that read the process settings from the environment, and why.
ENTRIES = {
    "sandboxes/settings.py": "defines ProcessSettings.from_env() and current()'s fallback outside any scope",
    "vfcli/app.py": "the vf-sandbox CLI: every sub-command (eval, runs, dashboard, sandboxes, images, openenv) "
                    "runs in the scope its callback enters",
    "swe_debug/cli.py": "vf-swe-debug's entry (`_main`)",
    "swe_debug/examples/__main__.py": "`python -m swe_debug.examples`: its commands run in its callback's scope",
    "runner/workers.py": "a -w worker process's entry (`worker_main`): only its registry credentials",
    "runner/ray_workers.py": "a hosted run's Ray actor (`GroupWorker.__init__`): only its registry credentials",
    "hosted/driver.py": "a hosted job's driver (`main`): its credentials (job env vars), and the settings of "
                        "a definition staged without any",
}
SETTING_VARS = {ProcessSettings.variable(f) for f in ProcessSettings.model_fields}


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _setting_name(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in SETTING_VARS


def environment_reads(source: str) -> list[str]:
    """Where `source` reads (or writes) a VF_* setting in os.environ, or calls
    `ProcessSettings.from_env(`: `line: what`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "from_env" and (isinstance(f.value, ast.Name) and f.value.id == "ProcessSettings"
                                         or isinstance(f.value, ast.Attribute) and f.value.attr == "ProcessSettings"):
                what = "ProcessSettings.from_env("
            elif f.attr in ("get", "pop", "setdefault") and _is_environ(f.value) and node.args \
                    and _setting_name(node.args[0]):
                what = f"os.environ.{f.attr}({node.args[0].value!r})"
            elif f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os" and node.args \
                    and _setting_name(node.args[0]):
                what = f"os.getenv({node.args[0].value!r})"
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and _setting_name(node.slice):
            what = f"os.environ[{node.slice.value!r}]"  # type: ignore[attr-defined]
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators) \
                and _setting_name(node.left):
            what = f"{node.left.value!r} in os.environ"  # type: ignore[attr-defined]
        if what:
            found.append(f"{node.lineno}: {what}")
    return found


def test_only_the_entries_read_the_settings_from_the_environment():
    offenders, readers = {}, set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            reads = environment_reads(path.read_text())
            if reads:
                readers.add(rel)
                if rel not in ENTRIES:
                    offenders[rel] = reads
    assert not offenders, f"VF_* settings read from the environment outside the entries (take them from the " \
                          f"run definition, an argument or sandboxes.settings.current()): {offenders}"
    assert readers == set(ENTRIES), f"listed entries that read nothing (remove them): {set(ENTRIES) - readers}"


def test_the_check_sees_every_kind_of_read():
    src = textwrap.dedent('''
        import os
        a = ProcessSettings.from_env()
        b = settings.ProcessSettings.from_env()
        c = os.environ.get("VF_SANDBOX_CACHE")
        d = os.environ["VF_RUNS_DB"]
        os.environ["VF_RUNS_DB"] = "x"
        e = "VF_STATE_DIR" in os.environ
        f = os.getenv("VF_SWE_PIP")
        g = os.environ.get("PATH")  # not a setting
        h = os.environ.get("VF_TASK_JSON")  # set for programs, not a setting of ours
    ''')
    assert [r.split(": ", 1)[0] for r in environment_reads(src)] == ["3", "4", "5", "6", "7", "8", "9"]


# --------------------------------------------------------------- the scope

def test_the_scope_is_what_current_returns_and_names_the_run_label(monkeypatch):
    monkeypatch.setenv("VF_SANDBOX_CACHE", "/from-environ")
    monkeypatch.delenv("VF_SANDBOX_RUN_ID", raising=False)
    outside = labels.run_id()
    assert settings.current().sandbox_cache == "/from-environ"  # library use: the environment, per call
    assert labels.run_id() == outside  # one label per process outside any scope
    with settings.use(ProcessSettings(sandbox_cache="/scoped")) as scoped:
        assert settings.current() is scoped and settings.current().sandbox_cache == "/scoped"
        assert labels.run_id() == scoped.sandbox_run_id != outside  # a fresh label for the scope

        async def in_a_task_and_a_thread():
            return settings.current().sandbox_cache, await asyncio.to_thread(lambda: settings.current().sandbox_cache)

        assert asyncio.run(in_a_task_and_a_thread()) == ("/scoped", "/scoped")
        with settings.use(ProcessSettings(sandbox_run_id="inner")):
            assert labels.run_id() == "inner"
        assert labels.run_id() == scoped.sandbox_run_id
    assert labels.run_id() == outside


def test_consumers_take_the_scope_not_the_environment(monkeypatch, tmp_path):
    from backends.kubernetes.config import KubernetesConfig
    from backends.local.backend import LocalBackend
    from envs.openenv import build as openenv_build
    from runs import registry
    from sandboxes import wheels
    from sandboxes.images import RegistryAuth
    from swe_debug.images import ImageBuilder

    for var, value in {"VF_SANDBOX_CACHE": "/env-cache", "VF_K8S_NAMESPACE": "env-ns", "VF_RUNS_DB": "/env/runs.db",
                       "VF_LOCAL_SANDBOX_DIR": "/env-local", "VF_OPENENV_BASE_IMAGE": "env/base:1",
                       "VF_SWE_BASE_IMAGE": "env/swe:1", "VF_REGISTRY_USERNAME": "envuser",
                       "VF_REGISTRY_PASSWORD": "envpass"}.items():
        monkeypatch.setenv(var, value)
    mine = ProcessSettings(sandbox_cache=str(tmp_path / "c"), k8s_namespace="ns", runs_db=str(tmp_path / "r.db"),
                           local_sandbox_dir=str(tmp_path / "l"), openenv_base_image="o/base:1",
                           swe_base_image="s/base:1", registry_username="u", registry_password="p")
    with settings.use(mine):
        assert wheels.wheelhouse_root() == tmp_path / "c" / "wheelhouse"
        assert KubernetesConfig().namespace == "ns" and KubernetesConfig(namespace="opt").namespace == "opt"
        assert LocalBackend().base == tmp_path / "l" and LocalBackend(base_dir="/opt-dir").base == Path("/opt-dir")
        assert registry.db_path() == tmp_path / "r.db" and registry.db_path("/given.db") == Path("/given.db")
        assert openenv_build.base_image() == "o/base:1"
        builder = ImageBuilder()
        assert builder.base_image == "s/base:1" and builder.auth is not None and builder.auth.username == "u"
        assert RegistryAuth.from_settings().password.get_secret_value() == "p"
    # an explicit settings object wins over the scope (the short chains take them as an argument)
    assert ImageBuilder(settings=mine).base_image == "s/base:1"
    assert ImageBuilder(settings=ProcessSettings()).auth is None


# --------------------------------------------------------------- across processes

PROBE_ENV = textwrap.dedent('''
    import json
    import os
    from pathlib import Path

    import envs as vf
    from sandboxes import labels, settings, wheels


    def load_environment(out: str = ""):
        class Env(vf.MultiTurnEnv):
            requires_model = False

            async def env_response(self, messages, state, **kw):
                return []

            async def setup_state(self, state):
                now = settings.current()
                Path(out, str(os.getpid())).write_text(json.dumps({
                    "label": labels.run_id(), "wheelhouse": str(wheels.wheelhouse_root()),
                    "user": now.registry_username,
                    "password": now.registry_password.get_secret_value() if now.registry_password else None,
                    "environ": os.environ.get("VF_SANDBOX_CACHE")}))
                state["final_env_response"] = [{"role": "user", "content": "done"}]
                return state

        rows = [{"question": f"q{i}", "answer": "a"} for i in range(8)]
        return Env(dataset=rows, rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
''')

# In a fresh interpreter whose environment says otherwise; the definition carries settings
# with credentials of its own (which must not travel: the workers take their environment's).
DRIVER = textwrap.dedent('''
    import asyncio, json, os, sys
    from runner.config import build_eval_config
    from runner.setup import load_run_env
    from sandboxes import settings
    from sandboxes.settings import ProcessSettings

    envdir, out, where = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = build_eval_config({"env_id": "settings_probe", "env_dir_path": envdir, "env_args": {"out": out},
                             "model": "openai/none", "num_workers": 2, "max_concurrent": 2})
    mine = ProcessSettings(sandbox_cache="/from-definition", registry_username="defuser",
                           registry_password="defpass")
    cfg = cfg.model_copy(update={"sandbox_run_id": "fromdefinition", "settings": mine})
    assert "defpass" not in cfg.model_dump_json()  # what crosses to the workers
    with settings.use(mine):
        inputs = load_run_env(cfg).get_eval_inputs(8, 1, False, None)
    rows = []

    async def on_group(group):
        rows.extend(group)

    if where == "ray":
        import ray
        from runner.ray_workers import generate_on_ray

        ray.init(address=os.environ["VF_TEST_RAY_GCS"], log_to_driver=False)
        asyncio.run(generate_on_ray(cfg, inputs, on_group))
        ray.shutdown()
    else:
        from runner.workers import generate_in_workers

        asyncio.run(generate_in_workers(cfg, inputs, on_group))
    print(json.dumps({"rows": len(rows), "errors": [r.get("error") for r in rows if r.get("error")],
                      "pid": os.getpid()}))
''')

OTHERWISE = {"VF_SANDBOX_CACHE": "/from-environ", "VF_SANDBOX_RUN_ID": "fromenviron",
             "VF_REGISTRY_USERNAME": "envuser", "VF_REGISTRY_PASSWORD": "envpass"}


def probe_env(tmp_path: Path) -> tuple[Path, Path]:
    envdir = tmp_path / "environments"
    (envdir / "settings_probe").mkdir(parents=True)
    (envdir / "settings_probe" / "settings_probe.py").write_text(PROBE_ENV)
    out = tmp_path / "seen"
    out.mkdir()
    return envdir, out


def seen(out: Path) -> dict[int, dict]:
    return {int(p.name): json.loads(p.read_text()) for p in out.iterdir()}


def run_driver(tmp_path: Path, where: str, **env: str) -> dict[int, dict]:
    envdir, out = probe_env(tmp_path)
    e = {**os.environ, **OTHERWISE, "PYTHONPATH": str(ROOT), **env}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(envdir), str(out), where], env=e, cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["rows"], result["errors"]) == (8, [])
    workers = seen(out)
    assert workers and result["pid"] not in workers  # the rollouts ran in the workers
    return workers


def assert_definitions_settings(workers: dict[int, dict]) -> None:
    for what in workers.values():
        assert what["environ"] == "/from-environ", what  # their environment said otherwise ...
        assert what["label"] == "fromdefinition", what  # ... the definition won
        assert what["wheelhouse"] == "/from-definition/wheelhouse", what
        # credentials never travel in a definition: a -w worker gets its runner's beside it, an actor its environment's
        assert (what["user"], what["password"]) == ("envuser", "envpass"), what


def test_a_worker_process_takes_the_definitions_settings(tmp_path):
    assert_definitions_settings(run_driver(tmp_path, "workers"))


@pytest.mark.docker
@pytest.mark.xdist_group("ray-cluster")  # with test_hosted's cluster: never two clusters at once
def test_a_ray_actor_takes_the_definitions_settings(tmp_path):
    required = "1" in (os.environ.get("VF_REQUIRE_RAY"), os.environ.get("VF_REQUIRE_DOCKER")) or bool(os.environ.get("CI"))
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        (pytest.fail if required else pytest.skip)(f"Ray is not installed ({exc}): pip install 'vf-sandbox[ray]'")
    from ray_cluster import RayCluster, RayStartError

    cluster = RayCluster(nodes=1, cpus=(2,), env={**OTHERWISE, "PYTHONPATH": str(ROOT)})  # the actors' environment
    try:
        cluster.start()
    except RayStartError as exc:
        cluster.stop()
        (pytest.fail if required else pytest.skip)(f"cannot start a Ray cluster here: {exc}")
    try:
        workers = run_driver(tmp_path, "ray", VF_TEST_RAY_GCS=cluster.gcs)
    finally:
        cluster.stop()
    assert cluster.pids() == []
    assert_definitions_settings(workers)


def test_a_run_uses_its_definitions_settings_in_this_process(tmp_path, monkeypatch):
    """In the runner's own process too: the run's scope, not the environment at the point
    of use (an environment module may change os.environ; the run does not see it)."""
    from runner import config as C
    from runner.display import make_display
    from runner.runner import run_evals

    envdir, out = probe_env(tmp_path)
    monkeypatch.setenv("VF_SANDBOX_CACHE", "/from-environ")
    base = C.build_eval_config({"env_id": "settings_probe", "env_dir_path": str(envdir), "env_args": {"out": str(out)},
                                "model": "openai/none", "num_examples": 2, "rollouts_per_example": 1,
                                "output_dir": str(tmp_path / "o")}).model_copy(update={"runs_db": str(tmp_path / "r.db")})
    own = labels.run_id()
    entry = ProcessSettings(sandbox_cache=str(tmp_path / "entry"))
    with settings.use(entry) as scope:  # what an entry does
        (cfg,) = C.with_process_settings([base], settings.current())
        with make_display(True, False) as display:
            (res,) = asyncio.run(run_evals([cfg], display))
    assert res.status == "completed", res.error
    (what,) = seen(out).values()
    assert what["wheelhouse"] == str(tmp_path / "entry" / "wheelhouse") and what["label"] == scope.sandbox_run_id
    assert labels.run_id() == own


# --------------------------------------------------------------- runs --db

def test_runs_db_is_passed_down_not_through_os_environ(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from runs import registry
    from vfcli.app import app

    monkeypatch.setenv("VF_RUNS_DB", str(tmp_path / "environ.db"))
    given = tmp_path / "given.db"
    rec = registry.RunRecorder.start(kind="eval", env_id="dbprobe", output_dir=tmp_path / "o", db=given,
                                     capture_logging=False)
    rec.finish("completed")
    before = dict(os.environ)
    for argv in (["runs", "--db", str(given), "list", "--json"], ["runs", "list", "--db", str(given), "--json"]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 0, res.output
        assert [r["id"] for r in json.loads(res.output)] == [rec.id]
        assert dict(os.environ) == before  # nothing written to the environment
        assert settings.current().runs_db == str(tmp_path / "environ.db")  # the command's scope ended with it
    res = CliRunner().invoke(app, ["runs", "list", "--json"])  # without --db: the environment's (empty) registry
    assert res.exit_code == 0 and json.loads(res.output) == []
    assert not (tmp_path / "environ.db").exists() or registry.list_runs(path=tmp_path / "environ.db") == []


# --------------------------------------------------------------- credentials

def test_credentials_never_land_in_what_a_run_records(tmp_path, monkeypatch):
    from hosted import submit
    from hosted.driver import SPEC_FILE
    from runner import config as C
    from runner.display import make_display
    from runner.runner import run_evals
    from runs import registry

    secret = f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv("VF_REGISTRY_USERNAME", "someone")
    monkeypatch.setenv("VF_REGISTRY_PASSWORD", secret)
    envdir, out = probe_env(tmp_path)
    base = C.build_eval_config({"env_id": "settings_probe", "env_dir_path": str(envdir), "env_args": {"out": str(out)},
                                "model": "openai/none", "num_examples": 4, "rollouts_per_example": 1,
                                "num_workers": 2, "output_dir": str(tmp_path / "o"), "save_results": True,
                                "junit_xml": str(tmp_path / "junit.xml")}).model_copy(update={"runs_db": str(tmp_path / "r.db")})
    with settings.use(ProcessSettings.from_env()):  # the entry
        (cfg,) = C.with_process_settings([base], settings.current())
        assert cfg.settings.registry_password.get_secret_value() == secret  # in memory, in this process
        with make_display(True, False) as display:
            (res,) = asyncio.run(run_evals([cfg], display))
    assert res.status == "completed", res.error
    assert {w["password"] for w in seen(out).values()} == {secret}  # the workers had it (the runner's, handed beside the definition)
    (rec,) = registry.list_runs(path=tmp_path / "r.db")
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != out] + [Path(rec.log_path)]
    assert any(p.name == "metadata.json" for p in written) and (tmp_path / "junit.xml").exists()
    leaked = [str(p) for p in written if secret.encode() in p.read_bytes()]
    assert not leaked, f"the registry password was written to {leaked}"
    assert secret not in cfg.model_dump_json() and secret not in json.dumps(cfg.public_args())
    # a hosted job: the staged definition holds no credential; the job's environment does
    staging = submit.stage(cfg, "0123456789ab", "job1", None)
    try:
        assert secret not in (staging / SPEC_FILE).read_text()
    finally:
        import shutil

        shutil.rmtree(staging)
    assert submit.job_env_vars(cfg, {})["VF_REGISTRY_PASSWORD"] == secret
