"""A device's link runs at its physical limit while the device communicates.

## Why it matters
When the NVLink / HCCS / xGMI fabric, PCIe or the device's network port already carries its peak
bandwidth during the communication phases, collectives cannot go faster on this hardware: the
fix is less traffic or a different layout, not tuning. Moneo (§III-A) samples NVLink, PCIe and
InfiniBand throughput per device for this.

## How it is detected
From ``hw_metrics`` link series (``nvlink_tx_bps`` / ``_rx_bps``, ``hccs_*``, ``xgmi_bw_bps``,
``pcie_*``, ``roce_*``, ``nic_*``), per device and direction, over the samples taken while a device
communication runs (without device events: every sample inside a step): the mean against the
link's peak per direction from ``rules/compute/devices.toml`` (``links_gbps``, each figure with its
source) or the ``peak_<kind>_gbps`` override. It fires when the mean reaches ``min_share`` of the
peak. The steps named are those whose communication-phase mean does. A device whose link peak is
unknown is named in warnings.

No saving is estimated: a saturated link bounds communication at its current time.

## What to do
Move less data: gradient compression or lower-precision communication, a parallel layout that
keeps heavy traffic (tensor parallelism) on the fastest link, overlap with compute; or more /
faster links.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.hardware._common import LINKS, link_means, link_peak, stage, steps_text


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for HW002."""

    min_share: float = knob(0.9, "fire when the mean bandwidth during communication reaches this share of the peak")
    peak_nvlink_gbps: float = knob(0.0, "NVLink peak per direction, GB/s; 0 = devices.toml")
    peak_hccs_gbps: float = knob(0.0, "HCCS peak per direction, GB/s; 0 = devices.toml")
    peak_xgmi_gbps: float = knob(0.0, "xGMI / Infinity Fabric peak per direction, GB/s; 0 = devices.toml")
    peak_pcie_gbps: float = knob(0.0, "PCIe peak per direction, GB/s; 0 = devices.toml")
    peak_roce_gbps: float = knob(0.0, "RoCE port peak per direction, GB/s; 0 = devices.toml")
    peak_nic_gbps: float = knob(0.0, "network card peak per direction, GB/s (not a device property: set it)")


@rule("HW002", "hardware.link-saturated", cause="comm.link_saturated", scope="cluster", requires=("hw_metrics",),
      thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per device and link direction at its peak during communication."""
    hw = stage(ctx)
    means, basis = link_means(hw, "comm")
    if not means:
        ctx.warn("hw_metrics has no link bandwidth series (nvlink/hccs/xgmi/pcie/roce/nic *_bps)")
        return
    kind_of = {m: k for k, ms in LINKS.items() for m in ms}
    unknown: set[str] = set()
    for (dev, series), st in sorted(means.items()):
        kind = kind_of[series]
        peak, where = link_peak(ctx, hw, dev, kind)
        if peak is None:
            unknown.add(f"{hw.label(dev)} {kind} ({where})")
            continue
        share = st["mean"] / (peak * 1e9)
        if share < ctx.t.min_share:
            continue
        steps = sorted(s for s, v in st["per_step"].items() if v / (peak * 1e9) >= ctx.t.min_share)
        rank = hw.rank_of(dev)
        yield ctx.finding(
            title=(f"{hw.label(dev)}: {series.replace('_bps', '').replace('_', ' ')} at {share:.0%} of its "
                   f"{peak:g} GB/s peak during communication (steps {steps_text(steps)})"),
            evidence={
                "device": hw.label(dev),
                "link": kind,
                "series": series,
                "mean_gbps": round(st["mean"] / 1e9, 2),
                "p95_gbps": round(st["p95"] / 1e9, 2),
                "peak_gbps": peak,
                "peak_basis": where,
                "share": round(share, 3),
                "min_share": ctx.t.min_share,
                "samples": st["samples"],
                "over": basis,
            },
            severity=Severity.MEDIUM,
            ranks=[] if rank is None else [rank],
            steps=steps,
        )
    if unknown:
        ctx.warn("link peak unknown, saturation not judged for: " + ", ".join(sorted(unknown)[:8])
                 + (f" ... ({len(unknown)} in all)" if len(unknown) > 8 else "")
                 + " - set HW002.peak_<kind>_gbps")
