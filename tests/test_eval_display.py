"""Display pieces: selection in the multi-eval live view, summary tables, markup safety."""

import io

from runner.display import EvalProgress, PlainDisplay, RichDisplay, print_summary


def test_rich_display_selection_and_render():
    d = RichDisplay()
    a, b = EvalProgress(label="a", model="m", total=4, status="completed", done=4), EvalProgress(label="b[x]", model="m", total=4, status="running")
    d.add(a)
    d.add(b)
    assert d._active() is b  # the first running eval by default
    d._select(-1)
    assert d._active() is a
    d._select(-1)
    assert d._active() is b
    out = io.StringIO()
    from rich.console import Console

    Console(file=out, width=100).print(d._render())
    text = out.getvalue()
    assert "b[x]" in text and "▶ b[x]" in text and "evaluations" in text


def test_plain_display_logs_progress(caplog):
    d = PlainDisplay(interval=0)
    i = d.add(EvalProgress(label="env", model="m", total=2))
    d.update(i)  # pending: nothing
    d.evals[i].status, d.evals[i].done, d.evals[i].reward_sum = "running", 2, 1.5
    with caplog.at_level("INFO", logger="envs.runner"):
        d.update(i)
    assert "env: 2/2 rollouts, avg reward 0.750" in caplog.text


def test_summary_shows_stats_errors_and_samples(capsys):
    rows = [
        {"example_id": 0, "reward": 1.0, "prompt": [{"role": "user", "content": "[b]q[/b]"}], "completion": [{"role": "assistant", "content": "a"}], "attempts": 2},
        {"example_id": 0, "reward": 0.0, "prompt": "q", "completion": None, "error": "InfraError: gone", "error_info": {"type": "InfraError", "message": "gone", "kind": "infra"}, "error_kind": "infra"},
    ]
    meta = {"env_id": "e", "model": "m", "num_examples": 1, "rollouts_per_example": 2, "avg_metrics": {"x": 0.5},
            "pass_at_k": {"1": 0.5}, "time_ms": 1500, "status": "completed", "path_to_save": "/tmp/r"}
    print_summary(meta, rows, plain=True)
    out = capsys.readouterr().out
    # the infra-error row has no result on the task: out of the average, counted apart
    assert "1.0000 ± 0.0000 (over 1 scored)" in out and "2: 1 scored, 1 errored" in out
    assert "not scored" in out and "sandbox: 1" in out
    assert "pass@1" in out and "retried rollouts" in out
    assert "[b]q[/b]" in out and "[error] InfraError: gone" in out
    print_summary(meta, rows, abbreviated=True, plain=True)
    assert "samples" not in capsys.readouterr().out
