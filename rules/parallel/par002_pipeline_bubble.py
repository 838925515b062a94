"""Pipeline stages sit idle waiting for each other: receive waits and idle gaps before point-to-point transfers.

## Why it matters
With pipeline parallelism a stage can only start a micro-batch once the previous stage has sent
its activations (forward) or the next stage its gradients (backward). With a 1F1B schedule the
idle share of a step is about (p − 1)/(m + p − 1) for p stages and m micro-batches (Narayanan
et al., SC'21), and unbalanced stages add more. That time is lost on every stage of the pipeline.

## How it is detected
Two sources, the first that the profile has:

* **Ascend** ``step_trace_time.csv`` (canonical ``vendor_steps``): ``Bubble`` is the time in
  ``hcom_receive*`` operators per step and ``Stage`` the step's device span minus the bubble
  (msprof-analyze); the bubble share is Bubble / (Stage + Bubble).
* **Kineto / other traces**: point-to-point transfers are the communication events whose own
  name, or the host communication call that launched them, names a send or receive
  (``nccl:send``, ``nccl:recv``, ``c10d::recv_``, ``gloo:recv``, ``hcom_receive`` …; NCCL's
  ``SendRecv`` kernels alone are not enough, since NCCL also runs all-to-all on them). The
  bubble per step is the time spent in receives (as Ascend counts it) plus, on device
  timelines, the idle gaps just before each send or receive (the device had nothing to do until
  the transfer could start). On CPU-only traces (gloo) the receive calls are host events and
  their duration is the wait.

A rank fires when its median bubble share of the step reaches ``min_bubble_share``. The
saving is the median bubble per step, an upper bound (a zero-bubble schedule).

## What to do
More micro-batches per step, an interleaved (virtual-stage) or zero-bubble schedule, and layers
moved so every stage has the same compute time; check the slowest stage's own findings first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for PAR002."""

    min_bubble_share: float = knob(
        0.10, "median pipeline-bubble time as a share of the step that fires the rule",
        "CAUSES.md 'high' cutoff (10 %); 1F1B bubble (p−1)/(m+p−1) stays below it only with m ≥ 9(p−1)",
    )


VENDOR_SQL = """
SELECT rank, step, bubble_ns / 1000.0 AS bubble_us, stage_ns / 1000.0 AS stage_us,
       (coalesce(stage_ns, 0) + bubble_ns) / 1000.0 AS span_us, 'vendor' AS source,
       NULL::DOUBLE AS recv_us, NULL::DOUBLE AS gap_us, NULL::BIGINT AS p2p_ops
FROM vendor_steps WHERE bubble_ns IS NOT NULL AND step IS NOT NULL
ORDER BY rank, step
"""

# P2P = a comm event named send/recv itself, or launched (corr) from inside a host comm call so named.
P2P_RE = r"(?i)(^|[^a-z])(send|recv|receive|isend|irecv)([^a-z]|$)|hcom_(send|receive)"
NOT_P2P_RE = r"(?i)sendrecv|all_?to_?all|all_?reduce|all_?gather|reduce_?scatter|broadcast"

HAS_P2P_SQL = """
SELECT count(*) AS n FROM event_names
WHERE kind = 'comm' AND regexp_matches(name, $p2p) AND NOT regexp_matches(name, $notp2p)
"""

TRACE_SQL = """
WITH comm_names AS (  -- every communication name classified once
    SELECT name, regexp_matches(name, $p2p) AND NOT regexp_matches(name, $notp2p) AS p2p,
           regexp_matches(name, '(?i)recv|receive') AS recv_word,
           regexp_matches(name, '(?i)recv|receive') AND NOT regexp_matches(name, $notp2p) AS recv
    FROM (SELECT DISTINCT name FROM event_names WHERE kind = 'comm')
),
hostp2p AS (
    SELECT e.rank, e.step, e.tid, e.start_ns, e.start_ns + e.dur_ns AS end_ns, e.name, n.recv_word AS is_recv
    FROM events e JOIN comm_names n USING (name)
    WHERE NOT e.device AND e.kind = 'comm' AND n.p2p
),
launch AS (  -- runtime launches made inside a host P2P call
    SELECT r.rank, r.corr, bool_or(h.is_recv) AS is_recv
    FROM events r JOIN hostp2p h ON r.rank = h.rank AND r.tid = h.tid
         AND r.start_ns >= h.start_ns AND r.start_ns < h.end_ns
    WHERE NOT r.device AND r.kind = 'runtime' AND r.corr IS NOT NULL
    GROUP BY ALL
),
devcomm AS (  -- device communication: P2P by its own name or by the host call that launched it
    SELECT e.rank, e.step, e.start_ns, e.start_ns + e.dur_ns AS end_ns,
           n.p2p OR l.corr IS NOT NULL AS p2p, n.recv OR coalesce(l.is_recv, false) AS recv
    FROM events e LEFT JOIN comm_names n USING (name) LEFT JOIN launch l ON l.rank = e.rank AND l.corr = e.corr
    WHERE e.device AND e.kind = 'comm' AND e.step IS NOT NULL
),
dev AS (  -- device work of the ranks with device P2P transfers
    SELECT rank, step, start_ns, start_ns + dur_ns AS end_ns, false AS p2p, false AS recv
    FROM events
    WHERE device AND kind IN ('kernel', 'memcpy', 'memset') AND step IS NOT NULL
      AND rank IN (SELECT rank FROM devcomm WHERE p2p)
    UNION ALL
    SELECT rank, step, start_ns, end_ns, p2p, recv FROM devcomm WHERE rank IN (SELECT rank FROM devcomm WHERE p2p)
),
ord AS (
    SELECT *, max(end_ns) OVER (PARTITION BY rank ORDER BY start_ns, end_ns
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM dev
),
devstep AS (
    SELECT o.rank, o.step,
           sum(o.end_ns - o.start_ns) FILTER (WHERE o.recv) / 1000.0 AS recv_us,
           sum(greatest(o.start_ns - greatest(o.prev_end, s.start_ns), 0)) FILTER (WHERE o.p2p) / 1000.0 AS gap_us,
           count(*) FILTER (WHERE o.p2p) AS p2p_ops
    FROM ord o JOIN steps s ON s.rank = o.rank AND s.step = o.step
    GROUP BY ALL HAVING count(*) FILTER (WHERE o.p2p) > 0
),
hoststep AS (  -- CPU-only ranks: host receive calls are the wait
    SELECT h.rank, h.step, sum(h.end_ns - h.start_ns) FILTER (WHERE h.is_recv) / 1000.0 AS recv_us,
           0.0 AS gap_us, count(*) AS p2p_ops
    FROM hostp2p h JOIN ranks r ON r.rank = h.rank AND NOT coalesce(r.has_device, false)
    WHERE h.step IS NOT NULL
      AND NOT EXISTS (  -- count nested calls once (e.g. a c10d op enclosing its gloo annotation)
          SELECT 1 FROM hostp2p o WHERE o.rank = h.rank AND o.tid = h.tid AND o.is_recv = h.is_recv
            AND o.start_ns <= h.start_ns AND o.end_ns >= h.end_ns
            AND (o.start_ns, -o.end_ns, o.name) < (h.start_ns, -h.end_ns, h.name))
    GROUP BY ALL
),
per AS (SELECT * FROM devstep UNION ALL SELECT * FROM hoststep)
SELECT p.rank, p.step, coalesce(p.recv_us, 0) + coalesce(p.gap_us, 0) AS bubble_us, NULL::DOUBLE AS stage_us,
       b.step_us AS span_us, 'trace' AS source, p.recv_us, p.gap_us, p.p2p_ops
FROM per p JOIN breakdown b ON b.rank = p.rank AND b.step = p.step
ORDER BY p.rank, p.step
"""


@rule("PAR002", "parallel.pipeline-bubble", cause="parallel.pipeline_bubble",
      requires=("breakdown",), thresholds=Thresholds, derived=("event_names",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per rank when the pipeline bubble is a large share of the step."""
    df = ctx.df(VENDOR_SQL) if ctx.rows("vendor_steps") else None
    if df is None or df.empty or float(df["bubble_us"].sum()) <= 0:
        params = {"p2p": P2P_RE, "notp2p": NOT_P2P_RE}
        if not ctx.query(HAS_P2P_SQL, params)[0]["n"]:
            return  # no communication named send/receive: no host P2P call and no device P2P transfer
        df = ctx.df(TRACE_SQL, params)
    if df.empty:
        return
    df = df[df["span_us"] > 0]
    df = df.assign(share=df["bubble_us"] / df["span_us"])
    for rank, g in df.groupby("rank"):
        share = float(g["share"].median())
        if share < ctx.t.min_bubble_share:
            continue
        bubble = float(g["bubble_us"].median())
        span = float(g["span_us"].median())
        vendor = g["source"].iloc[0] == "vendor"
        evidence: dict[str, Any] = {
            "bubble_share": round(share, 4),
            "min_bubble_share": ctx.t.min_bubble_share,
            "bubble_us_median": round(bubble, 1),
            "step_us_median": round(span, 1),
            "source": "step_trace_time Bubble/Stage" if vendor else "P2P receive time + idle gaps before P2P ops",
            "steps": len(g),
        }
        if vendor:
            evidence["stage_us_median"] = round(float(g["stage_us"].median()), 1)
        else:
            evidence["recv_us_median"] = round(float(g["recv_us"].fillna(0).median()), 1)
            evidence["idle_before_p2p_us_median"] = round(float(g["gap_us"].fillna(0).median()), 1)
            evidence["p2p_ops_per_step"] = round(float(g["p2p_ops"].median()), 1)
        yield ctx.finding(
            title=f"Pipeline bubble on rank {rank}: {share:.0%} of each step ({bubble / 1000:.1f} ms of "
            f"{span / 1000:.1f} ms) is spent waiting for the neighbouring stage",
            evidence=evidence,
            saving_us=bubble,
            step_us=span,
            saving_basis="median per-step bubble (" + ("step_trace_time Bubble = hcom_receive time" if vendor
                                                      else "receive time plus device idle just before P2P ops")
            + "); a zero-bubble schedule is the upper bound",
            ranks=[int(rank)],
            steps=[int(s) for s in g["step"]],
        )
