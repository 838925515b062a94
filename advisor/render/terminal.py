"""Terminal output with rich: the verdict first, then gate, breakdown, baseline diff, findings, critical path, confidence.

Only this module prints to the terminal. Without a TTY it writes plain text (no colour codes).
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from advisor.model import Report
from advisor.render import view
from advisor.render.view import fmt_us
from advisor.text import one_line

SEV_STYLE = {  # colour is decoration only: the severity word is always printed
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "info": "dim",
}


def _us(v: float | None) -> str:
    return fmt_us(v)


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def verdict(report: Report | dict[str, Any]) -> str:
    """One sentence: what limits the step."""
    return str(view.verdict(view.display_data(report))["text"])


class _Console(Console):
    """rich's Console, except that a reader gone away (``advisor analyze ... | head``) raises
    BrokenPipeError for the caller to decide the exit code (rich itself exits with 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


#: Width of plain (piped) output when ``COLUMNS`` does not say otherwise.
PLAIN_WIDTH = 120


def plain_width() -> int:
    """Width of piped output: ``COLUMNS`` when it holds a usable number, else :data:`PLAIN_WIDTH`."""
    cols = os.environ.get("COLUMNS", "").strip()
    return max(40, int(cols)) if cols.isdigit() and int(cols) > 0 else PLAIN_WIDTH


def _console(file: Any, color: bool | None, width: int | None = None) -> Console:
    """A console that writes plain text (no colour, no cursor codes) when ``color`` is False or not a TTY.

    Markup is off: a string the report supplies (a rule id, an operator name) is printed as it is,
    never read as Rich markup (``[link=...]``, ``[/x]``), and emoji codes stay text.
    Plain text is ``width`` columns wide, else ``COLUMNS``, else 120; a terminal's width is its own
    (rich reads the terminal size, or ``COLUMNS`` when set)."""
    if color is False:
        return _Console(file=file or sys.stdout, no_color=True, highlight=False, soft_wrap=False, force_terminal=False,
                        width=width or plain_width(), emoji=False, markup=False)
    return _Console(file=file or sys.stdout, highlight=False, soft_wrap=False, emoji=False, width=width, markup=False)


def print_report(report: Report | dict[str, Any], *, verbose: bool = False, color: bool | None = None,
                 file: Any = None, width: int | None = None) -> None:
    """Print the report: verdict, gate, breakdown, baseline diff, findings by saving, critical path, confidence.

    No number and no rank is ever cut to fit the width: tables stack or drop columns instead, and
    long text wraps."""
    d = view.display_data(report)
    console = _console(file, color, width)
    p = d.get("profile") or {}
    console.print(Text("advisor ", style="bold")
                  + Text(f"{one_line((d.get('tool') or {}).get('version', '?'), 40)} — {one_line(p.get('path'), 1000)}"))
    console.print(
        Text(f"sources: {', '.join(p.get('sources') or []) or '-'}   ranks: {_list(p.get('ranks'))}"
             f"   world size: {p.get('world_size') or '-'}   steps: {_list(p.get('steps')) if p.get('steps') else view.steps_text(None)}"
             + (" (inferred)" if p.get("steps_inferred") else "")
             + ("   [CPU-only]" if p.get("cpu_only") else ""), style="dim")
    )
    console.print()
    v = view.verdict(d)
    line = Text("Verdict: ", style="bold")
    line.append(one_line(v["text"], 1000), style=SEV_STYLE.get(v["severity"], "") if v["kind"] == "finding" else "bold green")
    console.print(line)
    if fix := view.combined_line(d):
        console.print(Text(one_line(fix, 1000), style="bold"))
    if note := view.window_note(d):
        console.print(Text(one_line(note, 1000), style="dim"))
    scope = view.scope_note(d)
    if scope:
        console.print(Text(one_line(scope, 600), style="yellow"))
    gate = d.get("gate")
    if gate:
        failed = gate.get("status") == "failed"
        console.print(Text(f"Gate: {gate.get('status')}", style="bold red" if failed else "bold green")
                      + Text("".join(f"\n  - {one_line(m, 300)}" for m in gate.get("messages") or [])))
    cfg_line = view.config_line(d)
    if cfg_line:
        console.print(Text(one_line(cfg_line, 1000), style="yellow" if (d.get("config") or {}).get("implicit") else "dim"))
    console.print()
    _breakdown(console, d)
    _groups(console, d)
    diff = d.get("baseline_diff")
    if diff:
        _diff(console, diff)
    _findings(console, d, verbose)
    _hardware(console, d, verbose)
    _critical_path(console, d)
    _variability(console, d)
    _confidence(console, d, verbose)


_STACKED_HEADERS = {"compute_only_us": "compute\nonly", "overlapped_us": "compute\n∥ comm", "comm_only_us": "comm\nonly",
                    "host_only_us": "host\nonly", "free_us": "idle"}


def _fits(console: Console, renderable: Any) -> bool:
    """Whether ``renderable`` fits the console's width at its natural size (nothing shrunk)."""
    natural = Measurement.get(console, console.options.update_width(10_000), renderable)
    return natural.maximum <= console.width


def _breakdown_table(rows: list[tuple[str, str, dict[str, float], bool]], layout: str) -> Table:
    """The per-rank breakdown in one of three layouts, widest first: ``wide`` (time and share on
    one line), ``stacked`` (share under the time) and ``narrow`` (stacked, no box, no steps column).
    Every cell is ``no_wrap``: the caller picks the layout that fits, so no number is cut."""
    title = "Step breakdown (mean per step)"
    if layout == "narrow":
        t = Table(title=title, title_justify="left", show_edge=False, title_style="bold", box=None, padding=(0, 1),
                  show_header=True, header_style="bold")
    else:
        t = Table(title=title, title_justify="left", show_edge=False, title_style="bold")
    stacked = layout != "wide"
    cols = ["rank", *(["steps"] if layout != "narrow" else []), "step",
            *((_STACKED_HEADERS[k] if stacked else view.PHASE_LABEL[k]) for k in view.PHASES)]
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    sep = "\n" if stacked else " "
    for label, n, m, bold in rows:
        s = m["step_us"]
        # "158.88 ms 25.7%": no parentheses, so that the wide table fits 120 columns (a piped report's width)
        cells = [label, *([n] if layout != "narrow" else []), _us(s), *(f"{_us(m[k])}{sep}{_pct(m[k], s)}" for k in view.PHASES)]
        t.add_row(*cells, style="bold" if bold else None, end_section=stacked)
    return t


def _breakdown_lines(rows: list[tuple[str, str, dict[str, float], bool]]) -> Padding:
    """The breakdown as one wrapped paragraph per rank, for terminals too narrow for any table."""
    lines = [Text.assemble((f"rank {label}", "bold"), f": {n} steps, step {_us(m['step_us'])}; "
                           + "; ".join(f"{view.PHASE_LABEL[k]} {_us(m[k])} {_pct(m[k], m['step_us'])}" for k in view.PHASES))
             for label, n, m, _bold in rows]
    return Padding(Text("\n").join(lines), (0, 0, 0, 1), expand=False)


def _breakdown(console: Console, d: dict[str, Any]) -> None:
    pr = view.per_rank_means(d.get("breakdown") or [])
    if not pr:
        console.print(Text("No step windows: no breakdown.", style="yellow"))
        console.print()
        return
    outl, _basis = view.slow_steps(d)
    busiest = view.busiest_rank(d.get("breakdown") or [])
    shown = sorted(pr.items())
    if len(shown) > 16:  # the slowest ranks, and always the busiest one
        slowest = sorted(shown, key=lambda kv: -kv[1]["step_us"])
        keep = {r for r, _m in slowest[:16]}
        if busiest is not None and busiest in pr and busiest not in keep:
            keep = {r for r, _m in slowest[:15]} | {busiest}
        shown = [kv for kv in slowest if kv[0] in keep]
    rows: list[tuple[str, str, dict[str, float], bool]] = []
    if len(pr) > 1:
        overall = view.overall_means(d["breakdown"]) or {}
        rows.append(("all", str(len(d["breakdown"])), overall, True))
    for rank, m in shown:
        rows.append((str(rank) + (" *" if rank == busiest else ""), str(int(m["steps"])), m, False))
    for layout in ("wide", "stacked", "narrow"):
        t = _breakdown_table(rows, layout)
        if _fits(console, t):
            console.print(t)
            if layout == "narrow":  # the steps column was dropped
                counts = {n for label, n, _m, _b in rows if label != "all"}
                steps = (f"{counts.pop()} steps per rank" if len(counts) == 1 else
                         "steps per rank: " + ", ".join(f"{label.rstrip(' *')} {n}" for label, n, _m, _b in rows
                                                        if label != "all"))
                console.print(_indented(Text(steps, style="dim"), 2))
            break
    else:
        console.print(Text("Step breakdown (mean per step)", style="bold"))
        console.print(_breakdown_lines(rows))
    notes = []
    whole = view.whole_window_note(d)
    if whole:
        notes.append(whole)
    if len(pr) > 16:
        extra = busiest is not None and busiest in dict(shown) and \
            busiest not in {r for r, _m in sorted(pr.items(), key=lambda kv: -kv[1]["step_us"])[:16]}
        notes.append(f"15 slowest of {len(pr)} ranks and the busiest shown" if extra else f"16 slowest of {len(pr)} ranks shown")
    if busiest is not None:
        notes.append(f"* busiest rank (the one others wait for): {busiest}")
    if outl:
        notes.append("slow steps: " + ", ".join(f"rank {r} step {s}" for r, s in sorted(outl)[:8])
                     + (f" and {len(outl) - 8} more" if len(outl) > 8 else ""))
    for n in notes:
        console.print(_indented(Text(n, style="dim"), 2))
    console.print()


def _groups(console: Console, d: dict[str, Any]) -> None:
    from advisor.render.groups import summary

    text = summary(d)
    if text:
        console.print(_indented(Text(text, style="dim"), 2))
        console.print()


def _indented(text: Text, left: int) -> Padding:
    """Text that wraps at word boundaries with every line indented by ``left`` columns."""
    return Padding(text, (0, 0, 0, left), expand=False)


def _diff(console: Console, diff: dict[str, Any]) -> None:
    reg = diff.get("regression_pct")
    head = Text(f"Against the baseline {diff.get('baseline')}: ", style="bold")
    if reg is None:
        head.append("step times not compared (no step windows in one run)")
    else:
        head.append(f"mean step {reg:+.1f}% (allowed +{diff.get('max_regression_pct'):g}%)",
                    style="bold red" if diff.get("regressed") else "green")
    console.print(head)
    if diff.get("phases"):
        t = Table(show_edge=False, box=None, padding=(0, 2))
        for col in ("phase", "baseline", "now", "change", "of step"):
            t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=col != "phase")
        for p in diff["phases"]:
            pct = p.get("delta_pct_of_step")
            style = "red" if p.get("slower") else ("green" if p["delta_us"] < 0 else "")
            t.add_row(p["label"], _us(p["baseline_us"]), _us(p["current_us"]),
                      Text(("+" if p["delta_us"] > 0 else "") + _us(p["delta_us"]), style=style),
                      "-" if pct is None else f"{pct:+.1f}%")
        console.print(t)
    for label, key, style in (("new", "new_findings", "red"), ("gone", "gone_findings", "green"),
                              ("severity changed", "changed_findings", "yellow")):
        for f in diff.get(key) or []:
            was = f" (was {f['baseline_severity']})" if f.get("baseline_severity") else ""
            console.print(_indented(Text(f"{label}: ", style=style)
                                    + Text(one_line(f"{f.get('severity')}{was} {f.get('rule')} {f.get('title')}", 200)), 2))
    cal = view.calibration_lines(diff)
    if cal:
        console.print(_indented(Text("predicted against measured (mean step):", style="bold"), 2))
        for line in cal[:-1]:
            console.print(_indented(Text(one_line(line, 200)), 4))
        console.print(_indented(Text(one_line(cal[-1], 300), style="dim"), 4))
    console.print()


def _findings(console: Console, d: dict[str, Any], verbose: bool) -> None:
    """One row per finding (severity, rule, saving, title wrapped beside them) and, under it, the
    first optimisation (all of them and the evidence with ``verbose``)."""
    findings = d.get("findings") or []
    if not findings:
        console.print(Text("No findings.", style="bold green"))
        console.print()
        return
    nar = (d.get("profile") or {}).get("narrowed_to") or {}
    mixed = any(f.get("scope") for f in findings) and not all(f.get("scope") for f in findings)
    order = (f"rank {nar['rank']}'s own first, then cluster-wide; largest saving first"
             if nar.get("rank") is not None and mixed else "largest saving first")
    console.print(Text(f"Findings ({len(findings)}), {order}", style="bold"))
    verdict_id = view.verdict(d).get("finding_id")
    savings = [f"save ≤ {_us(f['estimated_saving_us'])}" if f.get("estimated_saving_us") else "-" for f in findings]
    sev_w = max(len(str(f.get("severity", "info"))) for f in findings)
    rule_w = max(len(str(f.get("rule", ""))) for f in findings)
    save_w = max(len(s) for s in savings)
    for f, saving in zip(findings, savings):
        sev = str(f.get("severity", "info"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=1)
        grid.add_column(width=sev_w, no_wrap=True)
        grid.add_column(width=rule_w, no_wrap=True)
        grid.add_column(width=save_w, justify="right", no_wrap=True)
        grid.add_column(ratio=1, overflow="fold")
        grid.add_row("", Text(sev, style=SEV_STYLE.get(sev, "")), str(f.get("rule", "")), Text(saving, style="green"),
                     Text(one_line(str(f.get("title", "")), 400)))
        note = view.explained_note(f, findings, verdict_id)
        if note:
            grid.add_row("", "", "", "", Text(note, style="dim"))
        opts = f.get("optimizations") or []
        if opts and not verbose:
            grid.add_row("", "", "", "", Text("→ " + one_line(str(opts[0].get("title", "")), 300), style="cyan"))
        console.print(grid)
        if verbose:
            console.print(_indented(_details(f), 6))
    console.print()


def _hardware(console: Console, d: dict[str, Any], verbose: bool) -> None:
    """One line per hardware metric (the kept ones; every one with ``verbose``) and what was dropped."""
    hw = d.get("hardware")
    if not isinstance(hw, dict) or not hw.get("metrics"):
        return
    metrics = hw.get("metrics") or []
    kept = [m for m in metrics if m.get("kept")]
    dropped = [m for m in metrics if not m.get("kept")]
    console.print(Text(f"Hardware metrics ({hw.get('devices')} devices, {len(kept)} of {len(metrics)} kept)",
                       style="bold"))
    for m in (kept + dropped if verbose else kept)[:60]:
        console.print(_indented(Text(one_line(str(m.get("summary", m.get("metric"))), 300)), 2))
    if dropped and not verbose:
        console.print(_indented(Text("dropped: " + ", ".join(
            f"{m.get('metric')} ({m.get('dropped')}{' with ' + str(m.get('like')) if m.get('like') else ''})"
            for m in dropped[:20]) + (" ..." if len(dropped) > 20 else ""), style="dim"), 2))
    console.print()


def _details(f: dict[str, Any]) -> Text:
    lines = [f"cause {one_line(f.get('cause'), 200)} · ranks {view.compact_ints(f.get('ranks'))} · steps {view.compact_ints(f.get('steps'))}"]
    if f.get("saving_basis"):
        lines.append(f"saving: {one_line(f['saving_basis'], 200)}")
    for k, v in (f.get("evidence") or {}).items():
        kind = "threshold" if view.is_threshold_key(k) else "measured"
        lines.append(f"  {one_line(k, 100)} = {one_line(view.fmt_evidence(k, v), 300)}  ({kind})")
    for o in list(f.get("ops") or [])[:5]:
        lines.append(f"  op: {view.truncate(o, 100)}")
    for row in list(f.get("top") or [])[:5]:
        lines.append("  top: " + view.truncate(", ".join(f"{k}={view.fmt_evidence(k, v)}" for k, v in row.items()), 110))
    for i, o in enumerate(f.get("optimizations") or [], 1):
        lines.append(f"  do {i}. {one_line(o.get('title'), 300)}"
                     + (f" — {view.truncate(o.get('how', ''), 100)}" if o.get("how") else ""))
    return Text("\n".join(lines), style="dim")


def _critical_path(console: Console, d: dict[str, Any]) -> None:
    cp = d.get("critical_path") or {}
    if not cp.get("ops"):
        return
    length = cp.get("length_us") or 0
    ops = cp["ops"][:10]
    rows = [(str(op.get("kind")), _us(op.get("total_us")), _pct(op.get("total_us") or 0, length), str(op.get("count", "")))
            for op in ops]
    # the operator name is the only column that may be shortened: the others keep their full width
    fixed = sum(max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("kind", "time on path", "share", "count")))
    name_w = max(12, min(70, console.width - fixed - 3 * 4 - 2))
    t = Table(title=f"Critical path: rank {cp.get('rank')}, {view.step_text(cp.get('step'))}, {_us(length)}",
              title_justify="left", show_edge=False, title_style="bold")
    t.add_column("operator", no_wrap=True, overflow="ellipsis", max_width=name_w)
    t.add_column("kind", no_wrap=True)
    t.add_column("time on path", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("count", justify="right", no_wrap=True)
    for op, r in zip(ops, rows):
        t.add_row(Text(view.short_name(op.get("name", ""), name_w)), *r)
    console.print(t)
    edges = view.cp_edges(d)
    if edges:
        console.print(_indented(Text(f"edges followed: {edges[0]}", style="dim"), 2))
        if edges[1]:
            console.print(_indented(Text(f"note: {edges[1]}", style="dim"), 2))
    console.print()


def _variability(console: Console, d: dict[str, Any]) -> None:
    """Variability: the step-time spread, the operators that make steps vary, the slowdown at scale."""
    from advisor.render import variability_text as vt

    v = d.get("variability")
    if not v:
        return
    console.print(Text("Variability", style="bold"))
    for line in vt.summary(v) + ([f"Note: {v['note']}"] if v.get("note") else []):
        console.print(_indented(Text(one_line(line, 400)), 2))
    ops = (v.get("ops") or [])[:5]
    if ops and vt.shares_known(v):
        heads = ("operator", "kind", "p50", "p95", "sigma", "share of variance")
        rows: list[tuple[str, ...]] = [(one_line(o.get("kind"), 20), _us(o.get("p50_us")), _us(o.get("p95_us")), _us(o.get("sigma_us")),
                 vt.pct(vt.share(o))) for o in ops]
        # as in the critical-path table, only the operator name is shortened: one line, the rest in full

        def table(name_w: int) -> Table:
            t = Table(show_edge=False, box=None, padding=(0, 2))
            for h in heads:
                if h == "operator":
                    t.add_column(h, no_wrap=True, justify="left", overflow="ellipsis", max_width=name_w)
                else:
                    t.add_column(h, no_wrap=True, justify="left" if h == "kind" else "right")
            for o, r in zip(ops, rows):
                t.add_row(Text(view.short_name(vt.op_label(o, name_w), name_w)), *r)
            return t

        widest = min(60, max(len(vt.op_label(o, 60)) for o in ops))
        t = table(widest)
        natural = Measurement.get(console, console.options.update_width(10_000), t).maximum
        name_w = widest - max(0, natural - (console.width - 2))
        if name_w >= 24:
            console.print(_indented(table(name_w) if name_w < widest else t, 2))  # type: ignore[arg-type]
        else:  # too narrow for a table with a readable name: one wrapped line per operator
            for o, r in zip(ops, rows):
                console.print(_indented(Text(f"{vt.op_label(o, 80)} ({r[0]}): p50 {r[1]}, p95 {r[2]}, sigma {r[3]}, "
                                             f"{r[4]} of the variance"), 4))
    pred_rows: list[dict[str, Any]] = (v.get("prediction") or {}).get("rows") or []
    if pred_rows:
        t = Table(show_edge=False, box=None, padding=(0, 2))
        for h in ("scale", "ranks", "median", "p95", "expected", *(f"P(>+{x} %)" for x in (5, 10, 20))):
            t.add_column(h, justify="right", no_wrap=True)
        for pr in pred_rows:
            t.add_row(f"{pr['scale']}x", str(pr["ranks"]), _us(pr["p50_us"]),
                      _us(pr["p95_us"]) + ("*" if pr.get("extrapolated") else ""),
                      _us(pr["mean_us"]), *(vt.pct(pr.get(f"p_slowdown_{x}")) for x in (5, 10, 20)))
        console.print(_indented(t, 2))  # type: ignore[arg-type]
        console.print(_indented(Text(one_line(f"Assumption: {v.get('assumption')}. * beyond the measured range.", 600),
                                     style="dim"), 2))
    pp = ((v.get("sensitivity") or {}).get("pipeline") or {})
    if pp.get("stages"):
        console.print(_indented(Text(f"Pipeline: a slow rank hurts stage {pp['most_sensitive_stage']} most "
                                     f"(least slack of {len(pp['stages'])} stages)."), 2))
    console.print()


def _confidence(console: Console, d: dict[str, Any], verbose: bool) -> None:
    conf = view.confidence(d)
    console.print(Text(f"Confidence: {conf['level']} — {conf['summary']}", style="bold"))
    for n in conf["notes"]:
        console.print(_indented(Text(n, style="dim"), 2))
    for r in conf["errors"]:
        console.print(_indented(Text(f"{r.get('rule')} failed: {one_line(str(r.get('reason')), 300)}", style="red"), 2))
    limit = None if verbose else 8
    skipped = conf["skipped"]
    for r in skipped[:limit]:
        console.print(_indented(Text(f"{r.get('rule')} skipped: {one_line(str(r.get('reason')), 200)}", style="dim"), 2))
    if limit is not None and len(skipped) > limit:
        console.print(_indented(Text(f"and {len(skipped) - limit} more skipped rules (--verbose)", style="dim"), 2))
    na = conf["not_applicable"]
    if na and verbose:
        for r in na:
            console.print(_indented(Text(f"{r.get('rule')} not applicable: {one_line(str(r.get('reason')), 200)}",
                                         style="dim"), 2))
    elif na:
        console.print(_indented(Text(f"not applicable to this profile: {', '.join(str(r.get('rule')) for r in na)}"
                                     " (--verbose: why)", style="dim"), 2))
    ws = conf["shown_warnings"]
    if ws:
        console.print(Text(f"Warnings ({len(ws)})", style="bold"))
        for w in ws[:30]:
            console.print(_indented(Text(f"[{w.get('code')}] " + (f"{one_line(w['path'], 120)}: " if w.get("path") else "")
                                         + one_line(str(w.get("message")), 400)), 2))
        if len(ws) > 30:
            console.print(_indented(Text(f"and {len(ws) - 30} more (see --format json)"), 2))


def render_text(report: Report | dict[str, Any], verbose: bool = False, width: int | None = None) -> str:
    """The terminal summary as plain text, ``width`` columns wide (default: ``COLUMNS``, else 120)."""
    buf = io.StringIO()
    print_report(report, verbose=verbose, color=False, file=buf, width=width)
    return buf.getvalue()


def _list(xs: Any) -> str:
    """Ranks or steps as ``0, 1, 2`` or, for many, as ranges (``0–63 (64)``): never cut."""
    xs = list(xs or [])
    if not xs:
        return "-"
    if len(xs) > 8:
        return f"{view.compact_ints(xs, limit=4)} ({len(xs)})"
    return ", ".join(map(str, xs))


def print_rules(specs: dict[str, Any]) -> None:
    """``advisor rules`` table."""
    console = _Console(highlight=False)
    t = Table(show_edge=False)
    for c in ("id", "name", "cause", "needs", "status"):
        t.add_column(c)
    for s in specs.values():
        t.add_row(s.id, s.name, ", ".join(s.all_causes), ", ".join(s.requires), s.status)
    console.print(t)


def print_markdown(text: str) -> None:
    """Render Markdown (``advisor explain``); plain text when not a TTY."""
    console = _Console(highlight=False)
    if console.is_terminal:
        console.print(Markdown(text))
    else:
        sys.stdout.write(text)


class Progress:
    """A progress line on stderr for long ingests, shown once the job has run one second.

    The loader reports at the start and the end of each scan; one scan of a big file or of a
    whole cluster can last a minute with no report in between, so a timer starts the line at
    the one-second mark with the last message (the spinner then shows the job is alive)."""

    DELAY = 1.0

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.console = Console(file=sys.stderr, markup=False, emoji=False, highlight=False)
        self._status: Any = None
        self._msg = ""
        self._closed = False
        self._lock = threading.Lock()
        self._timer: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._msg = one_line(f"{stage} {done}/{total}" if stage == "ingest" else stage, 200)
            if self._status is not None:
                self._status.update(self._msg)
                return
            wait = self.DELAY - (time.perf_counter() - self.t0)
            if wait > 0 and stage == "ingest" and done < total:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._start_late)
                    self._timer.daemon = True
                    self._timer.start()
                return
            self._start()

    def _start(self) -> None:
        self._status = self.console.status(self._msg)
        self._status.start()

    def _start_late(self) -> None:
        with self._lock:
            if self._status is None and not self._closed:
                self._start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._status is not None:
                self._status.stop()
