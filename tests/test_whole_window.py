"""A trace without step markers whose steps cannot be inferred is one window over the whole trace:
every renderer says "whole window", and a time budget fails (README: a gate must not pass blind)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from advisor.gate import evaluate
from advisor.render.terminal import print_report
from tests.render_helpers import run_cli


def no_step_trace(path: Path) -> Path:
    """Five different host operators, 1..5 ms long, 200 µs apart: nothing repeats, so no step is
    inferred. The window: 15 ms of operators + 4 gaps of 200 µs = 15.8 ms; idle 0.8 ms (5.06 %)."""
    events, t = [], 1000
    for i, name in enumerate(["aten::conv2d", "aten::relu", "aten::linear", "aten::softmax", "aten::add"]):
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": 1000 * (i + 1)})
        t += 1000 * (i + 1) + 200
    path.mkdir()
    (path / "t.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    return path


def test_time_budget_fails_on_the_whole_window(tmp_path: Path) -> None:
    prof = no_step_trace(tmp_path / "p")
    out = tmp_path / "r.json"
    res = run_cli(prof, "--budget", "step_ms=1000", "--budget", "free_ratio=0.5", "--budget", "findings_total=5",
                  "--out", out, "--out", tmp_path / "r.md", "--out", tmp_path / "r.html")
    assert res.returncode == 1, res.stderr
    assert "budget step_ms=1000: cannot be measured: no step windows on rank 0" in res.stderr
    checks = {c["name"]: c for c in json.loads(out.read_text())["gate"]["checks"]}
    assert not checks["step_ms"]["passed"] and checks["step_ms"]["value"] is None
    assert checks["free_ratio"]["passed"] and abs(checks["free_ratio"]["value"] - 800 / 15800) < 1e-6
    assert checks["findings_total"]["passed"]
    md = (tmp_path / "r.md").read_text()
    assert "steps none (whole window)" in md and "### Critical path — rank 0, whole window" in md
    assert "No step windows: the step time is the whole window" in md
    html = (tmp_path / "r.html").read_text()
    assert "steps none (whole window)" in html and "Critical path of rank 0, whole window" in html
    assert "step None" not in html and "step -" not in html

    buf = io.StringIO()
    print_report(json.loads(out.read_text()), file=buf, color=False, width=120)
    text = " ".join(buf.getvalue().split())
    assert "steps: none (whole window)" in text and "Critical path: rank 0, whole window" in text
    assert "No step windows: the step time is the whole window" in text
    assert "step None" not in text


def test_gate_on_a_report_with_one_rank_without_steps() -> None:
    """Rank 1 has step windows, rank 0 has none: the worst rank cannot be known, a time budget fails."""
    row = {"compute_us": 0.0, "comm_us": 0.0, "overlapped_us": 0.0, "compute_only_us": 0.0, "comm_only_us": 0.0,
           "host_only_us": 0.0, "free_us": 0.0, "overlap_ratio": None}
    d = {"breakdown": [{**row, "rank": 0, "step": None, "step_us": 9e6},
                       {**row, "rank": 1, "step": 4, "step_us": 1000.0}], "findings": []}
    res = evaluate(d, budgets={"step_us": 5000.0})
    assert res.exit_code == 1 and "no step windows on rank 0" in res.messages[0]
