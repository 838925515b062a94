"""Step windows and step assignment, the same for every source.

Definition (documented in the README):

* Step markers are the host events ``ProfilerStep#N`` (kind ``step``), or a source's own host
  step ranges (``STEP_TIME`` in a ``.db`` export), or, without either, the device tasks a vendor
  table numbers by step (then a step's host range is its device span).
* A step's device work is the device tasks launched from inside its host range (the launching
  host event and the task share a correlation id).
* Step N starts where its marker starts, later by the time the first device task it launched
  waited, after its launch, for the work before it on its stream to finish: a device lagging
  behind the host shifts the window by its lag; a device idle at the launch, not at all.
* Step N ends where step N+1 starts when that step was profiled too (consecutive steps tile the
  timeline); otherwise (the last step of a profiling cycle) at the later of its marker's end and
  the end of its device work. So no backlog piles up on the last step, and device work still
  running from before a cycle is not counted in its first step.
* A rank with no step marker gets its steps inferred from the repetition of its top-level host
  operators (:mod:`advisor.ingest.step_inference`; rows with ``inferred = true``, a warning),
  or, when they do not repeat, one window over its whole trace (``step = -1``) and a warning.
* Every event (and ``kernels`` / ``comm_ops`` row) belongs to the window holding its start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor.schema import NO_STEP

#: Largest gap (ns) between a step's marker end and the next marker's start for the two to be
#: consecutive (``prof.step()`` ends one marker and opens the next at once).
CONSECUTIVE_NS = 1000


def windows_sql(marks: str, src: str | None, *, inferred: bool = False) -> str:
    """SQL selecting ``steps`` rows (rank, step, start_ns, end_ns, host_start_ns, host_end_ns, inferred).

    ``marks``: a relation (rank, step, host_start_ns, host_end_ns), one row per step. ``src``: a
    relation with ``rank``, ``device``, ``tid`` (a device task's stream), ``start_ns``, ``dur_ns``
    and ``corr`` (host events with a correlation id and the device tasks sharing it), or None when
    there are no launch links to follow (the steps then start where their range starts).
    ``inferred``: the ranges were inferred (:mod:`advisor.ingest.step_inference`), not marked.
    """
    if src is None:
        dev = "SELECT rank, step, NULL::BIGINT AS delay, NULL::BIGINT AS dev_end FROM _m WHERE false"
    else:
        # each launching host event finds the step whose marker holds its start (ASOF: the marker
        # with the latest start at or before it), then the device tasks sharing its id. The delay:
        # how long the step's first launched task waited, after its launch, for the task before it
        # on its stream (p) to finish: the device's lag behind the host when the step began
        dev = f"""SELECT f.rank, f.step, f.dev_end,
                   greatest(least(f.ds, coalesce(p.start_ns + p.dur_ns, f.ls)) - f.ls, 0) AS delay
            FROM (
                SELECT rank, step, max(de) AS dev_end, arg_min(ds, (ls, ds)) AS ds, arg_min(tid, (ls, ds)) AS tid,
                       min(ls) AS ls
                FROM (
                    SELECT h.rank, m.step, h.start_ns AS ls, d.start_ns AS ds, d.start_ns + d.dur_ns AS de, d.tid
                    FROM (SELECT rank, start_ns, corr FROM {src} WHERE NOT device AND corr IS NOT NULL) h
                    ASOF JOIN _m m ON h.rank = m.rank AND h.start_ns >= m.host_start_ns
                    JOIN (SELECT rank, corr, start_ns, dur_ns, tid FROM {src} WHERE device AND corr IS NOT NULL) d
                         ON d.rank = h.rank AND d.corr = h.corr
                    WHERE h.start_ns < m.host_end_ns
                ) GROUP BY ALL
            ) f
            ASOF LEFT JOIN (SELECT rank, tid, start_ns, dur_ns FROM {src} WHERE device) p
                 ON p.rank = f.rank AND p.tid IS NOT DISTINCT FROM f.tid AND p.start_ns < f.ds"""
    return f"""
        WITH _m AS (SELECT * FROM {marks}),
        _d AS ({dev}),
        _o AS (
            SELECT m.*, d.dev_end, m.host_start_ns + coalesce(d.delay, 0) AS begin_ns,
                   lag(m.step) OVER w AS prev_step, lag(m.host_end_ns) OVER w AS prev_host_end,
                   lead(m.step) OVER w AS next_step, lead(m.host_start_ns) OVER w AS next_start,
                   lead(m.host_start_ns + coalesce(d.delay, 0)) OVER w AS next_begin
            FROM _m m LEFT JOIN _d d USING (rank, step)
            WINDOW w AS (PARTITION BY m.rank ORDER BY m.host_start_ns, m.step)
        ),
        _n AS (
            SELECT *,
                   NOT (prev_step IS NOT DISTINCT FROM step - 1
                        AND host_start_ns >= prev_host_end - {CONSECUTIVE_NS}) AS first,
                   CASE WHEN next_step = step + 1 AND next_start >= host_end_ns - {CONSECUTIVE_NS}
                        THEN next_begin
                        ELSE greatest(host_end_ns, coalesce(dev_end, host_end_ns)) END AS own_end
            FROM _o
        ),
        _c AS (  -- cycles: a first step opens one; bounds never go back in time within a cycle
            SELECT *, sum(first::INTEGER) OVER w AS cycle
            FROM _n WINDOW w AS (PARTITION BY rank ORDER BY host_start_ns, step)
        ),
        _e AS (
            SELECT *, greatest(max(own_end) OVER w, max(CASE WHEN first THEN begin_ns END) OVER w) AS end_ns
            FROM _c
            WINDOW w AS (PARTITION BY rank, cycle ORDER BY host_start_ns, step ROWS UNBOUNDED PRECEDING)
        )
        SELECT rank, step,
               CASE WHEN first THEN begin_ns
                    ELSE lag(end_ns) OVER (PARTITION BY rank ORDER BY host_start_ns, step) END AS start_ns,
               end_ns, host_start_ns, host_end_ns, {str(bool(inferred)).lower()} AS inferred
        FROM _e"""


def build_steps(con: Any, src: str, warn: Callable[..., None], detail: str | None = None, *,
                device: bool = True) -> None:
    """Insert the step windows of the ranks in ``src`` that have none yet.

    ``src`` is a relation (table name or ``(SELECT ...)``) with the columns ``rank``,
    ``is_mark`` (a host ``ProfilerStep#N`` event), ``device``, ``tid``, ``name``, ``start_ns``,
    ``dur_ns`` and ``corr``: the canonical ``events`` table, or a reader's staged rows so that
    steps can be assigned while the events are inserted (no second pass over them).
    ``detail``: the same events with ``kind`` and every event's ``name`` (``src`` when None),
    read to infer the steps of a rank without markers (:mod:`advisor.ingest.step_inference`).
    ``device``: False when ``src`` holds no device event (no launch links to follow).
    """
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _marks AS
        SELECT rank, TRY_CAST(regexp_extract(name, '#(\\d+)', 1) AS INTEGER) AS step,
               min(start_ns) AS host_start_ns, max(start_ns + dur_ns) AS host_end_ns, count(*) AS n
        FROM {src}
        WHERE is_mark AND NOT device AND rank NOT IN (SELECT DISTINCT rank FROM steps)
        GROUP BY ALL HAVING step IS NOT NULL"""
    )
    # in one statement: the steps marked more than once (the first five), whether any step is
    # marked, and the ranks without steps once the marked ones are inserted (each marked step
    # gives one ``steps`` row: the ranks of ``src`` neither in ``steps`` nor in ``_marks``)
    rows = con.execute(
        f"""SELECT 0 AS k, rank, step, n FROM (SELECT rank, step, n FROM _marks WHERE n > 1 ORDER BY rank, step LIMIT 5)
        UNION ALL SELECT 1, NULL, NULL, count(*) FROM _marks
        UNION ALL SELECT 2, rank, NULL, NULL FROM (
            SELECT DISTINCT rank FROM {src}
            WHERE rank NOT IN (SELECT DISTINCT rank FROM steps) AND rank NOT IN (SELECT rank FROM _marks))
        ORDER BY k, rank, step"""
    ).fetchall()
    for _k, rank, step, n in (r for r in rows if r[0] == 0):
        warn("duplicate_step", f"rank {rank}: step {step} is marked {n} times (duplicated events or files); merged")
    if any(r[0] == 1 and r[3] for r in rows):
        marked = "(SELECT rank, step, host_start_ns, host_end_ns FROM _marks)"
        con.execute(f"INSERT INTO steps {windows_sql(marked, src if device else None)}")
    con.execute("DROP TABLE _marks")
    no_marks = [r[1] for r in rows if r[0] == 2]
    if no_marks:
        no_marks = _infer_steps(con, src, detail or src, no_marks, warn)
    for rank, reason in no_marks:
        warn(
            "no_step_marker",
            f"rank {rank}: no ProfilerStep#N marker and steps cannot be inferred ({reason}); the whole trace is "
            "analysed as one window (call prof.step() each iteration to get per-step figures)",
        )
    if no_marks:
        con.execute(
            f"""INSERT INTO steps
            SELECT rank, {NO_STEP}, min(start_ns), max(start_ns + dur_ns), min(start_ns), max(start_ns + dur_ns), false
            FROM {src} WHERE rank IN ({", ".join(str(r) for r, _ in no_marks)})
            GROUP BY rank"""
        )


def _infer_steps(con: Any, src: str, detail: str, ranks: list[int],
                 warn: Callable[..., None]) -> list[tuple[int, str]]:
    """Insert the inferred step windows of ``ranks`` (no marker); return the ranks left without
    steps, each with the reason."""
    from advisor.ingest.step_inference import infer

    try:
        found = infer(con, detail, ranks)
    except Exception as exc:  # noqa: BLE001 - a trace the inference cannot read keeps its one window
        return [(r, f"inference failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                for r in ranks]
    rows = [(r.rank, n, a, b) for r in found for n, a, b in r.steps]
    if rows:
        con.execute("CREATE OR REPLACE TEMP TABLE _imarks (rank INTEGER, step INTEGER, host_start_ns BIGINT, "
                    "host_end_ns BIGINT)")
        con.executemany("INSERT INTO _imarks VALUES (?, ?, ?, ?)", rows)
        con.execute(f"INSERT INTO steps {windows_sql('_imarks', src, inferred=True)}")
        con.execute("DROP TABLE _imarks")
        done = [r for r in found if r.steps]
        counts = sorted({len(r.steps) for r in done})
        span = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        conf = min(r.confidence for r in done)
        # what the window holds: each rank's inferred steps with the inference's confidence
        con.executemany("INSERT INTO window_phases VALUES (?, 'inferred_steps', NULL, ?, ?, ?, ?, ?, false)",
                        [(r.rank, r.steps[0][1], r.steps[-1][2], r.steps[-1][2] - r.steps[0][1], len(r.steps),
                          f"confidence {r.confidence:.2f}, period {r.period}") for r in done])
        warn("steps_inferred",
             f"{_ranks_text([r.rank for r in done])}: no ProfilerStep#N marker; {span} steps inferred from the "
             "repetition of the top-level host operators (step = one period of the sequence, starting after the "
             "optimizer step / at the idle gap before an iteration; confidence "
             f"{conf:.2f}: the least share of operators repeating one period later and of names running as often "
             "in every step); per-step figures are marked inferred")
    return [(r.rank, r.reason) for r in found if not r.steps]


def _ranks_text(ranks: list[int]) -> str:
    """'rank 3' or 'ranks 0-3, 7' (runs of consecutive ranks collapsed)."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


@dataclass(frozen=True)
class WindowLookup:
    """SQL to find an event's step window: ``join`` (a LEFT JOIN clause) or ``match`` (a WHERE condition)."""

    join: str
    match: str


def window_lookup(con: Any, name: str, ranks: str | None = None, *, host: bool = False,
                  alias: str = "s") -> WindowLookup:
    """Build the lookup ``name`` that gives an event its step window; return the join SQL.

    ``host``: the host windows (from each marker's start to the next one's, the last to the
    later of its end and its window's end), which give host events their step: a host event
    belongs to the marker it runs in even when the device lags behind (the step windows, for
    device events, are shifted by the lag). ``alias``: the name the SQL gives the window.

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
    bounds = "host_start_ns AS start_ns, greatest(host_end_ns, end_ns) AS end_ns" if host else "start_ns, end_ns"
    # the windows clipped at the next one's start (a CTE each statement computes again: the
    # windows are few, a table of them cost two statements more)
    clipped = f"""WITH w AS (
        SELECT rank, step, start_ns,
               least(end_ns, coalesce(lead(start_ns) OVER (PARTITION BY rank ORDER BY start_ns, step), end_ns)) AS end_ns
        FROM (SELECT rank, step, {bounds} FROM steps {where}))"""
    # the width gives each rank ~4 buckets per window (+64) over its own span: the lookup holds
    # ~5 rows per window whatever the number of ranks (a width from the windows of all ranks
    # over the span of one listed every rank's windows under R times too many buckets: 1,024
    # ranks, 0.7 GB). A rank whose span is far longer than the others' (a garbage window) takes
    # more of the buckets and leaves the others wider ones: slower, never wrong.
    origin, end, width, wide = con.execute(
        f"""{clipped}, r AS (SELECT rank, min(start_ns) AS s, max(end_ns) AS e, count(*) AS n FROM w GROUP BY rank)
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
        f"""CREATE OR REPLACE TEMP TABLE {name} AS {clipped}
        SELECT rank, unnest(range(({bucket("start_ns")})::BIGINT, ({bucket("end_ns - 1")})::BIGINT + 1)) AS bucket,
               step, start_ns, end_ns
        FROM w WHERE end_ns > start_ns"""
    )
    # an event outside every window has no bucket (its distance to the origin may not fit a BIGINT)
    a = alias
    match = (f"{a}.rank = t.rank AND {a}.bucket = CASE WHEN t.start_ns >= {origin} AND t.start_ns < {end} "
             f"THEN {bucket('t.start_ns')} END AND t.start_ns >= {a}.start_ns AND t.start_ns < {a}.end_ns")
    return WindowLookup(f"LEFT JOIN {name} {a} ON {match}", match)


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
    # the ranks of events and of steps, and whether kernels / comm_ops have rows without a step
    ranks, have, *unset = con.execute(
        """SELECT (SELECT list(DISTINCT rank) FROM events), (SELECT list(DISTINCT rank) FROM steps),
                  EXISTS (SELECT 1 FROM kernels WHERE step IS NULL), EXISTS (SELECT 1 FROM comm_ops WHERE step IS NULL)"""
    ).fetchall()[0]
    ranks, have = set(ranks or ()), set(have or ())
    if ranks - have:
        build_steps(con, "(SELECT rank, kind = 'step' AS is_mark, kind, device, tid, name, start_ns, dur_ns, corr, bytes "
                    "FROM events)", warn)
    if ranks - set(assigned):
        _assign(con)
    for table, todo in zip(("kernels", "comm_ops"), unset, strict=True):
        if todo:
            con.execute(
                f"""UPDATE {table} t SET step = s.step FROM steps s
                WHERE t.step IS NULL AND t.rank = s.rank AND t.start_ns >= s.start_ns AND t.start_ns < s.end_ns"""
            )
    from advisor.ingest.window import review

    review(con, warn)


def _assign(con: Any) -> None:
    """Rebuild ``events`` with ``step`` = the window holding the event's start, the host window
    for a host event (no per-event loop)."""
    cols = [r[0] for r in con.execute("DESCRIBE events").fetchall()]
    step = f"coalesce(CASE WHEN t.device THEN {step_of('t.start_ns')} ELSE {step_of('t.start_ns', 'h')} END, t.step)"
    select = ", ".join(f"{step} AS step" if c == "step" else f"t.{c}" for c in cols)
    lookup = window_lookup(con, "_assign_w")
    hlookup = window_lookup(con, "_assign_h", host=True, alias="h")
    con.execute(f"CREATE TABLE _events_new AS SELECT {select} FROM events t {lookup.join} {hlookup.join}")
    drop_window_lookup(con, "_assign_w")
    drop_window_lookup(con, "_assign_h")
    con.execute("DROP TABLE events")
    con.execute("ALTER TABLE _events_new RENAME TO events")
