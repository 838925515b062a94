"""The communication rules' counterfactual as data (rules/comm/_common.py: transfer_changes): an operator's
transfers over one transport moved at a bandwidth, on the real torch_npu exports of one 2-NPU DDP job
(tests/data/ascend_real, provenance in its README): the text form records each all-reduce's HCCL tasks on
the device timeline, the .db form the all-reduce as one event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from advisor.config import build_thresholds
from advisor.engine.context import load_profile
from advisor.engine.registry import discover
from advisor.engine.rule import RuleContext
from rules.comm._common import Faster, transfer_changes
from tests.conftest import ROOT

REAL = ROOT / "tests" / "data" / "ascend_real"
GBPS = 24.0  # 0.8 x the 30 GB/s HCCS peak: COM002's target
OP = "hcom_allReduce__586_1_1"  # the second all-reduce; the .db recording names its group otherwise
OP_DB = "hcom_allReduce__210_1_1"


def _context(path: Path) -> RuleContext[Any]:
    spec = discover()["COM002"]
    return RuleContext(spec, load_profile(path), build_thresholds("COM002", spec.thresholds, {}))


def _hccs_row(rc: RuleContext[Any], op: str) -> dict[str, Any]:
    return rc.query("SELECT step, bytes, transit_ns FROM comm_bandwidth WHERE rank = 0 AND name = $op "
                    "AND transport = 'HCCS'", {"op": op})[0]


def test_an_operators_hccs_tasks_are_scaled_and_nothing_else() -> None:
    """Text form: rank 0's second all-reduce moves 117,440,512 B over HCCS. Its HCCS transfer tasks (comm_tasks
    with link HCCS and bytes, which sum to the operator's HCCS transit) and nothing else (not its on-chip
    copies, waits or notify records, nor another operator's tasks) are bounded, each to its duration times
    f = (bytes / 24 GB/s) / transit: together the bytes at 24 GB/s."""
    rc = _context(REAL / "ascend_pt_resnet_ddp_l1_text")
    row = _hccs_row(rc, OP)
    tasks = rc.query("SELECT start_ns, dur_ns FROM comm_tasks WHERE rank = 0 AND op_name = $op "
                     "AND link_type = 'HCCS' AND bytes > 0 ORDER BY start_ns", {"op": OP})
    assert len(tasks) == 14
    assert sum(t["dur_ns"] for t in tasks) == pytest.approx(row["transit_ns"], abs=10)  # µs with 3 decimals
    f = row["bytes"] / GBPS / row["transit_ns"]
    changes, missing = transfer_changes(rc, 0, [Faster(row["step"], OP, "HCCS", row["bytes"], row["transit_ns"], GBPS)])
    assert not missing and len(changes) == 1 and changes[0].action == "bound"
    bounds = changes[0].event_bounds
    assert {name for name, _, _ in bounds} == {"SDMA"}  # the tasks' name on the device timeline
    assert sorted((t, b) for _, t, b in bounds) == [(t["start_ns"], round(t["dur_ns"] * f)) for t in tasks]
    assert sum(b for _, _, b in bounds) == pytest.approx(row["bytes"] / GBPS, abs=len(tasks))


@pytest.mark.slow  # the quick suite: the task-level bound (the test above)
def test_an_operator_recorded_as_one_event_loses_its_wall_transits_share() -> None:
    """.db form: the second all-reduce is one device event (2,180,324 ns on rank 0), its HCCS tasks summing to
    9,265,805 ns of transit, more than the event (they run side by side); the operator table's Transit Time is
    1,316,426 ns. At 24 GB/s the event loses (1 - f) of that wall transit, f = (117,440,512 B / 24 GB/s) /
    9,265,805 ns = 0.52811: 621,209.6 ns, to 1,559,114.4 ns."""
    rc = _context(REAL / "ascend_pt_resnet_ddp_l1_db")
    row = _hccs_row(rc, OP_DB)
    assert (row["bytes"], row["transit_ns"]) == (117_440_512, 9_265_805)
    op = rc.query("SELECT transit_ns FROM comm_ops WHERE rank = 0 AND name = $op", {"op": OP_DB})[0]
    ev = rc.query("SELECT start_ns, dur_ns FROM events WHERE rank = 0 AND device AND name = $op", {"op": OP_DB})
    assert (op["transit_ns"], [e["dur_ns"] for e in ev]) == (1_316_426, [2_180_324])
    changes, missing = transfer_changes(rc, 0, [Faster(row["step"], OP_DB, "HCCS", row["bytes"], row["transit_ns"], GBPS)])
    assert not missing
    assert changes[0].event_bounds == ((OP_DB, ev[0]["start_ns"], 1_559_114),)
