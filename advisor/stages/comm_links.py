"""Rank-to-rank traffic of a profile, for the report's communication matrix.

From the ``comm_matrix`` table, which two sources fill:

* Ascend ``communication_matrix.json``: bytes and transit time per source -> destination link of
  each operator, with its link type (HCCS, PCIE, RDMA, SDMA, SIO, LOCAL). Where the export has the
  per-group ``*-total`` aggregates, only they are read, so that an operator is not counted twice
  (as CLU002 does); local (same-rank) links are left out.
* Kineto traces: one row per point-to-point transfer (send / recv, e.g. between pipeline
  stages), whose peer the trace names (advisor.ingest.kineto ``_p2p_links``). Each transfer is
  recorded twice, by the sender and by the receiver: the sender's rows count when the sender's
  trace is in the profile, the receiver's otherwise. Kineto knows no link type and no transit
  time (an op's duration includes waiting for its peer): such a link has bytes and a transfer
  count, no time and no bandwidth.

Why one table with a marker, not a second table: the matrix is one picture of who sends what to
whom, whatever recorded it, and the Kineto rows have the same columns. They are marked by their
``transport``, ``kineto:<backend>`` (``kineto:nccl``, ``kineto:gloo`` ...), which is no Ascend link
type, and carry no transit time. The rules that judge Ascend links therefore never see them:
COM004 (RDMA retransmission) and COM006 (HCCS 512-byte alignment) leave out the rows
:data:`NOT_KINETO_SQL` rejects, besides reading only RDMA / HCCS / SDMA rows; the rules that
need a transit time (COM002, CLU002) find none.

Per (source, destination): bytes, transit time and the bandwidth they give, and the transport
with the most bytes (a Kineto link: its backend in upper case, e.g. ``GLOO``).
"""

from __future__ import annotations

from typing import Any

from advisor.schema import KINETO_TRANSPORT_PREFIX, NOT_KINETO_SQL

LINKS_SQL = f"""
WITH m AS (
    SELECT src_rank, dst_rank, upper(coalesce(transport, '')) AS transport, name,
           coalesce(bytes, 0) AS bytes, transit_ns
    FROM comm_matrix
    WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank
      AND upper(coalesce(transport, '')) <> 'LOCAL' AND {NOT_KINETO_SQL}
),
pick AS (
    SELECT * FROM m WHERE (SELECT count(*) FROM m WHERE name LIKE '%-total%') = 0 OR name LIKE '%-total%'
),
k AS (  -- Kineto transfers: each reported by its sender (rank = src_rank) and by its receiver
    SELECT rank, src_rank, dst_rank, upper(substr(transport, {len(KINETO_TRANSPORT_PREFIX) + 1})) AS transport,
           coalesce(bytes, 0) AS bytes
    FROM comm_matrix
    WHERE src_rank IS NOT NULL AND dst_rank IS NOT NULL AND src_rank <> dst_rank AND NOT {NOT_KINETO_SQL}
),
kpick AS (  -- the sender's record where the sender's trace has transfers, else the receiver's
    SELECT * FROM k
    WHERE rank = src_rank OR (rank = dst_rank AND src_rank NOT IN (SELECT DISTINCT rank FROM k))
),
per AS (
    SELECT src_rank, dst_rank, transport, sum(bytes) AS bytes, sum(transit_ns) AS transit_ns,
           NULL::BIGINT AS transfers
    FROM pick GROUP BY ALL
    UNION ALL
    SELECT src_rank, dst_rank, transport, sum(bytes), NULL, count(*) FROM kpick GROUP BY ALL
)
SELECT src_rank, dst_rank, sum(bytes) AS bytes, sum(transit_ns) AS transit_ns,
       arg_max(transport, bytes) AS transport, sum(transfers) AS transfers
FROM per GROUP BY ALL
HAVING sum(bytes) > 0 OR sum(transit_ns) > 0
ORDER BY src_rank, dst_rank
"""


def links(con: Any) -> list[dict[str, Any]]:
    """One row per (src, dst) link: ``src``, ``dst``, ``bytes``, ``time_us`` (left out when no
    transit time is known), ``bandwidth_gbps`` (None without transit time), ``transport``, and
    for point-to-point transfers read from Kineto ``transfers`` (how many); empty when the
    profile has no matrix."""
    try:
        rows = con.cursor().execute(LINKS_SQL).fetchall()
    except Exception:  # noqa: BLE001 -- no comm_matrix table (a context built from a few tables): no links
        return []
    out = []
    for src, dst, nbytes, transit, transport, transfers in rows:
        nbytes = int(nbytes or 0)
        row: dict[str, Any] = {"src": int(src), "dst": int(dst), "bytes": nbytes}
        if transit is not None:
            transit_ns = int(transit)
            row["time_us"] = round(transit_ns / 1000.0, 3)
            row["bandwidth_gbps"] = round(nbytes / transit_ns, 3) if transit_ns > 0 else None
        else:
            row["bandwidth_gbps"] = None
        row["transport"] = transport or None
        if transfers is not None:
            row["transfers"] = int(transfers)
        out.append(row)
    return out
