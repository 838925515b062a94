"""CPU005 tells contention (the same operators running slower) from a step that runs more work
(more calls of the same operators). The Kineto traces are written here: eight steps of the same
operators and shapes; in step 6 either the convolution block runs 18 times instead of 2 at its
usual speed (more work), or every operator takes three times as long (contention)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from advisor.analyze import analyze
from advisor.config import Config
from tests.conftest import report_json

# (name, input dims, µs per call, calls per step); the first three form the block that step 6
# repeats 18 times in the "more work" trace
OPS: list[tuple[str, list[list[int]], float, int]] = [
    ("aten::conv2d", [[32, 64, 56, 56], [64, 64, 3, 3]], 5000.0, 2),
    ("aten::batch_norm", [[32, 64, 56, 56], [64], [64]], 1000.0, 2),
    ("aten::relu", [[32, 64, 56, 56]], 500.0, 2),
    ("aten::addmm", [[10], [32, 512], [512, 10]], 3000.0, 1),
    ("aten::add_", [[512, 10], [512, 10]], 500.0, 1),
    ("aten::mul", [[512, 10], []], 500.0, 1),
]
SLOW_STEP = 6
BLOCK_CALLS = 18


def _trace(tmp_path: Path, planted: str) -> Path:
    ev: list[dict[str, Any]] = []
    t = 0.0
    for step in range(1, 9):
        start = t
        for i, (name, dims, us, calls) in enumerate(OPS):
            if step == SLOW_STEP and planted == "more_work" and i < 3:
                calls = BLOCK_CALLS
            if step == SLOW_STEP and planted == "contention":
                us *= 3
            for _ in range(calls):
                t += 100.0
                ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": us,
                           "args": {"Input Dims": dims}})
                t += us
        t += 100.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                   "ts": start, "dur": t - start, "args": {}})
    (tmp_path / "rank-0.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return tmp_path


def _findings(tmp_path: Path, planted: str) -> dict[str, dict[str, Any]]:
    data = report_json(analyze(_trace(tmp_path, planted), Config(select=["CPU005", "CLU003"])))
    return {f["rule"]: f for f in data["findings"]}


def test_a_step_running_more_calls_is_not_contention(tmp_path: Path) -> None:
    got = _findings(tmp_path, "more_work")
    assert "CPU005" not in got
    # the step is slow all the same (16 more calls of the 6.5 ms block: +104 ms on ~17.9 ms)
    assert got["CLU003"]["steps"] == [SLOW_STEP]


def test_the_same_calls_running_slower_is_contention(tmp_path: Path) -> None:
    got = _findings(tmp_path, "contention")
    assert got["CPU005"]["steps"] == [SLOW_STEP]
    # every operator 3x its usual time per call
    assert got["CPU005"]["evidence"]["op_time_ratio_median"] == pytest.approx(3.0, abs=0.01)
