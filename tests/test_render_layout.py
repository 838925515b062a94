"""Layout of the HTML report that a browser need not check: column labels and the classes that
decide what wraps (issue 32). The page-width check itself is the browser test
``test_the_page_never_scrolls_sideways``."""

from __future__ import annotations

from advisor.render import html


def test_a_time_column_beside_its_namesake_says_time() -> None:
    """CLU003's top rows hold ``step`` and ``step_us``: the header read "step | step"."""
    assert html.evidence_labels(["rank", "step", "step_us", "excess_us"]) == {
        "rank": "rank", "step": "step", "step_us": "step time", "excess_us": "excess"}
    assert html.evidence_labels(["total_us", "count"]) == {"total_us": "total", "count": "count"}
    view = html.finding_view({"top": [{"rank": 1, "step": 2, "step_us": 10.0}], "evidence": {}}, None)
    assert view["top_labels"] == ["rank", "step", "step time"]


def test_text_evidence_wraps_and_numbers_do_not() -> None:
    view = html.finding_view({"evidence": {"slow_steps_extra": "aten::mm 5.7 ms per slow step " * 10,
                                           "total_us": 12.5, "flag": True}}, None)
    cls = {r["key"]: r["cls"] for r in view["measured"]}
    assert cls == {"slow_steps_extra": "text", "total_us": "num", "flag": "text"}
