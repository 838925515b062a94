"""HCCS transfers whose size is not a multiple of 512 bytes.

## Why it matters
HCCS (the Ascend intra-node interconnect) moves data efficiently only in 512-byte aligned blocks;
a transfer of any other size loses bandwidth. Hermes (§4.2.2, Table 3, *byte alignment*) detects
operators whose data size breaks this rule; it is specific to Ascend.

## How it is detected
Intra-node Ascend transfers (transport HCCS or SDMA, the DMA engine behind intra-node HCCS
traffic) larger than ``min_bytes`` in ``comm_bandwidth`` (per operator) and ``comm_matrix`` (per
link; SDMA entries that duplicate an operator's HCCS entry are dropped) are checked for size mod ``alignment_bytes`` ≠ 0.
Point-to-point transfers read from Kineto traces (NCCL, gloo ...) are never checked: the rule
is about Ascend's HCCS, and their rows carry a ``kineto:`` transport (advisor.stages.comm_links). The exported size is the sum over the
operator's transfers: a misaligned sum proves at least one misaligned transfer (an aligned sum may
still hide some, so the rule can miss cases but does not invent them). Sizes exported in MB are
rounded; remainders within ``size_tolerance_bytes`` of a multiple are treated as aligned.
One finding per transport, naming the ranks.

The saving per step is, on the worst rank, the transit time of the misaligned operators minus
their bytes at the bandwidth that aligned operators of a similar size (at least half the misaligned
median) reach on the same rank and transport, or on all ranks when that rank has none (median over
steps).
Without aligned operators to compare with there is no estimate, and the severity follows the
misaligned share of transit time (as msprof-analyze: high from 70 %, medium from 20 %).

Where the operator table is the source, the saving is the replayed step instead
(:mod:`advisor.stages.replay`): on each rank with misaligned transfers and aligned ones of a similar size
(at least half that rank's misaligned median), each misaligned operator's transfers over the transport
take its bytes at that rank's aligned bandwidth (its transfer tasks scaled, or where the operator is one
event its transit time alike, see ``rules/comm/_common.py``); per step, the slowest of those ranks' replayed steps
against its measured one, the mean over the steps. A rank without aligned transfers to compare with is
not replayed, and neither is the finding then.

## What to do
Pad or reshape the communicated tensors (bucket sizes, hidden sizes, sequence lengths) so each
transfer is a multiple of 512 bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RankPart, RuleContext, knob, rule
from advisor.model import Finding, Severity
from advisor.schema import NOT_KINETO_SQL
from rules.comm._common import (
    BW_ROWS_CTE,
    REPLAY_COLUMNS,
    Faster,
    mean_step_us,
    ms,
    replay_rows,
    replay_summary,
    step_us,
)


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for COM006."""

    alignment_bytes: int = knob(512, "HCCS transfer sizes should be a multiple of this",
                                "Hermes §4.2.2 byte alignment; msprof-analyze ByteAlignmentChecker _BASE_SIZE 512")
    min_bytes: int = knob(512, "transfers of at most this size are not checked",
                          "msprof-analyze ByteAlignmentChecker _MIN_SIZE 512")
    size_tolerance_bytes: int = knob(2, "remainders this close to a multiple count as aligned (MB rounding in exports)")


SQL = f"""
WITH {BW_ROWS_CTE},
x AS (
    SELECT 'comm_bandwidth' AS src, rank, step, name, transport, bytes, transit_ns FROM bw_rows
    UNION ALL
    SELECT 'comm_matrix', rank, step, name, upper(transport), bytes,
           coalesce(transit_ns, CASE WHEN bandwidth_gbps > 0 THEN bytes / bandwidth_gbps END)
    FROM comm_matrix WHERE src_rank IS DISTINCT FROM dst_rank AND {NOT_KINETO_SQL}
)
SELECT *, bytes % $alignment_bytes AS rem,
       least(bytes % $alignment_bytes, $alignment_bytes - bytes % $alignment_bytes) > $size_tolerance_bytes
         AS misaligned
FROM x WHERE transport IN ('HCCS', 'SDMA') AND bytes > $min_bytes
"""


# the rank part: each rank's operator rows over HCCS / SDMA, misaligned or not (what a replay bounds)
RANK_SQL = f"""
WITH {BW_ROWS_CTE}
SELECT rank, step, name, transport, bytes, transit_ns,
       least(bytes % $alignment_bytes, $alignment_bytes - bytes % $alignment_bytes) > $size_tolerance_bytes
         AS misaligned
FROM bw_rows WHERE transport IN ('HCCS', 'SDMA') AND bytes > $min_bytes AND transit_ns > 0
ORDER BY rank, transport, step, name
"""

RANK_TABLES = {"com006_replay": "transport VARCHAR, " + REPLAY_COLUMNS}
NO_REFERENCE = "no aligned transfers of a similar size on this rank and transport to compare with: not replayed"


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """Per rank and transport with misaligned operators: its steps replayed with each misaligned
    operator's transfers at the bandwidth of the rank's aligned ones of a similar size."""
    df = ctx.df(RANK_SQL)
    rows: list[tuple[Any, ...]] = []
    for (rank, transport), g in df.groupby(["rank", "transport"], sort=True):
        bad = g[g["misaligned"]]
        if bad.empty:
            continue
        ok = g[~g["misaligned"] & (g["bytes"] >= 0.5 * float(bad["bytes"].median()))]
        if ok.empty:
            rows += [(transport, int(rank), int(st), None, None, None, NO_REFERENCE)
                     for st in sorted(bad["step"].dropna().unique())]
            continue
        ref = float(ok["bytes"].sum() / ok["transit_ns"].sum())
        ops = [Faster(None if r["step"] != r["step"] else int(r["step"]), str(r["name"]), str(transport),
                      float(r["bytes"]), float(r["transit_ns"]), ref) for _, r in bad.iterrows()]
        rows += [(transport, *r) for r in replay_rows(ctx, int(rank), ops)]
    return {"com006_replay": rows}


@rule("COM006", "comm.byte-alignment", cause="comm.byte_alignment", requires=("comm_bandwidth",),
      thresholds=Thresholds, scope="cluster", rank_part=RankPart(RANK_TABLES, rank_part))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per transport on HCCS / SDMA transfers whose size is not 512-byte aligned."""
    df = ctx.df(SQL)
    if df.empty:
        return
    # one source per transport: the operator table when it has rows, else the matrix
    for transport, all_t in df.groupby("transport"):
        src = "comm_bandwidth" if (all_t["src"] == "comm_bandwidth").any() else "comm_matrix"
        g = all_t[all_t["src"] == src]
        bad = g[g["misaligned"]]
        if bad.empty:
            continue
        # compare like with like: aligned transfers of a similar size (at least half the misaligned median)
        ok = g[~g["misaligned"] & (g["transit_ns"] > 0) & (g["bytes"] >= 0.5 * float(bad["bytes"].median()))]
        bad_time = float(bad["transit_ns"].fillna(0).sum())
        total_time = float(g["transit_ns"].fillna(0).sum())
        share_time = bad_time / total_time if total_time > 0 else 1.0
        ref_gbps = float(ok["bytes"].sum() / ok["transit_ns"].sum()) if not ok.empty else None
        bad_gbps = float(bad["bytes"].sum() / bad_time) if bad_time > 0 else None
        saving_us, s_us, severity = None, step_us(ctx), None
        if ref_gbps and bad_time > 0:
            # the reference is the same rank's aligned bandwidth where it has some (a slow link is not misalignment)
            own = ok.groupby("rank").apply(lambda x: x["bytes"].sum() / x["transit_ns"].sum(), include_groups=False)
            ref = bad["rank"].map(own).fillna(ref_gbps)
            b = bad.assign(excess_ns=bad["transit_ns"] - bad["bytes"] / ref)
            per = b.groupby(["rank", "step"], dropna=False)["excess_ns"].sum().clip(lower=0)
            saving_us = float(per.groupby("step", dropna=False).max().median()) / 1000.0
            s_us = step_us(ctx, int(per.groupby("rank").median().idxmax()))
        else:
            severity = Severity.HIGH if share_time >= 0.7 else Severity.MEDIUM if share_time >= 0.2 else Severity.LOW
        ops = bad.drop_duplicates(["rank", "step", "name"])
        ranks = sorted(int(r) for r in bad["rank"].unique())
        steps = sorted(int(s) for s in bad["step"].dropna().unique())
        if src != "comm_bandwidth":
            replay: dict[str, Any] = {"estimated": False, "reason": "the transfers are per-link aggregates "
                                      "(communication_matrix), not operators: nothing to shorten"}
        else:
            replay = replay_summary(
                ctx.query("SELECT * FROM com006_replay WHERE transport = $t", {"t": transport}), ranks, steps,
                f"if each misaligned {transport} transfer moved its bytes at the bandwidth of the same rank's aligned "
                f"ones of a similar size" + (f" ({ref_gbps:.1f} GB/s over all ranks)" if ref_gbps else ""),
                mean_step_us(ctx, ranks, steps))
        yield ctx.finding(
            title=f"{len(ops)} {transport} transfer(s) are not multiples of {ctx.t.alignment_bytes} bytes "
                  f"({share_time:.0%} of {transport} transit time"
                  + (f"; {bad_gbps:.1f} vs {ref_gbps:.1f} GB/s aligned)" if ref_gbps and bad_gbps else ")"),
            evidence={
                "transport": transport,
                "misaligned_transfers": len(bad),
                "checked_transfers": len(g),
                "alignment_bytes": ctx.t.alignment_bytes,
                "misaligned_time_share": round(share_time, 4),
                "misaligned_gbps": None if bad_gbps is None else round(bad_gbps, 3),
                "aligned_gbps": None if ref_gbps is None else round(ref_gbps, 3),
                "source": src,
            },
            saving_us=saving_us,
            step_us=s_us,
            severity=severity,
            saving_basis="per step, transit time of the misaligned transfers minus their bytes at the aligned "
                         "transfers' bandwidth, worst rank, median over steps" if saving_us is not None else
                         "no aligned transfers to compare with: severity from the misaligned share of transit time",
            ranks=ranks,
            steps=steps,
            ops=[str(n) for n in bad.groupby("name")["transit_ns"].sum().sort_values(ascending=False, kind="stable")
                 .index[:5]],
            top=[{"rank": int(r["rank"]), "step": None if r["step"] != r["step"] else int(r["step"]),
                  "op": r["name"], "bytes": int(r["bytes"]), "bytes_mod_alignment": int(r["rem"]),
                  "transit_ms": ms(r["transit_ns"])}
                 for _, r in bad.sort_values(["transit_ns", "rank", "step", "name"], ascending=[False, True, True, True],
                                             na_position="last").head(5).iterrows()],
            replay=replay,
        )
