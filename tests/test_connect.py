"""The analyses' DuckDB databases: one instance shared per process, a database of its own each."""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from advisor import ingest
from advisor.analyze import analyze
from advisor.ingest import connect
from advisor.schema import OWN_TABLES_SQL, TABLES, create_all
from tests.conftest import SAMPLES, TRACES, report_json
from tests.test_determinism import _strip


def _attached(con: ingest.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}


def test_each_connection_has_its_own_tables() -> None:
    a, b = connect(), connect()
    a.create_tables()
    b.create_tables()
    assert a.db != b.db
    a.execute("INSERT INTO meta VALUES (0, 'k', 'v')")
    assert a.execute("SELECT count(*) FROM meta").fetchone() == (1,)
    assert b.cursor().execute("SELECT count(*) FROM meta").fetchone() == (0,)
    names = {r[0] for r in b.execute(f"SELECT table_name FROM duckdb_tables() WHERE {OWN_TABLES_SQL}").fetchall()}
    assert names == set(TABLES)


def test_a_database_is_detached_once_closed_or_unused() -> None:
    a, b = connect(), connect()
    name_a, name_b = a.db, b.db
    cur = b.cursor()
    a.close()
    del b
    gc.collect()
    c = connect()  # detaches what nobody uses any more
    assert name_a not in _attached(c)
    assert cur.execute("SELECT 1").fetchone() == (1,) and name_b in _attached(c)  # a cursor keeps it
    del cur
    gc.collect()
    assert name_b not in _attached(connect())


def test_a_memory_limit_is_the_connections_own() -> None:
    limited = connect(memory_limit="1GB")
    shared = connect()
    assert limited.db not in _attached(shared)
    assert shared.execute("SELECT current_setting('memory_limit')").fetchone() != ("953.6 MiB",)
    assert limited.execute("SELECT current_setting('memory_limit')").fetchone() == ("953.6 MiB",)  # 1e9 B


def test_analyses_side_by_side_in_one_process() -> None:
    """Analyses run at once in threads of one process (a Dask worker's) each give their own report."""
    paths: list[Path] = [TRACES / "cpu_healthy", SAMPLES / "ascend_pt_timeline"]
    alone = [_strip(report_json(analyze(p))) for p in paths]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: _strip(report_json(analyze(p))), paths * 2))
    assert together == alone * 2


def test_the_copied_tables_are_those_create_all_makes() -> None:
    """create_tables copies a template's schema: the columns (types, defaults, nullability) and the
    event_kind type are those of create_all."""
    made, copied = connect(), connect()
    create_all(made)
    copied.create_tables()

    def schema(con: ingest.Connection) -> list[tuple[object, ...]]:
        cur = con.cursor()
        return [*cur.execute(
            "SELECT table_name, column_index, column_name, data_type, column_default, is_nullable FROM duckdb_columns() "
            "WHERE database_name = current_database() ORDER BY ALL").fetchall(),
            *cur.execute("SELECT type_name, logical_type, labels FROM duckdb_types() "
                         "WHERE database_name = current_database() AND type_name = 'event_kind'").fetchall()]

    assert len(schema(made)) > len(TABLES) and schema(copied) == schema(made)
