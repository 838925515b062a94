"""Terminal output with rich: the verdict first, then gate, breakdown, baseline diff, findings, critical path, confidence.

Only this module prints to the terminal. Without a TTY it writes plain text (no colour codes).
"""

from __future__ import annotations

import io
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from advisor.ingest.base import one_line
from advisor.model import Report
from advisor.render import view
from advisor.render.view import fmt_us

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
    return str(view.verdict(view.report_data(report))["text"])


class _Console(Console):
    """rich's Console, except that a reader gone away (``advisor analyze ... | head``) raises
    BrokenPipeError for the caller to decide the exit code (rich itself exits with 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _console(file: Any, color: bool | None) -> Console:
    """A console that writes plain text (no colour, no cursor codes) when ``color`` is False or not a TTY."""
    if color is False:
        return _Console(file=file or sys.stdout, no_color=True, highlight=False, soft_wrap=False, force_terminal=False,
                        width=120, emoji=False)
    return _Console(file=file or sys.stdout, highlight=False, soft_wrap=False, emoji=False)


def print_report(report: Report | dict[str, Any], *, verbose: bool = False, color: bool | None = None,
                 file: Any = None) -> None:
    """Print the report: verdict, gate, breakdown, baseline diff, findings by saving, critical path, confidence."""
    d = view.report_data(report)
    console = _console(file, color)
    p = d.get("profile") or {}
    console.print(Text("advisor ", style="bold") + Text(f"{(d.get('tool') or {}).get('version', '?')} — {p.get('path')}"))
    console.print(
        Text(f"sources: {', '.join(p.get('sources') or []) or '-'}   ranks: {_list(p.get('ranks'))}"
             f"   world size: {p.get('world_size') or '-'}   steps: {_list(p.get('steps'))}"
             + ("   [CPU-only]" if p.get("cpu_only") else ""), style="dim")
    )
    console.print()
    v = view.verdict(d)
    line = Text("Verdict: ", style="bold")
    line.append(v["text"], style=SEV_STYLE.get(v["severity"], "") if v["kind"] == "finding" else "bold green")
    console.print(line)
    gate = d.get("gate")
    if gate:
        failed = gate.get("status") == "failed"
        console.print(Text(f"Gate: {gate.get('status')}", style="bold red" if failed else "bold green")
                      + Text("".join(f"\n  - {one_line(m, 300)}" for m in gate.get("messages") or [])))
    console.print()
    _breakdown(console, d)
    diff = d.get("baseline_diff")
    if diff:
        _diff(console, diff)
    _findings(console, d, verbose)
    _critical_path(console, d)
    _confidence(console, d, verbose)


def _breakdown(console: Console, d: dict[str, Any]) -> None:
    pr = view.per_rank_means(d.get("breakdown") or [])
    if not pr:
        console.print(Text("No step windows: no breakdown.", style="yellow"))
        console.print()
        return
    t = Table(title="Step breakdown (mean per step)", title_justify="left", show_edge=False, title_style="bold")
    for col in ("rank", "steps", "step", *(view.PHASE_LABEL[k] for k in view.PHASES)):
        t.add_column(col, justify="right", no_wrap=True)
    outl, _basis = view.slow_steps(d)

    def row(label: str, n: str, m: dict[str, float]) -> list[str]:
        s = m["step_us"]
        # "158.88 ms 25.7%": no parentheses, so that the table fits 120 columns (a piped report's width)
        return [label, n, _us(s), *(f"{_us(m[k])} {_pct(m[k], s)}" for k in view.PHASES)]

    busiest = view.busiest_rank(d.get("breakdown") or [])
    shown = sorted(pr.items())
    if len(shown) > 16:  # the slowest ranks, and always the busiest one
        slowest = sorted(shown, key=lambda kv: -kv[1]["step_us"])
        keep = {r for r, _m in slowest[:16]}
        if busiest is not None and busiest in pr and busiest not in keep:
            keep = {r for r, _m in slowest[:15]} | {busiest}
        shown = [kv for kv in slowest if kv[0] in keep]
    if len(pr) > 1:
        overall = view.overall_means(d["breakdown"]) or {}
        t.add_row(*row("all", str(len(d["breakdown"])), overall), style="bold")
    for rank, m in shown:
        t.add_row(*row(str(rank) + (" *" if rank == busiest else ""), str(int(m["steps"])), m))
    console.print(t)
    notes = []
    if len(pr) > 16:
        extra = busiest is not None and busiest in dict(shown) and \
            busiest not in {r for r, _m in sorted(pr.items(), key=lambda kv: -kv[1]["step_us"])[:16]}
        notes.append(f"15 slowest of {len(pr)} ranks and the busiest shown" if extra else f"16 slowest of {len(pr)} ranks shown")
    if busiest is not None:
        notes.append(f"* busiest rank (the one others wait for): {busiest}")
    if outl:
        notes.append("slow steps: " + ", ".join(f"rank {r} step {s}" for r, s in sorted(outl)[:8])
                     + (" …" if len(outl) > 8 else ""))
    for n in notes:
        console.print(Text("  " + n, style="dim"))
    console.print()


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
            t.add_column(col, justify="left" if col == "phase" else "right")
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
            console.print(Text(f"  {label}: ", style=style)
                          + Text(one_line(f"{f.get('severity')}{was} {f.get('rule')} {f.get('title')}", 200)),
                          overflow="ellipsis", no_wrap=True)
    console.print()


def _findings(console: Console, d: dict[str, Any], verbose: bool) -> None:
    findings = d.get("findings") or []
    if not findings:
        console.print(Text("No findings.", style="bold green"))
        console.print()
        return
    console.print(Text(f"Findings ({len(findings)}), largest saving first", style="bold"))
    width = max(len(f"save ≤ {_us(f['estimated_saving_us'])}") if f.get("estimated_saving_us") else 1 for f in findings)
    for f in findings:
        sev = f.get("severity", "info")
        saving = f"save ≤ {_us(f['estimated_saving_us'])}" if f.get("estimated_saving_us") else "-"
        line = Text("  ")
        line.append(f"{sev:<8}", style=SEV_STYLE.get(sev, ""))
        line.append(f" {f.get('rule', ''):<7}")
        line.append(f"{saving:>{width}}", style="green")
        line.append("  " + one_line(str(f.get("title", "")), 400))
        console.print(line, no_wrap=True, overflow="ellipsis")
        if f.get("explained_by"):
            console.print(Text(f"{'':19}explained by {', '.join(f['explained_by'])}", style="dim"), no_wrap=True)
        if verbose:
            console.print(_details(f), no_wrap=True, overflow="ellipsis")
    console.print()


def _details(f: dict[str, Any]) -> Text:
    out = Text(style="dim")
    out.append(f"      cause {f.get('cause')} · ranks {view.compact_ints(f.get('ranks'))} · steps {view.compact_ints(f.get('steps'))}\n")
    if f.get("saving_basis"):
        out.append(f"      saving: {one_line(f['saving_basis'], 200)}\n")
    for k, v in (f.get("evidence") or {}).items():
        kind = "threshold" if view.is_threshold_key(k) else "measured"
        out.append(f"        {k} = {view.fmt_evidence(k, v)}  ({kind})\n")
    for o in list(f.get("ops") or [])[:5]:
        out.append(f"        op: {view.truncate(o, 100)}\n")
    for row in list(f.get("top") or [])[:5]:
        out.append("        top: " + view.truncate(", ".join(f"{k}={view.fmt_evidence(k, v)}" for k, v in row.items()), 110) + "\n")
    for i, o in enumerate(f.get("optimizations") or [], 1):
        out.append(f"        do {i}. {o.get('title')}" + (f" — {view.truncate(o.get('how', ''), 100)}" if o.get("how") else "") + "\n")
    return out


def _critical_path(console: Console, d: dict[str, Any]) -> None:
    cp = d.get("critical_path") or {}
    if not cp.get("ops"):
        return
    length = cp.get("length_us") or 0
    t = Table(title=f"Critical path: rank {cp.get('rank')}, step {cp.get('step')}, {_us(length)}",
              title_justify="left", show_edge=False, title_style="bold")
    t.add_column("operator", no_wrap=True, overflow="ellipsis", max_width=70)
    t.add_column("kind", no_wrap=True)
    t.add_column("time on path", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("count", justify="right", no_wrap=True)
    for op in cp["ops"][:10]:
        t.add_row(Text(view.truncate(op.get("name", ""), 70)), str(op.get("kind")), _us(op.get("total_us")),
                  _pct(op.get("total_us") or 0, length), str(op.get("count", "")))
    console.print(t)
    edges = view.cp_edges(d)
    if edges:
        console.print(Text(f"  edges followed: {edges[0]}", style="dim"))
        if edges[1]:
            console.print(Text(f"  note: {edges[1]}", style="dim"))
    console.print()


def _confidence(console: Console, d: dict[str, Any], verbose: bool) -> None:
    conf = view.confidence(d)
    console.print(Text(f"Confidence: {conf['level']} — {conf['summary']}", style="bold"))
    for n in conf["notes"]:
        console.print(Text(f"  {n}", style="dim"))
    for r in conf["errors"]:
        console.print(Text(f"  {r.get('rule')} failed: {one_line(str(r.get('reason')), 300)}", style="red"))
    limit = None if verbose else 8
    skipped = conf["skipped"]
    for r in skipped[:limit]:
        console.print(Text(f"  {r.get('rule')} skipped: {one_line(str(r.get('reason')), 200)}", style="dim"),
                      overflow="ellipsis", no_wrap=True)
    if limit is not None and len(skipped) > limit:
        console.print(Text(f"  … {len(skipped) - limit} more skipped rules (--verbose)", style="dim"))
    ws = conf["shown_warnings"]
    if ws:
        console.print(Text(f"Warnings ({len(ws)})", style="bold"))
        for w in ws[:30]:
            console.print(Text(f"  [{w.get('code')}] " + (f"{one_line(w['path'], 120)}: " if w.get("path") else "")
                               + one_line(str(w.get("message")), 400)))
        if len(ws) > 30:
            console.print(f"  … {len(ws) - 30} more (see --format json)")


def render_text(report: Report | dict[str, Any], verbose: bool = False) -> str:
    """The terminal summary as plain text."""
    buf = io.StringIO()
    print_report(report, verbose=verbose, color=False, file=buf)
    return buf.getvalue()


def _list(xs: Any) -> str:
    xs = list(xs or [])
    if not xs:
        return "-"
    if len(xs) > 8:
        return f"{xs[0]}…{xs[-1]} ({len(xs)})"
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
        self.console = Console(file=sys.stderr)
        self._status: Any = None
        self._msg = ""
        self._closed = False
        self._lock = threading.Lock()
        self._timer: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._msg = f"{stage} {done}/{total}" if stage == "ingest" else stage
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
