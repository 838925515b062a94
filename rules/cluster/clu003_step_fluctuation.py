"""Some steps are much slower than the others (cross-step k-sigma, with periodic-spike detection).

## Why it matters
In steady training every step does the same work, so its time should be nearly constant
(LLMPrism §IV-D cross-step diagnosis). A step far above the others means something ran that
is not part of the training computation: a checkpoint, a Python garbage-collector pass (25 %
of the fluctuation cases in Hermes §5.2.3), a data-loader stall, a recompilation, a slow node.
In synchronous training every rank waits for the slowest step of any rank, so the cost
multiplies with the cluster size. PRISM shows that step-time variability alone can cost a
large job tens of percent of its throughput.

## How it is detected
Per rank, the step times of the breakdown (``step_us`` of every ``ProfilerStep#N`` window)
are tested with LLMPrism's rule, *step time > mean + k·σ* with k = 3, made robust:

* plain k-sigma cannot work on a profile's few steps: an outlier inflates the σ it is compared
  with, and with n steps a single outlier's z-score is at most (n − 1)/√n (2.85 for n = 10),
  so it can never exceed 3 below 11 steps; several outliers also mask each other;
* so the mean and σ are taken from a **clean baseline** grown by forward search: start with the
  faster half of the steps and add the next slower step while it stays within mean + k·σ of the
  baseline so far (or within the relative floor below); the first step beyond, and every slower
  one, is an outlier;
* a step must also exceed the baseline median by ``min_excess_ratio`` (10 %, the fluctuation
  size Hermes §5.2.1 counts), so very regular runs with a tiny σ do not flag noise;
* warm-up steps are left out, of the baseline and of the outliers: a step whose host compile
  events (CPU001's definition: JIT / CANN compiles, torch.compile's compile regions) alone take
  more than ``min_excess_ratio`` of the median step, and the first step of a profiling cycle
  when it is the only slow one (one-off initialisation: lazy init, autotuning, allocator
  growth). A slow first step next to other slow steps stays an outlier.

Slow steps are then classed as *isolated* (one), *recurring*, or *periodic* (three or more, at
gaps within ±1 step of their median gap: e.g. a full GC every few steps, a checkpoint every N).
The finding carries the PRISM-style step-time distribution of the rank (p50 / p90 / p99 / max
and coefficient of variation). Ranks with the same set of slow steps are reported together.
At least ``min_steps`` steps are needed; with fewer the rule says so in the warnings.

The saving is the excess of the slow steps over the baseline median, summed and amortised
over all profiled steps: what removing the spikes would give back per step on average.

## What to do
Look at what the slow steps do that the others do not: the findings listed as explaining this
one (GC, data loading, host syncs, recompilation), ``record_function`` ranges such as
checkpointing, and whether the spikes are periodic. Move checkpoints and logging off the
critical path (async checkpointing), tune or freeze the GC, and isolate a node whose slow steps
do not line up with any software cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from rules.cluster._stats import distribution, median, spacing_pattern, warmup_steps
from rules.cpu.cpu001_operator_compilation import COMPILE_RE, COMPILE_SQL, NOT_COMPILE_RE


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU003."""

    k: float = knob(3.0, "a step is slow when above baseline mean + k·σ", "LLMPrism §IV-D k-sigma rule, k = 3")
    min_excess_ratio: float = knob(
        0.10,
        "a slow step must also exceed the baseline median by this fraction",
        "Hermes §5.2.1 counts step-time fluctuations exceeding 10 %",
    )
    min_steps: int = knob(4, "fewest steps per rank to test (the baseline needs at least two)",
                          "first principles: σ needs two baseline values; the baseline is half the steps")
    periodic_min_count: int = knob(3, "slow steps needed to call the spikes periodic",
                                   "first principles: two gaps are the least that can agree")


SQL = """
SELECT rank, step, step_us FROM breakdown WHERE step >= 0 ORDER BY rank, step
"""


@rule("CLU003", "cluster.step-fluctuation", cause="cluster.step_fluctuation",
      requires=("breakdown", "multi_step"), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag ranks whose slow steps exceed a robust k-sigma bound; group ranks by slow-step set."""
    rows = ctx.query(SQL)
    per_rank: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        per_rank.setdefault(int(r["rank"]), []).append((int(r["step"]), float(r["step_us"])))
    few = [r for r, v in per_rank.items() if len(v) < ctx.t.min_steps]
    if few:
        ctx.warn(f"ranks {_short(few)}: fewer than {ctx.t.min_steps} steps profiled; "
                 "cross-step outliers cannot be told from noise (profile more active steps)")
    compile_us: dict[int, dict[int, float]] = {}  # rank -> step -> host compile time
    if any(len(v) >= ctx.t.min_steps for v in per_rank.values()):
        for r in ctx.query(COMPILE_SQL, {"compile_re": COMPILE_RE, "not_compile_re": NOT_COMPILE_RE}):
            if r["step"] is not None:
                compile_us.setdefault(int(r["rank"]), {})[int(r["step"])] = float(r["compile_us"])
    results: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for rank, vals in sorted(per_rank.items()):
        if len(vals) < ctx.t.min_steps:
            continue
        warm, fs, kept = warmup_steps(vals, compile_us.get(rank, {}), ctx.t.k, ctx.t.min_excess_ratio)
        if not fs.outliers:
            continue
        steps = [s for s, _ in kept]
        times = [t for _, t in kept]
        slow = tuple(steps[i] for i in fs.outliers)
        excess = [times[i] - fs.baseline_median for i in fs.outliers]
        results.setdefault(slow, []).append({
            "rank": rank, "fs": fs, "times": times, "steps": steps, "excess": excess,
            "slow_times": [times[i] for i in fs.outliers], "warmup": warm,
        })
    for slow, group in results.items():
        yield _finding(ctx, slow, group)


def _finding(ctx: RuleContext[Thresholds], slow: tuple[int, ...], group: list[dict[str, Any]]) -> Finding:
    # the representative rank: the one with the largest total excess
    rep = max(group, key=lambda g: sum(g["excess"]))
    fs = rep["fs"]
    n = len(rep["times"])
    savings = [sum(g["excess"]) / len(g["times"]) for g in group]
    saving = median(savings)
    step_us = median([sum(g["times"]) / len(g["times"]) for g in group])
    pattern, period = spacing_pattern(slow, ctx.t.periodic_min_count)
    ranks = [g["rank"] for g in group]
    worst = max(rep["slow_times"])
    where = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({_short(ranks)})"
    steps_txt = ", ".join(f"#{s}" for s in slow[:6]) + (" …" if len(slow) > 6 else "")
    shape = {"isolated": "one slow step", "recurring": f"{len(slow)} slow steps",
             "periodic": f"{len(slow)} slow steps, about every {period} steps"}[pattern]
    title = (f"Step time fluctuates on {where}: {shape} ({steps_txt}), up to {worst / 1000:.1f} ms vs a "
             f"{fs.baseline_median / 1000:.1f} ms baseline ({worst / fs.baseline_median:.1f}×)")
    evidence: dict[str, Any] = {
        "slow_steps": ", ".join(str(s) for s in slow),
        "slow_step_count": len(slow),
        "steps_profiled": n,
        "slowest_step_us": round(worst, 1),
        "baseline_median_us": round(fs.baseline_median, 1),
        "baseline_mean_us": round(fs.baseline_mean, 1),
        "baseline_std_us": round(fs.baseline_std, 1),
        "baseline_steps": fs.baseline_n,
        "threshold_us": round(fs.threshold, 1),
        "k": ctx.t.k,
        "min_excess_ratio": ctx.t.min_excess_ratio,
        "excess_us_total": round(sum(rep["excess"]), 1),
        "pattern": pattern,
        "period_steps": period,
        **distribution(rep["times"]),
    }
    if rep["warmup"]:
        evidence["warmup_steps_excluded"] = ", ".join(str(s) for s in rep["warmup"])
    if len(ranks) > 1:
        evidence["representative_rank"] = rep["rank"]
    top = [
        {"rank": g["rank"], "step": s, "step_us": round(t, 1), "excess_us": round(t - g["fs"].baseline_median, 1)}
        for g in group for s, t in zip(g["steps"], g["times"], strict=True) if s in slow
    ]
    top.sort(key=lambda x: -x["excess_us"])
    return ctx.finding(
        title=title,
        evidence=evidence,
        saving_us=saving,
        step_us=step_us,
        saving_basis="excess of the slow steps over the baseline median step, summed and amortised over all "
        "profiled steps (median over the ranks listed); the denominator is the mean step time",
        ranks=ranks,
        steps=slow,
        top=top[:20],
    )


def _short(items: list[int]) -> str:
    return ", ".join(map(str, items[:8])) + (" …" if len(items) > 8 else "")
