"""Derived tables several rules share, built once per analysis on first use.

A rule names one in its SQL like a canonical table (``FROM device_busy``); the analysis context
creates it (a temporary table) the first time a query mentions it, so rules that never need it
never pay for it, and rules that do share one copy instead of each scanning ``events`` again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.schema import DEVICE_BUSY_KINDS


@dataclass(frozen=True)
class Derived:
    """One shared table: what it holds and how it is built on a DuckDB connection."""

    doc: str
    build: Callable[[Any, str], None]


def _sql_table(sql: str) -> Callable[[Any, str], None]:
    def build(con: Any, name: str) -> None:
        con.cursor().execute(f"CREATE OR REPLACE TABLE {name} AS {sql}")

    return build


def _islands(rank: np.ndarray, s: np.ndarray, e: np.ndarray) -> pd.DataFrame:
    """Disjoint unions (rank, s, e) of intervals sorted by (rank, s); touching intervals merge."""
    n = len(s)
    if n == 0:
        return pd.DataFrame({"rank": rank[:0], "s": s[:0], "e": e[:0], "before": e[:0]})
    first = np.flatnonzero(np.concatenate([[True], rank[1:] != rank[:-1]]))
    reach = np.empty(n, dtype=np.int64)  # latest end so far within the rank
    for a, b in zip(first, [*first[1:], n], strict=True):
        np.maximum.accumulate(e[a:b], out=reach[a:b])
    new = np.ones(n, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    new[first] = True
    idx = np.flatnonzero(new)
    isl_s, isl_e = s[idx], np.maximum.reduceat(e, idx)
    # busy time of the rank's earlier periods (a running sum restarted at each rank)
    done = np.cumsum(isl_e - isl_s) - (isl_e - isl_s)
    rank_first = np.flatnonzero(np.concatenate([[True], rank[idx][1:] != rank[idx][:-1]]))
    done -= np.repeat(done[rank_first], np.diff(np.append(rank_first, len(idx))))
    return pd.DataFrame({"rank": rank[idx], "s": isl_s, "e": isl_e, "before": done})


def busy_islands(con: Any, where: str) -> pd.DataFrame:
    """Busy periods per rank of the events matching ``where`` (positive durations, known times)."""
    d = con.cursor().execute(
        f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM events "
        f"WHERE ({where}) AND dur_ns > 0 AND rank IS NOT NULL AND start_ns IS NOT NULL ORDER BY rank, s"
    ).fetchnumpy()
    return _islands(*(np.ma.getdata(d[c]) for c in ("rank", "s", "e")))


def _islands_table(where: str) -> Callable[[Any, str], None]:
    def build(con: Any, name: str) -> None:
        df = busy_islands(con, where)
        cur = con.cursor()
        cur.register("_islands_df", df)
        cur.execute(
            f"CREATE OR REPLACE TABLE {name} AS "
            "SELECT rank::INTEGER AS rank, s::BIGINT AS s, e::BIGINT AS e, before::BIGINT AS before FROM _islands_df"
        )
        cur.unregister("_islands_df")

    return build


_DEVICE_BUSY = "device AND kind IN (" + ", ".join(f"'{k}'" for k in DEVICE_BUSY_KINDS) + ")"

DERIVED: dict[str, Derived] = {
    "event_names": Derived(
        "one row per distinct (kind, device, name) of events with its count n: classify names once, "
        "then join, instead of a regular expression on every event",
        _sql_table("SELECT kind, device, name, count(*) AS n FROM events GROUP BY ALL"),
    ),
    "kernel_names": Derived(
        "one row per distinct (op_type, name) of kernels with its count n",
        _sql_table("SELECT op_type, name, count(*) AS n FROM kernels GROUP BY ALL"),
    ),
    "device_busy": Derived(
        "device busy periods (rank, s, e, before): the disjoint unions of each rank's device kernels, "
        "communication, memcpy and memset (touching intervals merge); before = busy time of the rank's earlier periods",
        _islands_table(_DEVICE_BUSY),
    ),
    "kernel_busy": Derived(
        "kernel busy periods (rank, s, e, before): the disjoint unions of each rank's device kernels; before = busy "
        "time of the rank's earlier periods",
        _islands_table("device AND kind = 'kernel'"),
    ),
}
