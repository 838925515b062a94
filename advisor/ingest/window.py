"""What a profile window holds besides the steady state: one-time phases and stub steps.

A profile window is not always a steady training loop. Its first step may hold the process's
set-up (CUDA context creation, module loading, the caching allocator's first ``cudaMalloc`` /
``cudaFree``, cuDNN / cuBLAS handles, compilation, DataLoader workers starting), it may capture
CUDA / HIP graphs, and the profiler may cut its first or last step short. None of that is what
every step of the job costs, so it is left out of every per-step figure: the steps holding it lose
their row in ``steps`` (their events keep ``step = NULL``, like events outside every window), and
a one-window trace (no step) starts after the one-time work it holds. ``window_phases`` keeps
what was found and the warnings say it with its cost.

One-time work, per rank (host events):

* a call of a family declared one-time (``one_time.toml`` beside this module: module loads,
  context and handle creation, compilation, worker start-up, graph capture), unless its name runs
  in :data:`RECURS` of the steps or more (a recompile every step is the steady state);
* a runtime call at least :data:`SLOW_FACTOR` x the median of the same call on the rank and at
  least :data:`FLOOR_NS`, *early* (before the end of the rank's first step, or in the first half
  of a one-window trace), when no call of that name is that slow later: the first call of an API
  paying for lazy set-up (a kernel's first launch loads its module; the allocator's first
  ``cudaFree`` creates the context);
* the rank's first runtime call, when it takes at least :data:`CONTEXT_NS` (context creation
  happens in whichever CUDA call comes first, e.g. ``cudaDeviceGetStreamPriorityRange``);
* with steps, a runtime call of at least :data:`FLOOR_NS` made early under a name that never runs
  again from the second step on (a burst of allocator set-up in the first step only).

A step is left out when one-time work covers at least :data:`STEP_SHARE` of the rank's median
step in it, or when it overlaps a graph capture phase. A *stub* step (the window cut it short) is
the first or last step of a run of consecutive steps, shorter than :data:`STUB_RATIO` x the
median of the rank's other steps (at least :data:`STUB_MIN_STEPS` steps): never a step of a
statistic, nor the one the critical path is drawn on. A rank keeps at least one step.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advisor.schema import NO_STEP
from advisor.text import spans

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: the declared one-time families and the labels of APIs whose slow early calls are set-up
ONE_TIME_FILE = Path(__file__).with_name("one_time.toml")
#: a call this many times its own median (on the rank) is far above it
SLOW_FACTOR = 20.0
#: shortest call (ns) that counts as one-time by timing alone
FLOOR_NS = 1_000_000
#: the rank's first runtime call holds context creation when it takes at least this long (ns)
CONTEXT_NS = 50_000_000
#: a declared one-time name that runs in at least this share of the steps is steady-state work
RECURS = 0.5
#: share of the rank's median step that one-time work must cover in a step for the step to be left out
STEP_SHARE = 0.05
#: a step at the edge of a run shorter than this share of the rank's median step is a stub
STUB_RATIO = 0.5
#: steps a rank needs for a stub to be told from a short step
STUB_MIN_STEPS = 3
#: ``window_phases.kind`` of a step left out, by why
STEP_KINDS = {"one_time": "warmup_step", "capture": "capture_step", "stub": "stub_step"}
#: a capture phase reaching this close to the window's end (share of the window) leaves no replay to judge
MIN_LEFT = 0.2
#: ``window_phases.kind`` of a rank whose device activity the trace does not give as the advisor models it:
#: an accelerator's own event category read as its kernels but not modelled (MTIA command-processor events), a
#: CUPTI range-profiler capture (kernels replayed for their counters, none recorded), or kernel launches with no
#: device activity recorded. Rules that judge the host by the device's idleness skip these ranks.
DEVICE_GAP_KINDS = ("device_unmodelled", "range_profiler", "device_not_recorded")
#: device event categories of accelerators Kineto records whose timeline the advisor does not model
UNMODELLED_DEVICE_CATS = ("mtia_ccp_events",)
#: host runtime calls that queue device work (kernel or graph launches of CUDA, ROCm, MTIA, XPU, driver API)
LAUNCH_RE = r"(?i)launch"


@dataclass(frozen=True)
class Family:
    """A declared one-time API family."""

    what: str
    prefixes: tuple[str, ...]
    capture: bool = False


@lru_cache(maxsize=1)
def declared() -> tuple[tuple[Family, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """The one-time families and the labels of ``one_time.toml``."""
    doc = tomllib.loads(ONE_TIME_FILE.read_text(encoding="utf-8"))
    fams = tuple(Family(str(f["what"]), tuple(str(p) for p in f["prefixes"]), bool(f.get("capture", False)))
                 for f in doc.get("one_time", []))
    labels = tuple((str(k), tuple(str(p) for p in v)) for k, v in doc.get("labels", {}).items())
    return fams, labels


def _regex(prefixes: list[str]) -> str:
    return "^(" + "|".join(re.escape(p) for p in prefixes) + ")"


def label(name: str) -> str:
    """What a one-time call of ``name`` is doing ('' when no family or label says)."""
    fams, labels = declared()
    for f in fams:
        if name.startswith(f.prefixes):
            return f.what
    for what, prefixes in labels:
        if name.startswith(prefixes):
            return what
    return ""


def _union_ns(iv: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(iv):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _fmt(ns: float) -> str:
    us = ns / 1000.0
    if us >= 5e5:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} µs"


def _steps_text(steps: list[int]) -> str:
    s = sorted(steps)
    return ("step " if len(s) == 1 else "steps ") + ", ".join(str(x) for x in s[:8]) + (" ..." if len(s) > 8 else "")


@dataclass
class RankWindow:
    """What one rank's window holds (filled by :func:`review`)."""

    rank: int
    one_time: pd.DataFrame  # name, start_ns, end_ns, what
    capture: tuple[int, int] | None = None
    left_out: dict[int, str] | None = None  # step -> 'one_time' | 'capture' | 'stub'
    trimmed_to: int | None = None


def _candidates(con: Any) -> pd.DataFrame:
    """Host events that may be one-time work: declared families, and runtime calls of at least
    FLOOR_NS with their name's median, count and last start on the rank."""
    fams, _ = declared()
    rx = _regex([p for f in fams for p in f.prefixes])
    return con.execute(  # type: ignore[no-any-return]
        f"""WITH c AS (
            SELECT rank, step, name, kind::VARCHAR AS kind, start_ns, dur_ns, regexp_matches(name, $rx) AS declared
            FROM events
            WHERE NOT device AND dur_ns IS NOT NULL AND start_ns IS NOT NULL
              AND ((kind = 'runtime' AND dur_ns >= {FLOOR_NS})
                   OR (kind NOT IN ('step', 'python') AND regexp_matches(name, $rx)))
        ),
        n AS (
            SELECT e.rank, e.name, median(e.dur_ns) AS med_ns, count(*) AS calls
            FROM events e SEMI JOIN (SELECT DISTINCT rank, name FROM c) k ON e.rank = k.rank AND e.name = k.name
            WHERE NOT e.device AND e.kind = 'runtime' GROUP BY ALL
        )
        SELECT c.*, n.med_ns, coalesce(n.calls, 0) AS calls FROM c LEFT JOIN n USING (rank, name)
        ORDER BY rank, start_ns""",
        {"rx": rx},
    ).df()


def _first_runtime(con: Any) -> dict[int, tuple[str, int, int]]:
    """Each rank's first runtime call: (name, start, duration)."""
    rows = con.execute(
        """SELECT rank, arg_min(name, start_ns), min(start_ns), arg_min(dur_ns, start_ns)
        FROM events WHERE NOT device AND kind = 'runtime' AND start_ns IS NOT NULL GROUP BY rank"""
    ).fetchall()
    return {int(r): (str(n), int(s), int(d)) for r, n, s, d in rows}


def _later_names(con: Any, after: dict[int, int]) -> set[tuple[int, str]]:
    """(rank, name) of runtime calls starting at or after ``after[rank]``."""
    if not after:
        return set()
    ranks, times = zip(*sorted(after.items()), strict=True)
    rows = con.execute(
        """SELECT DISTINCT e.rank, e.name FROM events e
        JOIN (SELECT unnest($ranks::INTEGER[]) AS rank, unnest($times::BIGINT[]) AS t) a ON e.rank = a.rank
        WHERE NOT e.device AND e.kind = 'runtime' AND e.start_ns >= a.t""",
        {"ranks": list(ranks), "times": list(times)},
    ).fetchall()
    return {(int(r), str(n)) for r, n in rows}


def find(con: Any, steps: pd.DataFrame | None = None,
         first: dict[int, tuple[str, int, int]] | None = None) -> dict[int, RankWindow]:
    """The one-time work and capture phase of every rank (see the module doc); steps untouched.
    ``steps``: the ``steps`` rows (rank, step, start_ns, end_ns ...) in (rank, start_ns, step)
    order, and ``first``: :func:`_first_runtime`, when read already."""
    if steps is None:
        steps = con.execute("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, start_ns, step").df()
    return _find(con, steps, first)


def _find(con: Any, steps: Any, first: dict[int, tuple[str, int, int]] | None) -> dict[int, RankWindow]:
    """:func:`find` once the steps are read."""
    cand = _candidates(con)
    if first is None:
        first = _first_runtime(con)
    fams, _ = declared()
    capture_rx = re.compile(_regex([p for f in fams if f.capture for p in f.prefixes]))
    n_steps_of = {int(r): int(n) for r, n in steps[steps["step"] != NO_STEP].groupby("rank").size().items()}
    early: dict[int, int] = {}
    second: dict[int, int] = {}
    for rank, s in steps.groupby("rank", sort=True):
        rank = int(rank)
        if len(s) == 1 and int(s["step"].iloc[0]) == NO_STEP:
            a, b = int(s["start_ns"].iloc[0]), int(s["end_ns"].iloc[0])
            early[rank] = a + (b - a) // 2
        else:
            early[rank] = int(s["end_ns"].iloc[0])
            if len(s) > 1:
                second[rank] = int(s["start_ns"].iloc[1])
    later = _later_names(con, second)
    out: dict[int, RankWindow] = {}
    for rank in sorted(set(early)):
        c = cand[cand["rank"] == rank] if len(cand) else cand
        rows: list[tuple[str, int, int, str]] = []
        cap: list[tuple[int, int]] = []
        if len(c):
            med = c["med_ns"].astype(float).fillna(0.0)
            slow = (c["kind"] == "runtime") & (c["calls"] >= 3) & (c["dur_ns"] >= SLOW_FACTOR * med)
            # a name slow after the early part is slow at steady state: none of its calls is one-time
            recurring = set(c.loc[slow & (c["start_ns"] >= early[rank]), "name"])
            n_steps = n_steps_of.get(rank, 0)
            if n_steps > 1:
                per = c[c["declared"]].groupby("name")["step"].nunique()
                recurring |= set(per[per >= max(2, RECURS * n_steps)].index)
            r: Any
            for r in c.itertuples(index=False):
                name, s0, d = str(r.name), int(r.start_ns), int(r.dur_ns)
                if r.declared and name not in recurring:
                    if capture_rx.match(name):
                        cap.append((s0, s0 + d))
                        continue
                    rows.append((name, s0, s0 + d, label(name)))
                    continue
                # timing tells a first step only from others: one marked step has none to compare
                if r.kind != "runtime" or s0 >= early[rank] or name in recurring or n_steps == 1:
                    continue
                calls = int(r.calls)
                is_slow = bool(calls >= 3 and d >= SLOW_FACTOR * float(r.med_ns or 0))
                only_early = rank in second and (rank, name) not in later
                is_first = (rank in first and first[rank][1] == s0 and first[rank][0] == name and d >= CONTEXT_NS
                            and (calls < 3 or is_slow))
                if is_slow or only_early or is_first:
                    what = label(name) or ("context creation (the first runtime call)" if is_first else "")
                    rows.append((name, s0, s0 + d, what or "first-call set-up"))
        df = pd.DataFrame(rows, columns=["name", "start_ns", "end_ns", "what"])
        win = RankWindow(rank, df)
        if cap:
            win.capture = (min(a for a, _ in cap), max(b for _, b in cap))
        if len(df) or win.capture:
            out[rank] = win
    return out


def _left_out(steps: pd.DataFrame, win: RankWindow | None) -> dict[int, str]:
    """Steps of one rank (marked or inferred, in time order) to leave out, and why."""
    out: dict[int, str] = {}
    dur = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.int64)
    med = float(np.median(dur)) if len(dur) else 0.0
    if win is not None:
        for st, a, b in zip(steps["step"].tolist(), steps["start_ns"].tolist(), steps["end_ns"].tolist()):
            if win.capture and a < win.capture[1] and b > win.capture[0]:
                out[int(st)] = "capture"
                continue
            if len(win.one_time):
                inside = win.one_time[(win.one_time["start_ns"] >= a) & (win.one_time["start_ns"] < b)]
                iv = [(int(s), min(int(e), int(b))) for s, e in zip(inside["start_ns"], inside["end_ns"])]
                if iv and _union_ns(iv) >= STEP_SHARE * med:
                    out[int(st)] = "one_time"
    keep = [k for k in range(len(steps)) if int(steps["step"].iloc[k]) not in out]
    if len(keep) >= STUB_MIN_STEPS:
        kd = dur[keep]
        ops = steps["ops"].to_numpy(dtype=np.int64)[keep]
        nums = steps["step"].to_numpy()[keep]
        for j, k in enumerate(keep):
            edge = (j == 0 or nums[j - 1] != nums[j] - 1 or j == len(keep) - 1 or nums[j + 1] != nums[j] + 1)
            # cut short: much shorter than the others and holding much less of their work (a step that
            # is short because it does less, with small inputs, runs the same host events)
            if (edge and dur[k] < STUB_RATIO * float(np.median(np.delete(kd, j)))
                    and ops[j] < STUB_RATIO * float(np.median(np.delete(ops, j)))):
                out[int(nums[j])] = "stub"
    if len(out) >= len(steps):  # a rank keeps at least one step: the longest of those left
        keep_one = int(steps["step"].iloc[int(np.argmax(dur))])
        out.pop(keep_one, None)
    return out


def device_gaps(con: Any) -> list[tuple[Any, ...]]:
    """``window_phases`` rows (kind in :data:`DEVICE_GAP_KINDS`, the reason in ``names``) of the
    ranks whose device activity is absent or not modelled, at most one per rank."""
    return _gaps_and_first_runtime(con)[0]


def _gaps_and_first_runtime(con: Any) -> tuple[list[tuple[Any, ...]], dict[int, tuple[str, int, int]]]:
    """:func:`device_gaps` and :func:`_first_runtime`, from one pass over the events."""
    cats = ", ".join(f"'{c}'" for c in UNMODELLED_DEVICE_CATS)
    runtime = "NOT device AND kind = 'runtime' AND start_ns IS NOT NULL"
    rows = con.execute(
        f"""SELECT rank,
               count(*) FILTER (WHERE device AND kind IN ('kernel', 'comm', 'memcpy', 'memset')) AS dev,
               count(*) FILTER (WHERE device AND lower(cat) IN ({cats})) AS unmodelled,
               count(*) FILTER (WHERE lower(cat) = 'cuda_profiler_range') AS ranges,
               count(*) FILTER (WHERE NOT device AND kind IN ('runtime', 'sync')
                                AND regexp_matches(name, $launch)) AS launches,
               min(start_ns) AS a, max(start_ns + dur_ns) AS b,
               arg_min(name, start_ns) FILTER (WHERE {runtime}), min(start_ns) FILTER (WHERE {runtime}),
               arg_min(dur_ns, start_ns) FILTER (WHERE {runtime})
        FROM events GROUP BY rank ORDER BY rank""", {"launch": LAUNCH_RE}).fetchall()
    first = {int(r[0]): (str(r[7]), int(r[8]), int(r[9])) for r in rows if r[8] is not None}
    out: list[tuple[Any, ...]] = []
    for rank, dev, unmodelled, ranges, launches, a, b, *_first in rows:
        if unmodelled:
            kind, n = "device_unmodelled", int(unmodelled)
            why = (f"the trace's device activity is an accelerator's own event category "
                   f"({', '.join(UNMODELLED_DEVICE_CATS)}, {n:,} events) that advisor reads as kernels but does not "
                   "model (its queues, copies and idleness are not those of a CUDA stream): no host-bound or "
                   "host-device sync verdict is drawn from its gaps")
        elif ranges and not dev:
            kind, n = "range_profiler", int(ranges)
            why = (f"a CUPTI range-profiler capture ({n:,} cuda_profiler_range events, no kernel events): the "
                   "profiler replays each kernel to read its counters, so launches and syncs are slowed by the "
                   "replay and no device timeline exists; no host-bound or host-device sync verdict is drawn; "
                   "profile with activities=[CPU, CUDA] for the timeline")
        elif launches and not dev:
            kind, n = "device_not_recorded", int(launches)
            why = (f"the host launched device work ({n:,} launch calls) but no device activity was recorded "
                   "(the profiler ran without the CUDA / device activity, or the device trace was lost): this is "
                   "not a CPU-only run, and no host-bound or host-device sync verdict is drawn from the missing "
                   "device timeline; profile with activities=[CPU, CUDA]")
        else:
            continue
        a, b = int(a or 0), int(b or 0)
        out.append((int(rank), kind, None, a, b, max(b - a, 0), n, why, False))
    return out, first


def review(con: Any, warn: Callable[..., None]) -> None:
    """Leave one-time phases and stub steps out of every rank's steps; record them in
    ``window_phases`` and say so in warnings. Runs once the steps and the events' steps are set."""
    gaps, first = _gaps_and_first_runtime(con)
    if gaps:
        con.executemany("INSERT INTO window_phases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", gaps)
        by_kind: dict[str, list[tuple[int, str]]] = {}
        for g in gaps:
            by_kind.setdefault(g[1], []).append((g[0], g[7]))
        for kind, items in by_kind.items():
            ranks = sorted(r for r, _ in items)
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {spans(ranks)}"
            warn(kind, f"{who}: {items[0][1]}")
    steps = con.execute(
        """SELECT s.rank, s.step, s.start_ns, s.end_ns, s.inferred, coalesce(n.ops, 0) AS ops
        FROM steps s LEFT JOIN (
            SELECT rank, step, count(*) AS ops FROM events
            WHERE NOT device AND step IS NOT NULL AND kind NOT IN ('step', 'python') GROUP BY ALL
        ) n USING (rank, step) ORDER BY s.rank, s.start_ns, s.step""").df()
    if steps.empty:
        return
    found = find(con, steps, first)
    phases: list[tuple[Any, ...]] = []
    drops: list[tuple[int, int]] = []
    trims: list[tuple[int, int]] = []
    notes: dict[str, list[tuple[int, str]]] = {}
    for rank, s in steps.groupby("rank", sort=True):
        rank = int(rank)
        win = found.get(rank)
        s = s.reset_index(drop=True)
        one_window = len(s) == 1 and int(s["step"].iloc[0]) == NO_STEP
        if one_window:
            if win is None:
                continue
            a, b = int(s["start_ns"].iloc[0]), int(s["end_ns"].iloc[0])
            if win.capture and win.capture[1] >= b - MIN_LEFT * (b - a):
                # a capture phase to (nearly) the end: no replay to judge, nothing of it is steady state
                drops.append((rank, NO_STEP))
                win.left_out = {NO_STEP: "capture"}
                phases.append((rank, "capture_step", NO_STEP, a, b, b - a, None, None, True))
            else:
                # one-time work in the first half: the window starts after it (later work is said, kept)
                ends = [int(e) for st, e in zip(win.one_time["start_ns"], win.one_time["end_ns"])
                        if int(st) < a + (b - a) // 2] + ([win.capture[1]] if win.capture else [])
                cut = max(ends) if ends else a
                if a < cut < b:
                    trims.append((rank, cut))
                    win.trimmed_to = cut
        else:
            win_left = _left_out(s, win)
            if win is not None:
                win.left_out = win_left
            elif win_left:
                win = found[rank] = RankWindow(rank, pd.DataFrame(columns=["name", "start_ns", "end_ns", "what"]),
                                               left_out=win_left)
            drops += [(rank, st) for st in win_left]
            for st, why in win_left.items():
                row = s[s["step"] == st].iloc[0]
                phases.append((rank, STEP_KINDS[why], int(st), int(row["start_ns"]),
                               int(row["end_ns"]), int(row["end_ns"] - row["start_ns"]), None, None, True))
        if win is None:
            continue
        ot = win.one_time
        if len(ot):
            iv = list(zip(ot["start_ns"].astype(int), ot["end_ns"].astype(int)))
            cost = _union_ns(iv)
            by = ot.assign(d=ot["end_ns"] - ot["start_ns"]).groupby(["what", "name"])["d"].agg(["size", "sum"])
            by = by.sort_values("sum", ascending=False)
            names = "; ".join(f"{key[1]} ×{int(r['size'])} ({key[0]}, {_fmt(float(r['sum']))})"
                              for key, r in by.head(4).iterrows() if isinstance(key, tuple))
            excluded = bool(win.trimmed_to) or any(v == "one_time" for v in (win.left_out or {}).values()) \
                or _before_steps(s, iv, one_window)
            # kept in the figures and too small to matter in them: not said
            if excluded or cost >= STEP_SHARE * float((s["end_ns"] - s["start_ns"]).median()):
                phases.append((rank, "one_time", None, int(min(a for a, _ in iv)), int(max(b for _, b in iv)),
                               int(cost), len(ot), names[:2000], excluded))
                where = _where(win, s, one_window, iv)
                notes.setdefault("one_time_phase", []).append(
                    (rank, (f"the window includes {_fmt(cost)} of one-time set-up ({names}){where}; profile after "
                            "warm-up (torch.profiler.schedule(wait=1, warmup=1, active=N) skips the first steps)")))
        if win.capture:
            a, b = win.capture
            phases.append((rank, "capture", None, int(a), int(b), int(b - a), None, None, True))
            span = s["end_ns"].max() - s["start_ns"].min()
            whole = (b - a) >= (1 - MIN_LEFT) * span or (one_window and not win.trimmed_to)
            what = ("the window is a CUDA/HIP graph capture phase (stream capture / graph instantiation over "
                    f"{_fmt(b - a)}): a one-time phase with nothing to tune at run time; "
                    + ("it holds no replay to judge; profile the replay (cudaGraphLaunch / hipGraphLaunch) instead"
                       if whole else "it is left out and only the replay after it is judged"))
            notes.setdefault("graph_capture", []).append((rank, what))
        stubs = sorted(st for st, why in (win.left_out or {}).items() if why == "stub")
        if stubs:
            dur = (s["end_ns"] - s["start_ns"])
            med = float(dur[~s["step"].isin(win.left_out or {})].median())
            shorts = ", ".join(_fmt(float(dur[s["step"] == st].iloc[0])) for st in stubs)
            notes.setdefault("stub_step", []).append(
                (rank, (f"{_steps_text(stubs)} cut short by the profile window ({shorts} against a median step of "
                        f"{_fmt(med)}): left out of every per-step figure and of the critical path")))
    _apply(con, drops, trims)
    if phases:
        con.executemany("INSERT INTO window_phases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", phases)
    for code, items in notes.items():
        for rank, text in items[:8]:
            warn(code, f"rank {rank}: {text}")
        if len(items) > 8:
            warn(code, f"{len(items) - 8} more ranks: the same ({code.replace('_', ' ')})")


def _before_steps(s: pd.DataFrame, iv: list[tuple[int, int]], one_window: bool) -> bool:
    return not one_window and all(b <= int(s["start_ns"].min()) for _, b in iv)


def _where(win: RankWindow, s: pd.DataFrame, one_window: bool, iv: list[tuple[int, int]]) -> str:
    if one_window:
        if win.trimmed_to:
            return (f"; the window starts after it, {_fmt(win.trimmed_to - int(s['start_ns'].iloc[0]))} in, "
                    "so it is in no figure")
        return "; it runs inside the only window (no step markers), so the figures include it"
    gone = sorted(st for st, why in (win.left_out or {}).items() if why == "one_time")
    if gone:
        return f"; {_steps_text(gone)} holding it left out of every per-step figure"
    if _before_steps(s, iv, one_window):
        return "; before the first step, so in no per-step figure"
    return "; kept in the figures"


def _apply(con: Any, drops: list[tuple[int, int]], trims: list[tuple[int, int]]) -> None:
    """Delete the dropped steps and trim the one windows; events, kernels and comm_ops of what
    was left out lose their step."""
    if drops:
        con.execute("CREATE OR REPLACE TEMP TABLE _win_drop (rank INTEGER, step INTEGER)")
        con.executemany("INSERT INTO _win_drop VALUES (?, ?)", drops)
        con.execute("DELETE FROM steps WHERE (rank, step) IN (SELECT (rank, step) FROM _win_drop)")
        for table in ("events", "kernels", "comm_ops"):
            con.execute(f"UPDATE {table} SET step = NULL WHERE step IS NOT NULL AND rank IN (SELECT rank FROM _win_drop) "
                        "AND (rank, step) IN (SELECT (rank, step) FROM _win_drop)")
        con.execute("DROP TABLE _win_drop")
    for rank, cut in trims:
        con.execute("UPDATE steps SET start_ns = greatest(start_ns, ?), host_start_ns = greatest(host_start_ns, ?) "
                    f"WHERE rank = ? AND step = {NO_STEP}", [cut, cut, rank])
        for table in ("events", "kernels", "comm_ops"):
            con.execute(f"UPDATE {table} SET step = NULL WHERE rank = ? AND step = {NO_STEP} AND start_ns < ?",
                        [rank, cut])
