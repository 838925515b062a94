"""One communication group's collectives take much longer than the same collectives in the other groups.

## Why it matters
Data-parallel groups of one job run the same collectives on the same amount of data, so their
durations should agree (LLMPrism §IV-D cross-group diagnosis: "DP communication durations
across different DP groups should exhibit minimal variance"). A group that is consistently
slower points at the network under it — a congested or faulty switch, a bad link, a
misconfigured node — and, in synchronous training, holds back the whole job.

## How it is detected
From ``comm_ops`` rows that carry a ``group_name``: per group and step, the time the group's
ranks spend in each collective type (sum of operator durations per rank, median over the
group's ranks), then the median over steps. Groups seen on fewer than ``min_ranks_per_group``
ranks are left out (one rank's groups are its TP / DP / PP groups, not peers of each other).
Groups are compared only with groups of the same parallel kind (data-, tensor-, pipeline-parallel,
as advisor.stages.groups infers it from the traffic, "groups of one kind"), doing the same
collective type with the same number of ranks and a similar volume (bytes per step within
``max_bytes_ratio`` of the cohort median when sizes are known). Within a cohort of at least
``min_groups`` groups, a group is slow when its duration is above LLMPrism's mean + k·σ of a
clean baseline (forward search from the faster half of the groups) and above the baseline median
by ``min_excess_ratio``. Without group names, or with fewer than ``min_groups`` comparable groups,
the rule says so in the warnings instead of guessing.

The saving per step is the group's excess duration over the baseline median.

## What to do
Look at the switches, links and nodes under that group: port error counters, congestion,
ECMP/hash collisions, a node with a degraded NIC. Compare with cluster.slow_link findings for
links inside the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from rules.cluster._stats import forward_search, median


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU004."""

    k: float = knob(3.0, "a group is slow when its collective time is above baseline mean + k·σ",
                    "LLMPrism §IV-D k-sigma rule, k = 3")
    min_excess_ratio: float = knob(0.20, "the group's collective time must also exceed the baseline median by this fraction",
                                   "PRISM Fig. 5: inter-node collectives vary at the ms level; 20 % is beyond run-to-run noise")
    min_groups: int = knob(3, "fewest comparable groups", "LLMPrism cross-group diagnosis needs peers to compare; "
                           "with two groups an outlier cannot be told from the other group")
    min_ranks_per_group: int = knob(
        2, "groups seen on fewer ranks are not compared (a single rank's groups are different parallel dimensions)",
        "LLMPrism compares DP groups across ranks",
    )
    max_bytes_ratio: float = knob(1.25,
                                  "groups compared only when their bytes per step are within this factor of the cohort median",
                                  "first principles: same collective on the same volume")


SQL = """
WITH per_rank AS (
    SELECT group_name, op_type, rank, step, sum(dur_ns) / 1000.0 AS dur_us, sum(bytes) AS bytes
    FROM comm_ops
    WHERE group_name IS NOT NULL AND group_name <> '' AND step IS NOT NULL AND op_type IS NOT NULL
    GROUP BY ALL
),
per_step AS (
    SELECT group_name, op_type, step, median(dur_us) AS dur_us, median(bytes) AS bytes,
           count(DISTINCT rank) AS n_ranks
    FROM per_rank GROUP BY ALL
)
SELECT group_name, op_type, median(dur_us) AS dur_us, median(bytes) AS bytes, max(n_ranks) AS n_ranks,
       count(*) AS steps, list(step ORDER BY step) AS step_list,
       (SELECT list(DISTINCT rank ORDER BY rank) FROM per_rank r WHERE r.group_name = p.group_name) AS ranks
FROM per_step p GROUP BY group_name, op_type
ORDER BY op_type, group_name
"""


@rule("CLU004", "cluster.slow-group", cause="cluster.slow_group", requires=("comm_ops",), thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag groups whose collective time is an outlier among comparable groups."""
    rows = ctx.query(SQL)
    if not rows:
        ctx.warn("no communication operator carries a group name; slow-group comparison needs group names")
        return
    pg = ctx.parallel_groups()
    kinds = {str(g["name"]): str(g["kind"]) for g in pg["groups"]} if pg else {}
    cohorts: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if int(r["n_ranks"]) >= ctx.t.min_ranks_per_group:
            kind = kinds.get(str(r["group_name"])[:80], "")
            cohorts.setdefault((str(r["op_type"]), int(r["n_ranks"]), kind), []).append(r)
    compared = False
    for (op, n_ranks, kind), gs in sorted(cohorts.items()):
        sizes = [float(g["bytes"]) for g in gs if g["bytes"] is not None]
        if sizes:
            mb = median(sizes)
            gs = [g for g in gs if g["bytes"] is None or mb <= 0
                  or 1 / ctx.t.max_bytes_ratio <= float(g["bytes"]) / mb <= ctx.t.max_bytes_ratio]
        if len(gs) < ctx.t.min_groups:
            continue
        compared = True
        durs = [float(g["dur_us"]) for g in gs]
        fs = forward_search(durs, ctx.t.k, ctx.t.min_excess_ratio)
        for i in fs.outliers:
            g = gs[i]
            ranks = [int(x) for x in g["ranks"]]
            step_us = ctx.median_step_us(ranks)
            excess = durs[i] - fs.baseline_median
            yield ctx.finding(
                title=f"Slow {kind + ' ' if kind else ''}communication group {g['group_name']}: {op} takes {durs[i] / 1000:.2f} ms per step vs "
                f"{fs.baseline_median / 1000:.2f} ms in the other {len(gs) - 1} {kind + ' ' if kind else ''}groups of {n_ranks} ranks "
                f"({durs[i] / fs.baseline_median:.1f}×)",
                evidence={
                    "group_name": str(g["group_name"])[:80],
                    "op_type": op,
                    "group_kind": kind or None,
                    "group_us_median": round(durs[i], 1),
                    "baseline_us_median": round(fs.baseline_median, 1),
                    "baseline_std_us": round(fs.baseline_std, 1),
                    "threshold_us": round(fs.threshold, 1),
                    "groups_compared": len(gs),
                    "ranks_per_group": n_ranks,
                    "bytes_per_step": None if g["bytes"] is None else int(g["bytes"]),
                    "k": ctx.t.k,
                    "min_excess_ratio": ctx.t.min_excess_ratio,
                },
                saving_us=excess,
                step_us=float(step_us) if step_us else None,
                saving_basis="the group's median per-step collective time beyond the baseline median of comparable groups",
                ranks=ranks,
                steps=[int(s) for s in g["step_list"]],
                ops=[f"{op}@{g['group_name']}"],
                top=[{"group_name": x["group_name"], "dur_us": round(float(x["dur_us"]), 1)} for x in gs][:20],
            )
    if not compared:
        ctx.warn(f"fewer than {ctx.t.min_groups} comparable communication groups (same collective, same size, seen on "
                 f"≥ {ctx.t.min_ranks_per_group} ranks); "
                 "cross-group comparison not possible")
