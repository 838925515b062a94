"""The HTML charts are drawn from the data, and only where the profile has it.

Without a browser: the page is parsed and each chart's inline SVG checked (present, labelled by
``aria-label``, with marks in it). A generated Ascend cluster with ``communication_matrix.json``
gets the communication matrix; a Kineto GPU trace with FLOP counts gets the roofline (CMP001);
neither chart is drawn for a profile without its data. The step-time series and the evidence
tables are checked on hand-made data.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import report_json

# -- profiles ----------------------------------------------------------------------------------

#: (name, FLOPs, input dims, input types, kernel µs) per operator of each step. A100 (312 TFLOP/s
#: fp16, 19.5 fp32, 2039 GB/s in rules/compute/devices.toml). By hand: mm and addmm 2·8192³ =
#: 1.0995e12 FLOP; addmm in 20 ms = 54.98 TFLOP/s; mm in 4 ms = 274.9 TFLOP/s; add 2^26 FLOP over
#: 2 x 2^26 float inputs (536.9 MB) = 0.125 FLOP/B.
GPU_OPS = (
    ("aten::mm", 2 * 8192**3, [[8192, 8192], [8192, 8192]], ["c10::Half", "c10::Half"], 4000.0),
    ("aten::add", float(2**26), [[67108864], [67108864], []], ["float", "float", "Scalar"], 300.0),
    ("aten::addmm", 2 * 8192**3, [[8192], [8192, 8192], [8192, 8192]], ["c10::Half"] * 3, 20000.0),
)


def write_gpu_roofline_trace(directory: Path, steps: int = 3) -> Path:
    """A one-GPU Kineto trace (A100) whose operators carry FLOP counts and input shapes: CMP001 fires."""
    directory.mkdir(parents=True, exist_ok=True)
    ev: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
                                {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    t, corr = 1000.0, 1
    for step in range(1, steps + 1):
        t0 = t
        body = []
        for name, flops, dims, types, kdur in GPU_OPS:
            body.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": t, "dur": 20.0,
                         "args": {"External id": corr, "Input Dims": dims, "Input type": types, "flops": flops}})
            body.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
                         "ts": t + 5, "dur": 5.0, "args": {"correlation": corr, "External id": corr}})
            body.append({"ph": "X", "cat": "kernel", "name": f"kernel_{name[6:]}", "pid": 0, "tid": 7, "ts": t + 15,
                         "dur": kdur, "args": {"correlation": corr, "External id": corr, "device": 0, "stream": 7}})
            t += 15 + kdur + 10
            corr += 1
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 100, "tid": 100,
                   "ts": t0, "dur": t - t0, "args": {}})
        ev += body
    props = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920}]
    path = directory / "gpu.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev}))
    return path


def write_ascend_cluster(directory: Path) -> Any:
    """The generator's 8-rank ``faults8`` torch_npu export (communication_matrix.json per rank; a slow
    link planted at 1/8 of its peers' bandwidth); returns its facts."""
    from tests.ascend import gen_cluster

    return gen_cluster.generate("faults8", directory, "text")


# -- the page's charts -------------------------------------------------------------------------


class _Charts(HTMLParser):
    """figure id -> {"aria": the svg's aria-label, "tags": {tag: count inside the svg}, "titles": [...]}."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, Any]] = {}
        self._fig: str | None = None
        self._in_svg = False
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and a.get("id"):
            self._fig = a["id"]
            self.charts[self._fig] = {"aria": None, "tags": {}, "titles": [], "svgs": 0}
        elif self._fig and tag == "svg":
            c = self.charts[self._fig]
            c["svgs"] += 1
            c["aria"] = a.get("aria-label")
            c["role"] = a.get("role")
            self._in_svg = True
        elif self._fig and self._in_svg:
            tags = self.charts[self._fig]["tags"]
            tags[tag] = tags.get(tag, 0) + 1
            self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._in_svg = False
        elif tag == "figure":
            self._fig = None
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._fig and self._in_svg and self._in_title:
            self.charts[self._fig]["titles"].append(data)


def charts_of(page: str) -> dict[str, dict[str, Any]]:
    p = _Charts()
    p.feed(page)
    return p.charts


def assert_drawn(charts: dict[str, dict[str, Any]], chart_id: str, mark: str, at_least: int = 1) -> dict[str, Any]:
    """The chart is there: one SVG with role img, a non-empty aria-label, and ``at_least`` ``mark`` elements."""
    assert chart_id in charts, f"{chart_id} not drawn; charts: {sorted(charts)}"
    c = charts[chart_id]
    assert c["svgs"] == 1 and c["role"] == "img", c
    assert c["aria"] and c["aria"].strip(), c
    assert c["tags"].get(mark, 0) >= at_least, (chart_id, c["tags"])
    return c


# -- tests -------------------------------------------------------------------------------------


def test_comm_matrix_is_drawn_from_the_matrix_table() -> None:
    """The canonical rows of tests/rules/fixtures_cluster.slow_link: two HCCS rings of 100 MB per
    link in 5.5 ms (18.18 GB/s), 5 -> 6 in 16.5 ms (6.06 GB/s); four RDMA links at 2 GB/s; LOCAL
    self-links, which are no link between ranks."""
    from advisor.analyze import analyze_context
    from advisor.render import html
    from advisor.testing import context_from_tables
    from tests.rules.fixtures_cluster import slow_link

    report = analyze_context(context_from_tables(slow_link()))
    data = report_json(report)
    links = {(r["src"], r["dst"]): r for r in data["comm_matrix"]}
    assert len(links) == 12 and all(s != d for s, d in links)
    assert links[(5, 6)]["bandwidth_gbps"] == pytest.approx(100e6 / 16.5e6, rel=1e-3)
    assert links[(0, 1)]["bandwidth_gbps"] == pytest.approx(100e6 / 5.5e6, rel=1e-3)
    assert links[(0, 4)] == {"src": 0, "dst": 4, "bytes": 100_000_000, "time_us": 50_000.0, "bandwidth_gbps": 2.0,
                             "transport": "RDMA"}
    charts = charts_of(html.render(report))
    c = assert_drawn(charts, "chart-comm", "rect", at_least=12)
    assert c["tags"]["rect"] == 12 and "bandwidth (GB/s)" in c["aria"]
    assert any(t.startswith("rank 5 → rank 6: 6.06 GB/s, 95.4 MiB, 16.50 ms transit, HCCS") for t in c["titles"])


@pytest.mark.slow
def test_comm_matrix_is_drawn_from_the_ascend_matrix(tmp_path: Path) -> None:
    from advisor.analyze import analyze
    from advisor.render import html

    facts = write_ascend_cluster(tmp_path / "faults8")
    report = analyze(tmp_path / "faults8")
    data = report_json(report)
    links = {(r["src"], r["dst"]): r for r in data["comm_matrix"]}
    assert all(s != d for s, d in links)  # local links left out
    src, dst = facts.slow_link
    slow = links[(src, dst)]
    # the planted slow link: the slowest HCCS link that moves real data, ~1/8 of its peers
    # (the generator divides its bandwidth by slow_link_factor = 8; latency makes it a little faster)
    big_hccs = [r for r in links.values() if r["transport"] == "HCCS" and r["bytes"] >= 1 << 20 and r is not slow]
    assert big_hccs
    assert all(r["bandwidth_gbps"] > slow["bandwidth_gbps"] for r in big_hccs)
    assert max(r["bandwidth_gbps"] for r in big_hccs) / slow["bandwidth_gbps"] == pytest.approx(8.0, rel=0.05)
    assert slow["bandwidth_gbps"] == pytest.approx(slow["bytes"] / (slow["time_us"] * 1e3), rel=1e-3)

    charts = charts_of(html.render(report))
    c = assert_drawn(charts, "chart-comm", "rect", at_least=len(links))
    assert "communication matrix" in c["aria"] and "GB/s" in c["aria"]
    assert any(t.startswith(f"rank {src} → rank {dst}: ") and "HCCS" in t for t in c["titles"])
    assert "chart-roofline" not in charts  # no CMP001 finding, no roofline
    assert_drawn(charts, "chart-series", "polyline")
    assert_drawn(charts, "chart-breakdown", "rect")


def test_roofline_is_drawn_from_the_roofline_rule(tmp_path: Path) -> None:
    from advisor.analyze import analyze
    from advisor.render import html

    write_gpu_roofline_trace(tmp_path / "gpu")
    report = analyze(tmp_path / "gpu")
    data = report_json(report)
    assert "comm_matrix" not in data
    rows = {t["op"]: t for f in data["findings"] if f["rule"] == "CMP001" for t in f["top"]}
    assert set(rows) == {"aten::mm", "aten::add", "aten::addmm"}
    charts = charts_of(html.render(report))
    c = assert_drawn(charts, "chart-roofline", "circle", at_least=3)
    assert "roofline" in c["aria"]
    assert c["tags"].get("polyline", 0) >= 2  # the fp16 and fp32 roofs
    addmm = next(t for t in c["titles"] if t.startswith("aten::addmm"))
    assert "54.98 TFLOP/s" in addmm  # 1.0995e12 FLOP / 20 ms = 54.976 TFLOP/s
    add = next(t for t in c["titles"] if t.startswith("aten::add "))
    assert "intensity 0.12" in add  # 2^26 FLOP / 2^29 B (inputs only) = 0.125 FLOP/B
    assert any("fp16 roof: 312 TFLOP/s" in t for t in c["titles"])
    assert "chart-comm" not in charts


def _rows(ranks: int, steps: int, step_us: float = 34_000.0) -> list[dict[str, Any]]:
    return [{"rank": r, "step": s, "step_us": step_us + 10.0 * r + 5.0 * s, "compute_only_us": step_us / 2}
            for r in range(ranks) for s in range(1, steps + 1)]


def test_step_series_tells_ranks_apart_and_clips_an_outlier() -> None:
    from advisor.render.charts import step_series

    rows = _rows(3, 10)
    rows[4]["step_us"] = 4_500_000.0  # rank 0, step 5
    c = step_series(rows, set())
    assert c is not None
    assert c["coloured"] and [x["label"] for x in c["legend"]] == ["rank 0", "rank 1", "rank 2"]
    assert len({x["cls"] for x in c["lines"]}) == 3
    assert c["yticks"][-1]["label"] == "40 ms"  # 34 ms steps fill the axis; not 5 s
    assert [(m["step"], m["label"]) for m in c["clipped"]] == [(5, "4.50 s")]
    assert c["clipped"][0]["y"] == c["top"]

    # a steady run: no clipping, the axis holds the largest step
    c = step_series(_rows(3, 10), set())
    assert c is not None and not c["clipped"] and c["yticks"][-1]["label"] == "40 ms"


def test_step_series_of_many_ranks_is_a_band() -> None:
    from advisor.render.charts import step_series

    c = step_series(_rows(12, 5), set())
    assert c is not None and not c["coloured"]
    assert c["band"] is not None and [x["title"] for x in c["lines"]] == ["median over 12 ranks"]
    assert len(c["band"]["points"].split()) == 2 * 5  # the max edge and back along the min edge


def test_evidence_tables_show_human_names_and_units() -> None:
    from advisor.model import Finding, Report, Severity
    from advisor.render import html

    f = Finding(rule="CPU002", cause="cpu.dispatch", severity=Severity.HIGH, title="t",
                evidence={"total_us": 2550.0, "calls": 1234.0, "peak_gbps": 2039.0, "time_share": 0.5,
                          "time_us_per_step": 20000.0, "min_calls": 10.0},
                top=({"op": "aten::x", "count": 1500.0, "total_us": 2550.0},))
    rep = Report(tool_version="t", profile={"path": "p"}, breakdown=[], critical_path={}, findings=[f])
    page = html.render(rep)
    for label, value in (("total", "2.55 ms"), ("calls", "1,234"), ("peak bandwidth", "2,039.0 GB/s"),
                         ("time share", "50.0%"), ("time per step", "20.00 ms"), ("min calls", "10")):
        assert f">{label}</td><td class=\"num\"" in page, label
        assert f">{value}</td>" in page, value
    assert ">total_us<" not in page and ">1,234.0<" not in page
    assert '<th title="count">count</th><th title="total_us">total</th>' in page
    assert ">1,500</td>" in page


def test_evidence_value_keeps_ratios_and_units() -> None:
    from advisor.render.html import evidence_label, evidence_value

    assert evidence_value("time_share", 1.0) == "100.0%"  # a whole-number ratio is no count
    assert evidence_value("count", 3.0) == "3" and evidence_value("steps", 12) == "12"
    assert evidence_value("wait_bytes", 1048576) == "1.0 MiB" and evidence_label("wait_bytes") == "wait size"
    assert evidence_value("ridge_flop_per_byte", 153.0) == "153.0 FLOP/B" and evidence_label("ridge_flop_per_byte") == "ridge"
    assert evidence_value("device", "A100") == "A100"


def test_no_data_no_chart() -> None:
    """A profile without steps across ranks, links or roofline rows draws none of those charts (no empty frames)."""
    from advisor.render import charts

    assert charts.comm_matrix({}) is None
    assert charts.comm_matrix({"comm_matrix": []}) is None
    assert charts.comm_matrix({"comm_matrix": [{"src": 0, "dst": 1, "bandwidth_gbps": None}]}) is None
    assert charts.roofline([{"rule": "CMP001", "evidence": {"peak_tflops": 312.0, "peak_gbps": 2039.0}, "top": []}]) is None
    assert charts.step_series(_rows(2, 1), set()) is None
