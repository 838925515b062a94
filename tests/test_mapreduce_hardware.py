"""Hardware series beside a cluster: the reduce, which holds no events, tells each sample's phase
from the device's busy periods the per-rank map hands it, as a context holding the events does."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor.analyze import analyze, analyze_context, build_context
from advisor.metrics import finish_load
from advisor.options import LoadOptions
from advisor.pipeline import plan
from tests.conftest import SAMPLES, report_json

PROFILE = SAMPLES / "kineto_two_ranks"


def _metrics_file(tmp_path: Path) -> Path:
    """A canonical CSV (time, node, device, metric, value, unit) sampling both GPUs every 2 ms over
    the trace's device span (its first and last device events, read from the trace by DuckDB)."""
    from advisor.engine.context import load_profile

    con = load_profile(PROFILE).con
    t0, t1 = con.execute("SELECT min(start_ns), max(start_ns + dur_ns) FROM events WHERE device").fetchone()
    lines = ["time,node,device,metric,value,unit"]
    t = t0
    while t < t1:
        for dev in (0, 1):
            lines.append(f"{t / 1e9:.6f},node-a,{dev},sm_active_pct,{40 + dev},%")
        t += 2_000_000
    path = tmp_path / "series.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_reduce_knows_the_phases_of_the_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = _metrics_file(tmp_path)
    monkeypatch.setattr(plan, "SHARD_BYTES", 1)  # one rank per shard: two maps, then the reduce
    sharded = report_json(analyze(PROFILE, options=LoadOptions(metrics=(metrics,))))
    whole = build_context(PROFILE)  # one DuckDB holding every event
    finish_load(whole.con, lambda *_said: None, (metrics,))  # its warnings are not what is compared
    kept = report_json(analyze_context(whole))
    hw, ref = sharded["hardware"], kept["hardware"]
    assert ref["phases_known"] and hw["phases_known"]
    by_phase = {m["metric"]: m.get("by_phase") for m in hw["metrics"]}
    assert by_phase == {m["metric"]: m.get("by_phase") for m in ref["metrics"]}
    assert len(by_phase["sm_active_pct"]) >= 2  # samples fell in more than one phase
