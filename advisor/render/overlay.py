"""Report -> a Chrome-trace overlay (``{"traceEvents": [...]}``) of the critical path and the findings.

Times are in the input trace's own ``ts`` (µs) where the report gives the focused step window's
start there (``critical_path.trace_start_us``, Kineto profiles): loaded beside the input trace
(Perfetto / ``chrome://tracing``), the overlay's spans line up with the events they name. One
process, "advisor", holds four tracks: the focused step window, every step of the focused rank,
the critical path's segments and the findings. Without ``trace_start_us`` times count from the
focused window's start (0) and ``otherData.time_base`` says so.

A pure function of the report dict; every string is made printable first (:func:`display_data`)
and JSON-encoded, so a profile's names reach the viewer as plain strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from advisor.model import Report
from advisor.render.view import display_data

#: the overlay's process id: far above the pids of real processes, and the device ids Kineto uses
ADVISOR_PID = 999_999_999
TID_WINDOW, TID_STEPS, TID_PATH, TID_FINDINGS = 1, 2, 3, 4
#: spans drawn per finding at most (one per step window it names)
MAX_SPANS_PER_FINDING = 64


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def overlay_events(report: Report | Mapping[str, Any]) -> dict[str, Any]:
    """The overlay as a Chrome-trace JSON object."""
    data = display_data(report)
    cp = data.get("critical_path") or {}
    rank, step = cp.get("rank"), cp.get("step")
    base = _num(cp.get("trace_start_us"))
    absolute = base is not None
    t0 = base if base is not None else 0.0
    length = _num(cp.get("length_us")) or 0.0
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": ADVISOR_PID, "tid": 0, "name": "process_name", "args": {"name": "advisor"}},
        {"ph": "M", "pid": ADVISOR_PID, "tid": 0, "name": "process_sort_index", "args": {"sort_index": -1}},
    ]
    for tid, label in ((TID_WINDOW, "focused step"), (TID_STEPS, f"steps of rank {rank}"),
                       (TID_PATH, "critical path"), (TID_FINDINGS, "findings")):
        ev.append({"ph": "M", "pid": ADVISOR_PID, "tid": tid, "name": "thread_name", "args": {"name": label}})
        ev.append({"ph": "M", "pid": ADVISOR_PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})

    def span(tid: int, name: str, ts: float, dur: float, args: dict[str, Any], cat: str) -> None:
        ev.append({"ph": "X", "pid": ADVISOR_PID, "tid": tid, "name": name, "cat": cat,
                   "ts": round(ts, 3), "dur": round(max(dur, 0.0), 3), "args": args})

    if rank is not None and step is not None and length > 0:
        span(TID_WINDOW, f"rank {rank} step {step}", t0, length,
             {"rank": rank, "step": step, "length_us": length}, "advisor.window")
    steps: dict[int, tuple[float, float]] = {}
    for s in cp.get("trace_steps") or []:
        a, b = _num(s.get("start_us")), _num(s.get("end_us"))
        if a is None or b is None or not isinstance(s.get("step"), int):
            continue
        steps[s["step"]] = (a, b)
        span(TID_STEPS, f"step {s['step']}", a, b - a, {"rank": rank, "step": s["step"]}, "advisor.step")
    for seg in cp.get("segments") or []:
        a, d = _num(seg.get("start_us")), _num(seg.get("dur_us"))
        if a is None or d is None:
            continue
        args: dict[str, Any] = {"op": seg.get("name"), "kind": seg.get("kind"),
                                "share": round(d / length, 6) if length > 0 else None}
        for k in ("pid", "tid", "merged", "by_kind_us", "top"):
            if k in seg:
                args[k] = seg[k]
        span(TID_PATH, f"{seg.get('kind')}: {seg.get('name')}", t0 + a, d, args, "advisor.critical_path")
    for f in data.get("findings") or []:
        name = f"{f.get('rule')}: {f.get('title')}"
        args = {"rule": f.get("rule"), "severity": f.get("severity"), "bottleneck": f.get("bottleneck"),
                "ranks": f.get("ranks"), "steps": f.get("steps"), "evidence": f.get("evidence") or {},
                "drawn_on": f"step windows of rank {rank}"}
        named = [steps[s] for s in (f.get("steps") or []) if isinstance(s, int) and s in steps]
        if named:
            for a, b in named[:MAX_SPANS_PER_FINDING]:
                span(TID_FINDINGS, name, a, b - a, args, "advisor.finding")
        else:  # no step window of the focused rank: an instant at the focused window's start
            ev.append({"ph": "i", "s": "t", "pid": ADVISOR_PID, "tid": TID_FINDINGS, "name": name,
                       "cat": "advisor.finding", "ts": round(t0, 3), "args": args})
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "advisor": "critical path and findings overlay",
            "time_base": "input trace ts (us)" if absolute
            else "us from the focused step window's start (the report gives no trace time base)",
        },
    }


def render(report: Report | Mapping[str, Any]) -> str:
    """The overlay as JSON text."""
    return json.dumps(overlay_events(report), ensure_ascii=False, allow_nan=False) + "\n"
