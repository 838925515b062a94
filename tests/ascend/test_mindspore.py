"""MindSpore ``*_ascend_ms`` exports (format doc §20): string ``dur``, the ``MindSpore`` framework lane,
``mindspore_to_npu`` flows with string ids, ``Step ID``, ``<launch op>/<kernel>`` names, no Device_id."""

from __future__ import annotations

import csv
import json
import shutil
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from advisor.engine.context import load_profile
from tests.ascend import gen_cluster

# one worker runs this module: its module-scoped fixtures are built once
pytestmark = pytest.mark.xdist_group("mindspore")


@pytest.fixture(scope="module")
def ms4(tmp_path_factory):
    facts = gen_cluster.generate("mindspore4", tmp_path_factory.mktemp("ms4"), "text")
    return facts, load_profile(facts.root)


def q(ctx, sql, params=None):
    return ctx.con.cursor().execute(sql, params or []).fetchall()


def test_ranks_flavour_and_sources(ms4):
    _facts, ctx = ms4
    assert ctx.ranks == [0, 1, 2, 3]
    assert q(ctx, "SELECT DISTINCT rank_source FROM ranks") == [("profiler_info",)]
    assert q(ctx, "SELECT DISTINCT value FROM meta WHERE key = 'ascend.flavor'") == [("ascend_ms",)]
    assert q(ctx, "SELECT DISTINCT source FROM profile_files") == [("ascend_ms",)]
    # ranks.source says ascend_ms once the orchestrator maps every name in ascend.SOURCES (see the report)
    assert set(ctx.sources) <= {"ascend_pt", "ascend_ms"}
    assert q(ctx, "SELECT DISTINCT value FROM meta WHERE key = 'ms_version'") == [("2.5.0",)]


def test_string_durations_and_framework_lane(ms4):
    facts, ctx = ms4
    raw = json.loads((facts.rank_dirs[2] / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    host = [e for e in raw if e["ph"] == "X" and e["pid"] == 1]
    assert host and all(isinstance(e["dur"], str) for e in host)
    want = sum(int((Decimal(e["dur"]) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP)) for e in host)
    assert q(ctx, "SELECT sum(dur_ns) FROM events WHERE rank = 2 AND pid = '1'")[0][0] == want
    steps = sorted(int(e["name"].split("#")[1]) for e in host if e["name"].startswith("ProfilerStep#"))
    assert [s for (s,) in q(ctx, "SELECT step FROM steps WHERE rank = 2 ORDER BY step")] == steps


def test_string_flow_ids_link_framework_ops_to_tasks(ms4):
    facts, ctx = ms4
    raw = json.loads((facts.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    flows = [e for e in raw if e.get("cat") == "async_npu" and e["ph"] == "f"]
    assert flows and all(isinstance(e["id"], str) for e in flows)
    n_tasks = len({e["ts"] for e in flows})
    assert (
        q(ctx, "SELECT count(*) FROM events WHERE rank = 0 AND device AND kind = 'kernel' AND ext_id IS NOT NULL")[0][0]
        == n_tasks
    )


def test_kernel_details_step_id_and_names(ms4):
    facts, ctx = ms4
    with (facts.rank_dirs[1] / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert "Step ID" in rows[0] and "Device_id" not in rows[0]
    assert q(ctx, "SELECT count(*), count(step) FROM kernels WHERE rank = 1") == [
        (len(rows), sum(1 for r in rows if r["Step ID"]))
    ]
    slash = sum(1 for r in rows if "/" in r["Name"])
    assert slash and q(ctx, "SELECT count(*) FROM kernels WHERE rank = 1 AND name LIKE '%/%'")[0][0] == slash
    with (facts.rank_dirs[1] / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").open(newline="") as fh:
        st = list(csv.DictReader(fh))
    assert "Device_id" not in st[0]
    assert q(ctx, "SELECT count(*) FROM vendor_steps WHERE rank = 1")[0][0] == len(st)


def test_rank_from_ms_profiler_info_content(tmp_path, ms4):
    facts, _ = ms4
    d = tmp_path / "one" / facts.rank_dirs[3].name
    shutil.copytree(facts.rank_dirs[3], d)
    (d / "profiler_info_3.json").rename(d / "profiler_info.json")  # no rank in the name: ms_profiler_info.rank_id ("3")
    ctx = load_profile(tmp_path / "one")
    assert ctx.ranks == [3]
    assert q(ctx, "SELECT rank_source FROM ranks") == [("profiler_info",)]


def test_mindspore_db_name_gives_flavour_and_rank(tmp_path, faults8_db):
    src = faults8_db.rank_dirs[4] / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_4.db"
    out = tmp_path / "x" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    shutil.copy(src, out / "ascend_mindspore_profiler_6.db")
    ctx = load_profile(tmp_path / "x")
    assert ctx.ranks == [6]
    assert q(ctx, "SELECT DISTINCT value FROM meta WHERE key = 'ascend.flavor'") == [("ascend_ms",)]
    assert q(ctx, "SELECT count(*) FROM kernels")[0][0] > 0


def test_mindspore_generator_layout(ms4):
    facts, _ = ms4
    for rank, d in facts.rank_dirs.items():
        assert d.name.endswith("_ascend_ms")
        info = json.loads((d / f"profiler_info_{rank}.json").read_text())
        assert info["ms_profiler_info"]["rank_id"] == str(rank)  # a string (format doc §15, §20)
    assert Path(facts.root).is_dir()


def test_minddata_queue_samples(tmp_path, ms4):
    """Dataset-pipeline queue samples -> ``queues``: the root op is the host queue, its children the data queue."""
    facts, _ = ms4
    d = tmp_path / "q" / facts.rank_dirs[0].name
    shutil.copytree(facts.rank_dirs[0], d)
    rows = [
        ["op_id", "op_type", "num_workers", "output_queue_size", "output_queue_average_size", "output_queue_length",
         "output_queue_usage_rate", "sample_interval", "parent_id", "children_id"],
        ["0", "DeviceQueue", "1", "[2, 1, 0, 0]", "0.75", "64", "0.01", "10", "-1", "[1]"],
        ["1", "Batch", "4", "[5, 6, 7, 8]", "6.5", "64", "0.1", "10", "0", "[2]"],
        ["2", "Map", "8", "[1, 1, 1, 1]", "1", "64", "0.02", "10", "1", "[]"],
    ]
    with (d / "ASCEND_PROFILER_OUTPUT" / "minddata_pipeline_raw_0.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    ctx = load_profile(tmp_path / "q")
    got = q(ctx, "SELECT queue, ts_ns, size FROM queues ORDER BY queue, ts_ns")
    want = [("data", i * 10_000_000, s) for i, s in enumerate((5, 6, 7, 8))] + [("host", i * 10_000_000, s) for i, s in enumerate((2, 1, 0, 0))]
    assert got == want
