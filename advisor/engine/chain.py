"""One account of savings: cap each finding's saving at its step, link the findings that describe
the same time into chains, and sum the roots only.

Rules run independently, so two of them often report the same lost time from two sides: an RDMA
retransmission makes a link slow, the slow link makes its peers wait in the collective, the wait
shows as step fluctuation. The runner calls, after every rule has run:

* :func:`cap_savings`: a saving is at most the step of the ranks the finding names (no fix
  removes more than the whole step): per rank the larger of its median and its mean step
  (:func:`cap_steps`), since a saving typical of a step is at most the median step and one
  amortised over the steps (a single spike's excess spread over all of them) at most the mean. A capped finding keeps what the rule claimed in
  ``evidence["saving_capped_from_us"]``; its share of the step (at most 1) and the severity that
  follows from it (CAUSES.md) stay as the rule measured them.
* :func:`link`: finding A *explains* finding B when B's cause is one A's cause can explain
  (``explains = [...]`` in ``rules/causes.toml``) and both concern the same time: they share a
  rank (or one names none), most of B's steps are A's steps, A's saving is not zero and (where
  both are known) at least half of B's, and where B blames ranks
  (``slowest_ranks``, e.g. the member a collective waits for) A names one of them. Links into a
  slow rank or a step fluctuation also need :func:`advisor.engine.explain.annotate`'s test that
  the explaining finding is specific to that rank or those steps. A finding nothing explains is a
  *root*; the others point to their direct explainers (``explained_by``) and to the root they
  trace back to (``root_id``). For the cause pairs of :data:`PARTIAL` a link that fails only the
  saving test is a *partial* one: the explained finding stays a root, with
  ``evidence["explained_in_part_by"]`` and ``evidence["unexplained_saving_us"]`` (its saving less
  the explainers'), and the explaining one gets ``evidence["explains_in_part"]``.
* :func:`summary`: the report's total saving sums the roots only, per rank (a root explained in
  part by a finding on that rank counts its unexplained saving), and is the largest rank's sum
  capped at that rank's median step; the verdict is the root with the largest saving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from advisor.model import Finding, severity_for_fraction

# causes whose links need explain.annotate's specificity test, not only a shared rank and step
REFINED = frozenset({"cluster.slow_rank", "cluster.step_fluctuation"})
# causes whose links, either way, need explain.annotate's test: a finding that names every rank and no
# step cannot be placed by a shared rank and step (its spikes place it)
PLACED_BY_ANNOTATE = frozenset({"cluster.operator_variability"})
# cluster causes that explain a REFINED finding without annotate's test when it lies inside them: a slow
# pipeline stage, a slow rank whose ranks all belong to the stage; a rank slow in some steps, a step
# fluctuation whose slow steps are all among them
ENCLOSING = {"cluster.slow_stage": "ranks", "cluster.slow_rank_step": "steps"}
# explaining cause -> explained cause where a finding with less than MIN_SAVING_SHARE of the other's
# saving explains part of it: a slow pipeline stage makes the other stages wait its excess (the bubble
# beyond it is the schedule's); a rank slow in some steps makes an operator vary in those steps (its
# variability elsewhere is not the rank's). The explained finding stays a root and counts its saving
# beyond the part explained.
PARTIAL = frozenset({("cluster.slow_stage", "parallel.pipeline_bubble"),
                     ("cluster.slow_rank_step", "cluster.operator_variability")})
# explaining cause -> explained cause found on other ranks: a slow stage stalls the other stages
OTHER_RANKS = frozenset({("cluster.slow_stage", "parallel.pipeline_bubble")})
# a slow link explains the slow group it lies in only when it is the group's one slow link (specific to
# the group); where several of the group's links are slow, no one of them is the group's cause
GROUP, LINK = "cluster.slow_group", "cluster.slow_link"
# share of the explained finding's steps the explaining one must also name
MIN_STEP_OVERLAP = 0.5
# where both savings are known, the explaining finding accounts for at least this share of the
# explained one's (a cause that removes a fraction of the time does not explain all of it)
MIN_SAVING_SHARE = 0.5
# a saving within this relative margin of the cap is not a cap (rounding of the rule's figures)
CAP_TOLERANCE = 1e-6


def explains_map() -> dict[str, tuple[str, ...]]:
    """cause id -> the causes it can explain (``explains = [...]`` in ``rules/causes.toml``, or a
    cause a rule added): from the cause registry."""
    from advisor.causes import registry

    return registry().explains_map()


def median_steps(breakdown: Any, no_step: int) -> dict[int, float]:
    """Median step time (µs) of each rank over its real steps (rows outside any step left out)."""
    if breakdown is None or breakdown.empty:
        return {}
    bd = breakdown[breakdown["step"] != no_step]
    return {int(r): float(s.median()) for r, s in bd.groupby("rank")["step_us"] if len(s)}


def cap_steps(breakdown: Any, no_step: int) -> dict[int, float]:
    """The most a finding can save per step on each rank: the larger of its median and its mean step
    (µs, over its real steps). A saving per typical step is at most the median step; a saving
    amortised over the steps (one 200 ms spike among 1.5 ms steps saves 25 ms per step on average)
    is at most the mean step, which a median cap would cut to the typical step."""
    if breakdown is None or breakdown.empty:
        return {}
    bd = breakdown[breakdown["step"] != no_step]
    return {int(r): max(float(s.median()), float(s.mean())) for r, s in bd.groupby("rank")["step_us"] if len(s)}


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def step_cap(f: Finding, med: Mapping[int, float]) -> float | None:
    """The most a finding can save per step: the median over the ranks it names (every rank for a
    finding that names none) of their step cap ``med`` (:func:`cap_steps`); None without step
    times for them."""
    vals = [med[r] for r in (f.ranks or tuple(med)) if r in med]
    return _median(vals) if vals else None


def cap_savings(findings: Iterable[Finding], med: Mapping[int, float]) -> list[Finding]:
    """Each saving at most :func:`step_cap`; a capped finding records the claimed figure. A finding
    with a share of the step has the severity CAUSES.md gives that share."""
    out = []
    for f in findings:
        if f.saving_fraction is not None and f.severity != severity_for_fraction(f.saving_fraction):
            f = dataclasses.replace(f, severity=severity_for_fraction(f.saving_fraction))  # CAUSES.md's bands
        cap = step_cap(f, med)
        s = f.estimated_saving_us
        if cap is None or s is None or s <= cap * (1 + CAP_TOLERANCE):
            out.append(f)
            continue
        ev = dict(f.evidence)
        ev["saving_capped_from_us"] = round(s, 3)
        basis = (f.saving_basis + "; " if f.saving_basis else "") + "capped at the step of the ranks it names"
        # the share stays the rule's (of the step it measured, at most 1) and so does the severity
        # that follows from it: a stall longer than the median step is still the whole step
        out.append(dataclasses.replace(f, estimated_saving_us=round(cap, 3), evidence=ev, saving_basis=basis))
    return out


def unique_ids(findings: Iterable[Finding]) -> list[Finding]:
    """Give the second and later findings that share an id a suffixed one (``-2``, ``-3`` ...)."""
    seen: dict[str, int] = {}
    out = []
    for f in findings:
        n = seen.get(f.id, 0) + 1
        seen[f.id] = n
        out.append(f if n == 1 else dataclasses.replace(f, uid=f"{f.id}-{n}"))
    return out


def _blamed(f: Finding) -> set[int]:
    """Ranks a finding blames among those it names (the member a collective waits for), else none."""
    text = str(f.evidence.get("slowest_ranks", f.evidence.get("slowest_rank", "")))
    return {int(p) for p in text.replace("…", "").split(",") if p.strip().isdigit()}


def same_time(a: Finding, b: Finding) -> bool:
    """Whether ``a`` and ``b`` concern the same ranks and steps (see the module doc)."""
    if a.ranks and b.ranks and not set(a.ranks) & set(b.ranks):
        return False
    blamed = _blamed(b)
    if blamed and a.ranks and not blamed & set(a.ranks):
        return False
    shared = len(set(a.steps) & set(b.steps))
    return not (a.steps and b.steps and shared < MIN_STEP_OVERLAP * len(set(b.steps)))


def _reaches(edges: Mapping[int, set[int]], src: int, dst: int) -> bool:
    stack, seen = [src], {src}
    while stack:
        x = stack.pop()
        if x == dst:
            return True
        for y in edges.get(x, ()):
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return False


def link(findings: Sequence[Finding], causes: Mapping[str, Sequence[str]] | None = None,
         replayed: Mapping[int, Mapping[str, Any]] | None = None) -> list[Finding]:
    """Return ``findings`` with ``explains``, ``explained_by``, ``root`` and ``root_id`` set.

    ``findings`` carry :func:`advisor.engine.explain.annotate`'s links in ``explains``; they are
    kept where ``causes`` declares them, and are the only links into :data:`REFINED` causes.
    ``replayed`` (per rank, the rank rules' changes replayed alone and together:
    :func:`advisor.engine.combined.replay_combinations`): a declared pair whose both changes were
    replayed on a rank they share is linked by the replay alone (:func:`advisor.engine.combined.measured_link`:
    the explained finding's saving mostly gone once the other's change is made), its figures in the
    explained finding's ``evidence["explained_by_replay"]``."""
    from advisor.engine.combined import link_text, measured_link

    causes = explains_map() if causes is None else causes
    measured: dict[int, list[str]] = {}  # explained finding -> its measured links, in words
    items = list(findings)
    idx = {f.id: i for i, f in enumerate(items)}
    annotated = {(i, idx[b]) for i, f in enumerate(items) for b in f.explains if b in idx}
    # strongest explanations first, so that where two links would close a cycle the larger saving wins
    order = sorted(range(len(items)), key=lambda i: (-(items[i].estimated_saving_us or 0.0), i))
    edges: dict[int, set[int]] = {}
    partial: dict[int, list[int]] = {}  # explained in part -> the findings that explain that part
    for ai in order:
        a = items[ai]
        can = set(causes.get(a.cause, ()))
        for bi in range(len(items)):
            b = items[bi]
            if bi == ai or b.cause == a.cause or b.cause not in can:
                continue
            if not _group_link_ok(a, b, items):
                continue
            by_annotate = b.cause in REFINED or a.cause in PLACED_BY_ANNOTATE or b.cause in PLACED_BY_ANNOTATE
            if by_annotate:
                ok = (ai, bi) in annotated
            else:
                ok = same_time(dataclasses.replace(a, ranks=()) if (a.cause, b.cause) in OTHER_RANKS else a, b)
            if not ok and b.cause in REFINED and a.cause in ENCLOSING:
                inside = (set(b.ranks) <= set(a.ranks) if ENCLOSING[a.cause] == "ranks"
                          else set(b.steps) <= set(a.steps))
                ok = inside and bool(b.ranks and b.steps) and same_time(a, b)
            sa, sb = a.estimated_saving_us, b.estimated_saving_us
            m = measured_link(a, b, replayed)
            if m is not None:
                measured.setdefault(bi, []).append(link_text(m, a.rule))
                if m["holds"] and not _reaches(edges, bi, ai):
                    edges.setdefault(ai, set()).add(bi)
                continue
            if sa is not None and (sa <= 0 or sb is not None and sa < MIN_SAVING_SHARE * sb):
                if ok and sa > 0 and (a.cause, b.cause) in PARTIAL:
                    partial.setdefault(bi, []).append(ai)
                ok = False  # nothing to remove explains nothing; a small part explains a part
            if ok and not _reaches(edges, bi, ai):
                edges.setdefault(ai, set()).add(bi)
    parents: dict[int, list[int]] = {}
    for ai in order:
        for bi in sorted(edges.get(ai, ())):
            parents.setdefault(bi, []).append(ai)
    chain = {i: chain_saving(i, items, edges) for i in range(len(items))}
    out = []
    for i, f in enumerate(items):
        ps = parents.get(i, [])
        root_id = None
        if ps:
            roots = [r for r in _ancestors(i, parents) if r not in parents]
            best = min(roots, key=lambda r: (-(chain[r] or 0.0), -items[r].severity, r))
            root_id = items[best].id
        ev = dict(f.evidence)
        if ps:
            ev["explained_by"] = ", ".join(items[p].id for p in ps)
        else:
            ev.pop("explained_by", None)
        _part_evidence(ev, i, items, partial)
        ev.pop("explained_by_replay", None)
        if i in measured:
            ev["explained_by_replay"] = "; ".join(measured[i])
        out.append(dataclasses.replace(
            f, explains=tuple(items[b].id for b in sorted(edges.get(i, ()))),
            explained_by=tuple(items[p].id for p in ps), root=not ps, root_id=root_id, evidence=ev))
    return out


def _group_link_ok(a: Finding, b: Finding, items: Sequence[Finding]) -> bool:
    """Whether ``a`` may explain ``b`` as far as :data:`GROUP` goes: a slow link explains a slow group
    only when no other slow link lies inside the group."""
    if (a.cause, b.cause) != (LINK, GROUP):
        return True
    return sum(1 for f in items if f.cause == LINK and f.ranks and set(f.ranks) <= set(b.ranks)) <= 1


def _counted(i: int, r: int | None, items: Sequence[Finding], idx: Mapping[str, int],
             chain: Mapping[int, float | None]) -> float | None:
    """Root ``i``'s part of rank ``r``'s total: its chain saving, or where a finding of the report on the
    same rank explains a part of it (:data:`PARTIAL`; counted in its own chain), its saving beyond that part."""
    rest = items[i].evidence.get("unexplained_saving_us")
    if rest is not None:
        for x in str(items[i].evidence.get("explained_in_part_by", "")).split(","):
            p = idx.get(x.strip())
            if p is not None and (r is None or not items[p].ranks or r in items[p].ranks):
                return float(rest)
    return chain[i]


def _part_evidence(ev: dict[str, Any], i: int, items: Sequence[Finding], partial: Mapping[int, list[int]]) -> None:
    """Record in ``ev`` (finding ``i``'s evidence) the partial links of :data:`PARTIAL`: what explains a part
    of it and its saving beyond that part, or the findings it explains a part of."""
    for key in ("explained_in_part_by", "unexplained_saving_us", "explains_in_part"):
        ev.pop(key, None)
    by = partial.get(i, [])
    if by:
        ev["explained_in_part_by"] = ", ".join(items[p].id for p in by)
        rest = float(items[i].estimated_saving_us or 0.0) - sum(float(items[p].estimated_saving_us or 0.0) for p in by)
        ev["unexplained_saving_us"] = round(max(0.0, rest), 3)
    parts = [items[b].id for b, ps in sorted(partial.items()) if i in ps]
    if parts:
        ev["explains_in_part"] = ", ".join(parts)


def _ancestors(i: int, parents: Mapping[int, list[int]]) -> list[int]:
    out: list[int] = []
    stack, seen = list(parents.get(i, [])), set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        out.append(x)
        stack.extend(parents.get(x, []))
    return sorted(out)


def chain_saving(i: int, items: Sequence[Finding], edges: Mapping[int, set[int]]) -> float | None:
    """A finding's own saving, or where it has none the largest saving of what it explains (the
    same time, seen from another side)."""
    own = items[i].estimated_saving_us
    if own is not None:
        return float(own)
    best: float | None = None
    stack, seen = list(edges.get(i, ())), set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        s = items[x].estimated_saving_us
        if s is not None and (best is None or s > best):
            best = float(s)
        stack.extend(edges.get(x, ()))
    return best


def summary(findings: Sequence[Finding], med: Mapping[int, float]) -> dict[str, Any]:
    """Report-level account: the roots, the verdict (root with the largest saving), and the total
    saving (roots only, per rank; the largest rank's sum, capped at that rank's median step)."""
    items = list(findings)
    idx = {f.id: i for i, f in enumerate(items)}
    edges = {i: {idx[b] for b in f.explains if b in idx} for i, f in enumerate(items)}
    # a finding whose explainers were filtered out of the report (--rank / --step) counts as a root here
    roots = [i for i, f in enumerate(items) if f.root or not any(e in idx for e in f.explained_by)]
    chain = {i: chain_saving(i, items, edges) for i in roots}
    verdict = min(roots, key=lambda i: (chain[i] is None, -(chain[i] or 0.0), -items[i].severity, i), default=None)
    ranks = sorted(set(med) | {r for i in roots for r in items[i].ranks})
    best: tuple[float, int | None, float, float | None] | None = None  # (total, rank, uncapped, cap)
    at = {i for i in roots if chain[i] is not None}
    for r in ranks or [None]:  # type: ignore[list-item]
        here = {i for i in at if r is None or not items[i].ranks or r in items[i].ranks}
        parts = [_counted(i, r, items, idx, chain) for i in sorted(here)]
        if not parts:
            continue
        raw = float(sum(p for p in parts if p is not None))
        cap = med.get(r) if r is not None else None
        total = min(raw, cap) if cap else raw
        if best is None or total > best[0]:
            best = (total, r, raw, cap)
    out: dict[str, Any] = {
        "total_saving_us": None if best is None else round(best[0], 3),
        "total_saving_fraction": round(best[0] / best[3], 4) if best and best[3] else None,
        "total_saving_rank": None if best is None else best[1],
        "roots": [items[i].id for i in roots],
        "verdict": None if verdict is None else items[verdict].id,
    }
    if best is not None and best[2] > best[0] * (1 + CAP_TOLERANCE):
        out["total_saving_capped_from_us"] = round(best[2], 3)
    return out
