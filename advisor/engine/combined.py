""""Fix these three": the top root findings' changes replayed together, never their savings summed.

Each rank rule states its counterfactual as data (:class:`advisor.stages.replay.Change`) when it calls
:meth:`advisor.engine.rule.RuleContext.what_if`; :func:`record` keeps those changes per (rule, rank)
with the steps they apply to. Where the events are (the per-rank map, or a context holding every rank),
:func:`replay_combinations` replays, on each rank, the changes of its :data:`TOP` rules with the largest
savings there alone and in every combination of two and three, step by step (a rule's changes apply to
the steps it replayed its own change on): the mean replayed saving per step of each combination over the
steps that reproduce. In the report, :func:`headline` takes the three root findings with the largest
saving (:func:`advisor.engine.chain.summary`'s roots) and reads, on each rank, the combination of those
that have a change there: the saving of fixing them together is the largest rank's.

A rule's changes are keyed by the rule: two findings of one rule on one rank are one fix.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from advisor.model import Finding

#: ``AnalysisContext.extras`` key of the recorded changes: (rule, rank) -> [(steps or None, changes)]
CHANGES_KEY = "what_if_changes"
#: ``AnalysisContext.extras`` key of the combinations' replays: rank -> :func:`replay_combinations` row
TABLE_KEY = "combined_replay"
#: the rules with the largest savings on a rank whose changes are replayed in combination there: one
#: more than the headline's three, so that a top finding that turns out explained in the report is replaced
TOP = 4
#: the most findings replayed together
MOST = 3

_LOCK = threading.Lock()


def key(rules: Iterable[str]) -> str:
    """A combination's key: its rules sorted, joined with ``+``."""
    return "+".join(sorted(set(rules)))


def record(extras: dict[str, Any], rule: str, rank: int, steps: Iterable[int] | None, changes: Sequence[Any]) -> None:
    """Keep rule ``rule``'s ``changes`` on rank ``rank`` (for ``steps``; None: every step; none: nothing kept)."""
    kept = None if steps is None else tuple(sorted({int(s) for s in steps}))
    if not changes or kept == ():
        return
    with _LOCK:
        extras.setdefault(CHANGES_KEY, {}).setdefault((rule, int(rank)), []).append((kept, tuple(changes)))


def _savings_on(findings: Iterable[Finding]) -> dict[tuple[str, int], float]:
    """(rule, rank) -> the largest saving of the rule's findings naming the rank."""
    out: dict[tuple[str, int], float] = {}
    for f in findings:
        if f.estimated_saving_us is None:
            continue
        for r in f.ranks:
            k = (f.rule, int(r))
            out[k] = max(out.get(k, 0.0), float(f.estimated_saving_us))
    return out


def replay_combinations(ctx: Any, findings: Iterable[Finding]) -> dict[int, dict[str, Any]]:
    """Per rank with changes of two rules or more that have a finding there (``findings``, the rank rules'):
    the :data:`TOP` of them by saving, replayed alone and in every combination of up to :data:`MOST`
    (:func:`combine_on`). Needs the rank's events (``ctx`` an analysis context of the map)."""
    from advisor.stages import replay as replay_stage

    recorded: dict[tuple[str, int], list[tuple[tuple[int, ...] | None, tuple[Any, ...]]]] = dict(
        ctx.extras.get(CHANGES_KEY) or {})
    saving = _savings_on(findings)
    by_rank: dict[int, list[tuple[float, str]]] = {}
    for (rule, rank) in recorded:
        if (rule, rank) in saving and saving[(rule, rank)] > 0:
            by_rank.setdefault(rank, []).append((saving[(rule, rank)], rule))
    out: dict[int, dict[str, Any]] = {}
    cur = ctx.con.cursor()
    try:
        for rank in sorted(by_rank):
            top = [rule for _, rule in sorted(by_rank[rank], key=lambda x: (-x[0], x[1]))[:TOP]]
            if len(top) < 2:
                continue
            parts: dict[str, list[tuple[tuple[int, ...] | None, tuple[Any, ...]]]] = {r: recorded[(r, rank)] for r in top}
            windows = [(int(r["step"]), int(r["start_ns"]), int(r["end_ns"])) for r in ctx.query(
                "SELECT step, start_ns, end_ns FROM steps WHERE rank = $rank AND end_ns > start_ns ORDER BY step",
                {"rank": rank})]
            wanted = _steps_of(parts, {w[0] for w in windows}, ctx, rank)
            windows = [w for w in windows if w[0] in wanted]
            gs = replay_stage.graphs(cur, ctx.extras, rank, windows)
            out[rank] = combine_on(gs, parts)
    finally:
        cur.close()
    return out


def of_done(ctx: Any, done: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """:func:`replay_combinations` of the findings of the rules that ran (``done``: rule id ->
    :data:`advisor.engine.runner.Done`), kept in ``ctx.extras`` for the report."""
    findings = [f for status, got in done.values() if status == "ran" for f in got[1]]
    table = replay_combinations(ctx, findings)
    ctx.extras[TABLE_KEY] = table
    return table


def _steps_of(parts: Mapping[str, Sequence[tuple[tuple[int, ...] | None, Any]]], have: set[int], ctx: Any,
              rank: int) -> set[int]:
    """The steps any part's changes apply to (a part recorded without steps: the rank's breakdown steps)."""
    out: set[int] = set()
    for recs in parts.values():
        for steps, _ in recs:
            if steps is None:
                bd = ctx.breakdown
                if bd is not None and not bd.empty:
                    out |= {int(s) for s in bd[bd["rank"] == rank]["step"]}
                else:
                    out |= have
            else:
                out |= set(steps)
    return out & have


def _changes_at(recs: Sequence[tuple[tuple[int, ...] | None, Sequence[Any]]], step: int | None) -> list[Any]:
    return [c for steps, chs in recs if steps is None or (step is not None and step in steps) for c in chs]


def combine_on(gs: Sequence[Any], parts: Mapping[str, Sequence[tuple[tuple[int, ...] | None, Sequence[Any]]]]
               ) -> dict[str, Any]:
    """Each graph (one step of one rank) replayed with the changes of each part alone and of every combination
    of two to :data:`MOST` parts (``parts``: rule -> [(its steps or None, its changes)]; a part's changes
    apply on its steps only). A step counts where its no-change replay reproduces the measured step and
    every combination's saving is estimated there. Returns ``steps``, ``steps_replayed``, ``step_us`` (the
    mean measured step over those), ``reproduction_error`` (the worst), ``rules`` (the parts) and
    ``savings_us``: combination key (:func:`key`) -> mean replayed saving per step (µs) over those steps;
    ``reason`` where no step counts."""
    from advisor.stages import replay as replay_stage

    rules = sorted(parts)
    combos = [c for n in range(1, min(MOST, len(rules)) + 1) for c in itertools.combinations(rules, n)]
    sums = {key(c): 0 for c in combos}
    measured = 0
    good = 0
    worst = 0.0
    reasons: set[str] = set()
    for g in gs:
        per_step: dict[str, int] = {}
        err = 0.0
        ok = True
        for c in combos:
            changes = [ch for r in c for ch in _changes_at(parts[r], g.step)]
            res = replay_stage.what_if([g], changes)[0]
            err = res.error
            if not res.reproduced:
                ok = False
                reasons.add(f"no step's replay reproduces the measured step within {replay_stage.REPRODUCE_WITHIN:.0%}")
                break
            if res.saving_ns is None:
                ok = False
                reasons.add(str(res.reason))
                break
            per_step[key(c)] = int(res.saving_ns)
        worst = max(worst, err)
        if not ok:
            continue
        good += 1
        measured += g.length
        for k, v in per_step.items():
            sums[k] += v
    out: dict[str, Any] = {"rules": rules, "steps": len(gs), "steps_replayed": good,
                           "reproduction_error": round(worst, 4)}
    if not good:
        out["reason"] = "; ".join(sorted(reasons)) or "no step window with events to replay"
        return out
    out["step_us"] = round(measured / good / 1000.0, 3)
    out["savings_us"] = {k: round(max(v / good / 1000.0, 0.0), 3) for k, v in sums.items()}
    return out


#: the assumption of the headline, in words
ASSUMPTION = "if the changes of these findings were made together (replayed at once on each rank, not summed)"


def headline(findings: Sequence[Finding], roots: Sequence[str], table: Mapping[int, Mapping[str, Any]] | None,
             today: float | None) -> dict[str, Any]:
    """``savings.combined``: the three root findings (``roots``, ids) with the largest saving, and the
    saving of fixing them together: on each rank, the replayed combination of those whose rule has a
    change replayed there (``table``: :func:`replay_combinations`), the largest rank's figure. Where fewer
    than two of them have a change replayed on one rank, ``estimated: false`` with the reason, and
    ``saving_us`` is today's summed total (``today``), said to be summed."""
    by_id = {f.id: f for f in findings}
    top = sorted((by_id[i] for i in roots if i in by_id and (by_id[i].estimated_saving_us or 0.0) > 0),
                 key=lambda f: (-(f.estimated_saving_us or 0.0), f.rule, f.id))[:MOST]
    out: dict[str, Any] = {"findings": [f.id for f in top], "rules": [f.rule for f in top]}
    per_rank: list[dict[str, Any]] = []
    for rank in sorted(table or {}):
        row = (table or {})[rank]
        have = set(row.get("rules") or ())
        # the top findings on this rank whose rule's change was replayed here
        mine = [f for f in top if f.rule in have and (not f.ranks or rank in f.ranks)]
        if len(mine) < 2 or "savings_us" not in row:
            continue
        k = key(f.rule for f in mine)
        if k not in row["savings_us"]:
            continue
        parts = {f.rule: row["savings_us"].get(f.rule) for f in mine}
        per_rank.append({"rank": rank, "findings": [f.id for f in mine], "saving_us": row["savings_us"][k],
                         "parts_us": parts, "step_us": row.get("step_us"), "steps": row.get("steps"),
                         "steps_replayed": row.get("steps_replayed"),
                         "reproduction_error": row.get("reproduction_error")})
    if len(top) < 2:
        return {**out, "estimated": False, "saving_us": today, "basis": "summed",
                "reason": f"{len(top)} root finding{'' if len(top) == 1 else 's'} with a saving: nothing to replay together"}
    if not per_rank:
        return {**out, "estimated": False, "saving_us": today, "basis": "summed",
                "reason": "fewer than two of the top root findings have a change replayed on one rank (a rule that "
                          "states no counterfactual, a cluster finding, or steps that do not reproduce): the figure "
                          "is today's sum of the root findings' savings, not a replay"}
    best = max(per_rank, key=lambda x: (float(x["saving_us"]), -int(x["rank"])))
    replayed = set(best["findings"])
    out.update({"estimated": True, "saving_us": best["saving_us"], "rank": best["rank"], "basis": "replayed",
                "replayed": best["findings"], "parts_us": best["parts_us"],
                "saving_fraction": round(float(best["saving_us"]) / float(best["step_us"]), 4) if best.get("step_us") else None,
                "assumption": ASSUMPTION, "per_rank": per_rank})
    left = [f.id for f in top if f.id not in replayed]
    if left:
        out["not_replayed"] = left
        out["not_replayed_reason"] = ("no change of theirs was replayed on that rank (a rule that states no "
                                      "counterfactual, or a cluster finding): not in the figure, never added to it")
    return out


#: a finding is explained by another when, after the other's change, less than this share of its own replayed
#: saving is left
LEFT_SHARE = 0.5


def measured_link(a: Finding, b: Finding, table: Mapping[int, Mapping[str, Any]] | None) -> dict[str, Any] | None:
    """Whether ``a`` explains ``b``, measured by replay: on the ranks both name where both rules' changes were
    replayed (``table``: :func:`replay_combinations`), ``b``'s saving left once ``a``'s change is made
    (their changes together less ``a``'s alone) against ``b``'s alone, summed over those ranks: the link
    holds when less than :data:`LEFT_SHARE` of it is left. None where no rank has both replayed (the
    link is then decided as before, :func:`advisor.engine.chain.link`)."""
    if not table or a.rule == b.rule:
        return None
    both = key((a.rule, b.rule))
    own = left = 0.0
    ranks: list[int] = []
    for rank in sorted(table):
        if (a.ranks and rank not in a.ranks) or (b.ranks and rank not in b.ranks):
            continue
        sv = table[rank].get("savings_us") or {}
        if both not in sv or a.rule not in sv or b.rule not in sv:
            continue
        ranks.append(int(rank))
        own += float(sv[b.rule])
        left += max(float(sv[both]) - float(sv[a.rule]), 0.0)
    if not ranks:
        return None
    holds = own > 0 and left < LEFT_SHARE * own
    return {"by": a.id, "ranks": ranks, "own_saving_us": round(own / len(ranks), 3),
            "left_saving_us": round(left / len(ranks), 3), "holds": holds}


def link_text(m: Mapping[str, Any], rule: str) -> str:
    """One evidence line of a measured link (:func:`measured_link`)."""
    where = ", ".join(str(r) for r in m["ranks"])
    return (f"{rule}'s change made, {m['left_saving_us']:.3f} µs of this finding's {m['own_saving_us']:.3f} µs per step "
            f"is left (replayed on rank{'s' if len(m['ranks']) > 1 else ''} {where}): "
            + ("explained" if m["holds"] else f"not explained (at least {LEFT_SHARE:.0%} is left)"))
