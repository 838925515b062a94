"""Some steps are much slower than the others (cross-step k-sigma, with periodic-spike detection).

## Why it matters
In steady training every step does the same work, so its time should be nearly constant
(LLMPrism §IV-D cross-step diagnosis). A step far above the others means something ran that
is not part of the training computation: a checkpoint, a Python garbage-collector pass (25 %
of the fluctuation cases in Hermes §5.2.3), a data-loader stall, a host sync, a slow node.
In synchronous training every rank waits for the slowest step of any rank, so the cost
multiplies with the cluster size. PRISM shows that step-time variability alone can cost a
large job tens of percent of its throughput. A step slowed by operator compilation, or a lone
slow first step of a profiling cycle, is warm-up rather than fluctuation and is left out (below;
the compiles are CPU001's).

## How it is detected
Per rank, the step times of the breakdown (``step_us`` of every step window: ``ProfilerStep#N``
on Kineto traces, the exported steps on Ascend) are tested with LLMPrism's rule, *step time >
mean + k·σ* with k = 3, made robust:

* plain k-sigma cannot work on a profile's few steps: an outlier inflates the σ it is compared
  with, and with n steps a single outlier's z-score is at most (n − 1)/√n (2.85 for n = 10),
  so it can never exceed 3 below 11 steps; several outliers also mask each other;
* so the mean and σ are taken from a **clean baseline** grown by forward search: start with the
  faster half of the steps and add the next slower step while it stays within mean + k·σ of the
  baseline so far (or within the relative floor below); the first step beyond, and every slower
  one, is an outlier;
* a step must also exceed the baseline median by ``min_excess_ratio`` (10 %, the fluctuation
  size Hermes §5.2.1 counts), so very regular runs with a tiny σ do not flag noise;
* warm-up steps are left out, of the baseline and of the outliers, before the search: a step
  whose host compile events (CPU001's definition: JIT / CANN compiles, torch.compile's compile
  regions) alone take more than ``min_excess_ratio`` of the rank's median step (over all its
  steps). Then, when the search finds exactly one slow step and it is the first step of a
  profiling cycle (the step before it was not profiled), it is warm-up too (one-off
  initialisation: lazy init, autotuning, allocator growth) and the search is run again without
  it. A slow first step next to other slow steps stays an outlier. The warm-up steps a finding
  left out are in ``evidence["warmup_steps_excluded"]``; ``steps_profiled`` counts the others.

Slow steps are then classed as *isolated* (one), *recurring*, or *periodic* (three or more,
never two in a row, at gaps within ±1 step of their median gap: e.g. a full GC every few steps,
a checkpoint every N).
The finding carries the PRISM-style step-time distribution of the rank (p50 / p90 / p99 / max
and coefficient of variation). Ranks with the same set of slow steps are reported together.
At least ``min_steps`` steps of a rank (warm-up ones included) are needed; with fewer the rule
says so in the warnings.

It then names what the slow steps run extra (on the representative rank, the one with the
largest excess; for the ``extra_max_findings`` findings with the largest excess): per name, the
host events inside each step window are summed, and the mean per slow step is compared with the
mean per other step (warm-up steps left out; a host event counts in the step whose marker it runs
in, even where the device lags and the step's window starts later). A name that runs in at least half of the slow
steps and in no other step (a ``save_checkpoint`` range), or that takes ``extra_min_ratio`` times
longer there (a full GC pass, operators slowed by contention), is named when it explains at least
``extra_min_share`` of the slow steps' mean excess. Of names nested in each other only the outermost is kept (the
checkpoint range, not the copies inside it). With periodic spikes the detail reads "Every 10
steps (10, 20, 30): these steps run save_checkpoint (0.90 s) that the other steps do not".

The saving is the excess of the slow steps over the baseline median, summed and amortised
over the rank's steps other than warm-up ones (the median of that over the ranks reported
together): what removing the spikes would give back per step on average.

## What to do
Look at what the slow steps do that the others do not: the findings listed as explaining this
one (GC, data loading, host syncs; an operator whose spikes make those steps slow, VAR001),
``record_function`` ranges such as
checkpointing, and whether the spikes are periodic. Move checkpoints and logging off the
critical path (async checkpointing), tune or freeze the GC, and isolate a node whose slow steps
do not line up with any software cause.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RankPart, RuleContext, knob, rule
from advisor.model import Finding
from rules.cluster._stats import distribution, median, spacing_pattern, warmup_steps
from rules.cpu.cpu001_operator_compilation import compile_rows as cpu001_compile_rows


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU003."""

    k: float = knob(3.0, "a step is slow when above baseline mean + k·σ (and the min_excess_ratio floor)",
                    "LLMPrism §IV-D k-sigma rule, k = 3")
    min_excess_ratio: float = knob(
        0.10,
        "a slow step must also exceed the baseline median by this fraction; a step whose host compile time "
        "exceeds this fraction of the median step is warm-up, left out",
        "Hermes §5.2.1 counts step-time fluctuations exceeding 10 %",
    )
    min_steps: int = knob(4, "fewest steps per rank to test, warm-up ones included (the baseline needs at least two)",
                          "first principles: σ needs two baseline values; the baseline is half the steps")
    periodic_min_count: int = knob(3, "slow steps needed to call the spikes periodic",
                                   "first principles: two gaps are the least that can agree")
    extra_min_share: float = knob(
        0.10, "host work the slow steps run extra must explain this share of their mean excess to be named",
        "first principles: an item below a tenth of the excess does not explain the spike")
    extra_min_ratio: float = knob(
        2.0, "work the other steps also run is named when it takes this many times longer in the slow steps",
        "first principles: a doubling is well beyond step-to-step noise of one operation")
    extra_max_findings: int = knob(10, "findings whose slow steps' extra work is looked up (each reads one rank's "
                                       "events)", "run time on clusters of many ranks")
    extra_top_n: int = knob(3, "extra items named per finding", "presentation")


SQL = """
SELECT rank, step, step_us FROM breakdown WHERE step >= 0 ORDER BY rank, step
"""


def _per_rank(ctx: RuleContext[Thresholds]) -> dict[int, list[tuple[int, float]]]:
    """(step, step time) of each rank, from the breakdown."""
    per_rank: dict[int, list[tuple[int, float]]] = {}
    for r in ctx.query(SQL):
        per_rank.setdefault(int(r["rank"]), []).append((int(r["step"]), float(r["step_us"])))
    return per_rank


def _slow_ranks(ctx: RuleContext[Thresholds], per_rank: dict[int, list[tuple[int, float]]],
                compile_us: dict[int, dict[int, float]]) -> list[dict[str, Any]]:
    """The ranks with slow steps, each with its search (a rank's own steps decide)."""
    out = []
    for rank, vals in sorted(per_rank.items()):
        if len(vals) < ctx.t.min_steps:
            continue
        warm, fs, kept = warmup_steps(vals, compile_us.get(rank, {}), ctx.t.k, ctx.t.min_excess_ratio)
        if not fs.outliers:
            continue
        steps = [s for s, _ in kept]
        times = [t for _, t in kept]
        out.append({
            "rank": rank, "fs": fs, "times": times, "steps": steps,
            "slow": tuple(steps[i] for i in fs.outliers),
            "excess": [times[i] - fs.baseline_median for i in fs.outliers],
            "slow_times": [times[i] for i in fs.outliers], "warmup": warm,
        })
    return out


RANK_TABLES = {
    "clu003_compile": "rank INTEGER, step INTEGER, compile_us DOUBLE",
    "clu003_extras": "rank INTEGER, ord INTEGER, name VARCHAR, kind VARCHAR, slow_us DOUBLE, normal_us DOUBLE, "
                     "extra_us DOUBLE, slow_steps_with INTEGER, normal_steps_with INTEGER",
}
_EXTRA_FIELDS = ("name", "kind", "slow_us", "normal_us", "extra_us", "slow_steps_with", "normal_steps_with")


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """What CLU003 reads of each rank's events (see :class:`advisor.engine.rule.RankPart`): the host
    compile time of each step, and, on each rank with slow steps, what they run extra."""
    per_rank = _per_rank(ctx)
    compile_rows: list[tuple[Any, ...]] = []
    compile_us: dict[int, dict[int, float]] = {}  # rank -> step -> host compile time
    if any(len(v) >= ctx.t.min_steps for v in per_rank.values()):
        for r in cpu001_compile_rows(ctx):
            if r["step"] is not None:
                compile_us.setdefault(int(r["rank"]), {})[int(r["step"])] = float(r["compile_us"])
                compile_rows.append((int(r["rank"]), int(r["step"]), float(r["compile_us"])))
    extras: list[tuple[Any, ...]] = []
    for g in _slow_ranks(ctx, per_rank, compile_us):
        found = _extra_work(ctx, g["rank"], g["slow"], g["steps"], sum(g["excess"]) / len(g["slow"]))
        extras += [(g["rank"], i, *(x[k] for k in _EXTRA_FIELDS)) for i, x in enumerate(found)]
    return {"clu003_compile": compile_rows, "clu003_extras": extras}


@rule("CLU003", "cluster.step-fluctuation", cause="cluster.step_fluctuation",
      requires=("breakdown", "multi_step"), thresholds=Thresholds, scope="cluster",
      rank_part=RankPart(RANK_TABLES, rank_part, derived=("event_names",)))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag ranks whose slow steps exceed a robust k-sigma bound; group ranks by slow-step set."""
    per_rank = _per_rank(ctx)
    few = [r for r, v in per_rank.items() if len(v) < ctx.t.min_steps]
    if few:
        ctx.warn(f"ranks {_short(few)}: fewer than {ctx.t.min_steps} steps profiled; "
                 "cross-step outliers cannot be told from noise (profile more active steps)")
    compile_us: dict[int, dict[int, float]] = {}
    for r in ctx.query("SELECT rank, step, compile_us FROM clu003_compile"):
        compile_us.setdefault(int(r["rank"]), {})[int(r["step"])] = float(r["compile_us"])
    results: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for g in _slow_ranks(ctx, per_rank, compile_us):
        results.setdefault(g["slow"], []).append(g)
    order = sorted(results, key=lambda k: -max(sum(g["excess"]) for g in results[k]))
    looked_up = set(order[: ctx.t.extra_max_findings])
    for slow, group in results.items():
        yield _finding(ctx, slow, group, slow in looked_up)


def _finding(ctx: RuleContext[Thresholds], slow: tuple[int, ...], group: list[dict[str, Any]],
             look_up: bool = True) -> Finding:
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
    extras = ctx.query("SELECT * FROM clu003_extras WHERE rank = $rank ORDER BY ord", {"rank": rep["rank"]}) \
        if look_up else []
    extra_title, detail = _describe_extras(extras, pattern, period, slow)
    if extras:
        evidence |= {
            "slow_steps_extra": "; ".join(_extra_text(x) for x in extras),
            "slow_steps_extra_us": round(sum(x["extra_us"] for x in extras), 1),
            "slow_steps_extra_share": round(min(1.0, sum(x["extra_us"] for x in extras) / max(
                sum(rep["excess"]) / len(slow), 1e-9)), 4),
        }
    return ctx.finding(
        title=title + extra_title,
        detail=detail,
        evidence=evidence,
        saving_us=saving,
        step_us=step_us,
        saving_basis="excess of the slow steps over the baseline median step, summed and amortised over all "
        "profiled steps (median over the ranks listed); the denominator is the mean step time",
        ranks=ranks,
        steps=slow,
        top=top[:20],
    )


# a host event belongs to the step whose marker it runs in (events.step): the step's device window
# starts later when the device lags, and bounding by it would lose the host work at the step's start
# (a batch fetched before the step's first launch) in exactly the steps where the device lags
EXTRA_SQL = """
WITH w AS (SELECT step FROM steps WHERE rank = $rank AND step >= 0)
SELECT e.step, regexp_replace(e.name, ' at 0x[0-9a-fA-F]+', '') AS name, sum(e.dur_ns) / 1000.0 AS us
FROM events e JOIN w ON w.step = e.step
WHERE e.rank = $rank AND NOT e.device AND e.kind <> 'step'
GROUP BY ALL
"""

# the candidates' events in the slow steps that no other candidate event encloses on the same thread
OUTERMOST_SQL = """
WITH w AS (SELECT step FROM steps WHERE rank = $rank AND step >= 0 AND list_contains($slow, step)),
cand AS (
    SELECT e.rank, e.pid, e.tid, regexp_replace(e.name, ' at 0x[0-9a-fA-F]+', '') AS name, e.start_ns, e.dur_ns
    FROM events e JOIN w ON w.step = e.step
    WHERE e.rank = $rank AND NOT e.device AND e.kind <> 'step'
      AND list_contains($names, regexp_replace(e.name, ' at 0x[0-9a-fA-F]+', ''))
),
top AS (
    SELECT * FROM (
        SELECT c.*, max(c.start_ns + c.dur_ns) OVER (
            PARTITION BY c.pid, c.tid ORDER BY c.start_ns, c.dur_ns DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM cand c
    ) WHERE prev_end IS NULL OR prev_end <= start_ns
)
SELECT DISTINCT name FROM top
"""


def _extra_work(ctx: RuleContext[Thresholds], rank: int, slow: tuple[int, ...], steps: list[int],
                excess_us: float) -> list[dict[str, Any]]:
    """Host work the slow steps run that the other steps do not (``only``), or run much longer (``longer``).

    Per event name (host events inside the step windows), the mean time per slow step is compared with the
    mean per other step. A name is named when it explains at least ``extra_min_share`` of the slow steps' mean
    excess and either runs in at least half of the slow steps and in no other step, or takes
    ``extra_min_ratio`` times longer in them. Of names nested in each other (a ``save_checkpoint`` range and
    the copies inside it) only the outermost is kept."""
    normal = [s for s in steps if s not in slow]
    if not normal or excess_us <= 0:
        return []
    per: dict[str, dict[int, float]] = {}
    for r in ctx.query(EXTRA_SQL, {"rank": rank}):
        per.setdefault(str(r["name"]), {})[int(r["step"])] = float(r["us"])
    cands: dict[str, dict[str, Any]] = {}
    for name, by_step in per.items():
        slow_us = sum(by_step.get(s, 0.0) for s in slow) / len(slow)
        normal_us = sum(by_step.get(s, 0.0) for s in normal) / len(normal)
        in_slow = sum(1 for s in slow if s in by_step)
        in_normal = sum(1 for s in normal if s in by_step)
        extra = slow_us - normal_us
        if extra < ctx.t.extra_min_share * excess_us:
            continue
        if in_normal == 0 and 2 * in_slow >= len(slow):
            kind = "only"
        elif in_normal and slow_us >= ctx.t.extra_min_ratio * normal_us:
            kind = "longer"
        else:
            continue
        cands[name] = {"name": name, "kind": kind, "slow_us": slow_us, "normal_us": normal_us, "extra_us": extra,
                       "slow_steps_with": in_slow, "normal_steps_with": in_normal}
    if not cands:
        return []
    keep = {str(r["name"]) for r in ctx.query(OUTERMOST_SQL, {"rank": rank, "slow": list(slow), "names": list(cands)})}
    out = sorted((c for n, c in cands.items() if n in keep), key=lambda c: (c["kind"] != "only", -c["extra_us"]))
    return out[: ctx.t.extra_top_n]


def _extra_text(x: dict[str, Any]) -> str:
    if x["kind"] == "only":
        return f"{x['name']} {_ms(x['slow_us'])} per slow step, in no other step"
    return f"{x['name']} {_ms(x['slow_us'])} per slow step vs {_ms(x['normal_us'])} in the others"


def _describe_extras(extras: list[dict[str, Any]], pattern: str, period: int | None,
                     slow: tuple[int, ...]) -> tuple[str, str]:
    """Title suffix and detail sentence naming what the slow steps run extra (empty when nothing stands out)."""
    if not extras:
        return "", ""
    only = [x for x in extras if x["kind"] == "only"]
    longer = [x for x in extras if x["kind"] == "longer"]
    one = len(slow) == 1
    parts = []
    if only:
        parts.append(("this step runs " if one else "these steps run ")
                     + ", ".join(f"{x['name']} ({_ms(x['slow_us'])})" for x in only[:2]) + " that the other steps do not")
    if longer:
        parts.append(", ".join(f"{x['name']} takes {_ms(x['slow_us'])} in {'this step' if one else 'these steps'} vs "
                               f"{_ms(x['normal_us'])} in the other steps" for x in longer[:2]))
    sentence = title = "; ".join(parts)  # the title already gives the period
    gaps = {b - a for a, b in itertools.pairwise(slow)}
    listed = ", ".join(map(str, slow[:6])) + (" …" if len(slow) > 6 else "")
    if pattern == "periodic" and period:
        sentence = f"{'Every' if len(gaps) == 1 else 'About every'} {period} steps ({listed}): {sentence}"
    else:
        sentence = f"Step{'' if one else 's'} {listed}: {sentence}"
    detail = sentence + ". Host events compared per name between the slow steps and the others; nested ones are " \
        "named by the outermost."
    return f"; {title}", detail


def _ms(us: float) -> str:
    return f"{us / 1e6:.2f} s" if us >= 1e6 else (f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.0f} µs")


def _short(items: list[int]) -> str:
    return ", ".join(map(str, items[:8])) + (" …" if len(items) > 8 else "")
