"""A finding another one explains is marked so in every renderer's findings table: on the gloo
slow-rank sample, COM001 (the collectives wait for rank 1) sits above its root CLU001 (rank 1 is
the straggler, the verdict) by saving, and its row says "explained by CLU001, the verdict"."""

from __future__ import annotations

import re

import pytest

from advisor.analyze import analyze
from advisor.render import html, markdown, terminal
from advisor.render.view import explained_note, verdict
from tests.conftest import ROOT, profile_group, report_json, shared_report

GLOO = ROOT / "sample_profiles" / "kineto_gloo_slow_rank"
TWO_RANKS = ROOT / "sample_profiles" / "kineto_two_ranks"


@pytest.fixture(scope="module")
def data() -> dict:
    return report_json(shared_report(GLOO))


@profile_group(GLOO)
def test_the_explained_finding_is_marked_in_every_table(data: dict) -> None:
    rules = [f["rule"] for f in data["findings"]]
    assert rules.index("COM001") < rules.index("CLU001")  # the explained finding comes first by saving
    clu = next(f for f in data["findings"] if f["rule"] == "CLU001")
    com = next(f for f in data["findings"] if f["rule"] == "COM001")
    assert com["explained_by"] == [clu["id"]] and clu["root"]
    note = "explained by CLU001, the verdict"
    assert explained_note(com, data["findings"], clu["id"]) == note
    assert explained_note(clu, data["findings"], clu["id"]) == ""

    md = markdown.render(data)
    (row,) = [ln for ln in md.splitlines() if ln.startswith("| **") and "| COM001 |" in ln]
    assert note in row
    assert not any(note in ln for ln in md.splitlines() if ln.startswith("| **") and "| COM001 |" not in ln)

    page = html.render(data)
    table = page[page.index('id="findings-table"'):page.index("</table>", page.index('id="findings-table"'))]
    rows = re.findall(r"<tr>.*?</tr>", table, flags=re.DOTALL)
    marked = [r for r in rows if note in r]
    assert len(marked) == 1 and ">COM001<" in marked[0]

    text = terminal.render_text(data, width=200)
    findings = text[text.index("Findings ("):text.index("Critical path")]
    assert findings.count(note) == 1
    assert findings.index("COM001") < findings.index(note) < findings.index("CLU001")


def _row(data: dict, rank: int, step: int) -> dict:
    return next(b for b in data["breakdown"] if (b["rank"], b["step"]) == (rank, step))


def test_narrowing_keeps_the_ranks_own_findings_first_and_marks_the_rest() -> None:
    """Hand-built: findings on rank 1 alone, on ranks 0 and 1, on rank 0, on no rank in particular,
    and one naming steps 2-3 only. Narrowed to rank 1, step 5: rank 1's own first, then the two
    cluster-wide ones marked; rank 0's and the one of other steps left out. The verdict's share is
    of the scope's step (1000 / 4000 µs = 25%), and it says when it is cluster-wide."""
    import pandas as pd

    from advisor.model import Finding, Severity
    from advisor.pipeline.report import narrow_findings, narrowed_scope
    from advisor.render.view import scope_line

    def f(rule: str, ranks: tuple[int, ...], steps: tuple[int, ...] = (5,)) -> Finding:
        return Finding(rule=rule, cause="compute.x", severity=Severity.HIGH, title=rule, evidence={},
                       ranks=ranks, steps=steps, estimated_saving_us=1000.0)

    got = narrow_findings([f("A", (0, 1)), f("B", (1,)), f("C", (0,)), f("D", ()), f("E", (1,), (2, 3))], 1, 5)
    assert [(x.rule, x.scope) for x in got] == [("B", ""), ("A", "cluster-wide"), ("D", "cluster-wide")]
    assert [x.rule for x in narrow_findings([f("A", (0, 1)), f("E", (1,), (2, 3))], None, 5)] == ["A"]
    bd = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [4, 5, 4, 5], "step_us": [3000.0, 3500.0, 2000.0, 4000.0]})
    matrix = {"steps": [4, 5], "median_own_us": 2000.0,
              "rows": [{"label": "rank 0", "ranks": "0", "cells": [0.9, 1.0]},
                       {"label": "rank 1", "ranks": "1", "cells": [1.1, 1.5]}]}
    scope = narrowed_scope(bd, 1, 5, [0, 1], [4, 5], matrix)
    assert scope is not None
    assert (scope["step_us"], scope["step_basis"]) == (4000.0, "rank 1's step 5")
    assert scope["cells"] == [{"rank": 1, "step": 5, "slowdown": 1.5}]
    assert narrowed_scope(bd, 1, None, [0, 1], [4, 5], matrix)["step_us"] == 3000.0  # type: ignore[index]  # median
    assert narrowed_scope(bd, None, 5, [0, 1], [4, 5], matrix)["step_us"] == 4000.0  # type: ignore[index]  # slowest
    assert narrowed_scope(bd, None, None, [0, 1], [4, 5], matrix) is None
    d = {"profile": {"narrowed_to": scope, "ranks": [0, 1], "steps": [4, 5]}, "step_matrix": matrix,
         "findings": [{"id": "w", "rule": "A", "cause": "compute.x", "severity": "high", "title": "A",
                       "estimated_saving_us": 1000.0, "saving_fraction": 0.3, "scope": "cluster-wide"}]}
    v = verdict(d)
    assert v["saving_fraction"] == 0.25 and "(25% of rank 1's step 5, 4.00 ms)" in v["text"]
    assert v["text"].endswith("(cluster-wide, not narrowed)")
    assert explained_note(d["findings"][0], d["findings"]) == "cluster-wide, not narrowed"
    gone = {**d["findings"][0], "explained_by": ["CLU001-d973a371"]}  # its explainer narrowed out
    assert explained_note(gone, [gone]) == ("explained by CLU001 (outside this narrowed report); "
                                            "cluster-wide, not narrowed")
    assert scope_line(d) == ("Ranks x steps narrowed to rank 1 (one of 2 ranks), step 5 (one of 2 steps): own time "
                             "1.50x the median of all cells (2.00 ms)")
    assert scope_line({**d, "step_matrix": None}) == "Narrowed to rank 1 (one of 2 ranks), step 5 (one of 2 steps)"
    # the slow steps a cluster-wide fluctuation finding lists: those of the scope only
    from advisor.render.view import SLOW_STEP_RULE, slow_steps

    fluct = {"rules": [{"rule": SLOW_STEP_RULE, "status": "ran"}],
             "findings": [{"rule": SLOW_STEP_RULE, "top": [{"rank": 0, "step": 2}, {"rank": 1, "step": 2},
                                                           {"rank": 1, "step": 5}]}]}
    assert slow_steps({**fluct, "profile": {"narrowed_to": {"rank": 1, "step": None}}})[0] == {(1, 2), (1, 5)}
    assert slow_steps({**fluct, "profile": {"narrowed_to": {"rank": None, "step": 2}}})[0] == {(0, 2), (1, 2)}
    assert len(slow_steps({**fluct, "profile": {}})[0]) == 3


@pytest.mark.slow  # one analysis and three renders (~3 s)
@profile_group(GLOO)
def test_a_narrowed_report_is_narrowed_throughout(data: dict) -> None:
    """gloo, --rank 1 --step N (N: the profile's fourth step): every figure the narrowed report
    gives for its scope is derived here from the whole report's per-rank / per-step data."""
    from tests.conftest import validate_report

    n = data["profile"]["steps"][3]
    nar = report_json(analyze(GLOO, rank=1, step=n))
    validate_report(nar)
    row = _row(data, 1, n)
    assert [(b["rank"], b["step"]) for b in nar["breakdown"]] == [(1, n)]
    scope = nar["profile"]["narrowed_to"]
    assert (scope["rank"], scope["step"]) == (1, n)
    assert (scope["ranks_total"], scope["steps_total"]) == (len(data["profile"]["ranks"]), len(data["profile"]["steps"]))
    assert scope["step_us"] == pytest.approx(row["step_us"], abs=1e-3)
    # the findings naming rank 1 and step N: rank 1's own first, the others marked cluster-wide
    named = [f for f in data["findings"] if (not f["ranks"] or 1 in f["ranks"]) and (not f["steps"] or n in f["steps"])]
    own = [f["id"] for f in named if f["ranks"] == [1]]
    wide = [f["id"] for f in named if f["ranks"] != [1]]
    assert own and wide  # the sample has both: CLU001 (rank 1 the straggler), COM001 (the group's wait)
    assert [f["id"] for f in nar["findings"]] == own + wide
    assert [f.get("scope") for f in nar["findings"]] == [None] * len(own) + ["cluster-wide"] * len(wide)
    # the verdict: rank 1's own root with the largest saving, its share of rank 1's step N
    roots = [f for f in data["findings"] if f["id"] in own and f["root"]]
    top = max(roots, key=lambda f: f["estimated_saving_us"])
    v = verdict(nar)
    assert v["finding_id"] == top["id"]
    assert v["saving_fraction"] == pytest.approx(top["estimated_saving_us"] / row["step_us"])
    share = f"{100 * top['estimated_saving_us'] / row['step_us']:.0f}% of rank 1's step {n}"
    assert f"({share}" in v["text"]
    # the ranks x steps line: the scope among the profile's ranks and steps, and its one cell
    sm = data["step_matrix"]
    cell = next(r for r in sm["rows"] if r["label"] == "rank 1")["cells"][sm["steps"].index(n)]
    line = (f"rank 1 (one of {len(data['profile']['ranks'])} ranks), step {n} (one of {len(data['profile']['steps'])} "
            f"steps): own time {cell:.2f}x")
    mark = "cluster-wide, not narrowed"
    text, md, page = terminal.render_text(nar, width=400), markdown.render(nar), html.render(nar)
    for out in (text, md, page):
        assert line in out and share in out.replace("&#39;", "'")
        assert "the ranks x steps picture covers the whole profile: 2 ranks (0–1)" in out
    findings = text[text.index("Findings ("):text.index("Critical path")]
    assert findings.count(mark) == len(wide)
    assert sum(mark in ln for ln in md.splitlines() if ln.startswith("| **")) == len(wide)
    table = page[page.index('id="findings-table"'):page.index("</table>", page.index('id="findings-table"'))]
    assert table.count(mark) == len(wide)
    assert "Narrowed to" not in terminal.render_text(data, width=400) and data["profile"]["narrowed_to"] is None


@pytest.mark.slow  # two analyses of the two-rank sample (~6 s)
@profile_group(TWO_RANKS)
def test_rank_narrowing_on_two_ranks_takes_the_ranks_own_verdict() -> None:
    """kineto_two_ranks, --rank 1: CPU007 of rank 0 is left out, PAR001 ("on 2 ranks") is kept
    marked cluster-wide, and the verdict is rank 1's own CPU007 with its share of rank 1's median
    step (the median of its rows in the whole report's breakdown)."""
    import statistics

    from tests.conftest import validate_report

    whole = report_json(shared_report(TWO_RANKS))
    nar = report_json(analyze(ROOT / "sample_profiles" / "kineto_two_ranks", rank=1))
    validate_report(nar)
    med = statistics.median(b["step_us"] for b in whole["breakdown"] if b["rank"] == 1 and b["step"] is not None)
    assert nar["profile"]["narrowed_to"]["step_us"] == pytest.approx(med, abs=1e-3)
    rules = {(f["rule"], tuple(f["ranks"])): f for f in whole["findings"]}
    own = rules[("CPU007", (1,))]
    assert ("CPU007", (0,)) in rules and ("PAR001", (0, 1)) in rules
    got = [(f["rule"], f["ranks"], f.get("scope")) for f in nar["findings"]]
    assert ("CPU007", [1], None) in got and ("PAR001", [0, 1], "cluster-wide") in got
    assert ("CPU007", [0], None) not in got and got[0][2] is None
    v = verdict(nar)
    assert v["finding_id"] == own["id"]
    assert f"({100 * own['estimated_saving_us'] / med:.0f}% of rank 1's median step" in v["text"]
    text = terminal.render_text(nar, width=400)
    assert "Ranks x steps narrowed to rank 1 (one of 2 ranks): slowest cells rank 1 step" in text
    assert "step 551" in text and "step 552" in text
