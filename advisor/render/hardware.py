"""Geometry of the report's hardware section (``templates/_hardware.html.j2``) from its JSON
``hardware`` field: per metric a panel with one line per device over the profile's time (steps
shaded, the breakdown's phases in a strip beneath), or for many devices a heat map (devices x
time) drawn as a small PNG embedded as a data URI (the page's policy allows ``img-src data:``).
Every string stays text for the template, which escapes it."""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Mapping
from typing import Any

from advisor.units import fmt_value

WIDTH = 820
LEFT = 70
RIGHT = 10
PANEL_H = 96
HEAT_H = 220
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
PHASE_CLASSES = ("compute_only", "overlapped", "comm_only", "host_only", "free")


def _fmt(v: float | None, unit: str) -> str:
    return fmt_value("x" + {"%": "_pct", "MHz": "_mhz", "W": "_w", "°C": "_c", "B": "_bytes", "B/s": "_bps"}.get(unit, ""),
                     v)


def _png(rows: list[list[float | None]], lo: float, hi: float) -> str:
    """A heat map as a PNG data URI: one pixel per cell, light (low) to dark blue (high), grey where empty."""
    h = len(rows)
    w = max((len(r) for r in rows), default=0)
    raw = bytearray()
    span = hi - lo if hi > lo else 1.0
    for r in rows:
        raw.append(0)
        for i in range(w):
            v = r[i] if i < len(r) else None
            if v is None or not math.isfinite(v):
                raw += bytes((235, 235, 235))
                continue
            t = min(1.0, max(0.0, (v - lo) / span))
            raw += bytes((int(247 - t * (247 - 8)), int(251 - t * (251 - 48)), int(255 - t * (255 - 107))))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def view(hw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the template draws (None when the report has no hardware field)."""
    if not isinstance(hw, Mapping) or not hw.get("metrics"):
        return None
    tl = hw.get("timeline") or {}
    span = float(tl.get("span_ms") or 0.0) or 1.0
    mode = str(tl.get("mode") or "lines")
    plot_w = WIDTH - LEFT - RIGHT

    def x(ms: float) -> float:
        return round(LEFT + plot_w * min(1.0, max(0.0, ms / span)), 2)

    steps = []
    for i, s in enumerate(tl.get("steps") or []):
        a, b = x(float(s.get("start_ms", 0))), x(float(s.get("end_ms", 0)))
        if b <= a:
            continue
        segs = []
        pos = a
        for c in PHASE_CLASSES:
            share = float((s.get("phases") or {}).get(c) or 0.0)
            if share > 0:
                segs.append({"cls": "ph-" + c, "x": round(pos, 2), "w": round((b - a) * share, 2),
                             "title": f"step {s.get('step')}: {c.replace('_', ' ')} {share:.0%}"})
                pos += (b - a) * share
        steps.append({"step": s.get("step"), "x": a, "w": round(b - a, 2), "odd": i % 2 == 1, "segs": segs})
    label_every = max(1, len(steps) // 20)
    panels = []
    for k, m in enumerate(hw.get("series") or []):
        rows = m.get("rows") or []
        lo, hi = m.get("lo"), m.get("hi")
        lo = float(lo) if isinstance(lo, (int, float)) else 0.0
        hi = float(hi) if isinstance(hi, (int, float)) else 1.0
        if hi <= lo:
            hi = lo + (abs(lo) or 1.0)
        nb = max((len(r.get("values") or []) for r in rows), default=0)
        panel: dict[str, Any] = {"id": f"hw-{k}", "metric": str(m.get("metric")), "unit": str(m.get("unit") or ""),
                                 "lo_text": _fmt(lo, str(m.get("unit") or "")),
                                 "hi_text": _fmt(hi, str(m.get("unit") or "")), "devices": len(rows)}
        if mode == "heatmap":
            panel["h"] = HEAT_H
            panel["image"] = _png([list(r.get("values") or []) for r in rows], lo, hi) if rows and nb else None
        else:
            panel["h"] = PANEL_H
            lines = []
            for i, r in enumerate(rows):
                vals = r.get("values") or []
                pts: list[list[str]] = [[]]
                for j, v in enumerate(vals):
                    if v is None:
                        if pts[-1]:
                            pts.append([])
                        continue
                    px = LEFT + plot_w * (j + 0.5) / max(1, len(vals))
                    py = 8 + (PANEL_H - 16) * (1 - (float(v) - lo) / (hi - lo))
                    pts[-1].append(f"{px:.1f},{py:.1f}")
                lines.append({"device": str(r.get("device")), "color": PALETTE[i % len(PALETTE)],
                              "paths": [" ".join(p) for p in pts if p]})
            panel["lines"] = lines
        panels.append(panel)
    legend = []
    if mode == "lines" and hw.get("series"):
        first = (hw.get("series") or [{}])[0].get("rows") or []
        legend = [{"device": str(r.get("device")), "color": PALETTE[i % len(PALETTE)]} for i, r in enumerate(first)]
    return {
        "mode": mode, "width": WIDTH, "left": LEFT, "plot_w": plot_w, "steps": steps, "label_every": label_every,
        "panels": panels, "legend": legend, "span_ms": span,
        "metrics": list(hw.get("metrics") or []), "dropped": list(hw.get("dropped") or []),
        "diverging": list(hw.get("diverging") or []), "devices": hw.get("devices"),
        "phases_known": bool(hw.get("phases_known")),
    }
