"""rules/cluster/_stats.py: the forward search against a plain transcription of its definition."""

from __future__ import annotations

import math
import random

import pytest

from rules.cluster._stats import forward_search, mean, median, stdev


def _reference(values: list[float], k: float, ratio: float) -> tuple[tuple[int, ...], float, float, float, int, float]:
    """The definition, recomputing every statistic over the clean set for each candidate."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    n = len(order)
    if n < 3:
        return (), mean(values), stdev(values), median(values), n, math.inf
    accepted = [values[i] for i in order[: (n + 1) // 2]]
    for pos in range((n + 1) // 2, n):
        bound = max(mean(accepted) + k * stdev(accepted), (1.0 + ratio) * median(accepted))
        if values[order[pos]] > bound:
            return tuple(sorted(order[pos:])), mean(accepted), stdev(accepted), median(accepted), len(accepted), bound
        accepted.append(values[order[pos]])
    bound = max(mean(accepted) + k * stdev(accepted), (1.0 + ratio) * median(accepted))
    return (), mean(accepted), stdev(accepted), median(accepted), len(accepted), bound


@pytest.mark.parametrize("seed", range(40))
def test_forward_search_equals_its_definition(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.choice([1, 2, 3, 4, 7, 16, 100, 1024])
    base = rnd.uniform(1e3, 1e6)
    values = [base * (1 + rnd.gauss(0, rnd.choice([0.001, 0.02, 0.2]))) for _ in range(n)]
    for _ in range(rnd.choice([0, 1, 3])):  # planted slow ranks
        if values:
            values[rnd.randrange(n)] *= rnd.uniform(1.05, 3.0)
    if rnd.random() < 0.3:
        values = [round(v, -3) for v in values]  # ties
    k, ratio = rnd.choice([(3.0, 0.1), (2.0, 0.05), (3.0, 0.0)])
    fs = forward_search(values, k, ratio)
    assert (fs.outliers, fs.baseline_mean, fs.baseline_std, fs.baseline_median, fs.baseline_n, fs.threshold) \
        == _reference(values, k, ratio)


def test_forward_search_finds_one_slow_rank_among_a_thousand() -> None:
    values = [100.0 + (i % 7) * 0.1 for i in range(1024)]
    values[613] = 130.0
    fs = forward_search(values, 3.0, 0.05)
    assert fs.outliers == (613,)
    assert fs.baseline_n == 1023 and fs.baseline_median == 100.3
