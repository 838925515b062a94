"""Step windows inferred for a rank whose trace has no step marker.

A training loop repeats the same work every iteration, so the sequence of top-level host
operators on the thread that drives it (the host thread whose top-level operators cover the most
time) repeats: ``p`` operators per step.

* Period: a lag ``p`` at which at least :data:`MATCH` of the operator names equal the name ``p``
  places later. The match counts of every lag come at once from an FFT over random phases given
  to the names, then each candidate is checked exactly: the lags matching (nearly) best first,
  shortest first, so a repeated pattern inside a step (thousands of tiny ops) is tried after the
  whole step when the whole step matches better.
* Start of a step: PyTorch names the optimizer's step (``Optimizer.step#<class>.step``) and each
  batch a DataLoader yields (``enumerate(DataLoader)#...``): a step starts after the one and at
  or before the other. Within that span (the whole period without them), the start is the
  position with the longest idle gap before it, in the median over the periods: between
  ``prof.step()`` / the loop's own Python and the next iteration the driving thread idles longer
  than between the operators of one iteration.
* Cuts: every occurrence of the shortest run of operator names ending at the start operator
  that occurs once per period, so an operator added or missing in one step moves no other cut.
  A step's host range runs from the first event of its thread after the previous step's last
  operator (a Python GC pause or the loop's Python, when recorded, is the step's; an idle gap
  longer than usual counts from the usual gap on) to the next step's start. An idle gap longer
  than :data:`PAUSE` median steps is a pause of the profiler (two profiling cycles): the step
  before it ends at its last operator's end and the step numbers skip one, as markers' do. The step windows then follow the common definition
  (:func:`advisor.ingest.steps.windows_sql`), device lag included.

Checks, else the rank keeps one window, with the reason: at least :data:`MIN_STEPS` whole steps;
(nearly) every operator name recurs in most steps (a single pass over repeated layers, framed by
operators run once, is not a loop); a step holds more than one operator name, and the operators
are not one call repeated back to back (:data:`BACK_TO_BACK`: a micro-benchmark has no iteration
structure, any cut of it is arbitrary); :data:`STABLE_NAMES` of the recurring names run the same
number of times in (nearly) every step (:func:`count_stability`: a period whose steps hold varying
work is not an iteration, and per-step figures on it would state savings on an unsure basis); on
a rank with collectives, :data:`COMM_AGREE` of the steps hold the same number of them (the same collectives run every iteration). The steps kept carry a
confidence (:attr:`Inference.confidence`, said in the ``steps_inferred`` warning): an inference
unsure of its period keeps no steps, so no per-step statistic or saving rests on it.

Collectives alone (the big gaps between their bursts, as LLMPrism's change-point detection
reads them) place a step boundary only somewhere in the compute between two bursts; the host
operators place it at the marker (tests/test_step_inference.py measures both). Where the
operators do not repeat cleanly (a sparse part whose operators vary with the batch, work spread
over several host threads), the sequence of collectives does: each step runs the same
collectives in the same order, of the same kinds and sizes (LLMPrism's own signal), and
:func:`infer_from_collectives` takes the period from it and the boundary from the main thread's
idle gap in the longest pause between collectives.

Cost: one window query sorting the rank's host events by thread and time, then O(m log m) numpy
over the ``m`` top-level operators of one thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: fraction of the operators equal to the one a period later for the sequence to repeat
MATCH = 0.8
#: complete steps the sequence must repeat for steps to be inferred
MIN_STEPS = 2
#: sequences up to this length have their lag matches counted exactly, longer ones by FFT
EXACT_UP_TO = 2048
#: candidate periods tried, best first
MAX_CHECKS = 16
#: fraction of the operator names that must run in at least half of the steps
NAMES_RECUR = 0.8
#: fraction of the inferred steps that must hold the most common number of collectives
COMM_AGREE = 0.9
#: an idle gap before a step longer than this many median steps is a pause of the profiler
PAUSE = 2.0
#: a name recurring in the steps runs the same number of times in at least this share of them to be stable
COUNT_AGREE = 0.8
#: share of the recurring names that must be stable for the period to be an iteration
STABLE_NAMES = 0.8
#: share of the operators equal to the one before from which the sequence is one call repeated
BACK_TO_BACK = 0.95
#: name prefixes of PyTorch's own ranges around an optimizer step and a DataLoader batch
OPTIMIZER_STEP = "Optimizer.step#"
DATALOADER_NEXT = "enumerate(DataLoader)#"
#: a collective's name holding this (lower case, underscores dropped) is a gradient all-reduce
ALL_REDUCE = "allreduce"


@dataclass
class Inference:
    """Inferred steps of one rank: ``steps`` (number, host start, host end), or ``reason`` why none."""

    rank: int
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    period: int = 0
    reason: str = ""
    #: how well the steps repeat (0-1): the least of the share of operators (or collectives) equal one
    #: period later and the share of recurring names run the same number of times in (nearly) every step
    confidence: float = 0.0


def top_level_sql(detail: str, ranks: list[int]) -> str:
    """SQL: the top-level host events (rank, tid, name, start, end) of ``ranks`` in ``detail``, per
    thread; step markers, Python frames (with_stack) and host collectives (on their own threads)
    left out."""
    return f"""
        WITH h AS (SELECT rank, CAST(tid AS VARCHAR) AS tid, name, start_ns AS s, start_ns + dur_ns AS e FROM {detail}
                   WHERE rank IN ({", ".join(str(int(r)) for r in ranks)}) AND NOT device
                         AND kind NOT IN ('step', 'python', 'comm') AND dur_ns >= 0 AND start_ns IS NOT NULL),
        t AS (SELECT *, max(e) OVER (PARTITION BY rank, tid ORDER BY s, e DESC
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe FROM h)
        SELECT rank, tid, name, s, e FROM t WHERE pe IS NULL OR s >= pe ORDER BY rank, tid, s, e DESC"""


def lag_matches(codes: np.ndarray, max_lag: int, draws: int = 2) -> np.ndarray:
    """Count of ``codes[i] == codes[i + p]`` for every lag ``p`` in 0..max_lag: exact for a short
    sequence, else estimated.

    Each code gets a random phase; the autocorrelation of the unit vectors (by FFT) counts 1 per
    equal pair and a zero-mean term per unequal pair (its spread, over the ``m - p`` pairs of a
    lag averaged over ``draws`` phase draws, is ``sqrt((m - p) / (2 draws))``: under 1% of the pairs
    from 2,048 operators on).
    """
    m = len(codes)
    if m <= EXACT_UP_TO:
        return np.array([float(m)] + [float(np.count_nonzero(codes[:-p] == codes[p:])) for p in range(1, max_lag + 1)])
    rng = np.random.default_rng(0)
    n = 1 << int(np.ceil(np.log2(2 * m)))
    total = np.zeros(max_lag + 1)
    k = int(codes.max()) + 1
    for _ in range(draws):
        z = np.exp(2j * np.pi * rng.random(k))[codes]
        f = np.fft.fft(z, n)
        total += np.fft.ifft(f * np.conj(f))[: max_lag + 1].real
    return total / draws


def candidate_periods(codes: np.ndarray) -> tuple[list[int], float]:
    """Lags ``p`` >= 2 (with :data:`MIN_STEPS` repetitions) at which at least :data:`MATCH` of the
    names repeat, best matching first (within 0.01), shortest first; and the best fraction seen."""
    m = len(codes)
    max_lag = m // MIN_STEPS
    if max_lag < 2:
        return [], 0.0
    lags = np.arange(max_lag + 1)
    est = lag_matches(codes, max_lag) / np.maximum(m - lags, 1)
    top = float(est[2:].max())
    near = [int(p) for p in lags[2:] if est[p] >= MATCH - 0.05]
    near = sorted(near, key=lambda p: (est[p] < top - 0.02, p))[: 4 * MAX_CHECKS]
    exact = {p: float(np.mean(codes[:-p] == codes[p:])) for p in near}
    ok = [p for p in near if exact[p] >= MATCH]
    best = max(exact.values(), default=0.0)
    ok.sort(key=lambda p: (exact[p] < best - 0.01, p))
    return ok[:MAX_CHECKS], best


def start_phase(names: np.ndarray, gaps: np.ndarray, p: int) -> int:
    """Position in the first period of the operator that starts a step, or -1 (see the module doc)."""
    whole = len(gaps) // p * p
    table = gaps[:whole].reshape(-1, p)
    with np.errstate(all="ignore"):
        med = np.where(np.all(np.isnan(table), axis=0), -np.inf,
                       np.nanmedian(np.where(np.isnan(table).all(axis=0), 0.0, table), axis=0))
    first = names[:p]
    opt = [i for i in range(p) if str(first[i]).startswith(OPTIMIZER_STEP)]
    data = [i for i in range(p) if str(first[i]).startswith(DATALOADER_NEXT)]
    if len(opt) == 1 and len(data) == 1:
        o, d = opt[0], data[0]
        span = [(o + k) % p for k in range(1, (d - o) % p + 1)]
    elif len(opt) == 1:
        span = [(opt[0] + 1) % p]
    elif len(data) == 1:
        span = [data[0]]
    else:
        span = list(range(p))
    best = max(span, key=lambda ph: (med[ph], -ph))
    return best if med[best] > 0 or len(span) == 1 else -1


def _occurrences(codes: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """Start positions of every occurrence of ``gram`` in ``codes``."""
    n = len(codes) - len(gram) + 1
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    hit = np.ones(n, dtype=bool)
    for j, c in enumerate(gram):
        hit &= codes[j: n + j] == c
    return np.flatnonzero(hit)


def anchor_cuts(codes: np.ndarray, start: int, p: int) -> np.ndarray:
    """Positions of a step's first operator: every occurrence of the shortest run of names ending
    at ``start`` (the position in the first period) that occurs about once per period, with every
    occurrence of the shortest such run starting there (an operator added at a step's end or
    start hides the step from one of the two, not from both)."""
    m = len(codes)
    expect = m / p + 1
    found = [np.array([start])]
    for back in (True, False):
        for length in range(1, min(p, 8) + 1):
            ref = (start if start >= length - 1 else start + p) if back else start
            lo = ref - length + 1 if back else ref
            if lo + length > m:
                break
            pos = _occurrences(codes, codes[lo: lo + length]) + (length - 1 if back else 0)
            if len(pos) <= expect:
                found.append(pos)
                break
    cuts = np.unique(np.concatenate(found))
    # two runs found next to each other mark one start: keep the first of cuts closer than half a period
    keep = [int(cuts[0])]
    for c in cuts[1:].tolist():
        if c - keep[-1] >= max(p // 2, 1):
            keep.append(c)
    return np.array(keep, dtype=np.int64)


def try_period(names: np.ndarray, codes: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               extra: np.ndarray, comm: np.ndarray, p: int) -> tuple[list[tuple[int, int, int]], str]:
    """The steps with period ``p`` (number, host start, host end), or [] and why not."""
    m = len(codes)
    prev_end = np.maximum.accumulate(ends)
    gaps = np.full(m, np.nan)
    gaps[1:] = starts[1:] - prev_end[:-1]
    phase = start_phase(names, gaps, p)
    if phase < 0:
        return [], f"its top-level host operators repeat every {p} but no idle gap marks where an iteration starts"
    cuts = anchor_cuts(codes, phase, p)
    # a step starts after the previous step's last operator: at its first operator, or earlier at
    # the thread's first other event (Python, GC) after that end, and at most the usual idle gap
    # after it (a longer one is the thread kept from running: idle at the start of the step)
    prev = prev_end[np.maximum(cuts - 1, 0)]
    idle = np.where(cuts > 0, starts[cuts] - prev, 0)
    usual = float(np.median(idle[cuts > 0])) if np.any(cuts > 0) else 0.0
    period = float(np.median(np.diff(starts[cuts]))) if len(cuts) > 1 else np.inf
    held = (cuts > 0) & (idle > usual) & (idle <= PAUSE * period)
    begin = np.where(held, prev + int(usual), starts[cuts])
    if len(extra):
        i = np.searchsorted(extra, prev, "right")
        cand = extra[np.minimum(i, len(extra) - 1)]
        begin = np.where((cuts > 0) & (i < len(extra)) & (cand < begin), cand, begin)
    first_at = {int(c): int(t) for c, t in zip(cuts, begin)}
    spans = [(int(cuts[k]), int(cuts[k + 1])) for k in range(len(cuts) - 1)]
    # the last step runs to the thread's end when it holds (nearly) a whole period
    if m - cuts[-1] >= round(MATCH * p):
        spans.append((int(cuts[-1]), m))
    # the operators before the first cut are a step starting at the trace's start when they make
    # (nearly) a whole period
    if cuts[0] >= round(MATCH * p):
        spans.insert(0, (0, int(cuts[0])))
        first_at[0] = int(starts[0])
    if len(spans) < MIN_STEPS:
        return [], f"its top-level host operators repeat every {p} but fewer than {MIN_STEPS} whole times"
    rows = [(first_at[a], int(prev_end[b - 1]), a, b) for a, b in spans]
    durs = np.array([r[1] - r[0] for r in rows])
    med = float(np.median(durs))
    steps, num = [], 0
    for k, (s, e, a, b) in enumerate(rows):
        nxt = rows[k + 1][0] if k + 1 < len(rows) else None
        if nxt is not None and nxt - e <= PAUSE * med:
            steps.append((num, s, nxt))
            num += 1
        else:
            steps.append((num, s, e))
            num += 2  # a profiler pause: the numbers skip, so the next step opens a new cycle
    # a training loop does the same work every step: (nearly) every operator name recurs in
    # most steps, unlike a single pass over repeated layers framed by operators run once
    idx = np.arange(m)
    step_of = np.searchsorted(np.array([r[2] for r in rows]), idx, "right") - 1
    inside = (step_of >= 0) & (idx < rows[-1][3])
    pairs = np.unique(codes[inside] * len(rows) + step_of[inside])
    per_name = np.bincount(pairs // len(rows))
    seen = per_name[per_name > 0]
    if np.mean(seen * 2 >= len(rows)) < NAMES_RECUR:
        return [], (f"its top-level host operators repeat every {p}, but many of them run in only a few of the "
                    "repetitions (not a training loop)")
    # an iteration does distinct work: one operator name repeated (a micro-benchmark of one call) has no
    # iteration structure, and any cut of it into steps is arbitrary
    if len(seen) < 2:
        return [], (f"its top-level host operators are one operator ({names[0]}) called over and over: a "
                    "micro-benchmark with no iteration structure")
    stable = count_stability(codes[inside], step_of[inside], len(rows))
    if stable < STABLE_NAMES:
        return [], (f"its top-level host operators repeat every {p}, but only {stable:.0%} of the recurring names "
                    "run the same number of times in each repetition (no stable iteration)")
    if len(comm):
        lo_t = np.array([s for _, s, _ in steps])
        hi_t = np.array([e for _, _, e in steps])
        counts = np.searchsorted(comm, hi_t, "left") - np.searchsorted(comm, lo_t, "left")
        vals, cnt = np.unique(counts, return_counts=True)
        if cnt.max() < COMM_AGREE * len(counts) or vals[np.argmax(cnt)] == 0:
            return [], f"its top-level host operators repeat every {p}, but its collectives do not repeat with them"
    return steps, ""


def count_stability(codes: np.ndarray, step_of: np.ndarray, n_steps: int) -> float:
    """Share of the names running in at least half of the ``n_steps`` steps whose count per step is the
    same (the most common count) in at least :data:`COUNT_AGREE` of the steps; 1.0 when there are none."""
    if not len(codes) or n_steps < 1:
        return 1.0
    k = int(codes.max()) + 1
    counts = np.bincount(codes * n_steps + step_of, minlength=k * n_steps).reshape(k, n_steps)
    recurring = counts[(counts > 0).sum(axis=1) * 2 >= n_steps]
    if not len(recurring):
        return 1.0
    modal = np.array([np.bincount(row).max() for row in recurring])
    return float(np.mean(modal >= COUNT_AGREE * n_steps))


def _stability(codes: np.ndarray, steps: list[tuple[int, int, int]], starts: np.ndarray) -> float:
    """:func:`count_stability` of the operators (``codes`` starting at ``starts``) inside ``steps``."""
    lo = np.array([a for _, a, _ in steps])
    hi = np.array([b for _, _, b in steps])
    k = np.searchsorted(lo, starts, "right") - 1
    inside = (k >= 0) & (starts < hi[np.maximum(k, 0)])
    return count_stability(codes[inside], k[inside], len(steps))


def infer_rank(rank: int, names: np.ndarray, starts: np.ndarray, ends: np.ndarray, extra: np.ndarray,
               comm: np.ndarray) -> Inference:
    """Infer the steps of one rank from the top-level host operators of its main thread (in order),
    the sorted start times of that thread's other host events (Python, GC) and of its collectives."""
    out = Inference(rank)
    codes = pd.factorize(names)[0].astype(np.int64)
    m = len(codes)
    same_next = float(np.mean(codes[1:] == codes[:-1])) if m >= 4 else 0.0
    if same_next >= BACK_TO_BACK:
        # one call repeated (a micro-benchmark): no iteration structure, any cut into steps is arbitrary
        top = str(pd.Series(names).value_counts().index[0])
        out.reason = (f"{same_next:.0%} of its {m} top-level host operators are the same operator as the one before "
                      f"({top} called over and over): a micro-benchmark with no iteration structure")
        return out
    cands, best = candidate_periods(codes) if m else ([], 0.0)
    if not cands:
        out.reason = (f"the {m} top-level host operators of its main thread do not repeat "
                      f"(at most {best:.0%} equal one period later)" if m >= 4
                      else f"{m} top-level host operator(s) on its main thread")
        return out
    for p in cands:
        steps, why = try_period(names, codes, starts, ends, extra, comm, p)
        if steps:
            out.steps, out.period = steps, p
            out.confidence = round(min(float(np.mean(codes[:-p] == codes[p:])), _stability(codes, steps, starts)), 2)
            return out
        out.reason = out.reason or why
    return out


def infer_from_collectives(rank: int, threads: dict[str, tuple[np.ndarray, np.ndarray]], sig: np.ndarray,
                           c_starts: np.ndarray, c_ends: np.ndarray, c_tids: np.ndarray,
                           kinds: np.ndarray | None = None, opt_starts: np.ndarray | None = None) -> Inference:
    """Steps from the sequence of collectives (LLMPrism's signal) where the operators do not repeat
    cleanly (several host threads, a sparse part whose operators vary with the batch): every training
    step runs the same collectives, in the same order, of the same kinds and sizes (``sig``, one code
    per collective, in time order with their starts and ends).

    The period is that of the codes (as for the operators). A step starts in the pause between
    two collectives that holds PyTorch's ``Optimizer.step#`` range in most periods, else in the
    pause after the period's last all-reduce (the gradients' synchronisation ends a step; ``kinds``:
    the collectives' names), else in the longest pause, at the top-level
    operator of the thread calling that collective (``threads``: per thread id, the starts and ends
    of its top-level operators, in order; ``c_tids``: the collectives' threads) after the longest
    idle gap of that thread in the pause (the loop's own Python between iterations), else at that
    collective. The checks are those of the operators': whole periods, at least :data:`MIN_STEPS`."""
    out = Inference(rank)
    m = len(sig)
    kinds = np.array([""] * m) if kinds is None else kinds
    opt_starts = np.zeros(0, dtype=np.int64) if opt_starts is None else opt_starts
    cands, best = candidate_periods(sig) if m >= 2 * MIN_STEPS else ([], 0.0)
    if not cands:
        out.reason = f"its {m} collectives do not repeat either (at most {best:.0%} equal one period later)"
        return out
    p = cands[0]
    gaps = np.full(m, np.nan)
    gaps[1:] = c_starts[1:] - np.maximum.accumulate(c_ends)[:-1]
    whole = (m - 1) // p * p
    table = gaps[1: 1 + whole].reshape(-1, p)
    with np.errstate(all="ignore"):
        phase = (int(np.argmax(np.nanmedian(table, axis=0))) + 1) % p
    # a step ends with its optimizer step, after the gradients' all-reduce: the pause holding
    # PyTorch's Optimizer.step# range in most periods, else the one after the period's last all-reduce
    if len(opt_starts):
        held = np.zeros(p)
        c_done = np.maximum.accumulate(c_ends)
        for i in range(1, m):
            held[i % p] += np.any((opt_starts >= c_done[i - 1]) & (opt_starts < c_starts[i]))
        if held.max() * 2 >= m // p:
            phase = int(np.argmax(held))
    elif len(reduce_at := [i for i in range(p) if ALL_REDUCE in str(kinds[i]).lower().replace("_", "")]):
        phase = (reduce_at[-1] + 1) % p
    cuts = anchor_cuts(sig, phase, p)
    if len(cuts) < MIN_STEPS:
        out.reason = f"its collectives repeat every {p} but fewer than {MIN_STEPS} whole times"
        return out
    c_done = np.maximum.accumulate(c_ends)
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    bounds = []
    for c in cuts.tolist():
        starts, ends = threads.get(str(c_tids[c]), empty)
        hi = int(c_starts[c])
        lo = int(c_done[c - 1]) if c > 0 else (int(starts[0]) - 1 if len(starts) else hi)
        i0, i1 = np.searchsorted(starts, [lo, hi], "left") if len(starts) else (0, 0)
        if i1 > i0 and c > 0:
            before = np.maximum.accumulate(ends)
            idx = np.arange(i0, i1)
            idle = starts[idx] - np.where(idx > 0, before[np.maximum(idx - 1, 0)], lo)
            bounds.append(int(starts[i0 + int(np.argmax(idle))]))
        else:
            bounds.append(int(starts[i0]) if i1 > i0 else hi)
    span = np.diff(bounds)
    med = float(np.median(span)) if len(span) else 0.0
    steps, num = [], 0
    for k in range(len(bounds) - 1):
        steps.append((num, bounds[k], bounds[k + 1]))
        num += 1 if bounds[k + 1] - bounds[k] <= PAUSE * med else 2
    # the last step runs to the end of the thread when it holds a whole period of collectives
    if m - cuts[-1] >= p:
        end = max([int(c_ends.max())] + [int(e.max()) for _, e in threads.values() if len(e)])
        steps.append((num, bounds[-1], end))
    if len(steps) < MIN_STEPS:
        out.reason = f"its collectives repeat every {p} but fewer than {MIN_STEPS} whole times"
        return out
    out.steps, out.period = steps, p
    out.confidence = round(float(np.mean(sig[:-p] == sig[p:])), 2)
    return out


def main_threads(rank: np.ndarray, tid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> dict[int, str]:
    """Per rank, the host thread whose top-level events cover the most time."""
    out: dict[int, str] = {}
    cover: dict[tuple[int, str], int] = {}
    for r, t, d in zip(rank.tolist(), tid.tolist(), (ends - starts).tolist()):
        cover[(r, t)] = cover.get((r, t), 0) + d
    for (r, t), d in sorted(cover.items()):
        if r not in out or d > cover[(r, out[r])]:
            out[r] = t
    return out


def infer(con: Any, detail: str, ranks: list[int]) -> list[Inference]:
    """Infer the steps of ``ranks`` from the events in ``detail`` (a relation with ``rank``,
    ``device``, ``kind``, ``tid``, ``name``, ``start_ns``, ``dur_ns``): three queries for all the
    ranks, then each rank's numpy."""
    in_ranks = ", ".join(str(int(r)) for r in ranks)
    top = con.execute(top_level_sql(detail, ranks)).fetchnumpy()
    t_rank = np.asarray(top["rank"], dtype=np.int64)
    t_tid = np.asarray(top["tid"]).astype(str)
    t_s = np.asarray(top["s"], dtype=np.int64)
    t_e = np.asarray(top["e"], dtype=np.int64)
    t_name = np.asarray(top["name"]).astype(str)
    main = main_threads(t_rank, t_tid, t_s, t_e)
    # collectives: on the device where the rank has device collectives, else on the host
    comm = con.execute(
        f"""WITH c AS (SELECT rank, device, start_ns FROM {detail}
                   WHERE kind = 'comm' AND rank IN ({in_ranks}) AND start_ns IS NOT NULL)
        SELECT rank, start_ns FROM c WHERE device = (SELECT bool_or(device) FROM c c2 WHERE c2.rank = c.rank)
        ORDER BY rank, start_ns"""
    ).fetchnumpy()
    c_rank = np.asarray(comm["rank"], dtype=np.int64)
    c_s = np.asarray(comm["start_ns"], dtype=np.int64)
    # the sequence of collectives, for ranks whose operators do not repeat: the outermost host
    # collectives (their calls in order), else the device ones; one code per kind and size
    cols = {d[0] for d in con.execute(f"SELECT * FROM {detail} LIMIT 0").description}
    size = "coalesce(bytes, -1)" if "bytes" in cols else "-1"
    seq = con.execute(
        f"""WITH c AS (SELECT rank, device, CAST(tid AS VARCHAR) AS tid, name, {size} AS nbytes,
                          start_ns AS s, start_ns + dur_ns AS e FROM {detail}
                   WHERE kind = 'comm' AND rank IN ({in_ranks}) AND start_ns IS NOT NULL AND dur_ns >= 0),
        h AS (SELECT *, bool_or(NOT device) OVER (PARTITION BY rank) AS host FROM c),
        k AS (SELECT *, max(e) OVER (PARTITION BY rank, device, tid ORDER BY s, e DESC
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe
              FROM h WHERE device <> host)
        SELECT rank, name || '|' || nbytes AS sig, s, e, tid FROM k WHERE pe IS NULL OR s >= pe ORDER BY rank, s, e"""
    ).fetchnumpy()
    q_rank = np.asarray(seq["rank"], dtype=np.int64)
    q_sig = pd.factorize(np.asarray(seq["sig"]).astype(str))[0].astype(np.int64) if len(q_rank) else q_rank
    q_s = np.asarray(seq["s"], dtype=np.int64)
    q_e = np.asarray(seq["e"], dtype=np.int64)
    q_tid = np.asarray(seq["tid"]).astype(str)
    q_name = np.asarray(seq["sig"]).astype(str)
    extra: dict[int, np.ndarray] = {}
    if main:
        con.execute("CREATE OR REPLACE TEMP TABLE _main_tid (rank INTEGER, tid VARCHAR)")
        con.executemany("INSERT INTO _main_tid VALUES (?, ?)", sorted(main.items()))
        py = con.execute(
            f"""SELECT d.rank, d.start_ns FROM {detail} d JOIN _main_tid m ON d.rank = m.rank
                AND CAST(d.tid AS VARCHAR) = m.tid
            WHERE d.kind = 'python' AND NOT d.device AND d.start_ns IS NOT NULL ORDER BY d.rank, d.start_ns"""
        ).fetchnumpy()
        con.execute("DROP TABLE _main_tid")
        p_rank = np.asarray(py["rank"], dtype=np.int64)
        p_s = np.asarray(py["start_ns"], dtype=np.int64)
        for r in main:
            lo, hi = np.searchsorted(p_rank, [r, r + 1])
            extra[r] = p_s[lo:hi]
    res = []
    for rank in ranks:
        lo, hi = np.searchsorted(t_rank, [rank, rank + 1])
        sel = np.zeros(len(t_rank), dtype=bool)
        sel[lo:hi] = t_tid[lo:hi] == main.get(rank, "")
        clo, chi = np.searchsorted(c_rank, [rank, rank + 1])
        got = infer_rank(rank, t_name[sel], t_s[sel], t_e[sel], extra.get(rank, np.zeros(0, dtype=np.int64)),
                         c_s[clo:chi])
        qlo, qhi = np.searchsorted(q_rank, [rank, rank + 1])
        if not got.steps and qhi - qlo >= 2 * MIN_STEPS:
            threads = {str(t): (t_s[lo:hi][t_tid[lo:hi] == t], t_e[lo:hi][t_tid[lo:hi] == t])
                       for t in np.unique(t_tid[lo:hi])}
            opt = np.sort(t_s[lo:hi][np.char.startswith(t_name[lo:hi], OPTIMIZER_STEP)])
            by_comm = infer_from_collectives(rank, threads, q_sig[qlo:qhi], q_s[qlo:qhi], q_e[qlo:qhi],
                                             q_tid[qlo:qhi], q_name[qlo:qhi], opt)
            if by_comm.steps:
                got = by_comm
            else:
                got.reason += f"; {by_comm.reason}"
        res.append(got)
    return res
