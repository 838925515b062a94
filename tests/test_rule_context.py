"""The rule-facing helpers of :class:`advisor.engine.rule.RuleContext` (step time, device presence,
breakdown, platform), on small canonical tables whose figures are worked out by hand."""

from __future__ import annotations

from typing import Any

import pandas as pd

from advisor.engine.registry import discover
from advisor.engine.rule import RuleContext
from advisor.testing import context_from_tables

MS = 1_000_000  # ns


def _ctx(events: list[dict[str, Any]]) -> RuleContext[Any]:
    spec = discover()["CPU001"]
    return RuleContext(spec, context_from_tables({"events": events}), spec.thresholds())


def _steps() -> list[dict[str, Any]]:
    # rank 0: steps of 1 ms and 2 ms; rank 1: one step of 4 ms
    return [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 1 * MS},
        {"rank": 0, "kind": "step", "name": "ProfilerStep#2", "start_ns": 1 * MS, "dur_ns": 2 * MS},
        {"rank": 1, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 4 * MS},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 10, "dur_ns": 50},
    ]


def test_step_times_from_the_breakdown() -> None:
    ctx = _ctx(_steps())
    assert ctx.has_breakdown
    assert ctx.step_us(0, 1) == 1000.0
    assert ctx.step_us(0, 2) == 2000.0
    assert ctx.step_us(0) == 1500.0  # median of 1000 and 2000
    assert ctx.step_us(1) == 4000.0
    assert ctx.step_us() == 2000.0  # median of 1000, 2000, 4000
    assert ctx.step_us(7) is None  # no such rank
    assert ctx.median_step_us([0, 1]) == 2000.0
    assert ctx.median_step_us([1]) == 4000.0
    assert ctx.median_step_us([5]) is None


def test_breakdown_selection() -> None:
    ctx = _ctx(_steps())
    assert sorted(ctx.breakdown()["rank"].tolist()) == [0, 0, 1]
    assert ctx.breakdown(rank=0)["step"].tolist() == [1, 2]
    assert ctx.breakdown(rank=0, step=2)["step_us"].tolist() == [2000.0]
    assert len(ctx.breakdown(step=1)) == 2


def test_without_a_breakdown_the_helpers_say_so() -> None:
    spec = discover()["CPU001"]
    ctx = RuleContext(spec, context_from_tables({"events": _steps()}, run_stages=False), spec.thresholds())
    assert not ctx.has_breakdown
    assert ctx.breakdown().empty and list(ctx.breakdown().columns) == ["rank", "step", "step_us"]
    assert ctx.step_us(0) is None
    assert ctx.median_step_us([0, 1]) is None


def test_device_presence_and_platform() -> None:
    cpu = _ctx(_steps())
    assert not cpu.has_device
    assert cpu.platform == "cpu"
    assert cpu.rows("events") == 4
    assert cpu.vendor_kernels == 0
    gpu = _ctx([*_steps(),
                {"rank": 0, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 20, "dur_ns": 5},
                {"rank": 0, "kind": "kernel", "name": "gemm", "device": True, "start_ns": 30, "dur_ns": 100}])
    assert gpu.has_device
    assert gpu.platform == "cuda"
    assert cpu.device_ranks == frozenset()
    assert gpu.device_ranks == frozenset({0})  # the kernel ran on rank 0 only


def test_scalar_binds_thresholds_and_params() -> None:
    ctx = _ctx(_steps())
    assert ctx.scalar("SELECT count(*) FROM events WHERE rank = $r", {"r": 0}) == 3
    assert ctx.scalar("SELECT count(*) FROM events WHERE rank = $r AND false", {"r": 0}) == 0
    assert ctx.scalar("SELECT 1 WHERE false") is None
    # the scalar's result is read to its end: the thread's cursor takes the next query, of any kind
    assert ctx.scalar("SELECT count(*) FROM events") == 4
    assert ctx.arrays("SELECT rank FROM events WHERE kind = 'step' ORDER BY rank")["rank"].tolist() == [0, 0, 1]


def test_query_frames_reads_a_dataframe_beside_the_tables() -> None:
    ctx = _ctx(_steps())
    frame = pd.DataFrame({"rank": [0, 1, 2]})
    rows = ctx.query_frames("SELECT f.rank, count(e.rank) AS n FROM _t f LEFT JOIN events e USING (rank) "
                            "GROUP BY f.rank ORDER BY f.rank", {"_t": frame})
    assert rows == [{"rank": 0, "n": 3}, {"rank": 1, "n": 1}, {"rank": 2, "n": 0}]
    # the frame is visible to that query only
    assert ctx.scalar("SELECT count(*) FROM duckdb_views() WHERE view_name = '_t'") == 0


def test_once_computes_a_shared_figure_once_per_analysis() -> None:
    ctx = _ctx(_steps())
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return 42

    assert ctx.once("k", compute) == 42
    other = RuleContext(discover()["CPU002"], ctx.analysis, discover()["CPU002"].thresholds())
    assert other.once("k", compute) == 42
    assert calls == [1]


def test_arrays_returns_numpy_columns_and_ordered_codes() -> None:
    ctx = _ctx(_steps() + [{"rank": 1, "kind": "host_op", "name": "aten::add", "start_ns": 20, "dur_ns": 5}])
    got = ctx.arrays("SELECT rank, name, start_ns FROM events WHERE kind = 'host_op' AND rank >= $lo ORDER BY start_ns",
                     {"lo": 0}, codes=("name",))
    assert got["rank"].tolist() == [0, 1] and got["start_ns"].tolist() == [10, 20]
    # codes number the distinct values in their sorted order: aten::add before aten::mm
    assert got.names["name"] == ["aten::add", "aten::mm"]
    assert got["name"].tolist() == [1, 0]
    # NULL is a value of its own, after the others
    nulls = ctx.arrays("SELECT unnest(['b', NULL, 'a', 'b']) AS v", codes=("v",))
    assert nulls.names["v"] == ["a", "b", None] and nulls["v"].tolist() == [1, 2, 0, 1]
    empty = ctx.arrays("SELECT name FROM events WHERE false", codes=("name",))
    assert empty["name"].tolist() == [] and empty.names["name"] == []
