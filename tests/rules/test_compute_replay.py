"""The compute rules' counterfactuals replayed on planted kernels (tests/rules/fixtures_compute)."""

from __future__ import annotations

import pytest

from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.testing import context_from_tables
from tests.rules import fixtures_compute


def test_roofline_replays_each_operator_at_its_time() -> None:
    """Per step (A100, fixtures_compute): mm 4 ms, add 0.3 ms, addmm 20 ms, each kernel launched by its operator and
    the next operator starting 10 µs after it ends (untraced host time in between: a fixed gap). The addmm runs
    last; at the 0.8 threshold it takes 1.0995e12 / (0.8 x 312e12) = 4.405 ms, so the step ends 15.595 ms
    earlier. The mm and the add run before fixed host gaps: at their roofs nothing after them moves."""
    rep = analyze_context(context_from_tables(fixtures_compute.kineto_gpu_roofline()), Config())
    by_cause = {f.cause: f for f in rep.findings if f.rule == "CMP001"}
    under = by_cause["compute.underutilization"]
    assert under.replay is not None and under.replay["reproduced"]
    assert under.estimated_saving_us == pytest.approx(15_595, abs=1)
    assert by_cause["compute.compute_bound"].estimated_saving_us == 0.0
    assert by_cause["compute.memory_bound"].estimated_saving_us == 0.0


@pytest.mark.parametrize(("fixture", "saving_us"), [
    # AddX (500 µs) on 8 of 48 vector cores, back to back with MatMulX on one stream: 500 x (1 - 8/48)
    ("ascend_low_block_dim", 500 * (1 - 8 / 48)),
    # a 1000 µs kernel with 40 blocks on 108 SMs, back to back with a 500 µs one: 1000 x (1 - 40/108)
    ("gpu_small_grid", 1000 * (1 - 40 / 108)),
])
def test_low_block_dim_replays_each_kernel_spread_over_all_cores(fixture: str, saving_us: float) -> None:
    """The kernels of each step run back to back on one stream, 10 µs apart: the low-grid kernel at block_dim /
    cores of its time moves everything after it, and the step's end, by the time it gives back."""
    rep = analyze_context(context_from_tables(getattr(fixtures_compute, fixture)()), Config())
    f = next(x for x in rep.findings if x.rule == "CMP006")
    assert f.replay is not None and f.replay["reproduced"]
    assert f.estimated_saving_us == pytest.approx(saving_us, abs=0.01)


def test_conversions_replayed_away() -> None:
    """Per step: mm (4 ms kernel), then aten::_to_copy (host, 0-20 µs) launching a 1 ms cast kernel at 15 µs, the
    step's last work (the step ends 10 µs after it, at 1025 µs). Without the kernels launched inside the cast
    operator the last work is the operator's own end at 20 µs: the step is 1015 - 20 = 995 µs shorter."""
    rep = analyze_context(context_from_tables(fixtures_compute.kineto_gpu_casts()), Config())
    f = next(x for x in rep.findings if x.rule == "CMP004")
    assert f.replay is not None and f.replay["reproduced"]
    assert f.estimated_saving_us == pytest.approx(995.0, abs=0.01)
