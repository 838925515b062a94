"""Shared helpers of the hardware-metric rules (HW*): the stage's result, devices' specifications,
the samples of a phase.

Not a rule module (the leading underscore keeps the registry from importing it as one).
"""

from __future__ import annotations

from typing import Any, cast

import pandas as pd

from advisor.engine.rule import RuleContext
from advisor.text import spans
from rules.compute._common import Device, match_device

Hardware = Any  # advisor.stages.hardware.Hardware, which rules reach through RuleContext.hardware()


def stage(ctx: RuleContext[Any]) -> Hardware:
    """The hardware stage of this analysis (computed once, shared by the rules)."""
    return ctx.hardware()


def rank_device(ctx: RuleContext[Any]) -> dict[int, tuple[str | None, Device | None]]:
    """Per rank: the device name as exported and its devices.toml entry (None when unknown)."""
    def build() -> dict[int, tuple[str | None, Device | None]]:
        rows = ctx.query("SELECT rank, device_name FROM ranks ORDER BY rank")
        return {int(r["rank"]): (r["device_name"], match_device(r["device_name"])) for r in rows}

    return ctx.once("hw_rank_devices", build)


def spec_of(ctx: RuleContext[Any], hw: Hardware, dev: str) -> tuple[str | None, Device | None]:
    """The exported name and devices.toml entry of a hardware device (through its rank)."""
    rank = hw.rank_of(dev)
    if rank is None:
        return None, None
    return rank_device(ctx).get(rank, (None, None))


def phase_samples(hw: Hardware, metric: str, phase: str) -> tuple[pd.DataFrame, str]:
    """The samples of ``metric`` in ``phase`` (``Hardware.in_phase``) and the basis."""
    return hw.in_phase(metric, phase)  # type: ignore[no-any-return]


def steps_text(steps: list[int]) -> str:
    """Steps as compact runs for a title: ``[1, 2, 3, 7]`` -> ``1-3, 7`` (at most 8 runs); ``-`` for none."""
    return spans(steps) if steps else "-"


#: link kinds and their per-direction series (bytes/s); xGMI is sampled as one figure
LINKS: dict[str, tuple[str, ...]] = {
    "nvlink": ("nvlink_tx_bps", "nvlink_rx_bps"),
    "hccs": ("hccs_tx_bps", "hccs_rx_bps"),
    "xgmi": ("xgmi_bw_bps",),
    "pcie": ("pcie_tx_bps", "pcie_rx_bps"),
    "roce": ("roce_tx_bps", "roce_rx_bps"),
    "nic": ("nic_tx_bps", "nic_rx_bps"),
}
FAST_LINKS = ("nvlink", "hccs", "xgmi")


def link_peak(ctx: RuleContext[Any], hw: Hardware, dev: str, kind: str) -> tuple[float | None, str]:
    """Peak bandwidth per direction (GB/s) of a link kind on a device: the rule's override
    (``peak_<kind>_gbps``), else the device's devices.toml entry; and where it comes from."""
    override = float(getattr(ctx.t, f"peak_{kind}_gbps", 0.0) or 0.0)
    if override > 0:
        return override, "override"
    name, spec = spec_of(ctx, hw, dev)
    if spec is not None and kind in spec.links_gbps:
        return float(spec.links_gbps[kind]), f"devices.toml {spec.id}"
    return None, f"no {kind} figure for device {name!r}" if name else f"no {kind} figure (device unnamed)"


def link_means(hw: Hardware, phase: str) -> tuple[dict[tuple[str, str], dict[str, Any]], str]:
    """Per (device, series) of every link series: the mean and p95 in ``phase`` (see
    :func:`phase_samples`), the samples, and the mean per step; and the basis of the selection."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    basis = ""
    have = set(hw.samples["metric"].unique()) if not hw.empty else set()
    for series in (m for ms in LINKS.values() for m in ms):
        if series not in have:
            continue
        s, basis = phase_samples(hw, series, phase)
        if s.empty:
            continue
        grp = s.groupby("dev")["value"]
        stats = pd.DataFrame({"mean": grp.mean(), "p95": grp.quantile(0.95), "n": grp.size()})
        per_step: dict[str, dict[int, float]] = {}
        inside = s[s["step"] >= 0]
        for key, v in inside.groupby(["dev", "step"])["value"].mean().items():
            dev, step = cast(tuple[Any, Any], key)
            per_step.setdefault(str(dev), {})[int(step)] = float(v)
        for dev, r in stats.iterrows():
            out[(str(dev), series)] = {"mean": float(r["mean"]), "p95": float(r["p95"]), "samples": int(r["n"]),
                                       "per_step": per_step.get(str(dev), {})}
    return out, basis
