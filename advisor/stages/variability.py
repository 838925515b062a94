"""The variability stage: :mod:`advisor.variability`'s model run on an analysis, once.

It reads the breakdown rows and the small tables (``op_step_stats``, ``comm_ops``,
``comm_matrix``), never ``events``: on a cluster those stay inside each rank's map.
"""

from __future__ import annotations

from typing import Any

from advisor import variability

KEY = "variability"  # the analysis' extras key (the VAR rules' ``ctx.once`` shares it)


def compute(ctx: Any) -> dict[str, Any] | None:
    """The report's ``variability`` object for an analysis context."""
    ctx.ensure_derived(["op_step_stats"])
    return variability.compute(ctx.breakdown, ctx.df, ctx.extras.setdefault(variability.CELLS_KEY, {}),
                               _empty(ctx, ("comm_ops", "comm_matrix")))


def _empty(ctx: Any, tables: tuple[str, ...]) -> list[str]:
    """Those of ``tables`` the context knows to hold no row (its cached counts; a table it lacks is
    not said empty: the query that reads it says what it says)."""
    out = []
    for name in tables:
        try:
            n = ctx.rows(name)
        except Exception:  # noqa: BLE001 -- no such table here
            n = None
        if n == 0:
            out.append(name)
    return out


def of(ctx: Any) -> dict[str, Any] | None:
    """:func:`compute` once per analysis (the report and the VAR rules share it)."""
    if KEY not in ctx.extras:
        ctx.extras[KEY] = compute(ctx)
    return ctx.extras[KEY]  # type: ignore[no-any-return]
