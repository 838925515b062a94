"""Communication moves data in transfers too small to reach the link's bandwidth.

## Why it matters
Each transfer pays a fixed latency (launch, handshake, synchronisation) before data flows, so a
link reaches its bandwidth only above some transfer size. Many small transfers leave it
underused. In Hermes' VGG16 case (§5) HCCS transfers averaged 12.8 MB against the 32 MB at which
HCCS saturates, and gradient fusion fixed it (Table 3, *small packet*).

## How it is detected
Transfer sizes per transport come from, in this order of preference:

* ``comm_bandwidth`` (Ascend *Communication Bandwidth Info*): bytes per operator and transport;
* ``comm_ops.bytes`` (Kineto NCCL/HCCL kernels: ``In msg nelems`` × dtype size), transport unknown;
* on ranks without either, the host collectives ``gloo:*`` / ``mpi:*`` / ``ucc:*`` and their
  ``Input Dims`` × ``Input type`` (first tensor), transport unknown (gloo runs over TCP).

A transfer is small below the transport's size: ``min_intra_bytes`` for intra-node transports (HCCS,
PCIe, SDMA, SIO, NVLink) and device collectives of unknown transport, ``min_inter_bytes`` for RDMA
and host (socket) collectives. The rule fires per transport when the share of small transfers
reaches ``min_small_share``; the finding reports the mean size next to the threshold.

The saving per step, where the transport's peak is known, is the transit time of the small
transfers minus bytes / peak (what they would cost if fused into transfers that run at peak),
on the worst rank, median over steps. Otherwise (durations include waiting) there is no
estimate and the finding is low severity.

## What to do
Fuse gradients into larger buckets (DDP ``bucket_cap_mb``, Megatron / DeepSpeed bucket sizes),
raise the batch size or gradient accumulation, use fused optimizers / operators that issue fewer
collectives, and avoid ZeRO-3 where memory allows ZeRO-1/2.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from advisor.engine.rule import RankPart, RuleContext, knob, rule
from advisor.model import Finding, Severity
from advisor.schema import DTYPE_BYTES_SQL
from rules.comm._common import BW_ROWS_CTE, INTRA_NODE, PeakThresholds, peak_case, step_us


@dataclass(frozen=True)
class Thresholds(PeakThresholds):
    """Thresholds for COM005."""

    min_intra_bytes: int = knob(16_000_000, "intra-node transfers smaller than this are small (16 MB)",
                                "msprof-analyze advisor packet.yaml min_sdma_size 16 MB; Hermes §5: HCCS saturates "
                                "at about 32 MB")
    min_inter_bytes: int = knob(1_000_000, "RDMA / network (socket) transfers smaller than this are small (1 MB)",
                                "msprof-analyze advisor packet.yaml min_rdma_size 1 MB")
    min_small_share: float = knob(0.2, "share of small transfers (by count) that fires the rule",
                                  "msprof-analyze advisor packet.yaml min_sdma_ratio / min_rdma_ratio 0.2")


SQL = """
WITH {bw_rows},
cb AS (
    SELECT 'comm_bandwidth' AS src, rank, step, name, transport, bytes, transit_ns AS time_ns,
           true AS transit_known
    FROM bw_rows
),
co AS (
    SELECT 'comm_ops' AS src, rank, step, name, 'DEVICE (transport unknown)' AS transport, bytes,
           coalesce(transit_ns, dur_ns) AS time_ns, transit_ns IS NOT NULL AS transit_known
    FROM comm_ops
    WHERE bytes > 0 AND rank NOT IN (SELECT rank FROM cb)
),
host AS (
    SELECT 'host' AS src, rank, step, name, 'HOST (gloo / socket)' AS transport, bytes,
           time_ns, false AS transit_known
    FROM com005_host
    WHERE rank NOT IN (SELECT rank FROM cb) AND rank NOT IN (SELECT rank FROM co)
),
allx AS (SELECT * FROM cb UNION ALL SELECT * FROM co UNION ALL SELECT * FROM host)
SELECT *, {peak} AS peak_gbps,
       CASE WHEN transport = 'RDMA' OR src = 'host' THEN $min_inter_bytes ELSE $min_intra_bytes END AS min_bytes
FROM allx WHERE bytes > 0
""".format(
    bw_rows=BW_ROWS_CTE,
    peak=peak_case("transport"),
)

# the rank part (each rank's own events): its host collectives and the bytes their shapes give
HOST_SQL = """
SELECT rank, step, name, list_product(TRY_CAST(json_extract(shapes, '$[0]') AS BIGINT[])) * ({dtype}) AS bytes,
       dur_ns AS time_ns
FROM events
WHERE kind = 'comm' AND NOT device AND regexp_matches(name, '^(gloo|mpi|ucc):')
ORDER BY rank, start_ns, name
""".format(dtype=DTYPE_BYTES_SQL.format(d="json_extract_string(dtypes, '$[0]')"))


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """What COM005 reads of each rank's events (see :class:`advisor.engine.rule.RankPart`)."""
    return {"com005_host": [(r["rank"], r["step"], r["name"], r["bytes"], r["time_ns"])
                            for r in ctx.query(HOST_SQL)]}


@rule("COM005", "comm.small-packet", cause="comm.small_packet", requires=("events", "steps"), thresholds=Thresholds,
      scope="cluster", rank_part=RankPart(
          {"com005_host": "rank INTEGER, step INTEGER, name VARCHAR, bytes DOUBLE, time_ns BIGINT"}, rank_part))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per transport when too many transfers are below the size that reaches bandwidth."""
    df = ctx.df(SQL)
    if df.empty:
        return
    for transport, g in df.groupby("transport"):
        small = g[g["bytes"] < g["min_bytes"]]
        share = len(small) / len(g)
        if share < ctx.t.min_small_share or small.empty:
            continue
        min_bytes = int(g["min_bytes"].iloc[0])
        peak = g["peak_gbps"].iloc[0]
        saving_us = None
        s_us = step_us(ctx)
        if not pd.isna(peak) and peak and bool(small["transit_known"].all()):
            small = small.assign(excess_ns=(small["time_ns"] - small["bytes"] / float(peak)).clip(lower=0))
            per = small.groupby(["rank", "step"], dropna=False)["excess_ns"].sum()
            worst = per.groupby("step", dropna=False).max()
            saving_us = float(worst.median()) / 1000.0
            s_us = step_us(ctx, int(per.groupby("rank").median().idxmax()))
        mean = float(g["bytes"].mean())
        mean_small = float(small["bytes"].mean())
        kind = "intra-node" if transport in INTRA_NODE or str(g["src"].iloc[0]) == "comm_ops" else "network"
        yield ctx.finding(
            title=f"{share:.0%} of {transport} transfers are below {min_bytes / 1e6:g} MB "
                  f"(mean {mean / 1e6:.2f} MB, {len(small)} of {len(g)})",
            evidence={
                "transport": transport,
                "small_share": round(share, 4),
                "min_small_share": ctx.t.min_small_share,
                "small_transfers": len(small),
                "transfers": len(g),
                "mean_bytes": round(mean, 1),
                "mean_small_bytes": round(mean_small, 1),
                "min_bytes": min_bytes,
                "size_class": kind,
                "small_time_ms": round(float(small["time_ns"].sum()) / 1e6, 3),
                "source": str(g["src"].iloc[0]),
            },
            saving_us=saving_us,
            step_us=s_us,
            severity=None if saving_us is not None else Severity.LOW,
            saving_basis="per step, transit time of the small transfers minus bytes / peak on the worst rank "
                         "(median over steps)" if saving_us is not None else
                         "no estimate: the durations include waiting for peers or the transport's peak is unknown",
            ranks=sorted(int(r) for r in small["rank"].unique()),
            steps=sorted(int(s) for s in small["step"].dropna().unique()),
            ops=[str(n) for n in small.groupby("name").size().sort_values(ascending=False, kind="stable").index[:5]],
            top=[{"op": str(name), "transfers": len(x), "mean_bytes": round(float(x["bytes"].mean()), 1)}
                 for name, x in sorted(small.groupby("name"), key=lambda kv: -len(kv[1]))[:5]],
        )
