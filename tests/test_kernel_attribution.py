"""Which host operator launched each Kineto kernel (``kernel_ops``, :func:`enclosing_intervals`).

Hand-worked cases, and the real samples checked against an independent call-stack sweep of the
raw trace files (plain ``json``, one Python stack per thread), not against the code's output.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import pytest

from advisor.analyze import build_context
from advisor.engine.derived import IntervalIndex, enclosing_intervals
from advisor.testing import context_from_tables
from rules.compute import _common  # noqa: F401  (registers kernel_ops)


def _enc(ops: list[tuple[int, int, int]], points: list[tuple[int, int]]) -> list[int]:
    a = np.array(ops, dtype=np.int64).reshape(-1, 3)
    p = np.array(points, dtype=np.int64).reshape(-1, 2)
    return enclosing_intervals(a[:, 0], a[:, 1], a[:, 2], p[:, 0], p[:, 1]).tolist()


def test_innermost_open_interval() -> None:
    ops = [
        (1, 0, 100),   # 0: linear
        (1, 10, 80),   # 1: addmm inside linear
        (1, 20, 30),   # 2: empty inside addmm (ends before the launch at 40)
        (1, 100, 150),  # 3: starts where linear ends: a sibling, not a child
        (1, 100, 120),  # 4: same start, shorter: inside 3
        (2, 0, 1000),  # 5: another thread
        (1, 200, 200),  # 6: zero length: holds nothing
    ]
    points = [(1, 40), (1, 25), (1, 100), (1, 130), (1, 5), (1, 99), (1, 80), (1, 200), (2, 500), (3, 10), (1, 300)]
    assert _enc(ops, points) == [1, 2, 4, 3, 0, 0, 0, -1, 5, -1, -1]


@pytest.mark.parametrize("seed", range(8))
def test_disjoint_and_nested_intervals_against_brute_force(seed: int) -> None:
    """Random disjoint (top-level operators: the fast path) and nested call stacks, with touching
    intervals and points on their bounds: the interval found is the innermost one holding the
    point (the latest started among those holding it), checked pair by pair. (No zero-length
    intervals: the callers leave them out.)"""
    rng = np.random.default_rng(seed)
    ops: list[tuple[int, int, int]] = []
    for th in range(3):
        t = 0
        for _ in range(40):
            t += int(rng.integers(0, 3)) * 5  # touching or apart
            length = int(rng.integers(1, 6)) * 5
            ops.append((th, t, t + length))
            if seed % 2 and length >= 10:  # two children side by side, a grandchild in the first
                half = length // 10 * 5
                ops += [(th, t, t + half), (th, t + half, t + length), (th, t, t + 5)]
            t += length
    order = rng.permutation(len(ops))
    ops = [ops[i] for i in order]
    points = [(int(rng.integers(0, 4)), int(rng.integers(0, 60)) * 5) for _ in range(500)]
    got = _enc(ops, points)
    for (pth, pt), idx in zip(points, got, strict=True):
        holding = [i for i, (th, s, e) in enumerate(ops) if th == pth and s <= pt < e]
        if not holding:
            assert idx == -1, (pth, pt)
        else:
            assert idx >= 0, (pth, pt)  # the innermost: latest start, then the shortest
            best = max(holding, key=lambda i: (ops[i][1], -ops[i][2]))
            assert ops[idx][1:] == ops[best][1:], (pth, pt)


@pytest.mark.parametrize("far", [False, True])
def test_index_looks_points_up_in_batches_and_calls(far: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One :class:`IntervalIndex`, its points looked up in small batches over several calls (and
    times too far apart to pack with the thread in an int64): each point gets the innermost
    interval of its thread holding it, checked by brute force."""
    monkeypatch.setattr(IntervalIndex, "BATCH", 7)
    rng = np.random.default_rng(3)
    unit = 1 << 55 if far else 5
    ops: list[tuple[int, int, int]] = []
    for th in (2, 3, 5):
        t = 0
        for _ in range(30):
            t += int(rng.integers(0, 3))
            length = int(rng.integers(2, 6))
            ops += [(th, t * unit, (t + length) * unit), (th, t * unit, (t + 1) * unit)]  # a child at its start
            t += length
    a = np.array(ops, dtype=np.int64)
    index = IntervalIndex(a[:, 0], a[:, 1], a[:, 2])
    points = [(int(rng.integers(1, 7)), (int(rng.integers(-2, 130)) * unit) // 2) for _ in range(300)]
    got: list[int] = []
    for part in (points[:100], points[100:101], points[101:]):
        p = np.array(part, dtype=np.int64)
        got += index.find(p[:, 0], p[:, 1]).tolist()
    for (pth, pt), idx in zip(points, got, strict=True):
        holding = [i for i, (th, s, e) in enumerate(ops) if th == pth and s <= pt < e]
        want = max(holding, key=lambda i: (ops[i][1], -ops[i][2])) if holding else -1
        assert idx == want, (pth, pt)


def test_input_order_does_not_matter_and_overlaps_are_not_guessed() -> None:
    ops = [(1, 10, 80), (1, 0, 100), (1, 20, 30)]  # unsorted
    assert _enc(ops, [(1, 40), (1, 25)]) == [0, 2]
    # 0 and 1 overlap without nesting: at 45 both are open (innermost: the later start); at 60 only
    # 1 is, but by depth it is a child of 0, which no longer holds the point: none is reported
    assert _enc([(1, 0, 50), (1, 40, 70)], [(1, 60), (1, 45)]) == [-1, 1]
    # times far apart (no packing into one integer): the same answers
    far = [(1, 0, 100), (1, 10, 80), (7, 2**62, 2**62 + 10)]
    assert _enc(far, [(1, 40), (7, 2**62 + 5)]) == [1, 2]
    assert _enc([], [(1, 5)]) == [-1]


def test_kernel_ops_names_top_level_flops_and_conversion_operators() -> None:
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1", "step": 1}
    ev = [
        {**host, "kind": "host_op", "name": "aten::linear", "start_ns": 0, "dur_ns": 100},
        {**host, "kind": "host_op", "name": "aten::addmm", "start_ns": 10, "dur_ns": 80, "flops": 1e9, "shapes": "[[4]]"},
        {**host, "kind": "host_op", "name": "aten::to", "start_ns": 200, "dur_ns": 50, "shapes": "[[4]]"},
        {**host, "kind": "host_op", "name": "aten::copy_", "start_ns": 210, "dur_ns": 30},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 40, "dur_ns": 5, "corr": 1},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 220, "dur_ns": 5, "corr": 2},
        {**host, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 300, "dur_ns": 5, "corr": 3},
    ]
    dev = {"rank": 0, "device": True, "pid": "0", "tid": "7", "kind": "kernel", "step": 1}
    ev += [{**dev, "name": f"k{c}", "start_ns": 1000 * c, "dur_ns": 10, "corr": c} for c in (1, 2, 3)]
    ctx = context_from_tables({"events": ev}, run_stages=False)
    ctx.ensure_derived(("kernel_ops",))
    got = ctx.query("SELECT k.corr, t.name AS top, k.top_start_ns, k.top_dur_ns, k.fop_name, k.fop_flops, "
                    "k.fop_start_ns, k.fop_dur_ns, k.conv_name, k.conv_shapes, k.launch_ns, k.start_ns "
                    "FROM kernel_ops k LEFT JOIN events t ON t.rowid = k.top_oid ORDER BY corr")
    assert [tuple(r.values()) for r in got] == [
        (1, "aten::linear", 0, 100, "aten::addmm", 1e9, 10, 80, None, None, 40, 1000),
        (2, "aten::to", 200, 50, None, None, None, None, "aten::to", "[[4]]", 220, 2000),
        (3, None, None, None, None, None, None, None, None, None, 300, 3000),  # outside any operator
    ]


# --------------------------------------------------------------------------- real samples
def _load(path: Path) -> list[dict]:
    with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as fh:
        raw = fh.read()
    data = json.loads(raw, parse_float=Decimal)  # exact: absolute µs times do not fit a double
    return data["traceEvents"] if isinstance(data, dict) else data


def _ns(x: object) -> int:
    return int((Decimal(str(x)) * 1000).to_integral_value(ROUND_HALF_EVEN))


# communication calls and NCCL kernels are the schema's 'comm' kind, step markers its 'step' kind:
# not operators / compute kernels
_NOT_OP = re.compile(r"nccl:|gloo:|c10d|record_param_comms|ProfilerStep#")


def _stack_sweep(events: list[dict]) -> dict[int, tuple]:
    """corr -> (outermost op, its start relative to the launch, innermost op with FLOPs), by
    walking each thread's operators with an explicit stack."""
    ops: dict[tuple, list] = defaultdict(list)
    launch: dict[int, tuple] = {}
    kernels: dict[int, str] = {}
    for e in events:
        if e.get("ph") != "X" or "ts" not in e or "dur" not in e:
            continue
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        if cat in ("cpu_op", "operator") and _ns(e["dur"]) > 0 and not _NOT_OP.match(e["name"]):
            ops[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["name"],
                                              float(args.get("flops") or 0) > 0))
        elif cat in ("cuda_runtime", "runtime") and "correlation" in args:
            launch[int(args["correlation"])] = ((e["pid"], e["tid"]), _ns(e["ts"]))
        elif cat == "kernel" and "correlation" in args and "nccl" not in e["name"].lower():
            kernels[int(args["correlation"])] = e["name"]
    by_thread: dict[tuple, list] = defaultdict(list)
    for corr, (th, t) in launch.items():
        if corr in kernels:
            by_thread[th].append((t, corr))
    out = {}
    for th, pts in by_thread.items():
        todo = sorted(ops.get(th, []), key=lambda o: (o[0], -o[1]))
        stack: list[tuple] = []
        i = 0
        for t, corr in sorted(pts):
            while i < len(todo) and todo[i][0] <= t:
                while stack and stack[-1][1] <= todo[i][0]:
                    stack.pop()
                stack.append(todo[i])
                i += 1
            while stack and stack[-1][1] <= t:
                stack.pop()
            if stack:
                fop = next((o[2] for o in reversed(stack) if o[3]), None)
                out[corr] = (stack[0][2], t - stack[0][0], fop)
            else:
                out[corr] = (None, None, None)
    return out


@pytest.mark.parametrize("name", ["kineto_two_ranks", pytest.param("kineto_resnet50_num_workers_0", marks=pytest.mark.slow)])
def test_kernel_ops_match_an_independent_stack_sweep(samples: Path, name: str) -> None:
    ctx = build_context(samples / name)
    files = {int(r["rank"]): Path(r["path"]) for r in ctx.query("SELECT rank, path FROM profile_files")}
    ctx.ensure_derived(("kernel_ops",))
    got = ctx.query("SELECT k.rank, k.corr, t.name AS top_name, k.launch_ns - k.top_start_ns AS rel, k.fop_name "
                    "FROM kernel_ops k LEFT JOIN events t ON t.rowid = k.top_oid")
    assert got
    attributed = 0
    for rank, path in files.items():
        want = _stack_sweep(_load(path))
        mine = {int(r["corr"]): (r["top_name"], r["rel"], r["fop_name"])
                for r in got if r["rank"] == rank}
        assert mine == want
        attributed += sum(1 for v in want.values() if v[0] is not None)
    assert attributed > 0.9 * len(got)  # nearly every kernel has its operator


def test_rules_say_when_kernel_time_cannot_be_tied_to_operators() -> None:
    from advisor.analyze import analyze_context
    from advisor.config import Config
    from tests.rules.fixtures_compute import kineto_gpu_casts

    def notes(tables: dict) -> list[str]:
        report = analyze_context(context_from_tables(tables), Config(select=["CMP003", "CMP004"]))
        return [w.message for w in report.warnings if "is tied to the host operator" in w.message]

    tables = kineto_gpu_casts()
    assert notes(tables) == []  # every kernel's launch sits inside its operator
    tables["events"] = [e for e in tables["events"] if e["kind"] != "runtime"]  # no launches recorded
    got = notes(tables)
    # one warning for both rules that read the operator times
    assert len(got) == 1 and got[0].startswith("CMP003 (compute.affinity-api), CMP004 (compute.format-conversion): ")
    assert "rank(s) 0 " in got[0] and "only 0%" in got[0], got
