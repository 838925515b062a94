"""Intra-node communication is slow while memory-heavy compute (MatMul) runs at the same time.

## Why it matters
Intra-node transfers (HCCS, PCIe, SDMA) read and write device memory by DMA, and MatMul is often
memory-bound: run together they compete for HBM bandwidth. Hermes (§3.1, §4.2.2) reports a 20–40 %
drop in this situation and counts bandwidth contention among the communication causes of Table 3.

## How it is detected
Every communication operator with intra-node traffic (``comm_bandwidth`` rows of transport HCCS,
PCIE, SDMA, SIO or NVLink; Ascend *Communication Bandwidth Info*) whose bandwidth is below
``min_ratio`` × ``baseline_gbps`` is placed on the timeline through its ``comm_ops`` row (start and
elapse time). If a MatMul-like kernel (name or type matching MatMul / GEMM / BatchMatMul / mm on the
same rank, from ``kernels`` or the device events) runs during it, the operator is contended.
Transfers below ``min_bytes`` are not judged (they cannot reach the baseline anyway: COM005). To
tell contention from a slow link, the contended operators must also be slower than
``max_clear_ratio`` × the bandwidth of the same rank's intra-node operators that run without a
MatMul, when there are such operators (otherwise the rule cannot compare and decides on the
threshold alone, as msprof-analyze does). The rule fires per rank when at least ``min_ops``
operators qualify. Slow operators with no concurrent MatMul are left to COM002 (low bandwidth).

The saving per step is the transit time those operators lose against the baseline (transit −
bytes / (``min_ratio`` × baseline)), median over steps: what separating them from compute could
give back at most.

Where the operators are on the rank's device timeline, the saving is the replayed step instead
(:mod:`advisor.stages.replay`): the steps with contended operators replayed with each one's transfers
over its transport at the bandwidth the same rank's intra-node operators reach without a concurrent
MatMul (else at ``min_ratio`` × baseline): its transfer tasks scaled, or where the operator is one
event its transit time alike (``rules/comm/_common.py``); the mean over those steps.

## What to do
Reschedule so heavy MatMul and collectives do not coincide (fewer, coarser overlap chunks in
tensor-parallel overlap schemes; lower priority for one of them), and compare step time with and
without the overlap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from rules.comm._common import BW_ROWS_CTE, INTRA_NODE, Faster, ms, step_us, transfer_changes


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for COM003."""

    baseline_gbps: float = knob(18.0, "expected intra-node (SDMA) bandwidth of a communication operator, GB/s",
                                "msprof-analyze advisor bandwidth_contention.yaml: sdma_baseline 18")
    min_ratio: float = knob(0.8, "an operator below min_ratio × baseline is slow",
                            "msprof-analyze advisor bandwidth_contention.yaml: threshold 0.8")
    min_ops: int = knob(1, "slow operators overlapping a MatMul needed on a rank to fire",
                        "msprof-analyze advisor reports any such operator")
    min_bytes: int = knob(16_000_000, "intra-node transfers smaller than this are not judged: they cannot reach "
                          "the baseline anyway (small packets are COM005's)", "msprof-analyze packet.yaml min_sdma_size 16 MB")
    max_clear_ratio: float = knob(0.9, "contention needs the operators that overlap MatMul to be slower than this "
                                  "share of the same rank's and transport's operators that do not (when there are any)")
    matmul_pattern: str = knob("(?i)matmul|gemm|^(aten::)?b?mm$|addmm|cutlass|xmma",
                               "regular expression for memory-heavy compute kernels (name or op type)",
                               "Hermes §3.1: MatMul is the memory-bound computation that contends with HCCS")


SQL = f"""
WITH {BW_ROWS_CTE},
bw AS (
    SELECT * FROM bw_rows WHERE list_contains($intra, transport) AND bytes >= $min_bytes AND transit_ns > 0
),
placed AS (
    SELECT b.*, b.bytes / b.transit_ns AS gbps, o.start_ns, o.start_ns + o.dur_ns AS end_ns, o.dur_ns
    FROM bw b JOIN comm_ops o ON o.rank = b.rank AND o.name = b.name
         AND (b.step IS NULL OR o.step IS NULL OR o.step = b.step)
         AND (b.group_name IS NULL OR o.group_name IS NULL OR o.group_name = b.group_name)
),
mm AS (
    SELECT rank, start_ns, start_ns + dur_ns AS end_ns, name FROM kernels
    WHERE regexp_matches(coalesce(name, '') || ' ' || coalesce(op_type, ''), $matmul_pattern) AND dur_ns > 0
    UNION ALL
    SELECT rank, start_ns, start_ns + dur_ns, name FROM events  -- the timeline, when there is no kernel table
    WHERE device AND kind = 'kernel' AND dur_ns > 0 AND regexp_matches(name, $matmul_pattern)
      AND NOT EXISTS (SELECT 1 FROM kernels)
),
hit AS (
    SELECT s.rank, s.step, s.name, s.transport, s.bytes, s.transit_ns, s.gbps, s.dur_ns,
           count(m.name) AS n_mm, any_value(m.name) AS mm_name,
           coalesce(least(sum(least(m.end_ns, s.end_ns) - greatest(m.start_ns, s.start_ns)), any_value(s.dur_ns)), 0)
             AS mm_overlap_ns
    FROM placed s LEFT JOIN mm m ON m.rank = s.rank AND m.start_ns < s.end_ns AND m.end_ns > s.start_ns
    GROUP BY ALL
)
SELECT *, n_mm > 0 AS with_mm, gbps < $min_ratio * $baseline_gbps AS slow FROM hit ORDER BY rank, step, name
"""



@rule("COM003", "comm.bandwidth-contention", cause="comm.bandwidth_contention",
      requires=("comm_bandwidth", "comm_ops"), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per rank on slow intra-node operators that overlap MatMul kernels."""
    if not ctx.query("SELECT 1 FROM kernels LIMIT 1") and not ctx.query(
            "SELECT 1 FROM events WHERE device AND kind = 'kernel' LIMIT 1"):
        ctx.warn("no device kernels in this profile: concurrent MatMul cannot be checked")
        return
    df = ctx.df(SQL, {"intra": list(INTRA_NODE)})
    if df.empty:
        return
    target = ctx.t.min_ratio * ctx.t.baseline_gbps
    for rank, all_r in df.groupby("rank"):
        g = all_r[all_r["slow"] & all_r["with_mm"]]
        if g.empty:
            continue
        clear = all_r[~all_r["with_mm"]]
        clear_gbps = float(clear["bytes"].sum() / clear["transit_ns"].sum()) if not clear.empty else None
        hit_gbps = float(g["bytes"].sum() / g["transit_ns"].sum())
        if clear_gbps is not None and hit_gbps >= ctx.t.max_clear_ratio * clear_gbps:
            ctx.warn(f"rank {rank}: intra-node operators are as slow without concurrent MatMul ({clear_gbps:.1f} GB/s) "
                     f"as with it ({hit_gbps:.1f} GB/s): the link, not contention (see COM002)")
            continue
        ops = g.drop_duplicates(["step", "name"])
        if len(ops) < ctx.t.min_ops:
            continue
        g = g.assign(excess_ns=(g["transit_ns"] - g["bytes"] / target).clip(lower=0))
        per_step = g.groupby("step")["excess_ns"].sum()
        saving_us = float(per_step.median()) / 1000.0
        gbps = float(g["bytes"].sum() / g["transit_ns"].sum())
        steps = sorted(int(s) for s in g["step"].dropna().unique())
        yield ctx.finding(
            title=f"Rank {rank}: {len(ops)} intra-node communication operator(s) run at {gbps:.1f} GB/s "
                  f"(< {target:.1f} GB/s) while MatMul kernels run at the same time",
            evidence={
                "contended_ops": len(ops),
                "intra_node_ops": len(all_r.drop_duplicates(["step", "name"])),
                "bandwidth_without_matmul_gbps": None if clear_gbps is None else round(clear_gbps, 3),
                "max_clear_ratio": ctx.t.max_clear_ratio,
                "bandwidth_gbps": round(gbps, 3),
                "threshold_gbps": round(target, 3),
                "baseline_gbps": ctx.t.baseline_gbps,
                "min_ratio": ctx.t.min_ratio,
                "matmul_overlap_ms": ms(float(g["mm_overlap_ns"].sum())),
                "transports": ", ".join(sorted(set(g["transport"]))),
            },
            saving_us=saving_us,
            step_us=step_us(ctx, int(rank)),
            saving_basis="per step, transit time of the contended operators minus bytes / (min_ratio × baseline), "
                         "median over steps",
            ranks=[int(rank)],
            steps=steps,
            ops=list(dict.fromkeys(str(n) for n in g["name"]))[:5],
            top=[{"step": None if r["step"] != r["step"] else int(r["step"]), "op": str(r["name"]),
                  "transport": str(r["transport"]), "gbps": round(float(r["gbps"]), 3),
                  "duration_ms": ms(r["dur_ns"]), "matmul": str(r["mm_name"]),
                  "matmul_overlap_ms": ms(r["mm_overlap_ns"])}
                 for _, r in g.sort_values("gbps").head(5).iterrows()],
            replay=_replay(ctx, int(rank), g, steps, clear_gbps if clear_gbps is not None else target),
        )


def _replay(ctx: RuleContext[Thresholds], rank: int, g: Any, steps: list[int], gbps: float) -> dict[str, Any]:
    """The finding's ``replay``: the contended operators' transfers at ``gbps`` (the rank's operators without a
    concurrent MatMul, else the threshold) on the steps that have them."""
    assumption = (f"if the contended operators moved their bytes at {gbps:.1f} GB/s (the same rank's intra-node "
                  "operators without a concurrent MatMul, else the threshold): no MatMul beside them")
    ops = [Faster(int(r["step"]), str(r["name"]), str(r["transport"]), float(r["bytes"]), float(r["transit_ns"]), gbps)
           for _, r in g.iterrows() if r["step"] == r["step"]]
    changes, missing = transfer_changes(ctx, rank, ops)
    if missing or not changes:
        return {"estimated": False, "assumption": assumption,
                "reason": ("no contended operator is slower than that bandwidth" if not missing else
                           f"{len(missing)} contended operator(s) are on no device timeline of the rank: nothing to "
                           "shorten")}
    return ctx.what_if(rank, changes, assumption, steps)
