"""The Ascend readers as declared data: the contract, the order, the stages, and a new file kind."""

from __future__ import annotations

import dataclasses
import re
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from advisor.ingest import ascend_readers, ascend_text, load
from advisor.ingest.ascend_readers import (
    READERS,
    AscendReader,
    BatchReader,
    DerivedReader,
    ReaderDeclarationError,
    ordered,
    role_of_name,
)
from advisor.ingest.base import LoadContext
from advisor.schema import TABLES

SAMPLES = Path(__file__).resolve().parents[2] / "sample_profiles"


# -- the declarations ---------------------------------------------------------------------------------


def test_every_reader_keeps_the_contract() -> None:
    names = [r.name for r in READERS]
    assert len(names) == len(set(names))
    roles = [r.role for r in READERS if r.role is not None]
    assert len(roles) == len(set(roles)), "one reader per role"
    for r in READERS:
        assert isinstance(r, AscendReader)
        assert r.form in ("text", "db", "any")
        assert set(r.yields) <= set(TABLES), r.name
        assert set(r.needs) <= set(names), r.name
        assert (r.role is None) == (not r.patterns), r.name
        for p in r.patterns:
            re.compile(p)


@pytest.mark.parametrize(
    ("file_name", "role"),
    [
        ("trace_view.json", "trace"),
        ("trace_view.json.gz", "trace"),
        ("KERNEL_DETAILS.CSV", "kernels"),
        ("kernel_details.csv", "kernels"),
        ("step_trace_time.csv", "step_trace"),
        ("communication.json", "comm"),
        ("communication_matrix.json", "matrix"),
        ("op_statistic.csv", "op_stat"),
        ("api_statistic.csv", "api_stat"),
        ("memory_record.csv", "memory_record"),
        ("npu_module_mem.csv", "module_mem"),
        ("minddata_pipeline_raw_0.csv", "minddata"),
        ("analysis.db", "analysis_db"),
        ("communication_analyzer.db", "analysis_db"),
        ("ascend_pytorch_profiler_3.db", "db"),
        ("ascend_mindspore_profiler.db", "db"),
        ("profiler_info_5.json", "info"),
        ("profiler_info.json", "info"),
        ("profiler_metadata.json", "metadata"),
        ("operator_details.csv", "operator_details"),  # recognised, not read
        ("profiler_info_x.json", None),
        ("kernel_details.csv.bak", None),
        ("notes.csv", None),
    ],
)
def test_a_file_gets_its_role_from_the_readers_patterns(file_name: str, role: str | None) -> None:
    assert role_of_name(file_name) == role


def _derived(name: str, needs: tuple[str, ...] = ()) -> DerivedReader:
    return DerivedReader(name, (), lambda ctx: None, needs=needs)


def test_readers_run_after_what_they_need() -> None:
    run = [r.name for r in ordered(READERS)]
    for r in READERS:
        assert all(run.index(n) < run.index(r.name) for n in r.needs), r.name
    # list order otherwise
    a, b, c = _derived("a", ("c",)), _derived("b"), _derived("c")
    assert [r.name for r in ordered([a, b, c])] == ["b", "c", "a"]
    with pytest.raises(ReaderDeclarationError, match="unknown"):
        ordered([_derived("a", ("nothing",))])
    with pytest.raises(ReaderDeclarationError, match="cycle"):
        ordered([_derived("a", ("b",)), _derived("b", ("a",))])


# -- named stages ---------------------------------------------------------------------------------------


class _Spy:
    """A cursor that records the temp tables and views created through it."""

    def __init__(self, cur: Any, names: list[str]) -> None:
        self._cur, self._names = cur, names

    def execute(self, sql: str, *args: Any) -> Any:
        self._names += re.findall(r"CREATE (?:OR REPLACE )?TEMP TABLE (\w+)", sql)
        return self._cur.execute(sql, *args)

    def register(self, name: str, obj: Any) -> Any:
        self._names.append(name)
        return self._cur.register(name, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


@pytest.mark.slow
def test_sql_stages_are_named_for_what_they_hold(monkeypatch, faults8_text, faults8_db) -> None:
    names: list[str] = []
    real = LoadContext.cursor
    monkeypatch.setattr(LoadContext, "cursor", lambda self: _Spy(real(self), names))
    for root in (faults8_text.root, faults8_db.root):
        load(root).con.close()
    stages = set(names)
    assert {"stage_trace_slices", "stage_kernel_details_csv", "stage_db_device_tasks"} <= stages
    numbered = sorted(n for n in stages if re.search(r"\d", n))
    assert not numbered
    assert all(re.fullmatch(r"stage_[a-z_]+|_chunk", n) for n in stages), sorted(stages)


# -- a new file kind is one reader ----------------------------------------------------------------------

# a made-up counter file: timestamps in µs (as the Ascend CSVs write them), one gauge in percent
TOY_ROWS = [("1700000000000000.500", "12.5"), ("1700000000001000.250", "50"), ("1700000000002000.000", "99.75")]


def _load_toy(cur: Any, jobs: list[ascend_text.Job]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}

    def one(cols: dict[str, str], gjobs: list[ascend_text.Job]) -> None:
        c = ascend_text.require(cols, gjobs, ts=("Timestamp(us)",), v=("Gauge(%)",))
        cur.execute(
            f"""INSERT INTO hw_metrics (rank, metric, ts_ns, value)
            SELECT rank, 'toy_gauge_pct', {ascend_text.us_ns(c["ts"])}, {ascend_text.num(c["v"])} FROM stage_toy_csv"""
        )
        out.update({j.fno: {} for j in gjobs})

    ascend_text.csv_groups(cur, jobs, "stage_toy_csv", one)
    return out


TOY = BatchReader("toy_gauge", "toy", (r"npu_toy_gauge\.csv",), ("hw_metrics",), _load_toy)


def _export_with_toy_file(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "ascend_pt_kernels"
    shutil.copytree(SAMPLES / "ascend_pt_kernels", root)
    toy = root / "ASCEND_PROFILER_OUTPUT" / "npu_toy_gauge.csv"
    toy.write_text("Timestamp(us),Gauge(%)\n" + "".join(f"{t},{v}\n" for t, v in TOY_ROWS))
    return root, toy


def test_a_new_file_kind_is_one_reader(monkeypatch, tmp_path) -> None:
    root, toy = _export_with_toy_file(tmp_path)
    q = "SELECT ts_ns, value FROM hw_metrics WHERE metric = 'toy_gauge_pct' ORDER BY ts_ns"
    files = "SELECT path FROM profile_files"

    before = load(root)
    assert before.con.execute(q).fetchall() == []
    assert str(toy) not in {p for (p,) in before.con.execute(files).fetchall()}

    monkeypatch.setattr(ascend_readers, "READERS", [*READERS, TOY])
    after = load(root)
    want = [(int(Decimal(t) * 1000), float(v)) for t, v in TOY_ROWS]
    assert after.con.execute(q).fetchall() == want
    assert str(toy) in {p for (p,) in after.con.execute(files).fetchall()}
    assert after.con.execute("SELECT DISTINCT rank FROM hw_metrics").fetchall() == [(0,)]
    # the rest of the export loads as before
    for table in ("events", "kernels"):
        n = f"SELECT count(*) FROM {table}"
        assert after.con.execute(n).fetchall() == before.con.execute(n).fetchall()


def test_a_bad_file_of_a_new_kind_costs_only_that_file(monkeypatch, tmp_path) -> None:
    root, toy = _export_with_toy_file(tmp_path)
    toy.write_text("Timestamp(us),Other\n1,2\n")
    monkeypatch.setattr(ascend_readers, "READERS", [*READERS, TOY])
    prof = load(root)
    assert prof.con.execute("SELECT count(*) FROM hw_metrics").fetchall() == [(0,)]
    assert prof.con.execute("SELECT count(*) FROM kernels").fetchall()[0][0] > 0
    (w,) = [w for w in prof.warnings if w.path == str(toy)]
    assert w.code == "bad_csv" and "Gauge(%)" in w.message


def test_a_reader_needing_an_unknown_reader_is_refused(monkeypatch, tmp_path) -> None:
    root, _toy = _export_with_toy_file(tmp_path)
    monkeypatch.setattr(ascend_readers, "READERS", [*READERS, dataclasses.replace(TOY, needs=("no_such",))])
    with pytest.raises(ReaderDeclarationError, match="no_such"):
        load(root)


# -- STRING_IDS lookups ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "dense"),
    [
        ([0, 1, 2, 5], True),  # holes: unknown ids inside the range
        ([], True),  # no strings at all
        ([3, 3, 4], False),  # an id twice: a join, which gives the row twice, as the ids say
        ([-1, 0, 1], False),  # a negative id
        ([0, 10**12], False),  # too sparse for a list
    ],
)
def test_string_ids_resolve_as_a_join_would(ids: list[int], dense: bool) -> None:
    import duckdb

    from advisor.ingest.ascend_db import _Strings

    cur = duckdb.connect()
    cur.execute("CREATE TABLE sid (id BIGINT, value VARCHAR)")
    for i, v in enumerate(ids):
        cur.execute("INSERT INTO sid VALUES (?, ?)", [v, None if i == 1 else f"s{v}"])  # one NULL string
    probes = [0, 1, 2, 3, 4, 5, 6, -1, -2, None, 10**12, 2**62]
    cur.execute("CREATE TABLE k AS SELECT * FROM (SELECT unnest(?::BIGINT[]) AS name)", [probes])
    strs = _Strings(cur, "sid", "t")
    assert strs.dense is dense
    got = cur.execute(f"SELECT k.name, {strs.val('sn', 'k.name')} AS v FROM k {strs.joins()} ORDER BY ALL").fetchall()
    want = cur.execute("SELECT k.name, sn.value FROM k LEFT JOIN sid sn ON sn.id = k.name ORDER BY ALL").fetchall()
    assert got == want
    assert strs.joins() == ("CROSS JOIN t_string_list _sl" if dense else "")  # the joins start afresh
