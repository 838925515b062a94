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
