""""Fix these three" (advisor.engine.combined): the top root findings' changes replayed together on each
rank, never their savings summed. Figures computed by hand from the planted traces."""

from __future__ import annotations

import dataclasses
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


def test_one_fix_is_its_own_saving_said_to_be_one() -> None:
    """Only the fetch (no GC): one fix, nothing to make together: its own saving (4 ms, the fetch), marked."""
    ev = [e for e in _loop(False)["events"] if e["name"] != "Python GC"]
    rep = analyze_context(context_from_tables({"events": ev}))
    comb = rep.savings["combined"]
    assert comb["estimated"] is False and comb["basis"] == "single" and comb["reason"]
    assert comb["saving_us"] == pytest.approx(4000, abs=5)


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


def _two_ranks(gc_ms: int, joined: bool) -> dict[str, list[dict[str, Any]]]:
    """Two CPU-only ranks, three 10 ms steps each, one thread. Rank 0: the batch fetched 0.01-4.01 ms (4 ms),
    ``aten::linear`` 7-8 ms. Rank 1: a 2 ms fetch (0.01-2.01 ms), a ``gc_ms`` ms ``Python GC`` from 3 ms,
    ``aten::linear`` 7-8 ms. With ``joined`` both ranks end each step with a 1 ms ``gloo:all_reduce``
    (8-9 ms): they wait for each other every step."""
    ev: list[dict[str, Any]] = []
    for rank in (0, 1):
        rows = _steps(3)
        for i in range(3):
            t = BASE + i * STEP_NS
            rows += [_ev("dataloader", LOADER, t + 10_000, (4 if rank == 0 else 2) * MS),
                     _ev("host_op", "aten::linear", t + 7 * MS, 1 * MS)]
            if rank == 1:
                rows.append(_ev("python", "Python GC", t + 3 * MS, gc_ms * MS, cat="python_function"))
            if joined:
                rows.append(_ev("comm", "gloo:all_reduce", t + 8 * MS, 1 * MS))
        ev += [{**r, "rank": rank} for r in rows]
    return {"events": ev}


def test_one_rule_on_two_joined_ranks_is_one_fix_the_slowest_ranks_step() -> None:
    """Each delay moves the rest of its rank's step earlier by its length. Rank 0 without its fetch: 6 ms;
    rank 1 without its fetch 8 ms, without its 2 ms GC too 6 ms. The ranks wait for each other, so the job's
    step is the slower rank's: fixing the loader (both ranks) 10 - max(6, 8) = 2 ms, the GC alone (rank 1)
    10 - max(10, 8) = 0, both 10 - max(6, 6) = 4 ms, where the three findings (4, 2, 2 ms) sum to 8."""
    rep = analyze_context(context_from_tables(_two_ranks(2, joined=True)))
    by = {(f.rule, f.ranks): f for f in rep.findings}
    assert by[("IO001", (0,))].estimated_saving_us == pytest.approx(4000, abs=5)
    assert by[("IO001", (1,))].estimated_saving_us == pytest.approx(2000, abs=5)
    assert by[("CPU004", (1,))].estimated_saving_us == pytest.approx(2000, abs=5)
    comb = rep.savings["combined"]
    assert [(x["rule"], x["ranks"]) for x in comb["fixes"]] == [("IO001", [0, 1]), ("CPU004", [1])]
    assert comb["fixes"][0]["saving_us"] == pytest.approx(2000, abs=5)
    assert comb["fixes"][1]["saving_us"] == pytest.approx(0, abs=5)
    assert comb["estimated"] is True and comb["basis"] == "replayed" and comb["method"] == "slowest_rank"
    assert comb["saving_us"] == pytest.approx(4000, abs=5)
    from advisor.render import markdown
    from advisor.render.json import report_dict
    from tests.conftest import validate_report

    validate_report(json.loads(json.dumps(report_dict(rep))))
    assert "Fix these two (IO001 on ranks 0 and 1; CPU004): −4.00 ms per step" in markdown.render(rep)


def test_ranks_that_do_not_wait_for_each_other_keep_their_own_step() -> None:
    """The same ranks without a collective, rank 1's GC 3 ms: each rank keeps its own step. Rank 0 saves
    4 ms (its fetch), rank 1 2 + 3 = 5 ms: the largest rank's, 5 ms; joined, max(6, 5) would give 4."""
    comb = analyze_context(context_from_tables(_two_ranks(3, joined=False))).savings["combined"]
    assert comb["method"] == "largest_rank" and comb["rank"] == 1
    assert comb["saving_us"] == pytest.approx(5000, abs=5)
    comb = analyze_context(context_from_tables(_two_ranks(3, joined=True))).savings["combined"]
    assert comb["method"] == "slowest_rank" and comb["saving_us"] == pytest.approx(4000, abs=5)


def _finding(rule: str, cause: str, saving: float, ranks: tuple[int, ...] = (0,), **kw: Any) -> Any:
    from advisor.model import Finding

    return Finding(rule=rule, cause=cause, severity=3, title=rule, evidence=kw.pop("evidence", {}), ranks=ranks,
                   estimated_saving_us=saving, **kw)


def _bd(**cols: float) -> Any:
    """One rank, two steps of 10 ms with the given class times (µs) in each."""
    import pandas as pd

    row = {"step_us": 10_000.0, "comm_us": 0.0, "kernel_us": 1.0, "memory_us": 0.0, "compute_only_us": 0.0,
           "overlapped_us": 0.0, "comm_only_us": 0.0, "host_only_us": 0.0, "free_us": 0.0, **cols}
    return pd.DataFrame([{"rank": 0, "step": s, **row} for s in (1, 2)])


def test_fixes_not_replayed_together_give_a_range_never_a_sum() -> None:
    """A replayed host fix (4 ms) and a compute finding without a change (3 ms): at least 4 ms (the larger),
    at most 4 + 3 = 7 ms where the classes' time is larger (host 5 + compute 4 = 9 ms), else that time
    (host 4 + compute 2 = 6 ms)."""
    a = _finding("IO001", "io.dataloader_wait", 4000.0)
    b = _finding("CMP003", "compute.unfused", 3000.0)
    table = {0: {"rules": ["IO001"], "savings_us": {"IO001": 4000.0}, "step_ns": {1: 10_000_000, 2: 10_000_000},
                 "step_savings_ns": {"IO001": {1: 4_000_000, 2: 4_000_000}}, "step_us": 10_000.0}}
    out = C.headline([a, b], [a.id, b.id], table, None, _bd(host_only_us=3000, free_us=2000, compute_only_us=4000))
    assert out["estimated"] is False and out["basis"] == "range"
    assert (out["saving_min_us"], out["saving_max_us"], out["max_bound"]) == (4000.0, 7000.0, "summed")
    assert out["saving_us"] == 4000.0 and [x["rule"] for x in out["left_out"]] == ["IO001", "CMP003"]
    out = C.headline([a, b], [a.id, b.id], table, None, _bd(host_only_us=3000, free_us=1000, compute_only_us=2000))
    assert (out["saving_min_us"], out["saving_max_us"], out["max_bound"]) == (4000.0, 6000.0, "classes")


def test_a_finding_explained_by_a_top_one_is_not_counted() -> None:
    """A 2 ms finding explained by the 4 ms one is no fix of its own; one explained in part counts only its
    unexplained saving (1 ms of 3): at most 4 + 1 = 5 ms."""
    a = _finding("IO001", "io.dataloader_wait", 4000.0)
    b = _finding("CPU004", "cpu.garbage_collection", 2000.0, explained_by=(a.id,))
    c = _finding("CMP003", "compute.unfused", 3000.0,
                 evidence={"explained_in_part_by": a.id, "unexplained_saving_us": 1000.0})
    out = C.headline([a, b, c], [a.id, b.id, c.id], {}, None, None)
    assert [x["rule"] for x in out["fixes"]] == ["IO001", "CMP003"]
    assert (out["saving_min_us"], out["saving_max_us"]) == (4000.0, 5000.0)


def test_the_range_is_said_to_be_one() -> None:
    """The range of the test above, in the words every format prints (they share the line)."""
    from advisor.render.view import combined_line

    a = _finding("IO001", "io.dataloader_wait", 4000.0)
    b = _finding("CMP003", "compute.unfused", 3000.0)
    out = C.headline([a, b], [a.id, b.id], {}, None, _bd(host_only_us=3000, free_us=1000, compute_only_us=2000))
    line = combined_line({"savings": {"combined": out}})
    assert line is not None
    assert "(IO001, CMP003): between −4.00 ms and −6.00 ms per step, a range, not a replay" in line
    assert "at most the step time their classes of cause could free" in line


def _two_gpus() -> dict[str, list[dict[str, Any]]]:
    """Two ranks, three 10 ms steps, each kernel launched by a 50 µs ``cudaLaunchKernel`` and starting 0.1 ms
    after it, all on one stream: k1 0.1-3 ms; the all-reduce launched at 5 ms on rank 0 (after a 2 ms
    ``Python GC`` at 3-5 ms), at 3 ms on rank 1; it ends at 6.1 ms on both (rank 0's lasts its 1 ms transfer,
    rank 1's 3 ms: it waits 2 ms for rank 0); k2 6.1-9.9 ms on both."""
    ev: list[dict[str, Any]] = []
    corr = 0
    for rank in (0, 1):
        rows = _steps(3)
        for i in range(3):
            t = BASE + i * STEP_NS
            at = 5 * MS if rank == 0 else 3 * MS
            for start, name, dur, kind in ((0, "k1", 2_900_000, "kernel"),
                                           (at, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 6_100_000 - at - 100_000, "comm")):
                corr += 1
                rows += [_ev("runtime", "cudaLaunchKernel", t + start, 50_000, corr=corr),
                         _ev(kind, name, t + start + 100_000, dur, DEV, corr=corr)]
            corr += 1
            rows += [_ev("runtime", "cudaLaunchKernel", t + at + 60_000, 50_000, corr=corr),
                     _ev("kernel", "k2", t + 6_100_000, 3_800_000, DEV, corr=corr)]
            if rank == 0:
                rows.append(_ev("python", "Python GC", t + 3 * MS, 2 * MS, cat="python_function"))
        ev += [{**r, "rank": rank} for r in rows]
    return {"events": ev}


def test_a_change_on_one_rank_reaches_its_peer_through_the_collective() -> None:
    """Rank 0's GC removed: it launches the all-reduce at 3 ms, which starts at 3.1 ms on both ranks and ends
    after its 1 ms transfer, 4.1 ms; k2 runs 4.1-7.9 ms on both: the job's step is 2 ms shorter. Replayed on
    rank 0 alone (rank 1's 3 ms collective kept as measured) rank 0 saves 2 ms, rank 1 nothing, and the slower
    rank's step gives 0: only the ranks replayed joined by the collective see the saving."""
    ctx = context_from_tables(_two_gpus())
    rep = analyze_context(ctx)
    gc = _by_rule(rep)["CPU004"]
    assert gc.ranks == (0,) and gc.estimated_saving_us == pytest.approx(2000, abs=5)
    joined = ctx.extras[C.JOINED_KEY]
    assert joined["ranks"] == [0, 1] and joined["steps_replayed"] == 3
    assert joined["savings_us"]["CPU004"] == pytest.approx(2000, abs=5)
    fix = next(x for x in rep.savings["combined"]["fixes"] if x["rule"] == "CPU004")
    assert fix["method"] == "joined" and fix["saving_us"] == pytest.approx(2000, abs=5)
    alone = C.headline([gc], [gc.id], ctx.extras[C.TABLE_KEY], None, ctx.breakdown)
    assert alone["fixes"][0]["method"] == "slowest_rank" and alone["saving_us"] == pytest.approx(0, abs=5)


def test_a_straggler_finding_is_replayed_with_the_rank_rules_changes() -> None:
    """CLU001 names rank 0 (its own time 8.9 ms against rank 1's 6.9: the GC) and replays it at rank 1's
    speed. Made together with the GC's removal, rank 0 reaches the all-reduce before rank 1, whose arrival
    (3.1 ms) neither change moves: the all-reduce ends at 4.1 ms, rank 1's k2 at 7.9 ms, the job's step
    8 ms: 2 ms saved, as by the GC's removal alone, not the two savings added."""
    ctx = context_from_tables(_two_gpus())
    rep = analyze_context(ctx)
    f = _by_rule(rep)
    gc, clu = f["CPU004"], f["CLU001"]
    assert clu.ranks == (0,) and (clu.replay or {}).get("change") == C.STRAGGLER
    assert clu.explained_by == (gc.id,)  # the report links them; taken here as two roots to make together
    clu = dataclasses.replace(clu, explained_by=(), root=True)
    out = C.headline([gc, clu], [gc.id, clu.id], ctx.extras[C.TABLE_KEY], ctx.extras[C.JOINED_KEY], ctx.breakdown)
    assert out["basis"] == "replayed" and out["method"] == "joined"
    assert out["saving_us"] == pytest.approx(2000, abs=5)
    assert max(x["saving_us"] for x in out["fixes"]) <= out["saving_us"] + 1e-3


def test_two_findings_of_one_rule_on_a_rank_not_replayed_may_add_up() -> None:
    """Two CMP003 findings on rank 0 (other operators: 3 and 2 ms) without a change, and a 4 ms finding
    without one: one CMP003 fix, at least 4 ms (the largest finding), at most 4 + 3 + 2 = 9 ms."""
    a = _finding("CPU005", "cpu.contention", 4000.0)
    b = _finding("CMP003", "compute.unfused", 3000.0, ops=("a",))
    c = _finding("CMP003", "compute.unfused", 2000.0, ops=("b",))
    out = C.headline([a, b, c], [a.id, b.id, c.id], {}, None, None)
    assert [x["rule"] for x in out["fixes"]] == ["CPU005", "CMP003"]
    assert (out["saving_min_us"], out["saving_max_us"], out["max_bound"]) == (4000.0, 9000.0, "summed")
