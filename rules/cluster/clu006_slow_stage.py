"""One pipeline stage computes longer than the others, and the stages around it wait for it.

## Why it matters
In pipeline parallelism every micro-batch passes through every stage, so the pipeline runs at the
pace of its slowest stage: the stages after it wait for its activations, the stages before it for
its gradients (LLMPrism §IV-D: a pipeline stage that stalls the others). The waiting shows on the
*other* stages, as long receives and pipeline bubbles, while the cause is on the slow one: more
layers than the others, an embedding or loss layer on top of its share, or slow devices.

## How it is detected
Stages come from the parallel groups (advisor.stages.groups): the ranks joined by their data- and
tensor-parallel groups, in the order the pipeline groups give. Per stage and step, the stage's
**own time** is the median over its ranks of the step minus the not-overlapped communication
(the rest is waiting for the other stages) and its **wait** the median not-overlapped
communication; per stage, the median over steps. With three stages or more a stage is slow when
its own time is above LLMPrism's mean + k·σ of a clean baseline of the other stages (forward
search from the faster half, as CLU004); with two stages, when it is above the other's by more
than ``min_excess_ratio``. In both cases it must also exceed the baseline median by
``min_excess_ratio`` and the other stages must wait: their median wait at least
``min_wait_share`` of the step and above the slow stage's own wait. The stalled stages are named
in the evidence, never as the cause.

The saving per step is the stage's excess own time over the other stages' median, capped by
their median wait (what they would get back). The pipeline bubble the other stages show (PAR002)
is its symptom: this finding explains it, in full when this saving is at least half the bubble's,
in part otherwise (the bubble beyond it is the schedule's, and stays a finding of its own).

## What to do
Rebalance the layers across stages (fewer on the slow stage, or move the embedding / loss layer),
use an uneven split (Megatron ``--decoder-first-pipeline-num-layers`` / ``...-last-...``), or look
at the slow stage's own findings when its layers are no heavier than the others'.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from advisor.text import spans
from rules.cluster._stats import forward_search, median

SQL = """
SELECT rank, step, step_us, step_us - comm_only_us AS own_us, comm_only_us AS wait_us
FROM breakdown WHERE step >= 0 ORDER BY rank, step
"""


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU006."""

    k: float = knob(3.0, "with three stages or more: own time above baseline mean + k·σ of the other stages",
                    "LLMPrism §IV-D k-sigma rule, k = 3")
    min_excess_ratio: float = knob(
        0.20, "the stage's own time must exceed the other stages' median by this fraction",
        "PRISM Fig. 3a: identical GEMMs vary up to 14 % across healthy GPUs; 20 % is beyond that")
    min_wait_share: float = knob(
        0.05, "the other stages' median not-overlapped communication as a share of the step",
        "first principles: a slow stage makes the others wait; 5 % is above the CAUSES.md medium cutoff (3 %)")


@rule("CLU006", "cluster.slow-stage", cause="cluster.slow_stage", scope="cluster", requires=("breakdown", "multi_rank"),
      thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag pipeline stages whose own time is an outlier among the stages while the others wait."""
    pg = ctx.parallel_groups()
    stages = pg["stages"] if pg else []
    if len(stages) < 2:
        return
    cell = {(int(r["rank"]), int(r["step"])): r for r in ctx.query(SQL)}
    steps = sorted({s for _, s in cell})
    own_st: list[float] = []
    wait_st: list[float] = []
    step_st: list[float] = []
    for st in stages:
        own_s, wait_s, step_s = [], [], []
        for s in steps:
            present = [r for r in st if (r, s) in cell]
            if present:
                own_s.append(median([float(cell[(r, s)]["own_us"]) for r in present]))
                wait_s.append(median([float(cell[(r, s)]["wait_us"]) for r in present]))
                step_s.append(median([float(cell[(r, s)]["step_us"]) for r in present]))
        own_st.append(median(own_s))
        wait_st.append(median(wait_s))
        step_st.append(median(step_s))
    t = ctx.t
    if len(stages) >= 3:
        fs = forward_search(own_st, t.k, t.min_excess_ratio)
        slow, method = list(fs.outliers), "k-sigma (forward-search baseline of the stages)"
    else:
        lo = min(range(2), key=lambda i: own_st[i])
        slow = [1 - lo] if own_st[1 - lo] > (1 + t.min_excess_ratio) * own_st[lo] else []
        method = "ratio to the other stage (two stages: no σ)"
    for i in slow:
        others = [j for j in range(len(stages)) if j not in slow]
        if not others:
            continue
        base_own = median([own_st[j] for j in others])
        base_wait = median([wait_st[j] for j in others])
        step_us = median([step_st[j] for j in range(len(stages))])
        if own_st[i] <= (1 + t.min_excess_ratio) * base_own:
            continue
        if base_wait < t.min_wait_share * step_us or base_wait <= wait_st[i]:
            continue
        stalled = sorted(r for j in others for r in stages[j])
        saving = min(own_st[i] - base_own, base_wait)
        yield ctx.finding(
            title=f"Pipeline stage {i} (ranks {spans(stages[i])}) is the slow stage: {own_st[i] / 1000:.2f} ms of its "
            f"own work per step vs {base_own / 1000:.2f} ms on the other {len(others)} stage(s), which wait "
            f"{base_wait / 1000:.2f} ms per step for it",
            evidence={
                "stage": i,
                "stages": len(stages),
                "stage_ranks": spans(stages[i]),
                "stage_own_us": round(own_st[i], 1),
                "others_own_us": round(base_own, 1),
                "stage_wait_us": round(wait_st[i], 1),
                "others_wait_us": round(base_wait, 1),
                "stalled_ranks": spans(stalled),
                "method": method,
                "k": t.k,
                "min_excess_ratio": t.min_excess_ratio,
            },
            saving_us=saving,
            step_us=step_us,
            saving_basis="the stage's own time beyond the other stages' median, capped by their wait",
            ranks=stages[i],
            steps=steps,
            top=[{"stage": j, "ranks": spans(stages[j]), "own_us": round(own_st[j], 1), "wait_us": round(wait_st[j], 1)}
                 for j in range(len(stages))][:20],
        )
