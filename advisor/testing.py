"""Helpers for tests: build an analysis context from canonical rows (no export files needed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from advisor.engine.context import AnalysisContext
from advisor.ingest import connect
from advisor.ingest.steps import finalize
from advisor.schema import TABLES, insert_rows

EVENT_DEFAULTS = {"device": False, "dur_ns": 0, "cat": "", "pid": "1", "tid": "1", "file_id": 0}


def _insert(con: Any, table: str, cols: Sequence[str], values: list[tuple[Any, ...]]) -> None:
    """The rows into ``table`` through one Arrow table (DuckDB casts each column to the table's
    type); rows whose values Arrow cannot type as one column go in as SQL parameters."""
    import pyarrow as pa

    try:
        arrow = pa.Table.from_pylist([dict(zip(cols, v, strict=True)) for v in values])
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        insert_rows(con, table, values, chunk=200)
        return
    _advisor_rows = arrow  # read by name by DuckDB's scan of Python objects (no view to register and drop)
    names = ", ".join('"' + c + '"' for c in cols)
    con.execute(f"INSERT INTO {table} SELECT {names} FROM _advisor_rows")


def context_from_tables(tables: dict[str, list[dict[str, Any]]], *, run_stages: bool = True) -> AnalysisContext:
    """Insert canonical rows (missing columns become NULL / defaults), finalize steps, run the stages.

    ``ranks`` rows are derived from ``events`` when not given.
    """
    from advisor.stages import breakdown
    from advisor.stages.sequence import choose_focus, critical_path_of

    con = connect()
    con.create_tables()
    for name, rows in tables.items():
        if name not in TABLES:
            raise KeyError(f"unknown canonical table {name!r}")
        cols = TABLES[name].column_names
        base = EVENT_DEFAULTS if name == "events" else {}
        values = []
        for row in rows:
            unknown = set(row) - set(cols)
            if unknown:
                raise KeyError(f"{name}: unknown columns {sorted(unknown)}")
            values.append(tuple(row.get(c, base.get(c)) for c in cols))
        if values:
            _insert(con, name, cols, values)
    if "ranks" not in tables:
        con.execute(
            """INSERT INTO ranks (rank, source, has_device, rank_source, files)
            SELECT rank, 'kineto', bool_or(device AND kind IN ('kernel','comm','memcpy','memset')), 'test', ''
            FROM events GROUP BY rank"""
        )
    warnings: list[Any] = []

    def warn(code: str, message: str, path: Any = None) -> None:
        from advisor.model import Warning_

        warnings.append(Warning_(code, message, None if path is None else str(path)))

    finalize(con, warn)
    ranks = [r[0] for r in con.execute("SELECT DISTINCT rank FROM ranks ORDER BY rank").fetchall()]
    sources = [r[0] for r in con.execute("SELECT DISTINCT source FROM ranks").fetchall()]
    ctx = AnalysisContext(con=con, path="<tables>", sources=sources, ranks=ranks, warnings=warnings)
    if run_stages:
        ctx.breakdown = breakdown.compute(con)
        breakdown.store(con, ctx.breakdown)
        ctx.focus_rank, ctx.focus_step = choose_focus(ctx, None, None)
        ctx.critical_path = critical_path_of(ctx, ctx.warnings)
    return ctx
