"""The host cannot issue operators fast enough: many tiny operators, per-operator overhead dominates.

## Why it matters
Every operator costs the host a fixed amount of Python, dispatcher and launch work (several µs
in eager PyTorch) whatever its size. With many small operators that fixed cost, not the math,
sets the step time: on a device the kernels finish faster than the host launches them and the
device idles between them; on a CPU-only run the time goes to the gaps between operators and to
operators whose body is shorter than their overhead. Hermes (Table 2) lists "excessive dispatch"
among the CPU causes and recommends operator fusion.

## How it is detected
*With a device* (per step): the device-idle gaps between consecutive busy periods that are
shorter than ``max_gap_us`` (the device waits a launch's time for its next kernel, as opposed to
long pauses for data or syncs), the share of kernels shorter than ``short_kernel_us``, and the
host launch (runtime API) time against the kernel time. It fires when those short idle gaps are
at least ``min_idle_share`` of the step (median over steps) and either the launch time is at
least ``launch_ratio`` × the kernel time or at least ``min_short_share`` of the kernels are
short. Saving: the median per-step time in those short gaps. It is not replayed: the gaps close
only if the host issues the kernels faster, by an amount the trace does not give (which operators
fusion would merge is not recorded); the finding says so, and CPU007 replays the host's side.

*CPU-only* (per step, top-level host operators on each thread): the operator count, the share
shorter than ``short_op_us`` and the per-operator overhead = time in those short operators plus
the gaps shorter than ``max_gap_us`` between consecutive operators (Python and dispatch between
calls; longer gaps are other Python work, sleeps or GC and are left to other rules). It fires
when that overhead is at least ``min_idle_share`` of the step (median over steps) and at least
``min_short_share`` of the operators are short. Saving: the median per-step overhead, an upper
bound on what fusing those operators can give back; where the what-if replay reproduces every step,
the replayed saving instead, with those short top-level operators taking no time and those short
gaps closed.

## What to do
Fuse operators: fused optimizers (``foreach`` / ``fused=True``), fused norms and attention,
``torch.compile`` or graph mode; vectorise Python loops over tensors; make each operator do
more work (larger batches, merged small tensors).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import SupportsInt, cast

import pandas as pd

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.cpu._common import fmt_ms, step_join, step_table, top_level_ops


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU002."""

    short_op_us: float = knob(10.0, "a host operator (CPU-only) shorter than this is mostly overhead",
                              "first principles: eager PyTorch spends several µs per operator in Python and the dispatcher")
    short_kernel_us: float = knob(10.0, "a device kernel shorter than this finishes faster than a typical launch",
                                  "CUDA / AscendCL launch calls take about 5-10 µs of host time each")
    max_gap_us: float = knob(50.0, "idle gaps shorter than this between operators / kernels count as dispatch overhead",
                             "first principles: a few launches' time; longer gaps are data waits, syncs or Python work")
    min_idle_share: float = knob(0.10, "median share of the step lost to dispatch overhead (short gaps, short ops) that fires the rule",
                                 "CAUSES.md: 10 % of the step is the 'high' severity cut")
    min_short_share: float = knob(0.5, "share of operators / kernels that are short (at least half)",
                                  "first principles: the step must be made of mostly tiny operators")
    launch_ratio: float = knob(1.0, "host launch time >= this x kernel time means the host cannot keep up",
                               "CAUSES.md cpu.operator_dispatch: launch/dispatch time >= kernel time")


#: why the device form is not replayed
DEVICE_NOT_REPLAYED = ("the short gaps between kernels close only if the host issues the kernels faster, by an amount "
                       "the trace does not give (which operators fusion would merge, and what the merged ones cost the "
                       "host, is not recorded); CPU007 replays the host's side where it fires")


def cpu_counterfactual(t: Thresholds) -> tuple[Change, ...]:
    """The per-operator overhead gone: the top-level host operators shorter than ``short_op_us`` take no
    time, and the gaps shorter than ``max_gap_us`` before top-level operators close."""
    top = Select(kinds=("host_op",), device=False, outermost=True)
    short = Select(kinds=("host_op",), device=False, outermost=True, max_dur_ns=int(t.short_op_us * 1000))
    return (Change("remove", short), Change("scale_gaps", top, value=0.0, max_gap_ns=int(t.max_gap_us * 1000)))


CPU_SQL = f"""
WITH {top_level_ops("e.rank IN (SELECT unnest($ranks))")},
g AS (
    SELECT *, start_ns - lag(end_ns) OVER (PARTITION BY rank, tid, step ORDER BY start_ns) AS gap_ns FROM top_ops
)
SELECT rank, step, count(*) AS n_ops,
       count(*) FILTER (WHERE dur_ns < $short_op_us * 1000) AS n_short,
       coalesce(sum(dur_ns) FILTER (WHERE dur_ns < $short_op_us * 1000), 0) / 1000.0 AS short_us,
       coalesce(sum(gap_ns) FILTER (WHERE gap_ns > 0 AND gap_ns < $max_gap_us * 1000), 0) / 1000.0 AS gap_us,
       median(dur_ns) / 1000.0 AS median_op_us
FROM g WHERE step >= -1 GROUP BY rank, step
"""

DEVICE_SQL = """
WITH gaps AS (
    SELECT rank, e AS gap_start, next_s - e AS gap_ns FROM device_busy  -- next_s: the next period's start
),
gap_step AS (
    SELECT g.rank, s.step, sum(g.gap_ns) FILTER (WHERE g.gap_ns < $max_gap_us * 1000) / 1000.0 AS short_gap_us,
           count(*) FILTER (WHERE g.gap_ns < $max_gap_us * 1000) AS n_short_gaps
    FROM gaps g {step_join}
    WHERE g.gap_ns > 0 AND g.gap_start < s.end_ns GROUP BY ALL
),
k AS (
    SELECT rank, step, count(*) AS n_kernels, count(*) FILTER (WHERE dur_ns < $short_kernel_us * 1000) AS n_short,
           sum(dur_ns) / 1000.0 AS kernel_us, median(dur_ns) / 1000.0 AS median_kernel_us
    FROM events WHERE device AND kind = 'kernel' AND step IS NOT NULL GROUP BY ALL
),
l AS (
    SELECT rank, step, count(*) AS n_launch, sum(dur_ns) / 1000.0 AS launch_us
    FROM events WHERE NOT device AND kind = 'runtime' AND step IS NOT NULL GROUP BY ALL
)
SELECT k.*, coalesce(l.n_launch, 0) AS n_launch, coalesce(l.launch_us, 0) AS launch_us,
       coalesce(g.short_gap_us, 0) AS short_gap_us, coalesce(g.n_short_gaps, 0) AS n_short_gaps
FROM k LEFT JOIN l USING (rank, step) LEFT JOIN gap_step g USING (rank, step)
"""


@rule("CPU002", "cpu.operator-dispatch", cause="cpu.operator_dispatch",
      requires=("events", "steps", "breakdown"), thresholds=Thresholds, derived=("device_busy",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose steps are dominated by per-operator overhead."""
    bd = step_table(ctx)[["rank", "step", "step_us"]]
    dev_ranks = ctx.device_ranks
    if dev_ranks:
        dev = ctx.df(DEVICE_SQL.format(step_join=step_join(ctx, "g", "gap_start")))
        dev = dev[dev["rank"].isin(dev_ranks)].merge(bd, on=["rank", "step"])
        yield from _device(ctx, dev)
    cpu_ranks = sorted({int(r) for r in bd["rank"]} - dev_ranks)
    if cpu_ranks:  # operator overhead is judged on the host only where there is no device
        cpu = ctx.df(CPU_SQL, {"ranks": cpu_ranks}).merge(bd, on=["rank", "step"])
        yield from _cpu_only(ctx, cpu)


def _candidates(df: pd.DataFrame, part: str, minimum: float) -> pd.DataFrame:
    """The rows of the ranks whose median per-step share ``part / step_us`` is not below
    ``minimum`` (a NaN median is kept, as the per-rank test keeps it): one grouped median
    instead of a DataFrame per rank for every rank (1,024 ranks: ~0.3 s)."""
    med = (df[part] / df["step_us"]).groupby(df["rank"]).median()
    return df[df["rank"].isin(med.index[~(med < minimum)])]


def _device(ctx: RuleContext[Thresholds], df: pd.DataFrame) -> Iterator[Finding]:
    for rank, g in _candidates(df, "short_gap_us", ctx.t.min_idle_share).groupby("rank"):
        idle_share = float((g["short_gap_us"] / g["step_us"]).median())
        short_share = float(g["n_short"].sum() / max(g["n_kernels"].sum(), 1))
        launch_over_kernel = float(g["launch_us"].sum() / g["kernel_us"].sum()) if g["kernel_us"].sum() else None
        host_bound = (launch_over_kernel is not None and launch_over_kernel >= ctx.t.launch_ratio) or short_share >= ctx.t.min_short_share
        if idle_share < ctx.t.min_idle_share or not host_bound:
            continue
        saving = float(g["short_gap_us"].median())
        step_us = float(g["step_us"].median())
        yield ctx.finding(
            title=f"Rank {rank} is launch-bound: the device idles {idle_share:.0%} of each step in short gaps between kernels "
            f"({fmt_ms(saving)} of {fmt_ms(step_us)}); {g['n_kernels'].median():.0f} kernels per step, {short_share:.0%} shorter than "
            f"{ctx.t.short_kernel_us:g} µs, launch time {launch_over_kernel or 0:.2f}x kernel time",
            evidence={
                "short_gap_share": round(idle_share, 4), "min_idle_share": ctx.t.min_idle_share,
                "short_gap_us_median": round(saving, 1), "max_gap_us": ctx.t.max_gap_us,
                "kernels_per_step": float(g["n_kernels"].median()),
                "short_kernel_share": round(short_share, 4), "short_kernel_us": ctx.t.short_kernel_us,
                "min_short_share": ctx.t.min_short_share,
                "median_kernel_us": round(float(g["median_kernel_us"].median()), 2),
                "launch_over_kernel": None if launch_over_kernel is None else round(launch_over_kernel, 3),
                "launch_ratio": ctx.t.launch_ratio,
                "step_us_median": round(step_us, 1), "steps": len(g),
            },
            saving_us=saving, step_us=step_us,
            saving_basis="median per-step device idle time in gaps shorter than max_gap_us between kernels",
            ranks=[int(cast(SupportsInt, rank))], steps=[int(s) for s in g["step"]],
            replay={"estimated": False, "reason": DEVICE_NOT_REPLAYED},
        )


def _cpu_only(ctx: RuleContext[Thresholds], df: pd.DataFrame) -> Iterator[Finding]:
    df = df.assign(_overhead=df["short_us"] + df["gap_us"])
    for rank, g in _candidates(df, "_overhead", ctx.t.min_idle_share).groupby("rank"):
        overhead = g["_overhead"]
        share = float((overhead / g["step_us"]).median())
        short_share = float(g["n_short"].sum() / max(g["n_ops"].sum(), 1))
        if share < ctx.t.min_idle_share or short_share < ctx.t.min_short_share:
            continue
        saving = float(overhead.median())
        step_us = float(g["step_us"].median())
        yield ctx.finding(
            title=f"Rank {rank} is dispatch-bound: {g['n_ops'].median():.0f} operators per step, {short_share:.0%} shorter than "
            f"{ctx.t.short_op_us:g} µs; per-operator overhead is {share:.0%} of the step ({fmt_ms(saving)} of {fmt_ms(step_us)})",
            evidence={
                "overhead_share": round(share, 4), "min_idle_share": ctx.t.min_idle_share,
                "overhead_us_median": round(saving, 1),
                "ops_per_step": float(g["n_ops"].median()),
                "short_op_share": round(short_share, 4), "short_op_us": ctx.t.short_op_us,
                "min_short_share": ctx.t.min_short_share,
                "median_op_us": round(float(g["median_op_us"].median()), 3),
                "short_ops_us_median": round(float(g["short_us"].median()), 1),
                "short_gaps_us_median": round(float(g["gap_us"].median()), 1), "max_gap_us": ctx.t.max_gap_us,
                "step_us_median": round(step_us, 1), "steps": len(g),
            },
            saving_us=saving, step_us=step_us,
            saving_basis="median per-step time in operators shorter than short_op_us plus gaps shorter than max_gap_us "
            "between top-level operators (CPU-only trace)",
            ranks=[int(cast(SupportsInt, rank))], steps=[int(s) for s in g["step"]],
            replay=ctx.what_if(int(cast(SupportsInt, rank)), cpu_counterfactual(ctx.t),
                               f"if the top-level operators shorter than {ctx.t.short_op_us:g} µs took no time and the "
                               f"gaps shorter than {ctx.t.max_gap_us:g} µs between top-level operators closed "
                               "(fused operators)", steps=[int(s) for s in g["step"]]),
        )
