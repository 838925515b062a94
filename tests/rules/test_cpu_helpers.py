"""Unit tests for the SQL building blocks in rules/cpu/_common.py (numbers worked out by hand)."""

from __future__ import annotations

import duckdb

from advisor.engine.derived import DERIVED
from advisor.schema import create_all
from rules.cpu._common import (
    TOP_LEVEL_OPS,
    covered_by_device_sql,
    fmt_ms,
    outermost,
    python_stack_sql,
    steady_steps,
)

COLS = ("rank", "step", "kind", "name", "pid", "tid", "device", "start_ns", "dur_ns")


def _con(rows: list[tuple]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    create_all(con)
    for r in rows:
        con.execute(f"INSERT INTO events ({', '.join(COLS)}) VALUES ({', '.join('?' for _ in COLS)})", list(r))
    return con


def test_device_islands_merge_overlapping_and_touching_intervals() -> None:
    # kernels [0,10) [5,20) [20,25) -> one island [0,25); memcpy [30,40) -> second island; host op ignored
    con = _con([
        (0, 1, "kernel", "a", "0", "7", True, 0, 10),
        (0, 1, "kernel", "b", "0", "8", True, 5, 15),
        (0, 1, "kernel", "c", "0", "7", True, 20, 5),
        (0, 1, "memcpy", "m", "0", "7", True, 30, 10),
        (0, 1, "host_op", "h", "1", "1", False, 0, 100),
    ])
    DERIVED["device_busy"].build(con, "device_busy")
    got = con.execute("SELECT s, e, before FROM device_busy ORDER BY s").fetchall()
    assert got == [(0, 25, 0), (30, 40, 25)]


def test_covered_by_device_counts_only_overlap() -> None:
    # islands [0,25) and [30,40); interval [20,35) overlaps 5 + 5 = 10; [50,60) overlaps nothing
    con = _con([
        (0, 1, "kernel", "a", "0", "7", True, 0, 25),
        (0, 1, "kernel", "b", "0", "7", True, 30, 10),
    ])
    DERIVED["device_busy"].build(con, "device_busy")
    sql = ("WITH iv AS (SELECT * FROM (VALUES (1, 0, 20, 35), (2, 0, 50, 60)) t(id, rank, s, e)) "
           + covered_by_device_sql("iv") + " ORDER BY id")
    assert con.execute(sql).fetchall() == [(1, 10), (2, 0)]


def test_outermost_keeps_only_unnested_rows_per_thread() -> None:
    # item [0,100) holds dense [10,90) holds sync [20,80); on another thread sync2 [50,60) is outermost there
    con = _con([
        (0, 1, "host_op", "aten::item", "1", "1", False, 0, 100),
        (0, 1, "host_op", "aten::_local_scalar_dense", "1", "1", False, 10, 80),
        (0, 1, "sync", "cudaStreamSynchronize", "1", "1", False, 20, 60),
        (0, 1, "sync", "cudaStreamSynchronize", "1", "2", False, 50, 10),
        (0, 1, "host_op", "aten::add", "1", "1", False, 100, 5),  # starts where item ends: not nested
    ])
    sql = f"WITH src AS (SELECT * FROM events), {outermost('o', 'src')} SELECT tid, name FROM o ORDER BY tid, start_ns"
    assert con.execute(sql).fetchall() == [("1", "aten::item"), ("1", "aten::add"), ("2", "cudaStreamSynchronize")]


def test_top_level_ops_ignore_non_operators_and_nesting() -> None:
    con = _con([
        (0, 1, "host_op", "aten::linear", "1", "1", False, 0, 100),
        (0, 1, "host_op", "aten::addmm", "1", "1", False, 10, 80),
        (0, 1, "python", "f", "1", "1", False, 0, 500),
        (0, 1, "host_op", "aten::relu", "1", "1", False, 120, 10),
    ])
    got = con.execute(f"WITH {TOP_LEVEL_OPS} SELECT name FROM top_ops ORDER BY start_ns").fetchall()
    assert got == [("aten::linear",), ("aten::relu",)]


def test_python_stack_lists_enclosing_frames_outermost_first() -> None:
    con = _con([
        (0, 1, "python", "train.py(1): <module>", "1", "1", False, 0, 1000),
        (0, 1, "python", "train.py(9): step", "1", "1", False, 100, 500),
        (0, 1, "python", "other.py(3): unrelated", "1", "1", False, 700, 100),
        (0, 1, "python", "Python GC", "1", "1", False, 150, 10),
    ])
    sql = ("WITH t AS (SELECT * FROM (VALUES (7, 0, '1', '1', 200, 210)) v(id, rank, pid, tid, start_ns, end_ns)) "
           + python_stack_sql("t"))
    assert con.execute(sql).fetchall() == [(7, "train.py(1): <module>\ntrain.py(9): step")]


def test_steady_steps_and_fmt() -> None:
    assert steady_steps([5, 3, 4]) == [4, 5]
    assert steady_steps([3, 4]) == [3, 4]
    assert fmt_ms(1500.0) == "1.5 ms"
    assert fmt_ms(850.0) == "850 µs"


def test_cpu007_idle_intervals_of_overlapping_step_windows() -> None:
    import numpy as np

    from rules.cpu.cpu007_host_bound import _idle

    def idle(busy: list[tuple[int, int]], windows: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        b = np.array(busy, np.int64).reshape(-1, 2)
        w = np.array(windows, np.int64).reshape(-1, 2)
        s, e, j = _idle(b[:, 0], b[:, 1], w[:, 0], w[:, 1])
        return list(zip(s.tolist(), e.tolist(), j.tolist(), strict=True))

    # device busy [10,20) and [30,40). Window 0 [0,25): idle [0,10) and [20,25). Window 1 [15,50) starts
    # inside the first busy period: idle [20,30) and [40,50). Window 2 [41,45) lies in the last gap: all idle.
    # By start; the two intervals starting at 20 in window order.
    assert idle([(10, 20), (30, 40)], [(0, 25), (15, 50), (41, 45)]) == [
        (0, 10, 0), (20, 25, 0), (20, 30, 1), (40, 50, 1), (41, 45, 2)]
    # a window covered by one busy period has no idle interval; with no busy period a window is all idle
    assert idle([(10, 20), (30, 40)], [(12, 18)]) == []
    assert idle([], [(0, 5), (3, 9)]) == [(0, 5, 0), (3, 9, 1)]
