"""The cluster generator writes files with the real layout: headers, keys, units, process and thread
names are checked against the real samples and against the tables of the format doc."""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from tests.ascend import gen_cluster

# one worker runs this module: its module-scoped fixtures are built once
pytestmark = pytest.mark.xdist_group("ascend_generator")

SAMPLES = Path(__file__).resolve().parents[2] / "sample_profiles"
ASCEND_DATA = Path(__file__).resolve().parents[1] / "data" / "ascend"  # provenance: its README.md
DOC = ASCEND_DATA / "ascend-formats.md"
REAL_TRACE = ASCEND_DATA / "ascend_pt_timeline" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
REAL_KD = SAMPLES / "ascend_pt_kernels" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"

TICK = re.compile(r"`([^`]+)`")


def doc_table(heading: str, nth: int = 0) -> list[list[str]]:
    """Rows (cells) of the nth markdown table after the line starting with ``heading``."""
    lines = DOC.read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(heading))
    tables: list[list[list[str]]] = []
    cur: list[list[str]] = []
    for ln in lines[i + 1 :]:
        if ln.startswith("#") and tables:
            break
        if ln.startswith("|"):
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                cur.append(cells)
        elif cur:
            tables.append(cur[1:])  # drop the header row
            cur = []
            if len(tables) > nth:
                break
    if cur:
        tables.append(cur[1:])
    return tables[nth]


def first_col_names(heading: str, nth: int = 0) -> list[str]:
    return [n for row in doc_table(heading, nth) for n in TICK.findall(row[0])]


def columns_cell(cell: str) -> set[str]:
    """Column names of a doc cell, without parenthesised remarks and optional/alternative ones."""
    cell = re.sub(r"\([^)]*\)", "", cell)
    cell = re.split(r"\boptional\b", cell)[0]
    names = set(TICK.findall(cell))
    return names - {"blockNum", "mixBlockNum"}  # the doc's "or" alternative of blockDim/mixBlockDim


@pytest.fixture(scope="module")
def gen_both(tmp_path_factory) -> gen_cluster.Facts:
    return gen_cluster.generate("faults8", tmp_path_factory.mktemp("gen_both"), "both")


@pytest.fixture(scope="module")
def real_trace() -> list[dict]:
    return json.loads(REAL_TRACE.read_text())


def _classes(events: list[dict]) -> tuple[dict, dict, dict]:
    pname = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    keys: dict[tuple, set[frozenset]] = defaultdict(set)
    args: dict[tuple, set[frozenset]] = defaultdict(set)
    meta: dict[str, dict[str, object]] = defaultdict(dict)
    for e in events:
        cls = (pname.get(e["pid"]), e["ph"], e.get("cat"))
        keys[cls].add(frozenset(e))
        if e["ph"] == "X":
            args[cls].add(frozenset(e.get("args", {})))
        if e["ph"] == "M" and e["name"] in ("process_labels", "process_sort_index"):
            meta[pname.get(e["pid"])][e["name"]] = next(iter(e["args"].values()))
    return keys, args, meta


def test_layout_and_file_names(gen_both):
    assert len(gen_both.rank_dirs) == gen_both.scenario.world
    for rank, d in gen_both.rank_dirs.items():
        assert re.match(r"^[\w.-]+_\d+_\d{17}_ascend_pt$", d.name), d.name  # format doc §2.1
        assert (d / f"profiler_info_{rank}.json").is_file()
        assert (d / "profiler_metadata.json").is_file()
        names = {p.name for p in (d / "ASCEND_PROFILER_OUTPUT").iterdir()}
        assert names == {
            "trace_view.json",
            "kernel_details.csv",
            "step_trace_time.csv",
            "communication.json",
            "communication_matrix.json",
            "op_statistic.csv",
            f"ascend_pytorch_profiler_{rank}.db",
            "analysis.db",
        }


def test_trace_view_matches_real_sample(gen_both, real_trace):
    gen = json.loads((gen_both.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    assert isinstance(gen, list)  # bare array, no {"traceEvents": ...} (format doc §5.1)
    rk, ra, rm = _classes(real_trace)
    gk, ga, gm = _classes(gen)
    common = set(rk) & set(gk)
    assert {c[0] for c in common} >= {"Python", "CANN", "Ascend Hardware", "Overlap Analysis"}
    for cls in common:
        assert set().union(*gk[cls]) <= set().union(*rk[cls]), cls  # no event key the real file lacks
        if cls in ra and cls in ga and cls[0] != "Ascend Hardware":
            assert ga[cls] <= ra[cls], (cls, ga[cls] - ra[cls])
    hw = ("Ascend Hardware", "X", None)
    assert ga[hw] == ra[hw]  # Model Id, Task Type, Stream Id, Task Id, Batch Id, Subtask Id, connection_id
    for proc in ("Python", "CANN", "Ascend Hardware", "Overlap Analysis"):
        assert gm[proc] == rm[proc], proc  # labels CPU/NPU and sort indexes 0, 2, 8, 11

    # Overlap Analysis thread names by tid, and their events named after their lane
    def lanes(ev):
        pid = next(e["pid"] for e in ev if e["ph"] == "M" and e["args"].get("name") == "Overlap Analysis")
        return {
            e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["pid"] == pid and e["name"] == "thread_name"
        }

    assert lanes(gen) == lanes(real_trace)
    # units and types: ts a string with three decimals, dur a number; flow id types per category
    for ev in (gen, real_trace):
        assert all(re.match(r"^\d+\.\d{3}$", e["ts"]) for e in ev if "ts" in e)
        assert all(isinstance(e["dur"], (int, float)) for e in ev if e["ph"] == "X")

    def id_types(ev):
        return {(e["cat"], type(e["id"]).__name__) for e in ev if e["ph"] in ("s", "f")}

    assert id_types(gen) - {("async_task_queue", "int")} <= id_types(real_trace) | {("fwdbwd", "int")}
    assert {("HostToDevice", "str"), ("async_npu", "int")} <= id_types(gen)
    # thread names 'Thread <tid>' on host processes, 'Stream <id>' on the device lane (as in the real file)
    tn = [e["args"]["name"] for e in gen if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(re.match(r"^Stream \d+$", n) for n in tn) and any(re.match(r"^Thread \d+$", n) for n in tn)


def test_trace_hccl_lanes_follow_the_format_doc(gen_both):
    gen = json.loads((gen_both.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    pid = next(e["pid"] for e in gen if e["ph"] == "M" and e["args"].get("name") in ("HCCL", "Communication"))
    threads = {
        e["tid"]: e["args"]["name"] for e in gen if e["ph"] == "M" and e["pid"] == pid and e["name"] == "thread_name"
    }
    ops = {t for t, n in threads.items() if re.match(r"^Group \d+ Communication$", n)}
    planes = {t for t, n in threads.items() if re.match(r"^Plane \d+$", n)}
    assert ops and planes and all(t - 1 in ops for t in planes)  # plane tid = op lane tid + p + 1 (addendum)
    task_args = {frozenset(e["args"]) for e in gen if e["ph"] == "X" and e["pid"] == pid and e["tid"] in planes}
    read_by_msprof = {"task type", "stream id", "task id", "transport type", "link type", "size(Byte)"}  # §5.6
    assert all(read_by_msprof <= a and "notify_id" in a for a in task_args)
    op_args = {frozenset(e["args"]) for e in gen if e["ph"] == "X" and e["pid"] == pid and e["tid"] in ops}
    assert op_args == {
        frozenset({"connection_id", "model id", "data_type", "alg_type", "count", "relay", "retry", "rank_size"})
    }


def test_kernel_details_header_and_cells(gen_both):
    with REAL_KD.open(newline="") as fh:
        real_header = next(csv.reader(fh))
    path = gen_both.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    raw = path.read_bytes()
    assert b"\r\n" in raw  # Python csv's CR LF, as torch_npu writes (format doc §3.3)
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == real_header
    body = [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]
    assert all(re.match(r'^".*"$', r["Input Shapes"]) or r["Input Shapes"] == "N/A" for r in body)
    hccl = [r for r in body if r["Accelerator Core"] == "HCCL"]
    assert hccl and all(
        r["Task ID"] == "N/A" and r["Stream ID"] == "N/A" and r["Block Dim"] == "0" for r in hccl
    )  # §6.3
    assert all(re.match(r"^hcom_[A-Za-z]+__\d{3}_\d+(_\d+)?$", r["Name"]) for r in hccl)  # §8.4 / addendum
    cores = {r["Accelerator Core"] for r in body}
    assert {"AI_CORE", "AI_VECTOR_CORE", "AI_CPU", "HCCL"} <= cores


def test_csv_headers_match_the_format_doc(gen_both):
    out = gen_both.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT"
    with (out / "step_trace_time.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == first_col_names("## 7.")
    op_stat_doc = [n for row in doc_table("## 11.") for n in TICK.findall(row[0]) if "[U]" not in row[-1]]
    with (out / "op_statistic.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == op_stat_doc


def test_communication_json_keys_match_the_format_doc(gen_both):
    out = gen_both.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT"
    comm = json.loads((out / "communication.json").read_text())
    assert all(re.match(r"^step\d+$", k) for k in comm)
    time_keys = first_col_names("### 8.2")
    bw_keys = set(first_col_names("### 8.3"))
    n_ops = 0
    for step in comm.values():
        assert set(step) <= {"collective", "p2p"}
        for kind in step.values():
            assert "Total Op Info" in kind
            for key, op in kind.items():
                if key == "Total Op Info":
                    continue
                assert re.match(r"^hcom_\w+@\d+$", key)
                n_ops += 1
                assert list(op) == ["Communication Time Info", "Communication Bandwidth Info"]
                assert list(op["Communication Time Info"]) == time_keys
                assert set(op["Communication Bandwidth Info"]) == set(gen_cluster.TRANSPORTS)
                assert all(set(v) == bw_keys for v in op["Communication Bandwidth Info"].values())
                assert isinstance(op["Communication Time Info"]["Start Timestamp(us)"], (int, float))
    assert n_ops > 0
    matrix = json.loads((out / "communication_matrix.json").read_text())
    link_keys = {"Transport Type", "Transit Size(MB)", "Transit Time(ms)", "Bandwidth(GB/s)"}  # §9
    for step in matrix.values():
        for kind in step.values():
            for key, links in kind.items():
                assert re.match(r"^[a-z]+-(top1|middle|bottom[123]|total)@\d+$", key), key
                for lk, v in links.items():
                    assert re.match(r"^\d+-\d+$", lk)
                    assert set(v) == (link_keys if "-total@" in key else link_keys | {"Op Name"})


def test_profiler_info_and_metadata_keys(gen_both):
    d = gen_both.rank_dirs[3]
    info = json.loads((d / "profiler_info_3.json").read_text())
    for row in doc_table("## 15."):
        for key in TICK.findall(row[0]):
            node = info
            for part in key.split("."):
                assert part in node, key
                node = node[part]
    exp_doc = set(TICK.findall(next(r for r in doc_table("## 15.") if "experimental_config" in r[0])[1]))
    assert set(info["config"]["experimental_config"]) <= exp_doc
    meta = json.loads((d / "profiler_metadata.json").read_text())
    doc_keys = {n for row in doc_table("## 16.") for n in TICK.findall(row[0])}
    assert set(meta) <= doc_keys
    env_doc = set(TICK.findall(next(r for r in doc_table("## 16.") if "ENV_VARIABLES" in r[0])[1]))
    assert set(meta["ENV_VARIABLES"]) <= env_doc
    for g in meta["parallel_group_info"].values():
        assert set(g) == {"group_name", "group_rank", "global_ranks"}
        assert g["global_ranks"][g["group_rank"]] == 3


def test_db_tables_have_the_documented_columns(gen_both):
    d = gen_both.rank_dirs[0] / "ASCEND_PROFILER_OUTPUT"

    def columns(path: Path) -> dict[str, dict[str, str]]:
        con = sqlite3.connect(path)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {t: {r[1]: r[2] for r in con.execute(f'PRAGMA table_info("{t}")')} for t in tables}
        finally:
            con.close()

    prof = columns(d / "ascend_pytorch_profiler_0.db")
    checked = 0
    for nth in (0, 1):  # CANN tables, then the tables torch_npu adds
        for row in doc_table("### 17.2", nth):
            for table in TICK.findall(row[0]):
                if table not in prof:
                    continue
                want = columns_cell(row[2])
                assert want <= set(prof[table]), (table, want - set(prof[table]))
                checked += 1
    assert checked >= 10
    assert prof["PYTORCH_API"]["startNs"] == "TEXT" and prof["PYTORCH_API"]["endNs"] == "TEXT"  # the §17.2 gotcha
    ana = columns(d / "analysis.db")
    for row in doc_table("### 17.3"):
        (table,) = TICK.findall(row[0])
        assert columns_cell(row[2]) <= set(ana[table]), table


def test_generation_stays_in_tmp(faults8_text, tmp_path_factory):
    base = str(tmp_path_factory.getbasetemp())
    assert faults8_text.files and all(str(p).startswith(base) for p in faults8_text.files)


@pytest.mark.slow
def test_64_rank_generation_stays_in_tmp(tmp_path):
    facts = gen_cluster.generate("cluster64", tmp_path / "c64", "text")
    assert len(facts.rank_dirs) == 64
    assert all(str(p).startswith(str(tmp_path)) for p in facts.files)