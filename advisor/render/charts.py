"""Chart geometry for the HTML report: plain numbers and labels, drawn as SVG by the templates.

Nothing here builds markup. Every function returns a dict of coordinates, CSS class names from
fixed sets, and label/title strings; the jinja templates (autoescape on) turn them into SVG, so
profile strings (operator names) are escaped like any other text. Sizes are bounded so that a
report for hundreds of ranks stays small: bars are aggregated and timeline segments merged below
one pixel.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping
from typing import Any, cast

from advisor.kinds import SegmentKind
from advisor.render.view import (
    PHASE_LABEL,
    PHASES,
    busiest_rank,
    fmt_bytes,
    fmt_ratio,
    fmt_us,
    per_rank_means,
    truncate,
)

WIDTH = 960
MAX_BARS = 480  # (rank, step) bars in the per-step chart before it switches to one bar per rank
MAX_RANK_ROWS = 64  # rows of the per-rank comparison; beyond, the busiest and the least busy ranks
MAX_SERIES_COLOURED = 8  # ranks drawn as their own coloured line (with a legend) before min/median/max bands
KINDS = tuple(k.value for k in SegmentKind)
KIND_LABEL = {"compute": "compute", "communication": "communication", "host": "host", "io": "data loading",
              "other": "other", "idle": "idle / waiting"}


def nice_ticks(vmax: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``vmax``."""
    if vmax <= 0 or not math.isfinite(vmax):
        return [0.0]
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(math.ceil(vmax / step) + 1)]


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels of time ticks (µs) in one unit, chosen by the largest tick, without the decimals a
    round tick does not have: ``0, 200 ms, 400 ms, 600 ms`` (``fmt_us`` gives ``600.00 ms``, which
    did not fit left of a vertical axis and lost its first digit there)."""
    top = max((abs(t) for t in ticks), default=0.0)
    div, unit = (1e6, "s") if top >= 1e6 else (1e3, "ms") if top >= 1e3 else (1.0, "µs")
    return ["0" if t == 0 else f"{round(t / div, 6):g} {unit}" for t in ticks]


def _axis_left(labels: list[str], least: int) -> int:
    """Left margin that holds the longest tick label right-aligned 6 px left of the axis (11 px
    font: digits ~6.5 px wide, 7 allows for wider glyphs)."""
    return max(least, 6 + 4 + 7 * max((len(x) for x in labels), default=0))


def _phase_title(head: str, row: Mapping[str, Any]) -> str:
    step = float(row.get("step_us") or 0.0)
    parts = [f"{head}: {fmt_us(step)}"]
    for k in PHASES:
        v = float(row.get(k) or 0.0)
        if v > 0:
            parts.append(f"{PHASE_LABEL[k]} {fmt_us(v)} ({fmt_ratio(v / step if step else None)})")
    return "\n".join(parts)


def _stack(row: Mapping[str, Any], y0: float, scale: float, vertical: bool) -> list[dict[str, Any]]:
    """Stacked segments of one bar (bottom-up when vertical, left-to-right otherwise)."""
    segs = []
    pos = 0.0
    for k in PHASES:
        v = float(row.get(k) or 0.0) * scale
        if v <= 0:
            continue
        if vertical:
            segs.append({"cls": "ph-" + k[:-3], "a": round(y0 - pos - v, 2), "len": round(v, 2)})
        else:
            segs.append({"cls": "ph-" + k[:-3], "a": round(y0 + pos, 2), "len": round(v, 2)})
        pos += v
    return segs


def breakdown_bars(breakdown: list[dict[str, Any]], outliers: set[tuple[int, int]],
                   basis: str = "") -> dict[str, Any] | None:
    """Stacked breakdown per (rank, step), grouped by rank; per-rank means when there are too many bars."""
    if not breakdown:
        return None
    rows = sorted(breakdown, key=lambda r: (int(r["rank"]), r.get("step") if r.get("step") is not None else -1))
    aggregated = len(rows) > MAX_BARS
    if aggregated:
        pr = per_rank_means(rows)
        rows = [{"rank": r, "step": None, **m} for r, m in pr.items()]
    vmax = max(float(r.get("step_us") or 0.0) for r in rows) or 1.0
    ticks = nice_ticks(vmax)
    labels = tick_labels(ticks)
    left, right, top, bottom = _axis_left(labels, 62), 16, 12, 34  # right: half of a 4-digit rank label
    height = 240
    plot_h = height - top - bottom
    plot_w = WIDTH - left - right
    scale = plot_h / ticks[-1] if ticks[-1] else 0.0
    ranks = sorted({int(r["rank"]) for r in rows})
    gap = 0.0 if aggregated or len(ranks) == 1 else max(1.0, min(8.0, plot_w * 0.15 / len(ranks)))
    slot = (plot_w - gap * (len(ranks) - 1)) / len(rows)
    bar_w = max(0.6, slot * (0.8 if slot > 3 else 1.0))
    bars, groups = [], []
    x = float(left)
    base_y = top + plot_h
    for rank in ranks:
        gx = x
        for r in (r for r in rows if int(r["rank"]) == rank):
            step = r.get("step")
            head = f"rank {rank}" + (f", step {step}" if step is not None else " (mean over steps)")
            out = step is not None and (rank, int(step)) in outliers
            bars.append({"x": round(x + (slot - bar_w) / 2, 2), "w": round(bar_w, 2),
                         "segs": _stack(r, base_y, scale, vertical=True),
                         "title": _phase_title(head + (" — slow step" if out else ""), r), "outlier": out,
                         "top": round(base_y - float(r.get("step_us") or 0.0) * scale, 2)})
            x += slot
        groups.append({"rank": rank, "x": round((gx + x) / 2, 2), "x0": round(gx, 2), "x1": round(x, 2)})
        x += gap
    every = max(1, math.ceil(len(groups) * 28 / plot_w))
    for i, g in enumerate(groups):
        g["label"] = (i % every == 0) or i == len(groups) - 1 and len(groups) <= 64
    return {"width": WIDTH, "height": height, "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h,
            "base_y": base_y, "bars": bars, "groups": groups, "aggregated": aggregated,
            "yticks": [{"y": round(base_y - t * scale, 2), "label": lab} for t, lab in zip(ticks, labels, strict=True)],
            "basis": basis, "multi_step": len(rows) > len(ranks),  # some rank has two steps or more
            "show_steps": not aggregated and len(ranks) == 1, "steps_label_every": max(1, math.ceil(len(bars) * 30 / plot_w))}


def rank_comparison(breakdown: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One horizontal stacked bar per rank (mean per step): the slow rank stands out by its busy time."""
    pr = per_rank_means(breakdown)
    if len(pr) < 2:
        return None
    total = len(pr)
    busy = {r: m["step_us"] - m["comm_only_us"] - m["free_us"] for r, m in pr.items()}
    med_busy = statistics.median(busy.values())
    steps = [m["step_us"] for m in pr.values()]
    mean_step = statistics.fmean(steps)
    busiest = busiest_rank(breakdown)
    least = 0
    if total > MAX_RANK_ROWS:
        # a row per rank would be thousands of pixels tall: the ranks others may wait for (most
        # busy time) and, for contrast, the least busy ones, in rank order; the breakdown chart
        # above has every rank
        least = MAX_RANK_ROWS // 4
        by_busy = sorted(pr, key=lambda r: (-busy[r], r))
        keep = set(by_busy[: MAX_RANK_ROWS - least]) | set(by_busy[-least:])
        pr = {r: m for r, m in pr.items() if r in keep}
    n = len(pr)
    row_h = max(3.0, min(18.0, 640.0 / n))
    left, right, top, bottom = 70, 130, 8, 30
    plot_w = WIDTH - left - right
    height = int(top + bottom + row_h * n)
    vmax = max(m["step_us"] for m in pr.values()) or 1.0
    ticks = nice_ticks(vmax)
    scale = plot_w / ticks[-1]
    every = max(1, math.ceil(11.0 / row_h))
    rows = []
    for i, (rank, m) in enumerate(pr.items()):
        y = top + i * row_h
        slow = rank == busiest and busy[rank] > med_busy * 1.05
        rows.append({"rank": rank, "y": round(y, 2), "h": round(max(1.0, row_h * 0.82), 2),
                     "segs": _stack(m, left, scale, vertical=False), "slow": slow,
                     "label": i % every == 0 or slow,
                     "busy": fmt_us(busy[rank]),
                     "end": round(left + m["step_us"] * scale, 2),
                     "title": _phase_title(f"rank {rank} (mean of {int(m['steps'])} steps)", m)})
    return {"width": WIDTH, "height": height, "left": left, "top": top, "plot_w": plot_w, "row_h": row_h,
            "rows": rows, "total": total, "busiest_shown": n - least if least else None, "least_shown": least or None,
            "busiest": busiest, "mean_x": round(left + mean_step * scale, 2),
            "mean_label": fmt_us(mean_step), "base_y": round(top + row_h * n, 2),
            "xticks": [{"x": round(left + t * scale, 2), "label": lab} for t, lab in zip(ticks, tick_labels(ticks), strict=True)]}


def robust_top(values: list[float]) -> float:
    """Top of a value axis that a few extreme values do not flatten.

    Values above a fence — Tukey's far fence (Q3 + 3·IQR, at least twice the median) but at most
    four times the median, since a slow step shared by every rank can hold a quarter of the values
    and move Q3 — are left out when the largest of them is more than three times the largest value
    inside (the rest would use under a third of the height). Those are drawn clipped at the top
    edge with their value written beside them. Otherwise: the largest value."""
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return 0.0
    if len(vals) < 4:
        return vals[-1]
    q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    med = statistics.median(vals)
    fence = min(4.0 * med, max(q3 + 3.0 * (q3 - q1), 2.0 * med))
    inside = [v for v in vals if v <= fence]
    if not inside or inside[-1] <= 0 or vals[-1] <= 3.0 * inside[-1]:
        return vals[-1]
    return inside[-1]


def step_series(breakdown: list[dict[str, Any]], outliers: set[tuple[int, int]],
                basis: str = "") -> dict[str, Any] | None:
    """Step time across steps: one coloured line per rank with a legend for a few ranks, a
    min–max band with the median line for more; the slow steps ``outliers`` marked (``basis``: why
    they are, for the caption; see ``view.slow_steps``). The y axis ends at :func:`robust_top`, so a
    4.5 s step does not flatten 34 ms ones; points above it sit on the top edge, labelled."""
    pts: dict[int, list[tuple[int, float]]] = {}
    for r in breakdown:
        if r.get("step") is None:
            continue
        pts.setdefault(int(r["rank"]), []).append((int(r["step"]), float(r.get("step_us") or 0.0)))
    steps = sorted({s for p in pts.values() for s, _ in p})
    if len(steps) < 2:
        return None
    every_v = [v for p in pts.values() for _, v in p]
    vmax = max(every_v) or 1.0
    top_v = robust_top(every_v) or vmax
    clipped_axis = top_v < vmax
    ticks = nice_ticks(top_v * (1.08 if clipped_axis else 1.0))
    labels = tick_labels(ticks)
    left, right, top, bottom = _axis_left(labels, 62), 16, 22, 34
    height = 240
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    y_max = ticks[-1]
    sy = plot_h / y_max
    xs = {s: left + plot_w * i / (len(steps) - 1) for i, s in enumerate(steps)}
    base_y = top + plot_h

    def y_of(v: float) -> float:
        return base_y - min(v, y_max) * sy

    def pt(s: int, v: float) -> str:
        return f"{xs[s]:.1f},{y_of(v):.1f}"

    lines: list[dict[str, Any]] = []
    legend: list[dict[str, str]] = []
    band = None
    if len(pts) <= MAX_SERIES_COLOURED:
        for i, (rank, p) in enumerate(sorted(pts.items())):
            p.sort()
            cls = f"series c{i}"
            lines.append({"points": " ".join(pt(s, v) for s, v in p), "title": f"rank {rank}", "cls": cls})
            legend.append({"cls": f"sw-c{i}", "label": f"rank {rank}"})
    else:
        by_step: dict[int, list[float]] = {}
        for p in pts.values():
            for s, v in p:
                by_step.setdefault(s, []).append(v)
        lo = [pt(s, min(by_step[s])) for s in steps]
        hi = [pt(s, max(by_step[s])) for s in steps]
        band = {"points": " ".join(hi + lo[::-1]), "title": f"min to max over {len(pts)} ranks"}
        lines.append({"points": " ".join(pt(s, statistics.median(by_step[s])) for s in steps),
                      "title": f"median over {len(pts)} ranks", "cls": "series band-median"})
        legend = [{"cls": "sw-band", "label": f"min – max over {len(pts)} ranks"},
                  {"cls": "sw-median", "label": "median"}]
    marks = []
    above: dict[int, list[tuple[int, float]]] = {}
    for rank, p in sorted(pts.items()):
        for s, v in p:
            if (rank, s) in outliers:
                marks.append({"x": round(xs[s], 1), "y": round(y_of(v), 1),
                              "title": f"rank {rank}, step {s}: {fmt_us(v)} (slow step)"})
            if v > y_max:
                above.setdefault(s, []).append((rank, v))
    clipped = []  # one mark per step: its largest value above the axis
    for s, rv in sorted(above.items()):
        vmax_s = max(v for _, v in rv)
        who = f"rank {rv[0][0]}" if len(rv) == 1 else f"{len(rv)} ranks"
        clipped.append({"x": round(xs[s], 1), "y": top, "step": s, "ranks": len(rv), "us": vmax_s,
                        "label": fmt_us(vmax_s) + ("" if len(rv) == 1 else f" ({len(rv)} ranks)"),
                        "title": f"step {s}, {who}: up to {fmt_us(vmax_s)}, above the axis (clipped)"})
    every = max(1, math.ceil(len(steps) * 36 / plot_w))
    return {"width": WIDTH, "height": height, "left": left, "top": top, "plot_w": plot_w, "base_y": base_y,
            "lines": lines, "band": band, "legend": legend, "marks": marks, "clipped": clipped,
            "ranks": len(pts), "basis": basis, "coloured": len(pts) <= MAX_SERIES_COLOURED,
            "xticks": [{"x": round(xs[s], 1), "label": str(s)} for i, s in enumerate(steps)
                       if i % every == 0 or i == len(steps) - 1],
            "yticks": [{"y": round(base_y - t * sy, 2), "label": lab} for t, lab in zip(ticks, labels, strict=True)]}


def kind_class(kind: Any) -> str:
    """CSS class of a critical-path kind (unknown kinds are 'other')."""
    return "k-" + (kind if kind in KINDS else "other")


def cp_ops(cp: Mapping[str, Any], top_n: int = 15) -> dict[str, Any] | None:
    """Critical-path operators as horizontal bars, longest first."""
    ops = list(cp.get("ops") or [])[:top_n]
    length = float(cp.get("length_us") or 0.0)
    if not ops or length <= 0:
        return None
    left, right, row_h, top = 330, 150, 20, 4
    plot_w = WIDTH - left - right
    vmax = max(float(o.get("total_us") or 0.0) for o in ops) or 1.0
    rows = []
    for i, o in enumerate(ops):
        t = float(o.get("total_us") or 0.0)
        name = str(o.get("name", ""))
        rows.append({"y": top + i * row_h, "w": round(max(1.0, plot_w * t / vmax), 2), "cls": kind_class(o.get("kind")),
                     "label": truncate(name, 46), "name": name,
                     "value": f"{fmt_us(t)} · {fmt_ratio(t / length)}",
                     "title": f"{name}\n{o.get('kind')}: {fmt_us(t)} on the path ({fmt_ratio(t / length)}), "
                              f"{o.get('count', '?')} segment(s)"})
    return {"width": WIDTH, "height": top * 2 + row_h * len(rows), "left": left, "row_h": row_h, "rows": rows,
            "more": max(0, int(cp.get("ops_total") or len(cp.get("ops") or [])) - len(rows))}


def _expand(segs: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Segments with one kind each: a merged run of the report (``by_kind_us``) becomes one piece
    per kind at the run's start, named by its longest operators of that kind."""
    out: list[dict[str, Any]] = []
    for s in segs:
        by_kind = s.get("by_kind_us")
        if not isinstance(by_kind, Mapping) or not by_kind:
            out.append({**s, "n": int(s.get("merged") or 1)})
            continue
        top = [t for t in (s.get("top") or []) if isinstance(t, Mapping)]
        for kind, us in by_kind.items():
            names = {str(t.get("name", "")): float(t.get("us") or 0.0) for t in top if t.get("kind") == kind}
            out.append({"start_us": s.get("start_us"), "dur_us": us, "kind": kind, "n": 0,  # 0: count unknown
                        "names": names or {f"{KIND_LABEL.get(str(kind), str(kind))} (merged)": float(us)}})
    return out


def cp_timeline(cp: Mapping[str, Any]) -> dict[str, Any] | None:
    """The critical path of one step as a timeline, one lane per kind; sub-pixel segments merged."""
    segs = _expand(list(cp.get("segments") or []))
    length = float(cp.get("length_us") or 0.0)
    if not segs or length <= 0:
        return None
    left, right, lane_h, top, bottom = 110, 34, 22, 6, 28
    plot_w = WIDTH - left - right
    sx = plot_w / length
    px_us = 1.0 / sx  # one pixel in µs
    present = [k for k in KINDS if any((s.get("kind") if s.get("kind") in KINDS else "other") == k for s in segs)]
    lane_of = {k: i for i, k in enumerate(present)}
    rects: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for s in sorted(segs, key=lambda s: float(s.get("start_us") or 0.0)):
        kind = str(s.get("kind")) if s.get("kind") in KINDS else "other"
        a = float(s.get("start_us") or 0.0)
        d = float(s.get("dur_us") or 0.0)
        names = s.get("names") or {str(s.get("name", "")): d}
        cur = open_.get(kind)
        if cur is not None and a - cur["end"] < px_us and (d < px_us or cur["end"] - cur["start"] < px_us):
            cur["end"] = max(cur["end"], a + d)
            cur["n"] += s["n"]
            cur["approx"] = cur["approx"] or not s["n"]
            for nm, v in names.items():
                cur["names"][nm] = cur["names"].get(nm, 0.0) + v
            continue
        cur = {"kind": kind, "start": a, "end": a + d, "n": s["n"], "approx": not s["n"], "names": dict(names)}
        open_[kind] = cur
        rects.append(cur)
    out = []
    for r in rects:
        top_names = sorted(r["names"].items(), key=lambda kv: -kv[1])[:3]
        dur = r["end"] - r["start"]
        if r["n"] == 1 and not r["approx"]:
            title = f"{top_names[0][0]}\n{KIND_LABEL[r['kind']]}: {fmt_us(dur)} at +{fmt_us(r['start'])}"
        else:
            count = "merged segments" if r["approx"] else f"{r['n']} segments"
            title = (f"{count} in {fmt_us(dur)} at +{fmt_us(r['start'])}\n"
                     + "\n".join(f"{truncate(n, 80)}: {fmt_us(v)}" for n, v in top_names))
        out.append({"x": round(left + r["start"] * sx, 2), "w": round(max(0.5, dur * sx), 2),
                    "y": top + lane_of[r["kind"]] * lane_h + 2, "cls": kind_class(r["kind"]), "title": title})
    ticks = nice_ticks(length, 6)
    base_y = top + lane_h * len(present)
    return {"width": WIDTH, "height": base_y + bottom, "left": left, "lane_h": lane_h, "rects": out,
            "lanes": [{"y": top + i * lane_h, "label": KIND_LABEL[k], "cls": kind_class(k)} for i, k in enumerate(present)],
            "base_y": base_y, "segments": int(cp.get("segments_total") or len(cp.get("segments") or [])),
            "xticks": [{"x": round(left + t * sx, 2), "label": lab}
                       for t, lab in zip(ticks, tick_labels(ticks), strict=True) if t <= length * 1.001]}


# Key names a roofline finding may carry (evidence / top rows); see docs in html.py.
ROOF_PEAK_KEYS = ("peak_tflops",)
ROOF_BW_KEYS = ("peak_bandwidth_tbps", "peak_bandwidth_gbps", "peak_bw_gbps", "peak_gbps")
ROOF_INTENSITY_KEYS = ("intensity_flop_per_byte", "intensity")  # CMP001's top rows: the first
ROOF_THRESHOLD_KEYS = ("utilization_threshold", "compute_bound_ratio", "memory_bound_ratio", "min_compute_ratio",
                       "min_bandwidth_ratio")


def roofline(findings: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Operators by arithmetic intensity (FLOP/byte) and achieved TFLOP/s, log-log, with roofs if known.

    One roof per distinct (peak TFLOP/s, bandwidth) of the findings (CMP001 gives one per dtype:
    an fp16 and an fp32 operator have different roofs), labelled with its ``peak_dtype``; the
    threshold roofs (``utilization_threshold`` x roof) and the ridge line for the highest roof."""
    pts: list[dict[str, Any]] = []
    roof_specs: dict[tuple[float, float], str] = {}
    thresholds: list[tuple[str, float]] = []
    for f in findings:
        ev = f.get("evidence") or {}
        peak = next((float(ev[k]) for k in ROOF_PEAK_KEYS if _positive(ev.get(k))), None)
        bw = next((float(ev[k]) / (1000.0 if k.endswith("gbps") else 1.0) for k in ROOF_BW_KEYS if _positive(ev.get(k))),
                  None)
        if peak and bw:
            roof_specs.setdefault((peak, bw), str(ev.get("peak_dtype") or ""))
        for k in ROOF_THRESHOLD_KEYS:
            if isinstance(ev.get(k), (int, float)) and 0 < ev[k] < 1 and (k, float(ev[k])) not in thresholds:
                thresholds.append((k, float(ev[k])))
        for row in f.get("top") or []:
            i = next((row[k] for k in ROOF_INTENSITY_KEYS if row.get(k) is not None), None)
            a = row.get("achieved_tflops")
            if isinstance(i, (int, float)) and isinstance(a, (int, float)) and i > 0 and a > 0:
                name = str(row.get("name") or row.get("op") or "")
                dtype = row.get("dtype")
                pts.append({"i": float(i), "a": float(a), "name": name, "rule": f.get("rule"),
                            "dtype": str(dtype) if isinstance(dtype, str) else "",
                            "sev": f.get("severity") if f.get("severity") in ("critical", "high", "medium", "low", "info") else "info"})
    if not pts:
        return None
    specs = sorted(roof_specs.items(), key=lambda kv: -kv[0][0])[:4]
    xs = [p["i"] for p in pts] + [pk / bw for (pk, bw), _ in specs]
    ys = [p["a"] for p in pts] + [pk for (pk, _), _ in specs]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    lx0, lx1 = math.floor(math.log10(x_lo)), math.ceil(math.log10(x_hi)) + (1 if x_hi == x_lo else 0)
    ly0, ly1 = math.floor(math.log10(y_lo)), math.ceil(math.log10(y_hi * 1.2))
    if ly1 == ly0:
        ly1 += 1
    left, right, top, bottom, height = 70, 20, 14, 40, 320
    plot_w, plot_h = WIDTH - left - right, height - top - bottom

    def X(v: float) -> float:
        return round(left + plot_w * (math.log10(v) - lx0) / (lx1 - lx0), 2)

    def Y(v: float) -> float:
        return round(top + plot_h * (1 - (math.log10(v) - ly0) / (ly1 - ly0)), 2)

    def clampy(v: float) -> float:
        return cast(float, min(max(v, 10**ly0), 10**ly1))  # int ** int is typed Any

    def roof_line(pk: float, bw: float) -> str:
        y0 = clampy(bw * 10**lx0)
        return f"{X(y0 / bw)},{Y(y0)} {X(pk / bw)},{Y(pk)} {X(10**lx1)},{Y(pk)}"

    roofs = []
    labels = []
    for n, ((pk, bw), dtype) in enumerate(specs):
        name = f"{dtype} roof" if dtype else "roof"
        roofs.append({"points": roof_line(pk, bw), "cls": "roof",
                      "title": f"{name}: {pk:g} TFLOP/s peak, {bw:g} TB/s, ridge {pk / bw:,.4g} FLOP/B"})
        labels.append({"x": X(10**lx1) - 4, "y": round(Y(pk) - 4, 2), "label": f"{dtype + ' ' if dtype else ''}{pk:g} TFLOP/s"})
        if n == 0:
            for key, t in thresholds[:2]:
                roofs.append({"points": roof_line(pk * t, bw * t), "cls": "roof-threshold", "title": f"{key} = {t:g} × {name}"})
    ridge = specs[0][0][0] / specs[0][0][1] if specs else None
    dots = [{"x": X(p["i"]), "y": Y(p["a"]), "cls": "sev-" + p["sev"],
             "title": f"{p['name']}{' (' + p['dtype'] + ')' if p['dtype'] else ''}\n{p['rule']}: intensity "
                      f"{p['i']:,.4g} FLOP/B, {p['a']:,.4g} TFLOP/s"} for p in pts[:400]]
    return {"width": WIDTH, "height": height, "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h,
            "dots": dots, "roofs": roofs, "roof_labels": labels,
            "ridge": {"x": X(ridge), "label": f"ridge {ridge:,.4g} FLOP/B"} if ridge else None,
            "xticks": [{"x": X(10**e), "label": f"{10**e:g}"} for e in range(lx0, lx1 + 1)],
            "yticks": [{"y": Y(10**e), "label": f"{10**e:g}"} for e in range(ly0, ly1 + 1)]}


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


COMM_VALUE_KEYS = (("bandwidth_gbps", "GB/s", True), ("time_us", "µs", False), ("bytes", "B", False))
COMM_METRIC_LABEL = {"bandwidth_gbps": "bandwidth", "time_us": "transit time", "bytes": "bytes moved"}
#: Links that move fewer bytes over the profile are latency-bound and show no bandwidth (CLU002's
#: min_link_bytes): drawn grey, outside the colour scale, when the metric is bandwidth.
COMM_MIN_BW_BYTES = 1 << 20


def comm_matrix(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """Heat map of the report's ``comm_matrix``: rows ``{src, dst, bandwidth_gbps | time_us | bytes}``
    (optionally ``transport``); None when there is no link to draw."""
    data = report.get("comm_matrix")
    rows = data.get("links") if isinstance(data, Mapping) else data
    if not isinstance(rows, list) or not rows:
        return None
    key = unit = None
    higher_is_better = True
    for k, u, hib in COMM_VALUE_KEYS:
        if any(isinstance(r, Mapping) and isinstance(r.get(k), (int, float)) for r in rows):
            key, unit, higher_is_better = k, u, hib
            break
    if key is None:
        return None
    cells: dict[tuple[int, int], tuple[float, Mapping[str, Any]]] = {}
    for r in rows:
        try:
            s, d, v = int(r["src"]), int(r["dst"]), float(r[key])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(v):
            cells[(s, d)] = (v, r)
    if not cells:
        return None
    ranks = sorted({a for a, _ in cells} | {b for _, b in cells})[:256]
    idx = {r: i for i, r in enumerate(ranks)}
    n = len(ranks)
    cell = max(2.0, min(28.0, 640.0 / n))
    left, top = 56, 40

    def small(r: Mapping[str, Any]) -> bool:
        b = r.get("bytes")
        return key == "bandwidth_gbps" and isinstance(b, (int, float)) and b < COMM_MIN_BW_BYTES

    vals = [v for v, r in cells.values() if not small(r)] or [v for v, _ in cells.values()]
    lo, hi = min(vals), max(vals)
    out = []
    n_small = 0
    for (s, d), (v, r) in sorted(cells.items()):
        if s not in idx or d not in idx:
            continue
        parts = [f"rank {s} → rank {d}: {_comm_value(key, v)}"]
        if key != "bytes" and isinstance(r.get("bytes"), (int, float)):
            parts.append(fmt_bytes(float(r["bytes"])))
        if key != "time_us" and isinstance(r.get("time_us"), (int, float)):
            parts.append(f"{fmt_us(float(r['time_us']))} transit")
        if r.get("transport"):
            parts.append(str(r["transport"]))
        if small(r):
            n_small += 1
            fill = "#c9ccd1"
            parts.append("too few bytes to show bandwidth (latency-bound)")
        else:
            t = 0.5 if hi == lo else (v - lo) / (hi - lo)
            fill = _heat(1 - t if higher_is_better else t)
        out.append({"x": round(left + idx[d] * cell, 2), "y": round(top + idx[s] * cell, 2), "fill": fill,
                    "title": ", ".join(parts)})
    every = max(1, math.ceil(12.0 / cell))
    labels = [{"rank": r, "pos": round(i * cell + cell / 2, 2)} for i, r in enumerate(ranks) if i % every == 0]
    return {"width": int(left + n * cell + 20), "height": int(top + n * cell + 20), "left": left, "top": top,
            "cell": round(cell, 2), "cells": out, "labels": labels, "metric": key, "unit": unit,
            "metric_label": f"{COMM_METRIC_LABEL[key]} ({unit})", "small": n_small,
            "lo": _comm_value(key, lo), "hi": _comm_value(key, hi), "higher_is_better": higher_is_better}


def _comm_value(key: str, v: float) -> str:
    if key == "bytes":
        return fmt_bytes(v)
    if key == "time_us":
        return fmt_us(v)
    return f"{v:.3g} GB/s"


def _heat(bad: float) -> str:
    """Green (good) to red (bad) through yellow, as a hex colour."""
    bad = min(1.0, max(0.0, bad))
    stops = ((0.0, (26, 152, 80)), (0.5, (254, 224, 139)), (1.0, (215, 48, 39)))
    for (t0, c0), (t1, c1) in itertools.pairwise(stops):
        if bad <= t1:
            f = (bad - t0) / (t1 - t0)
            rgb = tuple(round(a + (b - a) * f) for a, b in zip(c0, c1))
            return "#{:02x}{:02x}{:02x}".format(*rgb)
    return "#d73027"  # pragma: no cover
