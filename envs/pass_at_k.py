"""pass@k and pass^k: the one implementation used by run metadata
(`envs.outputs.aggregate`), `vf-sandbox runs show` and the dashboard
(`runs.results`).

Both are the unbiased estimators over an example's n rollouts of which c
passed (reward >= threshold), averaged over examples:

    pass@k = 1 - C(n-c, k) / C(n, k)    (at least one of k draws passes)
    pass^k = C(c, k) / C(n, k)          (all k draws pass)

for k = 1, 2, 4, ... up to the smallest number of rollouts of any example.
Keys are the k's as strings (JSON object keys).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from math import comb


def ks_for(rollouts: int) -> list[int]:
    """1, 2, 4, ... <= rollouts (empty when rollouts < 1)."""
    ks, k = [], 1
    while k <= rollouts:
        ks.append(k)
        k *= 2
    return ks


def pass_at_k_one(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one example: n rollouts, c passed, 1 <= k <= n."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    return 1.0 - comb(n - c, k) / comb(n, k)  # comb(m, k) == 0 when m < k


def pass_all_k_one(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one example: the chance that k draws (without replacement) all pass."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass^k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    return comb(c, k) / comb(n, k)


def pass_at_k(
    rewards_by_example: Mapping[Hashable, Iterable[float]], threshold: float
) -> tuple[dict[str, float], dict[str, float]]:
    """(pass@k, pass^k) averaged over examples; examples without rollouts are ignored."""
    counts = []
    for rewards in rewards_by_example.values():
        values = list(rewards)
        if values:
            counts.append((len(values), sum(1 for r in values if r >= threshold)))
    if not counts:
        return {}, {}
    p_any: dict[str, float] = {}
    p_all: dict[str, float] = {}
    for k in ks_for(min(n for n, _ in counts)):
        p_any[str(k)] = sum(pass_at_k_one(n, c, k) for n, c in counts) / len(counts)
        p_all[str(k)] = sum(pass_all_k_one(n, c, k) for n, c in counts) / len(counts)
    return p_any, p_all
