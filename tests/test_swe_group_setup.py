"""SWE pass@k with forks (issue 28): `SWEDebugEnv(setup_scope="group")` runs an instance's
setup once per group of attempts (`-r k`) and gives each attempt a fork, on the real Docker
engine with the example taskset (tests/test_swe_docker.py's fixtures), containers and
cells: the setup counted once per instance vs once per attempt, every verdict still valid and saying `forked`,
the fails-before run forked too, nothing left behind (containers, snapshot images)."""

from __future__ import annotations

import uuid

import pytest

from test_group_setup import assert_nothing_left
from test_swe_docker import IDNA, MORE, examples, instances  # noqa: F401  (session fixtures)

pytestmark = pytest.mark.docker


def counting_taskset(instances, ids):
    from swe_debug.taskset import SWETaskSet

    class Counting(SWETaskSet):
        setups: list[str] = []

        async def setup(self, sandbox, inst, timeout):
            self.setups.append(inst.instance_id)
            return await super().setup(sandbox, inst, timeout)

    ts = Counting([instances[i] for i in ids])
    ts.setups = []
    return ts


async def run(instances, scope: str, k: int, labels: dict[str, str], **kw):
    from swe_debug.env import SWEDebugEnv

    taskset = counting_taskset(instances, [IDNA, MORE])
    env = SWEDebugEnv(taskset, labels=labels, **kw)
    env.set_kwargs(setup_scope=scope)
    env.set_backend("docker")
    try:
        out = await env.generate(env.get_eval_inputs(rollouts_per_example=k), client=None, model="none",
                                 max_concurrent=4)
    finally:
        await env.teardown()
    return taskset.setups, [r["info"]["verdict"] for r in out["outputs"]], out["outputs"]


@pytest.mark.parametrize("rollout_isolation", ["container", "namespace"])
async def test_pass_at_k_sets_up_each_instance_once_and_forks_each_attempt(instances, rollout_isolation):
    labels = {"vf-sandbox.test": "1", "vf-test-case": uuid.uuid4().hex[:12]}
    setups, verdicts, rows = await run(instances, "group", 3, labels, check_fails_before=True,
                                       rollout_isolation=rollout_isolation)
    assert sorted(setups) == sorted([IDNA, MORE])  # once per instance, not per attempt
    assert len(verdicts) == 6 and [r["error"] for r in rows] == [None] * 6
    assert all(v["valid"] for v in verdicts), [(v["instance_id"], v["reason"], v["detail"]) for v in verdicts]
    assert all(v.get("forked") is True and v["timings"]["setup_s"] == 0.0 for v in verdicts)
    assert all(v["fails_before"]["ok"] for v in verdicts)  # the unpatched run on a fork of the set-up tree
    assert_nothing_left(labels)


async def test_rollout_scope_sets_up_every_attempt(instances):
    labels = {"vf-sandbox.test": "1", "vf-test-case": uuid.uuid4().hex[:12]}
    setups, verdicts, _ = await run(instances, "rollout", 2, labels)
    assert sorted(setups) == sorted([IDNA, IDNA, MORE, MORE])
    assert all(v["valid"] and "forked" not in v for v in verdicts)
    assert_nothing_left(labels)
