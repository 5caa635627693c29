"""`vf-swe-debug`'s flags are generated from one declaration per option
(`swe_debug.options.SWEDebugOptions`, `Opt` markers), as `vf-sandbox eval`'s are: each
option is reachable by exactly one flag (and its aliases), every flag is a declared
option, the values are validated by the model, and an unknown flag is refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from runner.options import declared, flags
from swe_debug import cli
from swe_debug.options import Step, SWEDebugOptions


def click_command():
    return typer.main.get_command(cli.app)


def test_every_flag_is_one_declared_option_and_back():
    cmd = click_command()
    options = [p for p in cmd.params if p.opts and p.opts[0].startswith("-") and p.name != "help"]
    opts = Counter(o for p in options for o in p.opts)
    assert [o for o, n in opts.items() if n > 1] == []  # no flag reaches two options
    by_param = {d.param: d for d in flags(SWEDebugOptions)}
    assert {p.name for p in options} == set(by_param)  # every flag declared, every declared flag a flag
    for p in options:
        assert tuple(p.opts) == by_param[p.name].flags
    # every field of the model is either a flag or the positional dataset
    assert set(SWEDebugOptions.model_fields) == set(by_param) | {"dataset"}
    assert [p.name for p in cmd.params if not p.opts[0].startswith("-")] == ["dataset"]
    # declared once: the fields with a marker are the model's fields, each once
    assert Counter(d.name for d in declared(SWEDebugOptions)).most_common(1)[0][1] == 1


@pytest.fixture
def seen(monkeypatch):
    got: list[dict] = []
    monkeypatch.setattr(cli, "_main", lambda **a: got.append(a) or 0)
    return got


def test_every_option_reaches_the_run_with_its_declared_default(seen):
    res = CliRunner().invoke(cli.app, ["ds.jsonl"])
    assert res.exit_code == 0, res.output
    (a,) = seen
    assert set(a) == set(SWEDebugOptions.model_fields)
    assert a == dict(SWEDebugOptions(dataset="ds.jsonl"))
    assert (a["concurrency"], a["split"], a["debug_step"], a["quiet"]) == (4, "test", Step.gold_patch, False)


def test_given_flags_land_on_their_options(seen):
    res = CliRunner().invoke(cli.app, ["ds.jsonl", "-c", "2", "--name", "n1", "-i", "a,b", "-i", "c", "-o", "out",
                                       "--debug-step", "command", "--debug-command", "true", "--no-tests", "-q",
                                       "--memory-gb", "1.5", "-w", "3"])
    assert res.exit_code == 0, res.output
    (a,) = seen
    assert (a["concurrency"], a["name"], a["instance_ids"], a["output_dir"]) == (2, "n1", ["a,b", "c"], Path("out"))
    assert (a["debug_step"], a["debug_command"], a["no_tests"], a["quiet"]) == (Step.command, "true", True, True)
    assert (a["memory_gb"], a["num_workers"]) == (1.5, 3)
    cfg = cli.eval_config(a)  # and on into the run definition
    assert cfg.max_concurrent == 2 and cfg.name == "n1" and cfg.num_workers == 3
    assert cfg.env_args["instance_ids"] == ["a", "b", "c"] and cfg.env_args["memory_gb"] == 1.5


def test_unknown_flag_is_refused(seen):
    res = CliRunner().invoke(cli.app, ["ds.jsonl", "--concurency", "2"])
    assert res.exit_code == 2 and "No such option" in res.output and "--concurency" in res.output
    assert seen == []


@pytest.mark.parametrize("argv, flag", [(["-c", "0"], "--concurrency/-c"), (["--repeat", "0"], "--repeat"),
                                        (["--max-retries", "-1"], "--max-retries"), (["-w", "0"], "--num-workers/-w"),
                                        (["--cpu-cores", "0"], "--cpu-cores")])
def test_a_value_out_of_range_is_refused_naming_the_flag(seen, argv, flag):
    res = CliRunner().invoke(cli.app, ["ds.jsonl", *argv])
    assert res.exit_code == 2, res.output
    assert f"error: {flag}:" in res.output
    assert seen == []


def test_a_bare_resume_still_means_the_newest_unfinished_run(seen):
    res = CliRunner().invoke(cli.app, ["ds.jsonl", "--resume"])
    assert res.exit_code == 0, res.output
    assert seen[0]["resume"] == cli.AUTO_RESUME
