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
from tests.rules.fixtures_cpu import BASE, DEV, MS, STEP_NS, _ev, _steps

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


def _sync_then_gc(gc_right_after_sync: bool) -> dict[str, list[dict[str, Any]]]:
    """Three 10 ms steps; each kernel launched by a 50 µs ``cudaLaunchKernel`` (same correlation id) and
    starting 0.1 ms after its launch; the host blocks in ``cudaStreamSynchronize`` from 0.1 ms until k1 ends.

    * ``gc_right_after_sync``: k1 0.1-4 ms, then a 2 ms ``Python GC`` (4-6 ms, the device idle), then k2
      launched at 6 ms, running 6.1-9.9 ms.
    * otherwise: k1 0.1-3 ms, 2 ms of ``aten::add`` (3-5 ms), k2 launched at 5 ms (5.1-6 ms), a 2 ms GC
      (6-8 ms), k3 launched at 8 ms (8.1-9.9 ms).
    """
    ev = _steps(3)
    corr = 0
    for i in range(3):
        t = BASE + i * STEP_NS

        def launch(at: int, name: str, dur: int, t: int = t) -> list[dict[str, Any]]:
            nonlocal corr
            corr += 1
            return [_ev("runtime", "cudaLaunchKernel", t + at, 50_000, corr=corr),
                    _ev("kernel", name, t + at + 100_000, dur, DEV, corr=corr)]

        if gc_right_after_sync:
            ev += launch(0, "k1", 3_900_000)
            ev += [_ev("sync", "cudaStreamSynchronize", t + 100_000, 3_900_000),
                   _ev("python", "Python GC", t + 4 * MS, 2 * MS, cat="python_function")]
            ev += launch(6 * MS, "k2", 3_800_000)
        else:
            ev += launch(0, "k1", 2_900_000)
            ev += [_ev("sync", "cudaStreamSynchronize", t + 100_000, 2_900_000),
                   _ev("host_op", "aten::add", t + 3 * MS, 2 * MS),
                   _ev("python", "Python GC", t + 6 * MS, 2 * MS, cat="python_function")]
            ev += launch(5 * MS, "k2", 900_000)
            ev += launch(8 * MS, "k3", 1_800_000)
    return {"events": ev}


def test_a_gc_pause_the_sync_waits_behind_explains_it_by_replay() -> None:
    """GC right after the sync, the device idle behind both. The sync's change (the host does not wait): the
    GC runs 0.1-2.1 ms, k2 still follows k1 on its stream (4-7.8 ms): 2.1 ms saved (the step ends 0.1 ms
    after the last kernel). The GC removed: k2 launched at 4 ms, 2 ms saved. Both: k2 still at 4 ms, 2.1 ms:
    once the GC is gone 0.1 of the sync's 2.1 ms is left, under half: the GC explains the sync."""
    rep = analyze_context(context_from_tables(_sync_then_gc(True)))
    f = _by_rule(rep)
    assert f["CPU003"].estimated_saving_us == pytest.approx(2100, abs=5)
    assert f["CPU004"].estimated_saving_us == pytest.approx(2000, abs=5)
    assert f["CPU003"].explained_by == (f["CPU004"].id,)
    text = f["CPU003"].evidence["explained_by_replay"]
    assert "100.000 µs of this finding's 2100.000 µs" in text and text.endswith("explained")


def test_two_independent_delays_are_not_linked_by_replay() -> None:
    """The sync's change: aten::add runs 0.1-2.1 ms, over k1; the GC and k3's launch follow 2.9 ms earlier
    (k3 at 5.2 ms, after k2 at 3-3.9 ms): 2.9 ms saved. The GC removed: 2 ms. Both: k3 launched at 3.1 ms
    waits for k2 (ends 3.9 ms), runs 3.9-5.7 ms: 4.2 ms saved, so 2.2 of the sync's 2.9 ms is left after the
    GC's change: not explained, although the rule's saving test alone (2 ms ≥ half of 2.9 ms, same rank and
    steps) links them."""
    from advisor.engine import chain

    rep = analyze_context(context_from_tables(_sync_then_gc(False)))
    f = _by_rule(rep)
    assert f["CPU003"].estimated_saving_us == pytest.approx(2900, abs=5)
    assert f["CPU004"].estimated_saving_us == pytest.approx(2000, abs=5)
    assert f["CPU004"].id not in f["CPU003"].explained_by
    assert "2200.000 µs of this finding's 2900.000 µs" in f["CPU003"].evidence["explained_by_replay"]
    assert "not explained" in f["CPU003"].evidence["explained_by_replay"]
    unmeasured = {x.rule: x for x in chain.link(rep.findings)}
    assert unmeasured["CPU003"].explained_by == (f["CPU004"].id,)
    comb = rep.savings["combined"]
    assert comb["estimated"] is True and comb["saving_us"] == pytest.approx(4200, abs=5)
    assert max(comb["parts_us"].values()) <= comb["saving_us"] <= sum(comb["parts_us"].values())
