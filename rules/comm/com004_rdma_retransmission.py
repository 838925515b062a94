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
RDMA peak (``peak_rdma_gbps``), summed and spread over the rank's profiled steps (a stall hits some
steps only).

Where the operator table is the source, the saving is the replayed step instead
(:mod:`advisor.stages.replay`): the rank's steps with long transfers replayed with each long operator's
RDMA transfers at the bandwidth the rank's other RDMA operators reach (else at the peak), spread over
the rank's profiled steps the same way (a step without a long transfer saves nothing). Only that rank
is replayed: the peers' waits for its transfer are kept, so the saving is the rank's own step's.

## What to do
Check the retransmission counters of the NICs and switch ports on the path, the RDMA settings of
switches and servers (PFC / ECN, traffic class and priority: ``HCCL_RDMA_TC``, ``HCCL_RDMA_SL``) and
the links (optical modules, port flapping).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RankPart, RuleContext, knob, rule
from advisor.model import Finding
from advisor.schema import NOT_KINETO_SQL
from rules.comm._common import (
    REPLAY_COLUMNS,
    Faster,
    PeakThresholds,
    mean_step_us,
    ms,
    replay_rows,
    replay_summary,
    step_us,
)


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


# the rank part: each rank's RDMA operator rows (the long ones are replayed at the others' bandwidth)
RANK_SQL = """
SELECT rank, step, name, bytes,
       coalesce(transit_ns, CASE WHEN bandwidth_gbps > 0 THEN bytes / bandwidth_gbps END) AS transit_ns
FROM comm_bandwidth WHERE upper(transport) = 'RDMA' AND step IS NOT NULL
ORDER BY rank, step, name
"""

RANK_TABLES = {"com004_replay": REPLAY_COLUMNS + ", ops VARCHAR, gbps DOUBLE"}


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """Per rank with RDMA transfers longer than ``min_transit_s``: the steps that have them replayed with
    those operators' RDMA transfers at the bandwidth of the rank's other RDMA operators (else the peak);
    ``ops`` the operators shortened in the step, ``gbps`` that bandwidth."""
    df = ctx.df(RANK_SQL)
    rows: list[tuple[Any, ...]] = []
    limit_ns = ctx.t.min_transit_s * 1e9
    for rank, g in df.groupby("rank", sort=True):
        long = g[g["transit_ns"] > limit_ns]
        if long.empty:
            continue
        rest = g[(g["transit_ns"] <= limit_ns) & (g["transit_ns"] > 0) & (g["bytes"] > 0)]
        gbps = float(rest["bytes"].sum() / rest["transit_ns"].sum()) if not rest.empty else ctx.t.peak_rdma_gbps
        names = long.groupby("step")["name"].agg(lambda x: ",".join(sorted(str(n) for n in x)))
        sized = long[long["bytes"] > 0]
        ops = [Faster(int(r["step"]), str(r["name"]), "RDMA", float(r["bytes"]), float(r["transit_ns"]), gbps)
               for _, r in sized.iterrows()]
        got = {r[1]: r for r in replay_rows(ctx, int(rank), ops)}
        for st in sorted(int(x) for x in long["step"].unique()):
            if len(long[long["step"] == st]) > len(sized[sized["step"] == st]):
                row: tuple[Any, ...] = (int(rank), st, None, None, None, "a long RDMA transfer's bytes are not exported")
            else:
                row = got.get(st, (int(rank), st, None, None, None, "not replayed"))
            rows.append((*row, names.loc[st], gbps))
    return {"com004_replay": rows}


@rule("COM004", "comm.rdma-retransmission", cause="comm.rdma_retransmission",
      requires=("comm_bandwidth",), thresholds=Thresholds, scope="cluster", rank_part=RankPart(RANK_TABLES, rank_part))
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
        # a stall hits some steps only: amortise it over every profiled step of the rank
        n_steps = max(len(ctx.breakdown(rank=int(rank))), g["step"].nunique(), 1)
        saving_us = float(g["excess_ns"].sum()) / 1000.0 / n_steps
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
            replay=_replay_of(ctx, int(rank), g),
        )


def _replay_of(ctx: RuleContext[Thresholds], rank: int, g: Any) -> dict[str, Any]:
    """The finding's ``replay``: the rank part's replay of the rank's steps with long transfers, spread over
    its profiled steps; not estimated where the rule does not count every transfer the replay shortened (a
    long one another member finished early) or the source is the per-link matrix (no operators)."""
    if (g["src"] != "comm_bandwidth").any():
        return {"estimated": False, "reason": "the long transfers are per-link aggregates (communication_matrix), "
                "not operators: nothing to shorten"}
    rows = ctx.query("SELECT * FROM com004_replay WHERE rank = $rank ORDER BY step", {"rank": rank})
    counted = g.groupby("step")["name"].agg(lambda x: ",".join(sorted(str(n) for n in x)))
    for r in rows:
        if r["saving_ns"] is not None and counted.get(r["step"]) != r["ops"]:
            r["saving_ns"], r["reason"] = None, (f"step {r['step']}: the replay shortened {r['ops']}, the rule counts "
                                                 f"{counted.get(r['step'], 'none of them')}")
    gbps = float(rows[0]["gbps"]) if rows else ctx.t.peak_rdma_gbps
    # the rank's profiled steps (those without a long transfer save nothing), as the rule counts them
    bd = ctx.breakdown(rank=rank)
    steps = sorted({int(s) for s in bd["step"].tolist()} | {int(s) for s in counted.index})
    return replay_summary(rows, [rank], steps, f"if the long RDMA transfers moved their bytes at {gbps:.2f} GB/s "
                          "(the rank's other RDMA transfers, else the RDMA peak): no retransmission",
                          mean_step_us(ctx, [rank], steps))
