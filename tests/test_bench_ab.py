"""benchmarks/ab.py: the report comparison it prints, and its bootstrap interval (the timing
itself is a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ab() -> Any:
    spec = importlib.util.spec_from_file_location("bench_ab", ROOT / "benchmarks" / "ab.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_timings_left_out_of_the_comparison(ab: Any) -> None:
    a = {"profile": {"ranks": [0, 1], "parse_seconds": 1.5, "analyze_seconds": 2.0},
         "rules": [{"rule": "CPU001", "seconds": 0.1, "findings": 1}]}
    b = json.loads(json.dumps(a))
    b["profile"]["parse_seconds"], b["rules"][0]["seconds"] = 9.0, 0.7
    assert ab.first_difference(ab.without_timings(a), ab.without_timings(b)) is None
    assert a["profile"]["parse_seconds"] == 1.5  # the caller's report is not changed


@pytest.mark.parametrize(("b", "where"), [
    ({"x": [1, 2, {"y": 3}]}, None),
    ({"x": [1, 2, {"y": 4}]}, ".x[2].y"),
    ({"x": [1, 2]}, ".x[] (length 3 vs 2)"),
    ({"x": [1, 2, {"y": 3}], "z": 0}, ".z"),
    ({"x": "1"}, ".x"),
])
def test_first_difference(ab: Any, b: dict[str, Any], where: str | None) -> None:
    assert ab.first_difference({"x": [1, 2, {"y": 3}]}, b) == where


def test_median_interval_brackets_the_median(ab: Any) -> None:
    diffs = [-0.3, -0.2, -0.25, -0.1, -0.35, -0.2, -0.15, -0.3, -0.22, -0.28]
    lo, hi = ab.median_interval(diffs)
    assert lo <= statistics.median(diffs) <= hi < 0  # all pairs faster: the interval stays below zero
    assert ab.median_interval(diffs) == (lo, hi)  # seeded: the same figures every time
