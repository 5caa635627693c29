"""Environment settings (`-x key=value` / extra_env_kwargs) come from a declared pydantic
model per env class, never from reflection on user input; unknown constructor keywords
and unknown generate() parameters are errors (issue 25)."""

import inspect
import json

import pytest
from openai import AsyncOpenAI

import envs as vf
from envs.environment import EnvSettings
from envs.sandbox_env import SandboxEnv
from testmodel.model_server import ModelServer, compute
from envs.v1 import Env, Harness, SandboxConfig, Taskset
from sandboxes.errors import ConfigError
from swe_debug.env import SWEDebugEnv

ROWS = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 1?", "answer": "3"}]


def single():
    return vf.SingleTurnEnv(dataset=ROWS)


def sandbox():
    return SandboxEnv(dataset=ROWS)


def v1_env():
    return Env(Taskset(source=[{"prompt": [{"role": "user", "content": "hi"}]}]),
               Harness(sandbox=SandboxConfig(image="vf-sandbox/python:3.11")))


def swe_debug():
    from swe_debug.taskset import SWETaskSet

    return SWEDebugEnv(SWETaskSet([]), dataset=ROWS)


# every env's keys: a value, and how to read back what it set
BASE = {
    "concurrency": (7, lambda e: e.concurrency),
    "max_seq_len": (100, lambda e: e.max_seq_len),
    "score_rollouts": (False, lambda e: e.score_rollouts),
    "max_retries": (2, lambda e: e.retry_policy.attempts - 1),
    "retry_policy": ({"attempts": 4, "initial_delay": 0.1}, lambda e: (e.retry_policy.attempts, e.retry_policy.initial_delay)),
    "isolation": ("gvisor", lambda e: e.isolation_in_use()),
    "message_type": ("completion", lambda e: e.message_type),
}
BASE_EXPECTED = {"retry_policy": (4, 0.1)}
MULTI_TURN = {
    "max_turns": (3, lambda e: e.max_turns),
    "max_total_completion_tokens": (500, lambda e: e.max_total_completion_tokens),
    "timeout_seconds": (9.5, lambda e: e.timeout_seconds),
}
SPEC = lambda field: (lambda e: getattr(e.sandbox_spec, field))  # noqa: E731
SANDBOX = {
    "docker_image": ("other:1", SPEC("image")), "sandbox_name": ("box", SPEC("name")),
    "start_command": ("sleep infinity", SPEC("start_command")), "cpu_cores": (2, SPEC("cpu_cores")),
    "memory_gb": (3, SPEC("memory_gb")), "disk_size_gb": (6, SPEC("disk_size_gb")), "gpu_count": (1, SPEC("gpu_count")),
    "timeout_minutes": (5, SPEC("timeout_minutes")), "timeout_per_command_seconds": (7, SPEC("timeout_per_command_seconds")),
    "environment_vars": ({"A": "1"}, SPEC("environment_vars")), "network": (True, SPEC("network")),
    "workdir": ("/work", SPEC("workdir")), "labels": ({"team": "x"}, SPEC("labels")),
    "rollout_isolation": ("namespace", lambda e: e.rollout_isolation), "pool_size": (0, lambda e: e.pool_size),
    "setup_scope": ("group", lambda e: e.setup_scope),
}
HARNESS = lambda field: (lambda e: getattr(e.harness.sandbox, field))  # noqa: E731
V1 = {
    "image": ("other:1", HARNESS("image")), "cpu_cores": (2, HARNESS("cpu_cores")), "memory_gb": (3, HARNESS("memory_gb")),
    "disk_size_gb": (6, HARNESS("disk_size_gb")), "timeout_minutes": (5, HARNESS("timeout_minutes")),
    "timeout_per_command_seconds": (7, HARNESS("timeout_per_command_seconds")),
    "environment_vars": ({"A": "1"}, HARNESS("environment_vars")), "workdir": ("/work", HARNESS("workdir")),
    "labels": ({"team": "x"}, HARNESS("labels")), "pool_size": (0, HARNESS("pool_size")),
    "output_limit_bytes": (1000, HARNESS("output_limit_bytes")), "scope": ("rollout", HARNESS("scope")),
    "setup_scope": ("group", HARNESS("setup_scope")),
}
OPTION = lambda field: (lambda e: getattr(e.options, field))  # noqa: E731
SWE = {"cpu_cores": (2, OPTION("cpu_cores")), "memory_gb": (3, OPTION("memory_gb")),
       "disk_size_gb": (6, OPTION("disk_size_gb")), "rollout_isolation": ("namespace", OPTION("rollout_isolation")),
       "timeout_seconds": (60, OPTION("timeout_seconds")), "setup_scope": ("group", OPTION("setup_scope"))}

CASES = {
    "SingleTurnEnv": (single, {**BASE, **MULTI_TURN}),
    "SandboxEnv": (sandbox, {**BASE, **MULTI_TURN, **SANDBOX}),
    "v1 Env": (v1_env, {**BASE, **V1}),
    "SWEDebugEnv": (swe_debug, {**BASE, **SWE}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_settable_key_works(name):
    make, table = CASES[name]
    env = make()
    # the table covers exactly the declared keys
    assert set(env.settable_kwargs()) == set(table)
    for key, (value, read) in table.items():
        fresh = make()
        fresh.set_kwargs(**{key: value})
        got = read(fresh)
        assert got == BASE_EXPECTED.get(key, value), (key, got)
    # several at once, applied together
    env.set_kwargs(**{k: v for k, (v, _) in list(table.items())[:3]})
    # max_workers only sizes the initial thread pool: refused with what to use instead
    with pytest.raises(ConfigError, match="use -c 8 instead of -x max_workers"):
        env.set_kwargs(max_workers=8)
    assert "max_workers" not in env.settable_kwargs()


@pytest.mark.parametrize("name", list(CASES))
def test_unknown_x_key_is_refused_listing_the_valid_ones(name):
    make, table = CASES[name]
    env = make()
    for key in ("rubric", "parser", "rollout", "dockr_image", "sandbox_spec"):
        with pytest.raises(ConfigError, match=f"no setting '{key}'") as ei:
            env.set_kwargs(**{key: 1})
        assert "settable: " + ", ".join(sorted(table)) in str(ei.value)
    assert not isinstance(getattr(env, "rubric", None), int)


def test_a_refused_value_applies_nothing():
    env = sandbox()
    with pytest.raises(ConfigError, match="memory_gb"):
        env.set_kwargs(cpu_cores=3, memory_gb=-1)
    assert env.sandbox_spec.cpu_cores == 1 and env.sandbox_spec.memory_gb == 2
    with pytest.raises(ConfigError, match="max_turns"):
        env.set_kwargs(max_turns="many", max_seq_len=5)
    assert env.max_seq_len is None
    with pytest.raises(ConfigError, match="rollout_isolation"):
        env.set_kwargs(rollout_isolation="vm")


def test_settings_models_are_declared_and_setters_written_out():
    assert issubclass(SandboxEnv.Settings, EnvSettings) and issubclass(Env.Settings, EnvSettings)
    source = inspect.getsource(SandboxEnv)
    for key in ("docker_image", "cpu_cores", "memory_gb", "network", "rollout_isolation", "pool_size"):
        assert f"def set_{key}(" in source  # grep finds every setter
    module = inspect.getsource(inspect.getmodule(SandboxEnv)) + inspect.getsource(inspect.getmodule(Env))
    assert "setattr(SandboxEnv" not in module and "setattr(Env" not in module


def test_unknown_constructor_keyword_is_an_error():
    with pytest.raises(TypeError, match="unexpected keyword argument.*'custom_attr'"):
        vf.SingleTurnEnv(dataset=ROWS, custom_attr=5)
    with pytest.raises(TypeError, match="'dockr_image'"):
        SandboxEnv(dataset=ROWS, dockr_image="x")
    with pytest.raises(ValueError, match="`oai_tools` is no longer supported"):
        vf.SingleTurnEnv(dataset=ROWS, oai_tools=[])
    # the reference's documented keywords are taken, and used
    env = vf.SingleTurnEnv(dataset=ROWS, tool_defs=[{"name": "echo", "description": "Echo.", "parameters": {}}],
                           client=None, model="m")
    assert env.tool_defs[0].name == "echo" and env.model == "m"


@pytest.fixture
async def server():
    async with ModelServer(compute()) as srv:
        yield srv


async def test_generate_parameters_are_implemented_or_refused(server, tmp_path, monkeypatch):
    client = AsyncOpenAI(base_url=server.base_url, api_key="x")
    env = vf.SingleTurnEnv(dataset=ROWS, client=client, model="m")
    inputs = env.get_eval_inputs(2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
        await env.generate(inputs, client, "m", no_such_option=True)
    with pytest.raises(TypeError, match="needs a client and a model"):
        await vf.SingleTurnEnv(dataset=ROWS).evaluate(num_examples=1)
    with pytest.raises(ValueError, match="hf_hub_dataset_name"):
        await env.generate(inputs, push_to_hf_hub=True)

    pushed = {}
    monkeypatch.setattr("datasets.Dataset.push_to_hub", lambda self, name: pushed.update(name=name, n=len(self)))
    messages: list[str] = []
    out = await env.evaluate(num_examples=2, shuffle=True, shuffle_seed=3, save_results=True, results_path=tmp_path,
                             push_to_hf_hub=True, hf_hub_dataset_name="me/results", on_log=messages.append)
    assert len(out["outputs"]) == 2  # client and model from the constructor
    assert out["metadata"]["shuffle"] is True and out["metadata"]["shuffle_seed"] == 3
    assert pushed == {"name": "me/results", "n": 2}
    assert messages[0] == f"Saving results to {tmp_path}" and messages[1] == f"Saved final results to {tmp_path}"
    assert "me/results" in messages[2]
    assert json.loads((tmp_path / "metadata.json").read_text())["shuffle_seed"] == 3
    plain = await env.evaluate(num_examples=1)
    assert plain["metadata"]["shuffle"] is False and plain["metadata"]["shuffle_seed"] is None


def test_run_group_takes_no_ignored_keywords():
    assert "kwargs" not in inspect.signature(vf.Environment.run_group).parameters
    assert "kwargs" not in inspect.signature(vf.Environment.generate).parameters
    assert "kwargs" not in inspect.signature(vf.Environment.evaluate).parameters


def test_message_type_setting_reformats_the_datasets():
    env = single()
    assert isinstance(env.get_eval_inputs(1)[0]["prompt"], list)  # formatted (and cached) as chat
    env.set_kwargs(message_type="completion")
    assert env.get_eval_inputs(1)[0]["prompt"] == "What is 1 + 1?"
    with pytest.raises(ConfigError, match="message_type"):
        env.set_kwargs(message_type="voice")
