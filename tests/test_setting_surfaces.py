"""One list of settings (issue 25): every flag of `vf-sandbox eval`, every TOML key and the
configuration reference come from the declared fields of `EvalConfig` / `ClientSettings` /
`ConsoleOptions` (`Opt` markers); `-x` keys from each env's `Settings` model. Each setting
is reachable exactly once per surface, and an unknown one is refused."""

from collections import Counter
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from vfcli.eval_cmd import app
from runner import config as C
from runner.options import declared, flags
from sandboxes.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def eval_click_command():
    return typer.main.get_command(app).commands["eval"]


def test_every_flag_is_one_declared_setting_and_back():
    cmd = eval_click_command()
    options = [p for p in cmd.params if p.opts and p.opts[0].startswith("-")]
    opts = Counter(o for p in options for o in p.opts)
    assert [o for o, n in opts.items() if n > 1] == []  # no flag reaches two settings
    by_param = {d.param: d for d in flags(*C.SETTING_MODELS)}
    assert Counter(d.param for d in flags(*C.SETTING_MODELS)).most_common(1)[0][1] == 1
    assert {p.name for p in options} == set(by_param)  # every flag declared, every declared flag a flag
    for p in options:
        assert tuple(p.opts) == by_param[p.name].flags


def test_every_toml_key_is_declared_exactly_once():
    names = Counter(d.name for d in declared(*C.SETTING_MODELS) if d.opt.toml)
    assert [k for k, n in names.items() if n > 1] == []
    assert C.SETTING_KEYS == frozenset(names)
    # the run definition's own fields are all declared, except the resolved / derived ones
    undeclared = set(C.EvalConfig.model_fields) - {d.name for d in declared(C.EvalConfig)}
    assert undeclared == {"env_id", "client_config", "kind", "custom_secret_names", "run_id", "sandbox_run_id", "runs_db",
                          "settings"}
    # the built-in defaults are the declared fields' defaults
    assert C.BUILTIN_DEFAULTS["num_examples"] == C.EvalConfig.model_fields["num_examples"].default == 5
    assert C.BUILTIN_DEFAULTS["api_key_var"] == "PRIME_API_KEY"


def test_every_toml_key_reaches_the_config(tmp_path):
    """Each TOML key is taken (no 'unknown key'); a few land where they should."""
    keys = {"num_examples": 2, "rollouts_per_example": 1, "max_concurrent": 4, "heartbeat_url": "http://h/",
            "shuffle": True, "shuffle_seed": 3, "retry_max_delay": 5.0, "max_tokens": 9, "temperature": 0.5}
    body = "\n".join(f"{k} = {v!r}".replace("True", "true").replace("'", '"') for k, v in keys.items())
    path = tmp_path / "c.toml"
    path.write_text(body + '\nmodel = "openai/x"\n[[eval]]\nenv_id = "gsm8k"\n')
    [cfg] = C.configs_from_toml(path)
    assert (cfg.num_examples, cfg.rollouts_per_example, cfg.max_concurrent) == (2, 1, 4)
    assert (cfg.heartbeat_url, cfg.shuffle, cfg.shuffle_seed, cfg.retry_max_delay) == ("http://h/", True, 3, 5.0)
    assert cfg.sampling_args == {"max_tokens": 9, "temperature": 0.5}


def test_unknown_toml_key_is_refused_naming_it_and_the_valid_ones(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('heartbeat = "http://h/"\n[[eval]]\nenv_id = "gsm8k"\n')
    with pytest.raises(ConfigError) as err:
        C.configs_from_toml(path)
    assert "unknown key(s) 'heartbeat'" in str(err.value)
    assert "heartbeat_url" in str(err.value) and "num_examples" in str(err.value)


def test_unknown_flag_is_refused_by_typer():
    res = CliRunner().invoke(app, ["eval", "gsm8k", "--heartbeat", "http://h/"])
    assert res.exit_code == 2
    assert "No such option" in res.output and "--heartbeat" in res.output


def test_unknown_x_key_is_refused_listing_the_env_settings():
    import envs as vf

    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}])
    assert env.settable_kwargs() == sorted(env.Settings.model_fields)  # -x: the env's declared fields, once each
    with pytest.raises(ConfigError, match="rubric"):
        env.set_kwargs(rubric="x")


def test_definition_diff_compares_what_the_declarations_say():
    compared = {d.name for d in declared(C.EvalConfig) if d.opt.result}
    assert {"env_args", "model", "rollouts_per_example", "sampling_args", "isolation"} <= compared
    assert not {"num_examples", "max_concurrent", "heartbeat_url", "backend"} & compared


def test_configuration_reference_is_current():
    doc = ROOT / "docs" / "configuration.md"
    assert doc.read_text() == C.configuration_reference(), (
        "docs/configuration.md is stale: regenerate it with python -c 'from runner.config import "
        "configuration_reference as r; open(\"docs/configuration.md\", \"w\").write(r())'")


def test_the_run_id_travels_in_the_definition(tmp_path):
    """A chosen run id is part of the run definition (no process global / environment
    variable needed): a new run takes it; resume's diff ignores it; --from-run drops it."""
    from hosted.driver import HostedJobSpec, prepare
    from runner.resume import new_run

    cfg = C.build_eval_config({"env_id": "gsm8k", "model": "openai/x", "output_dir": str(tmp_path)})
    assert cfg.run_id is None and len(new_run(cfg)[0]) == 12
    chosen = cfg.model_copy(update={"run_id": "abcdef123456"})
    rid, path = new_run(chosen)
    assert rid == "abcdef123456" and path.name == rid
    assert chosen.definition_diff(cfg) == []
    spec = HostedJobSpec(config=cfg, run_id="0123456789ab", job_id="j1")
    assert prepare(spec, tmp_path).run_id == "0123456789ab"
