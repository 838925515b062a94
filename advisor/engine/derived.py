"""Derived tables several rules share, built once per analysis when a rule that reads them runs.

A rule declares the ones its SQL reads (``@rule(..., derived=("device_busy",))``) and reads them
like canonical tables (``FROM device_busy``); the runner builds them before the rule runs
(:meth:`advisor.engine.context.AnalysisContext.ensure_derived`), so rules that never need one
never pay for it, and rules that do share one copy instead of each scanning ``events`` again.
Rule packages can add their own with :func:`register` (e.g. ``kernel_ops`` in
``rules/compute/_common.py``); a meta test checks that each rule declares what its SQL names.
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
    needs: tuple[str, ...] = ()  # derived tables the builder reads (built first)


def sql_table(sql: str) -> Callable[[Any, str], None]:
    """A builder that creates the table from a query."""
    def build(con: Any, name: str) -> None:
        con.cursor().execute(f"CREATE OR REPLACE TABLE {name} AS {sql}")

    return build


def _islands(rank: np.ndarray, s: np.ndarray, e: np.ndarray) -> pd.DataFrame:
    """Disjoint unions (rank, s, e) of intervals sorted by (rank, s); touching intervals merge."""
    if len(s) == 0:
        return pd.DataFrame({"rank": rank[:0], "s": s[:0], "e": e[:0], "before": e[:0],
                             "next_s": pd.array(e[:0], dtype="Int64")})
    cols, last = _island_columns(rank, s, e)
    return pd.DataFrame({**cols, "next_s": pd.arrays.IntegerArray(cols["next_s"], last)})


def _island_columns(rank: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """:func:`_islands` of at least one interval as columns rank, s, e, before, next_s (0 where NULL),
    and the NULL flags of next_s."""
    n = len(s)
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
    # start of the rank's next period (NULL after its last one)
    nxt = np.zeros(len(idx), dtype=np.int64)
    nxt[:-1] = isl_s[1:]
    last = np.zeros(len(idx), dtype=bool)
    last[rank_first[1:] - 1] = True
    last[-1] = True
    return {"rank": rank[idx], "s": isl_s, "e": isl_e, "before": done, "next_s": nxt}, last


def _busy_rows(cur: Any, where: str) -> tuple[np.ndarray, ...]:
    """(rank, s, e) of the events matching ``where`` (positive durations, known times), by rank and start
    (``cur``: a cursor)."""
    d = cur.execute(
        f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM events "
        f"WHERE ({where}) AND dur_ns > 0 AND rank IS NOT NULL AND start_ns IS NOT NULL ORDER BY rank, s"
    ).fetchnumpy()
    return tuple(np.ma.getdata(d[c]) for c in ("rank", "s", "e"))


def busy_islands(con: Any, where: str) -> pd.DataFrame:
    """Busy periods per rank of the events matching ``where`` (positive durations, known times)."""
    return _islands(*_busy_rows(con.cursor(), where))


def _islands_table(where: str) -> Callable[[Any, str], None]:
    def build(con: Any, name: str) -> None:
        cur = con.cursor()
        rows = _busy_rows(cur, where)
        if not len(rows[0]):  # no such event (a CPU-only trace): the table's columns only
            cur.execute(f"CREATE OR REPLACE TABLE {name} (rank INTEGER, s BIGINT, e BIGINT, before BIGINT, next_s BIGINT)")
            return
        import pyarrow as pa

        cols, last = _island_columns(*rows)
        cur.register("_islands_df", pa.table({**cols, "next_s": pa.array(cols["next_s"], mask=last)}))
        cur.execute(
            f"CREATE OR REPLACE TABLE {name} AS "
            "SELECT rank::INTEGER AS rank, s::BIGINT AS s, e::BIGINT AS e, before::BIGINT AS before, "
            "next_s::BIGINT AS next_s FROM _islands_df"
        )
        cur.unregister("_islands_df")

    return build


# th numbers the threads (rank, pid, tid; NULLs equal)
_HOST_OPS_SQL = """
SELECT rowid AS rid, dense_rank() OVER (ORDER BY rank, pid, tid) AS th, start_ns, dur_ns
FROM events WHERE NOT device AND kind = 'host_op'
"""


def top_level_rows(con: Any, cur: Any = None) -> np.ndarray:
    """Row ids of the host operators that no earlier-starting operator of their thread still covers.

    Per thread, operators are taken by start, longer first (NULL start or duration last, equal
    ones in storage order); an operator is top-level when the latest end before it (NULL ends
    ignored) is unknown or not after its start. ``cur``: a cursor of ``con`` to run the query on.
    """
    d = (cur if cur is not None else con.cursor()).execute(_HOST_OPS_SQL).fetchnumpy()
    rid, th = np.ma.getdata(d["rid"]), np.ma.getdata(d["th"])
    if not len(rid):
        return rid
    s, s_null = _values(d["start_ns"])
    du, d_null = _values(d["dur_ns"])
    order = np.lexsort((rid, -du, d_null, s, s_null, th))
    s, s_null, th = s[order], s_null[order], th[order]
    none = np.iinfo(np.int64).min  # no known end
    end = s + du[order]
    end[s_null | d_null[order]] = none
    first = np.flatnonzero(np.concatenate([[True], th[1:] != th[:-1]]))
    reach = np.empty(len(s), np.int64)  # latest known end up to each row, within the thread
    for a, b in zip(first, [*first[1:], len(s)], strict=True):
        np.maximum.accumulate(end[a:b], out=reach[a:b])
    before = np.empty(len(s), np.int64)
    before[1:] = reach[:-1]
    before[first] = none
    top = (before == none) | (~s_null & (s >= before))
    return np.asarray(rid[order][top])


def enclosing_intervals(thr: np.ndarray, s: np.ndarray, e: np.ndarray, pthr: np.ndarray,
                        pt: np.ndarray) -> np.ndarray:
    """For each point (thread ``pthr``, time ``pt``): the index of the innermost interval of its
    thread open at that time (``s <= pt < e``); -1 where none is.

    Intervals of one thread are expected to nest, as host operators do. No pair is compared: an
    interval's depth is the number of its thread's intervals started up to it (longer first
    among equal starts) minus those ended by its start, a point's depth the number open at it,
    and the innermost interval open at a point of depth d is the last one of depth d started up
    to it. A found interval that does not hold the point
    (intervals that overlap without nesting) is not reported. Zero-length intervals hold no point.
    """
    return IntervalIndex(thr, s, e).find(pthr, pt)


class IntervalIndex:
    """The intervals of :func:`enclosing_intervals` (threads, starts, ends), prepared once so that
    points can be looked up in as many calls as wanted, each point as if alone."""

    BATCH = 1 << 18  # points looked up at a time (bounds the memory of a lookup)

    def __init__(self, thr: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        self.n = n = len(s)
        self.thr = np.asarray(thr, np.int64)  # no copy of int64 input (none is written)
        self.s, self.e = np.asarray(s, np.int64), np.asarray(e, np.int64)
        if n == 0:
            return
        thr, s, e = self.thr, self.s, self.e
        # keys (thread, time) packed in an int64, times as offsets from below every start (a point
        # before them all or after every end is clipped to those bounds: it stays outside them all)
        self.t0, self.t1 = int(thr.min()), int(thr.max())
        self.lo, self.hi = int(s.min()) - 1, max(int(e.max()), int(s.max()))
        tb = max(self.hi - self.lo, 1).bit_length()
        self.times: np.ndarray | None = None
        ks, ke = s - self.lo, e - self.lo
        if tb + max(self.t1 - self.t0, 1).bit_length() > 62:  # times by rank instead: order and ties kept
            self.times = np.unique(np.concatenate([s, e]))
            ks, ke = 2 * np.searchsorted(self.times, s) + 1, 2 * np.searchsorted(self.times, e) + 1
            tb = (2 * len(self.times) + 1).bit_length()
        self.tb = tb
        th = (thr - self.t0) << tb
        skey, ekey = th | ks, th | ke
        del th, ks, ke
        dur = e - s
        step, ddur = np.diff(skey), np.diff(dur)
        self.order: np.ndarray | None = None  # rows by (thread, start), longer first; None: as given
        if not bool(np.all((step > 0) | ((step == 0) & (ddur <= 0)))):
            order = np.argsort(-dur, kind="stable")  # longer first among equal starts ...
            self.order = order[np.argsort(skey[order], kind="stable")]  # ... within (thread, start)
        del step, ddur, dur
        self.starts = starts = skey if self.order is None else skey[self.order]
        ordered_ends = ekey if self.order is None else ekey[self.order]
        # no interval overlaps the next one of its thread (top-level operators): the one started
        # last up to a point is the only one that can hold it
        self.disjoint = bool(np.all(ordered_ends[:-1] <= starts[1:]))
        if self.disjoint:
            return
        self.reach = np.maximum.accumulate(ordered_ends)
        del ordered_ends
        ekey.sort()
        self.ends = ekey
        self.depth = depth = np.arange(1, n + 1) - np.searchsorted(self.ends, starts, "right")
        self.by_depth = by_depth = np.argsort(depth, kind="stable")  # grouped by depth, in start order within one
        self.keys = depth[by_depth].astype(np.int64) * n + by_depth

    def _point_keys(self, pthr: np.ndarray, pt: np.ndarray) -> np.ndarray:
        if self.times is None:
            kp = np.clip(pt, self.lo, self.hi) - self.lo
        else:
            j = np.searchsorted(self.times, pt)
            kp = 2 * j + (self.times[np.minimum(j, len(self.times) - 1)] == pt)
        return np.asarray(((pthr - self.t0) << self.tb) | kp, np.int64)

    def find(self, pthr: np.ndarray, pt: np.ndarray) -> np.ndarray:
        """For each point (thread ``pthr``, time ``pt``): the index of the innermost interval of
        its thread open at that time; -1 where none is (as :func:`enclosing_intervals`)."""
        m = len(pt)
        out = np.full(m, -1, np.int64)
        if self.n == 0 or m == 0:
            return out
        pthr, pt = np.asarray(pthr, np.int64), np.asarray(pt, np.int64)
        for a in range(0, m, self.BATCH):
            sl = slice(a, min(a + self.BATCH, m))
            known = np.flatnonzero((pthr[sl] >= self.t0) & (pthr[sl] <= self.t1))  # threads with intervals
            out[sl][known] = self._find(pthr[sl][known], pt[sl][known])
        return out

    def _row(self, pos: np.ndarray) -> np.ndarray:
        """The rows of positions in (thread, start) order."""
        return pos if self.order is None else self.order[pos]

    def _find(self, pthr: np.ndarray, pt: np.ndarray) -> np.ndarray:
        thr, s, e, n = self.thr, self.s, self.e, self.n
        pkey = self._point_keys(pthr, pt)
        started = np.searchsorted(self.starts, pkey, "right")  # of the point's thread started up to it, + earlier threads'
        if self.disjoint:
            i = started - 1
            idx = self._row(np.maximum(i, 0))
            ok = (i >= 0) & (thr[idx] == pthr) & (s[idx] <= pt) & (pt < e[idx])
            return np.where(ok, idx, -1)
        out = np.full(len(pt), -1, np.int64)
        # a point inside no interval: the latest end among those started up to it is not after it
        # (thread bits lead the keys, so an earlier thread's end never is)
        inside = np.flatnonzero(started > 0)
        inside = inside[self.reach[started[inside] - 1] > pkey[inside]]
        pkey, started, pt, pthr = pkey[inside], started[inside], pt[inside], pthr[inside]
        pdepth = started - np.searchsorted(self.ends, pkey, "right")
        i = np.searchsorted(self.keys, pdepth.astype(np.int64) * n + (started - 1), "right") - 1  # last of its depth
        ok = (pdepth > 0) & (i >= 0)
        pos = self.by_depth[np.where(ok, i, 0)]
        ok &= self.depth[pos] == pdepth
        idx = self._row(pos)
        ok &= (thr[idx] == pthr) & (s[idx] <= pt) & (pt < e[idx])
        out[inside] = np.where(ok, idx, -1)
        return out


def _values(a: Any) -> tuple[np.ndarray, np.ndarray]:
    """A fetched integer column as (values with NULLs as 0, NULL flags)."""
    if isinstance(a, np.ma.MaskedArray):
        return np.ma.getdata(a.filled(0)), np.ma.getmaskarray(a)
    a = np.asarray(a)
    return a, np.zeros(len(a), dtype=bool)


def _top_table(con: Any, name: str) -> None:
    import pyarrow as pa

    cur = con.cursor()
    rid = top_level_rows(con, cur)
    cols = "e.rowid AS oid, e.rank, e.step, e.pid, e.tid, e.name, e.start_ns, e.dur_ns"
    if not len(rid):  # no host operator: the table's columns only
        cur.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {cols} FROM events e WHERE false")
        return
    cur.register("_top_rows", pa.table({"rid": np.asarray(rid, np.int64)}))
    cur.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {cols} FROM events e JOIN _top_rows t ON e.rowid = t.rid")
    cur.unregister("_top_rows")


# ranks with device work: their device events; any other rank: its host collectives and top-level operators
_OP_STEP_STATS_SQL = """
WITH dev AS (SELECT DISTINCT rank FROM events WHERE {busy} AND rank IS NOT NULL),
rows AS (
    SELECT rank, step, kind::VARCHAR AS kind, name, dur_ns FROM events
    WHERE {busy} AND rank IS NOT NULL AND dur_ns IS NOT NULL
    UNION ALL
    SELECT rank, step, 'comm', name, dur_ns FROM events
    WHERE NOT device AND kind = 'comm' AND rank IS NOT NULL AND dur_ns IS NOT NULL AND rank NOT IN (SELECT rank FROM dev)
    UNION ALL
    SELECT rank, step, 'host_op', name, dur_ns FROM host_op_top
    WHERE rank IS NOT NULL AND dur_ns IS NOT NULL AND rank NOT IN (SELECT rank FROM dev)
)
SELECT rank::INTEGER AS rank, step::INTEGER AS step, kind, name, count(*)::BIGINT AS n, sum(dur_ns)::BIGINT AS total_ns,
       min(dur_ns)::BIGINT AS min_ns, max(dur_ns)::BIGINT AS max_ns, sum(dur_ns::DOUBLE * dur_ns)::DOUBLE AS sumsq_ns2
FROM rows GROUP BY ALL
"""


_DEVICE_BUSY = "device AND kind IN (" + ", ".join(f"'{k}'" for k in DEVICE_BUSY_KINDS) + ")"

DERIVED: dict[str, Derived] = {
    "event_names": Derived(
        "one row per distinct (kind, device, name) of events with its count n: classify names once, "
        "then join, instead of a regular expression on every event",
        sql_table("SELECT kind, device, name, count(*) AS n FROM events GROUP BY ALL"),
    ),
    "kernel_names": Derived(
        "one row per distinct (op_type, name) of kernels with its count n",
        sql_table("SELECT op_type, name, count(*) AS n FROM kernels GROUP BY ALL"),
    ),
    "host_op_top": Derived(
        "the host operators (kind host_op, any step) that no earlier-starting operator of their thread still "
        "covers: oid (its events rowid), rank, step, pid, tid, name, start_ns, dur_ns",
        _top_table,
    ),
    "device_busy": Derived(
        "device busy periods (rank, s, e, before, next_s): the disjoint unions of each rank's device kernels, "
        "communication, memcpy and memset (touching intervals merge); before = busy time of the rank's earlier periods; "
        "next_s = start of the rank's next period (NULL after the last)",
        _islands_table(_DEVICE_BUSY),
    ),
    "kernel_busy": Derived(
        "kernel busy periods (rank, s, e, before, next_s): the disjoint unions of each rank's device kernels; before = "
        "busy time of the rank's earlier periods; next_s = start of the rank's next period (NULL after the last)",
        _islands_table("device AND kind = 'kernel'"),
    ),
    "op_step_stats": Derived(
        "one row per (rank, step, kind, name): n, total_ns, min_ns, max_ns, sumsq_ns2 (sum of squared durations) of "
        "the rank's device kernels, communication, memcpy and memset; on a rank with no device events, its host "
        "communication and top-level host operators (kind host_op). step is NULL for events outside every step "
        "window. The per-operator summary the cluster-level analyses read instead of events",
        sql_table(_OP_STEP_STATS_SQL.format(busy=_DEVICE_BUSY)),
        needs=("host_op_top",),
    ),
}


def register(name: str, doc: str, build: Callable[[Any, str], None], needs: tuple[str, ...] = ()) -> None:
    """Add a shared derived table (a rule package's own, next to the built-in ones); ``needs``:
    the derived tables its builder reads."""
    if name in DERIVED and DERIVED[name].build is not build:
        raise ValueError(f"derived table {name!r} is already registered")
    DERIVED[name] = Derived(doc, build, needs)
