"""A finding another one explains is marked so in every renderer's findings table: on the gloo
slow-rank sample, COM001 (the collectives wait for rank 1) sits above its root CLU001 (rank 1 is
the straggler, the verdict) by saving, and its row says "explained by CLU001, the verdict"."""

from __future__ import annotations

import re

import pytest

from advisor.analyze import analyze
from advisor.render import html, markdown, terminal
from advisor.render.view import explained_note
from tests.conftest import ROOT, report_json

GLOO = ROOT / "sample_profiles" / "kineto_gloo_slow_rank"


@pytest.fixture(scope="module")
def data() -> dict:
    return report_json(analyze(GLOO))


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


def test_a_narrowed_report_says_what_each_part_covers() -> None:
    """kineto_two_ranks holds ranks 0 and 1, steps 551 and 552. With --rank 1 --step 551 the breakdown
    is that one row, while the verdict and PAR001 ("on 2 ranks") speak for the whole profile: every
    renderer says so."""
    from tests.conftest import validate_report

    data = report_json(analyze(ROOT / "sample_profiles" / "kineto_two_ranks", rank=1, step=551))
    validate_report(data)
    assert [(b["rank"], b["step"]) for b in data["breakdown"]] == [(1, 551)]
    assert data["profile"]["narrowed_to"] == {"rank": 1, "step": 551}
    whole = "cover the whole profile: 2 ranks (0–1), 2 steps (551–552)"
    assert whole in terminal.render_text(data, width=400)
    assert whole in markdown.render(data)
    assert whole in html.render(data)
    plain = report_json(analyze(ROOT / "sample_profiles" / "kineto_two_ranks"))
    assert plain["profile"]["narrowed_to"] is None
    assert "Narrowed to" not in terminal.render_text(plain, width=400)
