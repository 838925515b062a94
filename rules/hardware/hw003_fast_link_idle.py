"""The device's fast link (NVLink / HCCS / xGMI) stays idle while its collectives go over a slower one.

## Why it matters
Devices joined by NVLink, HCCS or Infinity Fabric exchange data there several times faster than
over PCIe or the network. When the fast link is idle during the communication phases and PCIe or
the network port carries the traffic instead, the collectives run at the slower link's speed: a
disabled peer-to-peer path (``NCCL_P2P_DISABLE``), a container without the fabric devices, HCCL
routing intra-node traffic over PCIe or RoCE, or a link that is down.

## How it is detected
From ``hw_metrics``, per device, over the samples taken while a device communication runs (phase
from the rank's device events; without them the rule cannot tell the communication phases and
says so): the fast link's mean bandwidth (the larger direction) is at most ``max_idle_share`` of
its peak (``rules/compute/devices.toml`` ``links_gbps`` or the ``peak_<kind>_gbps`` override; a
device without a figure is not judged), while a slower link (PCIe, RoCE, NIC) carries at least
``min_other_gbps`` GB/s.

The saving is the per-step exposed communication time (breakdown ``comm_only_us``) times
``1 - slow bandwidth / fast peak``: that traffic at the fast link's peak (an upper bound).

## What to do
Check ``NCCL_P2P_DISABLE`` / ``NCCL_P2P_LEVEL`` and ``nvidia-smi topo -m`` (GPU), ``HCCL_INTRA_PCIE_ENABLE`` /
``HCCL_INTRA_ROCE_ENABLE`` and ``npu-smi info -t topo`` (Ascend), and the fabric's health.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity
from rules.hardware._common import FAST_LINKS, LINKS, link_means, link_peak, stage, steps_text


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for HW003."""

    max_idle_share: float = knob(0.02, "the fast link counts as idle below this share of its peak")
    min_other_gbps: float = knob(1.0, "a slower link carries the traffic when its mean reaches this (GB/s)")
    peak_nvlink_gbps: float = knob(0.0, "NVLink peak per direction, GB/s; 0 = devices.toml")
    peak_hccs_gbps: float = knob(0.0, "HCCS peak per direction, GB/s; 0 = devices.toml")
    peak_xgmi_gbps: float = knob(0.0, "xGMI / Infinity Fabric peak per direction, GB/s; 0 = devices.toml")


@rule("HW003", "hardware.fast-link-idle", cause="comm.fast_link_idle", scope="cluster", requires=("hw_metrics",),
      thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per device whose fast link idles while a slower link carries the communication."""
    hw = stage(ctx)
    means, basis = link_means(hw, "comm")
    if not any(series in LINKS[k] for k in FAST_LINKS for _, series in means):
        return  # no fast-link series: nothing to judge
    if not hw.phases_known:
        ctx.warn("no device events beside the link series: communication phases unknown, idle fast links not judged")
        return
    bd = ctx.breakdown()
    for dev in hw.devices["dev"]:
        dev = str(dev)
        for kind in FAST_LINKS:
            fast = [means[(dev, s)] for s in LINKS[kind] if (dev, s) in means]
            if not fast:
                continue
            fast_mean = max(st["mean"] for st in fast)
            peak, where = link_peak(ctx, hw, dev, kind)
            if peak is None or fast_mean > ctx.t.max_idle_share * peak * 1e9:
                continue
            slow = [(s, means[(dev, s)]) for k in ("pcie", "roce", "nic") for s in LINKS[k] if (dev, s) in means]
            if not slow:
                continue
            s_name, s_st = max(slow, key=lambda x: x[1]["mean"])
            if s_st["mean"] < ctx.t.min_other_gbps * 1e9 or s_st["mean"] <= fast_mean:
                continue
            rank = hw.rank_of(dev)
            comm_us = None
            if rank is not None and not bd.empty and "comm_only_us" in bd:
                sel = bd[bd["rank"] == rank]["comm_only_us"]
                comm_us = float(sel.median()) if len(sel) else None
            gain = max(0.0, 1.0 - s_st["mean"] / (peak * 1e9))
            steps = sorted(s_st["per_step"])
            yield ctx.finding(
                title=(f"{hw.label(dev)}: {kind} idle ({fast_mean / 1e9:.2f} GB/s of {peak:g}) while "
                       f"{s_name.replace('_bps', '').replace('_', ' ')} carries {s_st['mean'] / 1e9:.1f} GB/s "
                       f"during communication (steps {steps_text(steps)})"),
                evidence={
                    "device": hw.label(dev),
                    "fast_link": kind,
                    "fast_mean_gbps": round(fast_mean / 1e9, 3),
                    "fast_peak_gbps": peak,
                    "peak_basis": where,
                    "slow_series": s_name,
                    "slow_mean_gbps": round(s_st["mean"] / 1e9, 2),
                    "max_idle_share": ctx.t.max_idle_share,
                    "min_other_gbps": ctx.t.min_other_gbps,
                    "over": basis,
                    "comm_only_us_per_step": None if comm_us is None else round(comm_us, 1),
                },
                saving_us=None if comm_us is None else comm_us * gain,
                step_us=ctx.step_us(rank) if rank is not None else ctx.step_us(),
                severity=None if comm_us is not None else Severity.MEDIUM,
                saving_basis="median per-step exposed communication x (1 - slow link bandwidth / fast link peak)",
                ranks=[] if rank is None else [rank],
                steps=steps,
            )
