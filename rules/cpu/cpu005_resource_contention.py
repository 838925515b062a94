"""Other processes steal the host CPU: the same operators run much slower in some steps.

## Why it matters
The training process shares its cores with whatever else runs on the node: monitoring agents
(Hermes names Prometheus), other jobs, data preprocessing bound to the same cores. When they
compete, every host operator, launch and Python statement slows down at once, and the device
waits. Hermes (Table 2) checks the CPU usage of common processes; a profile has no per-process
CPU usage, but it shows the symptom.

## How it is detected
Two symptoms, each a finding of its own.

**Stalls** (preemption). A thread that another process takes the CPU from loses whole scheduler
slices, milliseconds at a time, inside whatever call it was running: one call's *own* time (its
duration less what is nested in it) jumps far beyond what the same call takes in the other steps.
Host calls (operators, and Python functions and ``record_function`` ranges where operators stalled
too) are compared with the same work: the same thread, name and input shapes and the same occurrence
in the step (:mod:`rules.cpu._stalls`). A call stalled when its own time exceeds that median by
``min_stall_us`` to ``max_stall_us`` and is at least ``stall_ratio`` times it. Calls inside a
data-loader fetch or a compile (CPU001's compile events), overlapping a recorded GC event, in a
warm-up step (the first of a profiling cycle: page faults on first touch, allocator growth, lazy
initialisation; or one whose compiles take ``min_excess_ratio`` of the median step, as CLU003's), during which another thread of the
process ran (a lock, a hand-off) or that may have waited for the device are not judged, and counted in
the evidence. The finding fires when the stalled time per step is at least ``min_stall_share`` of the
mean step; its steps are the *contended* ones: above the calm steps' median (the median of the faster
half of the steps) by ``min_excess_ratio`` with at least ``min_stalled_share`` of that extra time in
stalls (all the steps with stalls where none is). The saving is the replayed step with every stalled
call at its usual own time (what-if replay), else the stalled time averaged over all steps. A step
fluctuation (CLU003) or an operator's variability (VAR001) in those steps is explained by it: the
machine, not the job, made the steps slow.

**Broad slowdown.** Host operators are compared with themselves: for each host operator with recorded
input shapes (``record_shapes=True``; operators without shapes, such as autograd nodes, may do
different work in different steps and are left out), keyed by name and input shapes, its time per step is compared with
the time its calls in that step take at its own median time per call over the steps it appears
in (at least ``min_steps``): a step that runs an operator more often (more layers, more
micro-batches: 18 ``conv2d`` calls instead of 2) does more work, which is not contention, so
the comparison is per call. A step is *contended* when, over the keys it runs, the time is at
least ``slow_ratio`` x the keys' medians **and** keys holding at least ``min_key_share`` of that (median) time, at least
``min_slowed_keys`` distinct ones, are each that much slower (a step must share at least
``min_keys`` keys with the others, and those keys must take at least ``min_covered_share`` of the
step): a broad slowdown of unrelated operators doing the same work
as in the other steps, unlike one slow operator. Short operators often escape (they fit in a
scheduler time slice), so the share is weighted by time, not by count. The saving is the time
the contended steps took beyond the median of the other steps (at most the compared operators'
extra time), averaged over all steps.

Steps whose extra time is mostly stalls are left to the stall finding.

Thread CPU time against wall time would prove either directly, but neither Kineto nor the Ascend
exports carry it per thread; the rule says what it measured and warns that the cause of the
slowdown (another process, CPU binding, frequency scaling) is inferred, not observed.

## What to do
Find what else runs on the node during the slow steps (``top``/``pidstat``), stop or move it,
and bind each rank to its own NUMA node's cores (``numactl``/``taskset``) with
``OMP_NUM_THREADS`` sized to them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.cpu import _stalls
from rules.cpu._common import fmt_ms, step_table


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CPU005."""

    slow_ratio: float = knob(1.5, "operator time in a step / its median over steps that counts as slowed",
                             "first principles: a competing busy process on the same cores halves the CPU share (~2x); 1.5x leaves margin for noise")
    min_key_share: float = knob(0.5, "share of a step's operator time (at the keys' medians) in keys that are slowed (a broad slowdown)",
                                "first principles: contention slows most of the work, a single slow op does not")
    min_slowed_keys: int = knob(2, "distinct operator keys that must be slowed in a contended step",
                                "first principles: one slow operator is that operator's problem, not the host's")
    min_keys: int = knob(5, "operator keys (name + shapes) a step must share with the others to be judged",
                         "first principles: enough unrelated operators to call a slowdown broad")
    min_covered_share: float = knob(0.2, "the compared operators must take at least this share of the contended step",
                                    "first principles: the slowdown must explain the step, not a corner of it")
    min_steps: int = knob(3, "steps an operator key must appear in to have a median",
                          "first principles: a median needs at least three points")
    min_stall_us: float = knob(1000.0, "a call's own time over its usual own time (same work) that is a stall",
                               "first principles: a descheduled thread waits at least a scheduler slice (a tick is "
                               "1-10 ms; CFS/EEVDF slices 0.75-24 ms)")
    max_stall_us: float = knob(20_000.0, "a longer jump of a call's own time is not counted as a stall",
                               "first principles: a few scheduler slices; longer pauses are a sleep, a full GC, I/O")
    stall_ratio: float = knob(2.0, "a stalled call's own time is at least this many times its usual own time",
                              "first principles: beyond the noise of the same work, which varies by tens of percent")
    release_us: float = knob(50.0, "on device ranks, a call ending this soon after a device task ended may have "
                                   "waited for it (not judged)",
                             "first principles: a host thread woken by a device completion resumes within tens of µs")
    min_stall_share: float = knob(0.02, "stalled time per step, as a share of the mean step, that fires the stall finding",
                                  "first principles: 2 % of the step; severity then follows CAUSES.md")
    min_stalled_share: float = knob(0.5, "share of a slow step's extra time (over the median step) in stalls that makes "
                                         "it a contended step",
                                    "first principles: most of the extra time")
    min_excess_ratio: float = knob(0.10, "a step is slow when above the median step by this fraction; a step whose "
                                         "compiles take this fraction of the median step is warm-up (not judged)",
                                   "Hermes §5.2.1 counts step-time fluctuations exceeding 10 % (as CLU003)")


KEYS = """
WITH ks AS (  -- each operator key (name, input shapes holding a number: tensors) once, numbered, so that the
              -- per-step and median aggregates group integers, not texts (shapes tested once per distinct key)
    SELECT name, shapes, row_number() OVER () AS kid
    FROM (SELECT DISTINCT name, shapes FROM events WHERE kind = 'host_op' AND NOT device AND step >= 0)
    WHERE regexp_matches(coalesce(shapes, ''), '\\d')
),
j AS MATERIALIZED (  -- materialized: keeps DuckDB from pushing the per-step sum below the join, onto the texts
    SELECT e.rank, e.step, ks.kid, e.dur_ns
    FROM events e JOIN ks ON e.name = ks.name AND e.shapes = ks.shapes
    WHERE e.kind = 'host_op' AND NOT e.device AND e.step >= 0
),
k AS (SELECT rank, step, kid, sum(dur_ns) AS dur_ns, count(*) AS calls FROM j GROUP BY ALL),
med AS (  -- the key's median time per call over the steps it runs in
    SELECT rank, kid, median(dur_ns / calls) AS call_ns, count(*) AS n_steps
    FROM k GROUP BY ALL HAVING count(*) >= $min_steps
),
keyed AS (  -- med_ns: what the step's calls of the key take at that median (the same work, unslowed)
    SELECT k.rank, k.step, ks.name, ks.shapes, k.dur_ns, m.call_ns * k.calls AS med_ns,
           k.dur_ns >= $slow_ratio * m.call_ns * k.calls AS slowed
    FROM k JOIN med m USING (rank, kid) JOIN ks USING (kid)
)"""

# per (rank, step): the operator keys compared, how many ran slowed, their time and the time of the same
# calls at the keys' median time per call
SQL = KEYS + """
SELECT rank, step, count(*) AS n_keys, count(*) FILTER (WHERE slowed) AS slowed, sum(dur_ns)::DOUBLE AS dur,
       sum(med_ns) AS med, coalesce(sum(med_ns) FILTER (WHERE slowed), 0.0) AS slowed_med
FROM keyed GROUP BY rank, step ORDER BY rank, step
"""

# the compared operators of some steps of a rank, slowest against their median first
WORST_SQL = KEYS + """
SELECT name, dur_ns / med_ns AS r FROM keyed WHERE rank = $rank AND step IN (SELECT unnest($steps))
ORDER BY isnan(r), r DESC, step, name, shapes
"""


@rule("CPU005", "cpu.resource-contention", cause="cpu.resource_contention",
      requires=("events", "steps", "breakdown", "multi_step"), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Per rank: a finding for its host calls stalled by a scheduler slice (preemption), and one for steps in
    which most operators run much slower than their own median (broad slowdown)."""
    bd = step_table(ctx)
    found = _stalls.find(ctx, min_steps=ctx.t.min_steps, min_stall_us=ctx.t.min_stall_us,
                         max_stall_us=ctx.t.max_stall_us, stall_ratio=ctx.t.stall_ratio, release_us=ctx.t.release_us,
                         compile_share=ctx.t.min_excess_ratio, broad_share=ctx.t.min_key_share,
                         med_step={int(str(r)): float(g.median()) for r, g in bd.groupby("rank")["step_us"]})
    # rank -> its steps whose extra time is mostly stalls (the stall finding's, not the broad slowdown's)
    stalled = {rank: _contended(ctx, st.calls, bd[bd["rank"] == rank])[0] for rank, st in found.items()}
    broad = list(_broad(ctx, bd, stalled))
    for rank, st in sorted(found.items()):
        # the steps a broad slowdown holds (one that cost time): their extra time, stalls included, is that finding's
        held = {s for f in broad if rank in f.ranks and (f.estimated_saving_us or 0.0) > 0 for s in f.steps}
        f = _stall_finding(ctx, st, bd[bd["rank"] == rank], held)
        if f is not None:
            yield f
    yield from broad


def _broad(ctx: RuleContext[Thresholds], bd: pd.DataFrame, stalled: dict[int, list[int]]) -> Iterator[Finding]:
    """The broad-slowdown findings (see the module doc), leaving out the ``stalled`` steps of each rank."""
    df = ctx.df(SQL)
    if df.empty:
        if not ctx.scalar("SELECT count(*) FROM events WHERE kind = 'host_op' AND shapes IS NOT NULL AND shapes NOT IN ('', '[]')"):
            ctx.warn("no operator input shapes recorded (record_shapes=True): operators cannot be compared with themselves "
                     "doing the same work, so a broad slowdown is not judged")
        return
    df = df[[int(s) not in stalled.get(int(r), []) for r, s in zip(df["rank"], df["step"], strict=True)]]
    # the conditions that need no step time first: where no step meets them, none is contended
    with np.errstate(divide="ignore", invalid="ignore"):
        dur, med = df["dur"].to_numpy(np.float64), df["med"].to_numpy(np.float64)
        if not ((dur / med >= ctx.t.slow_ratio) & (df["slowed_med"].to_numpy(np.float64) / med >= ctx.t.min_key_share)
                & (df["n_keys"].to_numpy() >= ctx.t.min_keys) & (df["slowed"].to_numpy() >= ctx.t.min_slowed_keys)).any():
            return
    df = df.merge(bd[["rank", "step", "step_us"]], on=["rank", "step"], how="left")
    df["ratio"] = df["dur"] / df["med"]
    df["key_share"] = df["slowed_med"] / df["med"]
    df["covered"] = df["dur"] / 1000.0 / df["step_us"]
    df["hot"] = ((df["ratio"] >= ctx.t.slow_ratio) & (df["key_share"] >= ctx.t.min_key_share)
                 & (df["n_keys"] >= ctx.t.min_keys) & (df["slowed"] >= ctx.t.min_slowed_keys)
                 & (df["covered"] >= ctx.t.min_covered_share))
    cols = ["n_keys", "slowed", "dur", "med", "slowed_med", "ratio", "key_share", "step_us", "covered"]
    for rank, g in df[df["rank"].isin(df.loc[df["hot"], "rank"])].groupby("rank"):
        rank = int(rank)
        steps_r = bd[bd["rank"] == rank]
        per = g.set_index("step")
        hot = per.loc[per["hot"], cols]
        per = per[cols]
        n_steps = max(len(steps_r), 1)
        calm = steps_r[~steps_r["step"].isin(hot.index)]["step_us"]
        base_us = float(calm.median()) if len(calm) else float(steps_r["step_us"].min())
        # a step cannot lose more to contention than its compared operators' extra time
        extra_us = sum(min(max(float(su) - base_us, 0.0), float(d - m) / 1000.0)
                       for su, d, m in zip(hot["step_us"], hot["dur"], hot["med"], strict=True))
        saving = extra_us / n_steps
        step_us = float(steps_r["step_us"].mean())
        worst = ctx.df(WORST_SQL, {"rank": rank, "steps": [int(s) for s in hot.index]})
        top = [{"step": int(s), "op_time_ratio": round(float(r["ratio"]), 2), "slowed_key_share": round(float(r["key_share"]), 3),
                "op_extra_us": round(float(r["dur"] - r["med"]) / 1000.0, 1),
                "step_us": round(float(steps_r.loc[steps_r["step"] == s, "step_us"].iloc[0]), 1) if (steps_r["step"] == s).any() else None}
               for s, r in hot.sort_values("ratio", ascending=False).iterrows()]
        ctx.warn(f"rank {rank}: operators ran {float(hot['ratio'].median()):.1f}x slower than their own median in "
                 f"{len(hot)} steps; the trace has no per-thread CPU time, so competing processes are inferred, not observed")
        yield ctx.finding(
            title=f"Rank {rank}: host operators run {float(hot['ratio'].median()):.1f}x slower than their own median in "
            f"{len(hot)} of {n_steps} steps ({float(hot['key_share'].median()):.0%} of operator time in slowed operators); "
            f"those steps took {fmt_ms(extra_us)} longer than the others' median in total",
            evidence={
                "contended_steps": len(hot), "steps": n_steps,
                "op_time_ratio_median": round(float(hot["ratio"].median()), 3), "slow_ratio": ctx.t.slow_ratio,
                "slowed_key_share_median": round(float(hot["key_share"].median()), 3), "min_key_share": ctx.t.min_key_share,
                "keys_compared_median": float(per["n_keys"].median()), "min_keys": ctx.t.min_keys,
                "extra_step_us_total": round(extra_us, 1), "extra_us_per_step": round(saving, 1),
                "calm_step_us_median": round(base_us, 1),
                "step_us_mean": round(step_us, 1),
                "other_steps_ratio_median": round(float(per.drop(hot.index)["ratio"].median()), 3) if len(per) > len(hot) else None,
            },
            saving_us=saving, step_us=step_us,
            saving_basis="time the contended steps took over the median of the other steps, averaged over all steps",
            ranks=[rank], steps=[int(s) for s in hot.index], ops=list(dict.fromkeys(worst["name"]))[:5], top=top,
        )


STALL_ASSUMPTION = "if no host call stalled: each stalled call takes its usual own time for the same work"


def _contended(ctx: RuleContext[Thresholds], calls: pd.DataFrame, steps_r: pd.DataFrame) -> tuple[list[int], float]:
    """The steps whose extra time over the calm steps' median is mostly stalls, and that median (µs)."""
    if steps_r.empty:
        return [], 0.0
    per_step: dict[int, float] = {}
    if len(calls):
        sums = calls.groupby("step")["excess_ns"].sum()
        per_step = {int(s): float(v) / 1000.0 for s, v in zip(sums.index.tolist(), sums.tolist(), strict=True)}
    # the calm steps' median: the median of the faster half of the steps (up to half of them may be slow)
    times = sorted(float(x) for x in steps_r["step_us"])
    half = times[: max(len(times) // 2, 1)]
    if any(math.isnan(x) for x in half):
        med = float(pd.Series(half).median())
    else:  # as pandas': the mean of the two middle values for an even count
        k = len(half) // 2
        med = half[k] if len(half) % 2 else (half[k - 1] + half[k]) / 2
    out = []
    for s, su in zip(steps_r["step"], steps_r["step_us"], strict=True):
        extra = float(su) - med
        if extra >= ctx.t.min_excess_ratio * med and per_step.get(int(s), 0.0) >= ctx.t.min_stalled_share * extra:
            out.append(int(s))
    return out, med


def _stall_finding(ctx: RuleContext[Thresholds], st: _stalls.Stalls, steps_r: pd.DataFrame,
                   held: set[int]) -> Finding | None:
    """The rank's preemption stalls as one finding (None when they take less than ``min_stall_share`` of the step);
    stalls in the ``held`` steps (a broad slowdown's) are left out."""
    calls = st.calls
    left_out = dict(st.left_out)
    if held and len(calls):
        n = int(calls["step"].isin(held).sum())
        if n:
            left_out["in steps the broad-slowdown finding holds"] = n
        calls = calls[~calls["step"].isin(held)]
    if calls.empty or steps_r.empty:
        return None
    rank = st.rank
    n_steps = len(steps_r)
    step_us = float(steps_r["step_us"].mean())
    sums = calls.groupby("step")["excess_ns"].sum()
    per_step = {int(s): float(v) / 1000.0 for s, v in zip(sums.index.tolist(), sums.tolist(), strict=True)}
    stall_us = float(calls["excess_ns"].sum()) / 1000.0
    saving = stall_us / n_steps
    if saving < ctx.t.min_stall_share * step_us:
        return None
    contended, med = _contended(ctx, calls, steps_r)
    ops = calls[calls["kind"] == "host_op"]
    py = calls[calls["kind"] != "host_op"]
    bounds = tuple((str(n), int(t), int(d - x)) for n, t, d, x in
                   zip(calls["name"], calls["start_ns"], calls["dur_ns"], calls["excess_ns"], strict=True))
    change = (Change("bound", Select(at=tuple((n, t) for n, t, _ in bounds), device=False), at=bounds),)
    replay = ctx.what_if(rank, change, STALL_ASSUMPTION, steps=[int(x) for x in steps_r["step"]])
    ratio = calls["own_ns"] / calls["typ_ns"].clip(lower=1)
    where = (f"; steps {', '.join(map(str, contended))} are slow by mostly these stalls" if contended
             else "; no step is slow by mostly these stalls (they are spread over the steps)")
    ctx.warn(f"rank {rank}: {len(calls)} host calls stalled {fmt_ms(float(calls['excess_ns'].min()) / 1000)}-"
             f"{fmt_ms(float(calls['excess_ns'].max()) / 1000)} in their own time; the trace has no per-thread CPU "
             "time, so that the thread was descheduled (another process took the CPU) is inferred, not observed")
    top = [{"step": int(r["step"]), "name": str(r["name"]), "kind": str(r["kind"]),
            "own_us": round(float(r["own_ns"]) / 1000.0, 1), "usual_own_us": round(float(r["typ_ns"]) / 1000.0, 1),
            "stall_us": round(float(r["excess_ns"]) / 1000.0, 1)}
           for _, r in calls.sort_values("excess_ns", ascending=False).head(20).iterrows()]
    return ctx.finding(
        title=f"Rank {rank}: the host thread stalled {fmt_ms(saving)} per step ({saving / step_us:.0%} of "
        f"{fmt_ms(step_us)}): {len(calls)} host calls each took {fmt_ms(float(calls['excess_ns'].min()) / 1000)}-"
        f"{fmt_ms(float(calls['excess_ns'].max()) / 1000)} beyond their usual own time for the same work, with "
        f"nothing nested in them to explain it: the machine preempted the job{where}",
        detail="A stall is a scheduler slice lost inside one call's own time (the thread was not running): the "
        "machine, not the job. Calls inside data-loader fetches, overlapping a GC event, in the first step of a "
        "profiling cycle, waiting for another thread or possibly for the device are not counted"
        + (f" ({'; '.join(f'{v} {k}' for k, v in left_out.items())})" if left_out else "") + ".",
        evidence={
            "stalled_calls": len(calls), "stalled_us_total": round(stall_us, 1), "stalled_us_per_step": round(saving, 1),
            "stalled_us_in_operators": round(float(ops["excess_ns"].sum()) / 1000.0, 1),
            "stalled_us_in_python_or_ranges": round(float(py["excess_ns"].sum()) / 1000.0, 1),
            "steps_with_stalls": len(per_step), "steps": n_steps,
            "contended_steps": ", ".join(map(str, contended)) or None,
            "stall_us_min": round(float(calls["excess_ns"].min()) / 1000.0, 1),
            "stall_us_max": round(float(calls["excess_ns"].max()) / 1000.0, 1),
            "own_time_ratio_median": round(float(ratio.median()), 2),
            "min_stall_us": ctx.t.min_stall_us, "max_stall_us": ctx.t.max_stall_us, "stall_ratio": ctx.t.stall_ratio,
            "calm_step_us_median": round(med, 1), "step_us_mean": round(step_us, 1),
            "stalled_us_by_step": "; ".join(f"{s}: {per_step.get(s, 0.0):.0f}" for s in st.judged),
            "calls_not_judged": "; ".join(f"{v} {k}" for k, v in left_out.items()) or None,
        },
        saving_us=saving, step_us=step_us,
        saving_basis="the stalled calls' time beyond their usual own time, averaged over all steps",
        ranks=[rank], steps=contended or sorted(per_step),
        ops=list(dict.fromkeys(str(n) for n in calls.sort_values("excess_ns", ascending=False)["name"]))[:5],
        top=top, replay=replay,
    )
