"""The inter-operator stages in their order, and the focus they report on.

One sequence for every caller (a shard's map, a context built in one piece): the breakdown of
every step, the focus (rank, step) chosen from it, the critical path of the focus. The functions
take the analysis context by duck typing (``con``, ``ranks``, ``path``, ``breakdown``,
``focus_rank``, ``focus_step``, ``critical_path``): the stages sit below the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from advisor.config import ConfigError
from advisor.model import Warning_
from advisor.schema import NO_STEP
from advisor.text import spans

CPU_ONLY = ("CPU-only trace (no device events): device idle, communication overlap and roofline analyses "
            "do not apply; the breakdown treats host operators as compute (see README)")


class FocusError(ConfigError):
    """``--rank`` / ``--step`` name a rank or step the profile does not have (a usage error)."""


def check_focus(ctx: Any, rank: int | None, step: int | None) -> None:
    """``--rank`` / ``--step`` exist in the loaded profile (the step on the focused rank), else
    :class:`FocusError` listing what does."""
    where = ctx.path
    if rank is not None and rank not in ctx.ranks:
        noun = "rank" if len(ctx.ranks) == 1 else "ranks"
        raise FocusError(f"--rank {rank}: {where} has {noun} {spans(ctx.ranks)}" if ctx.ranks else
                         f"--rank {rank}: {where} has no ranks")
    if step is None:
        return
    rows = ctx.con.cursor().execute("SELECT DISTINCT rank, step FROM steps").fetchall()
    have = sorted({int(s) for r, s in rows if (rank is None or r == rank) and s != NO_STEP})
    if step in have:
        return
    what = f"--rank {rank} --step {step}" if rank is not None else f"--step {step}"
    owner = f"rank {rank} of {where}" if rank is not None else where
    if have:
        raise FocusError(f"{what}: {owner} has step{'s' if len(have) > 1 else ''} {spans(have)}")
    marked = "no step windows" if not rows else "no step markers (ProfilerStep#N): the whole trace is one window"
    raise FocusError(f"{what}: {owner} has {marked}")


def choose_focus(ctx: Any, rank: int | None, step: int | None) -> tuple[int | None, int | None]:
    """The (rank, step) whose critical path is reported.

    Default: the rank with the longest median step (the one the others wait for), and on it
    the step whose time is the median (representative, not a warm-up or a spike). With a step
    and no rank: the rank whose time at that step is the longest.
    """
    bd = ctx.breakdown
    if bd is None or bd.empty:
        return rank, step
    if rank is None and step is not None and (bd["step"] == step).any():
        at = bd[bd["step"] == step]
        rank = int(at.loc[at["step_us"].idxmax(), "rank"])
    if rank is None:
        med = bd.groupby("rank")["step_us"].median()
        rank = int(med.idxmax())
    rows = bd[bd["rank"] == rank].sort_values("step_us")
    if rows.empty:
        return rank, step
    if step is None:
        step = int(rows.iloc[(len(rows) - 1) // 2]["step"])
    return rank, step


def empty_path(rank: int | None, step: int | None) -> dict[str, Any]:
    """The critical path of a focus that has none (no steps, no window)."""
    return {"rank": rank, "step": None if step in (None, NO_STEP) else step, "length_us": 0.0, "ops": []}


def critical_path_of(ctx: Any, warnings: list[Warning_]) -> dict[str, Any]:
    """The critical path of the focus (rank, step); a warning it gives goes to ``warnings``."""
    rank, step = ctx.focus_rank, ctx.focus_step
    if rank is None or step is None:
        return empty_path(rank, step)
    win = ctx.con.cursor().execute("SELECT start_ns, end_ns FROM steps WHERE rank = ? AND step = ?", [rank, step]).fetchone()
    if not win:
        return empty_path(rank, step)
    from advisor.stages import critical_path as cp_stage

    cp = cp_stage.compute(ctx.con, rank, step, int(win[0]), int(win[1]))
    if cp.get("note"):
        warnings.append(Warning_("critical_path_no_links", f"critical path (rank {rank}): {cp['note']}"))
    if cp["step"] == NO_STEP:
        cp["step"] = None
    return cp


def _may_hold(ctx: Any, table: str) -> bool:
    """False when ``ctx`` knows ``table`` to hold no row (its cached row counts), else True."""
    try:
        return bool(ctx.rows(table))
    except Exception:  # noqa: BLE001 -- a context without counts or without the table: read it
        return True


def run_stages(ctx: Any, rank: int | None, step: int | None, *, warnings: list[Warning_],
               path_warnings: list[Warning_], progress: Callable[[str, int, int], None] | None = None) -> None:
    """The breakdown, the focus and its critical path, set on ``ctx``; the breakdown's warnings go
    to ``warnings``, the critical path's to ``path_warnings``.

    A ``rank`` asked for that ``ctx`` does not hold (a shard of other ranks) gives no focus and no
    critical path here: the shard that holds it gives them."""
    from advisor.stages import breakdown as breakdown_stage

    bd = breakdown_stage.compute(ctx.con)
    breakdown_stage.store(ctx.con, bd)
    ctx.breakdown = bd
    if _may_hold(ctx, "vendor_steps"):  # the exporter's own step table, to compare the breakdown with
        warnings.extend(Warning_(code, msg) for code, msg in breakdown_stage.vendor_check(ctx.con, bd))
    if rank is not None and rank not in ctx.ranks:
        ctx.focus_rank, ctx.focus_step = None, None
        ctx.critical_path = None
        return
    ctx.focus_rank, ctx.focus_step = choose_focus(ctx, rank, step)
    if progress:
        progress("critical path", 0, 1)
    ctx.critical_path = critical_path_of(ctx, path_warnings)
