""""Fix these three" (advisor.engine.combined): the top root findings' changes replayed together on each
rank, never their savings summed. Figures computed by hand from the planted traces."""

from __future__ import annotations

import json
from typing import Any

import pytest

from advisor.analyze import analyze_context
from advisor.engine import combined as C
from advisor.stages import replay as R
from advisor.testing import context_from_tables
from tests.rules.fixtures_cpu import BASE, MS, STEP_NS, _ev, _steps

LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _loop(gc_inside_loader: bool) -> dict[str, list[dict[str, Any]]]:
    """Three CPU-only 10 ms steps on one thread: the batch fetched 0.01-4.01 ms (``__next__``), a 2 ms
    ``Python GC`` pause, then 1 ms of ``aten::linear`` at 7 ms. The GC runs at 5-7 ms (after the fetch:
    a second delay on the same thread) or, with ``gc_inside_loader``, at 1-3 ms inside the fetch."""
    ev = _steps(3)
    for i in range(3):
        t = BASE + i * STEP_NS
        gc_at = t + (1 * MS if gc_inside_loader else 5 * MS)
        ev += [_ev("dataloader", LOADER, t + 10_000, 4 * MS),
               _ev("python", "Python GC", gc_at, 2 * MS, cat="python_function"),
               _ev("host_op", "aten::linear", t + 7 * MS, 1 * MS)]
    return {"events": ev}


def _report(gc_inside_loader: bool) -> Any:
    return analyze_context(context_from_tables(_loop(gc_inside_loader)))


def _by_rule(rep: Any) -> dict[str, Any]:
    return {f.rule: f for f in rep.findings}


def test_two_delays_one_after_the_other_save_their_sum() -> None:
    """Fetch (4 ms) and GC (2 ms) follow each other on the step's only thread: each alone moves the rest of
    the step earlier by its length, together by both: 6 ms = 4 + 2."""
    rep = _report(False)
    f = _by_rule(rep)
    assert {"IO001", "CPU004"} <= set(f)
    assert f["IO001"].estimated_saving_us == pytest.approx(4000, abs=5)
    assert f["CPU004"].estimated_saving_us == pytest.approx(2000, abs=5)
    comb = rep.savings["combined"]
    assert comb["estimated"] is True and comb["basis"] == "replayed"
    assert set(comb["replayed"]) == {f["IO001"].id, f["CPU004"].id}
    assert comb["saving_us"] == pytest.approx(6000, abs=5)
    assert comb["parts_us"] == {"IO001": pytest.approx(4000, abs=5), "CPU004": pytest.approx(2000, abs=5)}
    assert comb["rank"] == 0 and comb["per_rank"][0]["steps_replayed"] == 3
    from advisor.render.json import report_dict
    from tests.conftest import validate_report

    validate_report(json.loads(json.dumps(report_dict(rep))))


def test_two_causes_of_the_same_time_save_less_than_their_sum() -> None:
    """The GC pause (2 ms) runs inside the fetch (4 ms): removing the fetch removes it too. Alone they save
    4 and 2 ms; together 4 ms, not 6."""
    rep = _report(True)
    f = _by_rule(rep)
    assert {"IO001", "CPU004"} <= {x.rule for x in rep.findings}
    comb = rep.savings["combined"]
    assert comb["estimated"] is True
    assert comb["parts_us"]["IO001"] == pytest.approx(4000, abs=5)
    assert comb["parts_us"]["CPU004"] == pytest.approx(2000, abs=5)
    assert comb["saving_us"] == pytest.approx(4000, abs=5)
    assert f["IO001"].id in comb["findings"]


def test_one_finding_with_a_change_keeps_the_summed_figure_said_to_be() -> None:
    """Only the fetch (no GC): one root with a change, nothing to replay together; today's total, marked."""
    ev = [e for e in _loop(False)["events"] if e["name"] != "Python GC"]
    rep = analyze_context(context_from_tables({"events": ev}))
    comb = rep.savings["combined"]
    assert comb["estimated"] is False and comb["basis"] == "summed" and comb["reason"]
    assert comb["saving_us"] == rep.savings["total_saving_us"]


def test_combine_on_a_real_trace_lies_between_the_largest_part_and_their_sum() -> None:
    """The recorded CPU trace with GC pressure (tests/data/kineto/cpu_python_gc): its own GC counterfactual
    (CPU004), the data-loader one (IO001) and the host operators removed, replayed alone and together per step. The replay only removes
    work, so together they save at least the larger part; on one host thread, at most their sum."""
    from advisor.engine.context import load_profile
    from tests.conftest import TRACES

    prof = load_profile(TRACES / "cpu_python_gc")
    cur = prof.con.cursor()
    wins = cur.execute("SELECT rank, step, start_ns, end_ns FROM steps WHERE end_ns > start_ns ORDER BY rank, step").fetchall()
    gs = [g for g in (R.build(cur, r, s, a, b) for r, s, a, b in wins) if g is not None]
    assert gs
    from rules.cpu.cpu004_garbage_collection import COUNTERFACTUAL as gc
    from rules.io.io001_dataloader_wait import COUNTERFACTUAL as loader

    big = (R.Change("remove", R.Select(kinds=("host_op",), device=False)),)  # a third change: the host operators
    out = C.combine_on(gs, {"GC": [(None, gc)], "LOADER": [(None, loader)], "OPS": [(None, big)]})
    assert out["steps_replayed"] >= 1
    sv = out["savings_us"]
    assert sv["GC"] > 0
    for pair in ("GC+LOADER", "GC+OPS", "LOADER+OPS"):
        a, b = pair.split("+")
        assert max(sv[a], sv[b]) - 1e-3 <= sv[pair] <= sv[a] + sv[b] + 1e-3
    assert max(sv["GC+LOADER"], sv["GC+OPS"], sv["LOADER+OPS"]) - 1e-3 <= sv["GC+LOADER+OPS"]
    assert sv["GC+LOADER+OPS"] <= sv["GC"] + sv["LOADER"] + sv["OPS"] + 1e-3


def test_the_headline_is_shown_where_the_verdict_is() -> None:
    """Terminal, Markdown and HTML say the replayed figure of fixing both together (6 ms), not a sum."""
    from advisor.render import html, markdown, terminal

    rep = _report(False)
    for text in (terminal.render_text(rep, width=200), markdown.render(rep), html.render(rep)):
        assert "Fix these two (IO001, CPU004): −6.00 ms per step" in text, text[:3000]
        assert "replayed together on rank 0" in text
    rep = _report(True)
    assert "Fix these two (IO001, CPU004): −4.00 ms per step" in markdown.render(rep)
