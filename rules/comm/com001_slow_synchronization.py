"""Collectives spend most of their time waiting for the slowest member of the group.

## Why it matters
A collective finishes only when its last member has arrived and transmitted. Every other member
waits, and that wait is pure loss. Hermes (§4.2.2, eq. 1–2) models it: with T_i the time device i
needs and T_max the slowest, the group wastes T_wait = Σ(T_max − T_i) = n(T_max − T_avg) of
T_total = n·T_max, i.e. R_wait = 1 − T_avg / T_max. In its VGG16 case an R_wait of 0.3 pointed at
one slow NPU.

## How it is detected
The same collective instance is matched across the ranks of its group: per step and group, by
name where the name carries a sequence number (Ascend ``hcom_allReduce__445_2``), otherwise by the
operation type and its order within the step (the k-th all-reduce of step N on every rank).
Sources: ``comm_ops`` (Ascend communication.json, Kineto NCCL/HCCL device kernels); on ranks
without device communication, the host collectives that block for their peers (``gloo:*``,
``mpi:*``, ``ucc:*`` annotations; CPU-only gloo traces). Point-to-point send/recv are left out
(their partner is one rank, not a group), but not the ``SendRecv`` kernels NCCL runs an
all-to-all with: their ``comm_ops`` type is ``alltoall``, a collective of the whole group.

Per instance and member, the wait w_i is the exported wait time where the source has it (Ascend
``Wait Time(ms)``), else the member's duration minus the shortest duration in the group: the
collectives end together, so the member that arrives last has the shortest duration and everyone
else waited the difference. R_wait = Σ w_i / Σ d_i over the members; in the paper's model (all
members busy for T_max, w_i = T_max − T_i) this is exactly 1 − T_avg / T_max. The rule fires for a
group when R_wait over all its matched instances (time-weighted) reaches ``min_wait_ratio``. The
slowest member is the rank with the least wait (ties within ``tie_share`` of the longest duration
all count: several members can arrive last together), scored by the wait it caused the others.

A slowest member is a straggler only when it is significant across steps and large enough: per
step, the others' median wait minus its own wait is the time the group spends on it; the mean of
that over the steps must exceed k standard errors (LLMPrism's k-σ, k = 3; with fewer than three
steps it must be positive in every step) and ``min_wait_share`` of the step. Equal ranks whose
arrival order changes from step to step (a DDP job with large buckets) give a mean near zero and
no finding, however large R_wait is. The waiting rank named is never one of the slowest. Where the
group's ranks were read together and replayed joined by their collectives, and in no step does any
member's own time (its step less the communication no computation hides) lead its peers' by
``min_wait_share`` of the step, nobody arrives late: the recorded waits are the collective's own work
(a member moving its data over a slower path, as an export's wait/transit split can show), and there
is no finding (a warning says so).

The saving is, per step, the largest total wait of one member (capped at the time that member
spent inside the collectives, so concurrent collectives are not counted twice; the median over
steps): an upper bound of what removing the imbalance gives back, since a wait hidden under other
work costs less. Where the ranks' collectives can be joined (device collectives recorded as one
task, the group read together), the saving is instead the cluster's step replayed with the slowest
member at its peers' median own speed (docs/numbers.md: the what-if replay).

## What to do
Find out why the slowest member arrives late: look at that rank's own findings (data loading,
host overhead, compute, frequency drop) and at cluster.slow_rank. Balance per-rank work.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import Change, RankPart, RuleContext, Select, knob, rule, straggler_summary
from advisor.model import Finding
from rules.comm._common import P2P_RE, ms, slowest_rank_savings, step_us


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for COM001."""

    min_wait_ratio: float = knob(
        0.2,
        "R_wait (share of the group's collective time spent waiting) at which the rule fires",
        "Hermes §4.2.2 eq. 2 and §5 (VGG16: R_wait 0.3 was above the threshold); msprof-analyze packet/priority "
        "ratios use 0.2",
    )
    min_instances: int = knob(1, "matched collective instances a group needs before it is judged")
    top_n: int = knob(5, "collective instances listed in the finding")
    k: float = knob(3.0, "the slowest member's per-step lead over the others' wait must exceed k standard errors "
                    "across steps", "LLMPrism §IV-D k-sigma rule, k = 3")
    min_wait_share: float = knob(
        0.05, "the others' mean wait per step on the slowest member, as a share of the step",
        "first principles: as CLU001; 5 % is above the CAUSES.md medium cutoff (3 %)")
    tie_share: float = knob(0.05, "members whose wait is within this share of the instance's longest duration of "
                            "the least wait all count as arriving last")


BASE = """
WITH dev AS (SELECT DISTINCT rank FROM comm_ops),
src AS (
    SELECT rank, step, coalesce(group_name, '') AS grp, name, coalesce(op_type, '') AS op_type,
           start_ns, dur_ns, wait_ns, transit_ns, 'comm_ops' AS source
    FROM comm_ops
    WHERE step IS NOT NULL AND dur_ns > 0
      AND (regexp_matches(coalesce(op_type, ''), '^(alltoall|allreduce|allgather|reducescatter|broadcast)$')
           OR NOT regexp_matches(name || ' ' || coalesce(op_type, ''), $p2p))  -- a collective type wins (SendRecv kernels of an all-to-all)
    UNION ALL
    SELECT rank, step, '' AS grp, name, lower(regexp_replace(name, '^[a-z]+:', '')) AS op_type,
           start_ns, dur_ns, NULL AS wait_ns, NULL AS transit_ns, 'host' AS source
    FROM com001_host_comm
    WHERE rank NOT IN (SELECT rank FROM dev)
),
keyed AS (
    SELECT *, CASE WHEN regexp_matches(name, '^hcom_\\w+__\\d+_\\d+') THEN name
                   WHEN op_type <> '' THEN op_type ELSE name END AS key_name
    FROM src
),
ops AS (
    SELECT *, row_number() OVER (PARTITION BY rank, step, grp, key_name ORDER BY start_ns) AS ord
    FROM keyed
),
inst AS (
    SELECT step, grp, key_name, ord, count(*) AS n, min(dur_ns) AS dmin, max(dur_ns) AS dmax,
           avg(dur_ns) AS davg, sum(dur_ns) AS dsum, bool_and(wait_ns IS NOT NULL) AS has_wait,
           min(source) AS source, any_value(name) AS name
    FROM ops GROUP BY ALL HAVING count(*) >= 2
),
member AS (
    SELECT o.rank, o.step, o.grp, o.key_name, o.ord, o.start_ns, o.dur_ns, o.transit_ns,
           CASE WHEN i.has_wait THEN o.wait_ns ELSE o.dur_ns - i.dmin END AS w
    FROM ops o JOIN inst i USING (step, grp, key_name, ord)
)
"""

SQL = BASE + """
SELECT m.*, i.n, i.dmin, i.dmax, i.davg, i.dsum, i.has_wait, i.source, i.name
FROM member m JOIN inst i USING (step, grp, key_name, ord)
ORDER BY grp, step, key_name, ord, rank
"""

# per (group, rank, step): time inside the matched collectives (union of intervals: concurrent
# collectives on several threads or streams must not count twice)
UNION_SQL = BASE + """,
prev AS (
    SELECT grp, rank, step, start_ns AS s, start_ns + dur_ns AS e,
           max(start_ns + dur_ns) OVER (PARTITION BY grp, rank, step ORDER BY start_ns
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM member
),
isl AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY grp, rank, step ORDER BY s ROWS UNBOUNDED PRECEDING) AS island
    FROM prev
)
SELECT grp, rank, step, sum(e2 - s2) AS inside_ns
FROM (SELECT grp, rank, step, island, min(s) AS s2, max(e) AS e2 FROM isl GROUP BY ALL)
GROUP BY ALL
"""

COUNTS = """
SELECT rank, step, grp, key_name, count(*) AS n FROM (
    SELECT rank, step, coalesce(group_name, '') AS grp,
           CASE WHEN regexp_matches(name, '^hcom_\\w+__\\d+_\\d+') THEN name
                WHEN coalesce(op_type, '') <> '' THEN op_type ELSE name END AS key_name
    FROM comm_ops WHERE step IS NOT NULL
) GROUP BY ALL
"""


# the rank part (each rank's own events): the host collectives of ranks without device
# communication, and how many communication events each rank has
HOST_SQL = """
SELECT rank, step, name, start_ns, dur_ns
FROM events
WHERE kind = 'comm' AND NOT device AND step IS NOT NULL AND dur_ns > 0
  AND regexp_matches(name, '^(gloo|mpi|ucc):') AND NOT regexp_matches(name, $p2p)
  AND rank NOT IN (SELECT DISTINCT rank FROM comm_ops)
ORDER BY rank, start_ns, name
"""

RANK_TABLES = {
    "com001_host_comm": "rank INTEGER, step INTEGER, name VARCHAR, start_ns BIGINT, dur_ns BIGINT",
    "com001_comm_events": "rank INTEGER, n BIGINT",
    "com001_replay": "rank INTEGER, step INTEGER, measured_ns BIGINT, saving_ns BIGINT, error DOUBLE, reason VARCHAR",
    "com001_straggler": "step INTEGER, rank INTEGER, ranks VARCHAR, measured_ns BIGINT, saving_ns BIGINT, error DOUBLE, "
                        "factor DOUBLE, reason VARCHAR",
}

#: the counterfactual (advisor.stages.replay): each collective waits only for its transfer. Where the
#: export records the waits as tasks (Ascend HCCL ``Notify Wait`` beside the transfer tasks ``SDMA`` /
#: ``RDMA`` ...), those tasks take no time; where it records a collective's transit time (Ascend
#: communication.json / .db ``Transit Time``), the collective is bounded to it (else to its elapse time
#: less its ``Wait Time``): the rest of its elapse time is waiting, at the start or between transfers
NOTIFY_WAIT_RE = r"(?i)^notify[ _]wait$"
#: the cause of collectives idle on every member at once (no late member, no transfer)
IDLE_CAUSE = "comm.collective_idle"
ASSUMPTION = "if each collective waited only for its own transfer (no wait for its peers)"
IDLE_ASSUMPTION = "if each collective took only its own transfer time (no idle time inside it on any member)"
NOT_ESTIMATED = ("the collectives record no wait apart from their transfer (Kineto NCCL kernels, gloo calls): the time "
                 "beyond the last participant's arrival needs every participant's arrival on one clock, which "
                 "the replay of one rank does not have")

# per rank and step: the wait the collectives record (exported wait time, or their wait tasks)
WAITS_SQL = """
SELECT rank, step, sum(dur_ns - coalesce(transit_ns, dur_ns - wait_ns)) AS wait_ns FROM comm_ops
WHERE step IS NOT NULL AND coalesce(transit_ns, wait_ns) IS NOT NULL AND dur_ns > 0 GROUP BY ALL
"""
BOUNDS_SQL = """
SELECT name, greatest(coalesce(transit_ns, dur_ns - wait_ns), 0) AS bound FROM comm_ops
WHERE rank = $rank AND step = $step AND coalesce(transit_ns, wait_ns) IS NOT NULL AND dur_ns > 0
"""
NOTIFY_SQL = """
SELECT e.rank, s.step, sum(e.dur_ns) AS wait_ns FROM events e JOIN steps s
  ON s.rank = e.rank AND e.start_ns >= s.start_ns AND e.start_ns < s.end_ns
WHERE e.device AND e.kind = 'comm' AND regexp_matches(e.name, $notify_re) GROUP BY ALL
"""


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """What COM001 reads of each rank's events (see :class:`advisor.engine.rule.RankPart`)."""
    host = [(r["rank"], r["step"], r["name"], r["start_ns"], r["dur_ns"]) for r in ctx.query(HOST_SQL, {"p2p": P2P_RE})]
    counts = [(r["rank"], r["n"]) for r in ctx.query(
        "SELECT rank, count(*) AS n FROM events WHERE kind = 'comm' GROUP BY rank ORDER BY rank")]
    replayed, worth = _replay_rows(ctx)
    straggler = [(r["step"], r["rank"], r["ranks"], r["measured_ns"], r["saving_ns"], r["error"], r["factor"],
                  r["reason"]) for r in ctx.straggler_replay(worth, ctx.t.min_wait_share)]
    return {"com001_host_comm": host, "com001_comm_events": counts, "com001_replay": replayed,
            "com001_straggler": straggler}


def _replay_rows(ctx: RuleContext[Thresholds]) -> tuple[list[tuple[Any, ...]], set[int]]:
    """Per (rank, step) with collectives: the measured step and the saving of :data:`ASSUMPTION`
    replayed, or why it is not: no recorded wait, or waits under ``min_wait_share`` of the step (not
    worth a replay: the rule cannot fire on them). And the steps where some rank's collectives wait
    that much, or record no wait apart from their transfer (worth a straggler's replay)."""
    worth: set[int] = set()
    bd = ctx.breakdown()
    if bd is None or bd.empty:
        return [], worth
    waits: dict[tuple[int, int], float] = {}
    for r in ctx.query(WAITS_SQL):
        waits[(int(r["rank"]), int(r["step"]))] = float(r["wait_ns"] or 0)
    for r in ctx.query(NOTIFY_SQL, {"notify_re": NOTIFY_WAIT_RE}):
        key = (int(r["rank"]), int(r["step"]))
        waits[key] = max(waits.get(key, 0.0), float(r["wait_ns"] or 0))
    comm_ranks = {int(r["rank"]) for r in ctx.query(
        "SELECT DISTINCT rank FROM comm_ops UNION SELECT DISTINCT rank FROM events WHERE kind = 'comm'")}
    rows: list[tuple[Any, ...]] = []
    for rank, step, len_us in zip(bd["rank"].tolist(), bd["step"].tolist(), bd["step_us"].tolist(), strict=True):
        rank, step = int(rank), int(step)
        if rank not in comm_ranks:
            continue
        wait = waits.get((rank, step))
        if wait is None:
            rows.append((rank, step, round(len_us * 1000), None, None, NOT_ESTIMATED))
            worth.add(step)
            continue
        if wait < ctx.t.min_wait_share * len_us * 1000:
            rows.append((rank, step, round(len_us * 1000), 0, None,
                         f"the collectives wait under {ctx.t.min_wait_share:.0%} of the step: not replayed, no saving"))
            continue
        worth.add(step)
        bounds = tuple((str(r["name"]), int(r["bound"])) for r in ctx.query(BOUNDS_SQL, {"rank": rank, "step": step}))
        changes = [Change("remove", Select(kinds=("comm",), device=True, name_re=NOTIFY_WAIT_RE))]
        if bounds:
            changes.append(Change("bound", Select(kinds=("comm",), device=True, names=tuple(n for n, _ in bounds)),
                                  bounds=bounds))
        for res in ctx.replay_steps(rank, changes, [step]):
            rows.append((rank, step, res.measured_ns, res.saving_ns if res.reproduced else None, res.error,
                         None if res.reproduced else "the replay does not reproduce the measured step"))
    return rows, worth


def _straggler_replay_of(ctx: RuleContext[Thresholds], ranks: list[int], steps: list[int], slowest: int) -> dict[str, Any]:
    """The ``replay`` of a group waiting for ``slowest``: :func:`advisor.engine.rule.straggler_summary` of
    ``com001_straggler`` (built where the ranks' events are)."""
    rows = ctx.query("SELECT * FROM com001_straggler WHERE step IN (SELECT unnest($steps)) ORDER BY step",
                     {"steps": steps})
    return straggler_summary(rows, ranks, steps, slowest)


def _replay_of(ctx: RuleContext[Thresholds], ranks: list[int], steps: list[int],
               assumption: str = ASSUMPTION) -> dict[str, Any]:
    """The finding's ``replay``: per step, the cluster's step (its slowest rank) measured less the cluster's
    step replayed with every rank's collectives waiting only for their transfer (a rank whose collectives
    wait little keeps its measured step); the mean over the steps whose every rank was replayed, with
    ``ranks`` (the group) there. A rank that cannot be replayed leaves its step out."""
    rows = ctx.query("SELECT * FROM com001_replay WHERE step IN (SELECT unnest($steps)) ORDER BY step, rank",
                     {"steps": steps})
    group = set(ranks)
    rows = [r for r in rows if any(int(x["step"]) == int(r["step"]) and int(x["rank"]) in group for x in rows)]
    if not rows:
        return {"estimated": False, "assumption": assumption, "reason": "no replay of these ranks' steps"}
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    savings, errors, reasons = slowest_rank_savings(by_step)
    if not savings:
        return {"estimated": False, "assumption": assumption, "reason": "; ".join(sorted(reasons)) or "not replayed"}
    saving_us = sum(sv for sv, _ in savings) / len(savings) / 1000.0
    step_us = sum(m for _, m in savings) / len(savings) / 1000.0
    return {"estimated": True, "saving_us": round(max(saving_us, 0.0), 3),
            "saving_fraction": round(max(saving_us, 0.0) / step_us, 4) if step_us else None,
            "assumption": assumption, "reproduced": len(savings) == len(by_step),
            "reproduction_error": round(max(errors), 4) if errors else 0.0,
            "steps": len(by_step), "steps_replayed": len(savings)}


@rule("COM001", "comm.slow-synchronization", cause="comm.slow_synchronization", causes=(IDLE_CAUSE,),
      requires=("events", "steps", "multi_rank"), thresholds=Thresholds, scope="cluster",
      rank_part=RankPart(RANK_TABLES, rank_part))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per communication group whose collectives mostly wait for one member."""
    df = ctx.df(SQL, {"p2p": P2P_RE})
    if df.empty:
        n_comm = ctx.query(
            "SELECT (SELECT count(*) FROM comm_ops) + (SELECT coalesce(sum(n), 0) FROM com001_comm_events) AS n"
        )[0]["n"]
        if n_comm:
            ctx.warn("no collective was found on two or more ranks with the same step, group and order "
                     "(only point-to-point transfers, only host-side enqueue ops such as nccl:* / c10d::*, "
                     "or the ranks in the profile do not share a group); R_wait cannot be computed")
        return
    world = ctx.query("SELECT max(world_size) AS w, count(*) AS n FROM ranks")[0]
    inside = ctx.df(UNION_SQL, {"p2p": P2P_RE}).set_index(["grp", "rank", "step"])["inside_ns"]
    for grp, g in df.groupby("grp", sort=True):
        per_inst = g.groupby(["step", "key_name", "ord"], sort=False).agg(
            w=("w", "sum"), d=("dur_ns", "sum"), n=("n", "first"), dmin=("dmin", "first"), dmax=("dmax", "first"),
            davg=("davg", "first"), name=("name", "first"), has_wait=("has_wait", "first"))
        if len(per_inst) < ctx.t.min_instances:
            continue
        idle = _idle_finding(ctx, str(grp), g, inside, world)
        if idle is not None:
            yield idle
        total_w, total_d = float(g["w"].sum()), float(g["dur_ns"].sum())
        r_wait = total_w / total_d if total_d > 0 else 0.0
        if r_wait < ctx.t.min_wait_ratio:
            continue
        # slowest members per instance = least wait (ties within tie_share of the longest duration: several
        # members can arrive last together); score each rank by the wait the others spent on it
        keys = ["step", "key_name", "ord"]
        wmin = g.groupby(keys, sort=False)["w"].transform("min")
        tied = g[g["w"] <= wmin + ctx.t.tie_share * g["dmax"]]
        slow = tied[[*keys, "rank"]].merge(per_inst[["w"]].reset_index(), on=keys)
        by_rank = slow.groupby("rank")["w"].sum().sort_values(ascending=False)
        slowest_ranks = sorted(int(r) for r, v in by_rank.items() if v >= 0.9 * float(by_rank.iloc[0]))
        slowest = int(by_rank.index[0])
        slowest_share = float(slow[slow["rank"] == slowest][keys].drop_duplicates().shape[0] / len(per_inst))
        # a member cannot wait longer than it spent inside the collectives of that step
        per_rank_step = g.groupby(["rank", "step"])["w"].sum()
        lead = _lead_per_step(per_rank_step, slowest)
        lead_mean = float(lead.mean()) if len(lead) else 0.0
        lead_se = float(lead.std(ddof=1)) / math.sqrt(len(lead)) if len(lead) >= 3 else 0.0
        significant = lead_mean > ctx.t.k * lead_se if len(lead) >= 3 else bool(len(lead) and (lead > 0).all())
        s_slow = step_us(ctx, slowest)
        if not significant or lead_mean / 1000.0 < ctx.t.min_wait_share * s_slow:
            why = (f"its lead is not significant across {len(lead)} steps" if not significant else
                   f"its lead of {lead_mean / 1e6:.2f} ms per step is under {ctx.t.min_wait_share:.0%} of the step")
            ctx.warn(f"group {grp or '(default)'}: R_wait {r_wait:.2f}, but rank {slowest} is not a straggler ({why}); "
                     "no finding")
            continue
        cap = inside.loc[grp].reindex(per_rank_step.index)
        per_rank_step = per_rank_step.clip(upper=cap.fillna(per_rank_step))
        worst_per_step = per_rank_step.groupby("step").max()
        saving_us = float(worst_per_step.median()) / 1000.0
        waits = per_rank_step.groupby("rank").median()
        waiting_rank = int(waits.drop(index=slowest_ranks, errors="ignore").idxmax()) if len(
            waits.drop(index=slowest_ranks, errors="ignore")) else int(waits.idxmax())
        s_us = step_us(ctx, waiting_rank)
        ranks = sorted(int(r) for r in g["rank"].unique())
        per_inst = per_inst.assign(r=per_inst["w"] / per_inst["d"]).sort_values("w", ascending=False)
        slow_by_inst = slow.groupby(keys)["rank"].agg(lambda x: ", ".join(str(int(v)) for v in sorted(x)))
        top = [
            {"step": int(k[0]), "collective": str(row["name"]), "order_in_step": int(k[2]), "members": int(row["n"]),
             "r_wait": round(float(row["r"]), 4), "t_max_ms": ms(row["dmax"]), "t_avg_ms": ms(row["davg"]),
             "t_min_ms": ms(row["dmin"]), "total_wait_ms": ms(row["w"]), "slowest_ranks": slow_by_inst.loc[k]}
            for k, row in per_inst.head(ctx.t.top_n).iterrows()
        ]
        replay = _straggler_replay_of(ctx, ranks, sorted(int(s) for s in g["step"].unique()), slowest)
        if replay.get("no_straggler"):
            # the ranks replayed together: in no step does a member's own time lead its peers', so what the
            # others wait for is the collective's own work (its transfers, its path), not a late member
            ctx.warn(f"group {grp or '(default)'}: R_wait {r_wait:.2f}, the members wait for rank {slowest} in the "
                     f"{'exported wait time' if bool(per_inst['has_wait'].all()) else 'durations'}, but in no step "
                     "does any member's own time lead its peers' (the ranks replayed together): not a late member; "
                     "no finding")
            continue
        has_wait = bool(per_inst["has_wait"].all())
        label = f"group {grp}" if grp else "the default group"
        who = (f"rank {slowest}" if len(slowest_ranks) == 1 else
               "ranks " + ", ".join(map(str, slowest_ranks[:4])) + (" …" if len(slowest_ranks) > 4 else ""))
        partial = world["w"] is not None and world["w"] > len(ranks)
        yield ctx.finding(
            title=f"Collectives in {label} wait {r_wait:.0%} of their time for {who} "
                  f"(R_wait {r_wait:.2f} ≥ {ctx.t.min_wait_ratio}; up to {saving_us / 1000:.1f} ms per step)",
            evidence={
                "r_wait": round(r_wait, 4),
                "min_wait_ratio": ctx.t.min_wait_ratio,
                "r_wait_max_instance": round(float(per_inst["r"].max()), 4),
                "slowest_rank": slowest,
                "slowest_rank_share": round(slowest_share, 4),
                "slowest_ranks": ", ".join(map(str, slowest_ranks)),
                "instances": len(per_inst),
                "members": len(ranks),
                "world_size": None if world["w"] is None else int(world["w"]),
                "total_wait_ms": ms(total_w),
                "total_collective_ms": ms(total_d),
                "wait_per_step_ms_median": round(saving_us / 1000.0, 3),
                "waiting_rank": waiting_rank,
                "slowest_lead_us_per_step": round(lead_mean / 1000.0, 1),
                "slowest_lead_se_us": round(lead_se / 1000.0, 1),
                "steps_compared": len(lead),
                "k": ctx.t.k,
                "min_wait_share": ctx.t.min_wait_share,
                "wait_source": "exported wait time" if has_wait else "duration minus the group's shortest duration",
                "group": grp or None,
            },
            saving_us=saving_us,
            step_us=s_us,
            saving_basis="median over steps of the largest per-step wait of one member (upper bound: waits hidden "
                         "under other work cost less)",
            ranks=ranks,
            steps=sorted(int(s) for s in g["step"].unique()),
            ops=list(dict.fromkeys(str(n) for n in per_inst["name"]))[:5],
            detail=("Only part of the world is in this profile; the R_wait is over the ranks present."
                    if partial else ""),
            top=top,
            replay=replay,
        )
    _check_counts(ctx)



def _idle_finding(ctx: RuleContext[Thresholds], grp: str, g: Any, inside: Any, world: dict[str, Any]) -> Finding | None:
    """A group whose collectives sit idle on every member at once: time inside them that is neither
    their transfer (the exported transit time) nor a wait for a late member (the exported wait time).

    Only where the source records both (Ascend communication analysis). Per member, idle = duration −
    transit − wait; the group fires when every member spends ``min_wait_ratio`` of its collective time
    idle, idle outweighs the late-arrival wait on every member (else the wait is a straggler's, judged
    above), and the time idle on every member together (per step, the least member's idle, capped at its
    time inside the collectives) reaches ``min_wait_share`` of the step. No member arriving late, the
    wait is inside the collective on all of them at once: the saving is that shared idle time."""
    if g["transit_ns"].isna().any() or g["rank"].nunique() < 2:
        return None
    g = g.assign(idle=(g["dur_ns"] - g["transit_ns"] - g["w"]).clip(lower=0))
    by_rank = g.groupby("rank").agg(idle=("idle", "sum"), d=("dur_ns", "sum"), w=("w", "sum"),
                                    t=("transit_ns", "sum"))
    if (by_rank["d"] <= 0).any():
        return None
    ratio = by_rank["idle"] / by_rank["d"]
    if float(ratio.min()) < ctx.t.min_wait_ratio or bool((by_rank["idle"] <= by_rank["w"]).any()):
        return None
    per_rs = g.groupby(["rank", "step"])["idle"].sum()
    cap = inside.loc[grp].reindex(per_rs.index) if grp in inside.index.get_level_values(0) else None
    if cap is not None:
        per_rs = per_rs.clip(upper=cap.fillna(per_rs))
    together = per_rs.groupby("step").min()  # idle on every member: the least member's
    saving_us = float(together.median()) / 1000.0
    ranks = sorted(int(r) for r in g["rank"].unique())
    s_us = max(step_us(ctx, r) for r in ranks)
    if s_us <= 0 or saving_us < ctx.t.min_wait_share * s_us:
        return None
    keys = ["step", "key_name", "ord"]
    inst = g.groupby(keys, sort=False).agg(idle=("idle", "min"), d=("dur_ns", "max"), t=("transit_ns", "max"),
                                           w=("w", "max"), start=("start_ns", "median"), name=("name", "first"))
    inst["pos"] = inst.groupby(level="step")["start"].rank(method="first").astype(int)
    total_idle = float(inst["idle"].sum())
    first_share = float(inst.loc[inst["pos"] == 1, "idle"].sum()) / total_idle if total_idle > 0 else 0.0
    top = [
        {"step": int(k[0]), "collective": str(row["name"]), "order_in_step": int(row["pos"]),
         "idle_on_every_member_ms": ms(row["idle"]), "duration_ms": ms(row["d"]), "transit_ms": ms(row["t"]),
         "wait_for_late_member_ms": ms(row["w"])}
        for k, row in inst.sort_values("idle", ascending=False).head(ctx.t.top_n).iterrows()
    ]
    label = f"group {grp}" if grp else "the default group"
    steps = sorted(int(s) for s in g["step"].unique())
    where = (f"; {first_share:.0%} of it in the first collective of "
             f"{'each step' if len(steps) > 1 else 'the step'}" if first_share >= 0.5 and
             inst["pos"].max() > 1 else "")
    partial = world["w"] is not None and world["w"] > len(ranks)
    return ctx.finding(
        title=f"Collectives in {label} sit idle {float(ratio.min()):.0%} of their time on every member at once, "
              f"no member arriving late ({saving_us / 1000:.1f} ms per step{where})",
        cause=IDLE_CAUSE,
        evidence={
            "idle_ratio_min": round(float(ratio.min()), 4),
            "min_wait_ratio": ctx.t.min_wait_ratio,
            "idle_per_step_ms_median": round(saving_us / 1000.0, 3),
            "idle_ms_by_rank": {str(int(r)): ms(v) for r, v in by_rank["idle"].items()},
            "transit_ms_by_rank": {str(int(r)): ms(v) for r, v in by_rank["t"].items()},
            "wait_for_late_member_ms_by_rank": {str(int(r)): ms(v) for r, v in by_rank["w"].items()},
            "collective_ms_by_rank": {str(int(r)): ms(v) for r, v in by_rank["d"].items()},
            "first_in_step_idle_share": round(first_share, 4),
            "instances": len(inst),
            "members": len(ranks),
            "world_size": None if world["w"] is None else int(world["w"]),
            "min_wait_share": ctx.t.min_wait_share,
            "group": grp or None,
        },
        saving_us=saving_us,
        step_us=s_us,
        saving_basis="median over steps of the time the collectives sit idle on every member together (the least "
                     "member's idle: duration less transit less the wait for a late member)",
        ranks=ranks,
        steps=steps,
        ops=list(dict.fromkeys(str(n) for n in inst["name"]))[:5],
        detail=("Every member is inside the collective and none is moving data or waiting for a late peer: the time "
                "is spent in the collective library itself (link or notify setup, a first-call cost, a device "
                "queue it waits on), which the profile does not show. Compare the first collective of a step with "
                "the others, and a profile with more steps or task-level (HCCL level 2) detail."
                + (" Only part of the world is in this profile." if partial else "")),
        top=top,
        replay=_replay_of(ctx, ranks, steps, IDLE_ASSUMPTION),
    )


def _lead_per_step(per_rank_step: Any, slowest: int) -> Any:
    """Per step (ns): the other members' median wait minus the slowest member's own wait."""
    w = per_rank_step.unstack("rank")
    if slowest not in w.columns or w.shape[1] < 2:
        return w.iloc[:0, 0] if w.shape[1] else w
    others = w.drop(columns=[slowest]).median(axis=1, skipna=True)
    return (others - w[slowest]).dropna()


def _check_counts(ctx: RuleContext[Thresholds]) -> None:
    """Warn when ranks disagree on how many instances of a collective a step has (order matching is then unsure)."""
    rows = ctx.query(
        f"SELECT step, grp, key_name, min(n) AS lo, max(n) AS hi FROM ({COUNTS}) GROUP BY ALL HAVING min(n) <> max(n) "
        "ORDER BY step LIMIT 3"
    )
    for r in rows:
        ctx.warn(f"step {r['step']}: ranks record {r['lo']}–{r['hi']} instances of {r['key_name']} "
                 f"in group {r['grp'] or '(default)'}; instances were matched by order")
