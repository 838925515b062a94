"""Figures every renderer shows, computed once from the JSON form of a report.

The HTML, Markdown and terminal renderers all start from :func:`report_data` (a Report or the
dict of an earlier JSON report), so the four formats say the same thing. Pure functions: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any, cast

from advisor.kinds import EdgeKind, Source
from advisor.model import Report
from advisor.text import printable

#: Phases of the breakdown in the order they are stacked (they add up to ``step_us``).
PHASES: tuple[str, ...] = ("compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")
PHASE_LABEL: dict[str, str] = {
    "step_us": "step",
    "compute_only_us": "compute only",
    "overlapped_us": "compute ∥ comm",
    "comm_only_us": "comm only",
    "host_only_us": "host only",
    "free_us": "idle",
}
PHASE_HELP: dict[str, str] = {
    "compute_only_us": "device computes, no communication runs",
    "overlapped_us": "computation and communication run at the same time",
    "comm_only_us": "communication runs, nothing computes (exposed communication)",
    "host_only_us": "the device is idle while the host works (dispatch, data loading, sync)",
    "free_us": "nothing runs on host or device",
}
SEVERITIES: tuple[str, ...] = ("critical", "high", "medium", "low", "info")


def report_data(report: Report | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form (``report_dict``) of a Report; a dict is returned as it is."""
    if isinstance(report, Report):
        from advisor.render.json import report_dict

        return report_dict(report)
    return dict(report)


def display_data(report: Report | Mapping[str, Any]) -> dict[str, Any]:
    """:func:`report_data` with every string in it, keys too, through :func:`advisor.text.printable`:
    what the terminal, Markdown and HTML renderers start from, so that no control character, escape
    sequence or bidirectional override a profile or a report carries reaches any of them. Each
    renderer still escapes its own markup (Rich, Markdown, HTML)."""
    return cast(dict[str, Any], _printable_tree(report_data(report)))


def config_line(d: Mapping[str, Any]) -> str | None:
    """``Config: FILE (picked up from the working directory) — sets RULE.param=value, …; --set …``: the
    rule configuration a report was made with, or None with the built-in thresholds and no config file."""
    cfg = d.get("config")
    if not isinstance(cfg, Mapping):
        return None
    sets = cfg.get("set") or {}
    file = cfg.get("file")
    if not file and not sets:
        return None
    parts = []
    if file:
        changed = [f"{k}={v}" for k, v in (cfg.get("thresholds") or {}).items()]
        rules = cfg.get("rules") or {}
        if rules.get("select"):
            changed.append("only " + ", ".join(str(x) for x in rules["select"]))
        if rules.get("skip"):
            changed.append("skips " + ", ".join(str(x) for x in rules["skip"]))
        if rules.get("all"):
            changed.append("all rules")
        parts.append(f"{file}" + (" (picked up from the working directory)" if cfg.get("implicit") else "")
                     + " — sets " + ("; ".join(changed) or "nothing"))
    if sets:
        parts.append("--set " + ", ".join(f"{k}={v}" for k, v in sets.items()))
    return truncate("Config: " + "; ".join(parts), 1000)


def _printable_tree(v: Any) -> Any:
    if isinstance(v, str):
        return printable(v)
    if isinstance(v, Mapping):
        return {(printable(k) if isinstance(k, str) else k): _printable_tree(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_printable_tree(x) for x in v]
    return v


def fmt_us(v: float | None) -> str:
    """Microseconds as a human duration (``1.23 ms``); ``-`` for unknown."""
    if v is None:
        return "-"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f} s"
    if a >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def fmt_ratio(x: float | None, digits: int = 1) -> str:
    """A 0..1 ratio as a percentage."""
    if x is None:
        return "-"
    return f"{100.0 * x:.{digits}f}%"


def fmt_value(v: Any) -> str:
    """An evidence value: ratios as-is, floats rounded, everything else as text."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:,.4f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_value(x) for x in v)
    return str(v)


def fmt_evidence(key: str, v: Any) -> str:
    """An evidence value using its unit suffix (``_us``, ``_ns``, ``_ratio``/``_share``, ``_bytes``)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if key.endswith("_us") or "_us_" in key:
            return fmt_us(float(v))
        if key.endswith("_ms") or "_ms_" in key:
            return fmt_us(float(v) * 1000.0)
        if key.endswith("_ns"):
            return fmt_us(float(v) / 1000.0)
        if key.endswith(("_ratio", "_share", "_fraction")) and -10 <= v <= 10:
            return fmt_ratio(float(v))
        if key.endswith("_bytes"):
            return fmt_bytes(float(v))
    return fmt_value(v)


def fmt_bytes(v: float) -> str:
    """Bytes with a binary unit."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GiB"  # pragma: no cover


def is_threshold_key(key: str) -> bool:
    """Evidence keys that hold a rule's threshold rather than a measurement."""
    k = key.lower()
    return k.startswith(("min_", "max_", "threshold")) or k.endswith(("_threshold", "_min", "_max", "_limit"))


def compact_ints(xs: Iterable[int] | None, limit: int = 12) -> str:
    """``[0,1,2,3,7,9]`` -> ``0–3, 7, 9``; long lists are cut with a count."""
    vals = sorted({int(x) for x in (xs or [])})
    if not vals:
        return "-"
    runs: list[str] = []
    start = prev = vals[0]
    for v in [*vals[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}–{prev}")
        if v is not None:
            start = prev = v
    text = ", ".join(runs[:limit])
    if len(runs) > limit:
        text += f", … ({len(vals)} in all)"
    return text


def truncate(text: Any, n: int = 60) -> str:
    """One line, at most ``n`` characters (newlines and tabs become spaces)."""
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[: max(1, n - 1)] + "…"


def short_name(name: Any, n: int = 90) -> str:
    """An operator name for a table cell, at most ``n`` characters: a demangled C++ name that is
    too long loses its template arguments and parameter lists first
    (``void ns::kernel<float, 128, ...>(float*, int)`` -> ``void ns::kernel<…>(…)``), then its tail.
    The full name stays in the JSON report (and in the HTML cell's hover text)."""
    s = " ".join(str(name).split())
    if len(s) <= n:
        return s
    return truncate(_collapse_brackets(s), n)


def _collapse_brackets(s: str) -> str:
    """``s`` with the inside of every outermost ``<...>`` and ``(...)`` replaced by ``…``; ``s``
    itself where its brackets do not pair up (``operator<``, a comparison in a name)."""
    out: list[str] = []
    stack: list[str] = []
    pairs = {"<": ">", "(": ")"}
    for ch in s:
        if ch in pairs:
            if not stack:
                out.append(ch)
            stack.append(pairs[ch])
        elif ch in (">", ")"):
            if not stack or stack[-1] != ch:
                return s
            stack.pop()
            if not stack:
                out.append("…" + ch)
        elif not stack:
            out.append(ch)
    return s if stack else "".join(out)


def per_rank_means(breakdown: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Mean of ``step_us`` and each phase over the steps of every rank (plus ``steps``)."""
    acc: dict[int, list[dict[str, Any]]] = {}
    for r in breakdown:
        acc.setdefault(int(r["rank"]), []).append(r)
    out: dict[int, dict[str, float]] = {}
    for rank, rows in sorted(acc.items()):
        n = len(rows)
        m = {k: sum(float(x.get(k) or 0.0) for x in rows) / n for k in ("step_us", *PHASES)}
        m["steps"] = float(n)
        ov = cast(list[float], [x.get("overlap_ratio") for x in rows if x.get("overlap_ratio") is not None])
        m["overlap_ratio"] = sum(ov) / len(ov) if ov else float("nan")
        out[rank] = m
    return out


def overall_means(breakdown: list[dict[str, Any]]) -> dict[str, float] | None:
    """Mean over ranks of the per-rank means (step and phases); None without rows."""
    pr = per_rank_means(breakdown)
    if not pr:
        return None
    n = len(pr)
    return {k: sum(m[k] for m in pr.values()) / n for k in ("step_us", *PHASES)}


def breakdown_summary(d: Mapping[str, Any]) -> dict[str, Any] | None:
    """Mean step and its phases with shares, for the first screen of every format."""
    means = overall_means(d.get("breakdown") or [])
    if not means:
        return None
    step = means["step_us"]
    rows = []
    for k in PHASES:
        rows.append({"key": k, "label": PHASE_LABEL[k], "help": PHASE_HELP[k], "us": means[k],
                     "share": means[k] / step if step else None})
    ranks = {int(r["rank"]) for r in d["breakdown"]}
    return {"step_us": step, "phases": rows, "ranks": len(ranks), "rows": len(d["breakdown"])}


def _severity_rank(severity: str) -> int:
    """0 for critical ... 4 for info (an unknown name after info)."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def _scope_words(nar: Mapping[str, Any]) -> str:
    """"rank 1, step 5" of a ``narrowed_to``."""
    parts = [f"rank {nar['rank']}" if nar.get("rank") is not None else "",
             f"step {nar['step']}" if nar.get("step") is not None else ""]
    return ", ".join(p for p in parts if p)


def scope_note(d: Mapping[str, Any]) -> str:
    """Where ``--rank`` / ``--step`` narrowed the report, what each part covers: the breakdown, step
    times, critical path and verdict the focus; the findings those naming it, marked where they are
    cluster-wide; the ranks x steps picture stays whole. Empty when nothing was narrowed."""
    prof = d.get("profile") or {}
    nar = prof.get("narrowed_to")
    if not nar:
        return ""
    focus = _scope_words(nar)
    ranks, steps = prof.get("ranks") or [], prof.get("steps") or []
    whole = (f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'} ({compact_ints(ranks)})"
             + (f", {len(steps)} step{'' if len(steps) == 1 else 's'} ({compact_ints(steps)})" if steps else ""))
    found = d.get("findings") or []
    wide = sum(1 for f in found if f.get("scope") == "cluster-wide")
    text = (f"Narrowed to {focus}: the step breakdown, step times, critical path and verdict cover {focus} only; "
            f"the findings are those naming {focus}")
    if nar.get("rank") is not None and wide:
        text += ((f", rank {nar['rank']}'s own first, then " if wide < len(found) else ", all ")
                 + f"{wide} cluster-wide (marked; their figures cover every rank they name)")
    text += "; each finding's figures are its rule's over the steps it names"
    if (d.get("step_matrix") or {}).get("rows"):
        return text + f"; the ranks x steps picture covers the whole profile: {whole}"
    return text + f"; the whole profile holds {whole}"


def scope_line(d: Mapping[str, Any]) -> str | None:
    """The ranks x steps line of a narrowed report: the scope among the profile's ranks and steps
    ("rank 1 (one of 2 ranks), step 5 (one of 6 steps)") and its cells' own time against the
    median; None when not narrowed."""
    nar = (d.get("profile") or {}).get("narrowed_to")
    if not nar:
        return None
    def of(n: Any, what: str) -> str:
        return f"(one of {n} {what}{'' if n == 1 else 's'})"

    parts = []
    if nar.get("rank") is not None:
        parts.append(f"rank {nar['rank']} {of(nar.get('ranks_total'), 'rank')}")
    if nar.get("step") is not None:
        parts.append(f"step {nar['step']} {of(nar.get('steps_total'), 'step')}")
    sm = d.get("step_matrix") or {}
    text = ("Ranks x steps narrowed to " if sm.get("rows") else "Narrowed to ") + ", ".join(parts)
    cells = nar.get("cells") or []
    if cells and sm.get("median_own_us"):
        med = fmt_us(float(sm["median_own_us"]))
        if len(cells) == 1:
            text += f": own time {cells[0]['slowdown']:.2f}x the median of all cells ({med})"
        else:
            worst = ", ".join(f"rank {c['rank']} step {c['step']} ({c['slowdown']:.2f}x)" for c in cells[:3])
            text += f": slowest cells {worst} against the median of all cells ({med})"
    return text


def explained_note(f: Mapping[str, Any], findings: list[Mapping[str, Any]],
                   verdict_id: str | None = None) -> str:
    """For a finding another one explains (``explained_by``): "explained by CLU001", naming the
    explaining findings by rule (their ids where a rule fired twice), and "(the verdict)" when one
    of them is the verdict's finding; empty for a root cause. A finding kept cluster-wide in a
    report narrowed to a rank adds "cluster-wide, not narrowed"."""
    by = [str(x) for x in f.get("explained_by") or []]
    wide = "cluster-wide, not narrowed" if f.get("scope") == "cluster-wide" else ""
    if not by:
        return wide
    rule_of = {str(x.get("id")): str(x.get("rule")) for x in findings if x.get("id")}
    # an explaining finding left out of a report narrowed to a rank or step is named by its rule
    # (a finding id is ``RULE-hash``) and said to be outside
    rules = [rule_of.get(i, i.split("-", 1)[0]) for i in by]
    names = [(r if rules.count(r) == 1 else i) + ("" if i in rule_of else " (outside this narrowed report)")
             for r, i in zip(rules, by, strict=True)]
    text = "explained by " + ", ".join(dict.fromkeys(names))
    if verdict_id is not None and verdict_id in by:
        text += ", the verdict"
    return text + (f"; {wide}" if wide else "")


def verdict(d: Mapping[str, Any]) -> dict[str, Any]:
    """What limits the step: the top finding with its saving, else the largest phase."""
    findings = d.get("findings") or []
    if findings:
        vid = (d.get("savings") or {}).get("verdict")  # the root cause with the largest saving
        f = next((x for x in findings if x.get("id") == vid), findings[0])
        # the root answers for the time of the findings it explains: the verdict carries the most severe
        # of its chain and, where the root has no saving of its own, the largest saving in the chain
        chain = [f, *(x for x in findings if x is not f and f.get("id") and x.get("root_id") == f.get("id"))]
        severity = min((str(x.get("severity")) for x in chain), key=_severity_rank)
        source = f
        if f.get("estimated_saving_us") is None:
            with_saving = [x for x in chain if x.get("estimated_saving_us") is not None]
            source = max(with_saving, key=lambda x: float(x["estimated_saving_us"]), default=f)
        saving = source.get("estimated_saving_us")
        frac = source.get("saving_fraction")
        text = f"{severity.upper()}: {f['title']}"
        nar = (d.get("profile") or {}).get("narrowed_to") or {}
        basis = nar.get("step_us")
        of_step = "the step"
        if saving and basis:  # narrowed: the share is of the chosen scope's step
            frac = float(saving) / float(basis)
            of_step = f"{nar.get('step_basis')}, {fmt_us(float(basis))}"
            text += f" — up to {fmt_us(saving)} per step ({fmt_ratio(frac, 0)} of {of_step})"
        elif saving:
            text += f" — up to {fmt_us(saving)} per step" + (f" ({fmt_ratio(frac, 0)})" if frac else "")
        if f.get("scope") == "cluster-wide":
            text += " (cluster-wide, not narrowed)"
        if len(chain) > 1:
            text += f"; explains {len(chain) - 1} more finding{'' if len(chain) == 2 else 's'}"
        text += _uncertain_note(d)
        return {"kind": "finding", "severity": severity, "title": f["title"], "rule": f["rule"],
                "cause": f["cause"], "saving_us": saving, "saving_fraction": frac, "finding_id": f.get("id"),
                "text": text, "others": len(findings) - 1, "explains": len(chain) - 1, "of_step": of_step,
                "scope": f.get("scope") or None}
    summ = breakdown_summary(d)
    if not summ:
        return {"kind": "none", "severity": "info", "title": "No step could be analysed.",
                "text": "No step could be analysed.", "others": 0}
    top = max(summ["phases"], key=lambda p: p["us"])
    title = f"No rule fired. Largest share of the step: {top['label']} ({fmt_ratio(top['share'])})."
    return {"kind": "clean", "severity": "info", "title": title, "text": title + _uncertain_note(d), "others": 0}


_COUNT = {2: "two", 3: "three"}


def combined_line(d: Mapping[str, Any]) -> str | None:
    """The headline "fix these three" (report field ``savings.combined``): the saving of making the top fixes
    (a fix: one rule's root findings, on every rank it fires on) together, replayed at once; where they
    cannot be replayed together, the range that can be known, said to be a range and which bound is which;
    None with fewer than two fixes or no figure."""
    c = (d.get("savings") or {}).get("combined") or {}
    fixes = c.get("fixes")
    if fixes is None:  # a report without fixes: one per rule of its findings
        fixes = [{"rule": r, "ranks": []} for r in dict.fromkeys(str(r) for r in c.get("rules") or [])]
    if len(fixes) < 2 or c.get("saving_us") is None:
        return None

    def name(fx: Mapping[str, Any]) -> str:
        ranks = fx.get("ranks") or []
        several = len(fx.get("findings") or []) > 1 and len(ranks) > 1
        return str(fx["rule"]) + (f" on ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}" if several else "")

    named = [name(fx) for fx in fixes]
    names = ("; " if any(" on ranks " in x for x in named) else ", ").join(named)
    n = _COUNT.get(len(fixes), str(len(fixes)))
    if c.get("estimated"):
        how = c.get("how") or f"replayed together on rank {c.get('rank')}"
        return (f"Fix these {n} ({names}): −{fmt_us(c['saving_us'])} per step"
                + (f" ({fmt_ratio(c['saving_fraction'], 0)})" if c.get("saving_fraction") else "")
                + f", their changes {how}")
    if c.get("basis") == "range":
        hi = ("their savings summed" if c.get("max_bound") == "summed"
              else "the step time their classes of cause could free")
        text = (f"Fixing the top {n} ({names}): between −{fmt_us(c['saving_min_us'])} and −{fmt_us(c['saving_max_us'])} "
                f"per step, a range, not a replay (at least the largest saving of one fix"
                + (" or of those replayed together" if c.get("replayed") else "") + f"; at most {hi})")
        left = c.get("left_out") or []
        if left:
            text += ". " + "; ".join(f"{x['rule']}: {x['why']}" for x in left)
        return text
    return (f"Fixing the top {n} ({names}): up to {fmt_us(c['saving_us'])} per "
            "step, their savings summed, not replayed together (a report of an earlier version)")


def window_note(d: Mapping[str, Any]) -> str | None:
    """One line on what the window holds besides the steady state (report field ``window_phases``): the
    largest one-time set-up of a rank and any graph capture phase, with how to profile past them."""
    rows = d.get("window_phases") or []
    one = [r for r in rows if r.get("kind") == "one_time"]
    cap = [r for r in rows if r.get("kind") == "capture"]
    if not one and not cap:
        return None
    parts = []
    if one:
        top = max(one, key=lambda r: float(r.get("dur_us") or 0))
        calls = [c.split(" ×", 1)[0].strip() for c in str(top.get("names") or "").split("; ")]
        calls = [c for c in calls if c][:3]
        ranks = len({r.get("rank") for r in one})
        parts.append(f"{fmt_us(top.get('dur_us'))} of one-time set-up" + (f" ({', '.join(calls)})" if calls else "")
                     + (f" on rank {top.get('rank')}" if ranks == 1 else f" (rank {top.get('rank')}; {ranks} ranks)"))
    if cap:
        top = max(cap, key=lambda r: float(r.get("dur_us") or 0))
        parts.append(f"a {fmt_us(top.get('dur_us'))} graph capture phase")
    kept = any(not r.get("excluded") for r in one + cap)
    return ("The window includes " + " and ".join(parts)
            + ("; left out of the per-step figures" if not kept else "; part of it is in the figures")
            + "; profile after warm-up with torch.profiler.schedule(wait=1, warmup=1, active=N).")


def _uncertain_note(d: Mapping[str, Any]) -> str:
    """Where the breakdown disagrees with the exporter's own step table (warning ``vendor_mismatch``),
    the verdict says its figures are uncertain rather than stating them as fact."""
    ranks = {str(w.get("message", "")).split(" step", 1)[0] for w in d.get("warnings") or []
             if w.get("code") == "vendor_mismatch"}
    if not ranks:
        return ""
    return (f" (uncertain: the step breakdown of {len(ranks)} rank{'' if len(ranks) == 1 else 's'} is off the "
            "export's own step table by more than its tolerance; see the warnings)")


def confidence(d: Mapping[str, Any]) -> dict[str, Any]:
    """What could not be analysed and why: rules skipped for lack of data or failed, rules that do
    not apply to this profile, input warnings, CPU-only traces.

    The level is reduced only by what the profile could have given and did not: a rule that applies
    but lacks data, or an input warning (a rule's own "cannot judge" notes are listed, not counted).
    A rule that cannot apply (one rank, a CPU-only trace, an Ascend-export table on a Kineto trace:
    ``applicable`` false in the JSON) is listed as not applicable and reduces nothing."""
    rules = d.get("rules") or []
    ran = [r for r in rules if r.get("status") == "ran"]
    skipped = [r for r in rules if r.get("status") == "skipped" and r.get("applicable", True) is not False]
    not_applicable = [r for r in rules if r.get("status") == "skipped" and r.get("applicable", True) is False]
    errors = [r for r in rules if r.get("status") == "error"]
    not_sel = [r for r in rules if r.get("status") == "not_selected"]
    warnings = d.get("warnings") or []
    prof = d.get("profile") or {}
    notes: list[str] = []
    unrecorded = {r.get("kind") for r in d.get("window_phases") or []} & {"device_not_recorded", "range_profiler"}
    if prof.get("cpu_only") and unrecorded:
        notes.append("No device activity recorded although the host launched device work (not a CPU-only run): "
                     "device idle, overlap, roofline, host-bound and sync analyses do not apply.")
    elif prof.get("cpu_only"):
        notes.append("CPU-only trace: device idle, overlap and roofline analyses do not apply.")
    if not d.get("breakdown"):
        notes.append("No step windows: the step-time breakdown is empty.")
    # The engine also files a warning for every skipped rule; the rule lists already say so.
    # The CPU-only warning is already a note.
    shown = [w for w in warnings if w.get("code") != "rule_skipped"
             and not (w.get("code") == "cpu_only" and prof.get("cpu_only"))]
    reducing = [w for w in shown if w.get("code") != "rule_undecided"]
    if errors:
        level = "low"
    elif skipped or reducing:
        level = "reduced"
    else:
        level = "full"
    summary = f"{len(ran)} of {len(rules) - len(not_sel)} rules ran"
    if skipped:
        summary += f", {len(skipped)} skipped for lack of data"
    if not_applicable:
        summary += f", {len(not_applicable)} not applicable"
    if errors:
        summary += f", {len(errors)} failed"
    if shown:
        summary += f"; {len(shown)} input warning{'s' if len(shown) != 1 else ''}"
    return {"level": level, "summary": summary, "ran": ran, "skipped": skipped, "not_applicable": not_applicable,
            "errors": errors, "not_selected": not_sel, "warnings": warnings, "shown_warnings": shown, "notes": notes}


SLOW_STEP_RULE = "CLU003"  # the step-fluctuation rule: its findings list the slow (rank, step) pairs in their top rows


def slow_steps(d: Mapping[str, Any]) -> tuple[set[tuple[int, int]], str]:
    """The (rank, step) pairs that charts and tables mark as slow steps, and on what basis:
    ``"rule"``, ``"undecided"`` (the rule ran, marked nothing and said it could not decide, e.g.
    too few steps) or ``"robust"``.

    Those the step-fluctuation findings list (:data:`SLOW_STEP_RULE`: its top rows, the slowest
    20 of each finding) when that rule ran, so that what the report draws agrees with what it
    finds; a chart that said "no outlier steps" beside a finding listing three was contradicting
    it. Where the rule did not run (not selected, skipped, failed): :func:`step_outliers`.
    """
    status = {r.get("rule"): r.get("status") for r in d.get("rules") or []}
    nar = (d.get("profile") or {}).get("narrowed_to") or {}
    if status.get(SLOW_STEP_RULE) == "ran":
        pairs = {(int(t["rank"]), int(t["step"])) for f in d.get("findings") or [] if f.get("rule") == SLOW_STEP_RULE
                 for t in f.get("top") or [] if t.get("rank") is not None and t.get("step") is not None
                 # a narrowed report marks the slow steps of its scope only
                 and nar.get("rank") in (None, t["rank"]) and nar.get("step") in (None, t["step"])}
        undecided = any(w.get("code") == "rule_undecided"  # message: "<rule ids, names>: <why>"
                        and SLOW_STEP_RULE in str(w.get("message")).split(": ", 1)[0]
                        for w in d.get("warnings") or [])
        return pairs, "undecided" if undecided and not pairs else "rule"
    return step_outliers(d.get("breakdown") or []), "robust"


def step_outliers(breakdown: list[dict[str, Any]], k: float = 3.0, min_excess: float = 0.2) -> set[tuple[int, int]]:
    """(rank, step) pairs whose step time is far above that rank's median.

    Robust k-sigma (median + k·1.4826·MAD, the LLMPrism k-sigma with a robust spread so one
    huge step cannot hide itself) and at least ``min_excess`` above the median, so that a very
    steady run does not flag 1 % jitter. The fallback of :func:`slow_steps`.
    """
    by_rank: dict[int, list[tuple[int, float]]] = {}
    for r in breakdown:
        if r.get("step") is None:
            continue
        by_rank.setdefault(int(r["rank"]), []).append((int(r["step"]), float(r.get("step_us") or 0.0)))
    out: set[tuple[int, int]] = set()
    for rank, pts in by_rank.items():
        if len(pts) < 3:
            continue
        vals = [v for _, v in pts]
        med = statistics.median(vals)
        mad = statistics.median(abs(v - med) for v in vals) * 1.4826
        for step, v in pts:
            if v > med + k * mad and v > med * (1 + min_excess):
                out.add((rank, step))
    return out


def busiest_rank(breakdown: list[dict[str, Any]]) -> int | None:
    """The rank with the most busy time (step minus exposed communication and idle): the one others wait for."""
    pr = per_rank_means(breakdown)
    if len(pr) < 2:
        return None
    return max(pr, key=lambda r: pr[r]["step_us"] - pr[r]["comm_only_us"] - pr[r]["free_us"])


def _step_change(gain_us: float | None) -> str:
    """A step gain as the step's change: a gain of 26.5 ms is ``−26.50 ms``."""
    if gain_us is None:
        return "not measured"
    return "0" if gain_us == 0 else ("−" if gain_us > 0 else "+") + fmt_us(abs(gain_us))


def calibration_lines(diff: Mapping[str, Any]) -> list[str]:
    """One plain line per baseline finding that is gone: its predicted step change against the
    measured one (``IO001 io.slow_data_processing: predicted −40.60 ms (replay), measured −26.50 ms``),
    then the note on what the measured figure holds."""
    cal = diff.get("calibration") or {}
    rows = cal.get("findings") or []
    if not rows:
        return []
    measured = cal.get("measured_gain_us")
    out = []
    for r in rows:
        pred = r.get("predicted_saving_us")
        said = "no saving predicted" if pred is None else f"predicted {_step_change(pred)} ({r.get('predicted_by')})"
        out.append(f"{r.get('rule')} {r.get('cause')}: {said}, measured {_step_change(measured)}")
    if cal.get("note"):
        out.append(str(cal["note"]))
    return out


def finding_key(f: Mapping[str, Any]) -> str:
    """Identity of a finding across runs: rule, cause and ranks (what the baseline diff matches on)."""
    ranks = ",".join(str(r) for r in sorted(f.get("ranks") or []))
    return f"{f.get('rule')}|{f.get('cause')}|{ranks}"


INFERRED_EDGES = tuple(e.value for e in EdgeKind if e.inferred)


def cp_edges(d: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """The critical path's dependencies as one line ("host order 1539 · launch 12 ...") and, where
    the path crossed streams on waits inferred from timing in a Kineto trace, what would make them
    exact; None when the report has no edge counts."""
    cp = d.get("critical_path") or {}
    edges = cp.get("edges") or {}
    if not edges:
        return None
    line = " · ".join(f"{k} {v}" for k, v in edges.items())
    hint = None
    kineto = Source.KINETO in ((d.get("profile") or {}).get("sources") or [])
    if kineto and cp.get("stream_waits") == "inferred" and any(edges.get(k) for k in INFERRED_EDGES):
        hint = ("the cross-stream waits on this path are inferred from timing (the trace does not record them); on "
                "CUDA, a Kineto trace taken with experimental_config=_ExperimentalConfig(enable_cuda_sync_events=True) "
                "records them and makes these edges exact")
    return line, hint


#: How a report names the one window of a trace without step windows (``step`` null).
WHOLE_WINDOW = "whole window"


def step_text(step: Any) -> str:
    """``step 3``, or ``whole window`` for a trace without step windows (``step`` null)."""
    return WHOLE_WINDOW if step is None else f"step {step}"


def steps_text(steps: Any) -> str:
    """A profile's step list (compact), or ``none (whole window)`` when it has no step window."""
    return compact_ints(steps) if steps else f"none ({WHOLE_WINDOW})"


def whole_window_note(d: Mapping[str, Any]) -> str | None:
    """The note a breakdown carries when a rank has no step window: its "step" is the whole trace."""
    rows = d.get("breakdown") or []
    ranks = sorted({r.get("rank") for r in rows if r.get("step") is None}, key=str)
    if not ranks:
        return None
    where = "" if len(ranks) == len({r.get("rank") for r in rows}) else " on rank " + compact_ints(ranks)
    return (f"No step windows{where}: the step time is the {WHOLE_WINDOW} (the whole trace), "
            "not the time of one step; time budgets cannot be checked against it.")
