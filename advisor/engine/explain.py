"""Post-pass: link cluster findings (slow rank, step fluctuation, operator variability) to the
findings that explain them.

Rules run independently, so a cluster rule cannot see the other rules' findings. The runner
(``advisor.engine.runner.finish``) calls :func:`annotate` once on the full list after every rule
has run and the savings are capped, then :func:`advisor.engine.chain.link`, which keeps these
links where the cause registry declares them and the savings allow. It returns new ``Finding``
objects (they are frozen):

* the explaining finding gets the cluster finding's id in ``explains`` (A.explains ∋ B means
  "A explains B");
* the cluster finding gets ``evidence["explained_by"]`` (the explaining ids, comma separated)
  and a sentence in ``detail``, so the slow rank / slow step lists its own causes.

What counts as an explanation:

* **cluster.slow_rank on rank R** (flagged steps S, excess own time E): a non-cluster finding
  that names R (and not all of R's peers: a group-level finding such as comm.slow_synchronization
  is the symptom) and whose steps (if any) meet S, and that is *specific* to R: the same rule and
  cause did not fire on the peers, or its saving on R exceeds the peers' median saving for that
  rule and cause by at least ``min_share`` × E (a cause every rank has equally does not explain
  why R is slower).
* **cluster.step_fluctuation on ranks R, slow steps S**: a non-cluster finding on one of R whose
  steps meet S and either do not cover every profiled step of the rank (step-specific), or whose
  cause is one that typically comes and goes (GC, data loading, compilation, contention, host
  sync) — those rules often list every step they saw but their cost concentrates in the spikes.
  Where the explaining finding lists the host thread's stalls per step (CPU005's
  ``stalled_us_by_step``), the step fluctuation also says how much longer the thread stalled in its
  slow steps than in the others (``slow_steps_stalled_us``, and ``slow_steps_stalled_share`` of its
  excess) and that the machine, not the job, made that part of the steps slow.
* **cluster.operator_variability** (one operator explains most of the step-time variance; it
  names every rank and no step, so only its spikes place it: ``evidence["op_spike_steps"]``, the
  steps whose excess over the median step that operator carries on the rank the step waits for,
  and ``top``, the largest of them with that rank, :func:`advisor.variability.spikes`):

  - it explains a **step fluctuation** when at least half of the fluctuation's slow steps are
    spikes of the operator (the steps are slow because that operator is);
  - a **rank slow in some steps** (cluster.slow_rank_step, rank R, steps S; merged over ranks: its
    ranks and the steps they are slow in) explains it when in at least half of S the spike is on R:
    the operator varies because R was slow in those steps. Where the rank's saving is
    under half the variability's, :func:`advisor.engine.chain.link` keeps it as a partial link
    (the operator also varies elsewhere).

  - a **rank-level cause that slows whatever runs** (:data:`SPIKING_CAUSES`: contention, whose
    stalls land in whichever operator the thread was running) explains it when at least half of the
    operator's spikes lie in its ranks and steps.

  These links carry no sentence in ``detail``: :func:`advisor.engine.chain.link` keeps them only
  where the cause registry declares them and the savings allow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from advisor.model import Finding

VARIABILITY = "cluster.operator_variability"
# share of the other finding's slow steps (or rank-step cells) that must be spikes of the operator
MIN_SPIKE_OVERLAP = 0.5

INTERMITTENT_CAUSES = (
    "cpu.garbage_collection",
    "cpu.operator_compilation",
    "cpu.resource_contention",
    "cpu.host_device_sync",
    "io.slow_data_reading",
    "io.slow_data_processing",
    "io.slow_data_fetching",
)


#: rank-level causes that explain an operator's variability when its spikes lie in their steps (the cause
#: slows whatever runs there: the declared pairs are in ``rules/causes.toml``)
SPIKING_CAUSES = ("cpu.resource_contention",)


def _peers(f: Finding) -> list[int]:
    text = str(f.evidence.get("peer_ranks", ""))
    out = []
    for part in text.replace("…", "").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def annotate(findings: Sequence[Finding], min_share: float = 0.25,
             steps_by_rank: dict[int, set[int]] | None = None) -> list[Finding]:
    """Return ``findings`` with ``explains`` / ``explained_by`` filled in (see the module doc)."""
    items = list(findings)
    explains: dict[int, list[str]] = {}      # index of explaining finding -> cluster ids it explains
    explained_by: dict[int, list[str]] = {}  # index of cluster finding -> ids explaining it
    stalls: dict[int, tuple[str, float, int]] = {}  # step fluctuation -> (rule, stalled µs in its slow steps, steps)
    for ci, c in enumerate(items):
        if c.cause == "cluster.slow_rank" and c.ranks:
            rank = c.ranks[0]
            peers = _peers(c)
            excess = float(c.evidence.get("excess_us_median") or 0.0)
            for fi, f in enumerate(items):
                if fi == ci or f.cause.startswith("cluster.") or rank not in f.ranks:
                    continue
                if f.steps and c.steps and not set(f.steps) & set(c.steps):
                    continue
                if peers and set(peers) <= set(f.ranks):
                    continue  # a group-level finding (e.g. comm.slow_synchronization) is the symptom, not the cause
                same = [g for g in items if g.rule == f.rule and g.cause == f.cause and set(g.ranks) & set(peers)
                        and rank not in g.ranks]
                if same:
                    peer_saving = sorted(float(g.estimated_saving_us or 0.0) for g in same)[len(same) // 2]
                    if f.estimated_saving_us is None or float(f.estimated_saving_us) - peer_saving < min_share * excess:
                        continue
                _link(explains, explained_by, fi, ci, f, c)
        elif c.cause == "cluster.step_fluctuation" and c.steps:
            slow = set(c.steps)
            for fi, f in enumerate(items):
                if fi == ci or f.cause.startswith("cluster.") or not set(f.ranks) & set(c.ranks):
                    continue
                if not f.steps or not set(f.steps) & slow:
                    continue
                every = None
                if steps_by_rank:
                    every = set().union(*(steps_by_rank.get(r, set()) for r in f.ranks))
                specific = every is not None and not set(every) <= set(f.steps)
                if specific or f.cause in INTERMITTENT_CAUSES:
                    _link(explains, explained_by, fi, ci, f, c)
                    stalled = _stalled_in(f, slow)
                    if stalled is not None:
                        stalls[ci] = (f.rule, *stalled)
        elif c.cause == VARIABILITY:
            _variability_links(items, ci, c, explains)
    out: list[Finding] = []
    for i, f in enumerate(items):
        changes: dict[str, Any] = {}
        if i in explains:
            changes["explains"] = tuple(dict.fromkeys((*f.explains, *explains[i])))
        if i in explained_by:
            ids = explained_by[i]
            ev = dict(f.evidence)
            ev["explained_by"] = ", ".join(ids)
            changes["evidence"] = ev
            rules = sorted({g.rule for g in items if g.id in ids})
            note = "Explained by this rank's own findings: " + ", ".join(rules) + "."
            excess = float(f.evidence.get("excess_us_total") or 0.0)
            if i in stalls and excess > 0:
                rule, us, n = stalls[i]
                share = us / excess
                ev["slow_steps_stalled_us"] = round(us, 1)
                ev["slow_steps_stalled_share"] = round(share, 4)
                note += (f" In {n} of the slow steps the host thread stalled {us / 1000:.1f} ms more than in the other "
                         f"steps ({min(share, 1.0):.0%} of their excess over the baseline; {rule}): calls lost a "
                         "scheduler slice with nothing nested in them to explain it, so the machine, not the job, made "
                         + ("most of " if share >= 0.5 else "part of ") + "these steps' extra time.")
            changes["detail"] = (f.detail + " " + note).strip()
        out.append(dataclasses.replace(f, **changes) if changes else f)
    return out


def _stalled_in(f: Finding, steps: set[int]) -> tuple[float, int] | None:
    """How much longer the host thread stalled in ``steps`` than in the finding's other steps: from the stall time
    it lists per step judged (``evidence["stalled_us_by_step"]``, "step: µs; ..."), the sum over ``steps`` of each
    one's stalls beyond the median of the other steps' (the calm steps stall too: the baseline holds their
    stalls), and in how many of ``steps`` it stalled more; None when it lists no step."""
    text = f.evidence.get("stalled_us_by_step")
    if not isinstance(text, str) or not text:
        return None
    per: dict[int, float] = {}
    for part in text.split(";"):
        s, _, us = part.partition(":")
        if s.strip().lstrip("-").isdigit():
            per[int(s)] = float(us)
    calm = sorted(v for s, v in per.items() if s not in steps)
    base = 0.0 if not calm else (calm[len(calm) // 2] if len(calm) % 2 else (calm[len(calm) // 2 - 1] + calm[len(calm) // 2]) / 2)
    more = [per[s] - base for s in steps if s in per and per[s] > base]
    return (sum(more), len(more)) if more else None


def _spike_cells(f: Finding) -> set[tuple[int, int]]:
    """(rank, step) of each spike of a cluster.operator_variability finding (its ``top`` rows)."""
    out = set()
    for row in f.top:
        if isinstance(row.get("rank"), int) and isinstance(row.get("step"), int):
            out.add((int(row["rank"]), int(row["step"])))
    return out


def _variability_links(items: list[Finding], vi: int, v: Finding, explains: dict[int, list[str]]) -> None:
    """The links of the operator-variability finding ``v`` (see the module doc), into ``explains``."""
    cells = _spike_cells(v)
    listed = str(v.evidence.get("op_spike_steps") or "").split(",")
    spike_steps = {int(x) for x in listed if x.strip().isdigit()} | {s for _, s in cells}  # top: the 20 largest
    if not spike_steps:
        return
    for fi, f in enumerate(items):
        if fi == vi or not f.steps:
            continue
        if f.cause == "cluster.step_fluctuation":
            if len(set(f.steps) & spike_steps) >= MIN_SPIKE_OVERLAP * len(set(f.steps)):
                explains.setdefault(vi, []).append(f.id)
        elif f.cause in SPIKING_CAUSES and f.ranks:
            # the operator spikes in the steps this rank-level cause hit (the machine took the thread's CPU there)
            hit = {(r, s) for r, s in cells if r in f.ranks and s in f.steps} if cells else \
                {s for s in spike_steps if s in f.steps}
            if len(hit) >= MIN_SPIKE_OVERLAP * max(len(cells) if cells else len(spike_steps), 1):
                explains.setdefault(fi, []).append(v.id)
        elif f.cause == "cluster.slow_rank_step" and f.ranks:
            # its steps in which the spike is on one of its ranks (merged over ranks, a step is one of theirs)
            hit = {s for r, s in cells if r in f.ranks and s in f.steps}
            if len(hit) >= MIN_SPIKE_OVERLAP * len(set(f.steps)):
                explains.setdefault(fi, []).append(v.id)


def _link(explains: dict[int, list[str]], explained_by: dict[int, list[str]], fi: int, ci: int,
          f: Finding, c: Finding) -> None:
    explains.setdefault(fi, []).append(c.id)
    explained_by.setdefault(ci, []).append(f.id)
