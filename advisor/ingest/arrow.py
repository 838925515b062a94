"""Tables as values between processes: a query's rows as Arrow IPC bytes, and such bytes appended
to a table of another DuckDB (a shard's summary into the reduce's)."""

from __future__ import annotations

from typing import Any

from advisor.schema import OWN_TABLES_SQL


def to_ipc(table: Any) -> bytes:
    """A pyarrow Table as Arrow IPC stream bytes."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def query_arrow(cur: Any, sql: str) -> Any:
    """The rows of ``sql`` as a pyarrow Table."""
    rel = cur.sql(sql)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


def from_ipc(data: bytes) -> Any:
    """The pyarrow Table of Arrow IPC stream bytes."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def adopt(cur: Any, name: str, data: bytes, first_file_id: int) -> None:
    """Append a table's rows (Arrow IPC bytes) to the table ``name`` of ``cur``'s database, created
    with their columns if it does not exist; their file ids moved up by ``first_file_id``."""
    table = from_ipc(data)
    cur.register("_shard_rows", table)
    try:
        exists = cur.execute(f"SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND {OWN_TABLES_SQL}",
                             [name]).fetchone()[0]
        if not exists:
            cur.execute(f"CREATE TABLE {name} AS SELECT * FROM _shard_rows LIMIT 0")
        cols = [c for c in table.column_names]
        select = ", ".join(f'"{c}" + {int(first_file_id)}' if c == "file_id" else f'"{c}"' for c in cols)
        names = ", ".join(f'"{c}"' for c in cols)
        cur.execute(f"INSERT INTO {name} ({names}) SELECT {select} FROM _shard_rows")
    finally:
        cur.unregister("_shard_rows")
