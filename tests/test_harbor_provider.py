"""Harbor on vf-sandbox (integrations/harbor_env.py): Harbor's real CLI (`harbor run`, from
.venv-harbor: Harbor needs Python >= 3.12, scripts/setup.sh makes it) runs its oracle agent
on Harbor-format tasks through `VfHarborEnvironment`, loaded by import path, and the
assertions read Harbor's own verdict files (each trial's result.json and
verifier/reward.*, the job's result.json).

* examples/harbor_tasks (the valid ones) and tests/data/harbor_provider_task pass with the
  oracle on Docker containers, cells and gVisor; the sandbox got the task's workdir,
  memory limit and no network; no sandbox is left.
* A wrong oracle gets reward 0 (a run whose verdict can fail).
* What the provider cannot give is refused loudly, never run weaker: a task whose agent
  and verifier run as another user than the image's (our sandboxes cannot switch users),
  a public network without `--ek network=true`, an allowlist (Harbor refuses it from our
  capabilities).

Without .venv-harbor the tests are skipped, and FAIL under VF_REQUIRE_DOCKER=1 (CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, TEST_LABELS, docker_required, leftover_containers, require_gvisor

pytestmark = pytest.mark.docker

HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
EXAMPLES = ROOT / "examples" / "harbor_tasks"
OWN_TASK = ROOT / "tests" / "data" / "harbor_provider_task"
PROVIDER = "integrations.harbor_env:VfHarborEnvironment"
RUN_LABEL = "vf-harbor-test"
# the examples the oracle passes through our provider; user-owned-notes runs its agent and
# verifier as another user than the image's: refused (test_other_user_is_refused)
PASSING_EXAMPLES = ["fix-mean-bug", "primes-with-timeout", "word-counts"]
MODES = {
    "container": ["rollout_isolation=container"],
    "cell": ["rollout_isolation=cell"],
    "gvisor": ["isolation=gvisor"],
}


@pytest.fixture(autouse=True)
def _harbor_venv() -> None:
    if not HARBOR.is_file():
        reason = f"Harbor is not installed at {HARBOR} (scripts/setup.sh makes .venv-harbor)"
        if docker_required():
            pytest.fail(f"Harbor is required (VF_REQUIRE_DOCKER=1) but {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def run_label():
    """The label of this test's sandboxes and images ({RUN_LABEL: id}). The images its runs
    built carry it (the provider puts its `labels` option on them, part of their content
    key): they are removed after the test, so no test leaves an image behind."""
    label = {RUN_LABEL: uuid.uuid4().hex[:12]}
    yield label

    def images() -> list[str]:
        return sorted(set(subprocess.run(["docker", "images", "-q", "--filter", f"label={RUN_LABEL}={label[RUN_LABEL]}"],
                                         capture_output=True, text=True, timeout=60).stdout.split()))

    if ids := images():
        subprocess.run(["docker", "rmi", *ids], capture_output=True, timeout=120)
    assert images() == [], "the test's images could not be removed"


def harbor_cli(tasks: Path, jobs: Path, *ek: str, label: dict[str, str],
               timeout: float = 420) -> subprocess.CompletedProcess:
    """`harbor run` of the oracle on every task under `tasks` through our provider."""
    labels = json.dumps({**TEST_LABELS, **label})
    cmd = [str(HARBOR), "run", "-p", str(tasks), "-a", "oracle", "--env", PROVIDER, "-o", str(jobs),
           "--job-name", "job", "-y", "-n", "2", "--ek", f"labels={labels}", "--ek", "timeout_minutes=15"]
    for kwarg in ek:
        cmd += ["--ek", kwarg]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "COLUMNS": "400"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def harbor_run(tasks: Path, jobs: Path, *ek: str, label: dict[str, str]) -> Path:
    """`harbor run` that must finish (exit 0, the job's result.json written); the job dir."""
    proc = harbor_cli(tasks, jobs, *ek, label=label)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (jobs / "job" / "result.json").is_file(), proc.stdout[-3000:]
    return jobs / "job"


def trials(job: Path) -> dict[str, dict]:
    """Task directory name -> Harbor's result.json of its trial."""
    out = {}
    for path in job.glob("*/result.json"):
        result = json.loads(path.read_text())
        out[path.parent.name.split("__")[0]] = result | {"_dir": path.parent}
    return out


def reward(trial: dict) -> float:
    """The reward Harbor's verifier wrote (reward.txt or reward.json), read from the file itself."""
    verifier = trial["_dir"] / "verifier"
    if (verifier / "reward.txt").is_file():
        return float((verifier / "reward.txt").read_text().strip())
    return float(json.loads((verifier / "reward.json").read_text())["reward"])


def _tasks_dir(tmp_path: Path, names: list[str], own: bool = True) -> Path:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in names:
        shutil.copytree(EXAMPLES / name, tasks / name)
    if own:
        shutil.copytree(OWN_TASK, tasks / "answer")
    return tasks


def _variant(tmp_path: Path, name: str, *, toml: str | None = None, solve: str | None = None) -> Path:
    """A copy of our own task under `name`, its task.toml's [environment] network lines or its
    oracle replaced."""
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    task = tasks / name
    shutil.copytree(OWN_TASK, task)
    if toml is not None:
        text = (task / "task.toml").read_text().replace('network_mode = "no-network"\n', toml)
        (task / "task.toml").write_text(text)
    if solve is not None:
        (task / "solution" / "solve.sh").write_text(solve)
    return tasks


@pytest.mark.parametrize("mode", list(MODES))
def test_oracle_passes(tmp_path, python_image, run_label, mode):
    """The oracle passes every task (reward 1, no exception) in this mode; the sandbox got the
    task's workdir and memory limit and no network; no sandbox is left."""
    if mode == "gvisor":
        require_gvisor()
    label = run_label
    job = harbor_run(_tasks_dir(tmp_path, PASSING_EXAMPLES), tmp_path / "jobs", *MODES[mode], label=label)
    results = trials(job)
    assert sorted(results) == sorted([*PASSING_EXAMPLES, "answer"])
    for name, trial in results.items():
        assert trial["exception_info"] is None, (name, trial["exception_info"])
        assert reward(trial) == 1.0, (name, (trial["_dir"] / "verifier" / "test-stdout.txt").read_text()[-2000:])
        assert trial["verifier_result"]["rewards"]["reward"] == 1.0
    seen = dict(line.split("=", 1) for line in
                (results["answer"]["_dir"] / "verifier" / "sandbox.txt").read_text().splitlines())
    assert seen["pwd"] == "/app"  # the Dockerfile's WORKDIR
    assert seen["user"] == "root"
    assert seen["interfaces"].split() in ([], ["lo"])  # no network
    if mode != "gvisor":  # gVisor shows no cgroup limit inside the sandbox
        assert int(seen["memory_max"]) == 512 * 1024**2  # memory_mb = 512
    stats = json.loads((job / "result.json").read_text())["stats"]
    assert stats["n_errored_trials"] == 0 and stats["n_completed_trials"] == len(results)
    log = "".join(p.read_text() for p in job.glob("*/trial.log"))
    kind = {"container": "container, runc", "cell": "cell, runc", "gvisor": "container, gvisor"}[mode]
    assert f"({'docker'}, {kind})" in log, log[-2000:]
    assert leftover_containers(label) == []


def test_wrong_oracle_fails(tmp_path, python_image, run_label):
    """A task whose oracle writes the wrong answer: the trial runs cleanly and Harbor's verdict
    is reward 0."""
    label = run_label
    wrong = "#!/bin/bash\necho 41 > /app/answer.txt\n"
    job = harbor_run(_variant(tmp_path, "wrong-oracle", solve=wrong), tmp_path / "jobs", "rollout_isolation=cell",
                     label=label)
    trial = trials(job)["wrong-oracle"]
    assert trial["exception_info"] is None, trial["exception_info"]
    assert reward(trial) == 0.0
    assert "answer: 41" in (trial["_dir"] / "verifier" / "test-stdout.txt").read_text()
    assert leftover_containers(label) == []


def test_other_user_runs_as_that_user(tmp_path, python_image, run_label):
    """user-owned-notes runs its agent and verifier as `worker`, the image as root (Harbor's
    own bookkeeping runs as root). Without consent the provider refuses the switch
    (UserSwitchUnsupported: secure by default); with `--ek user_switch=true` (the agent alone
    keeps CAP_SETUID/SETGID/SETPCAP) the oracle's file is made by worker, as Harbor's own run
    makes it. In cells (no capability at all) the same task is refused before it starts,
    never run as the wrong user."""
    label = run_label
    (tmp_path / "plain").mkdir()
    plain = harbor_run(_tasks_dir(tmp_path / "plain", ["user-owned-notes"], own=False), tmp_path / "jobs-plain",
                       label=label)
    trial = trials(plain)["user-owned-notes"]
    assert trial["exception_info"]["exception_type"] == "UserSwitchUnsupported", trial["exception_info"]
    job = harbor_run(_tasks_dir(tmp_path, ["user-owned-notes"], own=False), tmp_path / "jobs", "user_switch=true",
                     label=label)
    trial = trials(job)["user-owned-notes"]
    assert trial["exception_info"] is None, trial["exception_info"]
    assert reward(trial) == 1.0, (trial["_dir"] / "verifier" / "test-stdout.txt").read_text()[-2000:]
    (tmp_path / "cells").mkdir()
    cells = harbor_run(_tasks_dir(tmp_path / "cells", ["user-owned-notes"], own=False), tmp_path / "jobs-cells",
                       "rollout_isolation=cell", "user_switch=true", label=label)
    trial = trials(cells)["user-owned-notes"]
    assert trial["exception_info"]["exception_type"] == "ConfigError", trial["exception_info"]
    assert "not available in cells" in trial["exception_info"]["exception_message"]
    assert leftover_containers(label) == []


@pytest.mark.parametrize("policy, needle", [
    ("", "pass --ek network=true"),  # no network_mode: Harbor's default, public
    ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "network_mode='allowlist' is not supported by "
     "vf-sandbox environment"),
])
def test_network_the_sandbox_cannot_give_is_refused(tmp_path, python_image, run_label, policy, needle):
    """A public network without the operator's consent, or an allowlist (no backend here filters
    egress by host): Harbor's run stops before any sandbox starts (it builds the environment up
    front), naming the reason; no verdict is written."""
    label = run_label
    proc = harbor_cli(_variant(tmp_path, "net", toml=policy), tmp_path / "jobs", label=label)
    output = " ".join((proc.stdout + proc.stderr).replace("\u2502", " ").split())
    assert proc.returncode != 0, output[-3000:]
    assert needle in output, output[-3000:]
    assert list((tmp_path / "jobs").glob("*/*/verifier/reward.*")) == []
    assert leftover_containers(label, wait=0) == []


def test_public_network_with_consent(tmp_path, python_image, run_label):
    """A public-network task with `--ek network=true`: a container gets a network interface;
    a cell cannot have one, and the backend refuses it (ConfigError), never runs it offline."""
    label = run_label
    tasks = _variant(tmp_path, "net", toml="")
    trial = trials(harbor_run(tasks, tmp_path / "jobs", "network=true", label=label))["net"]
    assert trial["exception_info"] is None, trial["exception_info"]
    seen = (trial["_dir"] / "verifier" / "sandbox.txt").read_text()
    assert [i for i in seen.split("interfaces=")[1].split() if i != "lo"], seen
    trial = trials(harbor_run(tasks, tmp_path / "jobs-cell", "network=true", "rollout_isolation=cell",
                              label=label))["net"]
    assert trial["exception_info"]["exception_type"] == "ConfigError", trial["exception_info"]
    assert "a cell has only loopback" in trial["exception_info"]["exception_message"]
    assert leftover_containers(label) == []


def test_agent_timeout_kills_the_command(tmp_path, python_image, run_label):
    """An oracle past its task's agent timeout (3 s): Harbor records AgentTimeoutError, the
    sandbox stays usable (the verifier runs in it: reward 0) and the timed-out command's
    processes are gone by then."""
    label = run_label
    slow = "#!/bin/bash\nsleep 600\necho 42 > /app/answer.txt\n"
    tasks = _variant(tmp_path, "slow", solve=slow)
    toml = tasks / "slow" / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec = 60.0", "[agent]\ntimeout_sec = 3.0"))
    t0 = time.monotonic()
    trial = trials(harbor_run(tasks, tmp_path / "jobs", "rollout_isolation=cell", label=label))["slow"]
    assert time.monotonic() - t0 < 300
    assert trial["exception_info"]["exception_type"] == "AgentTimeoutError", trial["exception_info"]
    assert reward(trial) == 0.0
    seen = (trial["_dir"] / "verifier" / "sandbox.txt").read_text()
    assert "sleeping=0" in seen, seen
    assert leftover_containers(label) == []


def test_healthcheck(tmp_path, python_image, run_label):
    """The task's [environment.healthcheck] runs in the sandbox before the agent: one that
    passes (the task's file is there, in the workdir) lets the oracle pass; one that never
    passes stops the trial with Harbor's HealthcheckError."""
    label = run_label
    for name, command in (("healthy", "test -f numbers.txt"), ("unhealthy", "test -f /nonexistent")):
        tasks = _variant(tmp_path, name)
        toml = tasks / name / "task.toml"
        toml.write_text(toml.read_text() + f'\n[environment.healthcheck]\ncommand = "{command}"\n'
                        "interval_sec = 0.2\nretries = 2\n")
    results = trials(harbor_run(tmp_path / "tasks", tmp_path / "jobs", label=label))
    assert results["healthy"]["exception_info"] is None, results["healthy"]["exception_info"]
    assert reward(results["healthy"]) == 1.0
    assert results["unhealthy"]["exception_info"]["exception_type"] == "HealthcheckError", \
        results["unhealthy"]["exception_info"]
    assert leftover_containers(label) == []


@pytest.mark.parametrize("mode", ["container", "cell"])
def test_environment_api(tmp_path, python_image, run_label, mode):
    """Harbor's BaseEnvironment operations on the provider, driven directly from .venv-harbor
    (tests/data/harbor_provider_probe.py): exec's exit code, separate streams, task + exec env,
    the Dockerfile's workdir, cwd, root, a user it cannot switch to (UserSwitchUnsupported), a
    timeout (Harbor's Docker wording; the sandbox stays usable); a tree uploaded into an
    existing directory (kept files, exec bits, symlinks), a file into new parents, downloads
    overwriting stale files, is_dir / is_file, a missing file, nothing after stop."""
    label = run_label
    proc = subprocess.run(
        [str(HARBOR.with_name("python")), str(ROOT / "tests" / "data" / "harbor_provider_probe.py"), str(OWN_TASK),
         str(tmp_path), f"rollout_isolation={mode}", f"labels={json.dumps({**TEST_LABELS, **label})}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["exec"] == [3, "/app\nroot\nfrom-task from-exec\n", "err\n"]
    assert seen["cwd"] == "/tmp" and seen["as_root"] == "root" and seen["as_nobody"] == "UserSwitchUnsupported"
    assert seen["timeout"] == "Command timed out after 1 seconds" and seen["after_timeout"] == "alive"
    assert seen["upload_dir"] == ["old", "a", "ran", "a.txt"] and seen["upload_file"] == "256"
    assert seen["download_dir"] == {"a": "a\n", "keep": "old\n", "exec_bit": True, "link": "a.txt", "bin": True}
    assert seen["download_file"] is True
    assert seen["is_dir"] == [True, False] and seen["is_file"] == [True, False]
    assert seen["download_missing"] == "FileNotFound"
    assert "not started" in seen["after_stop"]
    assert leftover_containers(label) == []
