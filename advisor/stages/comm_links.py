"""Rank-to-rank traffic of a profile, for the report's communication matrix.

From the ``comm_matrix`` table (Ascend ``communication_matrix.json``: bytes and transit time per
source -> destination link of each operator). Where the export has the per-group ``*-total``
aggregates, only they are read, so that an operator is not counted twice (as CLU002 does); local
(same-rank) links are left out. Per (source, destination): bytes, transit time and the bandwidth
they give, and the transport with the most bytes.
"""

from __future__ import annotations

from typing import Any

LINKS_SQL = """
WITH m AS (
    SELECT src_rank, dst_rank, upper(coalesce(transport, '')) AS transport, name,
           coalesce(bytes, 0) AS bytes, coalesce(transit_ns, 0) AS transit_ns
    FROM comm_matrix
    WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
      AND upper(coalesce(transport, '')) <> 'LOCAL'
),
pick AS (
    SELECT * FROM m WHERE (SELECT count(*) FROM m WHERE name LIKE '%-total%') = 0 OR name LIKE '%-total%'
),
per AS (
    SELECT src_rank, dst_rank, transport, sum(bytes) AS bytes, sum(transit_ns) AS transit_ns
    FROM pick GROUP BY ALL
)
SELECT src_rank, dst_rank, sum(bytes) AS bytes, sum(transit_ns) AS transit_ns,
       arg_max(transport, bytes) AS transport
FROM per GROUP BY ALL
HAVING sum(bytes) > 0 OR sum(transit_ns) > 0
ORDER BY src_rank, dst_rank
"""


def links(con: Any) -> list[dict[str, Any]]:
    """One row per (src, dst) link: ``src``, ``dst``, ``bytes``, ``time_us``, ``bandwidth_gbps``
    (None without transit time), ``transport``; empty when the profile has no matrix."""
    try:
        rows = con.cursor().execute(LINKS_SQL).fetchall()
    except Exception:  # noqa: BLE001 -- no comm_matrix table (a context built from a few tables): no links
        return []
    out = []
    for src, dst, nbytes, transit_ns, transport in rows:
        nbytes, transit_ns = int(nbytes or 0), int(transit_ns or 0)
        out.append({"src": int(src), "dst": int(dst), "bytes": nbytes, "time_us": round(transit_ns / 1000.0, 3),
                    "bandwidth_gbps": round(nbytes / transit_ns, 3) if transit_ns > 0 else None,
                    "transport": transport or None})
    return out
