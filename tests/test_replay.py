"""The what-if replay (advisor.stages.replay): the no-change replay reproduces every measured step,
and the counterfactuals give back the time of what they remove, figures checked against the trace."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advisor.engine.context import load_profile
from advisor.kinds import EdgeKind
from advisor.stages import replay as R
from tests.conftest import ROOT, SAMPLES, TRACES, profile_group, report_json, shared_report

DATA = ROOT / "tests" / "data"
#: the inputs the quick suite replays (one of each kind: GPU cluster, CPU loader, GC, sync, gloo, Ascend);
#: the marked run replays every profile
QUICK = {"kineto_two_ranks", "cpu_slow_dataloader", "cpu_python_gc", "cpu_host_sync", "gloo_slow_rank",
         "ascend_pt_resnet_ddp_l1_text", "kineto_mi300_hf_bert_small"}


def _inputs() -> list[Any]:
    dirs = [p for p in sorted(SAMPLES.iterdir()) if p.is_dir()]
    dirs += [p for p in sorted(TRACES.iterdir()) if p.is_dir()]
    dirs += [p for p in sorted((DATA / "kineto_real").iterdir()) if p.is_dir()]
    dirs += [p for p in sorted((DATA / "ascend_real").iterdir()) if p.is_dir()]
    twins = [p for p in sorted((DATA / "twins").glob("*/*")) if p.is_dir()]  # both sides of each twin: slow
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}", marks=[] if p.name in QUICK else [pytest.mark.slow])
            for p in dirs] + [pytest.param(p, id=f"twins/{p.parent.name}/{p.name}", marks=[pytest.mark.slow])
                              for p in twins]


@functools.lru_cache(maxsize=4)
def _load(path: Path) -> Any:
    """A profile loaded once for the tests of this module."""
    return load_profile(path)


def _windows(cur: Any) -> list[tuple[int, int, int, int]]:
    return cur.execute("SELECT rank, step, start_ns, end_ns FROM steps WHERE end_ns > start_ns "
                       "ORDER BY rank, step").fetchall()


@pytest.mark.parametrize("path", _inputs())
def test_no_change_reproduces_every_step(path: Path) -> None:
    """Replaying each (rank, step) with no change gives its measured length within 2 %."""
    cur = _load(path).con.cursor()
    wins = _windows(cur)
    assert wins
    for rank, step, a, b in wins:
        g = R.build(cur, rank, step, a, b)
        if g is None:
            continue
        assert g.length == b - a
        err = R.reproduction_error(g)
        assert err <= R.REPRODUCE_WITHIN, (rank, step, err)


@pytest.fixture(scope="module")
def slow_loader() -> Any:
    return _load(TRACES / "cpu_slow_dataloader").con.cursor()


def test_removing_the_loader_wait_gives_back_its_time(slow_loader: Any) -> None:
    """CPU-only, one thread: without the ``__next__`` annotation (31.25-31.65 ms per step, README) the
    step is shorter by that annotation's time, nothing else moves."""
    cur = slow_loader
    change = [R.Change("remove", R.Select(kinds=("dataloader",), device=False))]
    for rank, step, a, b in _windows(cur):
        g = R.build(cur, rank, step, a, b)
        assert g is not None
        dl = cur.execute("SELECT sum(least(start_ns + dur_ns, $b) - greatest(start_ns, $a)) FROM events "
                         "WHERE rank = $r AND kind = 'dataloader' AND start_ns < $b AND start_ns + dur_ns > $a",
                         {"r": rank, "a": a, "b": b}).fetchone()[0]
        assert 31.0e6 <= dl <= 31.8e6
        assert R.saving(g, change) == pytest.approx(dl, abs=2_000)


def test_a_change_that_touches_nothing_saves_nothing(slow_loader: Any) -> None:
    cur = slow_loader
    rank, step, a, b = _windows(cur)[0]
    g = R.build(cur, rank, step, a, b)
    assert g is not None
    assert R.saving(g, [R.Change("remove", R.Select(names=("no such event",)))]) == 0
    # CPU-only: no device, no sync wait edges to drop
    assert R.saving(g, [R.Change("drop_edges", R.Select(device=False), edge=EdgeKind.SYNC_WAIT)]) == 0
    # halving every host segment's time shortens the step, by less than half of it (the gaps stay)
    half = R.saving(g, [R.Change("scale", R.Select(device=False), value=0.5)])
    assert 0 < half < g.length / 2


def test_gc_pauses_removed() -> None:
    """cpu_python_gc: removing the ``Python GC`` events saves, per step, their time on the main thread."""
    ctx = load_profile(TRACES / "cpu_python_gc")
    cur = ctx.con.cursor()
    change = [R.Change("remove", R.Select(names=("Python GC",), device=False))]
    for rank, step, a, b in _windows(cur):
        g = R.build(cur, rank, step, a, b)
        assert g is not None
        gc = cur.execute("SELECT coalesce(sum(least(start_ns + dur_ns, $b) - greatest(start_ns, $a)), 0) FROM events "
                         "WHERE rank = $r AND name = 'Python GC' AND start_ns < $b AND start_ns + dur_ns > $a",
                         {"r": rank, "a": a, "b": b}).fetchone()[0]
        assert R.saving(g, change) == pytest.approx(gc, rel=0.02, abs=20_000)


def test_graph_edges_point_forward_and_reach_every_node(slow_loader: Any) -> None:
    cur = slow_loader
    rank, step, a, b = _windows(cur)[0]
    g = R.build(cur, rank, step, a, b)
    assert g is not None
    assert (g.src < g.dst).all()
    assert (g.delay >= 0).all()
    # one thread: a chain, so every node but the first has a predecessor
    assert len(np.unique(g.dst)) == g.n - 1


def test_ascend_sync_and_allreduce_wait() -> None:
    """Ascend DDP (text form): dropping the host's sync waits saves less than the step, and the all-reduce
    waiting only for its transfer (no ``Notify Wait``) saves most of the step, as the trace shows it."""
    cur = _load(DATA / "ascend_real" / "ascend_pt_resnet_ddp_l1_text").con.cursor()
    for rank, step, a, b in _windows(cur):
        g = R.build(cur, rank, step, a, b)
        assert g is not None
        sync = R.saving(g, [R.Change("drop_edges", R.Select(device=False), edge=EdgeKind.SYNC_WAIT)])
        assert 0 < sync < 0.2 * g.length
        notify = cur.execute("SELECT sum(dur_ns) FROM events WHERE rank = $r AND device AND name = 'Notify Wait' "
                             "AND start_ns >= $a AND start_ns < $b", {"r": rank, "a": a, "b": b}).fetchone()[0]
        wait = R.saving(g, [R.Change("remove", R.Select(names=("Notify Wait",), device=True))])
        # the waits overlap nothing else on their stream, but compute can run under some of them
        assert 0.5 * g.length < wait <= notify


def test_change_is_checked() -> None:
    with pytest.raises(ValueError):
        R.Change("shrink", R.Select())
    with pytest.raises(ValueError):
        R.Change("drop_edges", R.Select())


@profile_group(TRACES / "cpu_slow_dataloader")
def test_findings_carry_the_replayed_saving_beside_todays() -> None:
    """IO001 on the slow-loader trace: the finding keeps its own estimate and adds the replay's, which gives
    back the ``__next__`` time (31.25-31.65 ms per step, README); the report stays schema-valid."""
    data = report_json(shared_report(TRACES / "cpu_slow_dataloader"))
    io = [f for f in data["findings"] if f["rule"] == "IO001"]
    assert len(io) == 1
    rp = io[0]["replay"]
    assert rp["estimated"] and rp["reproduced"] and rp["reproduction_error"] <= R.REPRODUCE_WITHIN
    assert 31_000 <= rp["saving_us"] <= 31_800
    assert rp["assumption"].startswith("if ")
    assert io[0]["estimated_saving_us"] is not None  # today's estimate is kept as it was


@profile_group(TRACES / "cpu_slow_dataloader")
def test_a_replay_over_its_budget_is_not_estimated_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule's replays read at most its budget of events: over it a step is not replayed, the finding
    keeps the rule's own figure and says so; the same rule asked again spends a budget of its own."""
    from advisor.analyze import analyze

    path = TRACES / "cpu_slow_dataloader"
    steps = len(report_json(shared_report(path))["breakdown"])
    monkeypatch.setattr(R, "BUDGET_FLOOR", 1)
    monkeypatch.setattr(R, "BUDGET_SHARE", 0.0)
    io = next(f for f in report_json(analyze(path))["findings"] if f["rule"] == "IO001")
    assert not io["replay"]["estimated"] and "budget" in io["replay"]["reason"]
    assert "budget" in io["evidence"]["saving_not_replayed"]
    assert io["estimated_saving_us"] and "replayed" not in io["saving_basis"]
    ctx = _load(path)
    from advisor.stages.sequence import run_stages

    run_stages(ctx, None, None, warnings=[], path_warnings=[])
    cur = ctx.con.cursor()
    windows = [(int(s), int(a), int(b)) for s, a, b in ctx.con.execute(
        "SELECT step, start_ns, end_ns FROM steps WHERE rank = 0 AND end_ns > start_ns ORDER BY step").fetchall()]
    counts = R.window_events(cur, ctx.extras, 0, windows)
    # the counts are the events overlapping each window, as a plain scan of the events table gives them
    for (_s, a, b), n in zip(windows, counts, strict=True):
        assert n == ctx.con.execute("SELECT count(*) FROM events WHERE rank = 0 AND start_ns < ? "
                                    "AND start_ns + greatest(dur_ns, 0) > ?", [b, a]).fetchone()[0]
    assert len(windows) == steps and all(n > 0 for n in counts)
    budget = R.Budget(counts[0] + counts[1])
    assert budget.take(counts[0]) and budget.take(counts[1]) and not budget.take(1)
    # a rule whose budget holds the first two windows replays those and keeps its change for them only
    # (the report's "fix these" replays a rule's change only where that rule's graphs were built)
    from advisor.engine.combined import CHANGES_KEY
    from advisor.engine.registry import discover
    from advisor.engine.rule import RuleContext

    monkeypatch.setattr(R, "BUDGET_FLOOR", counts[0] + counts[1])
    spec = discover()["IO001"]
    rc = RuleContext(spec, ctx, spec.thresholds())
    out = rc.what_if(0, [R.Change("remove", R.Select(kinds=("io",)))], "if the data were ready")
    assert out["steps"] == len(windows) and "budget" in out["reason"]
    assert ctx.extras[CHANGES_KEY][("IO001", 0)][0][0] == (windows[0][0], windows[1][0])


def _com001_rows(path: Path) -> list[tuple[Any, ...]]:
    from advisor.engine.registry import discover
    from advisor.engine.rule import RuleContext
    from advisor.stages.sequence import run_stages
    from rules.comm.com001_slow_synchronization import _replay_rows

    ctx = _load(path)
    if ctx.breakdown is None:
        run_stages(ctx, None, None, warnings=[], path_warnings=[])
    spec = discover()["COM001"]
    return _replay_rows(RuleContext(spec, ctx, spec.thresholds()))[0]


def test_collective_wait_counterfactual_per_rank() -> None:
    """COM001's rank part: on the Ascend DDP export (HCCL ``Notify Wait`` tasks) each rank's step is replayed
    with its collectives waiting only for their transfer; the saving is most of the step and at most the
    ``Notify Wait`` time (the step is 156 / 154 ms, step_trace_time.csv)."""
    rows = _com001_rows(DATA / "ascend_real" / "ascend_pt_resnet_ddp_l1_text")
    assert sorted((r[0], r[1]) for r in rows) == [(0, 50), (1, 50)]
    for rank, _step, measured, saving, error, reason in rows:
        assert reason is None and error <= R.REPRODUCE_WITHIN
        assert 0.5 * measured < saving < measured, rank


def test_nccl_collective_wait_is_not_estimated() -> None:
    """Kineto NCCL kernels record no wait apart from their transfer: no saving, and the reason."""
    rows = _com001_rows(SAMPLES / "kineto_two_ranks")
    assert rows and all(r[3] is None and "NCCL" in r[5] for r in rows)


def _tiny(rows: list[tuple[Any, ...]]) -> Any:
    """A DuckDB holding only ``events`` rows (kind, name, tid, device, stream, start µs, dur µs, corr) of rank 0."""
    from advisor.ingest import connect
    from advisor.schema import create_all

    con = connect()
    create_all(con)
    for kind, name, tid, dev, stream, s, d, corr in rows:
        con.execute("INSERT INTO events (rank, kind, name, pid, tid, device, stream, start_ns, dur_ns, corr) "
                    "VALUES (0, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [kind, name, "1" if not dev else "0", tid, dev,
                                                              stream, s * 1000, d * 1000, corr])
    return con.cursor()


def test_a_sync_that_blocked_saves_its_wait_and_one_that_did_not_saves_nothing() -> None:
    """Host: launch kernel A (corr 1) at 0-10 µs, cudaStreamSynchronize 10-500 µs (A runs 20-480 µs: the host
    waits for it), launch B at 510 µs (corr 2), a second synchronize 530-540 µs during which the device runs
    nothing (B ran 515-525 µs), launch C at 600 µs; C runs 610-700 µs. Without the wait the host runs ahead,
    but B and C still follow A on the stream: the step loses the device's idle time after A, 35 + 85 µs. The
    second sync blocked on nothing: it has no wait edge to drop."""
    cur = _tiny([
        ("runtime", "cudaLaunchKernel", "h", False, None, 0, 10, 1),
        ("sync", "cudaStreamSynchronize", "h", False, None, 10, 490, None),
        ("runtime", "cudaLaunchKernel", "h", False, None, 510, 5, 2),
        ("sync", "cudaStreamSynchronize", "h", False, None, 530, 10, None),
        ("runtime", "cudaLaunchKernel", "h", False, None, 600, 5, 3),
        ("kernel", "A", "7", True, 7, 20, 460, 1),
        ("kernel", "B", "7", True, 7, 515, 10, 2),
        ("kernel", "C", "7", True, 7, 610, 90, 3),
    ])
    g = R.build(cur, 0, 0, 0, 700_000)
    assert g is not None and R.reproduction_error(g) == 0
    kinds = {R.EDGE_KINDS[k] for k in g.etype.tolist()}
    assert {EdgeKind.SYNC_WAIT, EdgeKind.LAUNCH, EdgeKind.STREAM_ORDER, EdgeKind.HOST_ORDER} <= kinds
    assert int((g.etype == R.EDGE_KINDS.index(EdgeKind.SYNC_WAIT)).sum()) == 1  # the second sync waited on nothing
    drop = [R.Change("drop_edges", R.Select(device=False), edge=EdgeKind.SYNC_WAIT)]
    assert R.saving(g, drop) == 120_000
    # the kernel A twice as fast: the sync returns 230 µs earlier, and so does everything after it
    assert R.saving(g, [R.Change("scale", R.Select(names=("A",)), value=0.5)]) == 230_000
    # A bounded to 100 µs: 360 µs earlier
    assert R.saving(g, [R.Change("bound", R.Select(names=("A",)), value=100_000)]) == 360_000


def test_event_bounds_bound_one_task_of_a_collective() -> None:
    """A collective as Ascend records it: the op (launched at 0 µs, corr 1) spans 10-210 µs on its lane, its
    tasks on another: Notify Wait 10-60, SDMA 60-160 (100 µs), SDMA 160-210 (50 µs), one after the other on
    their stream; the step ends with the last. The op is no node, its tasks are. The first SDMA bounded by
    its start (60 µs) to 40 µs: the second follows 60 µs earlier. With a per-name bound of 30 µs in the same
    change the second SDMA takes 30 of its 50 µs too: 80 µs; the per-event bound wins over the per-name
    one. A start no task has bounds nothing."""
    cur = _tiny([
        ("runtime", "launch", "h", False, None, 0, 3, 1),
        ("comm", "hcom_allReduce__1_1_1", "20", True, 20, 10, 200, 1),
        ("comm", "Notify Wait", "21", True, 21, 10, 50, None),
        ("comm", "SDMA", "21", True, 21, 60, 100, None),
        ("comm", "SDMA", "21", True, 21, 160, 50, None),
    ])
    g = R.build(cur, 0, 0, 0, 210_000)
    assert g is not None and R.reproduction_error(g) == 0
    assert sorted(g.w.name[int(g.event[v])] for v in range(g.n) if g.device[v]) == ["Notify Wait", "SDMA", "SDMA"]
    comm = R.Select(kinds=("comm",), device=True)
    assert R.saving(g, [R.Change("bound", comm, event_bounds=(("SDMA", 60_000, 40_000),))]) == 60_000
    both = R.Change("bound", comm, bounds=(("SDMA", 30_000),), event_bounds=(("SDMA", 60_000, 40_000),))
    assert R.saving(g, [both]) == 80_000
    assert R.saving(g, [R.Change("bound", comm, event_bounds=(("SDMA", 61_000, 1),))]) == 0


def test_a_shorter_upstream_task_moves_what_depends_on_it_and_nothing_else() -> None:
    """Host launches A (stream 7, runs 20-120 µs), B (stream 7, 120-220: it waits for A on its stream) and C
    (stream 8, 30-80: independent), then blocks in a synchronize (15-230) released by B's end at 220 and
    launches D (stream 7, 240-260). A at half its length: B, the sync's end and D all move 50 µs earlier
    (stream order, sync wait, host order, launch); C and A's start stay. Each dependency is needed: without
    one of these edges a node downstream of A would not move."""
    cur = _tiny([
        ("runtime", "cudaLaunchKernel", "h", False, None, 0, 3, 1),
        ("runtime", "cudaLaunchKernel", "h", False, None, 5, 3, 2),
        ("runtime", "cudaLaunchKernel", "h", False, None, 10, 3, 3),
        ("sync", "cudaStreamSynchronize", "h", False, None, 15, 215, None),
        ("runtime", "cudaLaunchKernel", "h", False, None, 235, 3, 4),
        ("kernel", "A", "7", True, 7, 20, 100, 1),
        ("kernel", "B", "7", True, 7, 120, 100, 2),
        ("kernel", "C", "8", True, 8, 30, 50, 3),
        ("kernel", "D", "7", True, 7, 240, 20, 4),
    ])
    g = R.build(cur, 0, 0, 0, 260_000)
    assert g is not None and R.reproduction_error(g) == 0
    dur, keep, _ = R.apply(g, [R.Change("scale", R.Select(names=("A",)), value=0.5)])
    start, end = R.replay(g, dur, keep)
    moved = {g.w.name[int(g.event[v])]: int(start[v] - g.start[v]) // 1000 for v in range(g.n) if g.device[v]}
    assert moved == {"A": 0, "B": -50, "C": 0, "D": -50}
    sync_end = max(int(end[v]) for v in range(g.n) if g.w.name[int(g.event[v])] == "cudaStreamSynchronize")
    assert sync_end == 180_000  # measured 230 µs
    assert R.step_length(g, end) == 210_000
    # the step carried along its binding chain: D's 20 µs of work back through the sync's rest (220-230), B, A
    parts = R.carried(g)
    assert sum(parts.values()) == g.length
    assert parts["work"] == (20 + 10 + 100 + 100) * 1000


@pytest.mark.parametrize("path", [p for p in _inputs() if p.values[0].name in ("kineto_cpu_slow_dataloader",
                                                                            "kineto_two_ranks")])
def test_the_binding_chain_adds_up_to_the_step(path: Path) -> None:
    """Work, fixed gaps, head and tail along each step's binding chain sum to the measured step (the
    replay's own account of how much of the step its dependencies explain)."""
    cur = _load(path).con.cursor()
    for rank, step, a, b in _windows(cur):
        g = R.build(cur, rank, step, a, b)
        if g is not None:
            parts = R.carried(g)
            assert sum(parts.values()) == b - a, (rank, step, parts)


def _rank_graph(work_us: int) -> Any:
    """One rank's step 0-310 µs: the host launches kernel W (stream 7, 10 µs to 10 + ``work_us``) and an
    all-reduce that runs on the same stream after W and ends at 310 µs (the later rank's W ends at 300)."""
    cur = _tiny([
        ("runtime", "cudaLaunchKernel", "h", False, None, 0, 3, 1),
        ("runtime", "cudaLaunchKernel", "h", False, None, 5, 3, 2),
        ("kernel", "W", "7", True, 7, 10, work_us, 1),
        ("comm", "ncclAllReduce", "7", True, 7, 10 + work_us, 300 - work_us, 2),
    ])
    g = R.build(cur, 0, 0, 0, 310_000)
    assert g is not None
    return g


def test_collectives_join_the_ranks_a_straggler_fixed_frees_its_peer() -> None:
    """Rank 0 computes 100 µs and waits 190 µs in the all-reduce for rank 1, which computes 290 µs; the
    transfer is the last member's 10 µs. Joined, the no-change replay gives both their measured 310 µs.
    Rank 1 at rank 0's speed: own time (step less time inside the collective) 300 µs against rank 0's 110,
    so its own time scales by 110 / 300, work and fixed gaps alike (W 290 -> 106.333 µs, the 10 µs launch
    gap -> 3.667 µs): both arrive at 110 µs, as rank 0 does, and end at 120: the cluster saves 190 µs, and
    rank 0 saves it with no change of its own (the change reaches the peer). Alone, rank 0's replay keeps
    its measured wait."""
    gs = {0: _rank_graph(100), 1: _rank_graph(290)}
    colls = R.collectives_of(gs)
    assert [(sorted(r for r, _ in c.members), c.transfer_ns) for c in colls] == [([0, 1], 10_000)]
    assert R.cluster_replay(gs, colls) == {0: 310_000, 1: 310_000}
    changes = R.straggler_changes(gs, colls, 1)
    assert R.cluster_replay(gs, colls, changes) == {0: 120_000, 1: 120_000}
    assert R.cluster_saving(gs, changes) == (190_000, 310_000)
    # a change on rank 1 alone (W 100 µs shorter) reaches rank 0 through the all-reduce
    shorter = {1: (R.Change("bound", R.Select(names=("W",)), value=190_000),)}
    assert R.cluster_replay(gs, colls, shorter) == {0: 210_000, 1: 210_000}
    assert R.straggler_changes(gs, colls, 0) == {}  # the fast rank is no straggler
    assert R.saving(gs[0], []) == 0


def test_joined_replay_reproduces_a_two_rank_job() -> None:
    """The ranks joined by their matched NCCL collectives, the no-change replay gives each rank's measured
    step back (every collective ended after its last member arrived)."""
    cur = _load(SAMPLES / "kineto_two_ranks").con.cursor()
    wins = _windows(cur)
    for step in sorted({w[1] for w in wins}):
        gs = {r: g for r, s, a, b in wins if s == step and (g := R.build(cur, r, s, a, b)) is not None}
        colls = R.collectives_of(gs)
        assert colls and all(len(c.members) == 2 for c in colls)
        got = R.cluster_replay(gs, colls)
        for r, g in gs.items():
            assert abs(got[r] - g.length) <= R.REPRODUCE_WITHIN * g.length, (step, r, got[r], g.length)


def test_a_sync_on_the_enqueuing_thread_waits_for_the_queue_to_drain() -> None:
    """torch_npu's task queue: the Python thread enqueues op A (0-2 µs) and enters ``aten::item`` (10-400 µs),
    whose ``aclrtSynchronizeStream`` only starts at 380 µs; the task-queue thread dequeues A (5-300 µs),
    compiling it for 240 µs (10-250) before launching it (260-270); A runs 290-390 µs and releases the sync
    (380-400). The item's time before the sync is a wait for the queue up to the dequeue's end (300 µs), then
    80 µs of its own: without the compile the dequeue ends at 60 µs, A runs 50-150, the item's own 80 µs end
    at 140, the sync returns at 160 µs: the step (400 µs) saves the 240 µs of compile."""
    cur = _tiny([
        ("queue", "Enqueue@A", "py", False, None, 0, 2, None),
        ("host_op", "aten::item", "py", False, None, 10, 390, None),
        ("sync", "aclrtSynchronizeStream", "py", False, None, 380, 20, None),
        ("queue", "Dequeue@A", "tq", False, None, 5, 295, None),
        ("runtime", "AscendCL@aclopCompileAndExecute", "tq", False, None, 10, 240, None),
        ("runtime", "AscendCL@aclnnA", "tq", False, None, 260, 10, 1),
        ("kernel", "A", "7", True, 7, 290, 100, 1),
    ])
    g = R.build(cur, 0, 0, 0, 400_000)
    assert g is not None and R.reproduction_error(g) == 0
    assert int((g.etype == R.EDGE_KINDS.index(EdgeKind.SYNC_WAIT)).sum()) == 2  # the queue's drain, A's end
    compile_ = [R.Change("remove", R.Select(name_re="Compile", device=False))]
    assert R.saving(g, compile_) == 240_000


def test_a_host_change_without_launch_links_is_not_estimated() -> None:
    """Kernel K1 (0-50 µs) and K2 (80-100 µs) carry no launch link; the host runs a GC pause 50-80 µs. Whether
    K2 waited for the pause is not known: removing it is not replayed, and the summary says why. With the
    launch of K2 (corr 1, 80-81 µs, K2 then at 82 µs) recorded, it is: the launch moves to 50 µs and K2, 2 µs
    after it, to 52 µs: 30 µs earlier."""
    cur = _tiny([
        ("kernel", "K1", "7", True, 7, 0, 50, None),
        ("kernel", "K2", "7", True, 7, 80, 20, None),
        ("python", "Python GC", "h", False, None, 50, 30, None),
    ])
    g = R.build(cur, 0, 0, 0, 100_000)
    assert g is not None
    gc = [R.Change("remove", R.Select(names=("Python GC",), device=False))]
    res = R.what_if([g], gc)
    assert res[0].saving_ns is None and res[0].reason == R.NO_LAUNCH_LINKS
    out = R.summary(res, "if no GC ran")
    assert out["estimated"] is False and out["reason"] == R.NO_LAUNCH_LINKS
    # a device change is still replayed there
    assert R.what_if([g], [R.Change("bound", R.Select(names=("K1",)), value=40_000)])[0].saving_ns == 10_000
    cur = _tiny([
        ("kernel", "K1", "7", True, 7, 0, 50, None),
        ("python", "Python GC", "h", False, None, 50, 30, None),
        ("runtime", "cudaLaunchKernel", "h", False, None, 80, 1, 1),
        ("kernel", "K2", "7", True, 7, 82, 18, 1),
    ])
    g = R.build(cur, 0, 0, 0, 100_000)
    assert g is not None
    res = R.what_if([g], gc)
    assert res[0].reason is None and res[0].saving_ns == 30_000


def test_a_straggler_is_replayed_only_where_its_group_was_read_together() -> None:
    """COM001 on 4 ranks where rank 3 arrives 15 ms late at both all-reduces of each 100 ms step
    (tests/rules/fixtures_comm.slow_rank_ascend). Own time to the last work (90 ms) less the time in the
    all-reduces: 50 ms on ranks 0-2, 80 on rank 3, so rank 3 runs at x0.625: its MatMul 55 -> 34.375 ms, the
    first all-reduce waits for the others (40 ms) and its 5 ms transfer, ends at 45; rank 3's 25 ms gap to the
    second -> 15.625, it arrives at 60.625 (the others at 55), which ends at 65.625; with the 10 ms tail the
    step is 75.625 of 100 ms: 24.375 ms saved. The same ranks as 4 of an 8-rank world (another shard holds the
    rest): not joined, the finding keeps its own figure and says why."""
    from advisor.analyze import analyze_context
    from advisor.config import Config
    from advisor.testing import context_from_tables
    from tests.conftest import report_json
    from tests.rules.fixtures_comm import slow_rank_ascend

    def com001(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        data = report_json(analyze_context(context_from_tables(rows), Config(select=["COM001"])))
        (f,) = [f for f in data["findings"] if f["rule"] == "COM001"]
        return f

    f = com001(slow_rank_ascend())
    assert f["replay"]["estimated"] and f["estimated_saving_us"] == pytest.approx(24_375)
    rows = slow_rank_ascend()
    rows["ranks"] = [{**r, "world_size": 8} for r in rows["ranks"]]
    f = com001(rows)
    assert f["replay"]["estimated"] is False and "not read together" in f["replay"]["reason"]
    assert f["estimated_saving_us"] == pytest.approx(30_000)  # the rule's own: the worst member's wait
    assert "not read together" in f["evidence"]["saving_not_replayed"]


def test_a_caller_waiting_for_a_host_collective_resumes_when_it_ends() -> None:
    """Host thread h: ``backward`` 0-100 µs issues ``c10d::allreduce_`` (20-30); gloo's work thread w runs
    ``gloo:all_reduce`` 40-300; h is idle until 310, then ``copy`` 310-320 and ``opt`` 320-400. h's resuming
    waits for the collective's end (10 µs after it). The collective at 60 µs (ends at 100): ``copy`` starts
    at 110, the step ends at 200 instead of 400. The caller's call at 5 µs instead of 10: the rest of
    ``backward``, and the collective it hands off to, 5 µs earlier."""
    cur = _tiny([
        ("host_op", "backward", "h", False, None, 0, 100, None),
        ("comm", "c10d::allreduce_", "h", False, None, 20, 10, None),
        ("comm", "gloo:all_reduce", "w", False, None, 40, 260, None),
        ("host_op", "copy", "h", False, None, 310, 10, None),
        ("host_op", "opt", "h", False, None, 320, 80, None),
    ])
    g = R.build(cur, 0, 0, 0, 400_000)
    assert g is not None and R.reproduction_error(g) == 0
    waits = g.etype == R.EDGE_KINDS.index(EdgeKind.COMMUNICATION_COMPLETION)
    assert int(waits.sum()) == 1
    assert g.w.name[int(g.event[int(g.dst[waits][0])])] == "copy"
    sel = R.Select(kinds=("comm",), device=False)
    assert R.saving(g, [R.Change("bound", sel, at=(("gloo:all_reduce", 40_000, 60_000),))]) == 200_000
    assert R.saving(g, [R.Change("bound", sel, at=(("c10d::allreduce_", 20_000, 5_000),))]) == 5_000
    # an instance not listed (another start) is left alone
    assert R.saving(g, [R.Change("bound", sel, at=(("gloo:all_reduce", 41_000, 60_000),))]) == 0


def test_a_device_collective_bounded_by_instance() -> None:
    """The host launches collective X (stream 7, 20-120 µs) and kernel K (stream 7, 120-220 µs, after X on
    its stream). X at 40 µs: K runs 60-160, the step (to 220) ends 60 µs earlier."""
    cur = _tiny([
        ("runtime", "launch", "h", False, None, 0, 3, 1),
        ("runtime", "launch", "h", False, None, 5, 3, 2),
        ("comm", "hcom_allGather__1_1_1", "7", True, 7, 20, 100, 1),
        ("kernel", "K", "7", True, 7, 120, 100, 2),
    ])
    g = R.build(cur, 0, 0, 0, 220_000)
    assert g is not None and R.reproduction_error(g) == 0
    ch = R.Change("bound", R.Select(kinds=("comm",), device=True), at=(("hcom_allGather__1_1_1", 20_000, 40_000),))
    assert R.saving(g, [ch]) == 60_000


def test_own_segments_and_launched_tasks_are_selected_apart() -> None:
    """Host: ``step_fn`` (python, 0-90 µs) runs ``aten::add`` (10-30) around a launch of A (20-25, corr 1) and
    ``aten::mul`` (60-90) around a launch of B (80-85, corr 2); A runs 27-40, B 87-100, each 7 µs after its
    launch began. Without the framework's own time (``exclusive``: the segments the python and host_op events
    own, their launches kept) the two launches run back to back at 0-5 and 5-10; A follows at 7-20 and B, its
    launch at 5 + 7 but A before it on the stream, at 20-33: the step (100 µs) is 67 µs shorter. Removing
    the same events with what is nested in them takes the launches' 5 µs too. ``launched`` selects the device
    tasks launched from inside ``aten::mul``: B at half its 13 µs ends 6.5 µs earlier; so does B scaled by
    name."""
    cur = _tiny([
        ("python", "step_fn", "h", False, None, 0, 90, None),
        ("host_op", "aten::add", "h", False, None, 10, 20, None),
        ("runtime", "cudaLaunchKernel", "h", False, None, 20, 5, 1),
        ("host_op", "aten::mul", "h", False, None, 60, 30, None),
        ("runtime", "cudaLaunchKernel", "h", False, None, 80, 5, 2),
        ("kernel", "A", "7", True, 7, 27, 13, 1),
        ("kernel", "B", "7", True, 7, 87, 13, 2),
    ])
    g = R.build(cur, 0, 0, 0, 100_000)
    assert g is not None and R.reproduction_error(g) == 0
    own = R.Select(kinds=("python", "host_op"), device=False, exclusive=True)
    assert R.saving(g, [R.Change("remove", own)]) == 67_000
    launches = [v for v in range(g.n) if g.w.name[int(g.event[v])] == "cudaLaunchKernel"]
    assert R.apply(g, [R.Change("remove", own)])[0][launches].tolist() == [5_000, 5_000]
    nested = R.Change("remove", R.Select(kinds=("python", "host_op"), device=False))
    assert R.apply(g, [nested])[0][launches].tolist() == [0, 0]
    # another thread's events, or only those outside a python event: nothing here
    assert R.saving(g, [R.Change("remove", R.Select(kinds=("host_op",), tids=("other",), exclusive=True))]) == 0
    assert not R.Select(kinds=("host_op", "python"), not_inside=("python",)).events(g.w).any()
    assert R.Select(kinds=("host_op",), tids=("h",), not_inside=("kernel",)).events(g.w).sum() == 2
    sel = R.select_nodes(g, R.Select(names=("aten::mul",), launched=True))
    assert [g.w.name[int(g.event[v])] for v in np.flatnonzero(sel)] == ["B"]
    assert R.saving(g, [R.Change("scale", R.Select(names=("aten::mul",), launched=True), value=0.5)]) == 6_500
    assert R.saving(g, [R.Change("scale", R.Select(device=True), scales=(("B", 0.5),))]) == 6_500
    # one recorded event by its name and start
    assert R.saving(g, [R.Change("scale", R.Select(at=(("B", 87_000), ("B", 1))), value=0.5)]) == 6_500
    assert R.saving(g, [R.Change("scale", R.Select(at=(("A", 87_000),)), value=0.5)]) == 0


def test_short_outermost_operators_and_short_gaps() -> None:
    """CPU-only thread: ``a`` 0-5 µs, ``b`` 10-100 with ``c`` 20-25 nested in it, ``d`` 200-205, ``e`` 208-210.
    The outermost operators shorter than 10 µs are a, d and e (c is nested, b is long): removed, 12 µs. The
    gaps shorter than 50 µs before the outermost operators (5 before b, 3 before e; not the 100 before d)
    closed: 8 µs more."""
    cur = _tiny([
        ("host_op", "a", "h", False, None, 0, 5, None),
        ("host_op", "b", "h", False, None, 10, 90, None),
        ("host_op", "c", "h", False, None, 20, 5, None),
        ("host_op", "d", "h", False, None, 200, 5, None),
        ("host_op", "e", "h", False, None, 208, 2, None),
    ])
    g = R.build(cur, 0, 0, 0, 210_000)
    assert g is not None and R.reproduction_error(g) == 0
    top = R.Select(kinds=("host_op",), device=False, outermost=True)
    short = R.Select(kinds=("host_op",), device=False, outermost=True, max_dur_ns=10_000)
    assert sorted(g.w.name[i] for i in np.flatnonzero(short.events(g.w))) == ["a", "d", "e"]
    assert R.saving(g, [R.Change("remove", short)]) == 12_000
    gaps = R.Change("scale_gaps", top, value=0.0, max_gap_ns=50_000)
    assert R.saving(g, [gaps]) == 8_000
    assert R.saving(g, [R.Change("remove", short), gaps]) == 20_000
