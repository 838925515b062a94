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
from dataclasses import dataclass
from typing import Any

from advisor.schema import NO_STEP


def build_steps(con: Any, src: str, warn: Callable[..., None]) -> None:
    """Insert the step windows of the ranks in ``src`` that have none yet.

    ``src`` is a relation (table name or ``(SELECT ...)``) with the columns ``rank``,
    ``is_mark`` (a host ``ProfilerStep#N`` event), ``device``, ``name``, ``start_ns``,
    ``dur_ns`` and ``corr``: the canonical ``events`` table, or a reader's staged rows so that
    steps can be assigned while the events are inserted (no second pass over them).
    """
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _marks AS
        SELECT rank, TRY_CAST(regexp_extract(name, '#(\\d+)', 1) AS INTEGER) AS step,
               min(start_ns) AS host_start_ns, max(start_ns + dur_ns) AS host_end_ns, count(*) AS n
        FROM {src}
        WHERE is_mark AND NOT device AND rank NOT IN (SELECT DISTINCT rank FROM steps)
        GROUP BY ALL HAVING step IS NOT NULL"""
    )
    dups = con.execute("SELECT rank, step, n FROM _marks WHERE n > 1 ORDER BY rank, step LIMIT 5").fetchall()
    for rank, step, n in dups:
        warn("duplicate_step", f"rank {rank}: step {step} is marked {n} times (duplicated events or files); merged")
    con.execute(
        f"""INSERT INTO steps
        WITH nxt AS (
            SELECT *, lead(step) OVER w AS next_step, lead(host_start_ns) OVER w AS next_start
            FROM _marks WINDOW w AS (PARTITION BY rank ORDER BY host_start_ns)
        ),
        launched AS (  -- device work launched from inside the marker of the last step of each cycle
            SELECT m.rank, m.step, max(d.start_ns + d.dur_ns) AS dev_end
            FROM (SELECT * FROM nxt WHERE next_step IS DISTINCT FROM step + 1) m
            JOIN {src} h ON h.rank = m.rank AND NOT h.device AND h.corr IS NOT NULL
                 AND h.start_ns >= m.host_start_ns AND h.start_ns < m.host_end_ns
            JOIN {src} d ON d.rank = h.rank AND d.device AND d.corr = h.corr
            GROUP BY ALL
        )
        SELECT n.rank, n.step, n.host_start_ns,
               CASE WHEN n.next_step = n.step + 1 AND n.next_start >= n.host_end_ns - 1000
                    THEN n.next_start
                    ELSE greatest(n.host_end_ns, coalesce(l.dev_end, n.host_end_ns)) END,
               n.host_start_ns, n.host_end_ns
        FROM nxt n LEFT JOIN launched l USING (rank, step)"""
    )
    con.execute("DROP TABLE _marks")
    no_marks = [r[0] for r in con.execute(
        f"SELECT DISTINCT rank FROM {src} WHERE rank NOT IN (SELECT DISTINCT rank FROM steps) ORDER BY rank"
    ).fetchall()]
    for rank in no_marks:
        warn(
            "no_step_marker",
            f"rank {rank}: no ProfilerStep#N marker; the whole trace is analysed as one window "
            "(call prof.step() each iteration to get per-step figures)",
        )
    if no_marks:
        con.execute(
            f"""INSERT INTO steps
            SELECT rank, {NO_STEP}, min(start_ns), max(start_ns + dur_ns), min(start_ns), max(start_ns + dur_ns)
            FROM {src} WHERE rank IN ({", ".join(map(str, no_marks))})
            GROUP BY rank"""
        )


@dataclass(frozen=True)
class WindowLookup:
    """SQL to find an event's step window: ``join`` (a LEFT JOIN clause) or ``match`` (a WHERE condition)."""

    join: str
    match: str


def window_lookup(con: Any, name: str, ranks: str | None = None) -> WindowLookup:
    """Build the lookup ``name`` that gives an event its step window; return the join SQL.

    Same answer as an ASOF join on ``steps`` (the window with the latest start at or before
    the event, if the event is before that window's end) but without sorting the events: the
    time span of the ranks is cut into buckets of equal width, every window is listed under
    each bucket it touches (windows clipped at the next window's start, so they are disjoint),
    and an event finds its window by a hash join on (rank, bucket) plus the range test. The
    bucket origin and width are constants, so the join key comes from the event row alone.
    The SQL expects the events as ``t`` (``rank``, ``start_ns``) and exposes the window as
    ``s`` (``step``, ``end_ns``), as :func:`step_of` reads it.
    """
    where = f"WHERE rank IN ({ranks})" if ranks is not None else ""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {name}_w AS
        SELECT rank, step, start_ns,
               least(end_ns, coalesce(lead(start_ns) OVER (PARTITION BY rank ORDER BY start_ns, step), end_ns)) AS end_ns
        FROM steps {where}"""
    )
    # the width gives each rank ~4 buckets per window (+64) over its own span: the lookup holds
    # ~5 rows per window whatever the number of ranks (a width from the windows of all ranks
    # over the span of one listed every rank's windows under R times too many buckets: 1,024
    # ranks, 0.7 GB). A rank whose span is far longer than the others' (a garbage window) takes
    # more of the buckets and leaves the others wider ones: slower, never wrong.
    origin, end, width, wide = con.execute(
        f"""WITH r AS (SELECT rank, min(start_ns) AS s, max(end_ns) AS e, count(*) AS n FROM {name}_w GROUP BY rank)
            SELECT coalesce(min(s), 0), coalesce(max(e), 0),
                   coalesce(greatest(1, sum(e::HUGEINT - s) // (4 * sum(n) + 64 * count(*))), 1)::BIGINT,
                   coalesce(max(e)::HUGEINT - min(s) >= {1 << 62}, false)
            FROM r"""
    ).fetchall()[0]
    origin, end, width = int(origin), int(end), int(width)

    def bucket(x: str) -> str:
        # a span beyond BIGINT (vendor step windows at garbage times: events are bounded, windows
        # read from a vendor file are not) is bucketed in HUGEINT
        return f"(({x})::HUGEINT - {origin}) // {width}" if wide else f"({x} - {origin}) // {width}"

    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {name} AS
        SELECT rank, unnest(range(({bucket("start_ns")})::BIGINT, ({bucket("end_ns - 1")})::BIGINT + 1)) AS bucket,
               step, start_ns, end_ns
        FROM {name}_w WHERE end_ns > start_ns"""
    )
    con.execute(f"DROP TABLE {name}_w")
    # an event outside every window has no bucket (its distance to the origin may not fit a BIGINT)
    match = (f"s.rank = t.rank AND s.bucket = CASE WHEN t.start_ns >= {origin} AND t.start_ns < {end} "
             f"THEN {bucket('t.start_ns')} END AND t.start_ns >= s.start_ns AND t.start_ns < s.end_ns")
    return WindowLookup(f"LEFT JOIN {name} s ON {match}", match)


def drop_window_lookup(con: Any, name: str) -> None:
    """Drop the tables made by :func:`window_lookup`."""
    con.execute(f"DROP TABLE IF EXISTS {name}")


def step_of(event_start: str, window: str = "s") -> str:
    """SQL: the step of an event ASOF-joined to ``steps`` as ``window`` (NULL outside every window)."""
    return f"CASE WHEN {window}.step IS NOT NULL AND {event_start} < {window}.end_ns THEN {window}.step END"


def finalize(con: Any, warn: Callable[..., None], assigned: set[int] | frozenset[int] = frozenset()) -> None:
    """Fill ``steps`` for ranks that lack them and assign ``step`` on events, kernels, comm_ops.

    ``assigned``: ranks whose events already carry their step (a reader assigned it on insert);
    when every rank is in it, ``events`` is not rewritten.
    """
    ranks = {r[0] for r in con.execute("SELECT DISTINCT rank FROM events").fetchall()}
    have = {r[0] for r in con.execute("SELECT DISTINCT rank FROM steps").fetchall()}
    if ranks - have:
        build_steps(con, "(SELECT rank, kind = 'step' AS is_mark, device, name, start_ns, dur_ns, corr FROM events)", warn)
    if ranks - set(assigned):
        _assign(con)
    for table in ("kernels", "comm_ops"):
        con.execute(
            f"""UPDATE {table} t SET step = s.step FROM steps s
            WHERE t.step IS NULL AND t.rank = s.rank AND t.start_ns >= s.start_ns AND t.start_ns < s.end_ns"""
        )


def _assign(con: Any) -> None:
    """Rebuild ``events`` with ``step`` = the window holding the event's start (no per-event loop)."""
    cols = [r[0] for r in con.execute("DESCRIBE events").fetchall()]
    select = ", ".join(f"coalesce({step_of('t.start_ns')}, t.step) AS step" if c == "step" else f"t.{c}" for c in cols)
    lookup = window_lookup(con, "_assign_w")
    con.execute(f"CREATE TABLE _events_new AS SELECT {select} FROM events t {lookup.join}")
    drop_window_lookup(con, "_assign_w")
    con.execute("DROP TABLE events")
    con.execute("ALTER TABLE _events_new RENAME TO events")
