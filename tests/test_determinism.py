"""Two runs on the same profile give the same report (finding ids feed baselines and CI gates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.analyze import analyze
from advisor.render.json import render
from tests.conftest import SAMPLES, TRACES

TIMING_KEYS = {"parse_seconds", "analyze_seconds", "seconds"}


def _strip(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


@pytest.mark.parametrize(
    "path",
    [TRACES / "cpu_dynamic_shapes", TRACES / "cpu_unfused_transformer", TRACES / "gloo_slow_rank", SAMPLES / "kineto_two_ranks"],
    ids=lambda p: p.name,
)
def test_same_report_twice(path: Path) -> None:
    first, second = (_strip(json.loads(render(analyze(path)))) for _ in range(2))
    assert first == second
