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
    # the quick suite analyses one profile twice; the marked run each
    [pytest.param(TRACES / "cpu_dynamic_shapes", id="cpu_dynamic_shapes"),
     *(pytest.param(p, id=p.name, marks=pytest.mark.slow)
       for p in (TRACES / "cpu_unfused_transformer", TRACES / "gloo_slow_rank", SAMPLES / "kineto_two_ranks"))],
)
def test_same_report_twice(path: Path) -> None:
    first, second = (_strip(json.loads(render(analyze(path)))) for _ in range(2))
    assert first == second


@pytest.mark.slow
@pytest.mark.parametrize("form", ["db", "text"])
def test_same_report_three_times_on_an_ascend_cluster(form: str, tmp_path: Path) -> None:
    """The Ascend load does not keep insertion order, so rules that take the first rows of a query
    (COM006's operators and top rows, CLU001's group on a tie) gave other ids and evidence from run to run."""
    from tests.ascend import gen_cluster

    facts = gen_cluster.generate("faults8", tmp_path, form)
    reports = {json.dumps(_strip(json.loads(render(analyze(facts.root)))), sort_keys=True) for _ in range(3)}
    assert len(reports) == 1
