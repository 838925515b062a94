""""Fix these three": the top fixes' changes replayed together, never their savings summed.

Each rank rule states its counterfactual as data (:class:`advisor.stages.replay.Change`) when it calls
:meth:`advisor.engine.rule.RuleContext.what_if`; :func:`record` keeps those changes per (rule, rank)
with the steps they apply to. Where the events are (the per-rank map, or a context holding every rank),
:func:`replay_combinations` replays, on each rank, the changes of its :data:`TOP` rules with the largest
savings there alone and in every combination of two and three, step by step (a rule's changes apply to
the steps it replayed its own change on), keeping each step's figures; where the context holds every
rank of the world, :func:`replay_joined` replays the same on every rank at once, the ranks joined by
their collectives. In the report, :func:`headline` groups the root findings into fixes (one rule's
findings, on every rank it fires on, are one change), takes the three with the largest saving and
replays them together (:func:`_job`); where it cannot, it gives the range that can be known, never a sum.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from advisor.model import Finding

#: ``AnalysisContext.extras`` key of the recorded changes: (rule, rank) -> [(steps or None, changes)]
CHANGES_KEY = "what_if_changes"
#: ``AnalysisContext.extras`` key of the combinations' replays: rank -> :func:`replay_combinations` row
TABLE_KEY = "combined_replay"
#: ``AnalysisContext.extras`` key of the changes replayed on every rank at once, joined: :func:`replay_joined`
JOINED_KEY = "combined_joined"
#: the part of :func:`replay_joined` that runs the rank with the longest own time at its peers' median speed
#: (:func:`advisor.stages.replay.straggler_changes`): a cluster finding whose ``replay`` has this ``change``
STRAGGLER = "straggler"
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
    """Per rank with changes of rules that have a finding there (``findings``, the rank rules'): the
    :data:`TOP` of them by saving, replayed alone and in every combination of up to :data:`MOST`
    (:func:`combine_on`; a rank with one such rule too: its per-step figures let the report replay one
    rule's change on every rank it fires on). Needs the rank's events (``ctx`` an analysis context of the map)."""
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


def replay_joined(ctx: Any, findings: Iterable[Finding]) -> dict[str, Any] | None:
    """The rank rules' changes replayed on every rank at once, the ranks joined by their collectives
    (:func:`advisor.stages.replay.cluster_replay`): a rule's change applies on each rank it recorded one
    for (one fix, every rank it fires on). The :data:`TOP` rules by their largest saving on any rank,
    alone and in every combination of up to :data:`MOST` (with :data:`STRAGGLER`, the straggler's counterfactual
    of COM001 / CLU001, as one more part); per step, the cluster's step (its slowest rank)
    replayed joined without the changes less with them; the mean over the steps whose joined no-change
    replay reproduces the measured cluster step. None where this context does not hold every rank of the
    world (a shard of a map/reduce run: the ranks were not read together) or holds one rank. Returns
    ``ranks``, ``rules``, ``steps``, ``steps_replayed``, ``step_us``, ``reproduction_error``, ``savings_us``
    (combination key -> µs per step) and ``reason`` where no step counts."""
    from advisor.stages import replay as replay_stage

    seen = ctx.query("SELECT count(DISTINCT rank) AS n, max(world_size) AS w FROM ranks")
    if not seen or int(seen[0]["n"] or 0) < 2:
        return None
    if seen[0]["w"] is not None and int(seen[0]["n"]) < int(seen[0]["w"]):
        return None
    recorded: dict[tuple[str, int], list[tuple[tuple[int, ...] | None, tuple[Any, ...]]]] = dict(
        ctx.extras.get(CHANGES_KEY) or {})
    saving = _savings_on(findings)
    best: dict[str, float] = {}
    for (rule, rank) in recorded:
        if saving.get((rule, rank), 0.0) > 0:
            best[rule] = max(best.get(rule, 0.0), saving[(rule, rank)])
    rules = sorted(sorted(best, key=lambda r: (-best[r], r))[:TOP])
    if not rules:
        return None
    rows = ctx.query("SELECT rank, step, start_ns, end_ns FROM steps WHERE end_ns > start_ns ORDER BY rank, step")
    wins: dict[int, dict[int, tuple[int, int, int]]] = {}
    for r in rows:
        wins.setdefault(int(r["rank"]), {})[int(r["step"])] = (int(r["step"]), int(r["start_ns"]), int(r["end_ns"]))
    ranks = sorted(wins)
    parts = {rule: {rank: recorded.get((rule, rank), []) for rank in ranks} for rule in rules}
    # the steps some rule's change applies to on some rank, held by every rank
    wanted: set[int] = set()
    for rule in rules:
        for rank in ranks:
            wanted |= _steps_of({rule: parts[rule][rank]}, set(wins[rank]), ctx, rank) if parts[rule][rank] else set()
    common = sorted(wanted.intersection(*(set(w) for w in wins.values())))
    top = [*rules, STRAGGLER]
    out: dict[str, Any] = {"ranks": ranks, "rules": top, "steps": len(common), "steps_replayed": 0,
                           "reproduction_error": 0.0}
    combos = [c for n in range(1, min(MOST, len(top)) + 1) for c in itertools.combinations(top, n)]
    sums = {key(c): 0 for c in combos}
    measured = good = 0
    worst = 0.0
    reasons: set[str] = set()
    cur = ctx.con.cursor()
    try:
        budget = replay_stage.budget_for(cur, ctx.extras)
        for step in common:
            need = sum(replay_stage.window_events(cur, ctx.extras, rank, [wins[rank][step]])[0] for rank in ranks)
            if not budget.take(need):
                reasons.add("the steps' events exceed the replay's budget")
                continue
            gs = {}
            for rank in ranks:
                got = replay_stage.graphs(cur, ctx.extras, rank, [wins[rank][step]])
                if got:
                    gs[rank] = got[0]
            if len(gs) < len(ranks):
                reasons.add("a rank's step has no events to replay")
                continue
            colls = replay_stage.collectives_of(gs)
            if not colls:
                reasons.add("no collective of the step joins the ranks (only device collectives recorded as one task "
                            "are joined)")
                continue
            length = max(g.length for g in gs.values())
            before = max(replay_stage.cluster_replay(gs, colls).values())
            err = abs(before - length) / length if length else 0.0
            worst = max(worst, err)
            if err > replay_stage.REPRODUCE_WITHIN:
                reasons.add(f"the ranks' joined replay does not reproduce the measured step within "
                            f"{replay_stage.REPRODUCE_WITHIN:.0%}")
                continue
            own = replay_stage.own_times(gs, colls)
            strag = replay_stage.straggler_changes(gs, colls, max(own, key=lambda r: (own[r], -r)))
            for c in combos:
                changes: dict[int, Sequence[Any]] = {
                    rank: [*(ch for rule in c if rule != STRAGGLER for ch in _changes_at(parts[rule][rank], step)),
                           *(strag.get(rank, ()) if STRAGGLER in c else ())] for rank in ranks}
                after = max(replay_stage.cluster_replay(gs, colls, changes).values())
                sums[key(c)] += before - after
            good += 1
            measured += length
    finally:
        cur.close()
    out["steps_replayed"] = good
    out["reproduction_error"] = round(worst, 4)
    if not good:
        out["reason"] = "; ".join(sorted(reasons)) or "no step held by every rank to replay"
        return out
    out["step_us"] = round(measured / good / 1000.0, 3)
    out["savings_us"] = {k: round(max(v / good / 1000.0, 0.0), 3) for k, v in sums.items()}
    return out


def of_done(ctx: Any, done: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """:func:`replay_combinations` of the findings of the rules that ran (``done``: rule id ->
    :data:`advisor.engine.runner.Done`), kept in ``ctx.extras`` for the report."""
    findings = [f for status, got in done.values() if status == "ran" for f in got[1]]
    table = replay_combinations(ctx, findings)
    ctx.extras[TABLE_KEY] = table
    ctx.extras[JOINED_KEY] = replay_joined(ctx, findings)
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
    mean measured step over those), ``reproduction_error`` (the worst), ``rules`` (the parts),
    ``savings_us``: combination key (:func:`key`) -> mean replayed saving per step (µs) over those steps,
    and per step of those: ``step_ns`` (step -> measured step) and ``step_savings_ns`` (combination key ->
    step -> replayed saving); ``reason`` where no step counts."""
    from advisor.stages import replay as replay_stage

    rules = sorted(parts)
    combos = [c for n in range(1, min(MOST, len(rules)) + 1) for c in itertools.combinations(rules, n)]
    sums = {key(c): 0 for c in combos}
    measured = 0
    good = 0
    worst = 0.0
    reasons: set[str] = set()
    step_ns: dict[int, int] = {}
    step_savings: dict[str, dict[int, int]] = {key(c): {} for c in combos}
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
        if g.step is not None:
            step_ns[int(g.step)] = int(g.length)
            for k, v in per_step.items():
                step_savings[k][int(g.step)] = v
    out: dict[str, Any] = {"rules": rules, "steps": len(gs), "steps_replayed": good,
                           "reproduction_error": round(worst, 4)}
    if not good:
        out["reason"] = "; ".join(sorted(reasons)) or "no step window with events to replay"
        return out
    out["step_us"] = round(measured / good / 1000.0, 3)
    out["savings_us"] = {k: round(max(v / good / 1000.0, 0.0), 3) for k, v in sums.items()}
    out["step_ns"] = step_ns
    out["step_savings_ns"] = step_savings
    return out


#: the assumption of the headline, in words
ASSUMPTION = "if the changes of these findings were made together (replayed at once on each rank, not summed)"

#: the step's classes (breakdown columns) a finding's class of cause could free: the first part of its cause
#: id. A class not listed (a cluster cause: a straggler's time lies anywhere) could free the whole step.
FREEABLE = {
    "cpu": ("host_only_us", "free_us"),
    "io": ("host_only_us", "free_us"),
    "compute": ("compute_only_us", "overlapped_us"),
    "memory": ("compute_only_us", "overlapped_us"),
    "comm": ("comm_only_us", "overlapped_us"),
    "parallel": ("comm_only_us", "overlapped_us"),
}
#: the host classes: on a rank without device work the host's time is the whole step
_HOST = frozenset({"cpu", "io"})


class _Fix:
    """One fix of the headline: the root findings of one rule (one code change, every rank it fires on)."""

    def __init__(self, rule: str, findings: list[Finding], figure: Mapping[str, float]) -> None:
        self.rule = rule
        self.findings = findings
        self.best = max(figure[f.id] for f in findings)
        self.ranks = sorted({int(r) for f in findings for r in f.ranks})
        # the most it could save unreplayed: on a rank, its findings there (other operators, other times) summed;
        # ranks in a step wait for the slowest, so the largest rank's
        self.most = max((sum(figure[f.id] for f in findings if not f.ranks or r in f.ranks) for r in self.ranks),
                        default=sum(figure[f.id] for f in findings))
        self.cause = findings[0].cause
        # the part of the joined replay that replays it: its rule, or the straggler's counterfactual
        straggler = all((f.replay or {}).get("estimated") and (f.replay or {}).get("change") == STRAGGLER
                        for f in findings)
        self.part = STRAGGLER if straggler else rule


def _counted(f: Finding, ids: set[str]) -> float:
    """A top finding's saving as counted in the headline: where another top finding explains a part of it
    (``explained_in_part_by``), only its saving beyond that part."""
    rest = f.evidence.get("unexplained_saving_us")
    by = {x.strip() for x in str(f.evidence.get("explained_in_part_by", "")).split(",") if x.strip()}
    if rest is not None and by & ids:
        return float(rest)
    return float(f.estimated_saving_us or 0.0)


def _steps_of_bd(bd: Any) -> dict[int, dict[int, float]]:
    """rank -> step -> measured step (µs) of the breakdown's real steps."""
    from advisor.schema import NO_STEP

    out: dict[int, dict[int, float]] = {}
    if bd is None or bd.empty:
        return out
    for r, s, v in zip(bd["rank"], bd["step"], bd["step_us"], strict=True):
        if int(s) != NO_STEP and not math.isnan(float(v)):
            out.setdefault(int(r), {})[int(s)] = float(v)
    return out


def coupled(bd: Any) -> bool | None:
    """Whether the profile's ranks wait for each other every step: two ranks or more, each step held by
    every rank, and every rank's every step holds communication (a collective, which every member of its
    group ends together). None with one rank."""
    from advisor.schema import NO_STEP

    if bd is None or bd.empty:
        return None
    sel = bd[bd["step"] != NO_STEP]
    ranks = {int(r) for r in sel["rank"]}
    if len(ranks) < 2:
        return None
    by_step: dict[int, set[int]] = {}
    for r, s, c in zip(sel["rank"], sel["step"], sel["comm_us"], strict=True):
        if math.isnan(float(c)) or float(c) <= 0:
            return False
        by_step.setdefault(int(s), set()).add(int(r))
    return bool(by_step) and all(v == ranks for v in by_step.values())


def _freeable(bd: Any, fixes: Sequence[_Fix]) -> float | None:
    """The most of the step the fixes' classes of cause could free (:data:`FREEABLE`): per rank they name
    (every rank for a fix naming none), the mean over its steps of those classes' time (the whole step for
    a class not listed, or a host class on a rank without device work); the largest rank's. None without
    a breakdown."""
    from advisor.schema import NO_STEP

    if bd is None or bd.empty:
        return None
    sel = bd[bd["step"] != NO_STEP]
    if sel.empty:
        return None
    classes = {fx.cause.split(".", 1)[0] for fx in fixes}
    named = {r for fx in fixes for r in fx.ranks}
    whole_for_all = any(c not in FREEABLE for c in classes) or any(not fx.ranks for fx in fixes)
    cols = sorted({col for c in classes for col in FREEABLE.get(c, ())})
    best: float | None = None
    for r, g in sel.groupby("rank"):
        if not whole_for_all and int(r) not in named:
            continue
        no_device = float(g["kernel_us"].fillna(0).sum()) + float(g["memory_us"].fillna(0).sum()) == 0
        if whole_for_all or (no_device and classes & _HOST):
            v = float(g["step_us"].mean())
        else:
            v = float(g[cols].fillna(0).sum(axis=1).mean())
        best = v if best is None else max(best, v)
    return None if best is None else round(best, 3)


def _job(fixes: Sequence[_Fix], table: Mapping[int, Mapping[str, Any]], joined: Mapping[str, Any] | None,
         steps_of: Mapping[int, Mapping[int, float]], tied: bool | None) -> dict[str, Any] | None:
    """The replayed saving per step of making the ``fixes`` together, each on every rank it fires on;
    None where it cannot be replayed. ``method``: ``joined`` (the ranks replayed at once, joined by their
    collectives: :func:`replay_joined`), ``slowest_rank`` (ranks that wait for each other every step: per
    step the cluster's step less the largest rank's replayed step, each rank replayed with the fixes it has,
    the others keeping their measured step), ``rank`` (one rank) or ``largest_rank`` (ranks that do not
    wait for each other: each its own step, the largest rank's saving)."""
    k = key(fx.part for fx in fixes)
    if joined and k in (joined.get("savings_us") or {}) and all(fx.ranks for fx in fixes) \
            and {r for fx in fixes for r in fx.ranks} <= set(joined.get("ranks") or ()):
        return {"saving_us": float(joined["savings_us"][k]), "method": "joined", "ranks": list(joined["ranks"]),
                "step_us": joined.get("step_us"), "steps": joined.get("steps"),
                "steps_replayed": joined.get("steps_replayed"), "reproduction_error": joined.get("reproduction_error")}
    if any(not fx.ranks for fx in fixes):
        return None
    involved = sorted({r for fx in fixes for r in fx.ranks})
    per_rank: list[dict[str, Any]] = []
    for r in involved:
        mine = [fx for fx in fixes if r in fx.ranks]
        kr = key(fx.rule for fx in mine)
        row = table.get(r) or {}
        if kr not in (row.get("step_savings_ns") or {}):
            return None
        per_rank.append({"rank": r, "findings": [f.id for fx in mine for f in fx.findings if r in f.ranks],
                         "saving_us": (row.get("savings_us") or {}).get(kr),
                         "parts_us": {fx.rule: (row.get("savings_us") or {}).get(fx.rule) for fx in mine},
                         "step_us": row.get("step_us"), "steps": row.get("steps"),
                         "steps_replayed": row.get("steps_replayed"),
                         "reproduction_error": row.get("reproduction_error"), "_key": kr})
    if tied:
        # the job's step is its slowest rank's: per step held by every rank, replayed or measured
        all_ranks = sorted(steps_of)
        sav = {p["rank"]: (table[p["rank"]]["step_savings_ns"][p["_key"]], table[p["rank"]]["step_ns"]) for p in per_rank}
        common: set[int] = {int(x) for x in next(iter(sav.values()))[0]}
        for sv, _ in sav.values():
            common &= {int(x) for x in sv}
        for r in all_ranks:
            common &= set(steps_of[r])
        got = []
        for s in sorted(common):
            old = max(steps_of[r][s] * 1000.0 for r in all_ranks)
            after = max((sav[r][1][s] - sav[r][0][s]) if r in sav else steps_of[r][s] * 1000.0 for r in all_ranks)
            got.append((old - after, old))
        if not got:
            return None
        out: dict[str, Any] = {"saving_us": round(max(sum(g for g, _ in got) / len(got) / 1000.0, 0.0), 3),
                               "method": "slowest_rank", "ranks": involved,
                               "step_us": round(sum(o for _, o in got) / len(got) / 1000.0, 3),
                               "steps": len(common), "steps_replayed": len(got)}
    else:
        best = max(per_rank, key=lambda p: (float(p["saving_us"] or 0.0), -int(p["rank"])))
        out = {"saving_us": float(best["saving_us"] or 0.0), "method": "rank" if tied is None else "largest_rank",
               "rank": best["rank"], "ranks": involved, "step_us": best.get("step_us"), "steps": best.get("steps"),
               "steps_replayed": best.get("steps_replayed"), "reproduction_error": best.get("reproduction_error")}
    out["per_rank"] = [{k2: v for k2, v in p.items() if k2 != "_key"} for p in per_rank]
    return out


#: what each way of replaying the fixes together says, in words
METHOD = {
    "joined": "replayed together on ranks {ranks} at once, joined by their collectives",
    "slowest_rank": ("replayed on each of ranks {ranks}, the job's step the slowest rank's (the ranks wait for each "
                     "other every step)"),
    "rank": "replayed together on rank {rank}",
    "largest_rank": ("replayed together on each rank, the largest rank's (rank {rank}); the ranks do not wait for "
                     "each other every step, so each keeps its own step"),
}


def _why_left_out(fx: _Fix, cluster_rules: set[str]) -> str:
    if fx.rule in cluster_rules:
        if any((f.replay or {}).get("estimated") for f in fx.findings):
            return ("a cluster finding: its rule replays its change across the ranks by itself, not together with "
                    "the rank rules' changes")
        return "a cluster finding: its saving is the rule's estimate, no change of its is replayed"
    if not fx.ranks:
        return "it names no rank: no rank's replay holds its change"
    return ("no change of its was replayed on its ranks (a rule that states no counterfactual, or steps that do "
            "not reproduce)")


def headline(findings: Sequence[Finding], roots: Sequence[str], table: Mapping[int, Mapping[str, Any]] | None,
             joined: Mapping[str, Any] | None = None, breakdown: Any = None,
             cluster_rules: Iterable[str] = ()) -> dict[str, Any]:
    """``savings.combined``: the top :data:`MOST` fixes among the root findings and the saving of making them
    together, never their savings summed. A fix is the root findings of one rule (one change, made on every
    rank it fires on); a root explained by another top finding is not one (a partial explanation counts
    its saving beyond it). Where the fixes' changes can be replayed together (:func:`_job`) the figure is
    that replay (``basis: replayed``). Where they cannot, a range (``basis: range``, ``estimated: false``):
    at least the largest saving of one fix or of a combination that could be replayed, at most the smaller
    of the savings summed (a replayed part counted once) and the step's time the fixes' classes of cause
    could free (:func:`_freeable`), ``max_bound`` saying which; ``saving_us`` is the lower end.
    ``cluster_rules``: the ids of the cluster rules (a fix of theirs left out is said to be one)."""
    table = table or {}
    by_id = {f.id: f for f in findings}
    cand = [by_id[i] for i in roots if i in by_id and (by_id[i].estimated_saving_us or 0.0) > 0]
    ids = {f.id for f in cand}
    cand = [f for f in cand if not set(f.explained_by) & (ids - {f.id})]
    figure = {f.id: _counted(f, ids) for f in cand}
    groups: dict[str, list[Finding]] = {}
    for f in sorted(cand, key=lambda f: (-figure[f.id], f.rule, f.id)):
        groups.setdefault(f.rule, []).append(f)
    fixes = sorted((_Fix(r, fs, figure) for r, fs in groups.items()), key=lambda x: (-x.best, x.rule))[:MOST]
    top = [f for fx in fixes for f in fx.findings]
    out: dict[str, Any] = {"findings": [f.id for f in top], "rules": [f.rule for f in top],
                           "fixes": [{"rule": fx.rule, "findings": [f.id for f in fx.findings], "ranks": fx.ranks,
                                      "largest_us": round(fx.best, 3)} for fx in fixes]}
    if not fixes:
        return {**out, "estimated": False, "saving_us": None, "basis": "single",
                "reason": "no root finding with a saving: nothing to fix together"}
    steps_of = _steps_of_bd(breakdown)
    tied = coupled(breakdown)
    if tied is None and len({r for fx in fixes for r in fx.ranks}) > 1:
        tied = False
    jobs: dict[tuple[int, ...], dict[str, Any] | None] = {}
    for n in range(1, len(fixes) + 1):
        for c in itertools.combinations(range(len(fixes)), n):
            jobs[c] = _job([fixes[i] for i in c], table, joined, steps_of, tied)
    for i, fx in enumerate(fixes):
        j = jobs[(i,)]
        out["fixes"][i]["saving_us"] = None if j is None else j["saving_us"]
        if j is not None:
            out["fixes"][i]["method"] = j["method"]
    allc = tuple(range(len(fixes)))
    full = jobs[allc]
    if len(fixes) == 1:
        return {**out, "estimated": False, "basis": "single",
                "saving_us": full["saving_us"] if full else round(fixes[0].best, 3),
                "reason": "one fix among the root findings: nothing to make together"}
    if full is not None:
        out.update({"estimated": True, "basis": "replayed", "saving_us": full["saving_us"], "method": full["method"],
                    "replayed": [f.id for f in top], "ranks": full["ranks"],
                    "parts_us": {fx.rule: out["fixes"][i]["saving_us"] for i, fx in enumerate(fixes)},
                    "saving_fraction": round(float(full["saving_us"]) / float(full["step_us"]), 4)
                    if full.get("step_us") else None,
                    "assumption": ASSUMPTION, "per_rank": full.get("per_rank") or [],
                    "how": METHOD[full["method"]].format(ranks=", ".join(map(str, full["ranks"])),
                                                         rank=full.get("rank"))})
        if full.get("rank") is not None:
            out["rank"] = full["rank"]
        if full["method"] == "joined":
            out["steps_replayed"] = full.get("steps_replayed")
        return out
    # not replayable together: a range
    fig = [out["fixes"][i]["saving_us"] if out["fixes"][i]["saving_us"] is not None else fixes[i].most
           for i in range(len(fixes))]
    lower = max([*(fx.best if out["fixes"][i]["saving_us"] is None else fig[i] for i, fx in enumerate(fixes)),
                 *(float(j["saving_us"]) for j in jobs.values() if j is not None)])
    summed = min(float(j["saving_us"]) + sum(fig[i] for i in allc if i not in c) if j is not None else float("inf")
                 for c, j in jobs.items())
    summed = min(summed, float(sum(fig)))
    free = _freeable(breakdown, fixes)
    upper, bound = (summed, "summed") if free is None or summed <= free else (free, "classes")
    lower = min(lower, upper)
    part = max(((c, j) for c, j in jobs.items() if j is not None and len(c) >= 2),
               key=lambda cj: float(cj[1]["saving_us"]), default=None)
    in_part = set(part[0]) if part else set()
    left = [i for i in allc if i not in in_part]
    cluster = set(cluster_rules)
    out.update({"estimated": False, "basis": "range", "saving_us": round(lower, 3),
                "saving_min_us": round(lower, 3), "saving_max_us": round(upper, 3), "max_bound": bound,
                "min_bound": ("the largest saving of one fix" + (" or of the fixes replayed together" if part else "")
                              + ": making them all saves at least that, if the changes do not undo each other"),
                "max_bound_text": ("their savings summed (a replayed part counted once): an upper bound, not the figure"
                                   if bound == "summed" else
                                   "the step time the fixes' classes of cause could free (" +
                                   ", ".join(sorted({c for fx in fixes for c in FREEABLE.get(fx.cause.split('.', 1)[0],
                                                                                            ('step_us',))})) + ")"),
                "left_out": [{"rule": fixes[i].rule, "findings": [f.id for f in fixes[i].findings],
                              "why": _why_left_out(fixes[i], cluster) if out["fixes"][i]["saving_us"] is None
                              else "its change is replayed alone only, not together with the others'"}
                             for i in left],
                "reason": "the fixes' changes cannot be replayed together: " + "; ".join(
                    f"{fixes[i].rule}: " + (_why_left_out(fixes[i], cluster) if out["fixes"][i]["saving_us"] is None
                                            else "replayed alone only") for i in left)})
    if part:
        c, j = part
        out["replayed"] = [f.id for i in c for f in fixes[i].findings]
        out["replayed_saving_us"] = j["saving_us"]
        out["method"] = j["method"]
    out["not_replayed"] = [f.id for i in left for f in fixes[i].findings]
    out["not_replayed_reason"] = out["reason"]
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
