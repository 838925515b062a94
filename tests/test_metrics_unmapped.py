"""A ``--metrics`` series of a device the trace maps to no rank (rank NULL) beside a mapped one:
the hardware stage and its rules (CMP005, HW001) read both, none fails on the missing rank."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from advisor.stages.hardware import _assign_phases, _assign_steps
from tests.render_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_stage_places_samples_of_no_rank() -> None:
    """Rank 3's steps and kernels; samples of rank 3 and of an unmapped device (rank NA, the
    nullable integer column DuckDB gives): the rank's samples get its step and phase, the others
    the job-wide step and no phase."""
    con = duckdb.connect()
    con.execute("CREATE TABLE steps AS SELECT * FROM (VALUES (3, 7, 100, 200)) t(rank, step, start_ns, end_ns)")
    con.execute("""CREATE TABLE events AS SELECT * FROM (VALUES (3, true, 'kernel', 120, 30))
                   t(rank, device, kind, start_ns, dur_ns)""")
    df = pd.DataFrame({"rank": pd.array([3, None, 3, None], dtype="Int64"), "ts_ns": [130, 130, 250, 90]})
    steps, _job = _assign_steps(con, df)
    assert list(steps) == [7, 7, -1, -1]
    phases, known = _assign_phases(con, df)
    assert known and list(phases)[1::2] == ["", ""] and phases[0] == "compute"


@pytest.mark.slow
def test_series_of_an_unmapped_device(tmp_path: Path) -> None:
    # rank 1 of kineto_two_ranks alone (it ran on GPU 1); nvidia_smi.csv samples GPU 0 and GPU 1
    prof = tmp_path / "rank1"
    prof.mkdir()
    shutil.copy(ROOT / "sample_profiles" / "kineto_two_ranks" / "rank-1.json.gz", prof)
    out = tmp_path / "r.json"
    res = run_cli(prof, "--metrics", ROOT / "tests" / "data" / "metrics" / "nvidia_smi.csv",
                  "--metrics-tz-offset", "+08:00", "--rule", "CMP005", "--rule", "HW001", "--out", out)
    assert res.returncode == 0, res.stderr
    d = json.loads(out.read_text())
    codes = {w["code"]: w["message"] for w in d["warnings"]}
    assert "rule_error" not in codes and "hardware_failed" not in codes, codes
    assert "(0)" in codes["metrics_unmapped"]  # GPU 0 is no rank's
    # the clock series of both devices reached CMP005: one nominal-clock note per device
    notes = [w["message"] for w in d["warnings"] if w["code"] == "rule_undecided" and "CMP005" in w["message"]]
    assert len(notes) == 2
