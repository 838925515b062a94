"""Tell apart the runs whose traces lie in one directory.

A run is a set of rank traces that belong together. Two traces are of different runs when
their world sizes differ, or when they give the same rank over overlapping time ranges (one
process cannot be profiled twice at once). Traces of one rank that follow each other in time
with the same world size are profiler cycles of one run (``schedule(repeat=N)``) and stay
merged: that cannot be told from two runs days apart, so a trace that overlaps no other rank's
trace of its run is named in a warning instead (:func:`strays`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.ingest.base import one_line


@dataclass(frozen=True)
class Span:
    """One rank trace (a Kineto file, an Ascend rank export) and the time range of its events."""

    label: str  # its path
    rank: int
    world: int | None
    start: int  # ns
    end: int
    unit: Any = None  # the loader's Unit


def _overlap(a: Span, b: Span) -> int:
    return max(0, min(a.end, b.end) - max(a.start, b.start))


def _clash(a: Span, b: Span) -> bool:
    """Same rank over overlapping times (as :func:`advisor.ingest.base.overlapping_files` sees it)."""
    return a.rank == b.rank and a.start < b.end and b.start < a.end


def split_runs(spans: list[Span]) -> list[list[Span]]:
    """The runs among ``spans``, ordered by their earliest start (then path).

    World sizes first: traces that name none join the others when these name one world size,
    else they form a run of their own. Within a world size, traces are taken in time order,
    each into the run where its rank is free over its time range, preferring a run it overlaps
    in time, then one of its directory, then the one it overlaps most, then the nearest.
    """
    known = sorted({s.world for s in spans if s.world is not None})
    groups: dict[int | None, list[Span]] = {}
    for s in spans:
        key = s.world if len(known) > 1 else (known[0] if known else None)
        groups.setdefault(key, []).append(s)
    runs: list[list[Span]] = []
    for group in groups.values():
        runs += _by_time(group)
    runs.sort(key=lambda r: (min(s.start for s in r), min(s.label for s in r)))
    for r in runs:
        r.sort(key=lambda s: (s.rank, s.start, s.label))
    return runs


def _by_time(spans: list[Span]) -> list[list[Span]]:
    runs: list[list[Span]] = []
    ranks: list[dict[int, list[Span]]] = []  # per run: its spans by rank (the clash test looks at one rank's)
    for s in sorted(spans, key=lambda s: (s.start, s.label)):
        free = [i for i, by_rank in enumerate(ranks) if not any(_clash(s, t) for t in by_rank.get(s.rank, ()))]
        if not free:
            runs.append([])
            ranks.append({})
            best = len(runs) - 1
        elif len(free) == 1:  # the usual case: one run
            best = free[0]
        else:
            folder = Path(s.label).parent

            def preference(i: int, s: Span = s, folder: Path = folder) -> tuple[bool, bool, int, int]:
                run = runs[i]
                shared = sum(_overlap(s, t) for t in run)
                gap = max(0, min(t.start for t in run) - s.end, s.start - max(t.end for t in run))
                return shared > 0, any(Path(t.label).parent == folder for t in run), shared, -gap

            best = max(free, key=preference)  # the first of equals: the earlier run
        runs[best].append(s)
        ranks[best].setdefault(s.rank, []).append(s)
    return runs


def strays(run: list[Span]) -> list[Span]:
    """Traces of a run with several ranks that overlap no other rank's trace in time, while
    other traces of the run do overlap each other: most likely from another run. When no two
    ranks overlap at all, none is singled out (the loader says that of the whole profile)."""
    if len({s.rank for s in run}) < 2:
        return []
    alone = [s for s in run if not any(t.rank != s.rank and _overlap(s, t) > 0 for t in run)]
    return [] if len(alone) == len(run) else alone


NAMED_RUNS = 6
NAMED_PER_RUN = 4


def when(ns: int) -> str:
    """A time since the epoch in ns as UTC, to the second (or the number when out of range)."""
    try:
        return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


def describe(root: Path, runs: list[list[Span]]) -> str:
    """The one-line refusal: each run with its world size, start and files (paths relative to ``root``)."""
    def name(label: str) -> str:
        try:
            return one_line(Path(label).relative_to(root), 120)
        except ValueError:
            return one_line(label, 120)

    parts = []
    for i, run in enumerate(runs[:NAMED_RUNS], 1):
        labels = sorted({s.label for s in run})
        files = ", ".join(name(x) for x in labels[:NAMED_PER_RUN])
        if len(labels) > NAMED_PER_RUN:
            files += f" and {len(labels) - NAMED_PER_RUN} more"
        world = next((s.world for s in run if s.world is not None), None)
        ws = f"world size {world}, " if world is not None else ""
        n = len({s.rank for s in run})
        parts.append(f"run {i} ({ws}{n} rank{'s' * (n != 1)}, from {when(min(s.start for s in run))}): {files}")
    more = f"; and {len(runs) - NAMED_RUNS} more runs" if len(runs) > NAMED_RUNS else ""
    return (f"{one_line(root)}: {len(runs)} runs in one directory (traces with different world sizes, or giving one "
            f"rank over overlapping times): " + "; ".join(parts) + more + "; analyse one with --run N")
