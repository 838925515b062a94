"""Step-time variability (PRISM): distributions, what makes steps vary, slowdown at scale, sensitivity.

The model; the stage that runs it on an analysis is :mod:`advisor.stages.variability`, and the
VAR rules run it through their rule context (one result per analysis, shared).

PRISM models a synchronous training step as the **maximum over ranks** of each rank's own time,
itself a **sum of operator times**: in series, variances add; in parallel (ranks synchronised by a
collective), the step's distribution is the **product of the ranks' CDFs**. This stage measures
those distributions and composes them the same way, from the small tables only (the breakdown
rows, ``op_step_stats``, ``comm_ops``, ``comm_matrix``), never from ``events``:

* **Own time of a rank in a step.** A rank's step window includes the time it waits inside
  collectives for slower peers. Per step and collective (operator type and group), the member
  with the shortest collective time arrived last: the excess of each other member's time over
  it is wait. A rank's own time is its step time minus that wait (at most its exposed
  communication time: a wait hidden under computation costs the step nothing). The cluster's
  step is then the maximum of the ranks' own times, which it matches when the ranks are
  synchronised at the end of the step.
* **Distributions.** p5 / p50 / p95 / sigma of the cluster step time (per step: the slowest
  rank's step time), of each rank's step time, and of each operator's time per (rank, step)
  with its temporal (within a rank, across steps) and spatial (across the ranks' means) spread.
* **What makes steps vary.** Series: an operator's share of the own time's variance is its
  covariance with the own time over all (rank, step) cells (the shares of operators that do
  not overlap add up to one; independent operators give their variances, PRISM eq. 2).
  Parallel: the cluster step's distribution is the product of the ranks' empirical CDFs of
  own time; an operator's contribution is the share of that distribution's variance (and the
  drop of its p95 and mean) that goes away when the operator is held at its median on every
  rank and step (PRISM use case III). A collective counts by its own part: the time the last
  member to arrive spends in it.
* **Slowdown at scale.** Assumption (stated in the report): at N ranks, each rank's own time
  is an independent draw from the pooled measured per-rank distribution (all ranks and steps),
  and steps are synchronised, so the step time is the maximum of N draws: CDF F(t)^N. Its
  median, p95 and mean, and the probability of a step more than x % above today's median step.
  Quantiles beyond the measured range cannot be read from it: they are the measured maximum
  (a lower bound) and flagged ``extrapolated``.
* **Sensitivity.** A group of g ranks synchronised at every layer (tensor parallelism) waits
  for the slowest of g: the probability of a slowdown as a function of g. For a pipeline
  (send / receive links forming chains of ranks), a rank's slowdown first fills the time its
  stage already waits on the others (its slack); the stage with the least slack, where a slow
  rank lengthens the step most, is named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import pandas as pd

from advisor.schema import NO_STEP

Sql = Callable[[str], pd.DataFrame]  # runs a query on the profile's tables
CELLS_KEY = "variability_cells"  # an analysis' extras key: compute()'s ``cells``, which the VAR rules read

MIN_STEPS = 5  # fewer steps than this: distributions are reported, not composed or extrapolated
SCALES = (1, 2, 8, 64)  # prediction at these multiples of the profile's rank count
SLOWDOWNS = (5, 10, 20)  # P(step more than x % above the baseline)
GROUP_SIZES = (2, 4, 8, 16, 32, 64, 72)
TOP_OPS = 10  # operators reported
CANDIDATES = 16  # operators whose parallel contribution is computed (by series covariance, then time)
RANKS_SHOWN = 16
HIST_BINS = 20
CDF_POINTS = 41
GRID = 512  # at most this many points for the product of CDFs
STEADY = 1e-3  # a step whose sigma is below this share of its mean has no variance to decompose
FIT_TOLERANCE = 0.05  # the model at the profile's own scale vs its measured median step  # at most this many points for the product of CDFs

ASSUMPTION = (
    "each rank's own step time (its step time minus the time it waits in collectives for slower peers) is an "
    "independent draw from the pooled measured per-rank distribution (all ranks, all steps), and the ranks are "
    "synchronised every step, so the step time at N ranks is the maximum of N draws (CDF F(t)^N)"
)

_COMM_SQL = """
SELECT rank, step, coalesce(op_type, 'comm') AS op_type, coalesce(group_name, '') AS grp,
       count(*) AS n, sum(dur_ns) / 1000.0 AS us
FROM comm_ops WHERE rank IS NOT NULL AND step IS NOT NULL AND step >= 0 AND dur_ns IS NOT NULL
GROUP BY ALL
"""
# without comm_ops rows (host collectives of a CPU-only trace): the communication operators of op_step_stats by name
_COMM_OPS_SQL = """
SELECT rank, step, name AS op_type, '' AS grp, sum(n) AS n, sum(total_ns) / 1000.0 AS us
FROM op_step_stats WHERE kind = 'comm' AND rank IS NOT NULL AND step IS NOT NULL AND step >= 0
GROUP BY ALL
"""
# the operators with the longest total time (i: their order), each with its rows (one row with NULL
# rank and step for an operator none of whose rows joins back: a NULL kind or name)
_TOP_OPS_SQL = """
SELECT kind, name, row_number() OVER (ORDER BY sum(total_ns) DESC, kind, name) - 1 AS i, sum(n) AS n
FROM op_step_stats WHERE rank IS NOT NULL AND step IS NOT NULL AND step >= 0 {comm}
GROUP BY kind, name QUALIFY i < {limit}
"""
_OPS_SQL = """
WITH top AS ({top})
SELECT t.i, t.kind, t.name, t.n, o.rank, o.step, o.total_ns / 1000.0 AS us
FROM top t LEFT JOIN op_step_stats o ON o.kind = t.kind AND o.name = t.name
     AND o.rank IS NOT NULL AND o.step IS NOT NULL AND o.step >= 0
"""
_P2P_SQL = """
SELECT DISTINCT least(src_rank, dst_rank) AS a, greatest(src_rank, dst_rank) AS b FROM comm_matrix
WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
  AND regexp_matches(lower(coalesce(name, '')), 'send|recv|receive|p2p')
"""


# -- distributions ---------------------------------------------------------------------------
def dist(values: np.ndarray) -> dict[str, float]:
    """p5 / p50 / p95, mean and sigma (population) of a sample, in its unit."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {}
    p5, p50, p95 = np.percentile(v, [5, 50, 95])
    return {"p5_us": _r(p5), "p50_us": _r(p50), "p95_us": _r(p95), "mean_us": _r(v.mean()), "sigma_us": _r(v.std()),
            "n": len(v)}


def _r(x: float) -> float:
    return round(float(x), 3)


def histogram(values: np.ndarray, bins: int = HIST_BINS) -> dict[str, list[float]]:
    """Equal-width histogram (edges, counts) and the empirical CDF at ``CDF_POINTS`` quantiles."""
    v = np.sort(np.asarray(values, dtype=float))
    if not len(v):
        return {"edges_us": [], "counts": [], "cdf_us": [], "cdf_p": []}
    lo, hi = float(v[0]), float(v[-1])
    if hi <= lo:
        hi = lo + max(abs(lo) * 1e-3, 1e-3)
    counts, edges = np.histogram(v, bins=bins, range=(lo, hi))
    p = np.linspace(0.0, 1.0, CDF_POINTS)
    return {"edges_us": [_r(e) for e in edges], "counts": [int(c) for c in counts],
            "cdf_us": [_r(x) for x in np.quantile(v, p)], "cdf_p": [round(float(x), 3) for x in p]}


# -- composition: the maximum over ranks through the product of their CDFs ------------------
def max_distribution(own: np.ndarray, grid_size: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of the maximum over rows (ranks) of independent draws, each row's from the
    empirical distribution of its finite values (the product of the rows' CDFs, PRISM eq. 3).

    Returns (support, probability mass): the support is the pooled values from the largest row
    minimum up (all of them, or ``grid_size`` of them evenly spaced in rank order, both ends included).
    """
    a = np.sort(np.atleast_2d(np.asarray(own, dtype=float)), axis=1)  # NaN last in each row
    counts = np.isfinite(a).sum(axis=1)
    a = a[counts > 0]
    counts = counts[counts > 0]
    if not len(a):
        return np.empty(0), np.empty(0)
    vals = a[np.isfinite(a)]
    lo = float(a[:, 0].max())  # below the largest row minimum the maximum never falls
    grid = np.unique(vals[vals >= lo])
    if len(grid) > grid_size:
        grid = np.unique(grid[np.linspace(0, len(grid) - 1, grid_size).astype(int)])  # ends included
    # per row, how many of its values lie at or below each grid point: each value counts from the
    # first grid point at or above it (values above the grid's top never occur: it is the maximum)
    rows, cols = np.nonzero(np.isfinite(a))
    at = np.searchsorted(grid, a[rows, cols], side="left")
    keep = at < len(grid)
    hist = np.bincount(rows[keep] * len(grid) + at[keep], minlength=len(a) * len(grid)).reshape(len(a), len(grid))
    below = np.cumsum(hist, axis=1)
    with np.errstate(divide="ignore"):
        logf = np.log(below / counts[:, None]).sum(axis=0)
    cdf = np.exp(logf)
    cdf[-1] = 1.0
    mass = np.diff(np.concatenate([[0.0], cdf]))
    return grid, np.clip(mass, 0.0, None)


def dist_stats(support: np.ndarray, mass: np.ndarray) -> dict[str, float]:
    """Mean, sigma, p5 / p50 / p95 of a discrete distribution."""
    if not len(support):
        return {}
    mass = mass / mass.sum()
    mean = float((support * mass).sum())
    var = float((((support - mean) ** 2) * mass).sum())
    cdf = np.cumsum(mass)
    q = [float(support[min(int(np.searchsorted(cdf, p - 1e-12)), len(support) - 1)]) for p in (0.05, 0.5, 0.95)]
    return {"mean_us": _r(mean), "sigma_us": _r(math.sqrt(max(var, 0.0))), "var": var,
            "p5_us": _r(q[0]), "p50_us": _r(q[1]), "p95_us": _r(q[2])}


def predict_max(pooled: np.ndarray, n: int, baseline: float) -> dict[str, Any]:
    """Step time at ``n`` ranks when each rank draws independently from ``pooled`` and the step is
    the maximum: CDF F^n on the sorted sample. p50 / p95, mean, P(step > baseline·(1 + x %))."""
    x = np.sort(np.asarray(pooled, dtype=float))
    m = len(x)
    i = np.arange(1, m + 1) / m
    mass = i ** n - (i - 1.0 / m) ** n
    mean = float((x * mass).sum() / mass.sum())
    out: dict[str, Any] = {"ranks": int(n), "mean_us": _r(mean)}
    beyond = False
    for q, key in ((0.5, "p50_us"), (0.95, "p95_us")):
        level = q ** (1.0 / n)  # the pooled quantile whose n-th power is q
        k = math.ceil(m * level - 1e-9)
        beyond |= level > 1.0 - 1.0 / m  # read from the sample's maximum: a lower bound
        out[key] = _r(x[min(max(k, 1), m) - 1])
    for pct in SLOWDOWNS:
        f = np.searchsorted(x, baseline * (1 + pct / 100.0), side="right") / m
        out[f"p_slowdown_{pct}"] = round(float(1.0 - f ** n), 4)
    out["extrapolated"] = bool(beyond)
    return out


# -- the stage ----------------------------------------------------------------------------------
def compute(bd: pd.DataFrame | None, sql: Sql, cells: dict[str, Any] | None = None,
            empty: Collection[str] = ()) -> dict[str, Any] | None:
    """The report's ``variability`` object (None when the profile has no step breakdown), from the
    breakdown rows and the small tables that ``sql`` reads (``op_step_stats`` must be built).

    ``cells``, when given, receives what :func:`spikes` reads (kept out of the report): the ranks and
    steps composed, the cluster's step time per step, the own time and the leading operator's time
    per (rank, step). ``empty``: tables known to hold no row (``comm_ops``, ``comm_matrix``), not read.
    """
    if bd is None or bd.empty:
        return None
    ranks_in_profile = int(bd["rank"].nunique())
    bd = bd[bd["step"] != NO_STEP]
    if bd.empty:
        return {"ranks": ranks_in_profile, "steps": 0, "assumption": ASSUMPTION,
                "note": "no step markers: the whole trace is one window, so there is no step-time distribution"}
    ranks = sorted(int(r) for r in bd["rank"].unique())
    per_rank_steps = bd.groupby("rank")["step"].nunique()
    per_step = bd.groupby("step")["rank"].nunique()
    common = sorted(int(s) for s in per_step.index[per_step.to_numpy() == len(ranks)])
    R, S = len(ranks), len(common)
    ridx = {r: i for i, r in enumerate(ranks)}
    sidx = {s: j for j, s in enumerate(common)}
    notes: list[str] = []
    out: dict[str, Any] = {"ranks": R, "steps": S, "assumption": ASSUMPTION}

    sel = bd[bd["step"].isin(common)]
    ri = sel["rank"].map(ridx).to_numpy(int)
    si = sel["step"].map(sidx).to_numpy(int)
    T = _matrix(R, S, ri, si, sel["step_us"].to_numpy(float))
    exposed = _matrix(R, S, ri, si, sel["comm_only_us"].to_numpy(float) if "comm_only_us" in sel else
                      np.zeros(len(sel)))

    # the cluster's step time per step: its slowest rank's
    cluster = np.nanmax(T, axis=0) if S else np.empty(0)
    out["step_time"] = {**dist(cluster), **histogram(cluster)}
    out["rank_step_time"] = _rank_table(bd, ranks)
    if S < MIN_STEPS:
        notes.append(f"{S} step(s) common to all ranks (fewer than {MIN_STEPS}): distributions are shown, but "
                     "what makes steps vary and the slowdown at scale are not estimated from so few samples")
        out["note"] = "; ".join(notes)
        out["ops"] = _ops_table(sql, ranks, common, ridx, sidx, None, None, R, S)[0] if S else []
        return out
    if (per_rank_steps > S).any():
        notes.append(f"only the {S} steps every rank has are composed")

    comm_keys, wait = _waits(sql, ridx, sidx, R, S, no_ops="comm_ops" in empty)
    wait = np.minimum(wait, np.nan_to_num(exposed, nan=0.0))
    own = T - wait
    out["own_time"] = {**dist(own.ravel()), "wait_mean_us": _r(float(np.nanmean(wait)))}
    ops, mats = _ops_table(sql, ranks, common, ridx, sidx, comm_keys, own, R, S)

    # parallel composition: the maximum over ranks, and each candidate held at its median
    if R > 1:
        base = dist_stats(*max_distribution(own))
        out["model"] = {k: v for k, v in base.items() if k != "var"}
        for op in ops[:CANDIDATES]:
            m = mats[op["key"]]
            held = own - np.nan_to_num(m) + np.where(np.isfinite(m), np.nanmedian(m), 0.0)
            st = dist_stats(*max_distribution(held))
            steady = base["var"] <= (STEADY * base["mean_us"]) ** 2  # nothing to explain
            op["parallel_share"] = 0.0 if steady else round(max(0.0, 1.0 - st["var"] / base["var"]), 4)
            op["p95_drop_us"] = _r(max(0.0, base["p95_us"] - st["p95_us"]))
            op["mean_drop_us"] = _r(max(0.0, base["mean_us"] - st["mean_us"]))
        ops.sort(key=lambda o: (-o.get("parallel_share", -1.0), -o.get("series_share", 0.0), o["name"]))
    else:
        notes.append("one rank: the distribution across ranks, the maximum over ranks and the slowdown at scale "
                     "cannot be measured")
        ops.sort(key=lambda o: (-o.get("series_share", 0.0), o["name"]))
    if cells is not None and ops:
        cells.update(ranks=ranks, steps=common, cluster=cluster, own=own, op=mats[ops[0]["key"]])
    for o in ops:
        o.pop("key", None)
    out["ops"] = ops[:TOP_OPS]

    if R > 1:
        pooled = own[np.isfinite(own)]
        baseline = float(np.median(cluster))
        rows = []
        for k in SCALES:
            row = {"scale": k, **predict_max(pooled, R * k, baseline)}
            if k == 1:
                row["measured_p50_us"] = out["step_time"]["p50_us"]
                row["measured_p95_us"] = out["step_time"]["p95_us"]
            rows.append(row)
        fit = rows[0]["p50_us"] / baseline - 1.0 if baseline > 0 else 0.0
        out["prediction"] = {"baseline_us": _r(baseline), "basis": "the measured median step time at this scale",
                             "slowdowns_pct": list(SLOWDOWNS), "rows": rows, "fit_error": round(fit, 4)}
        if abs(fit) > FIT_TOLERANCE:
            notes.append(f"at this scale the model's median step is {fit:+.0%} off the measured one: the ranks are "
                         "not alike (a systematically slow rank, pipeline stages doing different work), so the "
                         "prediction at scale is indicative only")
        out["sensitivity"] = {"tp": _tp(sql, pooled, no_ops="comm_ops" in empty),
                              "pipeline": None if "comm_matrix" in empty else _pipeline(sql, ridx, T, own)}
    if notes:
        out["note"] = "; ".join(notes)
    return out


def spikes(cells: dict[str, Any], min_excess_ratio: float, min_op_share: float = 0.5) -> list[dict[str, Any]]:
    """The steps the leading operator of :func:`compute` makes slow: the cluster's step time is above its
    median by more than ``min_excess_ratio`` of it, and on the rank the step waits for (the largest own
    time) the operator's excess over its own median is at least ``min_op_share`` of the step's excess.
    One row per such step: the step, that rank, the step's and the operator's times and excesses."""
    if not cells or "op" not in cells:
        return []
    cluster, own, m = cells["cluster"], cells["own"], cells["op"]
    finite = m[np.isfinite(m)]
    if not len(cluster) or not len(finite):
        return []
    med, op_med = float(np.median(cluster)), float(np.median(finite))
    out = []
    for j, s in enumerate(cells["steps"]):
        excess = float(cluster[j]) - med
        col = own[:, j]
        if excess <= min_excess_ratio * med or not np.isfinite(col).any():
            continue
        i = int(np.nanargmax(col))
        op_us = float(m[i, j])
        if np.isfinite(op_us) and op_us - op_med >= min_op_share * excess:
            out.append({"step": int(s), "rank": int(cells["ranks"][i]), "step_us": _r(cluster[j]),
                        "step_excess_us": _r(excess), "op_us": _r(op_us), "op_excess_us": _r(op_us - op_med)})
    return out


def _matrix(R: int, S: int, ri: np.ndarray, si: np.ndarray, v: np.ndarray) -> np.ndarray:
    m = np.full((R, S), np.nan)
    m[ri, si] = v
    return m


def _rank_table(bd: pd.DataFrame, ranks: list[int]) -> dict[str, Any]:
    """Each rank's step-time distribution (the ``RANKS_SHOWN`` with the highest p95)."""
    g = bd.groupby("rank")["step_us"]
    q = g.quantile(np.array([0.05, 0.5, 0.95])).unstack()
    tab = pd.DataFrame({"rank": q.index.astype(int), "steps": g.size().to_numpy(), "p5_us": q[0.05].to_numpy(),
                        "p50_us": q[0.5].to_numpy(), "p95_us": q[0.95].to_numpy(),
                        "sigma_us": g.std(ddof=0).to_numpy()})
    tab = tab.sort_values(["p95_us", "rank"], ascending=[False, True]).head(RANKS_SHOWN)
    rows = [{k: (int(v) if k in ("rank", "steps") else _r(v)) for k, v in rec.items()} for rec in tab.to_dict("records")]
    return {"rows": rows, "shown": len(rows), "of": len(ranks)}


def _waits(sql: Sql, ridx: dict[int, int], sidx: dict[int, int], R: int, S: int,
           no_ops: bool = False) -> tuple[dict[tuple[str, str], np.ndarray], np.ndarray]:
    """Per collective (op type, group; without ``comm_ops``, per communication operator name): its time per
    (rank, step) (NaN where the rank is not a member), and the wait per (rank, step) summed over collectives:
    the excess over the member that arrived last. ``no_ops``: ``comm_ops`` is known to hold no row."""
    df = None if no_ops else sql(_COMM_SQL)
    if df is None or df.empty:
        df = sql(_COMM_OPS_SQL)
    keys: dict[tuple[str, str], np.ndarray] = {}
    wait = np.zeros((R, S))
    if df.empty:
        return keys, wait
    df = df[df["rank"].isin(ridx) & df["step"].isin(sidx)]
    for (op, grp), g in df.groupby(["op_type", "grp"], sort=True):
        m = np.zeros((R, S))
        members = np.zeros(R, dtype=bool)
        ri = g["rank"].map(ridx).to_numpy(int)
        m[ri, g["step"].map(sidx).to_numpy(int)] = g["us"].to_numpy(float)
        members[ri] = True
        m[~members] = np.nan
        last = np.nanmin(m, axis=0)  # the member that arrived last waited least
        wait += np.nan_to_num(m - last[None, :], nan=0.0)
        keys[(str(op), str(grp))] = m
    return keys, wait


def _ops_table(sql: Sql, ranks: list[int], common: list[int], ridx: dict[int, int], sidx: dict[int, int],
               comm_keys: dict[tuple[str, str], np.ndarray] | None, own: np.ndarray | None, R: int,
               S: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Per operator: its time per (rank, step) and its distribution; with ``own``, its series share."""
    top_sql = _TOP_OPS_SQL.format(comm="AND kind <> 'comm'" if comm_keys else "", limit=2 * CANDIDATES)
    df = sql(_OPS_SQL.format(top=top_sql))
    names = df[["i", "kind", "name", "n"]].drop_duplicates("i")
    df = df[df["rank"].isin(ridx) & df["step"].isin(sidx)]
    mats: dict[str, np.ndarray] = {}
    meta: dict[str, dict[str, Any]] = {}
    if not df.empty:
        k = len(names)
        cube = np.zeros((k, R, S))
        i = df["i"].to_numpy(int)
        ri = df["rank"].map(ridx).to_numpy(int)
        np.add.at(cube, (i, ri, df["step"].map(sidx).to_numpy(int)), df["us"].to_numpy(float))
        seen = np.zeros((k, R), dtype=bool)
        seen[i, ri] = True
        for rec in names.sort_values("i").to_dict("records"):
            j = int(rec["i"])
            key = f"{rec['kind']}\x00{rec['name']}"
            mats[key] = np.where(seen[j][:, None], cube[j], np.nan)  # NaN: a rank that never runs it
            meta[key] = {"kind": str(rec["kind"]), "name": str(rec["name"]), "group": None, "calls": int(rec["n"]),
                         "ranks": int(seen[j].sum())}
    for (op, grp), m in (comm_keys or {}).items():
        members = np.asarray(np.isfinite(m).any(axis=1), dtype=bool)
        key = f"comm\x00{op}\x00{grp}"
        # a collective's own part: the time of the member that arrived last, the same on every member
        own_part = np.where(members[:, None], np.nanmin(m, axis=0)[None, :], np.nan)
        mats[key] = own_part
        meta[key] = {"kind": "comm", "name": op, "group": grp or None, "calls": None, "ranks": int(members.sum()),
                     "measured": dist(m[members].ravel())}
    ops = []
    var_own = float(np.nanvar(own)) if own is not None else 0.0
    for key, m in mats.items():
        d = meta[key]
        cells = m[np.isfinite(m)]
        row: dict[str, Any] = {"key": key, **{k: v for k, v in d.items() if k != "measured"}, **dist(cells)}
        row["total_us"] = _r(cells.sum())
        present = np.isfinite(m).all(axis=1)  # the ranks that run it (every step: absent steps count 0)
        rows_m = m[present]
        row["temporal_sigma_us"] = _r(float(rows_m.std(axis=1).mean())) if S > 1 else 0.0
        row["spatial_sigma_us"] = _r(float(rows_m.mean(axis=1).std())) if R > 1 else 0.0
        means = np.where(present, np.nan_to_num(m).mean(axis=1), -np.inf)
        slow = int(np.argmax(means))
        row["slowest_rank"] = ranks[slow]
        row["slowest_rank_mean_us"] = _r(means[slow])
        if "measured" in d:
            row["measured"] = d["measured"]  # with the waits for peers
        if own is not None and var_own > 0:
            ok = np.isfinite(own)
            x = np.nan_to_num(m)[ok]  # a rank that does not run it: 0
            cov = float(((x - x.mean()) * (own[ok] - own[ok].mean())).mean())
            row["series_share"] = round(cov / var_own, 4)
        ops.append(row)
    ops.sort(key=lambda o: (-o.get("series_share", 0.0), -o["total_us"], o["name"]))
    if own is None:
        ops.sort(key=lambda o: (-o["total_us"], o["name"]))
    else:
        # candidates for the parallel composition: the largest series shares, then the longest
        lead = ops[:CANDIDATES // 2]
        rest = sorted(ops[CANDIDATES // 2:], key=lambda o: (-o["total_us"], o["name"]))
        ops = lead + rest
    return ops, mats


def _tp(sql: Sql, pooled: np.ndarray, no_ops: bool = False) -> dict[str, Any]:
    """P(the slowest of g ranks is more than x % above a typical rank) for group sizes g (``no_ops``:
    ``comm_ops`` is known to hold no row: no group size in the profile)."""
    base = float(np.median(pooled))
    sizes = None if no_ops else sql("SELECT coalesce(group_name, '') AS grp, count(DISTINCT rank) AS n FROM comm_ops "
                   "WHERE rank IS NOT NULL GROUP BY ALL")
    present = sorted({int(n) for n in sizes["n"]} - {1}) if sizes is not None and not sizes.empty else []
    rows = []
    for g in sorted(set(GROUP_SIZES) | set(present)):
        p = predict_max(pooled, g, base)
        rows.append({"size": g, "in_profile": g in present, "p50_us": p["p50_us"],
                     "expected_slowdown": round(p["mean_us"] / base - 1.0, 4) if base > 0 else None,
                     **{f"p_slowdown_{x}": p[f"p_slowdown_{x}"] for x in SLOWDOWNS}})
    return {"baseline_us": _r(base), "basis": "the median own step time of one rank", "rows": rows,
            "group_sizes": present}


def _pipeline(sql: Sql, ridx: dict[int, int], T: np.ndarray, own: np.ndarray) -> dict[str, Any] | None:
    """Pipeline stages from send / receive links (chains of ranks, the lower-numbered end first), each
    stage's slack (the time its ranks wait on the others: median of step time minus own time) and the
    step lengthening when one of its ranks is slowed by the same amount wherever it sits (PRISM use
    case I): the pooled own time's p95 minus its p50, less the stage's slack. Each stage's own
    p95 - p50 is given beside it."""
    try:
        pairs = sql(_P2P_SQL)
    except Exception:  # noqa: BLE001 -- a context without a comm_matrix table
        return None
    pairs = pairs[pairs["a"].isin(ridx) & pairs["b"].isin(ridx)]
    if pairs.empty:
        return None
    nbr: dict[int, set[int]] = {}
    for a, b in zip(pairs["a"].astype(int), pairs["b"].astype(int), strict=True):
        nbr.setdefault(a, set()).add(b)
        nbr.setdefault(b, set()).add(a)
    if any(len(v) > 2 for v in nbr.values()):
        return {"note": "send / receive links do not form chains of ranks: pipeline stages not inferred"}
    stage: dict[int, int] = {}
    for start in sorted(r for r, v in nbr.items() if len(v) == 1):
        if start in stage:
            continue
        prev, cur, k = -1, start, 0
        while cur not in stage:
            stage[cur] = k
            nxt = [x for x in nbr[cur] if x != prev]
            if not nxt:
                break
            prev, cur, k = cur, nxt[0], k + 1
    if len(set(stage.values())) < 2:
        return None
    slow = float(np.nanpercentile(own, 95) - np.nanpercentile(own, 50))
    rows: list[dict[str, Any]] = []
    for k in sorted(set(stage.values())):
        idx = [ridx[r] for r, s in stage.items() if s == k]
        o = own[idx]
        slack = float(np.nanmedian(T[idx] - o))
        delta = float(np.nanmedian(np.nanpercentile(o, 95, axis=1) - np.nanpercentile(o, 50, axis=1)))
        rows.append({"stage": k, "ranks": sorted(r for r, s in stage.items() if s == k), "slack_us": _r(slack),
                     "p95_excess_us": _r(delta), "step_increase_us": _r(max(0.0, slow - slack))})
    worst = max(rows, key=lambda x: (x["step_increase_us"], -x["slack_us"], -x["stage"]))
    return {"stages": rows, "most_sensitive_stage": worst["stage"], "slowdown_us": _r(slow),
            "basis": "stages are chains of send / receive links, numbered from the lower rank end; a slow rank "
                     "first fills the time its stage already waits on the others (its slack); the slowdown is the "
                     "pooled own time's p95 minus its p50, the same at every stage"}
