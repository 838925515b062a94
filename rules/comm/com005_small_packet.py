"""Communication moves data in transfers too small to reach the link's bandwidth.

## Why it matters
Each transfer pays a fixed latency (launch, handshake, synchronisation) before data flows, so a
link reaches its bandwidth only above some transfer size. Many small transfers leave it
underused. In Hermes' VGG16 case (§5) HCCS transfers averaged 12.8 MB against the 32 MB at which
HCCS saturates, and gradient fusion fixed it (Table 3, *small packet*).

## How it is detected
Where the export records each operator's packets per transport (Ascend ``Size Distribution``,
``comm_bandwidth.packet_sizes``: ``{size: [count, total time]}``, sizes and times scaled to the row's
bytes and transit time, as their units are not documented), the rule reads packets. A packet is small
below the transport's size (``min_intra_bytes`` / ``min_inter_bytes``, below). An operator splits its
bytes when it sends more small packets than it needs: its small packets' bytes need
ceil(bytes / that size) messages, and its collective no fewer than it sends to its peers (2 (n - 1)
for an all-reduce, n - 1 for an all-gather, reduce-scatter or all-to-all over a group of n ranks, one
otherwise; n from the group's listed ranks, else the ranks seen in it; unknown n: the operator is not
judged). The rule fires per transport when the small packets of the operators that split reach
``min_small_share`` of its packets. The saving is the what-if replay of those packets sent as that
many messages within each operator, each paying the per-packet cost the rank's packets of that
transport give (a least-squares fit of the fastest packet per size against its size, or the
link's peak where the sizes do not vary: :func:`fit_cost`): the operator's transit over the
transport shortened by the difference (its transfer tasks scaled, or its event shortened:
``rules.comm._common.transfer_changes``), each rank's steps replayed, per step the cluster's
slowest rank. Where an operator's packets ran side by side (its transports' summed transit time
above its own), fewer, larger messages would lose that parallelism by an amount the export does
not show: its steps are not estimated and the finding is low severity.

Without packets, transfer sizes per transport come from, in this order of preference:

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
on the worst rank, median over steps.

On host collectives (gloo, MPI, UCC: no peak, durations that include waiting), and on device
collectives whose export records their bytes and transit time (Ascend communication.json / .db: the
transit time is the fit's time), the saving is the what-if replay of the fix: the small collectives of each kind and step, in issue order, merged into
buckets of ``bucket_bytes`` (DDP's default 25 MB). A collective costs a per-call part plus bytes at a
bandwidth, both estimated on the rank from its own calls of that kind: a least-squares fit of the
fastest call of each size against its bytes (waiting only lengthens a call), or, where the sizes do
not vary (or the fit is not a cost), the fastest call as the per-call cost and the bandwidth at which a
transfer of the rule's size threshold spends as long on bytes as on the call (the threshold taken as
Hockney's half-performance length; on a device link whose peak is configured, the bytes move at the
peak and the per-call cost is what the fastest call spends beyond them; the basis is in the evidence). Each small collective is bounded to
its bytes' share of its bucket's time (per-call cost once per bucket plus the bucket's bytes), and so
is the caller's call that issued it (gloo's ``c10d::*``, paired in issue order: its fastest call, once
per bucket). A device collective's kind is its operator type and group. The replay (one rank's graph: the work threads' collectives, the caller waiting for the last
of them to end) gives each rank's step; the saving is the cluster's step (its slowest rank) measured
less replayed, the mean over steps. A step with one small collective of a kind merges nothing. The
replay of one rank cannot tell a collective's waiting for a late peer from its cost: a bucket is taken
to wait for nobody, as the small collectives' fastest calls did. Otherwise (durations include waiting,
no sizes) there is no estimate and the finding is low severity.

## What to do
Fuse gradients into larger buckets (DDP ``bucket_cap_mb``, Megatron / DeepSpeed bucket sizes),
raise the batch size or gradient accumulation, use fused optimizers / operators that issue fewer
collectives, and avoid ZeRO-3 where memory allows ZeRO-1/2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.engine.rule import Change, RankPart, RuleContext, Select, knob, rule
from advisor.model import Finding, Severity
from advisor.schema import DTYPE_BYTES_SQL
from rules.comm._common import (
    BW_ROWS_CTE,
    INTRA_NODE,
    REPLAY_COLUMNS,
    Faster,
    PeakThresholds,
    mean_step_us,
    peak_case,
    replay_rows,
    replay_summary,
    slowest_rank_savings,
    step_us,
)


@dataclass(frozen=True)
class Thresholds(PeakThresholds):
    """Thresholds for COM005."""

    min_intra_bytes: int = knob(16_000_000, "intra-node transfers smaller than this are small (16 MB)",
                                "msprof-analyze advisor packet.yaml min_sdma_size 16 MB; Hermes §5: HCCS saturates "
                                "at about 32 MB")
    min_inter_bytes: int = knob(1_000_000, "RDMA / network (socket) transfers smaller than this are small (1 MB)",
                                "msprof-analyze advisor packet.yaml min_rdma_size 1 MB")
    bucket_bytes: int = knob(25_000_000, "the counterfactual merges small collectives into buckets of this size (25 MB)",
                             "PyTorch DistributedDataParallel bucket_cap_mb default 25 (torch_npu's DDP the same)")
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

# the host collectives of the counterfactual: the work (``gloo:*`` ... on the backend's work threads,
# with bytes) and the caller's call that issued it (``c10d::*`` on the training thread); ``op`` is the
# collective both name (``gloo:all_reduce`` and ``c10d::allreduce_``: ``allreduce``)
REPLAY_SQL = """
SELECT step, name, start_ns, dur_ns,
       regexp_matches(name, '^(gloo|mpi|ucc):') AS work,
       lower(replace(regexp_replace(name, '^.*:', ''), '_', '')) AS op,
       CASE WHEN regexp_matches(name, '^(gloo|mpi|ucc):')
            THEN list_product(TRY_CAST(json_extract(shapes, '$[0]') AS BIGINT[])) * ({dtype}) END AS bytes
FROM events
WHERE rank = $rank AND kind = 'comm' AND NOT device AND step IS NOT NULL AND dur_ns > 0
  AND regexp_matches(name, '^(gloo|mpi|ucc):|^c10d::')
ORDER BY step, start_ns, name
""".format(dtype=DTYPE_BYTES_SQL.format(d="json_extract_string(dtypes, '$[0]')"))

# the device collectives of the counterfactual: those with bytes and a transit time (the time moving
# data, without waiting: Ascend communication.json / .db), each with its device event (same name; the
# same start, or the only event of that name); ``op`` its kind and group; small below the threshold of
# the transport carrying most of its bytes (comm_bandwidth; intra-node where none is recorded)
DEVICE_SQL = """
WITH ev AS (
    SELECT name, start_ns, count(*) OVER (PARTITION BY name) AS n FROM events
    WHERE rank = $rank AND device AND kind = 'comm'
),
tr AS (
    SELECT name, step, arg_max(upper(transport), bytes) AS transport FROM comm_bandwidth
    WHERE rank = $rank AND bytes > 0 GROUP BY ALL
)
SELECT c.step, c.name, e.start_ns, c.transit_ns AS fit_ns, c.bytes,
       coalesce(c.op_type, 'collective') || ' / ' || coalesce(c.group_name, '') AS op,
       CASE WHEN tr.transport = 'RDMA' THEN $inter ELSE $intra END AS min_bytes,
       {peak} AS peak_gbps
FROM comm_ops c
JOIN ev e ON e.name = c.name AND (e.start_ns = c.start_ns OR e.n = 1)
LEFT JOIN tr ON tr.name = c.name AND tr.step IS NOT DISTINCT FROM c.step
WHERE c.rank = $rank AND c.step IS NOT NULL AND c.bytes > 0 AND c.transit_ns IS NOT NULL
ORDER BY c.step, e.start_ns, c.name
""".format(peak=peak_case("tr.transport"))

#: the per-rank cost estimates the evidence lists (their count is given where there are more)
MAX_FIT_ROWS = 4

#: the sizes vary enough for a fit of time against bytes when the largest is this many times the smallest
MIN_SIZE_SPREAD = 2.0

REPLAY_TABLES = {
    "com005_host": "rank INTEGER, step INTEGER, name VARCHAR, bytes DOUBLE, time_ns BIGINT",
    "com005_packets": "rank INTEGER, step INTEGER, name VARCHAR, transport VARCHAR, packets DOUBLE, "
                      "small_packets DOUBLE, needed DOUBLE, merged_to DOUBLE, small_ns DOUBLE, merged_ns DOUBLE, "
                      "reason VARCHAR",
    "com005_packet_fit": "rank INTEGER, transport VARCHAR, sizes BIGINT, per_packet_ns DOUBLE, ns_per_byte DOUBLE, "
                         "basis VARCHAR",
    "com005_packet_replay": "transport VARCHAR, " + REPLAY_COLUMNS,
    "com005_replay": "rank INTEGER, src VARCHAR, step INTEGER, measured_ns BIGINT, saving_ns BIGINT, error DOUBLE, "
                     "reason VARCHAR",
    "com005_fit": "rank INTEGER, op VARCHAR, calls BIGINT, sizes BIGINT, per_call_ns DOUBLE, ns_per_byte DOUBLE, "
                  "caller_call_ns DOUBLE, basis VARCHAR",
}


@dataclass(frozen=True)
class CallCost:
    """One kind of collective's cost on one rank: ``per_call_ns`` + bytes × ``ns_per_byte``, and how it
    was estimated."""

    per_call_ns: float
    ns_per_byte: float
    basis: str


def fit_cost(sizes: list[float], times: list[float], half_bytes: float,
             peak_ns_per_byte: float | None = None, unit: str = "call") -> CallCost:
    """Per-call cost and time per byte of a kind of collective, from its calls' (bytes, ns).

    Durations include waiting for peers, which only lengthens them: the fit is of the lower envelope, the
    fastest call of each size, least squares of time against bytes. Where the sizes do not vary
    (largest < :data:`MIN_SIZE_SPREAD` × smallest) or the fit is not a cost (negative per-call cost or
    time per byte), the per-call cost is the fastest call and the bandwidth is the one that makes
    ``half_bytes`` (the size the rule calls small: below it the fixed cost dominates) cost as much in
    bytes as in the fixed part (Hockney's half-performance length n½ = per-call cost × bandwidth); where
    the link's peak is known (``peak_ns_per_byte``), the bytes move at the peak instead and the per-call
    cost is what the fastest call of a size spends beyond its bytes at the peak (at least 0). ``unit`` names
    what each time is of in the basis (a call, a packet)."""
    fastest: dict[float, float] = {}
    for b, t in zip(sizes, times, strict=True):
        fastest[b] = min(t, fastest.get(b, t))
    xs = sorted(fastest)
    if len(xs) >= 2 and xs[-1] >= MIN_SIZE_SPREAD * xs[0]:
        x = np.asarray(xs, dtype=float)
        y = np.asarray([fastest[v] for v in xs], dtype=float)
        slope, icpt = np.polyfit(x, y, 1)
        if icpt > 0 and slope > 0:
            return CallCost(float(icpt), float(slope),
                            f"least-squares fit of the fastest {unit} per size ({len(xs)} sizes, "
                            f"{xs[0]:.0f}-{xs[-1]:.0f} B)")
        why = "the fit of time against bytes gives no positive per-call cost and time per byte"
    else:
        why = (f"the sizes do not vary (one size, {xs[0]:.0f} B)" if len(xs) == 1 else
               f"the sizes vary less than {MIN_SIZE_SPREAD:g}x ({xs[0]:.0f}-{xs[-1]:.0f} B)")
    if peak_ns_per_byte:
        a = max(min(t - b * peak_ns_per_byte for b, t in fastest.items()), 0.0)
        return CallCost(a, peak_ns_per_byte,
                        f"{why}: bytes at the link's peak ({1.0 / peak_ns_per_byte:g} GB/s), per-{unit} cost = what "
                        f"the fastest {unit} spends beyond them ({a / 1e3:.1f} us)")
    a = min(fastest.values())
    return CallCost(a, a / half_bytes,
                    f"{why}: per-{unit} cost = the fastest {unit} ({a / 1e3:.1f} us), bandwidth such that a "
                    f"{half_bytes / 1e6:g} MB transfer spends as long on bytes as on the per-{unit} cost")


def bucket_bounds(works: list[dict[str, Any]], cost: CallCost, bucket_bytes: float) -> list[tuple[int, float, float]]:
    """Each small work (in issue order) merged into buckets of up to ``bucket_bytes``: its bound is its
    bytes' share of its bucket's time (the per-call cost once per bucket plus the bucket's bytes). A
    bucket of one work merges nothing: it is left out.
    (index into ``works``, bound ns, its bytes' share of its bucket)."""
    out: list[tuple[int, float, float]] = []
    bucket: list[int] = []
    total = 0.0

    def close() -> None:
        if len(bucket) < 2:  # nothing merged: the collective keeps its time
            return
        t = cost.per_call_ns + total * cost.ns_per_byte
        out.extend((k, t * float(works[k]["bytes"]) / total, float(works[k]["bytes"]) / total) for k in bucket)

    for k, w in enumerate(works):
        b = float(w["bytes"])
        if bucket and total + b > bucket_bytes:
            close()
            bucket, total = [], 0.0
        bucket.append(k)
        total += b
    if bucket and total > 0:
        close()
    return out


def _merged(ctx: RuleContext[Thresholds], rank: int, works: list[dict[str, Any]],
            callers: list[dict[str, Any]]) -> tuple[list[tuple[str, int, int]], list[tuple[Any, ...]], set[int]]:
    """The bounds of rank ``rank``'s small ``works`` (rows: ``step``, ``name``, ``start_ns`` of the
    event to bound, ``fit_ns`` the time the cost is fitted on, ``bytes``, ``op`` the kind and link,
    ``min_bytes`` the size below which it is small) merged into buckets, and of the ``callers`` (rows:
    ``step``, ``name``, ``start_ns``, ``dur_ns``, ``op``) that issued them; the ``com005_fit`` rows; the
    steps with a bound."""
    fits: list[tuple[Any, ...]] = []
    at: list[tuple[str, int, int]] = []
    steps: set[int] = set()
    for op in sorted({str(r["op"]) for r in works}):
        mine = [r for r in works if r["op"] == op]
        small = [r for r in mine if float(r["bytes"]) < float(r["min_bytes"])]
        if not small:
            continue
        peaks = [float(r["peak_gbps"]) for r in mine if r.get("peak_gbps")]
        cost = fit_cost([float(r["bytes"]) for r in mine], [float(r["fit_ns"]) for r in mine],
                        float(small[0]["min_bytes"]), 1.0 / min(peaks) if peaks else None)
        calls_of = [r for r in callers if r["op"] == op]
        caller_ns = min((float(r["dur_ns"]) for r in calls_of), default=None)
        fits.append((rank, op, len(mine), len({float(r["bytes"]) for r in mine}), cost.per_call_ns, cost.ns_per_byte,
                     caller_ns, cost.basis))
        for step in sorted({int(r["step"]) for r in small}):
            ws = [r for r in small if int(r["step"]) == step]
            bounds = bucket_bounds(ws, cost, float(ctx.t.bucket_bytes))
            at += [(str(ws[k]["name"]), int(ws[k]["start_ns"]), round(b)) for k, b, _ in bounds]
            if bounds:
                steps.add(step)
            # the calls that issued them, k-th call to k-th work (both in issue order), where they pair one
            # to one: the call's per-call cost (its fastest) paid once per bucket, shared as the bytes are
            calls = [r for r in calls_of if int(r["step"]) == step]
            alls = [r for r in mine if int(r["step"]) == step]
            if caller_ns is not None and len(calls) == len(alls):
                share = {id(ws[k]): f for k, _, f in bounds}
                for c, w in zip(calls, alls, strict=True):
                    f = share.get(id(w))
                    if f is not None:
                        at.append((str(c["name"]), int(c["start_ns"]), round(caller_ns * f)))
    return at, fits, steps


def _replayed(ctx: RuleContext[Thresholds], rank: int, src: str, at: list[tuple[str, int, int]],
              device: bool, steps: set[int]) -> list[tuple[Any, ...]]:
    """The ``com005_replay`` rows of rank ``rank``: its steps replayed with the ``at`` bounds."""
    if not at:
        return []
    change = Change("bound", Select(kinds=("comm",), device=device), at=tuple(at))
    return [(rank, src, res.step, res.measured_ns, res.saving_ns if res.reproduced else None, res.error,
             res.reason or (None if res.reproduced else "the replay does not reproduce the measured step"))
            for res in ctx.replay_steps(rank, [change], sorted(steps))]


def _host_counterfactual(ctx: RuleContext[Thresholds], rank: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Rank ``rank``'s host collectives merged into buckets (:data:`ASSUMPTION`), replayed per step: the
    ``com005_replay`` and ``com005_fit`` rows."""
    rows = ctx.query(REPLAY_SQL, {"rank": int(rank)})
    works = [{**r, "fit_ns": r["dur_ns"], "min_bytes": ctx.t.min_inter_bytes} for r in rows
             if r["work"] and r["bytes"] is not None and float(r["bytes"]) > 0]
    if not works:
        return [], []
    at, fits, steps = _merged(ctx, rank, works, [r for r in rows if not r["work"]])
    return _replayed(ctx, rank, "host", at, False, steps), fits


def _device_counterfactual(ctx: RuleContext[Thresholds], rank: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Rank ``rank``'s device collectives with sizes and transit times (Ascend communication.json / .db)
    merged into buckets, replayed per step: the ``com005_replay`` and ``com005_fit`` rows."""
    rows = ctx.query(DEVICE_SQL, {"rank": int(rank), "intra": ctx.t.min_intra_bytes, "inter": ctx.t.min_inter_bytes,
                                  **{f"peak_{t}_gbps": getattr(ctx.t, f"peak_{t}_gbps")
                                     for t in ("hccs", "pcie", "rdma", "sdma", "nvlink")}})
    if not rows:
        return [], []
    at, fits, steps = _merged(ctx, rank, rows, [])
    return _replayed(ctx, rank, "device", at, True, steps), fits


# -- packets: the Size Distribution of each operator's transfers over a transport (Ascend) -------------------

# each rank's operator rows over a transport with a Size Distribution, with the operator's type and group, its
# transit time (the wall time it moved data) and the transports' summed transit time (above the wall time
# where its transfers ran side by side)
PACKET_SQL = f"""
WITH {BW_ROWS_CTE},
tot AS (SELECT step, name, sum(transit_ns) AS sum_ns FROM bw_rows WHERE rank = $rank GROUP BY ALL)
SELECT b.step, b.name, b.transport, b.bytes, b.transit_ns, s.packet_sizes, o.op_type, o.group_name,
       o.transit_ns AS op_transit_ns, tot.sum_ns, {peak_case("b.transport")} AS peak_gbps
FROM bw_rows b
JOIN comm_bandwidth s ON s.rank = b.rank AND s.name = b.name AND s.step IS NOT DISTINCT FROM b.step
     AND s.group_name IS NOT DISTINCT FROM b.group_name AND upper(s.transport) = b.transport
LEFT JOIN comm_ops o ON o.rank = b.rank AND o.name = b.name AND o.step IS NOT DISTINCT FROM b.step
LEFT JOIN tot ON tot.name = b.name AND tot.step IS NOT DISTINCT FROM b.step
WHERE b.rank = $rank AND b.transit_ns > 0 AND s.packet_sizes IS NOT NULL
ORDER BY b.step, b.name, b.transport
"""

# the size of each group: its listed ranks (profiler_metadata), else the ranks seen in it (operators, links)
GROUP_SIZE_SQL = """
SELECT g, max(n) AS n FROM (
    SELECT group_name AS g, json_array_length(global_ranks) AS n FROM comm_groups WHERE global_ranks IS NOT NULL
    UNION ALL SELECT group_name, count(DISTINCT rank) FROM comm_ops GROUP BY 1
    UNION ALL SELECT g, count(DISTINCT r) FROM (
        SELECT coalesce(group_name, regexp_extract(name, '@([^@]*)$', 1)) AS g, unnest([src_rank, dst_rank]) AS r
        FROM comm_matrix WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL) GROUP BY 1
) WHERE g IS NOT NULL AND g <> '' GROUP BY g
"""

#: the transports' summed transit time above the operator's by more than this share (and
#: :data:`OVERLAP_SLACK_NS`, the export's rounding) means its packets ran side by side
OVERLAP_SHARE = 0.01
OVERLAP_SLACK_NS = 1_000


def packets(sizes: Any, nbytes: float, transit_ns: float) -> list[tuple[float, float, float]]:
    """A Size Distribution (``{"<size>": [count, total time]}``) as (bytes per packet, count, total ns). The
    export's units are not documented (MB and ms by analogy with the .db columns): the sizes are scaled so
    that the packets' bytes are the row's bytes, and the times so that they sum to its transit time. Empty
    where the distribution holds no packets with a size and a time."""
    try:
        d = json.loads(sizes) if isinstance(sizes, str) else dict(sizes or {})
        rows = [(float(k), float(v[0]), float(v[1])) for k, v in d.items()]
    except (TypeError, ValueError, IndexError, KeyError):
        return []
    rows = [r for r in rows if r[0] > 0 and r[1] > 0 and r[2] >= 0]
    sb, st = sum(k * c for k, c, _ in rows), sum(t for _, _, t in rows)
    if not rows or sb <= 0 or st <= 0 or nbytes <= 0 or transit_ns <= 0:
        return []
    return [(k * nbytes / sb, c, t * transit_ns / st) for k, c, t in rows]


def messages_needed(op_type: str | None, n: int | None) -> int | None:
    """The fewest messages a rank sends in one collective over a group of ``n`` ranks: a ring or a mesh
    all-reduce sends 2 (n - 1) (a reduce-scatter then an all-gather), an all-gather, reduce-scatter or
    all-to-all n - 1 (one per peer or ring step), anything else one. None: the group's size is unknown."""
    if n is None or n < 1:
        return None
    if n == 1:
        return 1
    t = (op_type or "").lower().replace("_", "").replace("-", "")
    if "allreduce" in t:
        return 2 * (n - 1)
    if any(k in t for k in ("allgather", "reducescatter", "alltoall")):
        return n - 1
    return 1


def _packet_counterfactual(ctx: RuleContext[Thresholds], rank: int) -> dict[str, list[tuple[Any, ...]]]:
    """Rank ``rank``'s operators whose transfers over a transport record their packets: the small packets of
    each sent as the fewest messages its bytes and its collective need (:data:`PACKET_ASSUMPTION`), each
    paying the per-packet cost fitted on the rank's packets of that transport; replayed per step."""
    rows = ctx.query(PACKET_SQL, {"rank": int(rank), **{f"peak_{t}_gbps": getattr(ctx.t, f"peak_{t}_gbps")
                                                         for t in ("hccs", "pcie", "rdma", "sdma", "nvlink")}})
    if not rows:
        return {}
    sizes = {str(r["g"]): int(r["n"]) for r in ctx.query(GROUP_SIZE_SQL)}
    pk = [(r, packets(r["packet_sizes"], float(r["bytes"]), float(r["transit_ns"]))) for r in rows]
    fits: list[tuple[Any, ...]] = []
    facts: list[tuple[Any, ...]] = []
    faster: list[Faster] = []
    off: dict[tuple[str, int], str] = {}  # (transport, step) -> why the step is not estimated
    for transport in sorted({str(r["transport"]) for r, _ in pk}):
        mine = [(r, p) for r, p in pk if str(r["transport"]) == transport and p]
        if not mine:
            continue
        thr = float(ctx.t.min_inter_bytes if transport == "RDMA" else ctx.t.min_intra_bytes)
        peak = next((float(r["peak_gbps"]) for r, _ in mine if r["peak_gbps"]), None)
        cost = fit_cost([s for _, p in mine for s, _, _ in p], [t / c for _, p in mine for _, c, t in p], thr,
                        1.0 / peak if peak else None, unit="packet")
        fits.append((rank, transport, len({round(s) for _, p in mine for s, _, _ in p}), cost.per_call_ns,
                     cost.ns_per_byte, cost.basis))
        for r, p in mine:
            small = [(s, c, t) for s, c, t in p if s < thr]
            c_s, b_s, t_s = sum(c for _, c, _ in small), sum(s * c for s, c, _ in small), sum(t for _, _, t in small)
            large = sum(c for s, c, _ in p if s >= thr)
            need = messages_needed(r["op_type"], sizes.get(str(r["group_name"])))
            step = None if r["step"] is None else int(r["step"])
            fewest = max(math.ceil(b_s / thr), 1) if c_s else 0
            why = None
            if need is None:
                merged_to = float(c_s)
                if c_s > fewest:  # split or not: the collective's own messages are unknown
                    why = f"{r['name']}: the size of its group is unknown (how many messages its collective needs)"
            else:
                merged_to = float(min(c_s, max(fewest, need - large))) if c_s else 0.0
            merged_ns = merged_to * cost.per_call_ns + b_s * cost.ns_per_byte
            split = need is not None and merged_to < c_s
            wall, summed = r["op_transit_ns"], float(r["sum_ns"] or 0)
            if split and (wall is None or summed > float(wall) * (1 + OVERLAP_SHARE) + OVERLAP_SLACK_NS):
                why = (f"{r['name']}'s packets over its transports ran side by side ({summed / 1e3:.1f} us of "
                       f"transfers in {float(wall) / 1e3:.1f} us): fewer, larger messages would lose that, by an "
                       f"amount the export does not show" if wall else
                       f"{r['name']} has no transit time of its own: whether its packets overlap is unknown")
            facts.append((rank, step, str(r["name"]), transport, sum(c for _, c, _ in p), c_s, need, merged_to,
                          t_s, merged_ns, why))
            if step is None:
                continue
            if why is not None:
                off.setdefault((transport, step), why)
            elif split and merged_ns < t_s:
                new = float(r["transit_ns"]) - (t_s - merged_ns)
                faster.append(Faster(step, str(r["name"]), transport, float(r["bytes"]), float(r["transit_ns"]),
                                     float(r["bytes"]) / new if new > 0 else 0.0))
    out: list[tuple[Any, ...]] = []
    for transport in sorted({f.transport for f in faster}):
        for rk, st, m, sv, e, why in replay_rows(ctx, rank, [f for f in faster if f.transport == transport]):
            why = off.get((transport, int(st)), why)
            out.append((transport, rk, st, m, None if why else sv, e, why))
    done = {(x[0], int(x[2])) for x in out}
    out += [(tr, rank, st, None, None, None, why) for (tr, st), why in sorted(off.items()) if (tr, st) not in done]
    return {"com005_packets": facts, "com005_packet_fit": fits, "com005_packet_replay": out}


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """What COM005 reads of each rank's events (see :class:`advisor.engine.rule.RankPart`)."""
    host = [(r["rank"], r["step"], r["name"], r["bytes"], r["time_ns"]) for r in ctx.query(HOST_SQL)]
    replayed: list[tuple[Any, ...]] = []
    fits: list[tuple[Any, ...]] = []
    device_ranks = {int(r["rank"]) for r in ctx.query(
        "SELECT DISTINCT rank FROM comm_ops WHERE bytes > 0 AND transit_ns IS NOT NULL")} if ctx.rows("comm_ops") else set()
    packet_ranks = {int(r["rank"]) for r in ctx.query(
        "SELECT DISTINCT rank FROM comm_bandwidth WHERE packet_sizes IS NOT NULL AND bytes > 0")} \
        if ctx.rows("comm_bandwidth") else set()
    out: dict[str, list[tuple[Any, ...]]] = {"com005_packets": [], "com005_packet_fit": [], "com005_packet_replay": []}
    for rank in sorted(packet_ranks):
        for k, v in _packet_counterfactual(ctx, rank).items():
            out[k] += v
    for rank in sorted(device_ranks - packet_ranks):
        rr, ff = _device_counterfactual(ctx, rank)
        replayed += rr
        fits += ff
    for rank in sorted({int(r[0]) for r in host if r[3] is not None and float(r[3]) < ctx.t.min_inter_bytes}
                       - device_ranks):
        rr, ff = _host_counterfactual(ctx, rank)
        replayed += rr
        fits += ff
    return {"com005_host": host, "com005_replay": replayed, "com005_fit": fits, **out}


NOTHING_MERGED = "no step issues two small collectives of a kind with sizes (one per step): merging saves no call"
ASSUMPTION = ("if the small collectives were merged into buckets of {bucket:g} MB: each pays the per-call cost "
              "once per bucket, and takes its bytes' share of the bucket's time (its caller's call too)")


def _replay_of(ctx: RuleContext[Thresholds], ranks: list[int], src: str) -> dict[str, Any] | None:
    """The finding's ``replay`` from ``com005_replay``: per step, the cluster's step (its slowest rank)
    measured less replayed; the mean over the steps whose every rank was replayed. None: no replay."""
    rows = [r for r in ctx.query("SELECT * FROM com005_replay WHERE src = $src ORDER BY step, rank", {"src": src})
            if int(r["rank"]) in ranks]
    assumption = ASSUMPTION.format(bucket=ctx.t.bucket_bytes / 1e6)
    if not rows:
        fitted = ctx.query("SELECT count(*) AS n FROM com005_fit")[0]["n"]
        return {"estimated": False, "assumption": assumption, "reason": NOTHING_MERGED} if fitted else None
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    savings, errors, reasons = slowest_rank_savings(by_step)
    if not savings:
        return {"estimated": False, "assumption": assumption, "reason": "; ".join(sorted(reasons)) or "not replayed"}
    saving_us = sum(sv for sv, _ in savings) / len(savings) / 1000.0
    step_ns = sum(m for _, m in savings) / len(savings)
    out = {"estimated": True, "saving_us": round(max(saving_us, 0.0), 3),
           "saving_fraction": round(max(saving_us, 0.0) * 1000.0 / step_ns, 4) if step_ns else None,
           "assumption": assumption, "reproduced": len(savings) == len(by_step),
           "reproduction_error": round(max(errors), 4) if errors else 0.0,
           "steps": len(by_step), "steps_replayed": len(savings)}
    if reasons:
        out["reason"] = "; ".join(sorted(reasons))
    return out


PACKET_ASSUMPTION = ("if each operator sent its small {transport} packets as the fewest messages its bytes need at "
                     "{min_mb:g} MB (and no fewer than its collective sends: 2 (n - 1) for an all-reduce, n - 1 for an "
                     "all-gather, reduce-scatter or all-to-all over n ranks, else one), each paying the per-packet "
                     "cost fitted on the rank's packets of that transport")


def _packet_findings(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Per transport whose operators record their packets: fire when the small packets of the operators that
    send more of them than their bytes and their collective need reach ``min_small_share`` of its packets."""
    facts = ctx.df("SELECT * FROM com005_packets")
    for transport, g in facts.groupby("transport"):
        split = g[g["needed"].notna() & (g["merged_to"] < g["small_packets"])]
        total = float(g["packets"].sum())
        small = float(split["small_packets"].sum())
        share = small / total if total else 0.0
        if split.empty or share < ctx.t.min_small_share:
            continue
        thr = int(ctx.t.min_inter_bytes if transport == "RDMA" else ctx.t.min_intra_bytes)
        ranks = sorted(int(r) for r in split["rank"].unique())
        steps = sorted(int(s) for s in split["step"].dropna().unique())
        replay = replay_summary(
            ctx.query("SELECT * FROM com005_packet_replay WHERE transport = $t", {"t": transport}), ranks, steps,
            PACKET_ASSUMPTION.format(transport=transport, min_mb=thr / 1e6), mean_step_us(ctx, ranks, steps))
        replayed = bool(replay.get("estimated") and replay.get("reproduced"))
        fit = [f for f in ctx.query("SELECT * FROM com005_packet_fit WHERE transport = $t ORDER BY rank",
                                    {"t": transport}) if int(f["rank"]) in ranks]
        ops = split.groupby("name").agg(n=("small_packets", "sum"), ns=("small_ns", "sum"),
                                        to=("merged_to", "sum"), ms=("merged_ns", "sum"), k=("rank", "size"))
        ops = ops.sort_values(["ns", "n"], ascending=False, kind="stable")
        per_op = float(split["small_packets"].mean())
        yield ctx.finding(
            title=f"{share:.0%} of {transport} packets are below {thr / 1e6:g} MB in operators that split their "
                  f"bytes into more packets than they need ({per_op:.0f} small packets per operator where "
                  f"{float(split['merged_to'].mean()):.0f} would do; {len(split)} operator(s))",
            evidence={
                "transport": transport,
                "packets": int(total),
                "small_packets_in_split_operators": int(small),
                "small_share": round(share, 4),
                "min_small_share": ctx.t.min_small_share,
                "min_bytes": thr,
                "split_operators": len(split),
                "operators_with_packets": len(g),
                "small_time_ms": round(float(split["small_ns"].sum()) / 1e6, 3),
                "merged_time_ms": round(float(split["merged_ns"].sum()) / 1e6, 3),
                "source": "comm_bandwidth Size Distribution",
                "per_packet_cost": [{"rank": int(f["rank"]), "sizes": int(f["sizes"]),
                                     "per_packet_us": round(float(f["per_packet_ns"]) / 1e3, 3),
                                     "bandwidth_gbps": round(1.0 / float(f["ns_per_byte"]), 4)
                                     if f["ns_per_byte"] else None, "basis": str(f["basis"])}
                                    for f in fit[:MAX_FIT_ROWS]],
                **({"per_packet_cost_rows": len(fit)} if len(fit) > MAX_FIT_ROWS else {}),
            },
            step_us=step_us(ctx),
            replay=replay,
            severity=None if replayed else Severity.LOW,
            saving_basis="" if replayed else "no estimate: " + str(replay.get("reason") or replay.get(
                "steps_not_replayed") or "the replay does not reproduce the measured step"),
            ranks=ranks,
            steps=steps,
            ops=[str(n) for n in ops.index[:5]],
            top=[{"op": str(n), "small_packets": int(x["n"]), "merged_to": int(x["to"]),
                  "small_time_ms": round(float(x["ns"]) / 1e6, 3), "merged_time_ms": round(float(x["ms"]) / 1e6, 3),
                  "ranks": int(x["k"])} for n, x in ops.head(5).iterrows()],
        )


@rule("COM005", "comm.small-packet", cause="comm.small_packet", requires=("events", "steps"), thresholds=Thresholds,
      scope="cluster", rank_part=RankPart(REPLAY_TABLES, rank_part))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per transport when too many transfers are below the size that reaches bandwidth."""
    # operators whose packets are recorded are read packet by packet (first)
    packet_of = {(int(r["rank"]), str(r["transport"])) for r in ctx.query(
        "SELECT DISTINCT rank, transport FROM com005_packets")}
    if packet_of:
        yield from _packet_findings(ctx)
    # no transfer to judge: no communication operator, bandwidth row or host collective
    if not ctx.rows("comm_ops") and not ctx.rows("comm_bandwidth") and not ctx.scalar(
            "SELECT count(*) FROM com005_host WHERE bytes > 0"):
        return
    df = ctx.df(SQL)
    if packet_of and not df.empty:
        df = df[[(int(r), str(t)) not in packet_of for r, t in zip(df["rank"], df["transport"], strict=True)]]
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
        src = "host" if str(g["src"].iloc[0]) == "host" else "device"
        replay = _replay_of(ctx, sorted(int(r) for r in small["rank"].unique()), src)
        replayed = bool(replay and replay.get("estimated") and replay.get("reproduced"))
        fit = [f for f in ctx.query("SELECT * FROM com005_fit ORDER BY rank, op")
               if int(f["rank"]) in set(small["rank"].astype(int))] if replay is not None else []
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
                **({"call_cost_rows": len(fit)} if len(fit) > MAX_FIT_ROWS else {}),
                **({"call_cost": [{"rank": int(f["rank"]), "op": str(f["op"]), "calls": int(f["calls"]),
                                   "per_call_us": round(float(f["per_call_ns"]) / 1e3, 3),
                                   "bandwidth_gbps": round(1.0 / float(f["ns_per_byte"]), 4)
                                   if f["ns_per_byte"] else None,
                                   "caller_call_us": None if f["caller_call_ns"] is None
                                   else round(float(f["caller_call_ns"]) / 1e3, 3),
                                   "basis": str(f["basis"])} for f in fit[:MAX_FIT_ROWS]]} if fit else {}),
            },
            saving_us=saving_us,
            step_us=s_us,
            replay=replay,
            severity=None if saving_us is not None or replayed else Severity.LOW,
            saving_basis="per step, transit time of the small transfers minus bytes / peak on the worst rank "
                         "(median over steps)" if saving_us is not None else
                         "no estimate: the durations include waiting for peers or the transport's peak is unknown",
            ranks=sorted(int(r) for r in small["rank"].unique()),
            steps=sorted(int(s) for s in small["step"].dropna().unique()),
            ops=[str(n) for n in small.groupby("name").size().sort_values(ascending=False, kind="stable").index[:5]],
            top=[{"op": str(name), "transfers": len(x), "mean_bytes": round(float(x["bytes"].mean()), 1)}
                 for name, x in sorted(small.groupby("name"), key=lambda kv: -len(kv[1]))[:5]],
        )
