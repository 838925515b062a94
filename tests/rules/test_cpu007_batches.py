"""CPU007 classifies the idle time of a big rank in batches of segments: the planted per-step
figures of the host-bound fixtures come out the same with batches of three segments."""

from __future__ import annotations

from typing import Any

import pytest

import rules.cpu.cpu007_host_bound as cpu007
from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.testing import context_from_tables
from tests.conftest import report_json
from tests.rules import fixtures_host_bound


def _evidence(tables: Any) -> dict[str, Any]:
    data = report_json(analyze_context(context_from_tables(tables), Config(select=["CPU007"])))
    (f,) = [f for f in data["findings"] if f["rule"] == "CPU007"]
    return dict(f["evidence"])


@pytest.mark.parametrize("batch", [3, 1 << 18])
def test_planted_idle_split_in_batches(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu007, "SEGMENTS_AT_ONCE", batch)
    # fixtures_host_bound.launch_bound, per step: idle 9500 us = launch 1000 + framework 6500 + nothing 2000
    ev = _evidence(fixtures_host_bound.launch_bound())
    idle = ev["device_idle_us_per_step"]
    assert (idle["launch"], idle["framework_python"], idle["nothing_recorded"]) == (1000.0, 6500.0, 2000.0)
    assert (idle["sync"], idle["allocator"], idle["data_loading"]) == (0.0, 0.0, 0.0)
    assert ev["host_work_share"] == 0.75
    # fixtures_host_bound.sync_bound, per step: sync 5000, framework 50 + 50, launch 40 + 30 us
    ev = _evidence(fixtures_host_bound.sync_bound())
    idle = ev["device_idle_us_per_step"]
    assert (idle["sync"], idle["framework_python"], idle["launch"]) == (5000.0, 100.0, 70.0)
    assert ev["main_reason"] == "sync"
