"""One link between ranks moves data much more slowly than the other links of the same transport.

## Why it matters
Collectives are paced by their slowest link: a ring all-reduce over eight links runs at the
speed of the worst one. A single degraded link (port flapping, a bad optical module, a link
trained down to a lower rate, a congested switch port) slows every collective that crosses it
(Hermes §3.1: network problems are mostly hardware faults such as port flapping and link
failures; LLMPrism Fig. 5: degraded switches at 30–60 Gb/s among healthy ones at 100–180 Gb/s).

## How it is detected
From the communication matrix (Ascend ``communication_matrix.json`` or its database: bytes and
transit time per source → destination link; Kineto's point-to-point rows carry no transit time,
since their duration includes the wait for the peer, and are left out), per link and transport: bandwidth = bytes / transit time over the
profile (``*-total`` aggregate rows when the export has them, else every operator row), links
with fewer than ``min_link_bytes`` left out (latency-bound transfers cannot show bandwidth),
local (same-rank) links excluded. Within each transport — only the same transport is compared —
the time per byte (1 / bandwidth) of every link is tested with LLMPrism's k-sigma rule against a
clean baseline grown by forward search from the faster half of the links, and must also exceed
the baseline median by ``min_excess_ratio`` (bandwidth at most 1 / (1 + ratio) of the baseline).
At least ``min_links`` links of a transport are needed.

A packet pays a fixed cost before its bytes flow, so a link carrying smaller packets moves its bytes
more slowly without being slow: where the export records packets (Ascend ``Size Distribution`` of the
reporting rank's operators of the link's group over its transport), each link's mean packet is its
bytes over its packets, and a link whose packets are k times smaller than the baseline links' (their
median) may be up to k times slower on that alone. Such a link is slow only when its bandwidth is
below 1 / k of the baseline's by ``min_excess_ratio`` too; otherwise it is not compared (a warning
says so: COM005 reads the packets).

The saving per step is the slow link's transit time beyond what it would take at the baseline
median bandwidth, divided by the steps profiled: an upper bound, since the link may not be on the
critical path of every collective.

## What to do
Check and repair that link: port flapping and error counters on the NICs / switch ports, the
optical modules and cables, the negotiated link rate, HCCS / NVLink health on the node. Re-run
the collective benchmark between the two ranks to confirm.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import median
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding
from rules.cluster._stats import forward_search


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU002."""

    k: float = knob(3.0, "a link is slow when its time per byte is above baseline mean + k·σ",
                    "LLMPrism §IV-D k-sigma rule, k = 3")
    min_excess_ratio: float = knob(
        0.5, "the link's time per byte must also exceed the baseline median by this fraction "
        "(bandwidth at most 1/1.5 = 67 % of the baseline)",
        "LLMPrism Fig. 5: healthy switch bandwidth spans 100–180 Gb/s (1.8×); degraded ones sat at 30–60 Gb/s",
    )
    min_links: int = knob(3, "fewest links of one transport to compare", "first principles: an outlier needs peers")
    min_link_bytes: int = knob(1 << 20, "links moving fewer bytes over the profile are left out (latency-bound)",
                               "Hermes §5.1.3: HCCS needs ~32 MB transfers to reach its bandwidth; 1 MiB is a floor")


SQL = """
WITH m AS (
    SELECT * FROM comm_matrix
    WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
      AND upper(coalesce(transport, '')) NOT IN ('LOCAL', '') AND transit_ns > 0 AND bytes > 0
),
pick AS (  -- prefer the exporter's per-group totals so operators are not counted twice
    SELECT * FROM m WHERE (SELECT count(*) FROM m WHERE name LIKE '%-total%') = 0 OR name LIKE '%-total%'
)
SELECT upper(transport) AS transport, src_rank, dst_rank, sum(bytes) AS bytes, sum(transit_ns) AS transit_ns,
       count(DISTINCT step) AS steps, list(DISTINCT rank) AS reported_by
FROM pick GROUP BY ALL
HAVING sum(bytes) >= $min_link_bytes
ORDER BY transport, src_rank, dst_rank
"""

# each link's bytes per reporting rank and group: the reporting rank's Size Distribution of that group's
# operators over the transport (PACKETS_SQL) gives its packets there
LINK_GROUPS_SQL = """
WITH m AS (
    SELECT *, coalesce(group_name, nullif(regexp_extract(name, '@([^@]*)$', 1), '')) AS g FROM comm_matrix
    WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
      AND upper(coalesce(transport, '')) NOT IN ('LOCAL', '') AND transit_ns > 0 AND bytes > 0
),
pick AS (
    SELECT * FROM m WHERE (SELECT count(*) FROM m WHERE name LIKE '%-total%') = 0 OR name LIKE '%-total%'
)
SELECT upper(transport) AS transport, src_rank, dst_rank, rank, g, sum(bytes) AS bytes FROM pick GROUP BY ALL
"""

PACKETS_SQL = """
SELECT rank, group_name AS g, upper(transport) AS transport, bytes, packet_sizes FROM comm_bandwidth
WHERE packet_sizes IS NOT NULL AND bytes > 0
"""

STEPS_SQL = "SELECT count(DISTINCT step) AS n, median(step_us) AS step_us FROM breakdown WHERE step >= 0"


def _packet_count(sizes: Any) -> float:
    """The packets a Size Distribution (``{"<size>": [count, total time]}``) counts (0: none readable)."""
    try:
        d = json.loads(sizes) if isinstance(sizes, str) else dict(sizes or {})
        return float(sum(float(v[0]) for v in d.values() if float(v[0]) > 0))
    except (TypeError, ValueError, IndexError, KeyError):
        return 0.0


def mean_packet_bytes(ctx: RuleContext[Thresholds]) -> dict[tuple[str, int, int], float]:
    """Per link (transport, src, dst): the mean size of the packets it carried, bytes per packet, where the
    export records packets (Ascend Size Distribution, per operator and transport on the reporting rank):
    the link's bytes in each group it carried over the mean packet of that rank's operators of that group
    on that transport."""
    per: dict[tuple[int, str, str], list[float]] = {}
    for r in ctx.query(PACKETS_SQL):
        n = _packet_count(r["packet_sizes"])
        if n > 0:
            acc = per.setdefault((int(r["rank"]), str(r["g"]), str(r["transport"])), [0.0, 0.0])
            acc[0] += float(r["bytes"])
            acc[1] += n
    if not per:
        return {}
    links: dict[tuple[str, int, int], list[float]] = {}
    unknown: set[tuple[str, int, int]] = set()
    for r in ctx.query(LINK_GROUPS_SQL):
        key = (str(r["transport"]), int(r["src_rank"]), int(r["dst_rank"]))
        got = per.get((int(r["rank"]), str(r["g"]), str(r["transport"])))
        if got is None or got[1] <= 0:
            unknown.add(key)
            continue
        acc = links.setdefault(key, [0.0, 0.0])
        acc[0] += float(r["bytes"])
        acc[1] += float(r["bytes"]) / (got[0] / got[1])
    return {k: v[0] / v[1] for k, v in links.items() if k not in unknown and v[1] > 0}


@rule("CLU002", "cluster.slow-link", cause="cluster.slow_link", requires=("comm_matrix",), thresholds=Thresholds, scope="cluster")
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag links whose bandwidth is a low outlier among links of the same transport."""
    links = ctx.query(SQL)
    by_tp: dict[str, list[dict[str, Any]]] = {}
    for link in links:
        by_tp.setdefault(str(link["transport"]), []).append(link)
    st = ctx.query(STEPS_SQL) if ctx.has_breakdown else [{}]
    n_steps = max(int(st[0].get("n") or 0), 1)
    step_us = float(st[0].get("step_us") or 0) or None
    packet = mean_packet_bytes(ctx)
    for tp, ls in sorted(by_tp.items()):
        if len(ls) < ctx.t.min_links:
            ctx.warn(f"{tp}: only {len(ls)} link(s) with ≥ {ctx.t.min_link_bytes} bytes; slow-link comparison needs "
                     f"{ctx.t.min_links}")
            continue
        ns_per_byte = [float(x["transit_ns"]) / float(x["bytes"]) for x in ls]
        fs = forward_search(ns_per_byte, ctx.t.k, ctx.t.min_excess_ratio)
        base_bw = 1.0 / fs.baseline_median  # bytes/ns == GB/s
        base_sizes = [packet[k] for k in ((tp, int(ls[j]["src_rank"]), int(ls[j]["dst_rank"]))
                                          for j in range(len(ls)) if j not in set(fs.outliers)) if k in packet]
        base_packet = median(base_sizes) if base_sizes else None
        for i in fs.outliers:
            x = ls[i]
            bw = float(x["bytes"]) / float(x["transit_ns"])
            size = packet.get((tp, int(x["src_rank"]), int(x["dst_rank"])))
            # a packet pays a fixed cost before its bytes flow: a link whose packets are k times smaller than
            # its peers' moves its bytes up to k times more slowly on that alone. It is slow only beyond that.
            if size is not None and base_packet and size < base_packet and \
                    bw / base_bw >= (size / base_packet) / (1.0 + ctx.t.min_excess_ratio):
                ctx.warn(f"{tp} link {x['src_rank']} → {x['dst_rank']}: {bw:.2f} GB/s against {base_bw:.2f} GB/s on "
                         f"the other {tp} links, but its packets average {size / 1e6:.3g} MB against their "
                         f"{base_packet / 1e6:.3g} MB: smaller packets alone can slow it that much; not compared "
                         f"(COM005 reads the packets)")
                continue
            excess_ns = float(x["transit_ns"]) - float(x["bytes"]) * fs.baseline_median
            saving = excess_ns / 1000.0 / n_steps
            yield ctx.finding(
                title=f"Slow {tp} link {x['src_rank']} → {x['dst_rank']}: {bw:.2f} GB/s vs {base_bw:.2f} GB/s on the other "
                f"{tp} links ({bw / base_bw:.0%})",
                evidence={
                    "transport": tp,
                    "src_rank": int(x["src_rank"]),
                    "dst_rank": int(x["dst_rank"]),
                    "bandwidth_gbps": round(bw, 3),
                    "baseline_bandwidth_gbps": round(base_bw, 3),
                    "bandwidth_ratio": round(bw / base_bw, 4),
                    "bytes": int(x["bytes"]),
                    "transit_us": round(float(x["transit_ns"]) / 1000.0, 1),
                    "links_compared": len(ls),
                    "threshold_ns_per_byte": round(fs.threshold, 6),
                    "k": ctx.t.k,
                    "min_excess_ratio": ctx.t.min_excess_ratio,
                    **({"mean_packet_bytes": round(size), "baseline_mean_packet_bytes": round(base_packet)}
                       if size is not None and base_packet else {}),
                },
                saving_us=saving,
                step_us=step_us,
                saving_basis="the link's transit time beyond what it would take at the baseline median bandwidth of its "
                "transport, per profiled step (upper bound: the link may not be on every collective's critical path)",
                ranks=[int(x["src_rank"]), int(x["dst_rank"])],
                ops=[f"{tp} {x['src_rank']}->{x['dst_rank']}"],
                top=[{"src_rank": int(y["src_rank"]), "dst_rank": int(y["dst_rank"]),
                      "bandwidth_gbps": round(float(y["bytes"]) / float(y["transit_ns"]), 3)} for y in ls][:20],
            )
