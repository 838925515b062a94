"""CPU007's counterfactual replayed on the planted host-bound steps (tests/rules/fixtures_host_bound)."""

from __future__ import annotations

from typing import Any

import pytest

from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.testing import context_from_tables
from rules.cpu.cpu007_host_bound import SYNC_NOT_REPLAYED
from tests.rules import fixtures_host_bound


def _cpu007(rows: dict[str, list[dict[str, Any]]]) -> Any:
    rep = analyze_context(context_from_tables(rows), Config())
    return next(f for f in rep.findings if f.rule == "CPU007")


def test_framework_time_removed_launches_kept() -> None:
    """Per 10 ms step, 100 operators of 80 µs every 90 µs from 0.5 ms, each with a 10 µs launch at +60 µs whose
    5 µs kernel starts 12 µs after the launch began. Without the operators' own 70 µs the host runs launch
    (10 µs) and the 10 µs gap per operator: the last launch starts at 0.5 + 99 x 0.02 = 2.48 ms, its kernel
    ends at 2.497 ms, and the 510 µs after the last work (the host's, at 9.49 ms) stay: the step is
    10 - 3.007 = 6.993 ms shorter (the rule's own figure: 7.5 ms of idle under host work)."""
    f = _cpu007(fixtures_host_bound.launch_bound())
    assert f.replay["estimated"] and f.replay["reproduced"]
    assert f.estimated_saving_us == pytest.approx(6993.0, abs=0.5)
    assert f.evidence["saving_before_replay_us"] == pytest.approx(7500.0, abs=0.5)


def test_idle_inside_a_sync_is_not_replayed_and_says_why() -> None:
    """The device idles 5.2 ms while the host sits in a blocking cudaMemcpy that waits for no recorded work: the
    finding keeps its own figure (5170 µs of host work over idle) and says why it is not replayed."""
    f = _cpu007(fixtures_host_bound.sync_bound())
    assert f.replay == {"estimated": False, "reason": SYNC_NOT_REPLAYED}
    assert f.evidence["saving_not_replayed"] == SYNC_NOT_REPLAYED
    assert f.estimated_saving_us == pytest.approx(5170.0, abs=0.5)
