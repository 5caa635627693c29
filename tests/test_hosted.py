"""Hosted runs (`--hosted`) against a REAL Ray cluster started for this module:
a head and a second node, separate `ray start` processes with their own temp
dirs and disjoint ports (tests/ray_cluster.py), stopped by pid at the end.
Every command is the real CLI in a subprocess; the model is the local model
server (in this process, reached by the actors over loopback); sandboxes are
real Docker containers.

Without Ray (or when the cluster cannot start) the module is skipped, except
with VF_REQUIRE_RAY=1 (`make test`), VF_REQUIRE_DOCKER=1 or CI set, where it
FAILS with the reason.

The node-kill test runs last: it leaves the cluster with one node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from testmodel.model_server import ModelServer, PolicyRequest, Reply, ToolCallSpec, compute, stall

# One worker runs the module (`make test` runs pytest-xdist with --dist loadgroup): its
# module fixture is a 2-node Ray cluster (a dozen processes); split across workers, each
# would start its own on this 2-core machine.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("ray-cluster")]

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "environments"
VF = [sys.executable, "-m", "vfcli.app"]
SWE = [sys.executable, "-m", "swe_debug.cli"]
SECRET = f"zebra-{uuid.uuid4().hex}-quokka"
IDNA, BAD_GOLD = "kjd__idna-3.4", "kjd__idna-3.4-bad-gold"


@pytest.fixture(scope="module")
def cluster():
    required = "1" in (os.environ.get("VF_REQUIRE_RAY"), os.environ.get("VF_REQUIRE_DOCKER")) or bool(os.environ.get("CI"))
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        (pytest.fail if required else pytest.skip)(f"Ray is not installed ({exc}): pip install 'vf-sandbox[ray]'")
    from ray_cluster import RayCluster, RayStartError

    c = RayCluster(nodes=2, cpus=(2, 1))
    try:
        c.start()
    except RayStartError as exc:
        (pytest.fail if required else pytest.skip)(f"cannot start a Ray cluster here: {exc}")
    try:
        yield c
    finally:
        c.stop()
        assert c.pids() == [], f"Ray processes left behind: {c.pids()}"


def vf(tmp: Path, cluster, *args: str, cmd: list[str] = VF, timeout: float = 400, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "VF_RUNS_DB": str(tmp / "runs.db"), "VF_TEST_KEY": "k", "RAY_ADDRESS": cluster.dashboard_url, **env}
    e.pop("VF_RUN_ID", None)
    return subprocess.run([*cmd, *args], cwd=tmp, env=e, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def dashboard(tmp: Path, cluster):
    """`vf-sandbox dashboard` in a fresh process over this test's registry; yields GET -> JSON."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = {**os.environ, "VF_RUNS_DB": str(tmp / "runs.db"), "RAY_ADDRESS": cluster.dashboard_url}
    proc = subprocess.Popen([*VF, "dashboard", "--port", str(port), "--no-launch"], cwd=tmp, env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return json.loads(r.read())

    try:
        deadline = time.time() + 60
        while True:
            try:
                get("/api/runs")
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        yield get
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def eval_args(env_id: str, base_url: str, *extra: str) -> list[str]:
    return ["eval", env_id, "-p", str(ENVS), "-m", "test-model", "-b", base_url, "-k", "VF_TEST_KEY", "-o", "out",
            "--hosted", *extra]


def saved(tmp: Path) -> tuple[list[dict], dict]:
    (d,) = [p for p in (tmp / "out" / "evals").glob("*/*") if (p / "metadata.json").exists()]
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines() if x.strip()]
    return rows, json.loads((d / "metadata.json").read_text())


def runs_json(tmp: Path, cluster) -> list[dict]:
    p = vf(tmp, cluster, "runs", "list", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def head_logs(cluster) -> Path:
    """The head node's Ray logs dir (of its session; `session_latest` is a link to it)."""
    return (cluster.root / "n0" / "session_latest").resolve() / "logs"


def cluster_results_dir(cluster, rid: str) -> Path:
    return head_logs(cluster) / "vf-sandbox" / f"vf-{rid}"


def cluster_rows(cluster, rid: str) -> int:
    found = list(cluster_results_dir(cluster, rid).glob("evals/*/*/results.jsonl"))
    return found[0].read_text().count("\n") if found else 0


def bash_files_policy_wrong_on_example_1():
    sys.path.insert(0, str(ENVS / "bash_files"))
    import bash_files

    right = bash_files.scripted_policy()

    def policy(req: PolicyRequest):
        if req.headers.get("X-Session-ID") == "1":  # example 1: a wrong file -> reward 0
            if req.n_tool_turns() == 0:
                return Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo 0 > /task/answer.txt"})])
            return Reply(content="\\boxed{0}")
        return right(req)

    return policy


def test_hosted_sandbox_eval_follow_every_row_once_and_secrets_unrecorded(tmp_path, cluster):
    from test_sandbox_env import wait_gone

    label = uuid.uuid4().hex[:12]
    with ModelServer(bash_files_policy_wrong_on_example_1()).run_in_thread() as srv:
        p = vf(tmp_path, cluster, *eval_args(
            "bash-files", srv.base_url, "-n", "4", "-r", "2", "-c", "4", "--follow", "--poll-interval", "0.5",
            "--allow-sandbox-access", "--eval-name", "hosted-e2e", "--custom-secrets", json.dumps({"VF_TEST_SECRET": SECRET}),
            "-a", json.dumps({"labels": {"vf-sandbox.test": "1", "vf-test-case": label}})))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-3000:]
    assert "submitted to" in p.stdout and "completed" in p.stdout
    rows, meta = saved(tmp_path)
    assert Counter(r["example_id"] for r in rows) == {0: 2, 1: 2, 2: 2, 3: 2}  # every rollout once
    assert {r["example_id"]: r["reward"] for r in rows} == {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}
    assert meta["status"] == "completed" and meta["eval_config"]["hosted"] is True
    assert meta["eval_config"]["custom_secret_names"] == ["VF_TEST_SECRET"]
    assert wait_gone({"vf-test-case": label}) == []  # 0 sandboxes left on the (shared) Docker engine
    assert "2 worker actor(s) over 2 node(s)" in p.stdout, p.stdout[-3000:]  # one per node (both ready: last test)

    (run,) = runs_json(tmp_path, cluster)
    assert (run["status"], run["name"], run["completed"], run["args"]["hosted"]) == ("completed", "hosted-e2e", 8, True)
    assert run["args"]["address"] == cluster.dashboard_url
    listing = vf(tmp_path, cluster, "runs", "list").stdout
    assert "HOSTED" in listing and cluster.dashboard_url in listing

    # the secret reached the job (Ray keeps it in the job's runtime_env: documented) ...
    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(cluster.dashboard_url).get_job_info(f"vf-{run['id']}")
    assert info.runtime_env["env_vars"]["VF_TEST_SECRET"] == SECRET
    # ... and appears nowhere in our outputs, registry or logs, here or on the cluster
    ours = [p for p in tmp_path.rglob("*") if p.is_file()] + \
           [p for p in cluster_results_dir(cluster, run["id"]).rglob("*") if p.is_file()]
    assert any(p.name == "results.jsonl" for p in ours) and any(p.suffix == ".db" for p in ours)
    # the processes' logs on every node (job driver, actors): Ray's own records (runtime env) are not ours
    ours += [p for p in cluster.root.glob("n*/session_*/logs/*")
             if p.is_file() and p.name.startswith(("job-driver-", "worker-"))]
    leaked = [str(p) for p in ours if SECRET.encode() in p.read_bytes()]
    assert leaked == [] and SECRET not in p.stdout + p.stderr
    assert SECRET not in vf(tmp_path, cluster, "runs", "logs", run["id"]).stdout
    assert SECRET not in vf(tmp_path, cluster, "runs", "show", run["id"], "--json").stdout


def test_missing_sandbox_permission_fails_before_any_rollout(tmp_path, cluster):
    """Submitted from a TOML config (`hosted = true`, the cluster from RAY_ADDRESS)."""
    from test_sandbox_env import containers_with

    label = uuid.uuid4().hex[:12]
    with ModelServer(bash_files_policy_wrong_on_example_1()).run_in_thread() as srv:
        (tmp_path / "hosted.toml").write_text(
            f'model = "test-model"\napi_base_url = "{srv.base_url}"\napi_key_var = "VF_TEST_KEY"\n'
            f'env_dir_path = "{ENVS}"\noutput_dir = "out"\nhosted = true\nnum_examples = 2\n'
            f'rollouts_per_example = 1\n[[eval]]\nenv_id = "bash-files"\n'
            f'[eval.env_args.labels]\n"vf-sandbox.test" = "1"\n"vf-test-case" = "{label}"\n')
        p = vf(tmp_path, cluster, "eval", "hosted.toml", "--follow", "--poll-interval", "0.5")
        requests = srv.count
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    assert "missing permission" in p.stdout and "--allow-sandbox-access" in p.stdout
    (run,) = runs_json(tmp_path, cluster)
    assert run["status"] == "failed" and "missing permission" in run["error"]
    rows, meta = saved(tmp_path)
    assert rows == [] and meta["status"] == "failed"
    assert containers_with({"vf-test-case": label}) == []
    assert requests == 0  # no rollout started: the model was never called


def test_detached_run_list_show_logs_stop_then_resume(tmp_path, cluster):
    """A SandboxEnv run submitted detached, seen and stopped from fresh processes while
    its sandboxes are live on the nodes; the stop leaves none and keeps whole groups;
    --resume ships them back and the run completes with every rollout once."""
    from test_sandbox_env import containers_with, wait_gone

    label = uuid.uuid4().hex[:12]
    labels = {"vf-sandbox.test": "1", "vf-test-case": label}
    args = ["-n", "16", "-r", "2", "--allow-sandbox-access", "-a", json.dumps({"labels": labels})]
    policy = bash_files_policy_wrong_on_example_1()
    held = threading.Event()  # set: a rollout's answer after its tool call waits (its sandbox stays live)

    async def gated(req: PolicyRequest) -> Reply:
        await asyncio.sleep(0.5)
        while held.is_set() and req.n_tool_turns() >= 1:
            await asyncio.sleep(0.1)
        return policy(req)

    with ModelServer(gated).run_in_thread() as srv, \
            dashboard(tmp_path, cluster) as api:  # it syncs running hosted runs: rows and progress live
        p = vf(tmp_path, cluster, *eval_args("bash-files", srv.base_url, *args, "-c", "2"))
        assert p.returncode == 0, p.stderr[-3000:]
        assert "submitted to" in p.stdout and "runs logs" in p.stdout
        (run,) = runs_json(tmp_path, cluster)  # a fresh process sees it
        rid = run["id"]
        assert run["status"] == "running" and run["args"]["hosted"] is True
        deadline = time.time() + 120
        while time.time() < deadline:  # groups written (on the head node), shown by the dashboard, sandboxes live
            run = api(f"/api/runs/{rid}")["run"]
            if run["status"] == "running" and run["completed"] >= 2 and containers_with(labels) and \
                    api(f"/api/runs/{rid}/samples")["total_groups"] >= 1:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"the dashboard did not show the hosted run's rows within 120 s: {run}")
        # the run is held mid-way until the stop: under load, the show/logs processes below used to take long
        # enough for the run to finish first (CI, stop 32: no live sandbox left to stop)
        held.set()
        show = vf(tmp_path, cluster, "runs", "show", rid)
        assert show.returncode == 0 and "HOSTED" in show.stdout and f"vf-{rid}" in show.stdout
        logs = vf(tmp_path, cluster, "runs", "logs", rid)
        assert logs.returncode == 0 and "worker actor" in logs.stdout
        live = time.time() + 60  # held rollouts keep theirs; a new one shows its sandbox at its tool call
        while not containers_with(labels) and time.time() < live:
            time.sleep(0.3)
        assert containers_with(labels), "the run had no live sandbox when it was stopped"

        stop = vf(tmp_path, cluster, "runs", "stop", rid)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "stopped" in stop.stdout
        assert wait_gone(labels) == []  # its sandboxes deleted on every node
        held.clear()  # the stopped job's held requests answer (to no one); the resumed run is not held
        (run,) = runs_json(tmp_path, cluster)
        assert run["status"] == "stopped"
        rows, meta = saved(tmp_path)  # the finished groups came back, whole
        assert meta["status"] == "stopped" and 2 <= len(rows) < 32
        assert all(n == 2 for n in Counter(r["example_id"] for r in rows).values())

        p = vf(tmp_path, cluster, *eval_args("bash-files", srv.base_url, *args, "-c", "16", "--resume"))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        follow = vf(tmp_path, cluster, "runs", "logs", rid, "--follow", "--poll-interval", "0.5")
        assert follow.returncode == 0 and f"run {rid}: completed" in follow.stdout, follow.stdout[-3000:]
        assert "resuming" in follow.stdout.lower(), follow.stdout[-3000:]
    rows, meta = saved(tmp_path)
    assert Counter(r["example_id"] for r in rows) == {i: 2 for i in range(16)}
    assert {r["example_id"]: r["reward"] for r in rows} == {i: 0.0 if i == 1 else 1.0 for i in range(16)}
    assert meta["status"] == "completed"
    (run,) = runs_json(tmp_path, cluster)
    assert (run["id"], run["status"], run["attempts"], run["completed"]) == (rid, "completed", 2, 32)
    assert wait_gone(labels) == []


def test_swe_debug_hosted_gives_the_local_verdicts(tmp_path, cluster):
    import asyncio

    from swe_debug.examples.builder import build_dataset, build_images

    examples = build_dataset()
    asyncio.run(build_images(examples))
    ids = f"{IDNA},{BAD_GOLD}"
    (tmp_path / "l").mkdir()
    local = vf(tmp_path / "l", cluster, str(examples), "-i", ids, "-o", "out", "-q", cmd=SWE)
    hosted = vf(tmp_path, cluster, str(examples), "-i", ids, "-o", "out", "-q", "--hosted", cmd=SWE)
    assert local.returncode == hosted.returncode == 1, hosted.stdout[-3000:] + hosted.stderr[-3000:]  # one invalid

    def verdicts(base: Path) -> dict:
        (d,) = list((base / "out" / "evals").glob("swe-debug--none/*"))
        rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines() if x.strip()]
        return {r["info"]["verdict"]["instance_id"]: (r["info"]["verdict"]["valid"], r["info"]["verdict"]["reason"])
                for r in rows}

    assert verdicts(tmp_path) == verdicts(tmp_path / "l") == {IDNA: (True, "pass"), BAD_GOLD: (False, "gold_apply_failed")}
    (run,) = runs_json(tmp_path, cluster)
    assert (run["kind"], run["status"], run["args"]["hosted"]) == ("swe-debug", "completed", True)


def test_permission_rules_sandboxes_and_instances(monkeypatch):
    """No cluster needed: what the job checks before any rollout (hosted.driver)."""
    from runner.config import configs_from_cli
    from hosted.driver import MissingPermission, check_permissions
    from runner.setup import load_run_env

    monkeypatch.setenv("VF_TEST_KEY", "k")

    def cfg(env_id: str, **kw):
        (c,) = configs_from_cli([env_id], {"model": "m", "api_base_url": "http://127.0.0.1:9/v1",
                                           "api_key_var": "VF_TEST_KEY", "env_dir_path": str(ENVS), **kw})
        return c, load_run_env(c)

    check_permissions(*cfg("math-single"))  # no sandboxes: no permission needed
    with pytest.raises(MissingPermission, match="--allow-sandbox-access"):
        check_permissions(*cfg("bash-files"))
    check_permissions(*cfg("bash-files", allow_sandbox_access=True))
    with pytest.raises(MissingPermission, match="--allow-instances-access"):
        check_permissions(*cfg("bash-files", allow_sandbox_access=True, backend="kubernetes"))
    check_permissions(*cfg("bash-files", allow_sandbox_access=True, allow_instances_access=True, backend="kubernetes"))


def test_kuberay_manifest_is_consistent():
    """configs/kuberay/raycluster.yaml cannot be applied here (no Kubernetes): at least its
    parts agree: the sandbox namespace exists and is the one the pods' Role and the backend
    use, both groups run as the bound service account, on one image, the head serves the Jobs API."""
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "configs" / "kuberay" / "raycluster.yaml").read_text())}
    assert set(docs) == {"Namespace", "ServiceAccount", "Role", "RoleBinding", "RayCluster"}
    ns = docs["Namespace"]["metadata"]["name"]
    assert docs["Role"]["metadata"]["namespace"] == docs["RoleBinding"]["metadata"]["namespace"] == ns
    assert {"pods", "pods/exec"} <= set(docs["Role"]["rules"][0]["resources"])
    assert {"create", "delete", "list"} <= set(docs["Role"]["rules"][0]["verbs"])
    sa = docs["ServiceAccount"]["metadata"]["name"]
    assert docs["RoleBinding"]["subjects"][0]["name"] == sa and docs["RoleBinding"]["roleRef"]["name"] == "vf-sandbox-pods"
    spec = docs["RayCluster"]["spec"]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    assert {p["serviceAccountName"] for p in pods} == {sa}
    containers = [c for p in pods for c in p["containers"]]
    assert len({c["image"] for c in containers}) == 1
    assert all({"name": "VF_K8S_NAMESPACE", "value": ns} in c["env"] for c in containers)
    assert 8265 in [port["containerPort"] for port in containers[0]["ports"]]
    import ray

    assert spec["rayVersion"] == ray.__version__  # the cluster's Ray = the submitting side's


def test_hosted_without_ray_says_how_to_install_it(tmp_path):
    """No cluster needed: the CLI in a process where `import ray` fails."""
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['vf-sandbox', *sys.argv[1:]]; "
            "from vfcli.app import main; main()")
    e = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db"), "VF_TEST_KEY": "k"}
    p = subprocess.run([sys.executable, "-c", code, *eval_args("math-single", "http://127.0.0.1:9/v1"),
                        "--address", "http://127.0.0.1:9"], cwd=tmp_path, env=e, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "pip install 'vf-sandbox[ray]'" in p.stdout + p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "out").exists()  # nothing recorded or started


def test_hosted_timeout_minutes_stops_the_run_keeping_its_groups(tmp_path, cluster):
    """`--timeout-minutes` bounds a hosted run as it bounds a local one: the job stops
    itself, keeps the whole groups it finished, deletes its sandboxes, and the run
    ends `stopped` with the timeout as its error (resumable)."""
    from test_sandbox_env import wait_gone

    label = uuid.uuid4().hex[:12]
    labels = {"vf-sandbox.test": "1", "vf-test-case": label}
    with ModelServer(stall(0.5, bash_files_policy_wrong_on_example_1())).run_in_thread() as srv:
        p = vf(tmp_path, cluster, *eval_args(
            "bash-files", srv.base_url, "-n", "40", "-r", "2", "-c", "2", "--allow-sandbox-access", "--follow",
            "--poll-interval", "0.5", "--timeout-minutes", "0.25", "-a", json.dumps({"labels": labels})))
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "timeout after 0.25 minute(s)" in p.stdout, p.stdout[-3000:]
    (run,) = runs_json(tmp_path, cluster)
    assert run["status"] == "stopped" and "timeout" in run["error"], run
    rows, meta = saved(tmp_path)
    assert meta["status"] == "stopped" and 2 <= len(rows) < 80, (len(rows), meta.get("status"))
    assert all(n == 2 for n in Counter(r["example_id"] for r in rows).values())  # whole groups only
    assert wait_gone(labels) == []


def test_follow_outlives_a_vanished_cluster_with_a_clear_error(tmp_path, cluster):
    """A cluster of its own (one node), killed while `runs logs --follow` streams a
    detached run from it: the follower says it lost contact, retries for
    --reconnect-for, then exits 1 saying how to reattach; `runs show` still answers
    (the row stays `running`: the follower cannot know the run's end)."""
    from ray_cluster import RayCluster

    own = RayCluster(nodes=1, cpus=(2,))
    own.start()
    try:
        with ModelServer(stall(1.0, compute())).run_in_thread() as srv:
            p = vf(tmp_path, own, *eval_args("math-single", srv.base_url, "-n", "30", "-r", "1", "-c", "1"))
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            (run,) = runs_json(tmp_path, own)
            e = {**os.environ, "VF_RUNS_DB": str(tmp_path / "runs.db"), "RAY_ADDRESS": own.dashboard_url}
            follower = subprocess.Popen([*VF, "runs", "logs", run["id"], "--follow", "--poll-interval", "0.5",
                                         "--reconnect-for", "3"], cwd=tmp_path, env=e, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.time() + 120
            while cluster_rows(own, run["id"]) < 2:  # the run is generating: the follower is streaming it
                assert time.time() < deadline and follower.poll() is None, "the hosted run wrote no rows"
                time.sleep(0.3)
            own.stop()
            out, errs = follower.communicate(timeout=60)
    finally:
        own.stop()
    assert follower.returncode == 1, out[-2000:] + errs[-2000:]
    assert f"lost contact with the Ray cluster at {own.dashboard_url}" in out, out[-2000:]
    assert "may still be running there" in errs and f"runs logs {run['id']} --follow" in errs, errs[-2000:]
    assert "Traceback" not in errs
    show = vf(tmp_path, own, "runs", "show", run["id"], timeout=60)
    assert show.returncode == 0 and run["id"] in show.stdout, show.stdout + show.stderr
    for cmd in (("runs", "stop", run["id"]), ("runs", "pull", run["id"])):  # one line saying why, no traceback
        p = vf(tmp_path, own, *cmd, timeout=120)
        assert p.returncode == 1 and f"error: cannot reach the Ray cluster at {own.dashboard_url}" in p.stderr, \
            (cmd, p.stdout[-1000:], p.stderr[-2000:])
        assert "Traceback" not in p.stderr


def test_worker_node_killed_mid_run_loses_and_duplicates_nothing(tmp_path, cluster):
    """Last in the module: the second node's raylet is killed (by pid) while its actor holds
    groups; they go to the head's actor, the run completes, every rollout written once."""
    import asyncio
    import threading

    # The job's process runs groups itself until the actors are ready: the model answers nothing
    # until both are (the gate), so the actors get the run's groups. Then 40 rollouts of 0.6 s,
    # 2 at a time per actor (each holds 2 groups while any are queued): when 8 rows are written,
    # >= 12 groups are still queued (>= 3.6 s of work), so the node-1 actor surely holds groups
    # when it is killed, however fast the machine
    gate = threading.Event()
    slow = stall(0.6, compute())

    async def gated(req: PolicyRequest) -> Reply:
        while not gate.is_set():
            await asyncio.sleep(0.05)
        return await slow(req)

    with ModelServer(gated).run_in_thread() as srv:
        p = vf(tmp_path, cluster, *eval_args("math-single", srv.base_url, "-n", "20", "-r", "2", "-c", "4", "-w", "2"))
        assert p.returncode == 0, p.stderr[-3000:]
        (run,) = runs_json(tmp_path, cluster)
        rid = run["id"]
        job_log = head_logs(cluster) / f"job-driver-vf-{rid}.log"
        deadline = time.time() + 120
        while time.time() < deadline:  # both actors ready, then groups written
            log = job_log.read_text(errors="replace") if job_log.exists() else ""
            if not gate.is_set() and log.count("ready on") >= 2:
                nodes = set(re.findall(r"worker actor \d+ ready on \S+ \(node (\w+)\)", log))
                assert len(nodes) == 2, log[-3000:]  # the groups are going to run on both nodes
                assert "the job's process runs no more groups" in log, log[-3000:]
                gate.set()
            if gate.is_set() and cluster_rows(cluster, rid) >= 8:
                break
            time.sleep(0.3)
        else:
            gate.set()
            pytest.fail("the run did not get going on both nodes within 120 s")
        cluster.kill_raylet(1)
        follow = vf(tmp_path, cluster, "runs", "logs", rid, "--follow", "--poll-interval", "0.5")
    assert follow.returncode == 0 and f"run {rid}: completed" in follow.stdout, follow.stdout[-4000:]
    assert "died" in follow.stdout and "go to the other workers" in follow.stdout
    rows, meta = saved(tmp_path)
    assert Counter(r["example_id"] for r in rows) == {i: 2 for i in range(20)}  # 0 lost, 0 duplicated
    assert meta["status"] == "completed" and not any(r.get("error") for r in rows)



def test_hosted_group_setup_once_per_group_every_rollout_a_fork(tmp_path, cluster, python_image):
    """Issue 28 on a Ray cluster: `-x setup_scope=group` in a hosted run sets each example
    up once (on whichever node runs its group) and every rollout is a fork of it."""
    from test_sandbox_env import wait_gone

    env_dir = ROOT / "tests" / "data" / "group_setup_env"
    sys.path.insert(0, str(env_dir))
    import group_setup_env

    label = uuid.uuid4().hex[:12]
    counter = tmp_path / "setups.txt"  # the nodes are processes of this machine: one file for all
    args = {"counter_path": str(counter), "num_examples": 3, "docker_image": python_image,
            "labels": {"vf-sandbox.test": "1", "vf-test-case": label}}
    with ModelServer(group_setup_env.scripted_policy()).run_in_thread() as srv:
        p = vf(tmp_path, cluster, "eval", "group-setup-env", "-p", str(env_dir.parent), "-m", "test-model",
               "-b", srv.base_url, "-k", "VF_TEST_KEY", "-o", "out", "--hosted", "--follow", "--poll-interval", "0.5",
               "--allow-sandbox-access", "-n", "3", "-r", "3", "-c", "6", "-a", json.dumps(args),
               "-x", "setup_scope=group")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-3000:]
    rows, meta = saved(tmp_path)
    assert meta["status"] == "completed" and len(rows) == 9
    assert [r["reward"] for r in rows] == [1.0] * 9
    assert [r["metrics"]["sandbox_forked"] for r in rows] == [1.0] * 9  # every rollout a fork
    lines = counter.read_text().splitlines()
    assert sorted(line.split()[1] for line in lines) == ["0", "1", "2"]  # one setup per group
    assert wait_gone({"vf-test-case": label}) == []
