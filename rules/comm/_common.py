"""Shared pieces of the communication rules: peak link bandwidths per transport, step times.

Not a rule module (the leading underscore keeps the registry from importing it as one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob


@dataclass(frozen=True, slots=True)
class LinkPeak:
    """Physical peak bandwidth of one transport variant, one direction, in GB/s (10^9 bytes/s)."""

    transport: str
    variant: str
    peak_gbps: float
    source: str


# Known link peaks (unidirectional). The defaults the rules use are the first entry per transport;
# every rule that compares with a peak exposes it as a threshold (peak_<transport>_gbps).
LINK_PEAKS: tuple[LinkPeak, ...] = (
    LinkPeak("HCCS", "Ascend 910 intra-node cluster (4 NPUs)", 30.0,
             "Hermes appendix A: NPUs interconnected via HCCS at 30 GB/s unidirectional (Table 7 lists 32 GB/s)"),
    LinkPeak("PCIE", "PCIe 4.0 x16", 31.5,
             "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b encoding = 31.5 GB/s per direction (Hermes appendix A: 32 GB/s)"),
    LinkPeak("PCIE", "PCIe 5.0 x16", 63.0, "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s per direction"),
    LinkPeak("RDMA", "RoCE v2 100 Gb/s", 12.5, "Hermes appendix A: one 100G RoCE v2 port per NPU; 100 Gb/s = 12.5 GB/s"),
    LinkPeak("RDMA", "RoCE / InfiniBand 200 Gb/s", 25.0, "200 Gb/s line rate = 25 GB/s"),
    LinkPeak("RDMA", "RoCE / InfiniBand 400 Gb/s", 50.0, "400 Gb/s line rate = 50 GB/s"),
    LinkPeak("SDMA", "Ascend intra-node DMA (HCCS / PCIe aggregate)", 30.0,
             "Huawei docs describe SDMA as the intra-node (HCCS/PCIe) aggregate; taken equal to the HCCS peak"),
    LinkPeak("NVLINK", "NVLink 3 (A100, 12 links)", 300.0, "NVIDIA A100: 600 GB/s total bidirectional NVLink"),
    LinkPeak("NVLINK", "NVLink 2 (V100, 6 links)", 150.0, "NVIDIA V100: 300 GB/s total bidirectional NVLink"),
    LinkPeak("NVLINK", "NVLink 4 (H100, 18 links)", 450.0, "NVIDIA H100: 900 GB/s total bidirectional NVLink"),
    LinkPeak("NVLINK", "NVLink 5 (B200, 18 links)", 900.0, "NVIDIA B200: 1.8 TB/s total bidirectional NVLink"),
)


def _default(transport: str) -> LinkPeak:
    return next(p for p in LINK_PEAKS if p.transport == transport)


def _peak_knob(transport: str) -> Any:
    p = _default(transport)
    return knob(p.peak_gbps, f"peak {transport} bandwidth per direction, GB/s ({p.variant})", p.source)


@dataclass(frozen=True)
class PeakThresholds:
    """Peak link bandwidths; rules that compare with a peak inherit these fields."""

    peak_hccs_gbps: float = _peak_knob("HCCS")
    peak_pcie_gbps: float = _peak_knob("PCIE")
    peak_rdma_gbps: float = _peak_knob("RDMA")
    peak_sdma_gbps: float = _peak_knob("SDMA")
    peak_nvlink_gbps: float = _peak_knob("NVLINK")


def peak_case(col: str) -> str:
    """SQL expression: the configured peak (GB/s) of the transport in column ``col`` (NULL if unknown).

    Only a column name is formatted in; the values come from the ``$peak_*`` parameters.
    """
    return (
        f"CASE upper({col}) WHEN 'HCCS' THEN $peak_hccs_gbps WHEN 'PCIE' THEN $peak_pcie_gbps "
        f"WHEN 'RDMA' THEN $peak_rdma_gbps WHEN 'SDMA' THEN $peak_sdma_gbps "
        f"WHEN 'NVLINK' THEN $peak_nvlink_gbps ELSE NULL END"
    )


# transports that stay inside a node (HBM-adjacent DMA; Hermes §4.2.2 bandwidth contention)
INTRA_NODE = ("HCCS", "PCIE", "SDMA", "SIO", "NVLINK")

# point-to-point operators: their partner is one rank, not a group (no group-wide wait ratio)
P2P_RE = r"(?i)send|recv|receive"


def step_us(ctx: RuleContext[Any], rank: int | None = None) -> float:
    """Median step time in µs of ``rank`` (or of all ranks): the breakdown, else the step windows."""
    v = ctx.step_us(rank)
    if v:
        return v
    row = ctx.query(
        "SELECT median(end_ns - start_ns) / 1000.0 AS us FROM steps WHERE ($rank IS NULL OR rank = $rank)",
        {"rank": rank},
    )
    return float(row[0]["us"] or 0.0) if row else 0.0


def ms(ns: float | None) -> float | None:
    """ns -> ms rounded for evidence."""
    return None if ns is None else round(float(ns) / 1e6, 3)


# comm_bandwidth rows with bytes, without the SDMA entry of an operator that also reports its
# HCCS / PCIe / SIO traffic (Huawei describes SDMA as their aggregate: counting both doubles it).
BW_ROWS_CTE = """bw_rows AS (
    SELECT b.rank, b.step, b.name, b.group_name, upper(b.transport) AS transport, b.bytes,
           coalesce(b.transit_ns, CASE WHEN b.bandwidth_gbps > 0 THEN b.bytes / b.bandwidth_gbps END) AS transit_ns
    FROM comm_bandwidth b
    WHERE b.bytes > 0 AND NOT (upper(b.transport) = 'SDMA' AND EXISTS (
        SELECT 1 FROM comm_bandwidth h
        WHERE h.rank = b.rank AND h.name = b.name AND h.step IS NOT DISTINCT FROM b.step
          AND h.group_name IS NOT DISTINCT FROM b.group_name
          AND upper(h.transport) IN ('HCCS', 'PCIE', 'SIO') AND h.bytes > 0))
)"""


# -- the transfers' counterfactual: moved at a reference bandwidth (advisor.stages.replay) --------------

#: a rank part's table of replayed (rank, step)s: the measured step, the replayed saving (NULL: not
#: estimated, ``reason`` says why), the no-change replay's error
REPLAY_COLUMNS = "rank INTEGER, step INTEGER, measured_ns BIGINT, saving_ns BIGINT, error DOUBLE, reason VARCHAR"


@dataclass(frozen=True, slots=True)
class Faster:
    """One operator's transfers over one transport (a ``comm_bandwidth`` row) and the bandwidth (GB/s =
    bytes per ns) they would move their bytes at."""

    step: int | None
    name: str
    transport: str
    bytes: float
    transit_ns: float
    gbps: float

    @property
    def excess_ns(self) -> float:
        """The transit time beyond the bytes at ``gbps`` (none when they are at least that fast)."""
        return max(self.transit_ns - self.bytes / self.gbps, 0.0) if self.gbps > 0 else 0.0


# comm_bandwidth's transports in comm_tasks' terms: RDMA is the RDMA (RoCE) tasks; SDMA the intra-node
# DMA over HCCS / PCIe / SIO (not the on-chip copies); HCCS / PCIE / SIO the tasks over that link
_TASK_OF_TRANSPORT = """CASE op.transport
    WHEN 'RDMA' THEN upper(coalesce(t.transport, '')) = 'RDMA' OR upper(coalesce(t.link_type, '')) = 'ROCE'
    WHEN 'SDMA' THEN upper(coalesce(t.transport, '')) = 'SDMA'
                     AND upper(coalesce(t.link_type, '')) IN ('HCCS', 'PCIE', 'SIO')
    ELSE upper(coalesce(t.link_type, '')) = op.transport END"""

# the device events a change bounds: each transfer task of an operator over the transport (its duration times
# the operator's factor), or where the export has no such tasks, the operator itself, shortened by the part of
# its transit time the factor takes off. Its transit time is the operator table's (the wall time it moved
# data; a transport's summed task times exceed it where tasks run side by side), else the transports' summed
# task time up to its duration, each transport's share of it in proportion to its task time. The operator's
# event: its name, overlapping its comm_ops row (the .db export's operator table runs a few µs off the device
# timeline); its tasks: comm_tasks rows within that event, matched to device events by start and duration
_BOUNDED_SQL = f"""
WITH {BW_ROWS_CTE},
w AS (
    SELECT unnest($names) AS name, unnest($steps) AS step, unnest($transports) AS transport,
           unnest($factors) AS f, unnest($transits) AS transit
),
tot AS (SELECT name, step, sum(transit_ns) AS transit FROM bw_rows WHERE rank = $rank GROUP BY ALL),
op AS (
    SELECT w.*, o.transit_ns AS o_transit, tot.transit AS tot, e.name AS e_name, e.start_ns AS e_start,
           e.dur_ns AS e_dur
    FROM w JOIN comm_ops o ON o.rank = $rank AND o.name = w.name AND o.step IS NOT DISTINCT FROM w.step
    JOIN events e ON e.rank = $rank AND e.device AND e.kind = 'comm' AND e.name = o.name
         AND e.start_ns < o.start_ns + o.dur_ns AND e.start_ns + e.dur_ns > o.start_ns
    LEFT JOIN tot ON tot.name = w.name AND tot.step IS NOT DISTINCT FROM w.step
),
task AS (
    SELECT DISTINCT op.name AS op_name, e.name, e.start_ns, e.dur_ns, op.f
    FROM op JOIN comm_tasks t ON t.rank = $rank AND t.op_name = op.name AND t.bytes > 0
         AND t.start_ns >= op.e_start AND t.start_ns < op.e_start + op.e_dur AND {_TASK_OF_TRANSPORT}
    JOIN events e ON e.rank = $rank AND e.device AND e.kind = 'comm' AND e.start_ns = t.start_ns
         AND e.dur_ns = t.dur_ns
),
whole AS (
    SELECT name AS op_name, e_name, e_start, e_dur,
           sum(coalesce(o_transit, least(greatest(tot, transit), e_dur)) * transit / greatest(tot, transit)
               * (1 - f)) AS cut
    FROM op WHERE name NOT IN (SELECT op_name FROM task)
    GROUP BY ALL
)
SELECT op_name, name, start_ns, round(dur_ns * f)::BIGINT AS bound FROM task
UNION ALL SELECT op_name, e_name, e_start, round(greatest(e_dur - cut, 0))::BIGINT FROM whole
ORDER BY start_ns, name
"""


def transfer_changes(ctx: RuleContext[Any], rank: int, ops: list[Faster]) -> tuple[list[Any], set[str]]:
    """The counterfactual of ``ops`` on rank ``rank`` as data: each operator's transfers over its transport
    take its bytes at its ``gbps``. Where the export records the operator's transfer tasks (``comm_tasks``,
    on the device timeline), each task of that transport is scaled by f = (bytes / gbps) / transit; where
    the operator is one device event, it loses (1 - f) of its transit time over the transport. And the
    operators slower than their bandwidth that are on no device timeline (nothing to bound)."""
    from advisor.engine.rule import Change, Select

    ops = [o for o in ops if o.excess_ns > 0 and o.transit_ns > 0]
    if not ops:
        return [], set()
    rows = ctx.query(_BOUNDED_SQL, {
        "rank": int(rank), "names": [o.name for o in ops], "steps": [o.step for o in ops],
        "transports": [o.transport.upper() for o in ops],
        "factors": [(o.bytes / o.gbps) / o.transit_ns for o in ops], "transits": [o.transit_ns for o in ops]})
    bounds = tuple((str(r["name"]), int(r["start_ns"]), int(r["bound"])) for r in rows)
    missing = {o.name for o in ops} - {str(r["op_name"]) for r in rows}
    return ([Change("bound", Select(kinds=("comm",), device=True), event_bounds=bounds)] if bounds else []), missing


def replay_rows(ctx: RuleContext[Any], rank: int, ops: list[Faster]) -> list[tuple[Any, ...]]:
    """Rows of :data:`REPLAY_COLUMNS`: rank ``rank``'s steps with ``ops`` (those slower than their bandwidth)
    replayed with :func:`transfer_changes`; a step with an operator that is on no device timeline is not
    estimated."""
    ops = [o for o in ops if o.excess_ns > 0 and o.transit_ns > 0 and o.step is not None]
    steps = sorted({int(o.step) for o in ops})  # type: ignore[arg-type]
    if not steps:
        return []
    changes, missing = transfer_changes(ctx, rank, ops)
    off = {int(o.step): o.name for o in ops if o.name in missing}  # type: ignore[arg-type]
    out: list[tuple[Any, ...]] = []
    for res in ctx.replay_steps(int(rank), changes, steps) if changes else []:
        why = res.reason or (None if res.reproduced else "the replay does not reproduce the measured step")
        if why is None and res.step in off:
            why = f"{off[res.step]}'s transfers are on no device timeline of rank {rank}: nothing to shorten"
        out.append((int(rank), res.step, res.measured_ns, res.saving_ns if why is None else None, res.error, why))
    done = {r[1] for r in out}
    for s in steps:
        if s not in done:
            why = (f"{off[s]}'s transfers are on no device timeline of rank {rank}: nothing to shorten" if s in off
                   else f"rank {rank} has no step window of step {s} to replay")
            out.append((int(rank), s, None, None, None, why))
    return out


def mean_step_us(ctx: RuleContext[Any], ranks: list[int], steps: list[int]) -> float | None:
    """The mean step (µs) of ``ranks`` over ``steps`` in the breakdown (None where it has none)."""
    bd = ctx.breakdown()
    if bd is None or bd.empty:
        return None
    sel = bd[bd["rank"].isin(ranks) & bd["step"].isin(steps)]["step_us"]
    return float(sel.mean()) if len(sel) else None


def slowest_rank_savings(by_step: dict[int, list[dict[str, Any]]]
                         ) -> tuple[list[tuple[int, int]], list[float], set[str]]:
    """Per step of ``by_step`` (its ranks' replay rows: ``measured_ns``, ``saving_ns``, ``error``, ``reason``),
    the cluster's step (its slowest rank) measured less replayed, with that measured step: (saving ns,
    measured ns) of the steps whose every rank was replayed; the no-change replays' errors; why the others
    were not."""
    pairs: list[tuple[int, int]] = []
    errors: list[float] = []
    reasons: set[str] = set()
    for members in by_step.values():
        errors += [float(r["error"]) for r in members if r["error"] is not None]
        if any(r["saving_ns"] is None for r in members):
            reasons |= {str(r["reason"]) for r in members if r["reason"]}
            continue
        measured = max(int(r["measured_ns"]) for r in members)
        pairs.append((measured - max(int(r["measured_ns"]) - int(r["saving_ns"]) for r in members), measured))
    return pairs, errors, reasons


def replay_summary(rows: list[dict[str, Any]], ranks: list[int], steps: list[int], assumption: str,
                   step_us: float | None = None) -> dict[str, Any]:
    """A finding's ``replay`` from its ranks' :data:`REPLAY_COLUMNS` rows over ``steps`` (a step no rank
    replayed saves nothing: no change touches it): per step, the step of the slowest of the ranks
    replayed with the change, against its measured one (ranks not joined: a rank's peers keep their
    measured waits); the mean over the steps. Not estimated where a step's rank was not replayed.
    ``saving_fraction`` is of ``step_us`` where given, else of the replayed steps' mean."""
    want, group = {int(s) for s in steps}, {int(r) for r in ranks}
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if int(r["rank"]) in group and r["step"] is not None and int(r["step"]) in want:
            by_step.setdefault(int(r["step"]), []).append(r)
    if not by_step:
        return {"estimated": False, "assumption": assumption,
                "reason": "no step of these ranks has a transfer slower than that bandwidth: nothing to shorten"}
    pairs, errors, reasons = slowest_rank_savings(by_step)
    savings, measured = [sv for sv, _ in pairs], [m for _, m in pairs]
    if not savings:
        return {"estimated": False, "assumption": assumption, "reason": "; ".join(sorted(reasons)) or "not replayed"}
    n = len(savings) + len(want - set(by_step))  # the steps no change touches save nothing
    saving_us = max(sum(savings) / n / 1000.0, 0.0)
    step_us = step_us or sum(measured) / len(measured) / 1000.0
    out = {"estimated": True, "saving_us": round(saving_us, 3),
           "saving_fraction": round(saving_us / step_us, 4) if step_us else None,
           "assumption": assumption, "reproduced": len(savings) == len(by_step),
           "reproduction_error": round(max(errors), 4) if errors else 0.0,
           "steps": len(want), "steps_replayed": n}
    if reasons:
        out["steps_not_replayed"] = "; ".join(sorted(reasons))
    return out
