"""``advisor render REPORT.json``: an earlier JSON report re-renders with nothing else, to the same
text as the direct render of the analysis it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor import cli
from advisor.model import Report
from tests.conftest import TRACES, report_json

GLOO = TRACES / "gloo_slow_rank"  # findings from several rules (their docs are embedded)

_REPORT: list[Report] = []


def _report() -> Report:
    if not _REPORT:
        from advisor.analyze import analyze

        _REPORT.append(analyze(GLOO))
    return _REPORT[0]


def _round_trip(report: Report) -> dict[str, Any]:
    from advisor.render.json import render

    return dict(json.loads(render(report)))


def test_a_json_report_renders_like_its_report() -> None:
    from advisor.render import html, markdown, terminal

    rep = _report()
    d = _round_trip(rep)
    report_json(rep)
    assert d["findings"], "the sample has findings (their rules' documentation goes with them)"
    assert html.render(d) == html.render(rep)
    assert markdown.render(d) == markdown.render(rep)
    assert markdown.render(d, full=True) == markdown.render(rep, full=True)
    assert terminal.render_text(d, verbose=True, width=120) == terminal.render_text(rep, verbose=True, width=120)


def test_rule_docs_are_the_explain_text_of_the_rules_with_findings() -> None:
    from advisor.engine.registry import discover
    from advisor.render.docs import rule_markdown

    rep = _report()
    rules = {f.rule for f in rep.findings}
    assert set(rep.rule_docs) == rules
    specs = discover()
    for rid in rules:
        assert rep.rule_docs[rid] == rule_markdown(specs[rid])
    d = _round_trip(rep)
    assert d["rule_docs"] == rep.rule_docs


def test_an_old_report_without_rule_docs_still_renders() -> None:
    from advisor.render import html, markdown

    d = _round_trip(_report())
    del d["rule_docs"]
    page = html.render(d)
    assert "<html" in page
    text = markdown.render(d, full=True)
    assert "## Cause `" not in text and d["findings"][0]["title"][:40] in text


def test_render_command_writes_each_format(tmp_path: Path) -> None:
    from advisor.render import html, markdown

    rep = _report()
    src = tmp_path / "r.json"
    src.write_text(json.dumps(_round_trip(rep)), encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(cli.main, ["render", str(src), "--format", "html", "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == html.render(rep)
    res = runner.invoke(cli.main, ["render", str(src), "--out", str(tmp_path / "r.md")])  # the extension says md
    assert res.exit_code == 0 and (tmp_path / "r.md").read_text(encoding="utf-8") == markdown.render(rep)
    res = runner.invoke(cli.main, ["render", str(src), "--format", "md", "--md-full"])
    assert res.exit_code == 0 and res.output == markdown.render(rep, full=True)
    res = runner.invoke(cli.main, ["render", str(src), "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output) == _round_trip(rep)
    res = runner.invoke(cli.main, ["render", str(src)])
    assert res.exit_code == 0 and "Verdict:" in res.output
    res = runner.invoke(cli.main, ["render", str(src), "--format", "json", "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 2 and "means --format html" in res.output


def test_render_command_links_the_overlay_it_writes(tmp_path: Path) -> None:
    """``render r.json --out r.html --out r.overlay.json``: the overlay is written and the page
    links it (relative to the page); the page without it is the plain render."""
    from advisor.render import html
    from advisor.render.overlay import overlay_events

    rep = _report()
    src = tmp_path / "r.json"
    src.write_text(json.dumps(_round_trip(rep)), encoding="utf-8")
    res = CliRunner().invoke(cli.main, ["render", str(src), "--out", str(tmp_path / "r.html"),
                                        "--out", str(tmp_path / "r.overlay.json")])
    assert res.exit_code == 0, res.output
    assert f"wrote {tmp_path / 'r.overlay.json'}" in res.output
    assert json.loads((tmp_path / "r.overlay.json").read_text(encoding="utf-8")) == overlay_events(_round_trip(rep))
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert '<a class="overlay-link" href="r.overlay.json">r.overlay.json</a>' in page
    assert page == html.render(rep, overlay={"href": "r.overlay.json", "name": "r.overlay.json"})


@pytest.mark.parametrize(("content", "problem"), [
    (None, "no such file"),
    ("{", "not a readable JSON file"),
    ('{"traceEvents": []}', "not an advisor JSON report"),
    ('{"schema": "other/v9", "breakdown": [], "findings": []}', "report schema 'other/v9'"),
    ('{"schema": "advisor.report/v1"}', "lacks 'breakdown' or 'findings'"),
])
def test_render_command_refuses_what_is_not_a_report(tmp_path: Path, content: str | None, problem: str) -> None:
    src = tmp_path / "r.json"
    if content is not None:
        src.write_text(content, encoding="utf-8")
    res = CliRunner().invoke(cli.main, ["render", str(src), "--format", "html"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"advisor: {src}: ") and problem in lines[0], res.output
