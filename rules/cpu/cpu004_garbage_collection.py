"""Python garbage collection pauses the training loop.

## Why it matters
CPython's cyclic collector stops the interpreter while it scans tracked objects; a full
(generation 2) collection in a process that has imported a deep-learning framework walks
hundreds of thousands of objects and takes tens to hundreds of milliseconds. The host launches
nothing meanwhile, so the device idles, and because collections come every few steps they show
up as step-time spikes. Hermes (§4.2.2, Table 2 and its 9,000-card MoE case) attributes 25 % of
its fluctuation cases to GC.

## How it is detected
GC pauses are host events named ``Python GC`` (Kineto with ``with_stack=True`` and
``experimental_config=_ExperimentalConfig(record_python_gc_info=True)``) or ``GC`` (torch_npu
``Python GC`` lane with ``gc_detect_threshold``). Per step: their count, total and longest
duration. The part of each pause that is a gap in the work is measured too: on device traces the
time the device was idle during the pause, on CPU-only traces the time no host operator ran. It
fires when the mean GC time per step is at least ``min_share`` of the mean step (GC is periodic,
so the mean over all steps, not the median, is the per-step cost). The saving is the mean
per-step pause time that was a gap (device idle, or on CPU-only traces the pause itself); where the
what-if replay of the steps without the pauses reproduces every step, the replayed saving instead.
Collections of at least ``long_gc_us`` are listed with their steps.

When no GC event is recorded the rule cannot tell "no GC" from "not recorded" and says so in a
warning on CPU-only traces with Python stacks.

## What to do
Call ``gc.freeze()`` after building the model and data pipeline, raise the thresholds
(``gc.set_threshold(100000, 50, 100)``), or ``gc.disable()`` and ``gc.collect()`` at safe points
(e.g. after a checkpoint, every N steps).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.cpu._common import covered_by_device_sql, fmt_ms, step_table, top_level_ops


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU004."""

    min_share: float = knob(0.02, "mean GC pause time per step, as a share of the mean step, that fires the rule",
                            "first principles: 2 % of the step; severity then follows CAUSES.md")
    long_gc_us: float = knob(10_000.0, "a single collection at least this long is listed (a full collection)",
                             "first principles: young collections take µs to ~1 ms; a full one in a framework process takes 10-100+ ms")


GC_NAMES = ("Python GC", "GC")

#: the counterfactual (advisor.stages.replay): no collection runs in the step (``gc.freeze()`` /
#: collections moved to safe points)
COUNTERFACTUAL = (Change("remove", Select(names=GC_NAMES, device=False)),)
ASSUMPTION = "if no Python GC pause ran in the step"

GC_SQL = """
SELECT count(*) AS n FROM event_names WHERE NOT device AND name IN (SELECT unnest($gc_names))
"""

SQL = f"""
WITH gc AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY rank, start_ns, dur_ns, pid, tid) AS id, rank, step, pid, tid, name, start_ns AS s, start_ns + dur_ns AS e, dur_ns
    FROM events WHERE NOT device AND name IN $gc_names AND step IS NOT NULL
),
{top_level_ops("e.rank IN (SELECT rank FROM gc)")},
dev AS ({covered_by_device_sql("gc")}),
ops AS (  -- time a host operator ran during the pause (same rank)
    SELECT g.id, coalesce(sum(least(g.e, o.end_ns) - greatest(g.s, o.start_ns)), 0) AS op_ns
    FROM gc g JOIN top_ops o ON o.rank = g.rank AND o.start_ns < g.e AND o.end_ns > g.s
    GROUP BY g.id
)
SELECT g.*, dev.busy_ns AS device_busy_ns, coalesce(ops.op_ns, 0) AS op_ns
FROM gc g JOIN dev USING (id) LEFT JOIN ops USING (id)
"""


@rule("CPU004", "cpu.garbage-collection", cause="cpu.garbage_collection",
      requires=("events", "steps", "breakdown"), thresholds=Thresholds,
      derived=("device_busy", "event_names"))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose GC pauses take a measurable share of the step."""
    params = {"gc_names": list(GC_NAMES)}
    df = ctx.df(SQL, params) if ctx.query(GC_SQL, params)[0]["n"] else None
    bd = step_table(ctx)
    if df is None or df.empty:
        has_py = ctx.scalar("SELECT count(*) FROM event_names WHERE kind = 'python'")
        if has_py:
            ctx.warn("no Python GC events recorded: GC pauses cannot be judged (Kineto: with_stack=True and "
                     "experimental_config=_ExperimentalConfig(record_python_gc_info=True); torch_npu: gc_detect_threshold)")
        return
    dev_ranks = ctx.device_ranks
    for rank, g in df.groupby("rank"):
        rank = int(rank)
        steps_r = bd[bd["rank"] == rank]
        g = g[g["step"].isin(steps_r["step"])]
        if steps_r.empty or g.empty:
            continue
        n_steps = len(steps_r)
        step_us = float(steps_r["step_us"].mean())
        gc_us = float(g["dur_ns"].sum()) / 1000.0 / n_steps
        share = gc_us / step_us if step_us else 0.0
        if rank in dev_ranks:
            gap = (g["dur_ns"] - g["device_busy_ns"]).clip(lower=0)
            basis = "mean per-step GC pause time during which the device was idle"
        else:
            gap = g["dur_ns"]
            basis = "mean per-step GC pause time (CPU-only trace: the training thread is stopped)"
        gap_us = float(gap.sum()) / 1000.0 / n_steps
        no_op = float((g["dur_ns"] - g["op_ns"]).clip(lower=0).sum()) / max(float(g["dur_ns"].sum()), 1.0)
        long = g[g["dur_ns"] >= ctx.t.long_gc_us * 1000]
        per_step = g.groupby("step")["dur_ns"].agg(["size", "sum", "max"])
        evidence = {
            "gc_us_per_step": round(gc_us, 1), "gc_share": round(share, 4), "min_share": ctx.t.min_share,
            "gc_events_per_step": round(len(g) / n_steps, 2), "gc_events": len(g),
            "longest_gc_us": round(float(g["dur_ns"].max()) / 1000.0, 1),
            "median_gc_us": round(float(g["dur_ns"].median()) / 1000.0, 1),
            "long_gcs": len(long), "long_gc_us": ctx.t.long_gc_us,
            "steps_with_long_gc": int(long["step"].nunique()),
            "gap_aligned_share": round(float(gap.sum()) / max(float(g["dur_ns"].sum()), 1.0), 4) if rank in dev_ranks
            else round(no_op, 4),
            "device_idle_during_gc_us_per_step": round(gap_us, 1) if rank in dev_ranks else None,
            "steps": n_steps, "step_us_mean": round(step_us, 1),
        }
        if share < ctx.t.min_share:
            continue
        longs = ""
        if len(long):
            longs = (f"; {len(long)} full collections of {fmt_ms(float(long['dur_ns'].min()) / 1000)}-"
                     f"{fmt_ms(float(long['dur_ns'].max()) / 1000)} in steps {', '.join(str(int(s)) for s in sorted(set(long['step'])))}")
        top = [{"step": int(s), "gc_events": int(r["size"]), "gc_us": round(float(r["sum"]) / 1000.0, 1),
                "longest_us": round(float(r["max"]) / 1000.0, 1),
                "step_us": round(float(steps_r.loc[steps_r["step"] == s, "step_us"].iloc[0]), 1)}
               for s, r in per_step.sort_values("sum", ascending=False).head(10).iterrows()]
        yield ctx.finding(
            title=f"Rank {rank} pauses for Python GC {fmt_ms(gc_us)} per step ({share:.0%} of {fmt_ms(step_us)}), "
            f"{len(g) / n_steps:.0f} collections per step{longs}",
            evidence=evidence, saving_us=gap_us, step_us=step_us, saving_basis=basis,
            ranks=[rank], steps=sorted({int(s) for s in (long["step"] if len(long) else g["step"])}),
            ops=sorted(set(g["name"])), top=top,
            replay=ctx.what_if(rank, COUNTERFACTUAL, ASSUMPTION, steps=[int(x) for x in steps_r["step"]]),
        )
