"""The Chrome-trace overlay (``--out NAME.overlay.json``): its spans sit at the input trace's own times.

Expected times are read from the input traces here (their ``ts`` / ``dur`` / ``ProfilerStep#N``
events), never from the overlay writer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor import cli
from advisor.options import format_of
from advisor.render.overlay import ADVISOR_PID, TID_PATH, TID_WINDOW, overlay_events
from advisor.render.overlay import render as render_overlay

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_profiles"
EPS = 0.002  # µs: the report rounds times to the ns


def _analyze(profile: Path, tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    report, overlay = tmp / "r.json", tmp / "r.overlay.json"
    res = CliRunner().invoke(cli.main, ["analyze", str(profile), "--full-critical-path",
                                        "--out", str(report), "--out", str(overlay)])
    assert res.exit_code in (0, 1), res.output
    return json.loads(report.read_text()), json.loads(overlay.read_text())


def _input_events(files: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in files:
        out += [e for e in json.loads(gzip.decompress(f.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    return out


def _check_against_input(report: dict[str, Any], overlay: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
    cp = report["critical_path"]
    mine = [e for e in overlay["traceEvents"] if e.get("pid") == ADVISOR_PID]
    # the focused step window is the input's ProfilerStep#<step> event (its start)
    step_ev = [e for e in inputs if e["name"] == f"ProfilerStep#{cp['step']}"]
    window = [e for e in mine if e["tid"] == TID_WINDOW and e["ph"] == "X"]
    assert len(window) == 1
    assert any(abs(window[0]["ts"] - float(e["ts"])) <= EPS for e in step_ev)
    # every critical-path span of one operator lies inside an input event of that name on its pid/tid
    # (a host segment is a piece of its outermost operator), and some start exactly at the event's ts
    spans = [e for e in mine if e["tid"] == TID_PATH and e["ph"] == "X" and "pid" in e["args"]
             and "merged" not in e["args"]]
    assert spans
    exact = 0
    for s in spans:
        a, op = s["args"], s["args"]["op"]
        assert s["name"] == f"{a['kind']}: {op}"
        hosts = [e for e in inputs if e["name"] == op and str(e.get("pid")) == a["pid"] and str(e.get("tid")) == a["tid"]
                 and float(e["ts"]) <= s["ts"] + EPS and float(e["ts"]) + float(e["dur"]) >= s["ts"] + s["dur"] - EPS]
        assert hosts, s
        exact += any(abs(float(e["ts"]) - s["ts"]) <= EPS for e in hosts)
    assert exact >= 1


@pytest.mark.slow  # one analysis (~4 s); the renderer's own tests below stay quick
def test_overlay_spans_sit_on_the_input_events_under_a_time_base(tmp_path: Path) -> None:
    """cpu_healthy writes ``baseTimeNanoseconds``: the overlay undoes it, back to the file's own ts."""
    src = SAMPLES / "kineto_cpu_healthy" / "cpu_healthy.pt.trace.json.gz"
    assert json.loads(gzip.decompress(src.read_bytes())).get("baseTimeNanoseconds")
    report, overlay = _analyze(src.parent, tmp_path)
    _check_against_input(report, overlay, _input_events([src]))
    # every finding is on the findings track, as a span or an instant
    names = {e["name"] for e in overlay["traceEvents"] if e.get("cat") == "advisor.finding"}
    assert names == {f"{f['rule']}: {f['title']}" for f in report["findings"]}


@pytest.mark.slow
def test_overlay_spans_sit_on_the_input_events_two_ranks(tmp_path: Path) -> None:
    """Absolute ts (no time base), host and device segments; the focused rank's file only."""
    report, overlay = _analyze(SAMPLES / "kineto_two_ranks", tmp_path)
    rank = report["critical_path"]["rank"]
    _check_against_input(report, overlay, _input_events([SAMPLES / "kineto_two_ranks" / f"rank-{rank}.json.gz"]))


def test_overlay_keeps_hostile_names_plain_strings() -> None:
    hostile = '</script><img src=x onerror=alert(1)>"\x1b[31m\u202e\n'
    report = {
        "critical_path": {
            "rank": 0, "step": 3, "length_us": 100.0, "trace_start_us": 5000.0,
            "trace_steps": [{"step": 3, "start_us": 5000.0, "end_us": 5100.0}],
            "segments": [{"start_us": 10.0, "dur_us": 20.0, "name": hostile, "kind": "compute", "pid": hostile,
                          "tid": "7"}],
        },
        "findings": [{"rule": "X001", "title": hostile, "severity": "high", "ranks": [0], "steps": [3],
                      "evidence": {hostile: hostile}},
                     {"rule": "X002", "title": "no step", "ranks": [], "steps": [], "evidence": {}}],
    }
    text = render_overlay(report)
    back = json.loads(text)
    assert back == overlay_events(report)
    seg = next(e for e in back["traceEvents"] if e.get("cat") == "advisor.critical_path")
    assert isinstance(seg["name"], str) and "\x1b" not in seg["name"] and "\u202e" not in seg["name"]
    assert seg["name"].startswith("compute: </script>")  # a string, not markup: the viewer shows it as text
    assert seg["ts"] == 5010.0 and seg["dur"] == 20.0 and seg["args"]["share"] == 0.2
    fnd = [e for e in back["traceEvents"] if e.get("cat") == "advisor.finding"]
    assert [(e["ph"], e["ts"]) for e in fnd] == [("X", 5000.0), ("i", 5000.0)]
    assert all(isinstance(k, str) and "\x1b" not in k for k in fnd[0]["args"]["evidence"])


def test_overlay_without_a_time_base_counts_from_the_window() -> None:
    back = overlay_events({"critical_path": {"rank": 0, "step": 1, "length_us": 10.0,
                                             "segments": [{"start_us": 2.0, "dur_us": 3.0, "name": "k", "kind": "compute"}]}})
    seg = next(e for e in back["traceEvents"] if e.get("cat") == "advisor.critical_path")
    assert seg["ts"] == 2.0
    assert "no trace time base" in back["otherData"]["time_base"]


def test_overlay_suffix_names_the_format() -> None:
    assert format_of(Path("run.overlay.json")) == "overlay"
    assert format_of(Path("RUN.Overlay.JSON")) == "overlay"
    assert format_of(Path("run.json")) == "json"
    assert format_of(Path("overlay.json")) == "json"


class _Ctx:
    """A context over a rank whose files count ts from 5 µs, with ``n`` steps of 10 µs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        if "meta" in sql:
            return [{"value": "5000"}]
        return [{"step": i, "start_ns": 5000 + 10_000 * i, "end_ns": 15_000 + 10_000 * i} for i in range(self.n)]


def test_trace_times_undo_the_base_and_keep_the_steps_near_the_focus() -> None:
    from advisor.pipeline.report import MAX_TRACE_STEPS, trace_times

    t = trace_times(_Ctx(3), 0, 1)  # type: ignore[arg-type]
    assert t["trace_start_us"] == 10.0  # (15000 - 5000) ns
    assert t["trace_steps"][2] == {"step": 2, "start_us": 20.0, "end_us": 30.0}
    far = trace_times(_Ctx(3 * MAX_TRACE_STEPS), 0, 3 * MAX_TRACE_STEPS - 1)  # type: ignore[arg-type]
    assert len(far["trace_steps"]) == MAX_TRACE_STEPS
    assert far["trace_steps"][-1]["step"] == 3 * MAX_TRACE_STEPS - 1


_CP_REPORT: dict[str, Any] = {
    "critical_path": {"rank": 2, "step": 3, "length_us": 100.0,
                      "ops": [{"name": "k", "kind": "compute", "total_us": 20.0, "count": 1}],
                      "segments": [{"start_us": 10.0, "dur_us": 20.0, "name": "k", "kind": "compute"}]},
    "findings": [], "breakdown": [],
}


def _overlay_anchor(page: str) -> tuple[str, str] | None:
    import re

    m = re.search(r'<a class="overlay-link" href="([^"]*)">([^<]*)</a>', page)
    return (m.group(1), m.group(2)) if m else None


def test_html_links_the_overlay_written_in_the_same_run(tmp_path: Path) -> None:
    """``--out sub/r.html --out r.overlay.json``: both written; the page links the overlay by its
    path relative to the page's directory, with how to open it; without an overlay it keeps the hint."""
    (tmp_path / "sub").mkdir()
    page, ov = tmp_path / "sub" / "r.html", tmp_path / "r.overlay.json"
    cli.write_targets(_CP_REPORT, [(page, "html"), (ov, "overlay")])
    assert json.loads(ov.read_text(encoding="utf-8")) == overlay_events(_CP_REPORT)
    text = page.read_text(encoding="utf-8")
    assert _overlay_anchor(text) == ("../r.overlay.json", "../r.overlay.json")
    assert "ui.perfetto.dev" in text and "chrome://tracing" in text and "rank 2" in text
    assert "--out NAME.overlay.json" not in text
    # beside it, the link is the bare file name; the HTML alone keeps the hint with the flag
    cli.write_targets(_CP_REPORT, [(tmp_path / "b.html", "html"), (ov, "overlay")])
    assert _overlay_anchor((tmp_path / "b.html").read_text(encoding="utf-8"))[0] == "r.overlay.json"  # type: ignore[index]
    cli.write_targets(_CP_REPORT, [(tmp_path / "alone.html", "html")])
    alone = (tmp_path / "alone.html").read_text(encoding="utf-8")
    assert _overlay_anchor(alone) is None and "--out NAME.overlay.json" in alone


def test_html_link_to_a_hostile_overlay_name_is_escaped(tmp_path: Path) -> None:
    """A file name with markup, quotes, a query, a fragment and a colon (scheme-like) is one
    relative, percent-encoded href and escaped text: no attribute break-out, no new element."""
    from urllib.parse import unquote

    name = 'javascript:x" onclick="alert(1)<img src=x>?a=1#f&.overlay.json'
    page, ov = tmp_path / "r.html", tmp_path / name
    cli.write_targets(_CP_REPORT, [(page, "html"), (ov, "overlay")])
    assert ov.is_file()
    text = page.read_text(encoding="utf-8")
    anchor = _overlay_anchor(text)
    assert anchor is not None
    href, shown = anchor
    assert unquote(href) == name and not any(c in href for c in '"<>?#&: ')
    assert "<img" not in text and 'onclick="' not in text
    assert shown == name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
