"""Text of the parallel groups and the ranks x steps picture (report fields ``parallel_groups`` and
``step_matrix``, :mod:`advisor.stages.groups`) for the Markdown and terminal reports."""

from __future__ import annotations

from typing import Any

from advisor.render import view


def summary(d: dict[str, Any]) -> str | None:
    """One paragraph (plain text, no profile string) on the parallel groups and the ranks x steps
    picture of a report dict, for the Markdown and terminal reports; None when it has neither."""
    pg = d.get("parallel_groups") or {}
    sm = d.get("step_matrix") or {}
    parts: list[str] = []
    layout = pg.get("layout") or {}
    if layout:
        kinds = ", ".join(f"{v['groups']} {k} group{'' if v['groups'] == 1 else 's'} of "
                          f"{'/'.join(str(x) for x in v['sizes'])}" for k, v in layout.items())
        text = f"Parallel groups (inferred from the traffic): {kinds}"
        if pg.get("stages"):
            text += f"; {len(pg['stages'])} pipeline stages"
        n_bad = len(pg.get("mismatches") or [])
        if n_bad:
            text += f"; {n_bad} group{'' if n_bad == 1 else 's'} disagree with the export's names (see warnings)"
        parts.append(text + ".")
    scope = view.scope_line(d)
    if scope:
        parts.append(scope + (" (the picture in the HTML report covers every rank and step)." if sm.get("rows") else "."))
    elif sm.get("rows"):
        worst = sm.get("worst") or []
        text = (f"Ranks x steps ({sm.get('ranks')} ranks, {len(sm.get('steps') or [])} steps"
                + (f", rows by {sm['aggregated_by']} group" if sm.get("aggregated_by") else "")
                + f"): own time per step against the median of {float(sm.get('median_own_us') or 0) / 1000:.2f} ms")
        if worst:
            text += "; slowest cells " + ", ".join(f"rank {w['rank']} step {w['step']} ({w['slowdown']:.2f}x)"
                                                   for w in worst[:3])
        parts.append(text + " (picture in the HTML report).")
    return " ".join(parts) or None
