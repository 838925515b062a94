"""Step-time breakdown by union of intervals (Hermes §4.2.1, inter-operator analysis).

Every (rank, step) window is cut into elementary segments at every event boundary; each
segment gets exactly one class, so the five classes add up to the window:

Ranks with device events (GPU / NPU traces):

* **overlapped** – device computation and device communication both running;
* **compute_only** – device computation (kernels, memcpy, memset) without communication;
* **comm_only** – device communication (NCCL/RCCL/HCCL kernels and tasks) without computation;
* **host_only** – the device idle while a host thread runs an operator, a runtime call, a sync
  wait, data loading or a host-side collective (step markers, annotations and Python-function
  frames alone do not count: they only enclose other work);
* **free** – nothing of the above.

Ranks without any device event (CPU-only traces, e.g. ``activities=[CPU]`` or gloo training):
the host *is* the compute device, so

* **compute** is host operators (``aten::*`` …), **comm** is host collectives (``gloo:*``,
  ``c10d::*``, ``record_param_comms``), and **overlapped** is both at once (a collective on one
  thread while operators run on another, or an operator enclosing a collective);
* **host_only** is data loading (``enumerate(DataLoader)#…``, which takes precedence over the
  operators it runs, such as ``collate``'s ``aten::stack``), sync and other host activity that is
  not an operator;
* **free** is time when no operator runs (Python between operators, sleeps).

Extra columns: ``kernel_us`` (device compute kernels only, HTA's "compute"), ``memory_us``
(memcpy/memset), ``dataloader_us``, ``overlap_ratio`` = overlapped / comm (share of
communication hidden under computation; null without communication).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from advisor.schema import DEVICE_BUSY_KINDS, HOST_BUSY_KINDS

CLASSES = ("compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")

_SQL = """
WITH r AS (SELECT rank, coalesce(has_device, false) AS dev FROM ranks),
win AS (SELECT s.rank, s.step, s.start_ns, s.end_ns FROM steps s {window_filter}),
iv AS (
    SELECT e.rank, e.start_ns AS s, e.start_ns + e.dur_ns AS e,
      CASE WHEN r.dev THEN (e.device AND e.kind IN {devbusy} AND e.kind <> 'comm')
           ELSE (NOT e.device AND e.kind = 'host_op') END::INTEGER AS c,
      CASE WHEN r.dev THEN (e.device AND e.kind = 'comm')
           ELSE (NOT e.device AND e.kind = 'comm') END::INTEGER AS m,
      (NOT e.device AND e.kind IN {hostbusy})::INTEGER AS h,
      (NOT e.device AND e.kind = 'dataloader')::INTEGER AS d,
      (e.device AND e.kind = 'kernel')::INTEGER AS k,
      (e.device AND e.kind IN ('memcpy', 'memset'))::INTEGER AS y
    FROM events e JOIN r USING (rank)
    WHERE e.dur_ns > 0 AND e.rank IN (SELECT rank FROM win)
      AND ((e.device AND e.kind IN {devbusy}) OR (NOT e.device AND e.kind IN {hostbusy}))
),
pts AS (  -- +1 / -1 per class at each boundary, the six counters packed 20 bits apart in one HUGEINT
    SELECT rank, s AS t, (c + (m << 20) + (h << 40) + (d << 60) + (k << 80) + (y << 100)) AS v FROM (
        SELECT rank, s, c::HUGEINT c, m::HUGEINT m, h::HUGEINT h, d::HUGEINT d, k::HUGEINT k, y::HUGEINT y FROM iv)
    UNION ALL
    SELECT rank, e, -(c + (m << 20) + (h << 40) + (d << 60) + (k << 80) + (y << 100)) FROM (
        SELECT rank, e, c::HUGEINT c, m::HUGEINT m, h::HUGEINT h, d::HUGEINT d, k::HUGEINT k, y::HUGEINT y FROM iv)
    UNION ALL SELECT rank, start_ns, 0::HUGEINT FROM win
    UNION ALL SELECT rank, end_ns, 0::HUGEINT FROM win
),
agg AS (SELECT rank, t, sum(v) AS v FROM pts GROUP BY rank, t),
acc AS (
    SELECT rank, t, lead(t) OVER w AS t2, sum(v) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS v
    FROM agg WINDOW w AS (PARTITION BY rank ORDER BY t)
),
run AS (  -- a class is active when its counter is positive (counters never exceed 2^20 - 1 here)
    SELECT rank, t, t2,
      (v & 1048575) > 0 AS c, ((v >> 20) & 1048575) > 0 AS m, ((v >> 40) & 1048575) > 0 AS h,
      ((v >> 60) & 1048575) > 0 AS d, ((v >> 80) & 1048575) > 0 AS k, ((v >> 100) & 1048575) > 0 AS y
    FROM acc
),
seg AS (
    SELECT run.rank, w.step, run.t2 - run.t AS len, run.c, run.m, run.h, run.d, run.k, run.y, r.dev
    FROM run ASOF JOIN win w ON run.rank = w.rank AND run.t >= w.start_ns
    JOIN r ON r.rank = run.rank
    WHERE run.t2 IS NOT NULL AND run.t < w.end_ns
)
SELECT rank, step,
  sum(len) AS step_ns,
  sum(len) FILTER (WHERE c AND m AND (dev OR NOT d)) AS overlapped_ns,
  sum(len) FILTER (WHERE c AND NOT m AND (dev OR NOT d)) AS compute_only_ns,
  sum(len) FILTER (WHERE m AND NOT c AND (dev OR NOT d)) AS comm_only_ns,
  sum(len) FILTER (WHERE NOT c AND NOT m AND (h OR d) OR (NOT dev AND d)) AS host_only_ns,
  sum(len) FILTER (WHERE NOT c AND NOT m AND NOT h AND NOT d) AS free_ns,
  sum(len) FILTER (WHERE k) AS kernel_ns,
  sum(len) FILTER (WHERE y) AS memory_ns,
  sum(len) FILTER (WHERE d) AS dataloader_ns,
  sum(len) FILTER (WHERE h OR d) AS host_busy_ns
FROM seg GROUP BY rank, step ORDER BY rank, step
"""


def compute(con: Any, windows: str | None = None) -> pd.DataFrame:
    """Breakdown per (rank, step) in µs.

    ``windows`` optionally names a table/view with the same columns as ``steps`` (rank, step,
    start_ns, end_ns) to break down other windows (tests use it to match a peer's window).
    """
    sql = _SQL.format(
        devbusy=tuple(DEVICE_BUSY_KINDS),
        hostbusy=tuple(HOST_BUSY_KINDS),
        window_filter="" if windows is None else "WHERE false UNION ALL SELECT rank, step, start_ns, end_ns FROM " + windows,
    )
    df = con.cursor().execute(sql).df()
    ns_cols = [c for c in df.columns if c.endswith("_ns")]
    df[ns_cols] = df[ns_cols].fillna(0)
    out = pd.DataFrame({"rank": df["rank"].astype(int), "step": df["step"].astype(int)})
    for c in ns_cols:
        out[c[:-3] + "_us"] = df[c].astype("float64") / 1000.0
    out["compute_us"] = out["compute_only_us"] + out["overlapped_us"]
    out["comm_us"] = out["comm_only_us"] + out["overlapped_us"]
    out["overlap_ratio"] = (out["overlapped_us"] / out["comm_us"]).where(out["comm_us"] > 0)
    return out


def store(con: Any, df: pd.DataFrame) -> None:
    """Keep the breakdown as table ``breakdown`` (µs columns) so rules can join it in SQL."""
    cur = con.cursor()
    cur.register("_breakdown_df", df)
    cur.execute("CREATE OR REPLACE TABLE breakdown AS SELECT * FROM _breakdown_df")
    cur.unregister("_breakdown_df")
