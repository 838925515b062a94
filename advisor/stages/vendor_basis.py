"""The step breakdown of ranks whose timeline is missing: the exporter's own step table, or none.

The ingest marks such a rank in ``meta`` (key ``ascend.breakdown_basis``, see
:func:`advisor.ingest.ascend_readers._breakdown_basis`):

* ``vendor``: the export has no device timeline but has its step table (Ascend
  ``step_trace_time.csv``, computed by CANN from the whole device timeline). Its figures are the
  rank's breakdown: Overlapped is computation beside communication, Computing minus it
  computation alone, Communication(Not Overlapped) communication alone, Free idle; the step is
  their sum (the device span of the step). Host-side time is unknown, so it is counted as idle
  (``host_only`` 0), never as a host finding.
* ``none``: nothing covers the step (no timeline, no step table, a kernel table that is an
  excerpt): the rank gets no breakdown rows rather than one rebuilt from the few rows it has.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

BASIS_KEY = "ascend.breakdown_basis"

_BASIS_SQL = f"SELECT rank, max(value) FROM meta WHERE key = '{BASIS_KEY}' AND rank IS NOT NULL GROUP BY rank"

_VENDOR_SQL = """
SELECT rank, step,
       avg(computing_ns) AS computing, avg(coalesce(comm_not_overlapped_ns, 0)) AS cno,
       avg(coalesce(overlapped_ns, greatest(coalesce(comm_ns, 0) - coalesce(comm_not_overlapped_ns, 0), 0), 0)) AS ov,
       avg(coalesce(free_ns, 0)) AS free
FROM vendor_steps
WHERE rank IN (SELECT unnest($ranks)) AND computing_ns IS NOT NULL
GROUP BY rank, step ORDER BY rank, step
"""


def apply(cur: Any, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (the breakdown, µs columns) with the rows of marked ranks replaced by their basis."""
    try:
        basis = dict(cur.execute(_BASIS_SQL).fetchall())
    except Exception:  # noqa: BLE001 - no meta table: nothing is marked
        return df
    if not basis:
        return df
    marked = [int(r) for r in basis]
    vendor_ranks = [int(r) for r, v in basis.items() if v == "vendor"]
    rows = cur.execute(_VENDOR_SQL, {"ranks": vendor_ranks}).fetchall() if vendor_ranks else []
    keep = df[~df["rank"].isin(marked)]
    if not rows:
        return keep.reset_index(drop=True)
    v = pd.DataFrame(rows, columns=["rank", "step", "computing", "cno", "ov", "free"]).astype(
        {"computing": "float64", "cno": "float64", "ov": "float64", "free": "float64"})
    ov = v[["ov", "computing"]].min(axis=1) / 1000.0
    out = pd.DataFrame({"rank": v["rank"].astype(int), "step": v["step"].astype(int)})
    out["step_us"] = (v["computing"] + v["cno"] + v["free"]) / 1000.0
    out["overlapped_us"] = ov
    out["compute_only_us"] = v["computing"] / 1000.0 - ov
    out["comm_only_us"] = v["cno"] / 1000.0
    out["host_only_us"] = 0.0
    out["free_us"] = v["free"] / 1000.0
    out["kernel_us"] = v["computing"] / 1000.0
    out["memory_us"] = 0.0
    out["dataloader_us"] = 0.0
    out["host_busy_us"] = 0.0
    out["compute_us"] = out["compute_only_us"] + out["overlapped_us"]
    out["comm_us"] = out["comm_only_us"] + out["overlapped_us"]
    out["overlap_ratio"] = (out["overlapped_us"] / out["comm_us"]).where(out["comm_us"] > 0)
    out = out[list(df.columns)] if set(df.columns) <= set(out.columns) else out
    merged = pd.concat([keep, out], ignore_index=True) if len(keep) else out
    return merged.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
