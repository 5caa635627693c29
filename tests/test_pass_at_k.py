"""One pass@k: run metadata (envs.outputs.aggregate) and `runs show` / the
dashboard (runs.results.summarize_eval) give the same, hand-computed numbers."""

from __future__ import annotations

import pytest

from envs.outputs import aggregate
from envs.pass_at_k import ks_for, pass_at_k
from runs.results import summarize_eval


def rows(rewards_by_example: dict[int, list[float]]) -> list[dict]:
    return [{"example_id": ex, "reward": r} for ex, rs in rewards_by_example.items() for r in rs]


def both(rewards_by_example: dict[int, list[float]], threshold: float = 0.5) -> tuple[dict, dict]:
    meta = aggregate(rows(rewards_by_example), threshold)
    shown = summarize_eval(rows(rewards_by_example), {"pass_threshold": threshold})
    return meta, shown


def test_hand_computed_n4_c2():
    meta, shown = both({0: [1.0, 0.0, 1.0, 0.0]})
    # pass@1 = 1 - C(2,1)/C(4,1) = 1/2; pass@2 = 1 - C(2,2)/C(4,2) = 5/6; pass@4 = 1 - 0 = 1
    expected_any = {"1": 0.5, "2": 5 / 6, "4": 1.0}
    # pass^1 = C(2,1)/C(4,1) = 1/2; pass^2 = C(2,2)/C(4,2) = 1/6; pass^4 = 0
    expected_all = {"1": 0.5, "2": 1 / 6, "4": 0.0}
    for out in (meta, shown):
        assert out["pass_at_k"] == pytest.approx(expected_any)
        assert out["pass_all_k"] == pytest.approx(expected_all)


def test_metadata_and_runs_show_agree_on_uneven_groups():
    # 3 rollouts per example (k = 1, 2 only: no "3"), one example with 5 rollouts, threshold 0.7
    data = {0: [1.0, 0.6, 0.9], 1: [0.0, 0.0, 0.8], 2: [1.0, 1.0, 1.0, 0.0, 0.75]}
    meta, shown = both(data, threshold=0.7)
    assert set(meta["pass_at_k"]) == {"1", "2"}
    assert meta["pass_at_k"] == pytest.approx(shown["pass_at_k"])
    assert meta["pass_all_k"] == pytest.approx(shown["pass_all_k"])
    # example 0: n=3 c=2, 1: n=3 c=1, 2: n=5 c=4
    at2 = ((1 - 0 / 3) + (1 - 1 / 3) + (1 - 0 / 10)) / 3
    all2 = (1 / 3 + 0 / 3 + 6 / 10) / 3
    assert meta["pass_at_k"]["2"] == pytest.approx(at2)
    assert meta["pass_all_k"]["2"] == pytest.approx(all2)


def test_ks_and_edges():
    assert ks_for(0) == [] and ks_for(1) == [1] and ks_for(7) == [1, 2, 4] and ks_for(8) == [1, 2, 4, 8]
    assert pass_at_k({}, 0.5) == ({}, {})
    assert pass_at_k({0: [0.0, 0.0]}, 0.5) == ({"1": 0.0, "2": 0.0}, {"1": 0.0, "2": 0.0})
