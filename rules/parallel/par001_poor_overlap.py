"""Communication runs after computation instead of under it: little of it is hidden and the rest stalls the step.

## Why it matters
Data-, tensor- and pipeline-parallel training all move data between devices; that time costs
nothing when it runs while the device computes and costs its full length when it does not.
Hermes' multi-component parallel analysis (§4.2.1) splits each step into overlap,
not-overlapped computation / communication / host, and free time, and calls a parallel
bottleneck when the overlap is well below what the job could reach — before any per-operator
tuning, because the overlap decides which operators end up on the critical path (PanGu-α,
§5.2.1 iteration 2: overlap only 2.66 % of the step; appendix D: GPT3-13B, 38 ms overlapped in
an 891 ms step).

## How it is detected
From the breakdown, per (rank, step) on ranks with device events: the **overlap ratio**
``overlapped_us / (overlapped_us + comm_only_us)`` (share of communication hidden under
computation) and the **not-overlapped communication share** ``comm_only_us / step_us``. A rank
fires when, over its steps, the median overlap ratio is below ``max_overlap_ratio`` *and* the
median not-overlapped share is at least ``min_comm_only_share``.

The saving is what overlap could hide at most: the not-overlapped communication, bounded by the
not-overlapped computation available to hide it under (``min(comm_only, compute_only)``). When
the export separates waiting from transfer (Ascend ``communication.json`` Wait Time), only the
transfer part of the communication counts, because time spent waiting for a late peer is a
slow-rank / synchronisation problem (see cluster.slow_rank, comm.slow_synchronization), not an
overlap one; on Kineto the wait cannot be separated and the saving says so.

CPU-only traces are skipped on purpose: with gloo the collective runs on the same CPU cores as
the "computation" (host operators), its interval includes the wait for the peer, and DDP already
issues it asynchronously from the backward pass, so a low overlap there measures neither hidden
transfer nor a schedule that could change (gloo_slow_rank: rank 0's 77 % not-overlapped
collective time is all waiting for rank 1).

## What to do
Let communication start as soon as its input is ready and let computation that does not depend
on it run meanwhile: DDP bucketing / ``overlap_grad_reduce``, FSDP prefetch, Megatron
``overlap_param_gather``, multi-shard (split the batch so one shard computes while the other
communicates, Hermes appendix D), or search for a hybrid-parallel layout that communicates less.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for PAR001."""

    max_overlap_ratio: float = knob(
        0.5, "median share of communication hidden under computation below which overlap is poor",
        "first principles: less than half of the communication hidden; Hermes §5.2.1 flagged 2.66 % of the step",
    )
    min_comm_only_share: float = knob(
        0.10, "median not-overlapped communication as a share of the step needed to fire",
        "CAUSES.md 'high' cutoff (10 % of the step); Hermes Table 5: 28 % not-overlapped AllReduce was the bottleneck",
    )


SQL = """
WITH w AS (  -- waiting share of communication per (rank, step), where the export has it
    SELECT rank, step, sum(wait_ns)::DOUBLE / nullif(sum(dur_ns), 0) AS wait_ratio
    FROM comm_ops WHERE wait_ns IS NOT NULL AND step IS NOT NULL GROUP BY rank, step
)
SELECT b.rank, b.step, b.step_us, b.overlapped_us, b.comm_only_us, b.compute_only_us,
       b.overlapped_us / nullif(b.overlapped_us + b.comm_only_us, 0) AS overlap_ratio,
       b.comm_only_us / nullif(b.step_us, 0) AS comm_only_share,
       CASE WHEN w.wait_ratio IS NULL THEN NULL ELSE least(greatest(w.wait_ratio, 0.0), 1.0) END AS wait_ratio
FROM breakdown b JOIN ranks r ON r.rank = b.rank AND r.has_device
LEFT JOIN w ON w.rank = b.rank AND w.step = b.step
WHERE b.step_us > 0
ORDER BY b.rank, b.step
"""


@rule("PAR001", "parallel.poor-overlap", cause="parallel.poor_overlap",
      requires=("breakdown", "device"), thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding for the ranks whose communication is mostly not overlapped."""
    df = ctx.df(SQL)
    if df.empty:
        return
    df = df[df["overlapped_us"] + df["comm_only_us"] > 0]
    if df.empty:
        return
    df = df.assign(
        hideable_us=df["comm_only_us"] * (1.0 - df["wait_ratio"].fillna(0.0)),
    )
    df = df.assign(saving_us=df[["hideable_us", "compute_only_us"]].min(axis=1))
    per_rank: list[dict[str, Any]] = []
    for rank, g in df.groupby("rank"):
        ratio = float(g["overlap_ratio"].median())
        share = float(g["comm_only_share"].median())
        if ratio >= ctx.t.max_overlap_ratio or share < ctx.t.min_comm_only_share:
            continue
        per_rank.append({
            "rank": int(rank), "overlap_ratio": ratio, "comm_only_share": share,
            "comm_only_us": float(g["comm_only_us"].median()), "overlapped_us": float(g["overlapped_us"].median()),
            "compute_only_us": float(g["compute_only_us"].median()), "saving_us": float(g["saving_us"].median()),
            "step_us": float(g["step_us"].median()), "steps": [int(s) for s in g["step"]],
            "wait_known": bool(g["wait_ratio"].notna().any()),
            "wait_ratio": float(g["wait_ratio"].median()) if g["wait_ratio"].notna().any() else None,
        })
    if not per_rank:
        return
    per_rank.sort(key=lambda x: -x["saving_us"])

    def med(key: str) -> float:
        vals: list[float] = sorted(x[key] for x in per_rank)
        n = len(vals)
        return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2

    ranks = [x["rank"] for x in per_rank]
    wait_known = any(x["wait_known"] for x in per_rank)
    where = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks"
    title = (f"Poor compute/communication overlap on {where}: only {med('overlap_ratio'):.0%} of communication is "
             f"hidden; {med('comm_only_us') / 1000:.1f} ms per step ({med('comm_only_share'):.0%}) runs with no "
             f"computation beside it")
    evidence: dict[str, Any] = {
        "overlap_ratio": round(med("overlap_ratio"), 4),
        "max_overlap_ratio": ctx.t.max_overlap_ratio,
        "comm_only_share": round(med("comm_only_share"), 4),
        "min_comm_only_share": ctx.t.min_comm_only_share,
        "comm_only_us_median": round(med("comm_only_us"), 1),
        "overlapped_us_median": round(med("overlapped_us"), 1),
        "compute_only_us_median": round(med("compute_only_us"), 1),
        "step_us_median": round(med("step_us"), 1),
        "ranks_affected": len(ranks),
        "wait_separated": "yes (communication.json wait time excluded)" if wait_known else "no (Kineto: includes waiting)",
    }
    if wait_known:
        evidence["wait_ratio"] = round(med("wait_ratio") if all(x["wait_ratio"] is not None for x in per_rank)
                                       else next(x["wait_ratio"] for x in per_rank if x["wait_ratio"] is not None), 4)
    top = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in x.items() if k not in ("steps", "wait_known")}
           for x in per_rank[:20]]
    yield ctx.finding(
        title=title,
        evidence=evidence,
        saving_us=med("saving_us"),
        step_us=med("step_us"),
        saving_basis="median per-step not-overlapped communication"
        + (" minus its waiting share" if wait_known else " (including any wait for peers, which Kineto cannot separate)")
        + ", bounded by the not-overlapped computation it could hide under; median over the ranks listed",
        ranks=ranks,
        steps=sorted({s for x in per_rank for s in x["steps"]}),
        top=top,
    )
