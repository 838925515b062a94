"""SQL building blocks shared by the CPU and I/O rules (not a rule module: the name starts with ``_``).

Every fragment is plain SQL over the canonical tables; values still reach queries only as
``$named`` parameters.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

import pandas as pd


def top_level_ops(where: str = "true") -> str:
    """CTE ``top_ops``: host operators not nested in another host operator on the same thread.

    An operator is top-level when no earlier-starting operator of the thread is still running.
    ``where`` may restrict the events further, by whole ranks only (nesting is per thread).
    """
    return f"""
top_ops AS (
    SELECT * FROM (
        SELECT e.rank, e.step, e.tid, e.name, e.start_ns, e.dur_ns, e.start_ns + e.dur_ns AS end_ns,
               max(e.start_ns + e.dur_ns) OVER (
                   PARTITION BY e.rank, e.pid, e.tid ORDER BY e.start_ns, e.dur_ns DESC
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM events e
        WHERE e.kind = 'host_op' AND NOT e.device AND e.step IS NOT NULL AND ({where})
    ) WHERE prev_end IS NULL OR prev_end <= start_ns
)"""


TOP_LEVEL_OPS = top_level_ops()


def outermost(cte: str, src: str) -> str:
    """A CTE ``cte`` keeping the rows of ``src`` (rank, pid, tid, start_ns, dur_ns, ...) not nested in another row of ``src`` on the same thread."""
    return f"""
{cte} AS (
    SELECT * EXCLUDE (prev_end) FROM (
        SELECT s.*, max(s.start_ns + s.dur_ns) OVER (
            PARTITION BY s.rank, s.pid, s.tid ORDER BY s.start_ns, s.dur_ns DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM {src} s
    ) WHERE prev_end IS NULL OR prev_end <= start_ns
)"""


OVERLAPPING_STEPS_SQL = """
SELECT count(*) AS n FROM (
    SELECT end_ns > lead(start_ns) OVER w OR start_ns = lead(start_ns) OVER w AS clash
    FROM steps WHERE start_ns IS NOT NULL WINDOW w AS (PARTITION BY rank ORDER BY start_ns)
) WHERE clash
"""


def step_join(ctx: Any, alias: str, col: str) -> str:
    """``JOIN steps s`` to rows ``alias`` (with ``rank``) whose ``col`` is at or after the window start.

    The query must also keep only ``alias.col < s.end_ns``. When no two windows of a rank overlap,
    the one holding a time is the one starting last before it: an ASOF join then gives the same rows
    as the range join, without comparing every row with every window of its rank.
    """
    kind = "JOIN" if ctx.scalar(OVERLAPPING_STEPS_SQL) else "ASOF JOIN"
    return f"{kind} steps s ON s.rank = {alias}.rank AND {alias}.{col} >= s.start_ns"


def covered_by_device_sql(intervals: str) -> str:
    """SQL over CTE ``intervals`` (id, rank, s, e) adding ``busy_ns``: how much of each interval the device was busy.

    Reads the shared ``device_busy`` periods (:mod:`advisor.engine.derived`).
    """
    return f"""
SELECT i.id, coalesce(sum(least(i.e, b.e) - greatest(i.s, b.s)) FILTER (WHERE b.s IS NOT NULL), 0) AS busy_ns
FROM {intervals} i LEFT JOIN device_busy b ON b.rank = i.rank AND b.s < i.e AND b.e > i.s
GROUP BY i.id"""


def step_table(ctx: Any) -> pd.DataFrame:
    """The breakdown as a DataFrame (rank, step, step_us, ...); empty when there is none."""
    bd: pd.DataFrame = ctx.breakdown()
    return bd


def steady_steps(steps: list[int]) -> list[int]:
    """Steps after the first recorded one when there are at least three (the first often holds one-off warm-up work)."""
    s = sorted(steps)
    return s[1:] if len(s) >= 3 else s


def fmt_ms(us: float) -> str:
    """µs -> '12.3 ms' (or '850 µs' below 1 ms)."""
    return f"{us / 1000:.1f} ms" if abs(us) >= 1000 else f"{us:.0f} µs"


def python_stack_sql(targets: str) -> str:
    """SQL: for each row of CTE ``targets`` (id, rank, pid, tid, start_ns, end_ns), the enclosing Python frames.

    Returns (id, frames) with frames ordered outermost first, joined by newlines. Uses
    ``python`` events on the same thread (Kineto ``with_stack`` / python tracer).
    """
    return f"""
SELECT t.id, string_agg(p.name, '\n' ORDER BY p.start_ns, p.dur_ns DESC) AS frames
FROM {targets} t JOIN events p ON p.rank = t.rank AND p.pid = t.pid AND p.tid = t.tid AND p.kind = 'python'
     AND NOT p.device AND p.name <> 'Python GC'
     AND p.start_ns <= t.start_ns AND p.start_ns + p.dur_ns >= t.end_ns
GROUP BY t.id"""


# a source frame as profilers write it: ``path/to/file.py(123): function`` (Kineto python_function events,
# the ``Call stack`` argument of torch / torch_npu operators)
_FRAME_RE = re.compile(r"^\s*(?P<file>[^()]+?\.py)\((?P<line>\d+)\): (?P<fn>.+?)\s*;?\s*$")
# the framework's own packages and widely installed model / training libraries: a frame in them is not where
# the user's code made the call (profilers write their paths relative to site-packages, so the name is all
# that tells them apart from the user's own packages)
_FRAMEWORK_PACKAGES = frozenset({"torch", "torch_npu", "torchair", "torchvision", "torchaudio", "mindspore",
                                 "triton", "functorch", "transformers", "accelerate", "deepspeed", "megatron",
                                 "apex", "lightning", "pytorch_lightning", "timm", "diffusers", "peft", "numpy",
                                 "tqdm"})
_LIBRARY_DIRS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen ")


def parse_frame(frame: str) -> tuple[str, int, str] | None:
    """``file.py(123): fn`` -> (file, 123, fn); None for anything else (``nn.Module: X``, ``<built-in ...>``)."""
    m = _FRAME_RE.match(frame)
    return (m["file"], int(m["line"]), m["fn"]) if m else None


def is_library_file(path: str) -> bool:
    """True for a file of the framework (torch, torch_npu, MindSpore ...), of the Python standard library
    (``threading.py``, ``contextlib.py`` ...) or of anything installed under site-packages.

    Profilers often write paths relative to their ``sys.path`` entry (``torch/nn/modules/module.py``), so
    the first path component names the package (or the standard-library module)."""
    p = path.replace("\\", "/")
    if any(d in p for d in _LIBRARY_DIRS):
        return True
    if p.startswith("/"):
        return False
    top = p.split("/", 1)[0].removesuffix(".py")
    return top in _FRAMEWORK_PACKAGES or top in sys.stdlib_module_names


def user_frame(frames: Iterable[str]) -> tuple[str, int, str] | None:
    """The innermost source frame of user code in ``frames`` (given innermost first): (file, line, function).

    Frames of the framework, the standard library and installed packages are skipped; without any user frame
    the innermost source frame is returned (still a place to look), None when no frame names a file."""
    parsed = [f for f in (parse_frame(x) for x in frames) if f is not None]
    return next((f for f in parsed if not is_library_file(f[0])), parsed[0] if parsed else None)


def fmt_source(frame: tuple[str, int, str] | None) -> str | None:
    """(file, line, fn) -> ``file:line (fn)``."""
    return None if frame is None else f"{frame[0]}:{frame[1]} ({frame[2]})"


def source_of(stack: str | None, python_frames: str | None) -> str | None:
    """Where user code made a call: from the recorded call stack (innermost first, as torch and torch_npu write
    it; one that starts at ``<module>`` is read the other way) when there is one, else from the enclosing Python
    frames (outermost first)."""
    if isinstance(stack, str) and stack.strip():
        frames = [f for f in stack.replace(";", "\n").splitlines() if f.strip()]
        if frames[0].rstrip("; ").endswith(": <module>") and not frames[-1].rstrip("; ").endswith(": <module>"):
            frames.reverse()  # written outermost first: the script's top level is always the outermost frame
        found = user_frame(frames)
        if found is not None:
            return fmt_source(found)
    if isinstance(python_frames, str) and python_frames:
        return fmt_source(user_frame(reversed([f for f in python_frames.split("\n") if f])))
    return None


def device_gaps(ctx: Any) -> dict[int, tuple[str, str]]:
    """Ranks whose device activity the trace does not give as advisor models it (an accelerator's own
    unmodelled event category, a CUPTI range-profiler capture, launches with no device activity recorded),
    with the reason (``window_phases``, :mod:`advisor.ingest.window`): no host-bound or sync verdict is drawn
    from their device's absence or gaps."""
    rows = ctx.query("SELECT rank, kind, names FROM window_phases WHERE kind IN "
                     "('device_unmodelled', 'range_profiler', 'device_not_recorded') ORDER BY rank")
    return {int(r["rank"]): (str(r["kind"]), str(r["names"] or "")) for r in rows}


def skip_device_gaps(ctx: Any, ranks: Iterable[int]) -> set[int]:
    """The ranks of ``ranks`` in :func:`device_gaps`, each said once in the rule's notes (undecided: why)."""
    gaps = device_gaps(ctx)
    skipped = sorted({int(r) for r in ranks} & set(gaps))
    by_kind: dict[str, list[int]] = {}
    for r in skipped:
        by_kind.setdefault(gaps[r][0], []).append(r)
    for rs in by_kind.values():
        who = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs[:8]))}" + (" ..." if len(rs) > 8 else "")
        ctx.warn(f"{who} not judged: {gaps[rs[0]][1].split(': ', 1)[0]}")
    return set(skipped)
