"""One operator makes the step time vary (PRISM's variance decomposition).

## Why it matters
In synchronous training every step waits for its slowest rank, so the step time is the maximum
over ranks of each rank's time, itself a sum of operator times (PRISM). The spread of one
operator, across steps or across ranks, becomes spread of the step, and the maximum over more
ranks pulls the step towards that operator's tail: the mean step grows with the cluster even
when no single rank is slow. PRISM finds that a few kernels (collectives such as AllGather and
ReduceScatter, some GEMMs) carry most of the variability, and that steadying them is the way to
a predictable step time.

## How it is detected
The variability model (``advisor/variability.py``) takes each rank's own time per step
(its step time minus the time it waits in collectives for slower peers) and composes the
cluster's step as the maximum over ranks through the product of their empirical CDFs. Each
operator is then held at its median on every rank and step: the share of the step-time
variance that goes away is its contribution (with one rank: its covariance with the step time,
the series decomposition). A finding is raised when the step time varies materially (its p95
at least ``min_spread`` above the median, over at least five steps) and one operator explains
at least ``min_share`` of that variance.

The saving is the drop of the expected step time when that operator is held at its median
(with one rank: its mean minus its median), never more than the median step.

The operator's **spikes** are the steps it makes slow: the step time is more than ``min_spread``
above its median, and on the rank the step waits for (the largest own time) the operator is above
its own median by at least half the step's excess (``evidence["op_spike_steps"]``; the 20 largest
in ``top``, with that rank). They link the finding: it explains a step fluctuation (CLU003) whose slow steps are mostly
spikes, and a rank slow in those steps (CLU005) explains it, in part when the operator also
varies elsewhere.

## What to do
Look at why that operator's time varies: for a collective, the links and switches of its group
and what shares them (other jobs, concurrent traffic); for a kernel, the ranks where it is
slower (thermal or power limits, clocks, a different input size per step), and dynamic shapes
that change its work from step to step. Keep the slowest ranks of a synchronised group on the
steadiest nodes: the report's slowdown-at-scale table shows what the spread costs at more ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor import variability
from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for VAR001."""

    min_spread: float = knob(0.10, "the step's p95 must exceed its median by this fraction",
                             "Hermes §5.2.1 counts step-time fluctuations exceeding 10 %")
    min_share: float = knob(0.5, "share of the step-time variance one operator must explain",
                            "first principles: 'most of the variance' is more than half of it")


@rule("VAR001", "variability.operator", cause="cluster.operator_variability", scope="cluster",
      requires=("breakdown", "multi_step"), thresholds=Thresholds, derived=("op_step_stats",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """The operator that explains most of a materially varying step time."""
    if not ctx.scalar("SELECT count(*) FROM op_step_stats WHERE step >= 0"):
        return  # no operator inside a step window: nothing to decompose
    # the same result as the report's section (one computation per analysis, whichever asks first)
    cells: dict[str, Any] = ctx.once(variability.CELLS_KEY, dict)
    v = ctx.once("variability", lambda: variability.compute(ctx.breakdown(), ctx.df, cells))
    if not v or not v.get("ops") or v.get("steps", 0) < variability.MIN_STEPS:
        return
    st = v.get("step_time") or {}
    p50, p95, mean = st.get("p50_us"), st.get("p95_us"), st.get("mean_us")
    if not p50 or not p95 or not mean or p95 < (1.0 + ctx.t.min_spread) * p50:
        return
    op = v["ops"][0]
    parallel = "parallel_share" in op
    share = float(op.get("parallel_share", op.get("series_share")) or 0.0)
    if share < ctx.t.min_share:
        return
    saving = float(op.get("mean_drop_us") or 0.0) if parallel else max(0.0, op["mean_us"] - op["p50_us"])
    saving = min(saving, p50)
    label = f"{op['name']} in group {op['group']}" if op.get("group") else op["name"]
    spread = p95 / p50 - 1.0
    title = (f"Step time varies (p95 {spread:.0%} above the median): {share:.0%} of the variance comes from "
             f"{label} ({op['kind']})")
    evidence = {
        "operator": op["name"], "kind": op["kind"], "group": op.get("group"),
        "variance_share": round(share, 4), "decomposition": "parallel" if parallel else "series",
        "step_p50_us": p50, "step_p95_us": p95, "step_mean_us": mean, "steps": v.get("steps"), "ranks": v.get("ranks"),
        "op_p5_us": op.get("p5_us"), "op_p50_us": op.get("p50_us"), "op_p95_us": op.get("p95_us"),
        "op_sigma_us": op.get("sigma_us"), "op_temporal_sigma_us": op.get("temporal_sigma_us"),
        "op_spatial_sigma_us": op.get("spatial_sigma_us"), "op_slowest_rank": op.get("slowest_rank"),
        "min_spread": ctx.t.min_spread, "min_share": ctx.t.min_share,
    }
    if parallel:
        evidence["p95_drop_us"] = op.get("p95_drop_us")
    spikes = variability.spikes(cells, ctx.t.min_spread)
    evidence["op_spike_steps"] = ", ".join(str(x["step"]) for x in spikes)
    yield ctx.finding(
        title=title,
        detail=("Held at its median on every rank and step, the step's p95 would drop by "
                f"{op.get('p95_drop_us', 0.0) / 1000:.2f} ms." if parallel else
                "With one rank, the share is the operator's covariance with the step time across steps."),
        evidence=evidence,
        saving_us=saving,
        step_us=mean,
        saving_basis=("drop of the expected step time (the maximum over ranks, product of their CDFs) when the "
                      "operator is held at its median" if parallel else "the operator's mean minus its median"),
        ops=[op["name"]],
        ranks=sorted({int(r) for r in ctx.breakdown()["rank"]}),  # the maximum over ranks: every rank takes part
        top=sorted(spikes, key=lambda x: -x["op_excess_us"])[:20],
    )
