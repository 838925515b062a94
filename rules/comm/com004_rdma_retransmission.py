"""An RDMA transfer lasts longer than the retransmission timeout: packets were lost and resent.

## Why it matters
RoCE/InfiniBand recover a lost packet only after a timeout of about four seconds. One
retransmission therefore stalls the whole collective, and every member of the group, for
seconds. Hermes (§4.2.2, Table 3) lists RDMA retransmission among the communication causes and
detects it by comparing the RDMA transmission time of an operator with a threshold of about 4 s.

## How it is detected
Every RDMA entry of ``comm_bandwidth`` (Ascend *Communication Bandwidth Info*: per operator and
transport) — or of ``comm_matrix`` (per link) when the export has no bandwidth rows — whose transit
time exceeds ``min_transit_s`` is a suspected retransmission. As msprof-analyze does, an operator is
not counted when another member of its group finished the same operator (same step, group and
name in ``comm_ops``) in less than the threshold: the long time is then waiting for a late peer, not
a retransmission. One finding per rank. Point-to-point transfers read from Kineto traces are
never judged: they have no transit time and their rows carry a ``kineto:`` transport
(advisor.stages.comm_links).

The saving per step is the transit time of those transfers minus what their bytes need at the
RDMA peak (``peak_rdma_gbps``), median over steps with such a transfer.

## What to do
Check the retransmission counters of the NICs and switch ports on the path, the RDMA settings of
switches and servers (PFC / ECN, traffic class and priority: ``HCCL_RDMA_TC``, ``HCCL_RDMA_SL``) and
the links (optical modules, port flapping).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from advisor.schema import NOT_KINETO_SQL
from rules.comm._common import PeakThresholds, ms, step_us


@dataclass(frozen=True)
class Thresholds(PeakThresholds):
    """Thresholds for COM004."""

    min_transit_s: float = knob(4.0, "RDMA transit time above which a retransmission is assumed, seconds",
                                "Hermes §4.2.2 (often 4 seconds); msprof-analyze rdma_analysis.yaml "
                                "min_retransmission_time 4000 ms")


SQL = f"""
WITH rd AS (
    SELECT 'comm_bandwidth' AS src, rank, step, name, group_name, NULL::INTEGER AS src_rank,
           NULL::INTEGER AS dst_rank, bytes,
           coalesce(transit_ns, CASE WHEN bandwidth_gbps > 0 THEN bytes / bandwidth_gbps END) AS transit_ns
    FROM comm_bandwidth WHERE upper(transport) = 'RDMA'
    UNION ALL
    SELECT 'comm_matrix', rank, step, name, group_name, src_rank, dst_rank, bytes,
           coalesce(transit_ns, CASE WHEN bandwidth_gbps > 0 THEN bytes / bandwidth_gbps END)
    FROM comm_matrix
    WHERE upper(transport) = 'RDMA' AND {NOT_KINETO_SQL}
      AND NOT EXISTS (SELECT 1 FROM comm_bandwidth WHERE upper(transport) = 'RDMA')
),
long AS (SELECT * FROM rd WHERE transit_ns > $min_transit_s * 1e9),
peers AS (  -- shortest elapse time of the same operator in its group
    SELECT step, coalesce(group_name, '') AS grp, name, min(dur_ns) AS min_dur_ns, count(*) AS members
    FROM comm_ops GROUP BY ALL
)
SELECT l.*, p.min_dur_ns, p.members
FROM long l LEFT JOIN peers p
  ON p.name = l.name AND p.grp = coalesce(l.group_name, '') AND p.step IS NOT DISTINCT FROM l.step
ORDER BY rank, step
"""


@rule("COM004", "comm.rdma-retransmission", cause="comm.rdma_retransmission",
      requires=("comm_bandwidth",), thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per rank on RDMA transfers longer than the retransmission timeout."""
    df = ctx.df(SQL)
    if df.empty:
        return
    limit_ns = ctx.t.min_transit_s * 1e9
    unsync = df["min_dur_ns"].notna() & (df["min_dur_ns"] < limit_ns) & (df["members"] > 1)
    if unsync.any():
        ctx.warn(f"{int(unsync.sum())} long RDMA transfer(s) not counted: another member of the group finished "
                 f"the same operator in under {ctx.t.min_transit_s:g} s (waiting for a peer, not retransmission)")
    df = df[~unsync]
    peak = ctx.t.peak_rdma_gbps
    for rank, g in df.groupby("rank"):
        g = g.assign(excess_ns=(g["transit_ns"] - g["bytes"].fillna(0) / peak).clip(lower=0))
        n_steps = len(ctx.breakdown(rank=int(rank)))
        # a stall hits some steps only: amortise it over every profiled step of the rank
        saving_us = float(g["excess_ns"].sum()) / 1000.0 / max(n_steps, g["step"].nunique(), 1)
        longest = g.sort_values("transit_ns", ascending=False)
        yield ctx.finding(
            title=f"Rank {rank}: {len(g)} RDMA transfer(s) last longer than {ctx.t.min_transit_s:g} s "
                  f"(longest {float(longest['transit_ns'].iloc[0]) / 1e9:.2f} s): suspected retransmission",
            evidence={
                "long_transfers": len(g),
                "longest_transit_s": round(float(longest["transit_ns"].iloc[0]) / 1e9, 3),
                "min_transit_s": ctx.t.min_transit_s,
                "rdma_bytes": int(g["bytes"].fillna(0).sum()),
                "peak_rdma_gbps": peak,
                "source": str(g["src"].iloc[0]),
            },
            saving_us=saving_us,
            step_us=step_us(ctx, int(rank)),
            saving_basis="RDMA transit time of the long transfers beyond bytes / RDMA peak, summed and averaged "
                         "over the rank's profiled steps",
            ranks=[int(rank)],
            steps=sorted(int(s) for s in g["step"].dropna().unique()),
            ops=list(dict.fromkeys(str(n) for n in g["name"] if n is not None))[:5],
            top=[{"step": None if r["step"] != r["step"] else int(r["step"]), "op": r["name"],
                  "transit_ms": ms(r["transit_ns"]),
                  "bytes": None if r["bytes"] != r["bytes"] else int(r["bytes"]),
                  "group_min_elapse_ms": ms(r["min_dur_ns"]) if r["min_dur_ns"] == r["min_dur_ns"] else None}
                 for _, r in longest.head(5).iterrows()],
        )
