"""One rank is slow in one step (or a few): its own work in that step is far above both its other steps and its peers.

## Why it matters
LLMPrism §IV-D diagnoses across steps (a step slower than the others) and across ranks (a rank
slower than its peers). A rank that falls behind in one step only is neither a straggler (it is
fine in the other steps) nor a slow step of the whole job (its peers are fine in that step), yet in
synchronous training every other rank waits for it at the next collective: the whole job loses
that step's excess. One-off causes: a garbage-collector pass, a page-cache miss, a checkpoint
write or a log flush on that rank, a noisy neighbour on its host, a thermal or power event.

## How it is detected
From the breakdown, per (rank, step) the rank's **own time**: the step minus its not-overlapped
communication (compute, host-only and free time; the rest of the step is waiting for peers).
A cell is slow when both robust tests (median / MAD: the median and 1.4826 × the median absolute
deviation, which an outlier cannot inflate) find it high:

* **cross-step**: above the rank's median own time over its steps by more than k × its MAD-σ
  and by more than ``min_excess_ratio`` of that median;
* **cross-rank**: above the median own time of the ranks it is compared with in that step (the
  ranks of its pipeline stage where the job has stages, else every rank; itself included) by the
  same two margins;
* and its peers wait for it: their median not-overlapped communication in that step is at least
  ``min_wait_share`` of the step and above the rank's own.

At least ``min_steps`` steps of the rank and ``min_ranks`` ranks compared in the step (itself
included) are needed. A rank slow in more than half of
its steps is a straggler (cluster.slow_rank) and is left to CLU001; a step slow on every rank is
a step fluctuation (CLU003) and does not pass the cross-rank test.

The saving per step: the cell's excess over the peers' median own time, capped by the peers'
wait in that step, summed over the flagged steps and spread over the rank's steps.

Where the cell's excess is one operator's, the operator-variability finding (VAR001) lists that
step among its spikes: this finding explains it (in part when the operator also varies elsewhere).

## What to do
Look at what ran on that rank in that step (``advisor analyze --rank R --step S``): GC, I/O,
checkpoints, logging, other processes on the host; compare with the host's metrics at that time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from rules.cluster._stats import median

SQL = """
SELECT rank, step, step_us, step_us - comm_only_us AS own_us, comm_only_us AS wait_us
FROM breakdown WHERE step >= 0 ORDER BY rank, step
"""

MAD_SIGMA = 1.4826  # MAD -> σ of a normal distribution


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU005."""

    k: float = knob(3.0, "a cell is slow when above the median by k robust σ (1.4826 × MAD) on both axes",
                    "LLMPrism §IV-D k-sigma rule, k = 3, with the median / MAD an outlier cannot inflate")
    min_excess_ratio: float = knob(
        0.20, "the cell's own time must also exceed both medians (its steps, its peers) by this fraction",
        "PRISM Fig. 3a: identical GEMMs vary up to 14 % across healthy GPUs; 20 % is beyond that")
    min_wait_share: float = knob(
        0.05, "the peers' median not-overlapped communication in that step, as a share of the step",
        "first principles: a slow rank makes its peers wait; 5 % is above the CAUSES.md medium cutoff (3 %)")
    min_steps: int = knob(3, "fewest steps of a rank for the cross-step test", "a median and MAD need three values")
    min_ranks: int = knob(3, "fewest peers (with the rank) in a step for the cross-rank test",
                          "a median and MAD need three values")


def mad(xs: list[float]) -> float:
    """Median absolute deviation (0 for an empty list)."""
    m = median(xs)
    return median([abs(x - m) for x in xs])


def high(x: float, xs: list[float], k: float, ratio: float) -> tuple[bool, float, float]:
    """(x is above the median of ``xs`` by k robust σ and by ``ratio`` of the median, median, robust σ)."""
    m = median(xs)
    sd = MAD_SIGMA * mad(xs)
    return x - m > max(k * sd, ratio * m) and m > 0, m, sd


def peer_sets(ranks: list[int], stages: list[list[int]]) -> dict[int, list[int]]:
    """rank -> the ranks it is compared with: its pipeline stage where the job has stages, else all."""
    out = {r: ranks for r in ranks}
    for st in stages:
        members = [r for r in st if r in out]
        for r in members:
            out[r] = members
    return out


@rule("CLU005", "cluster.rank-slow-in-step", cause="cluster.slow_rank_step", scope="cluster",
      requires=("breakdown", "multi_rank", "multi_step"), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag (rank, step) cells whose own time is an outlier across the rank's steps and across its peers."""
    rows = ctx.query(SQL)
    cell = {(int(r["rank"]), int(r["step"])): r for r in rows}
    ranks = sorted({k[0] for k in cell})
    steps_of: dict[int, list[int]] = {}
    for r, s in cell:
        steps_of.setdefault(r, []).append(s)
    pg = ctx.parallel_groups()
    peers = peer_sets(ranks, pg["stages"] if pg else [])
    t = ctx.t
    if max((len(v) for v in steps_of.values()), default=0) < t.min_steps:
        ctx.warn(f"fewer than {t.min_steps} steps per rank: a rank slow in one step cannot be told from its other steps")
        return
    for r in ranks:
        own_r = [float(cell[(r, s)]["own_us"]) for s in sorted(steps_of[r])]
        if len(own_r) < t.min_steps:
            continue
        hits: list[dict[str, Any]] = []
        for s in sorted(steps_of[r]):
            c = cell[(r, s)]
            x = float(c["own_us"])
            present = [p for p in peers[r] if (p, s) in cell]
            if len(present) < t.min_ranks:
                continue
            up_r, med_r, _sd_r = high(x, own_r, t.k, t.min_excess_ratio)
            up_s, med_s, _sd_s = high(x, [float(cell[(p, s)]["own_us"]) for p in present], t.k, t.min_excess_ratio)
            if not (up_r and up_s):
                continue
            others = [p for p in present if p != r]
            wait = median([float(cell[(p, s)]["wait_us"]) for p in others])
            step_us = float(c["step_us"])
            if wait < t.min_wait_share * step_us or wait <= float(c["wait_us"]):
                continue
            hits.append({"step": s, "own_us": round(x, 1), "rank_median_us": round(med_r, 1),
                         "step_median_us": round(med_s, 1), "peers_wait_us": round(wait, 1),
                         "step_us": round(step_us, 1), "saving_us": min(x - med_s, wait), "peers": others})
        if not hits or len(hits) * 2 > len(own_r):
            continue  # none, or slow in most steps: a straggler (CLU001)
        yield _finding(ctx, r, hits, own_r)


def _finding(ctx: RuleContext[Thresholds], rank: int, hits: list[dict[str, Any]], own_r: list[float]) -> Finding:
    worst = max(hits, key=lambda h: h["saving_us"])
    saving = sum(h["saving_us"] for h in hits) / len(own_r)
    n_peers = len(worst["peers"])
    steps = [h["step"] for h in hits]
    when = f"step {steps[0]}" if len(steps) == 1 else f"{len(steps)} steps ({', '.join(map(str, steps[:6]))})"
    return ctx.finding(
        title=f"Rank {rank} is slow in {when}: {worst['own_us'] / 1000:.2f} ms of its own work in step {worst['step']} "
        f"vs {worst['rank_median_us'] / 1000:.2f} ms in its other steps and {worst['step_median_us'] / 1000:.2f} ms on "
        f"its {n_peers} peers, who wait {worst['peers_wait_us'] / 1000:.2f} ms for it",
        evidence={
            "rank": rank,
            "slow_steps": ", ".join(map(str, steps)),
            "own_us": worst["own_us"],
            "rank_median_own_us": worst["rank_median_us"],
            "step_median_own_us": worst["step_median_us"],
            "peers_wait_us": worst["peers_wait_us"],
            "excess_ratio": round(worst["own_us"] / worst["step_median_us"], 3) if worst["step_median_us"] else None,
            "peers": n_peers,
            "statistic": "median / MAD (robust σ = 1.4826 × MAD), cross-step and cross-rank",
            "k": ctx.t.k,
            "min_excess_ratio": ctx.t.min_excess_ratio,
        },
        saving_us=saving,
        step_us=median([h["step_us"] for h in hits]) or None,
        saving_basis="the rank's excess own time over its peers' median in the slow steps (capped by their wait), "
        "spread over its steps",
        ranks=[rank],
        steps=steps,
        top=[{k: h[k] for k in ("step", "own_us", "rank_median_us", "step_median_us", "peers_wait_us")}
             for h in hits][:20],
    )
