"""Hostile Ascend ``.db`` exports (issue 33): each is a copy of the real export of
``tests/data/ascend_real`` altered by the test itself, so no exploit is checked in.

Injected column names must not run (their subqueries and functions change no value), a view where
a table is expected is skipped with one warning line naming the file and the table while the rest
is analysed, and every statement's work is bounded."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.sqlite_safe import SafeSqlite, SqliteRefused, quote_ident

REPO = Path(__file__).resolve().parents[2]
REAL_RANK0 = REPO / "tests" / "data" / "ascend_real" / "ascend_pt_resnet_ddp_l1_db" / "rank0_ascend_pt"
DB_NAME = "ascend_pytorch_profiler_0.db"

#: a column name that, pasted unquoted into SELECT text, adds a subquery's value
SUBQUERY_COL = 'read" + (SELECT 123456789 FROM sqlite_master LIMIT 1) + "read'
#: ... and one that calls fts3_tokenizer (its one-argument, read-only form: a pointer as 8 bytes)
FUNCTION_COL = "write\" + length(fts3_tokenizer('simple')) * 1000000 + \"write"


def _copy_export(tmp_path: Path) -> tuple[Path, Path]:
    """A writable copy of the real rank-0 db export; returns (profile dir, its profiler db)."""
    root = tmp_path / "prof"
    shutil.copytree(REAL_RANK0, root / REAL_RANK0.name)
    db = root / REAL_RANK0.name / "ASCEND_PROFILER_OUTPUT" / DB_NAME
    for side in (db.with_name(DB_NAME + "-wal"), db.with_name(DB_NAME + "-shm")):
        side.unlink(missing_ok=True)
    return root, db


def _alter(db: Path, *statements: str, rows: tuple[str, list[tuple]] | None = None) -> None:
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA journal_mode = DELETE")  # nothing left in a -wal beside the copy
        for sql in statements:
            con.execute(sql)
        if rows:
            con.executemany(rows[0], rows[1])
        con.commit()
    finally:
        con.close()


def _cli(root: Path, out: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "advisor.cli", "analyze", str(root), "--format", "json", "--out", str(out),
         "--workers", "1", *extra],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False,
    )


# -- item 1: no SQL from the file's names -----------------------------------------------------------------

def _ddr_db(tmp_path: Path) -> tuple[Path, Path]:
    root, db = _copy_export(tmp_path)
    cols = ["deviceId", "timestampNs", "read", SUBQUERY_COL, FUNCTION_COL]
    _alter(db, f"CREATE TABLE DDR ({', '.join(quote_ident(c) + ' NUMERIC' for c in cols)})",
           rows=("INSERT INTO DDR VALUES (?, ?, ?, ?, ?)", [(0, 1_000, 5.0, 7.0, 11.0), (0, 2_000, 1.0, 2.0, 4.0)]))
    return root, db


def test_injected_ddr_column_names_run_nothing(tmp_path):
    from advisor.ingest.ascend_counters import db_rows

    _, path = _ddr_db(tmp_path)
    db = SafeSqlite(path)
    try:
        rows = db_rows(db, 0)
    finally:
        db.close()
    # every column whose name says read or write is summed, as stored: 5 + 7 + 11 and 1 + 2 + 4
    assert sorted((r[2], r[3]) for r in rows if r[1] == "ddr_bw_bps") == [(1_000, 23.0), (2_000, 7.0)]


@pytest.mark.slow
def test_injected_ddr_columns_through_the_cli(tmp_path):
    root, _ = _ddr_db(tmp_path)
    out = tmp_path / "r.json"
    res = _cli(root, out)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    text = out.read_text(encoding="utf-8")
    assert "123456789" not in text
    assert json.loads(text)["profile"]["ranks"]


def test_the_authorizer_allows_only_named_tables_and_functions(tmp_path):
    _, path = _copy_export(tmp_path)
    odd = 'x"; DROP TABLE TASK; --'
    _alter(path, f"CREATE TABLE {quote_ident(odd)} ({quote_ident(odd)} INTEGER)",
           f"INSERT INTO {quote_ident(odd)} VALUES (3)",
           "CREATE VIEW V AS SELECT startNs FROM TASK")
    db = SafeSqlite(path)
    try:
        assert db.query(f"SELECT {quote_ident(odd)} FROM {quote_ident(odd)}", [odd]) == [(3,)]
        # rows of TASK in the export; the same text is refused below without the function
        assert db.query("SELECT count(*) FROM TASK", ["TASK"], ["count"]) == [(552,)]
        refused = [
            ("SELECT startNs FROM TASK", ["CANN_API"], []),  # a table the statement does not name
            ("SELECT count(*) FROM TASK", ["TASK"], []),  # a function it does not name
            ("SELECT hex(fts3_tokenizer('simple')) FROM TASK", ["TASK"], ["hex"]),
            ("SELECT name FROM sqlite_master", ["TASK"], []),
            ("SELECT startNs FROM V", ["V"], []),  # a view's body reads TASK on the view's behalf
            ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r", [], []),
            ("ATTACH DATABASE ':memory:' AS other", [], []),
            ("PRAGMA writable_schema = ON", [], []),
        ]
        for sql, tables, functions in refused:
            with pytest.raises((SqliteRefused, sqlite3.Error)) as exc:
                db.query(sql, tables, functions)
            assert "\n" not in str(exc.value), sql
        assert not db.has("V") and db.notes == ["table V is a view, not a table: not read"]
    finally:
        db.close()
    assert (path.parent / DB_NAME).exists() and not path.with_name(DB_NAME + "-journal").exists()


# -- item 2: views where tables are expected, and bounded statements -------------------------------------

_ENDLESS = ("CREATE VIEW COMMUNICATION_OP AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
            "SELECT x AS opName, x AS startNs, x + 1 AS endNs, x AS connectionId, x AS groupName, x AS opId, "
            "x AS dataType, x AS count, x AS opType FROM r")


def test_a_view_is_never_read_as_a_table(tmp_path):
    from advisor.ingest.ascend_db import Db

    _, path = _copy_export(tmp_path)
    _alter(path, "ALTER TABLE COMMUNICATION_OP RENAME TO COMMUNICATION_OP_REAL", _ENDLESS)
    db = Db(path)
    try:
        assert not db.has("COMMUNICATION_OP") and db.cols("COMMUNICATION_OP") == []
        assert db.has("TASK") and db.has("communication_op_real")
        assert db.notes == ["table COMMUNICATION_OP is a view, not a table: not read"]
    finally:
        db.close()


@pytest.mark.slow
def test_endless_view_is_skipped_when_loading(tmp_path):
    from advisor.engine.context import load_profile

    root, db = _copy_export(tmp_path)
    _alter(db, "ALTER TABLE COMMUNICATION_OP RENAME TO COMMUNICATION_OP_REAL", _ENDLESS)
    t0 = time.monotonic()
    ctx = load_profile(root, max_events=10**9)
    assert time.monotonic() - t0 < 30
    notes = [w for w in ctx.warnings if "COMMUNICATION_OP" in w.message]
    assert len(notes) == 1 and notes[0].path and notes[0].path.endswith(DB_NAME) and "\n" not in notes[0].message
    # the rest of the database was read: device tasks are there, HCCL operators (COMMUNICATION_OP) are not
    n_dev = ctx.con.execute("SELECT count(*) FROM events WHERE device AND kind <> 'comm'").fetchone()[0]
    assert n_dev > 0
    assert ctx.con.execute("SELECT count(*) FROM events WHERE cat = 'HCCL'").fetchone()[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--max-events", "1000000000")], ids=["plain", "max-events"])
def test_endless_view_is_skipped_and_the_rest_analysed(tmp_path, extra):
    root, db = _copy_export(tmp_path)
    _alter(db, "ALTER TABLE COMMUNICATION_OP RENAME TO COMMUNICATION_OP_REAL", _ENDLESS)
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    res = _cli(root, out, *extra)
    assert time.monotonic() - t0 < 60
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "COMMUNICATION_OP" in ln]
    assert len(lines) == 1 and DB_NAME in lines[0] and "view" in lines[0], res.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["profile"]["ranks"] == [0]
    assert report["breakdown"]  # the tasks, host ops and CANN calls were still read


def test_every_statement_is_bounded(tmp_path, monkeypatch):
    """A statement over real tables that does far more work than the file's size warrants (here a
    cross join, with the bound made small) stops with one line naming the table."""
    from advisor import sqlite_safe

    _, path = _copy_export(tmp_path)
    monkeypatch.setattr(sqlite_safe, "BASE_STEPS", 1_000_000)
    monkeypatch.setattr(sqlite_safe, "STEPS_PER_BYTE", 0)
    db = SafeSqlite(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(SqliteRefused) as exc:
            db.query("SELECT count(*) FROM TASK a, TASK b, TASK c", ["TASK"], ["count"])
        assert time.monotonic() - t0 < 5
    finally:
        db.close()
    assert str(exc.value).startswith("table TASK: ") and "\n" not in str(exc.value)


def test_a_stopped_statement_is_one_line_naming_file_and_table(tmp_path, monkeypatch):
    """Through the loader: the stopped database is skipped with one line naming it and the table
    (it is the export's only data here, so nothing usable is left: a clean InputError)."""
    from advisor import sqlite_safe
    from advisor.engine.context import load_profile
    from advisor.ingest.base import InputError

    root, _ = _copy_export(tmp_path)
    monkeypatch.setattr(sqlite_safe, "BASE_STEPS", 50_000)
    monkeypatch.setattr(sqlite_safe, "STEPS_PER_BYTE", 0)
    with pytest.raises(InputError) as exc:
        load_profile(root)
    msg = str(exc.value)
    assert "\n" not in msg and DB_NAME in msg and "(table PYTORCH_API" in msg and "reading it took more than" in msg


@pytest.mark.slow
def test_long_name_in_a_db_is_cut_and_marked(tmp_path):
    """A 10,000-character operator name (a STRING_IDS value) is cut to 4,096 and marked."""
    import hashlib

    from advisor.engine.context import load_profile

    root, db = _copy_export(tmp_path)
    con = sqlite3.connect(db)
    sid = con.execute("SELECT name FROM PYTORCH_API GROUP BY name ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
    n_ops = con.execute("SELECT count(*) FROM PYTORCH_API WHERE name = ?", (sid,)).fetchone()[0]
    con.close()
    long = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    _alter(db, rows=("UPDATE STRING_IDS SET value = ? WHERE id = ?", [(long, sid)]))
    ctx = load_profile(root)
    want = long[:4096] + f"…[cut: 10000 chars, #{hashlib.md5(long.encode()).hexdigest()[:8]}]"
    assert ctx.con.execute("SELECT count(*) FROM events WHERE name = ?", [want]).fetchone()[0] == n_ops
    assert ctx.con.execute("SELECT max(length(name)) FROM events").fetchone()[0] == len(want)
    assert [w.path for w in ctx.warnings if w.code == "long_names"] == [str(db)]


def test_max_events_refuses_a_db(tmp_path):
    from advisor.engine.context import load_profile
    from advisor.ingest.base import InputError

    root, _ = _copy_export(tmp_path)
    with pytest.raises(InputError, match=r"more than 10 events \(--max-events 10\): refused"):
        load_profile(root, max_events=10)
