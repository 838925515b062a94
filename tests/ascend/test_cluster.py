"""Generated torch_npu clusters (8 and 64 ranks, text and .db): ranks, planted facts, equivalence of
the two forms, a broken rank export skipped with a warning, and schema-valid reports."""

from __future__ import annotations

import shutil
import statistics

import pytest

from advisor.engine.context import load_profile


def q(ctx, sql, params=None):
    return ctx.con.cursor().execute(sql, params or []).fetchall()


def dp_groups(facts):
    """DP group hash -> members (the groups of the generator with stride tp)."""
    tp = facts.scenario.tp
    return {g: m for g, m in facts.groups.items() if len(m) > 1 and m[1] - m[0] == tp and len(m) < facts.scenario.world}


# one worker runs this module: it generates and loads the 8-rank cluster once in each form
pytestmark = pytest.mark.xdist_group("ascend_faults8")


@pytest.fixture(scope="module", params=["text", "db"])
def f8(request, loaded_faults8_text, loaded_faults8_db, faults8_text, faults8_db):
    return (loaded_faults8_text, faults8_text) if request.param == "text" else (loaded_faults8_db, faults8_db)


def test_ranks_from_profiler_info(f8):
    ctx, facts = f8
    assert ctx.ranks == list(range(facts.scenario.world))
    assert ctx.sources == ["ascend_pt"]
    rows = q(ctx, "SELECT DISTINCT rank_source, world_size, backend FROM ranks")
    assert rows == [("profiler_info", facts.scenario.world, "hccl")]
    assert not [w for w in ctx.warnings if w.code in ("rank_guessed", "bad_file", "bad_export")]


def test_steps_and_step_fluctuation(f8):
    ctx, facts = f8
    steps = q(ctx, "SELECT rank, step, end_ns - start_ns FROM steps ORDER BY rank, step")
    assert {(r, s) for r, s, _ in steps} == {(r, s) for r in range(facts.scenario.world) for s in facts.steps}
    for r in range(facts.scenario.world):
        durs = {s: d for rr, s, d in steps if rr == r}
        base = min(durs.values())
        assert durs[facts.slow_step] > 1.8 * base  # the planted slow step (a long dataloader stall)
        assert q(ctx, "SELECT count(*) FROM vendor_steps WHERE rank = ?", [r])[0][0] == len(facts.steps)


def test_slow_rank_makes_its_group_wait(f8):
    ctx, facts = f8
    slow = facts.slow_rank
    comp = dict(q(ctx, "SELECT rank, sum(dur_ns) FROM kernels WHERE core_type <> 'HCCL' GROUP BY rank"))
    others = [v for r, v in comp.items() if r != slow]
    assert comp[slow] > 1.3 * statistics.median(others)
    group = next(g for g, m in dp_groups(facts).items() if slow in m)
    waits = dict(
        q(
            ctx,
            "SELECT rank, sum(wait_ns) FROM comm_ops WHERE group_name = ? AND op_type = 'allreduce' GROUP BY rank",
            [group],
        )
    )
    assert set(waits) == set(facts.groups[group])
    assert all(waits[r] > waits[slow] + 1_000_000 for r in waits if r != slow)


def test_misaligned_hccs_transfers(f8):
    ctx, facts = f8
    assert facts.misaligned
    for rank, _step, op, size in facts.misaligned[:6]:
        assert size % 512
        rows = q(
            ctx,
            "SELECT DISTINCT bytes, link_type FROM comm_tasks WHERE rank = ? AND op_name = ? AND bytes > 0 AND transport <> 'LOCAL'",
            [rank, op],
        )
        assert (size, "HCCS") in rows or (size, "ROCE") in rows
        sizes = q(
            ctx,
            "SELECT packet_sizes FROM comm_bandwidth WHERE rank = ? AND name = ? AND transport IN ('HCCS', 'RDMA') AND bytes > 0",
            [rank, op],
        )
        import json

        keys = {round(float(k) * 1e6) for (p,) in sizes if p for k in json.loads(p)}
        assert size in keys


def test_rdma_retransmission(f8):
    ctx, facts = f8
    ((rank, step, op),) = facts.rdma_retrans
    t = q(ctx, "SELECT max(dur_ns) FROM comm_tasks WHERE rank = ? AND op_name = ? AND transport = 'RDMA'", [rank, op])[
        0
    ][0]
    assert t > 4_000_000_000
    bw = q(ctx, "SELECT transit_ns FROM comm_bandwidth WHERE rank = ? AND name = ? AND transport = 'RDMA'", [rank, op])
    assert bw and bw[0][0] > 4_000_000_000
    mx = q(
        ctx,
        "SELECT max(transit_ns) FROM comm_matrix WHERE rank = ? AND step = ? AND transport = 'RDMA' AND name LIKE '%-total@%'",
        [rank, step],
    )
    assert mx[0][0] > 4_000_000_000
    assert q(ctx, "SELECT count(*) FROM comm_tasks WHERE transport = 'RDMA' AND dur_ns > 4000000000")[0][0] == 1


def test_small_packets(f8):
    """The TP all-gathers move their whole volume (tp_bytes / tp per rank), as messages of small_packet_bytes."""
    ctx, facts = f8
    scn = facts.scenario
    chunk = scn.tp_bytes // scn.tp
    rows = q(
        ctx,
        "SELECT DISTINCT t.bytes FROM comm_tasks t JOIN comm_ops o ON o.rank = t.rank AND o.name = t.op_name "
        "WHERE o.op_type = 'allgather' AND t.bytes > 0 AND t.link_type = 'HCCS'",
    )
    assert rows == [(scn.small_packet_bytes,)]
    per_op = q(
        ctx,
        "SELECT DISTINCT sum(t.bytes) FROM comm_tasks t JOIN comm_ops o ON o.rank = t.rank AND o.name = t.op_name "
        "WHERE o.op_type = 'allgather' AND t.link_type = 'HCCS' GROUP BY t.rank, t.op_name",
    )
    assert per_op == [(chunk,)]
    assert scn.small_packet_bytes < 1 << 20 and chunk % scn.small_packet_bytes == 0


def test_slow_link_in_the_matrix(f8):
    ctx, facts = f8
    src, dst = facts.slow_link
    groups = list(
        dp_groups(facts)
    )  # the gradient allreduces (the tiny world-group loss allreduce has its own, lower figures)
    rows = q(
        ctx,
        f"""SELECT src_rank, dst_rank, min(bandwidth_gbps) FROM comm_matrix
                      WHERE name LIKE 'allreduce-total@%' AND transport = 'HCCS' AND src_rank <> dst_rank
                        AND group_name IN ({", ".join("?" for _ in groups)}) GROUP BY ALL ORDER BY 3""",
        groups,
    )
    assert rows[0][:2] == (src, dst)
    assert rows[0][2] * 4 < statistics.median(r[2] for r in rows)


def test_matrix_ranks_are_global(f8):
    ctx, facts = f8
    for g, members in dp_groups(facts).items():
        links = q(
            ctx,
            "SELECT DISTINCT src_rank, dst_rank FROM comm_matrix WHERE group_name = ? AND transport <> 'LOCAL'",
            [g],
        )
        n = len(members)
        assert links and all(s in members and d == members[(members.index(s) + 1) % n] for s, d in links)


def test_aicpu_and_low_block_dim(f8):
    ctx, facts = f8
    world = facts.scenario.world
    aicpu = q(ctx, "SELECT name, count(DISTINCT rank) FROM kernels WHERE core_type = 'AI_CPU' GROUP BY name")
    assert {n for n, _ in aicpu} == set(facts.aicpu_kernels) and all(c == world for _, c in aicpu)
    low = q(ctx, "SELECT DISTINCT name FROM kernels WHERE block_dim < 4 AND core_type NOT IN ('AI_CPU', 'HCCL')")
    assert {n for (n,) in low} == set(facts.low_block_kernels)


def test_text_and_db_forms_agree(loaded_faults8_text, loaded_faults8_db):
    a, b = loaded_faults8_text, loaded_faults8_db
    for sql in (
        "SELECT rank, step, start_ns, end_ns FROM steps ORDER BY ALL",
        "SELECT rank, count(*), sum(dur_ns), sum(block_dim) FROM kernels GROUP BY rank ORDER BY rank",
        "SELECT rank, core_type, count(*) FROM kernels GROUP BY ALL ORDER BY ALL",
        "SELECT rank, name, group_name, step, start_ns // 1000, dur_ns // 1000, wait_ns // 1000, bytes FROM comm_ops ORDER BY ALL",
        "SELECT rank, step, transport, count(*), sum(bytes) FROM comm_bandwidth GROUP BY ALL ORDER BY ALL",
        "SELECT rank, step, name, src_rank, dst_rank, transport, bytes FROM comm_matrix ORDER BY ALL",
        "SELECT rank, op_name, name, start_ns, dur_ns, bytes FROM comm_tasks ORDER BY ALL",
        "SELECT rank, step, computing_ns // 1000, free_ns // 1000 FROM vendor_steps ORDER BY ALL",
        "SELECT rank, group_name, group_rank FROM comm_groups ORDER BY ALL",
        "SELECT rank, kind, count(*) FROM events WHERE kind IN ('kernel', 'comm', 'step', 'runtime') GROUP BY ALL ORDER BY ALL",
        "SELECT rank, count(*) FROM events WHERE device AND corr IS NOT NULL GROUP BY rank ORDER BY rank",
    ):
        assert q(a, sql) == q(b, sql), sql


def test_breakdown_agrees_with_generated_vendor_lanes(loaded_faults8_text):
    from advisor.stages import breakdown

    ctx = loaded_faults8_text
    bd = breakdown.compute(ctx.con)
    lanes = dict(q(ctx, "SELECT rank || ':' || lane, sum(dur_ns) / 1000.0 FROM vendor_overlap GROUP BY ALL"))
    for r, g in bd.groupby("rank"):
        total = float(g["step_us"].sum())
        assert abs(g["compute_us"].sum() - lanes[f"{r}:computing"]) <= 0.01 * total
        assert abs(g["comm_us"].sum() - lanes[f"{r}:communication"]) <= 0.01 * total
        assert abs(g["comm_only_us"].sum() - lanes[f"{r}:comm_not_overlapped"]) <= 0.01 * total


@pytest.mark.slow  # broken exports in the quick suite: tests/ascend/test_partial_exports.py, test_bad_input.py
def test_broken_rank_exports(tmp_path, faults8_text):
    root = tmp_path / "cluster"
    shutil.copytree(faults8_text.root, root)
    d5 = root / faults8_text.rank_dirs[5].name / "ASCEND_PROFILER_OUTPUT"
    text = (d5 / "trace_view.json").read_text()
    (d5 / "trace_view.json").write_text(text[: len(text) // 2])  # truncated (crashed job)
    d6 = root / faults8_text.rank_dirs[6].name / "ASCEND_PROFILER_OUTPUT"
    for p in d6.iterdir():
        p.write_bytes(b"\x00\xff garbage \x01" * 10)
    ctx = load_profile(root)
    assert 5 in ctx.ranks and 6 not in ctx.ranks and len(ctx.ranks) == 7
    paths = {w.path for w in ctx.warnings}
    assert str(d5 / "trace_view.json") in paths
    assert any(w.path and faults8_text.rank_dirs[6].name in w.path for w in ctx.warnings)
    # rank 5 still has its kernels (and device events from kernel_details.csv), rank 6 nothing
    assert q(ctx, "SELECT count(*) FROM kernels WHERE rank = 5")[0][0] > 0
    assert q(ctx, "SELECT count(*) FROM events WHERE rank = 5 AND device")[0][0] > 0
    assert q(ctx, "SELECT count(*) FROM events WHERE rank = 6")[0][0] == 0


@pytest.mark.slow
def test_broken_db_rank(tmp_path, faults8_db):
    root = tmp_path / "cluster"
    shutil.copytree(faults8_db.root, root)
    db = root / faults8_db.rank_dirs[2].name / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_2.db"
    raw = db.read_bytes()
    db.write_bytes(raw[:100] + b"\x00" * 4096 + raw[4196:])  # corrupt pages after the header
    ctx = load_profile(root)
    assert [r for r in ctx.ranks if r != 2] == [0, 1, 3, 4, 5, 6, 7]
    assert any(w.path == str(db) for w in ctx.warnings)


@pytest.mark.parametrize("form", ["text", pytest.param("db", marks=pytest.mark.slow)])
def test_analyze_8_ranks_report(form, faults8_text, faults8_db):
    from advisor.analyze import analyze
    from tests.conftest import report_json

    facts = faults8_text if form == "text" else faults8_db
    data = report_json(analyze(facts.root))
    assert data["profile"]["sources"] == ["ascend_pt"]
    assert data["profile"]["ranks"] == list(range(8)) and data["profile"]["world_size"] == 8
    pairs = {(b["rank"], b["step"]) for b in data["breakdown"]}
    assert pairs == {(r, s) for r in range(8) for s in facts.steps}


@pytest.mark.slow
@pytest.mark.parametrize("form", ["text", "db"])
def test_64_ranks(form, cluster64_text, cluster64_db):
    from advisor.analyze import analyze
    from tests.conftest import report_json

    facts = cluster64_text if form == "text" else cluster64_db
    report = analyze(facts.root)
    data = report_json(report)
    assert data["profile"]["ranks"] == list(range(64)) and data["profile"]["world_size"] == 64
    assert len(data["breakdown"]) == 64 * len(facts.steps)
    assert not [w for w in data.get("warnings", []) if w["code"] in ("rank_guessed", "bad_file", "bad_export")]
    by_rank: dict[int, float] = {}
    for b in data["breakdown"]:
        by_rank[b["rank"]] = by_rank.get(b["rank"], 0.0) + b["compute_us"]
    assert max(by_rank, key=by_rank.get) == facts.slow_rank
