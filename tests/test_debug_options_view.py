"""The sandbox part of a debug run's options is a view onto `SandboxSpec` (issue 25):
`DebugOptions` declares only the debug run's own knobs (`DebugKnobs`); the sandbox
settings a run may override take their type, constraints and description from
SandboxSpec's own fields (None = the task set's spec), and SWEDebugEnv's `-x` keys are
DebugOptions' fields, applied through the one `set_kwargs` path (no setter per key).
The keys, their defaults and the `vf-swe-debug` flags stay what they were."""

from __future__ import annotations

import inspect
import typing

import pydantic
import pytest
import typer.main
from typer.testing import CliRunner

from sandboxes import SandboxSpec
from sandboxes.errors import ConfigError
from swe_debug import cli
from swe_debug.debug import SANDBOX_OVERRIDES, DebugKnobs, DebugOptions, debug_spec
from swe_debug.env import SETTINGS, SWEDebugEnv
from swe_debug.instances import SWEInstance
from swe_debug.options import SWEDebugOptions
from swe_debug.taskset import SWE_SANDBOX, SWETaskSet

INST = SWEInstance(instance_id="o__r-1", repo="o/r", image_name="img:1")
# values probing each field's type and constraints: SandboxSpec and the view must agree on each
PROBES = [0, -1, 0.5, 2, 10**12, "2", "x", "runc", "gvisor", "kvm", "container", "namespace", "vm", True,
          {"a": "b"}, {"a": 1}, ["a", "b"], [1], {}]


def env() -> SWEDebugEnv:
    return SWEDebugEnv(SWETaskSet([INST]))


def _error(model: type[pydantic.BaseModel], field: str, value: object) -> str | None:
    """pydantic's messages for `field=value` in `model` (None: accepted)."""
    try:
        model.model_validate({field: value})
    except pydantic.ValidationError as exc:
        return "; ".join(sorted(e["msg"] for e in exc.errors()))
    return None


def _taken(model: type[pydantic.BaseModel], field: str, value: object) -> object:
    """What `model` makes of `field=value`: the validated value, or pydantic's messages."""
    error = _error(model, field, value)
    return getattr(model.model_validate({field: value}), field) if error is None else error


def test_the_debug_runs_own_knobs_name_no_sandbox_field():
    assert set(DebugKnobs.model_fields).isdisjoint(SandboxSpec.model_fields)
    shared = set(DebugOptions.model_fields) & set(SandboxSpec.model_fields)
    assert shared == {*SANDBOX_OVERRIDES, "output_limit_bytes"}
    assert set(DebugOptions.model_fields) == set(DebugKnobs.model_fields) | shared


@pytest.mark.parametrize("field", SANDBOX_OVERRIDES)
def test_each_override_is_sandbox_specs_field_or_none(field):
    mine, spec = DebugOptions.model_fields[field], SandboxSpec.model_fields[field]
    assert mine.default is None and mine.description == spec.description
    assert DebugOptions().model_dump()[field] is None
    for value in PROBES:
        # taken as SandboxSpec takes it, refused with SandboxSpec's own message
        assert _taken(DebugOptions, field, value) == _taken(SandboxSpec, field, value), (field, value)


def test_the_test_log_limit_is_typed_as_the_specs_with_the_runs_default():
    for value in PROBES:
        assert _taken(DebugOptions, "output_limit_bytes", value) == _taken(SandboxSpec, "output_limit_bytes", value)
    assert DebugOptions().output_limit_bytes == 32 * 1024 * 1024 > SandboxSpec().output_limit_bytes


def test_none_keeps_the_task_sets_spec_and_a_value_overrides_it():
    ts = SWETaskSet([INST])
    plain = debug_spec(ts, INST, None, DebugOptions())
    assert plain == ts.sandbox_spec(INST, timeout_seconds=1800, labels={"sandbox-debug": "true"})
    assert (plain.cpu_cores, plain.memory_gb, plain.isolation, plain.rollout_isolation) == (
        SWE_SANDBOX.cpu_cores, SWE_SANDBOX.memory_gb, "runc", "container")
    over = debug_spec(ts, INST, None, DebugOptions(cpu_cores=2, memory_gb=8, disk_size_gb=20, isolation="gvisor",
                                                   rollout_isolation="namespace", labels=["a"]))
    assert (over.cpu_cores, over.memory_gb, over.disk_size_gb) == (2, 8, 20)
    assert (over.isolation, over.rollout_isolation) == ("gvisor", "namespace")
    assert over.labels == {**SWE_SANDBOX.labels, "a": "true"}


def test_the_x_keys_are_the_options_fields_unchanged():
    assert SWEDebugEnv.settable_kwargs() == sorted(
        {"concurrency", "max_seq_len", "score_rollouts", "max_retries", "retry_policy", "isolation", "message_type",
         "cpu_cores", "memory_gb", "disk_size_gb", "rollout_isolation", "timeout_seconds", "setup_scope"})
    for name in SETTINGS:
        mine, opt = SWEDebugEnv.Settings.model_fields[name], DebugOptions.model_fields[name]
        assert (mine.annotation, mine.default, mine.description) == (opt.annotation, opt.default, opt.description)
    defaults = {k: SWEDebugEnv.Settings.model_fields[k].default for k in SETTINGS}
    assert defaults == {"cpu_cores": None, "memory_gb": None, "disk_size_gb": None, "rollout_isolation": None,
                        "timeout_seconds": 1800.0, "setup_scope": "rollout"}


def test_x_keys_go_through_set_kwargs_alone():
    for name in SETTINGS:  # no setter per key beside the one path
        assert not hasattr(SWEDebugEnv, f"set_{name}"), name
    assert "setattr(" not in inspect.getsource(inspect.getmodule(SWEDebugEnv))
    e = env()
    e.set_kwargs(cpu_cores=2, rollout_isolation="namespace", setup_scope="group", isolation="gvisor")
    assert (e.options.cpu_cores, e.options.rollout_isolation, e.options.setup_scope) == (2, "namespace", "group")
    assert e.options.isolation == e.isolation_in_use() == "gvisor"
    spec = debug_spec(e.taskset, INST, None, e.options)
    assert (spec.cpu_cores, spec.rollout_isolation, spec.isolation) == (2, "namespace", "gvisor")


def test_a_refused_x_value_names_it_with_the_specs_message_and_applies_nothing():
    e = env()
    with pytest.raises(ConfigError) as err:
        e.set_kwargs(cpu_cores=3, memory_gb=0)
    assert f"memory_gb: {_error(SandboxSpec, 'memory_gb', 0)}" in str(err.value)
    assert e.options == DebugOptions()
    with pytest.raises(ConfigError, match="rollout_isolation: " + _error(SandboxSpec, "rollout_isolation", "vm")):
        e.set_kwargs(rollout_isolation="vm")
    with pytest.raises(ConfigError, match="isolation must be one of runc, gvisor"):
        e.set_kwargs(isolation="kvm")
    assert e.options == DebugOptions()


def test_a_bad_constructor_value_is_refused_as_the_spec_refuses_it():
    with pytest.raises(pydantic.ValidationError, match=_error(SandboxSpec, "disk_size_gb", -1)):
        SWEDebugEnv(SWETaskSet([INST]), disk_size_gb=-1)


# the sandbox flags of vf-swe-debug as they were declared before the view (name, flags, default)
FLAGS = {"cpu_cores": (("--cpu-cores",), None), "memory_gb": (("--memory-gb",), None),
         "rollout_isolation": (("--rollout-isolation",), None), "isolation": (("--isolation",), None),
         "setup_scope": (("--setup-scope",), None), "timeout_seconds": (("--timeout-seconds",), 1800),
         "test_timeout": (("--test-timeout",), 900), "output_tail_chars": (("--output-tail-chars",), 2000)}


def test_the_sandbox_flags_are_unchanged():
    params = {p.name: p for p in typer.main.get_command(cli.app).params}
    for name, (opts, default) in FLAGS.items():
        assert (tuple(params[name].opts), params[name].default) == (opts, default), name
    assert "CPU cores per sandbox (default: the instance's spec)" in params["cpu_cores"].help
    assert "[default: container]" in params["rollout_isolation"].help.replace("\\[", "[")


def test_the_sandbox_flags_are_typed_by_the_view():
    for name in ("cpu_cores", "memory_gb", "isolation", "rollout_isolation"):
        assert SWEDebugOptions.model_fields[name].annotation == DebugOptions.model_fields[name].annotation, name
        assert SWEDebugOptions.model_fields[name].default is None


@pytest.mark.parametrize("argv, field, value", [(["--cpu-cores", "0"], "cpu_cores", 0),
                                                 (["--memory-gb", "-1"], "memory_gb", -1),
                                                 (["--isolation", "kvm"], "isolation", "kvm"),
                                                 (["--rollout-isolation", "vm"], "rollout_isolation", "vm")])
def test_a_bad_sandbox_flag_is_refused_naming_it_with_the_specs_message(monkeypatch, argv, field, value):
    monkeypatch.setattr(cli, "_main", lambda **a: pytest.fail("ran with a refused value"))
    res = CliRunner().invoke(cli.app, ["ds.jsonl", *argv])
    assert res.exit_code == 2, res.output
    assert f"error: {argv[0]}: {_error(SandboxSpec, field, value)}" in res.output.replace("\n", " ")


def test_typing_of_the_view_is_optional_spec_types():
    for field in SANDBOX_OVERRIDES:
        args = typing.get_args(DebugOptions.model_fields[field].annotation)
        assert type(None) in args, field
