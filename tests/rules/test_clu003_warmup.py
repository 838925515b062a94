"""CLU003 leaves warm-up steps out: steps that compile, and a cycle's first step when it alone is
slow. Traces are canonical rows written here: one CPU rank, steps of 20 ms of operators; the
planted slow steps and their compile events are stated in each test."""

from __future__ import annotations

from typing import Any

from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.testing import context_from_tables
from rules.cluster._stats import warmup_steps
from tests.conftest import report_json

MS = 1_000_000  # ns


def _rows(step_ms: dict[int, float], compile_ms: dict[int, float]) -> list[dict[str, Any]]:
    """Back-to-back steps; each holds one operator over its whole length, and a step listed in
    ``compile_ms`` a compile region of that length at its start."""
    ev: list[dict[str, Any]] = []
    t = 0
    host = {"rank": 0, "device": False, "pid": "1", "tid": "1"}
    for step, ms in sorted(step_ms.items()):
        dur = int(ms * MS)
        ev.append({**host, "kind": "step", "name": f"ProfilerStep#{step}", "start_ns": t, "dur_ns": dur})
        c = int(compile_ms.get(step, 0) * MS)
        if c:
            ev.append({**host, "kind": "host_op", "name": "entire_frame_compile", "start_ns": t, "dur_ns": c})
        ev.append({**host, "kind": "host_op", "name": "aten::addmm", "start_ns": t + c, "dur_ns": dur - c})
        t += dur
    return ev


def _clu003(step_ms: dict[int, float], compile_ms: dict[int, float] | None = None) -> list[dict[str, Any]]:
    ctx = context_from_tables({"events": _rows(step_ms, compile_ms or {})})
    data = report_json(analyze_context(ctx, Config(select=["CLU003"])))
    return [f for f in data["findings"] if f["rule"] == "CLU003"]


def _steady(n: int = 8, first: int = 1) -> dict[int, float]:
    return {first + i: 20.0 + 0.2 * (i % 3) for i in range(n)}


def test_a_compiling_first_step_is_warm_up() -> None:
    steps = _steady()
    steps[1] = 320.0  # 300 ms compiling
    assert _clu003(steps, {1: 300.0}) == []


def test_a_first_step_slow_alone_is_warm_up() -> None:
    steps = _steady(first=5)
    steps[5] = 60.0
    assert _clu003(steps) == []


def test_a_slow_step_after_a_compiling_one_is_judged_on_the_steady_steps() -> None:
    steps = _steady()
    steps[1] = 320.0
    steps[6] = 250.0  # e.g. a checkpoint: no compile in it
    (f,) = _clu003(steps, {1: 300.0})
    assert f["steps"] == [6]
    assert f["evidence"]["warmup_steps_excluded"] == "1"
    assert f["evidence"]["steps_profiled"] == 7
    # the baseline: the seven other steps, 20.0-20.4 ms
    assert 20_000 <= f["evidence"]["baseline_median_us"] <= 20_400


def test_a_slow_first_step_next_to_other_slow_steps_stays() -> None:
    steps = _steady()
    steps[1] = 200.0
    steps[6] = 210.0
    (f,) = _clu003(steps)
    assert f["steps"] == [1, 6]
    assert "warmup_steps_excluded" not in f["evidence"]


def test_warmup_steps_by_mechanism() -> None:
    vals = [(s, 20.0) for s in range(1, 9)]
    # the first step of the second cycle (#11 after #8) slow alone: warm-up
    assert warmup_steps([*vals, (11, 60.0), (12, 20.0)], {}, 3.0, 0.1)[0] == (11,)
    # slow, not first of a cycle, no compile: an outlier, not warm-up
    warm, fs, kept = warmup_steps([*vals[:4], (5, 60.0), *vals[5:]], {}, 3.0, 0.1)
    assert warm == () and [kept[i][0] for i in fs.outliers] == [5]
    # compile time below 10 % of the median step does not make a step warm-up
    warm, fs, kept = warmup_steps([*vals[:4], (5, 60.0), *vals[5:]], {5: 1.0}, 3.0, 0.1)
    assert warm == ()
    assert warmup_steps([*vals[:4], (5, 60.0), *vals[5:]], {5: 40.0}, 3.0, 0.1)[0] == (5,)
