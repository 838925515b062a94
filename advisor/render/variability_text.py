"""Plain-text pieces of the report's "Variability" section, shared by the renderers (no markup here:
each renderer escapes what it takes from the profile)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from advisor.render.view import fmt_us, short_name

STEADY = 0.01  # a step whose p95 is within this share of its median is called steady


def op_label(op: Mapping[str, Any], limit: int | None = None) -> str:
    """``AllReduce in group X`` for a collective, the operator name otherwise (unescaped); the name
    shortened to ``limit`` characters (:func:`~advisor.render.view.short_name`) when given."""
    name = str(op.get("name") or "")
    if limit is not None:
        name = short_name(name, limit)
    if op.get("kind") == "comm" and op.get("group"):
        return f"{name} in group {op['group']}"
    return name


def share(op: Mapping[str, Any]) -> float | None:
    """The operator's contribution: its parallel share where ranks were composed, else its series share."""
    v = op.get("parallel_share", op.get("series_share"))
    return None if v is None else float(v)


def shares_known(v: Mapping[str, Any]) -> bool:
    """Whether the report estimated what makes steps vary (too few steps: every share is unknown,
    and the renderers leave the table out)."""
    return any(share(o) is not None for o in v.get("ops") or [])


def pct(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{100.0 * x:.{digits}f} %"


def summary(v: Mapping[str, Any]) -> list[str]:
    """Sentences: spread of the step, the main contributor, the prediction at the largest scale."""
    out: list[str] = []
    st = v.get("step_time") or {}
    if st.get("p50_us"):
        spread = st["p95_us"] / st["p50_us"] - 1.0 if st["p50_us"] else 0.0
        out.append(f"Step time over {st.get('n', v.get('steps'))} steps (slowest rank of {v.get('ranks')}): "
                   f"p5 {fmt_us(st.get('p5_us'))}, median {fmt_us(st['p50_us'])}, p95 {fmt_us(st.get('p95_us'))} "
                   f"(+{100 * spread:.1f} % over the median), sigma {fmt_us(st.get('sigma_us'))}.")
    ops = v.get("ops") or []
    spread = st["p95_us"] / st["p50_us"] - 1.0 if st.get("p50_us") and st.get("p95_us") else 0.0
    if st.get("p50_us") and spread < STEADY:
        out.append(f"The step time is steady: its p95 is within {STEADY:.0%} of its median.")
    elif ops and v.get("steps", 0) >= 2 and share(ops[0]) is not None and (share(ops[0]) or 0) > 0:
        what = "the step-time variance across steps and ranks" if "parallel_share" in ops[0] else \
            "the step-time variance across steps"
        lead = "Most" if (share(ops[0]) or 0) >= 0.5 else "The largest part"
        out.append(f"{lead} of {what} comes from {op_label(ops[0], 90)} ({ops[0].get('kind')}): "
                   f"{pct(share(ops[0]))} of it goes away when it is held at its median.")
    rows = (v.get("prediction") or {}).get("rows") or []
    if rows:
        last = rows[-1]
        base = (v.get("prediction") or {}).get("baseline_us") or 0.0
        grow = last["p50_us"] / base - 1.0 if base else 0.0
        out.append(f"At {last['scale']}x the ranks ({last['ranks']}): median step {fmt_us(last['p50_us'])} "
                   f"({grow * 100:+.1f} % vs today's median), expected {fmt_us(last['mean_us'])}, "
                   f"P(step > +10 %) = {pct(last.get('p_slowdown_10'))}"
                   + (" (tail beyond the measured range: a lower bound)" if last.get("extrapolated") else "") + ".")
    return out
