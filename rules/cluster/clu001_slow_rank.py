"""One rank does more of its own work per step than the rest of its communication group, and the others wait for it.

## Why it matters
Ranks in one communication group (data-, tensor- or pipeline-parallel) meet at every collective,
so the group runs at the pace of its slowest member: every other rank idles inside the
collective until the straggler arrives (Hermes §4.1.1: "devices within the same communication
domain theoretically have the same execution time", so the slowest one is the problem device).
Step times cannot show it — the collective lines the ranks up and every rank reports the same
step time — but the split of the step does: the slow rank is busy, the others wait.

## How it is detected
For every (rank, step) of the breakdown the rank's **own time** is the step minus its
not-overlapped communication (``step_us − comm_only_us`` = compute, host-only and free time;
on CPU-only traces compute is host operators and communication is the gloo/c10d collectives),
and its **wait** is ``comm_only_us``. Groups come from ``comm_ops.group_name`` (the ranks seen
in each group); when no group is named, all ranks form one group. For each group and step:

* groups of ``min_ranks_ksigma`` ranks or more: LLMPrism's k-sigma rule (own time above mean +
  k·σ, k = 3) with the mean and σ of a clean baseline grown from the faster half of the group
  (forward search), so one or two stragglers cannot inflate the σ they are compared with;
* smaller groups (two or three ranks, where σ over the peers is undefined or meaningless): a
  robust rule that uses the *temporal* spread instead of the spatial one — own time above the
  median of the other ranks by more than ``min_excess_ratio`` **and** by more than k × the
  peers' own σ across steps (how much a healthy rank's own time moves from step to step;
  needs three or more steps, else only the ratio applies);
* in both cases the group must show the waiting the straggler causes: the other ranks' median
  wait is at least ``min_wait_share`` of the step and larger than the straggler's own wait.

A rank flagged in some steps is a straggler only when its excess is significant across steps: over
every step its group has in common, its own time minus the median of the others' must have a mean
above k standard errors (with fewer than three steps: flagged in every one), and the others' wait
it causes, amortised over those steps, must reach ``min_wait_share`` of the step. A rank slow in
one step of many is not a straggler: it is a rank slow in that step (CLU005,
cluster.slow_rank_step), and the step a slow step of the job (CLU003, cluster.step_fluctuation). The peers a finding
names are the ranks that waited, never another rank flagged in the same step.

Both bounds also require the excess to exceed ``min_excess_ratio`` of the peers' median own time
(above PRISM's up-to-14 % spatial GEMM variation between healthy GPUs). The component (compute,
host, free) with the largest excess over the peers is named. The saving per flagged step is the
excess own time, capped by the peers' median wait (the time they would get back), amortised
over the steps the group has in common; where the ranks' collectives can be joined in every one of
those steps, the cluster's step replayed with the straggler at its peers' median own speed instead.

## What to do
Read the slow rank's own findings (listed as explaining this one): data loading, host syncs,
GC, dynamic shapes or extra work that only that rank does. If none explains it, suspect the
node (frequency drop, thermal throttling, a noisy neighbour) and isolate or repair it; also
check load balance (uneven pipeline stages, uneven expert routing, uneven sequence lengths).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from advisor.engine.rule import RankPart, RuleContext, knob, rule, straggler_summary
from advisor.model import Finding
from rules.cluster._stats import forward_search, mean, median, stdev


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for CLU001."""

    k: float = knob(3.0, "a rank is an outlier when its own time is above baseline mean + k·σ of its group",
                    "LLMPrism §IV-D k-sigma rule, k = 3")
    min_excess_ratio: float = knob(
        0.20,
        "own time must exceed the peers' median own time by this fraction",
        "PRISM Fig. 3a: identical GEMMs vary up to 14 % across healthy GPUs; 20 % is beyond that",
    )
    min_wait_share: float = knob(
        0.05, "the other ranks' median not-overlapped communication (their wait) as a share of the step",
        "first principles: a straggler must make its peers wait; 5 % is above the CAUSES.md medium cutoff (3 %)",
    )
    min_ranks_ksigma: int = knob(4, "group size from which k-sigma is used (smaller groups use the ratio rule)",
                                 "first principles: σ needs at least three peer values")


SQL = """
SELECT rank, step, step_us, step_us - comm_only_us AS own_us, comm_only_us AS wait_us,
       compute_only_us + overlapped_us AS compute_us, host_only_us, free_us
FROM breakdown ORDER BY rank, step
"""

GROUPS_SQL = """
SELECT group_name, list(DISTINCT rank ORDER BY rank) AS ranks
FROM comm_ops WHERE group_name IS NOT NULL AND group_name <> ''
GROUP BY group_name HAVING count(DISTINCT rank) >= 2
"""

COMPONENTS = (("compute_us", "compute"), ("host_only_us", "host"), ("free_us", "free (idle)"))


def groups_of(ctx: RuleContext[Any], all_ranks: list[int]) -> list[tuple[str, list[int]]]:
    """Communication groups (name, ranks) from comm_ops, or all ranks as one group."""
    found: dict[tuple[int, ...], list[str]] = {}
    if ctx.rows("comm_ops"):
        for g in ctx.query(GROUPS_SQL):
            members = tuple(int(r) for r in g["ranks"] if int(r) in all_ranks)
            if len(members) >= 2:
                found.setdefault(members, []).append(str(g["group_name"]))
    if not found:
        return [("all ranks", sorted(all_ranks))]
    # in member order, whatever order the query gave: a step's best hit keeps the first group on ties
    return [(", ".join(sorted(names)[:3]) + (" …" if len(names) > 3 else ""), list(m))
            for m, names in sorted(found.items(), key=lambda kv: (len(kv[0]), kv[0]))]


RANK_TABLES = {
    "clu001_straggler": "step INTEGER, rank INTEGER, ranks VARCHAR, measured_ns BIGINT, saving_ns BIGINT, error DOUBLE, "
                        "factor DOUBLE, reason VARCHAR",
}


def rank_part(ctx: RuleContext[Thresholds]) -> dict[str, list[tuple[Any, ...]]]:
    """The straggler's what-if where the ranks' events are (:meth:`RuleContext.straggler_replay`): per step
    in which one rank's own time leads the others' by ``min_wait_share`` of the step, the ranks joined by
    their collectives and that rank run at its peers' median own speed."""
    bd = ctx.breakdown()
    steps = sorted({int(s) for s in bd["step"]}) if len(bd) else []
    return {"clu001_straggler": [(r["step"], r["rank"], r["ranks"], r["measured_ns"], r["saving_ns"], r["error"],
                                  r["factor"], r["reason"]) for r in ctx.straggler_replay(steps, ctx.t.min_wait_share)]}


@rule("CLU001", "cluster.slow-rank", cause="cluster.slow_rank",
      requires=("breakdown", "multi_rank"), thresholds=Thresholds, scope="cluster",
      rank_part=RankPart(RANK_TABLES, rank_part))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Flag ranks whose own time per step is an outlier in their group while the others wait."""
    rows = ctx.query(SQL)
    by_rs = {(int(r["rank"]), int(r["step"])): r for r in rows}
    all_ranks = sorted({k[0] for k in by_rs})
    own_of: dict[int, list[float]] = {}  # one pass (a scan of every row per rank was quadratic in ranks)
    for (r, _s), v in by_rs.items():
        own_of.setdefault(r, []).append(float(v["own_us"]))
    temporal_sd = {r: stdev(own_of[r]) if len(own_of[r]) >= 3 else 0.0 for r in all_ranks}
    hits: dict[int, dict[int, dict[str, Any]]] = {}  # rank -> step -> best hit
    common_steps: dict[int, set[int]] = {}
    group_names: dict[int, set[str]] = {}
    peers_of: dict[int, set[int]] = {}
    lead_of: dict[int, list[float]] = {}  # rank -> per common step: own time minus the others' median
    for gname, members in groups_of(ctx, all_ranks):
        steps = sorted({s for (r, s) in by_rs if r in members})
        for step in steps:
            present = [r for r in members if (r, step) in by_rs]
            if len(present) < 2:
                continue
            for r in present:
                common_steps.setdefault(r, set()).add(step)
            for hit in _test_step(ctx, present, step, by_rs, temporal_sd):
                r = hit["rank"]
                best = hits.setdefault(r, {})
                if step not in best or hit["saving_us"] > best[step]["saving_us"]:
                    best[step] = hit
                group_names.setdefault(r, set()).add(gname)
                peers_of.setdefault(r, set()).update(hit["peers"])
            for r in present:
                others = [float(by_rs[(p, step)]["own_us"]) for p in present if p != r]
                lead_of.setdefault(r, []).append(float(by_rs[(r, step)]["own_us"]) - median(others))
    for rank, per_step in sorted(hits.items()):
        if not _significant(ctx, per_step, lead_of.get(rank, []), len(common_steps[rank])):
            continue
        yield _finding(ctx, rank, per_step, sorted(common_steps[rank]), sorted(group_names[rank]),
                       sorted(peers_of[rank]), by_rs)


def _test_step(ctx: RuleContext[Thresholds], present: list[int], step: int,
               by_rs: dict[tuple[int, int], dict[str, Any]], temporal_sd: dict[int, float]) -> Iterator[dict[str, Any]]:
    own = [float(by_rs[(r, step)]["own_us"]) for r in present]
    flagged: list[int] = []
    method = "ratio to peer median"
    if len(present) >= ctx.t.min_ranks_ksigma:
        fs = forward_search(own, ctx.t.k, ctx.t.min_excess_ratio)
        flagged = list(fs.outliers)
        method = "k-sigma (forward-search baseline)"
    else:
        for i in range(len(present)):
            peer_vals = [own[j] for j in range(len(present)) if j != i]
            noise = ctx.t.k * median([temporal_sd.get(present[j], 0.0) for j in range(len(present)) if j != i])
            if own[i] - median(peer_vals) > max(ctx.t.min_excess_ratio * median(peer_vals), noise):
                flagged.append(i)
        method = "ratio to peer median and k × peers' step-to-step σ"
    for i in flagged:
        r = present[i]
        peers = [p for j, p in enumerate(present) if j != i and j not in flagged] or [p for p in present if p != r]
        peer_own = median([float(by_rs[(p, step)]["own_us"]) for p in peers])
        peer_wait = median([float(by_rs[(p, step)]["wait_us"]) for p in peers])
        row = by_rs[(r, step)]
        step_us = float(row["step_us"])
        excess = own[i] - peer_own
        if excess <= ctx.t.min_excess_ratio * peer_own:
            continue
        if step_us <= 0 or peer_wait < ctx.t.min_wait_share * step_us or peer_wait <= float(row["wait_us"]):
            continue
        yield {
            "rank": r, "step": step, "own_us": own[i], "peer_own_us": peer_own, "peer_wait_us": peer_wait,
            "wait_us": float(row["wait_us"]), "step_us": step_us, "excess_us": excess,
            "saving_us": min(excess, peer_wait), "method": method, "group_size": len(present), "peers": peers,
            "components": {c: float(row[c]) - median([float(by_rs[(p, step)][c]) for p in peers]) for c, _ in COMPONENTS},
        }


def _significant(ctx: RuleContext[Thresholds], per_step: dict[int, dict[str, Any]], lead: list[float],
                 n_common: int) -> bool:
    """Whether a rank's excess holds across steps (k standard errors of its mean lead over the others'
    median own time) and the wait it causes, amortised over the common steps, is large enough."""
    if len(lead) >= 3:
        if mean(lead) <= ctx.t.k * stdev(lead) / math.sqrt(len(lead)):
            return False
    elif len(per_step) < n_common:
        return False
    hs = list(per_step.values())
    amortised = sum(h["saving_us"] for h in hs) / max(n_common, 1)
    return bool(amortised >= ctx.t.min_wait_share * median([float(h["step_us"]) for h in hs]))


def _finding(ctx: RuleContext[Thresholds], rank: int, per_step: dict[int, dict[str, Any]], common: list[int],
             groups: list[str], peers: list[int], by_rs: dict[tuple[int, int], dict[str, Any]]) -> Finding:
    n_common = len(common)
    hs = [per_step[s] for s in sorted(per_step)]
    own = median([h["own_us"] for h in hs])
    peer_own = median([h["peer_own_us"] for h in hs])
    peer_wait = median([h["peer_wait_us"] for h in hs])
    excess = median([h["excess_us"] for h in hs])
    comp_excess = {name: median([h["components"][c] for h in hs]) for c, name in COMPONENTS}
    main = max(comp_excess, key=lambda k: comp_excess[k])
    saving = sum(h["saving_us"] for h in hs) / max(n_common, 1)
    step_us = median([float(v["step_us"]) for (r, _), v in by_rs.items() if r == rank])
    peers_txt = _short(peers)
    persistent = len(hs) * 2 >= n_common
    when = (f"in {len(hs)} of {n_common} steps" if persistent
            else f"in {len(hs)} of {n_common} steps (" + ", ".join(f"#{h['step']}" for h in hs[:5]) + ")")
    title = (f"Rank {rank} is the straggler of its group {when}: {own / 1000:.1f} ms of its own work per step vs "
             f"{peer_own / 1000:.1f} ms on ranks {peers_txt} ({own / max(peer_own, 1e-9):.1f}×, mostly {main}); "
             f"they wait {peer_wait / 1000:.1f} ms per step in communication")
    evidence: dict[str, Any] = {
        "own_us_median": round(own, 1),
        "peer_own_us_median": round(peer_own, 1),
        "excess_us_median": round(excess, 1),
        "excess_ratio": round(excess / peer_own, 4) if peer_own > 0 else None,
        "peer_wait_us_median": round(peer_wait, 1),
        "own_wait_us_median": round(median([h["wait_us"] for h in hs]), 1),
        "peer_wait_share": round(peer_wait / step_us, 4) if step_us > 0 else None,
        "main_component": main,
        **{f"excess_{name.split()[0]}_us": round(v, 1) for name, v in comp_excess.items()},
        "flagged_steps": len(hs),
        "pattern": "persistent" if persistent else "occasional",
        "common_steps": n_common,
        "group_size": hs[0]["group_size"],
        "groups": "; ".join(groups)[:120],
        "peer_ranks": peers_txt,
        "method": hs[0]["method"],
        "k": ctx.t.k,
        "min_excess_ratio": ctx.t.min_excess_ratio,
        "min_wait_share": ctx.t.min_wait_share,
    }
    top = [{"step": h["step"], "own_us": round(h["own_us"], 1), "peer_own_us": round(h["peer_own_us"], 1),
            "peer_wait_us": round(h["peer_wait_us"], 1), "saving_us": round(h["saving_us"], 1)} for h in hs]
    return ctx.finding(
        title=title,
        evidence=evidence,
        saving_us=saving,
        step_us=step_us,
        saving_basis="per flagged step, the rank's own-time excess over its peers' median, capped by the peers' "
        "median wait in not-overlapped communication; summed and amortised over the steps the group has in common",
        ranks=[rank],
        steps=sorted(per_step),
        top=top[:20],
        replay=straggler_summary(ctx.query(
            "SELECT * FROM clu001_straggler WHERE step IN (SELECT unnest($steps)) ORDER BY step", {"steps": common}),
            [rank, *peers], common, rank),
    )


def _short(items: list[int]) -> str:
    return ", ".join(map(str, items[:8])) + (" …" if len(items) > 8 else "")
