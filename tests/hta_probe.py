"""HTA's side of the cross-check (tests/test_hta_crosscheck.py), run by the python of the HTA
environment (tests/hta_env.py), never imported by the tests: it needs HTA 0.5.0 and its pandas 2.x,
and imports nothing of advisor.

    python tests/hta_probe.py gpu DIR             # GPU events per rank, temporal breakdown, overlap, idle time
    python tests/hta_probe.py steps DIR           # CPU-only traces: GPU event count, iterations, step markers
    python tests/hta_probe.py critical_path DIR   # rank 0's critical path (names and edge types on it)

prints one JSON document on stdout. Times are HTA's, converted back to absolute ns where the
document says ``_ns`` (HTA keeps µs relative to ``min_ts`` and to ``baseTimeNanoseconds``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import warnings
from typing import Any


def _load(trace_dir: str) -> Any:
    """``TraceAnalysis(trace_dir=...)`` without its multiprocessing pool (same parser, same
    filtering: the GPU events launched before the last ``ProfilerStep``)."""
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis.__new__(TraceAnalysis)
    ta.t = Trace(trace_dir=trace_dir)
    ta.t.load_traces(include_last_profiler_step=False, use_multiprocessing=False)
    assert ta.t.is_parsed
    return ta


def _base_ns(t: Any, rank: int) -> int:
    return int(t.meta_data.get(rank, {}).get("baseTimeNanoseconds", 0) or 0)


def _num(x: Any) -> float | None:
    return None if x is None or math.isnan(float(x)) else float(x)  # NaN (0/0 without communication) -> null


def gpu(trace_dir: str) -> dict[str, Any]:
    from hta.utils.utils import get_kernel_type

    ta = _load(trace_dir)
    t = ta.t
    sym = t.symbol_table.get_sym_table()
    ranks: dict[str, Any] = {}
    for rank, df in t.traces.items():
        base = _base_ns(t, rank)
        g = df[df["stream"].ne(-1)]
        names = [sym[i] for i in g["name"]]
        ranks[str(int(rank))] = {
            "start_ns": [(int(ts) + int(t.min_ts)) * 1000 + base for ts in g["ts"]],
            "dur_ns": [int(d) * 1000 for d in g["dur"]],
            "stream": [int(s) for s in g["stream"]],
            "name": names,
            "type": [str(get_kernel_type(n)) for n in names],
        }
    temporal = ta.get_temporal_breakdown(visualize=False)
    overlap = ta.get_comm_comp_overlap(visualize=False)
    idle, _ = ta.get_idle_time_breakdown(ranks=sorted(t.traces), visualize=False)
    per_stream = idle.groupby(["rank", "stream"])["idle_time"].sum()
    return {
        "ranks": ranks,
        "temporal": [{k: (int(v) if k == "rank" else _num(v)) for k, v in row.items()}
                     for row in temporal.to_dict("records")],
        "overlap": {str(int(r)): _num(p) for r, p in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"], strict=True)},
        "idle_per_stream": [[int(r), int(s), float(v)] for (r, s), v in per_stream.items()],
    }


def steps(trace_dir: str) -> dict[str, Any]:
    ta = _load(trace_dir)
    t = ta.t
    sym = t.symbol_table.get_sym_table()
    try:
        ta.get_temporal_breakdown(visualize=False)
        raised = None
    except (IndexError, KeyError, ValueError) as exc:  # undefined without GPU events (its window is the GPU span)
        raised = type(exc).__name__
    ranks: dict[str, Any] = {}
    for rank, df in t.traces.items():
        base = _base_ns(t, rank)
        marks = []
        for ts, dur, name in zip(df["ts"], df["dur"], df["name"], strict=True):
            m = re.fullmatch(r"ProfilerStep#(\d+)", sym[name])
            if m:
                b = (int(ts) + int(t.min_ts)) * 1000 + base
                marks.append([int(m.group(1)), b, b + int(dur) * 1000])
        ranks[str(int(rank))] = {
            "gpu_events": int(df["stream"].ne(-1).sum()),
            "iterations": sorted(int(i) for i in t.get_iterations(rank)),
            "marks": marks,
        }
    return {"temporal_breakdown_raised": raised, "ranks": ranks}


def critical_path(trace_dir: str) -> dict[str, Any]:
    graph, ok = _load(trace_dir).critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=None)
    on_path = graph.get_critical_path_breakdown()
    return {"ok": bool(ok), "s_names": sorted(set(on_path["s_name"].dropna())), "types": sorted(set(on_path["type"]))}


def main(argv: list[str]) -> int:
    modes = {"gpu": gpu, "steps": steps, "critical_path": critical_path}
    if len(argv) != 2 or argv[0] not in modes:
        print(f"usage: hta_probe.py {{{','.join(modes)}}} TRACE_DIR", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # HTA's own pandas idioms (downcasting, 0/0)
    logging.getLogger("hta").setLevel(logging.ERROR)
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever HTA prints must not mix with the JSON document
    try:
        result = modes[argv[0]](argv[1])
    finally:
        sys.stdout = out
    json.dump(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
