"""A SWE instance's sandbox is a view onto one `SandboxSpec` (issue 25): the task set's
defaults are `SWE_SANDBOX` (SandboxSpec's defaults with what SWE needs), the instance
adds its image, environment and working directory, the run its lifetime and overrides;
no parallel list of resource fields, and an override is validated like any spec."""

from __future__ import annotations

import pydantic
import pytest

from sandboxes import SandboxSpec
from swe_debug.instances import SWEInstance
from swe_debug.taskset import APPLY_TIMEOUT, SWE_SANDBOX, SWETaskSet

INST = SWEInstance(instance_id="o__r-1", repo="o/r", image_name="img:1")


def test_the_defaults_are_sandbox_spec_defaults_plus_what_swe_needs():
    base = SandboxSpec()
    differs = {k for k in SandboxSpec.model_fields if getattr(SWE_SANDBOX, k) != getattr(base, k)}
    assert differs == {"name", "memory_gb", "disk_size_gb", "timeout_per_command_seconds", "labels", "pids_limit"}
    assert (SWE_SANDBOX.memory_gb, SWE_SANDBOX.timeout_per_command_seconds, SWE_SANDBOX.network) == (4, APPLY_TIMEOUT,
                                                                                                   False)


def test_an_instance_sandbox_is_the_defaults_with_the_instance_and_the_run():
    ts = SWETaskSet([INST])
    assert ts.sandbox is SWE_SANDBOX and not hasattr(ts, "cpu_cores")  # one description, no parallel fields
    spec = ts.sandbox_spec(INST, timeout_seconds=600, labels={"run": "x"})
    assert (spec.image, spec.workdir, spec.timeout_minutes) == ("img:1", INST.workdir, 20)
    assert spec.environment_vars == INST.run_env() and spec.labels == {"vf-swe-debug": "1", "run": "x"}
    same = {k for k in SandboxSpec.model_fields} - {"image", "workdir", "timeout_minutes", "environment_vars", "labels"}
    assert {k: getattr(spec, k) for k in same} == {k: getattr(SWE_SANDBOX, k) for k in same}
    over = ts.sandbox_spec(INST, cpu_cores=2, memory_gb=8)
    assert (over.cpu_cores, over.memory_gb, over.disk_size_gb) == (2, 8, SWE_SANDBOX.disk_size_gb)


def test_a_task_set_takes_its_own_defaults_as_one_spec():
    own = SWE_SANDBOX.model_copy(update={"memory_gb": 16, "labels": {"team": "a"}, "environment_vars": {"X": "1"}})
    spec = SWETaskSet([INST], sandbox=own).sandbox_spec(INST)
    assert spec.memory_gb == 16 and spec.labels == {"team": "a"} and spec.environment_vars["X"] == "1"


def test_a_bad_override_is_refused_like_any_spec():
    with pytest.raises(pydantic.ValidationError, match="cpu_cores"):
        SWETaskSet([INST]).sandbox_spec(INST, cpu_cores=-1)
