"""Units of the canonical hardware metric names (the unit is the name's suffix) and how a value
is written with its unit; shared by the hardware stage, its rules and the renderers."""

from __future__ import annotations

import math

_UNITS = (("_pct", "%"), ("_mhz", "MHz"), ("_w", "W"), ("_c", "°C"), ("_bytes", "B"), ("_bps", "B/s"))


def unit_of(metric: str) -> str:
    """The unit a canonical name carries in its suffix ('' when none)."""
    for suf, unit in _UNITS:
        if metric.endswith(suf):
            return unit
    return ""


def fmt_value(metric: str, v: float | None) -> str:
    """A metric value with its unit, scaled for reading (GB/s, GB)."""
    if v is None or not math.isfinite(v):
        return "-"
    unit = unit_of(metric)
    if unit in ("B/s", "B"):
        for div, pre in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if round(abs(v) / div, 3) >= 1:
                return f"{v / div:.3g} {pre}{unit}"
        return f"{v:.3g} {unit}"
    if unit == "%":
        return f"{v:.1f}%"
    return f"{v:.4g} {unit}".strip()
