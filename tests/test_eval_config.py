"""Eval settings resolution: endpoints registry, TOML [[eval]] / [[ablation]], precedence, bad input."""

import textwrap
from pathlib import Path

import pytest

from runner.config import (
    configs_from_cli,
    configs_from_toml,
    expand_ablation,
    load_endpoints,
    parse_header_lines,
    parse_json_object,
)
from sandboxes.errors import ConfigError


@pytest.fixture
def envdir(tmp_path):
    """An env package `demo-env` with pyproject eval defaults, and an endpoints registry."""
    pkg = tmp_path / "environments" / "demo_env"
    pkg.mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "demo-env"
        version = "0.1.0"
        [tool.verifiers.eval]
        num_examples = 7
        rollouts_per_example = 4
    """))
    (pkg / "demo_env.py").write_text("def load_environment(**kw):\n    raise NotImplementedError\n")
    reg = tmp_path / "endpoints.toml"
    reg.write_text(textwrap.dedent("""
        [[endpoint]]
        endpoint_id = "fast"
        model = "org/fast-model"
        url = "http://127.0.0.1:9/v1"
        key = "FAST_KEY"
        headers = { "X-A" = "1" }

        [[endpoint]]
        endpoint_id = "fast"
        model = "org/fast-model"
        url = "http://127.0.0.1:10/v1"
        key = "FAST_KEY"

        [[endpoint]]
        endpoint_id = "claude"
        model = "claude-x"
        url = "http://127.0.0.1:11"
        key = "ANTH_KEY"
        api_client_type = "anthropic_messages"
    """))
    return tmp_path


def cli(envdir, **kw):
    base = {"env_dir_path": str(envdir / "environments"), "endpoints_path": str(envdir / "endpoints.toml")}
    base.update(kw)
    return base


def test_builtin_defaults_and_pyproject_defaults(envdir):
    (cfg,) = configs_from_cli(["other-env"], cli(envdir))
    assert (cfg.num_examples, cfg.rollouts_per_example, cfg.max_concurrent) == (5, 3, 32)
    assert cfg.model == "openai/gpt-4.1-mini" and cfg.client_config.api_key_var == "PRIME_API_KEY"
    assert cfg.client_config.extra_headers_from_state == {"X-Session-ID": "example_id"}
    (cfg,) = configs_from_cli(["demo-env"], cli(envdir))
    assert (cfg.num_examples, cfg.rollouts_per_example) == (7, 4)
    (cfg,) = configs_from_cli(["demo-env"], cli(envdir, num_examples=2))
    assert (cfg.num_examples, cfg.rollouts_per_example) == (2, 4)  # CLI > pyproject > built-in


def test_endpoint_alias_replicas_headers_and_overrides(envdir):
    (cfg,) = configs_from_cli(["x"], cli(envdir, model="fast", headers={"X-B": "2"}))
    assert cfg.model == "org/fast-model" and cfg.endpoint_id == "fast"
    cc = cfg.client_config
    assert [e.api_base_url for e in cc.endpoint_configs] == ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    assert cc.api_key_var == "FAST_KEY" and cc.extra_headers == {"X-A": "1", "X-B": "2"}
    (cfg,) = configs_from_cli(["x"], cli(envdir, model="fast", api_base_url="http://override/v1", api_key_var="MINE"))
    assert cfg.client_config.api_base_url == "http://override/v1" and cfg.client_config.api_key_var == "MINE"
    assert cfg.client_config.endpoint_configs == []
    (cfg,) = configs_from_cli(["x"], cli(envdir, model="claude"))
    assert cfg.client_config.client_type == "anthropic_messages"
    (cfg,) = configs_from_cli(["x"], cli(envdir, model="not-an-alias", api_base_url="http://h/v1"))
    assert cfg.model == "not-an-alias" and cfg.endpoint_id is None and cfg.client_config.api_base_url == "http://h/v1"


def test_sampling_flags_merge():
    (cfg,) = configs_from_cli(["x"], {"endpoints_path": "/nonexistent.toml", "sampling_args": {"top_p": 0.9, "temperature": 0.1}, "temperature": 0.7, "max_tokens": 64})
    assert cfg.sampling_args == {"top_p": 0.9, "temperature": 0.7, "max_tokens": 64}


def test_bad_json_and_headers():
    with pytest.raises(ConfigError, match="--env-args/-a: invalid JSON"):
        parse_json_object("{not json", "--env-args/-a")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        parse_json_object("[1, 2]", "-S")
    assert parse_json_object('{"a": 1}', "-a") == {"a": 1}
    with pytest.raises(ConfigError, match="Name: Value"):
        parse_header_lines(["no-colon"])
    assert parse_header_lines(["X-A: b: c"]) == {"X-A": "b: c"}


def test_registry_errors(tmp_path):
    p = tmp_path / "e.toml"
    p.write_text('[[endpoint]]\nendpoint_id = "a"\nmodel = "m"\nurl = "u"\nkey = "K"\nheaders = {}\nextra_headers = {}\n')
    with pytest.raises(ConfigError, match="either 'headers' or 'extra_headers'"):
        load_endpoints(p)
    p.write_text('[[endpoint]]\nendpoint_id = "a"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match="missing required key"):
        load_endpoints(p)
    p.write_text('[[endpoint]]\nendpoint_id = "a"\nmodel = "m"\nurl = "u"\nkey = "K"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="unknown key.*'bogus'"):
        load_endpoints(p)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "eval.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_toml_precedence_and_save_default(envdir):
    p = write(envdir, f"""
        model = "fast"
        endpoints_path = "{envdir / 'endpoints.toml'}"
        env_dir_path = "{envdir / 'environments'}"
        num_examples = 50
        [[eval]]
        env_id = "demo-env"
        num_examples = 3
        [[eval]]
        env_id = "demo-env"
        [[eval]]
        env_id = "plain"
        rollouts_per_example = 1
        [eval.env_args]
        difficulty = "hard"
    """)
    a, b, c = configs_from_toml(p)
    assert (a.num_examples, a.rollouts_per_example) == (3, 4)  # eval > top > pyproject
    assert (b.num_examples, b.rollouts_per_example) == (50, 4)
    assert (c.num_examples, c.rollouts_per_example, c.env_args) == (50, 1, {"difficulty": "hard"})
    assert a.model == "org/fast-model" and a.save_results is True


def test_toml_syntax_error_names_file_and_line(tmp_path):
    p = write(tmp_path, """
        [[eval]]
        env_id = "a"
        num_examples = = 3
    """)
    with pytest.raises(ConfigError) as ei:
        configs_from_toml(p)
    assert str(p) in str(ei.value) and "line 4" in str(ei.value)


def test_toml_unknown_keys(tmp_path):
    p = write(tmp_path, '[[eval]]\nenv_id = "a"\nnum_exmaples = 3\n')
    with pytest.raises(ConfigError, match=r"\[\[eval\]\] #1: unknown key\(s\) 'num_exmaples'"):
        configs_from_toml(p)
    p = write(tmp_path, 'modle = "x"\n[[eval]]\nenv_id = "a"\n')
    with pytest.raises(ConfigError, match="top level: unknown key"):
        configs_from_toml(p)
    p = write(tmp_path, '[[eval]]\nname = "x"\n')
    with pytest.raises(ConfigError, match="missing required key 'env_id'"):
        configs_from_toml(p)
    p = write(tmp_path, 'model = "x"\n')
    with pytest.raises(ConfigError, match="no \\[\\[eval\\]\\]"):
        configs_from_toml(p)


def test_endpoint_id_requires_registry(tmp_path):
    p = write(tmp_path, f'endpoints_path = "{tmp_path}/none.toml"\n[[eval]]\nenv_id = "a"\nendpoint_id = "x"\n')
    with pytest.raises(ConfigError, match="no endpoint .x. in .*none.toml .looked in: .*none.toml \\(absent\\)"):
        configs_from_toml(p)


def test_ablation_expansion(tmp_path):
    p = write(tmp_path, f"""
        model = "m"
        api_base_url = "http://127.0.0.1:9/v1"
        endpoints_path = "{tmp_path}/none.toml"
        num_examples = 4
        [[eval]]
        env_id = "solo"
        [[ablation]]
        env_id = "my-env"
        env_args = {{ split = "test" }}
        [ablation.sweep]
        temperature = [0.0, 0.5, 1.0]
        [ablation.sweep.env_args]
        difficulty = ["easy", "hard"]
        [[ablation]]
        [ablation.sweep]
        env_id = ["x", "y"]
    """)
    cfgs = configs_from_toml(p)
    assert len(cfgs) == 1 + 6 + 2
    sweep = cfgs[1:7]
    assert {(c.sampling_args["temperature"], c.env_args["difficulty"]) for c in sweep} == {
        (t, d) for t in (0.0, 0.5, 1.0) for d in ("easy", "hard")
    }
    assert all(c.env_args["split"] == "test" and c.num_examples == 4 for c in sweep)
    assert [c.env_id for c in cfgs[7:]] == ["x", "y"]


def test_ablation_conflicts():
    with pytest.raises(ConfigError, match="both fixed and swept"):
        expand_ablation({"env_id": "a", "env_args": {"k": 1}, "sweep": {"env_args": {"k": [1, 2]}}}, "ab")
    with pytest.raises(ConfigError, match="non-empty list"):
        expand_ablation({"env_id": "a", "sweep": {"temperature": 0.5}}, "ab")
    with pytest.raises(ConfigError, match="unknown key"):
        expand_ablation({"env_id": "a", "sweep": {"tempreature": [0.5]}}, "ab")


def test_public_args_redact_header_values(envdir):
    (cfg,) = configs_from_cli(["x"], cli(envdir, model="fast", headers={"Authorization": "Bearer sk-secret"}))
    args = cfg.public_args()
    text = str(args)
    assert "sk-secret" not in text and args["client_config"]["extra_headers"]["Authorization"] == "***"
    assert args["client_config"]["api_key_var"] == "FAST_KEY"


def test_system_message_from_path(tmp_path):
    import envs as vf

    p = tmp_path / "sys.txt"
    p.write_text("  be exact\n", encoding="utf-8")
    msg = vf.SystemMessage.from_path(p)
    assert msg.content == "  be exact\n" and msg.role == "system"
    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}], system_prompt=msg)
    assert env.get_eval_dataset()[0]["prompt"][0] == {"role": "system", "content": "  be exact\n"}


def test_hosted_junit_without_follow_is_refused_before_anything_is_submitted():
    """The hosted JUnit report is written when the run ends, which only --follow waits for:
    without it the flag would be accepted and ignored."""
    from envs.clients import ClientConfig
    from runner.config import EvalConfig
    from hosted.submit import run_hosted
    from sandboxes.errors import ConfigError

    cfg = EvalConfig(env_id="math-single", model="m", client_config=ClientConfig(), junit_xml="report.xml")
    with pytest.raises(ConfigError, match="--junit-xml with --hosted needs --follow"):
        run_hosted([cfg], {}, follow=False, poll_interval=1.0)


def test_repeated_x_flags_merge_and_a_conflict_is_an_error():
    from runner.config import parse_kwargs_list
    from sandboxes.errors import ConfigError

    assert parse_kwargs_list(["rollout_isolation=namespace", "isolation=gvisor,n=3", '{"flag": true}'], "-x") == {
        "rollout_isolation": "namespace", "isolation": "gvisor", "n": 3, "flag": True}
    assert parse_kwargs_list(["a=1", "a=1"], "-x") == {"a": 1}
    with pytest.raises(ConfigError, match="a is given twice"):
        parse_kwargs_list(["a=1", "a=2"], "-x")


def test_renderer_client_settings_reach_the_client_config(tmp_path):
    """api_client_type "renderer" takes its tokenizer, renderer config and preserve_* flags from
    the eval TOML (recorded in the run definition); with another client type they are refused."""
    p = write(tmp_path, f"""
        env_dir_path = "{tmp_path}"
        endpoints_path = "{tmp_path / 'none.toml'}"
        [[eval]]
        env_id = "plain"
        api_client_type = "renderer"
        renderer_model_name = "/models/qwen3-tokenizer"
        renderer_config = {{ name = "qwen3", enable_thinking = false }}
        preserve_all_thinking = true
    """)
    [cfg] = configs_from_toml(p)
    cc = cfg.client_config
    assert (cc.client_type, cc.renderer_model_name, cc.renderer_config, cc.preserve_all_thinking) == (
        "renderer", "/models/qwen3-tokenizer", {"name": "qwen3", "enable_thinking": False}, True)
    assert cfg.public_args()["client_config"]["renderer_config"] == {"name": "qwen3", "enable_thinking": False}
    p = write(tmp_path, f"""
        env_dir_path = "{tmp_path}"
        endpoints_path = "{tmp_path / 'none.toml'}"
        [[eval]]
        env_id = "plain"
        preserve_thinking_between_tool_calls = true
    """)
    with pytest.raises(ConfigError, match="settings of api_client_type 'renderer', not 'openai_chat_completions'"):
        configs_from_toml(p)


def test_resume_check_sees_client_settings_that_change_results_not_the_endpoint():
    """`definition_diff` (what --resume refuses): another client type or renderer setting
    changes what the model sees; another endpoint URL or key variable does not."""
    from runner.config import EvalConfig
    from envs.types import ClientConfig

    base = EvalConfig(env_id="math-single", model="m", client_config=ClientConfig())
    moved = base.model_copy(update={"client_config": ClientConfig(api_base_url="http://elsewhere/v1",
                                                                  api_key_var="OTHER_KEY")})
    assert moved.definition_diff(base) == []
    other = base.model_copy(update={"client_config": ClientConfig(client_type="openai_responses")})
    assert other.definition_diff(base) == ["client_config.client_type: 'openai_chat_completions' -> 'openai_responses'"]
    thinking = base.model_copy(update={"client_config": ClientConfig(preserve_all_thinking=True)})
    assert [d.split(":")[0] for d in thinking.definition_diff(base)] == ["client_config.preserve_all_thinking"]
