"""Link bandwidth per transport against its physical peak: saturated everywhere, or well below it.

## Why it matters
Hermes' transmission analysis (§4.2.2) starts here. If every link already moves data at its
physical limit, nothing in the software makes communication faster: only less traffic or a faster
network does. If a transport stays well below its peak, something specific slows it (Table 3:
small packets, HCCS byte misalignment, contention with concurrent compute, RDMA retransmission,
network settings), and the other communication rules look for which.

## How it is detected
Per link (``comm_matrix``: source rank → destination rank and transport) or, when the export has
no matrix, per rank and transport (``comm_bandwidth``: Ascend *Communication Bandwidth Info*), the
achieved bandwidth is Σ bytes / Σ transit time over the profile. It is compared with the peak of
its transport (HCCS, PCIe, RDMA, SDMA, NVLink: ``peak_*_gbps``, see ``rules/comm/_common.py`` for
the table and its sources). Links that moved less than ``min_bytes`` or whose transport has no
known peak are not judged; a transport measured above its configured peak (``max_plausible_utilization``)
means the table does not fit this hardware (e.g. Ascend 910B HCCS links are faster than the 910 of
the Hermes testbed): it is reported in the warnings and not judged. SDMA entries that duplicate an
operator's HCCS / PCIe / SIO entries are dropped.

* Every judged link at ≥ ``utilization`` × peak → ``comm.link_saturated``.
* Otherwise each transport with links below ``utilization`` × peak → ``comm.low_bandwidth``, with
  the saving per step = transit time − bytes / (``utilization`` × peak) summed over that step's
  transfers on the worst rank (median over steps): the time given back if the transport reached the
  threshold. It is an upper bound because overlapped communication costs the step less.

Where the operator table (``comm_bandwidth``) has the transport's operators, the saving is the
replayed step instead (:mod:`advisor.stages.replay`): on each rank with a link below the threshold,
each operator's transfers over the transport take at most their bytes at ``utilization`` × peak (its
transfer tasks scaled, or where the operator is one event its transit time alike, see
``rules/comm/_common.py``); per
step, the slowest of those ranks' replayed steps against its measured one, the mean over the steps
with such transfers. The finding's steps are those with a transfer below the threshold.
The saturated finding states no saving: its fix is less traffic or a faster network, of a size the
profile does not give.

Kineto traces carry no per-transport transit time (an NCCL kernel's duration includes waiting),
so this rule needs the Ascend communication tables.

## What to do
Saturated: cut traffic (gradient compression, a parallel layout with less cross-node traffic) or
use a faster network. Below peak: read the other communication findings (COM003–COM007) and the
slow-link analysis for the cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from advisor.engine.rule import RankPart, RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.comm._common import (
    BW_ROWS_CTE,
    REPLAY_COLUMNS,
    Faster,
    PeakThresholds,
    mean_step_us,
    peak_case,
    replay_rows,
    replay_summary,
    step_us,
)


@dataclass(frozen=True)
class Thresholds(PeakThresholds):
    """Thresholds for COM002."""

    utilization: float = knob(
        0.8, "achieved / peak bandwidth that counts as reaching the link's limit",
        "msprof-analyze advisor bandwidth_contention.yaml threshold 0.8; Hermes §5 VGG16: 53 % utilisation was low")
    min_bytes: int = knob(1_000_000, "links that moved fewer bytes in the whole profile are not judged (1 MB)")
    max_plausible_utilization: float = knob(
        1.05, "a transport measured above this share of its configured peak means the peak is wrong for the "
        "hardware: it is then not judged")


LINKS = """
WITH cm AS (
    SELECT 'comm_matrix' AS src, rank, step, upper(transport) AS transport, src_rank, dst_rank, bytes,
           coalesce(transit_ns, CASE WHEN bandwidth_gbps > 0 THEN bytes / bandwidth_gbps END) AS transit_ns
    FROM comm_matrix
    WHERE bytes > 0 AND src_rank IS DISTINCT FROM dst_rank
      AND NOT regexp_matches(coalesce(name, ''), '(?i)-(top\\d*|middle|bottom\\d*)@')
),
{bw_rows},
cb AS (
    SELECT 'comm_bandwidth' AS src, rank, step, transport, NULL::INTEGER AS src_rank,
           NULL::INTEGER AS dst_rank, bytes, transit_ns
    FROM bw_rows
),
links AS (
    SELECT * FROM cm UNION ALL SELECT * FROM cb WHERE NOT EXISTS (SELECT 1 FROM cm)
)
SELECT src, rank, coalesce(step, -1) AS step, transport, src_rank, dst_rank,
       sum(bytes) AS bytes, sum(transit_ns) AS transit_ns, {peak} AS peak_gbps
FROM links WHERE transit_ns > 0
GROUP BY ALL
""".format(peak=peak_case("transport"), bw_rows=BW_ROWS_CTE)


# the rank part: the operators' transfers per transport (what a replay shortens)
OPS_SQL = f"""
WITH {BW_ROWS_CTE}
SELECT rank, step, name, transport, bytes, transit_ns FROM bw_rows
WHERE transit_ns > 0 AND step IS NOT NULL
ORDER BY rank, transport, step, name
"""

RANK_TABLES = {"com002_replay": "transport VARCHAR, " + REPLAY_COLUMNS}


def _links(df: Any) -> Any:
    """Per link (rank, transport, source, destination) over the profile: bytes, transit, peak, GB/s, utilisation."""
    links = df.groupby(["rank", "transport", "src_rank", "dst_rank"], dropna=False).agg(
        bytes=("bytes", "sum"), transit_ns=("transit_ns", "sum"), peak=("peak_gbps", "first")).reset_index()
    links["gbps"] = links["bytes"] / links["transit_ns"]
    links["util"] = links["gbps"] / links["peak"]
    return links


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """Per rank and transport with a link below ``utilization`` × peak (judged as the rule does, on the
    rank's own links): its steps replayed with every operator's transfers over the transport at no less
    than that bandwidth."""
    df = ctx.df(LINKS)
    if df.empty:
        return {}
    links = _links(df[df["peak_gbps"].notna()])
    low = links[(links["bytes"] >= ctx.t.min_bytes) & (links["util"] < ctx.t.utilization)]
    if low.empty:
        return {}
    ops = ctx.df(OPS_SQL)
    rows: list[tuple[Any, ...]] = []
    for (rank, transport), g in low.groupby(["rank", "transport"], sort=True):
        target = ctx.t.utilization * float(g["peak"].iloc[0])
        mine = ops[(ops["rank"] == rank) & (ops["transport"] == transport)]
        faster = [Faster(int(r["step"]), str(r["name"]), str(transport), float(r["bytes"]), float(r["transit_ns"]),
                         target) for _, r in mine.iterrows()]
        rows += [(transport, *r) for r in replay_rows(ctx, int(rank), faster)]
    return {"com002_replay": rows}


@rule("COM002", "comm.link-bandwidth", cause="comm.link_saturated", causes=("comm.low_bandwidth",),
      requires=("comm_bandwidth",), thresholds=Thresholds, scope="cluster", rank_part=RankPart(RANK_TABLES, rank_part))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Saturated links everywhere, or transports below the utilisation threshold."""
    df = ctx.df(LINKS)
    if df.empty:
        return
    unknown = sorted(set(df.loc[df["peak_gbps"].isna(), "transport"]))
    if unknown:
        ctx.warn(f"no peak bandwidth known for transport(s) {', '.join(unknown)}; not judged")
    df = df[df["peak_gbps"].notna()].copy()
    links = _links(df)
    links = links[links["bytes"] >= ctx.t.min_bytes]
    if links.empty:
        return
    over = links[links["util"] > ctx.t.max_plausible_utilization]
    for transport, g in over.groupby("transport"):
        ctx.warn(f"{transport} links reach {float(g['gbps'].max()):.1f} GB/s, above the configured peak of "
                 f"{float(g['peak'].iloc[0]):g} GB/s: the peak does not fit this hardware (set COM002.peak_"
                 f"{str(transport).lower()}_gbps); {transport} is not judged")
    links = links[~links["transport"].isin(set(over["transport"]))]
    df = df[~df["transport"].isin(set(over["transport"]))]
    if links.empty:
        return
    source = str(df["src"].iloc[0])
    thr = ctx.t.utilization
    ranks_all = sorted(int(r) for r in links["rank"].unique())
    if (links["util"] >= thr).all():
        comm_share = _comm_share(ctx)
        by_t = links.groupby("transport").agg(gbps=("gbps", "median"), util=("util", "min"), peak=("peak", "first"))
        yield ctx.finding(
            cause="comm.link_saturated",
            title=f"All {len(links)} links run at ≥ {thr:.0%} of their peak "
                  f"({', '.join(f'{t} {r.gbps:.1f}/{r.peak:.0f} GB/s' for t, r in by_t.iterrows())})",
            evidence={
                "links": len(links),
                "min_utilization": round(float(links["util"].min()), 4),
                "utilization": thr,
                "source": source,
                **{f"{t.lower()}_gbps_median": round(float(r.gbps), 3) for t, r in by_t.iterrows()},
                **{f"{t.lower()}_peak_gbps": float(r.peak) for t, r in by_t.iterrows()},
                "comm_not_overlapped_share": None if comm_share is None else round(comm_share, 4),
            },
            severity=Severity.MEDIUM if (comm_share or 0) >= 0.10 else Severity.LOW,
            ranks=ranks_all,
            detail="No software setting makes these links faster; only less traffic or a faster network helps.",
            replay={"estimated": False, "reason": "the fix is less traffic or a faster network, of a size the "
                    "profile does not give: no counterfactual to replay"},
        )
        return
    low = links[links["util"] < thr]
    for transport, g in low.groupby("transport"):
        peak = float(g["peak"].iloc[0])
        target = thr * peak  # GB/s = bytes per ns
        rows = df[(df["transport"] == transport) & df["rank"].isin(g["rank"].unique())].copy()
        rows["excess_ns"] = (rows["transit_ns"] - rows["bytes"] / target).clip(lower=0)
        if source == "comm_matrix":  # a rank's links run concurrently: the slowest one bounds the step
            per = rows.groupby(["rank", "step", "src_rank", "dst_rank"], dropna=False)["excess_ns"].sum()
            per = per.groupby(["rank", "step"]).max()
        else:
            per = rows.groupby(["rank", "step"])["excess_ns"].sum()
        worst = per.groupby("step").max()
        saving_us = float(worst.median()) / 1000.0
        worst_rank = int(per.groupby("rank").median().idxmax())
        gbps = float(g["bytes"].sum() / g["transit_ns"].sum())
        ranks = sorted(int(r) for r in g["rank"].unique())
        top = g.sort_values("util").head(5)
        all_steps = sorted(int(s) for s in rows["step"].unique() if s >= 0)
        replayed = ctx.query("SELECT * FROM com002_replay WHERE transport = $t", {"t": transport})
        assumption = (f"if every {transport} transfer on these ranks moved its bytes at no less than {thr:.0%} of the "
                      f"{peak:g} GB/s peak ({target:.1f} GB/s)")
        replay = replay_summary(replayed, ranks, all_steps, assumption,
                                mean_step_us(ctx, ranks, all_steps)) if replayed else {
            "estimated": False, "assumption": assumption,
            "reason": f"no operator's {transport} transfers (communication bandwidth info per operator) to shorten"}
        yield ctx.finding(
            cause="comm.low_bandwidth",
            title=f"{transport} reaches {gbps:.1f} GB/s = {gbps / peak:.0%} of its {peak:.0f} GB/s peak "
                  f"on {len(g)} link(s) (threshold {thr:.0%})",
            evidence={
                "transport": transport,
                "achieved_gbps": round(gbps, 3),
                "peak_gbps": peak,
                "achieved_utilization": round(gbps / peak, 4),
                "utilization": thr,
                "links_below": len(g),
                "links_judged": int((links["transport"] == transport).sum()),
                "bytes": int(g["bytes"].sum()),
                "source": source,
            },
            saving_us=saving_us,
            step_us=step_us(ctx, worst_rank),
            saving_basis=f"per step, transit time minus bytes / ({thr:.0%} × peak) on the worst rank (median over "
                         "steps); an upper bound when communication overlaps compute",
            ranks=ranks,
            steps=sorted(int(s) for s in rows.loc[rows["excess_ns"] > 0, "step"].unique()),
            top=[{"rank": int(r["rank"]),
                  "src_rank": None if pd.isna(r["src_rank"]) else int(r["src_rank"]),
                  "dst_rank": None if pd.isna(r["dst_rank"]) else int(r["dst_rank"]),
                  "gbps": round(float(r["gbps"]), 3), "utilization": round(float(r["util"]), 4),
                  "bytes": int(r["bytes"])} for _, r in top.iterrows()],
            replay=replay,
        )


def _comm_share(ctx: RuleContext[Thresholds]) -> float | None:
    """Median share of the step spent in not-overlapped communication (breakdown or vendor step table)."""
    bd = ctx.breakdown()
    if not bd.empty and float(bd["comm_us"].sum()) > 0:
        return float((bd["comm_only_us"] / bd["step_us"]).median())
    row = ctx.query(
        "SELECT median(comm_not_overlapped_ns::DOUBLE / nullif(computing_ns + comm_not_overlapped_ns + free_ns, 0)) AS s "
        "FROM vendor_steps"
    )
    return None if not row or row[0]["s"] is None else float(row[0]["s"])
