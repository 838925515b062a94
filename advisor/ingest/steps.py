"""Step windows and step assignment, the same for every source.

Definition (documented in the README):

* Step markers are the host events ``ProfilerStep#N`` (kind ``step``).
* Step N's window starts where its host marker starts. It ends where the marker of step N+1
  starts when that step was profiled too (consecutive steps tile the timeline, so device work
  that lags into the next step's host time is counted where it runs). Otherwise (the last step
  of a profiling cycle) it ends at the later of the marker's end and the end of the last device
  work launched from inside the marker.
* A rank with no step marker gets one window over its whole trace (``step = -1``) and a warning.
* Every event (and ``kernels`` / ``comm_ops`` row) belongs to the window holding its start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from advisor.schema import NO_STEP


def finalize(con: Any, warn: Callable[..., None]) -> None:
    """Fill ``steps`` for ranks that lack them and assign ``step`` on events, kernels, comm_ops."""
    con.execute(
        """CREATE TEMP TABLE _marks AS
        SELECT rank, TRY_CAST(regexp_extract(name, '#(\\d+)', 1) AS INTEGER) AS step,
               min(start_ns) AS host_start_ns, max(start_ns + dur_ns) AS host_end_ns, count(*) AS n
        FROM events
        WHERE kind = 'step' AND NOT device AND rank NOT IN (SELECT DISTINCT rank FROM steps)
        GROUP BY ALL HAVING step IS NOT NULL"""
    )
    dups = con.execute("SELECT rank, step, n FROM _marks WHERE n > 1 ORDER BY rank, step LIMIT 5").fetchall()
    for rank, step, n in dups:
        warn("duplicate_step", f"rank {rank}: step {step} is marked {n} times (duplicated events or files); merged")
    con.execute(
        """INSERT INTO steps
        WITH nxt AS (
            SELECT *, lead(step) OVER w AS next_step, lead(host_start_ns) OVER w AS next_start
            FROM _marks WINDOW w AS (PARTITION BY rank ORDER BY host_start_ns)
        ),
        launched AS (  -- device work launched from inside the marker of the last step of each cycle
            SELECT m.rank, m.step, max(d.start_ns + d.dur_ns) AS dev_end
            FROM (SELECT * FROM nxt WHERE next_step IS DISTINCT FROM step + 1) m
            JOIN events h ON h.rank = m.rank AND NOT h.device AND h.corr IS NOT NULL
                 AND h.start_ns >= m.host_start_ns AND h.start_ns < m.host_end_ns
            JOIN events d ON d.rank = h.rank AND d.device AND d.corr = h.corr
            GROUP BY ALL
        )
        SELECT n.rank, n.step, n.host_start_ns,
               CASE WHEN n.next_step = n.step + 1 AND n.next_start >= n.host_end_ns - 1000
                    THEN n.next_start
                    ELSE greatest(n.host_end_ns, coalesce(l.dev_end, n.host_end_ns)) END,
               n.host_start_ns, n.host_end_ns
        FROM nxt n LEFT JOIN launched l USING (rank, step)"""
    )
    no_marks = con.execute(
        "SELECT DISTINCT rank FROM events WHERE rank NOT IN (SELECT DISTINCT rank FROM steps) ORDER BY rank"
    ).fetchall()
    for (rank,) in no_marks:
        warn(
            "no_step_marker",
            f"rank {rank}: no ProfilerStep#N marker; the whole trace is analysed as one window "
            "(call prof.step() each iteration to get per-step figures)",
        )
    con.execute(
        f"""INSERT INTO steps
        SELECT rank, {NO_STEP}, min(start_ns), max(start_ns + dur_ns), min(start_ns), max(start_ns + dur_ns)
        FROM events WHERE rank IN (SELECT DISTINCT rank FROM events WHERE rank NOT IN (SELECT DISTINCT rank FROM steps))
        GROUP BY rank"""
    )
    con.execute("DROP TABLE _marks")
    _assign(con, "events", "start_ns")
    for table in ("kernels", "comm_ops"):
        con.execute(
            f"""UPDATE {table} t SET step = s.step FROM steps s
            WHERE t.step IS NULL AND t.rank = s.rank AND t.start_ns >= s.start_ns AND t.start_ns < s.end_ns"""
        )


def _assign(con: Any, table: str, col: str) -> None:
    """Rebuild ``table`` with ``step`` = the window holding ``col`` (ASOF join, no per-event loop)."""
    cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    select = ", ".join(
        "CASE WHEN s.step IS NOT NULL AND t.{c} < s.end_ns THEN s.step ELSE t.step END AS step".format(c=col)
        if c == "step"
        else f"t.{c}"
        for c in cols
    )
    con.execute(
        f"""CREATE TABLE _{table}_new AS
        SELECT {select} FROM {table} t
        ASOF LEFT JOIN steps s ON t.rank = s.rank AND t.{col} >= s.start_ns"""
    )
    con.execute(f"DROP TABLE {table}")
    con.execute(f"ALTER TABLE _{table}_new RENAME TO {table}")
