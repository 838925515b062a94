"""Helpers of the compute rules checked against a pair-by-pair computation."""

from __future__ import annotations

import numpy as np
import pytest

from rules.compute.cmp003_affinity_api import inside_windows


@pytest.mark.parametrize("seed", range(5))
def test_inside_windows_against_brute_force(seed: int) -> None:
    """An interval is inside when some window of its rank starts at or before it and ends at or
    after it (what CMP003's SQL range join used to decide): nested, overlapping and touching
    windows, intervals on the bounds, ranks without windows."""
    rng = np.random.default_rng(seed)
    n, m = 400, 30
    rank = rng.integers(0, 4, n)
    s = rng.integers(0, 100, n) * 10
    e = s + rng.integers(0, 8, n) * 10
    w_rank = rng.integers(0, 3, m)  # rank 3 has no window
    w_s = rng.integers(0, 100, m) * 10
    w_e = w_s + rng.integers(0, 30, m) * 10
    got = inside_windows(rank, s, e, w_rank, w_s, w_e)
    want = [any(w_rank[j] == rank[i] and w_s[j] <= s[i] and e[i] <= w_e[j] for j in range(m)) for i in range(n)]
    assert got.tolist() == want
    assert not got[rank == 3].any()
