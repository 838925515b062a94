"""Small robust statistics shared by the cluster rules (no I/O; pure functions of lists of floats).

Why not plain k-sigma: with n values, a single outlier's z-score computed with the mean and σ
that include it is bounded by (n − 1)/√n (Shiffler 1988), e.g. 2.85 for n = 10, so
``x > mean + 3σ`` can never fire on fewer than 11 steps or ranks. Outliers also mask each
other: four slow steps out of eight inflate σ so much that none of them exceeds mean + 3σ.
The helpers below therefore take the mean and σ from a *clean baseline* the outliers cannot
reach, and add a relative floor so that tiny σ on very regular data does not flag noise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean (0 for an empty sequence)."""
    return sum(xs) / len(xs) if xs else 0.0


def stdev(xs: Sequence[float]) -> float:
    """Sample standard deviation (ddof = 1; 0 for fewer than two values)."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def median(xs: Sequence[float]) -> float:
    """Median (0 for an empty sequence)."""
    s = sorted(xs)
    if not s:
        return 0.0
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def percentile(xs: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    if not s:
        return 0.0
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class ForwardSearch:
    """Result of :func:`forward_search`: indices of the high outliers and the clean baseline."""

    outliers: tuple[int, ...]
    baseline_mean: float
    baseline_std: float
    baseline_median: float
    baseline_n: int
    threshold: float


def forward_search(values: Sequence[float], k: float, min_excess_ratio: float) -> ForwardSearch:
    """High outliers by forward search (Atkinson & Riani): grow a clean set from the lower half.

    Start from the lower ⌈n/2⌉ values (an outlier can only be among the slow values, and fewer
    than half of them may be outliers), then add the next larger value while it stays within
    ``mean + k·σ`` of the set so far *or* within ``(1 + min_excess_ratio) × median`` of it. The
    first value beyond both bounds, and every larger one, is an outlier. ``mean`` and ``σ`` are
    therefore LLMPrism's k-sigma statistics, taken over values the outliers cannot inflate.
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    n = len(order)
    if n < 3:
        return ForwardSearch((), mean(values), stdev(values), median(values), n, math.inf)
    m = (n + 1) // 2
    accepted = [values[i] for i in order[:m]]  # ascending: its median is read by index
    # running mean and sum of squared deviations (Welford) for the bound of each candidate: the
    # set grows one value at a time, and recomputing them over it made the search quadratic
    # (1,024 ranks: 0.3 s a step). The figures returned are computed over the final set.
    cnt, mu, m2 = 0, 0.0, 0.0
    for x in accepted:
        cnt += 1
        d = x - mu
        mu += d / cnt
        m2 += d * (x - mu)

    def bound() -> float:
        sd = math.sqrt(max(m2, 0.0) / (cnt - 1)) if cnt > 1 else 0.0
        mid = cnt // 2
        med = accepted[mid] if cnt % 2 else (accepted[mid - 1] + accepted[mid]) / 2
        return max(mu + k * sd, (1.0 + min_excess_ratio) * med)

    for pos in range(m, n):
        x = values[order[pos]]
        if x > bound():
            return ForwardSearch(tuple(sorted(order[pos:])), mean(accepted), stdev(accepted), median(accepted),
                                 len(accepted), _threshold(accepted, k, min_excess_ratio))
        accepted.append(x)
        cnt += 1
        d = x - mu
        mu += d / cnt
        m2 += d * (x - mu)
    return ForwardSearch((), mean(accepted), stdev(accepted), median(accepted), len(accepted),
                         _threshold(accepted, k, min_excess_ratio))


def warmup_steps(
    vals: Sequence[tuple[int, float]], compile_us: dict[int, float], k: float, min_excess_ratio: float
) -> tuple[tuple[int, ...], ForwardSearch, list[tuple[int, float]]]:
    """Leave warm-up steps out of a rank's (step, time) list, then search for slow steps.

    Warm-up steps: those whose compile time (``compile_us`` by step) exceeds ``min_excess_ratio``
    of the median step (the compile alone makes them slow), and the first step of a profiling
    cycle (a step whose predecessor was not profiled) when it is the only slow step left. A slow
    first step next to other slow steps is not told apart from them and stays. Returns the
    warm-up steps, the search over the other steps and those steps.
    """
    med = median([t for _, t in vals])
    warm = {s for s, _ in vals if compile_us.get(s, 0.0) > min_excess_ratio * med}
    kept = [(s, t) for s, t in vals if s not in warm]
    fs = forward_search([t for _, t in kept], k, min_excess_ratio)
    present = {s for s, _ in vals}
    if len(fs.outliers) == 1 and kept[fs.outliers[0]][0] - 1 not in present:
        warm.add(kept[fs.outliers[0]][0])
        kept = [(s, t) for s, t in kept if s not in warm]
        fs = forward_search([t for _, t in kept], k, min_excess_ratio)
    return tuple(sorted(warm)), fs, kept


def _threshold(accepted: Sequence[float], k: float, min_excess_ratio: float) -> float:
    return max(mean(accepted) + k * stdev(accepted), (1.0 + min_excess_ratio) * median(accepted))


def spacing_pattern(steps: Sequence[int], min_count: int = 3) -> tuple[str, int | None]:
    """Describe where slow steps fall: ``isolated`` / ``recurring`` / ``periodic`` and the period.

    Periodic: at least ``min_count`` slow steps, never two in a row, whose gaps all lie within
    ±1 of the median gap (e.g. GC full collections triggered by allocation counts, checkpoints
    every N steps).
    """
    s = sorted(set(steps))
    if len(s) <= 1:
        return ("isolated", None)
    gaps = [b - a for a, b in itertools.pairwise(s)]
    med_gap = median([float(g) for g in gaps])
    if len(s) >= min_count and min(gaps) >= 2 and all(abs(g - med_gap) <= 1 for g in gaps):
        return ("periodic", round(med_gap))
    return ("recurring", None)


def distribution(values: Sequence[float]) -> dict[str, float]:
    """PRISM-style step-time distribution summary: p50 / p90 / p99 / max and coefficient of variation."""
    m = mean(values)
    return {
        "step_p50_us": round(percentile(values, 50), 1),
        "step_p90_us": round(percentile(values, 90), 1),
        "step_p99_us": round(percentile(values, 99), 1),
        "step_max_us": round(max(values), 1) if values else 0.0,
        "step_mean_us": round(m, 1),
        "step_cv": round(stdev(values) / m, 4) if m > 0 else 0.0,
    }
