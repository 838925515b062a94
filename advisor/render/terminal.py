"""Terminal output with rich: the verdict first, then breakdown, critical path, findings, warnings.

Only this module prints to the terminal. Without a TTY it writes plain text (no colour codes).
"""

from __future__ import annotations

import io
import sys
import time
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from advisor.model import Report, Severity

SEV_STYLE = {
    Severity.CRITICAL: "bold white on red",
    Severity.HIGH: "bold red",
    Severity.MEDIUM: "yellow",
    Severity.LOW: "cyan",
    Severity.INFO: "dim",
}


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def verdict(report: Report) -> str:
    """One sentence: what limits the step."""
    if report.findings:
        f = report.findings[0]
        saving = f" — up to {_us(f.estimated_saving_us)} per step ({100 * (f.saving_fraction or 0):.0f}%)" if f.estimated_saving_us else ""
        return f"{f.severity.label.upper()}: {f.title}{saving}"
    bd = report.breakdown
    if not bd:
        return "No step could be analysed."
    tot = {k: sum(r[k] or 0 for r in bd) for k in ("step_us", "compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")}
    biggest = max(("compute_only_us", "comm_only_us", "host_only_us", "free_us", "overlapped_us"), key=lambda k: tot[k])
    return f"No rule fired. Largest share of the step: {biggest[:-3].replace('_', '-')} ({_pct(tot[biggest], tot['step_us'])})."


def print_report(report: Report, *, verbose: bool = False, color: bool | None = None, file: Any = None) -> None:
    """Print the report to the terminal (or ``file``)."""
    console = Console(file=file or sys.stdout, no_color=color is False, highlight=False, soft_wrap=False,
                      force_terminal=False if color is False else None, width=None if color is not False else 120)
    p = report.profile
    console.print(Text("advisor ", style="bold") + Text(f"{report.tool_version} — {p.get('path')}"))
    console.print(
        f"sources: {', '.join(p.get('sources') or []) or '-'}   ranks: {_list(p.get('ranks'))}"
        f"   world size: {p.get('world_size') or '-'}   steps: {_list(p.get('steps'))}"
        + ("   [CPU-only]" if p.get("cpu_only") else "")
    )
    console.print()
    console.print(Text("Verdict: ", style="bold") + Text(verdict(report)))
    console.print()

    # breakdown per rank (mean over steps)
    if report.breakdown:
        t = Table(title="Step breakdown (mean per step)", title_justify="left", show_edge=False)
        for col in ("rank", "steps", "step", "compute-only", "overlapped", "comm-only", "host-only", "free"):
            t.add_column(col, justify="right")
        by_rank: dict[int, list[dict[str, Any]]] = {}
        for r in report.breakdown:
            by_rank.setdefault(r["rank"], []).append(r)
        shown = sorted(by_rank.items())
        if len(shown) > 16:
            shown = sorted(shown, key=lambda kv: -sum(x["step_us"] for x in kv[1]) / len(kv[1]))[:16]
        for rank, rows in shown:
            n = len(rows)
            mean = {k: sum(x[k] or 0 for x in rows) / n for k in ("step_us", "compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")}
            s = mean["step_us"]
            t.add_row(
                str(rank), str(n), _us(s),
                *(f"{_us(mean[k])} ({_pct(mean[k], s)})" for k in ("compute_only_us", "overlapped_us", "comm_only_us", "host_only_us", "free_us")),
            )
        console.print(t)
        if len(by_rank) > 16:
            console.print(f"  (16 slowest of {len(by_rank)} ranks shown)")
        console.print()

    cp = report.critical_path
    if cp and cp.get("ops"):
        t = Table(title=f"Critical path: rank {cp.get('rank')}, step {cp.get('step')}, {_us(cp.get('length_us'))}",
                  title_justify="left", show_edge=False)
        t.add_column("operator", overflow="fold", max_width=70)
        t.add_column("kind")
        t.add_column("time on path", justify="right")
        t.add_column("share", justify="right")
        t.add_column("count", justify="right")
        for op in cp["ops"][:10]:
            t.add_row(Text(str(op["name"])), op["kind"], _us(op["total_us"]), _pct(op["total_us"], cp.get("length_us") or 0), str(op.get("count", "")))
        console.print(t)
        console.print()

    if report.findings:
        console.print(Text(f"Findings ({len(report.findings)}), largest saving first", style="bold"))
        for f in report.findings:
            line = Text("  ")
            line.append(f"{f.severity.label:<8}", style=SEV_STYLE[f.severity])
            line.append(f" {f.rule} {f.cause}: ")
            line.append(f.title)
            if f.estimated_saving_us:
                line.append(f"  [save ≤ {_us(f.estimated_saving_us)}/step]", style="green")
            console.print(line)
            if verbose:
                for k, v in f.evidence.items():
                    console.print(Text(f"      {k}: {v}", style="dim"))
                if f.optimizations:
                    console.print(Text("      do: " + "; ".join(o.title for o in f.optimizations), style="dim"))
    else:
        console.print(Text("No findings.", style="bold green"))
    console.print()
    if report.warnings:
        console.print(Text(f"Warnings ({len(report.warnings)})", style="bold"))
        for w in report.warnings[:30]:
            console.print(Text(f"  [{w.code}] " + (f"{w.path}: " if w.path else "") + w.message))
        if len(report.warnings) > 30:
            console.print(f"  … {len(report.warnings) - 30} more (see --format json)")
    gate = report.extras.get("gate")
    if gate:
        console.print(Text(f"Gate: {gate.get('status')}", style="bold red" if gate.get("status") == "failed" else "bold green"))


def render_text(report: Report, verbose: bool = False) -> str:
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
    console = Console(highlight=False)
    t = Table(show_edge=False)
    for c in ("id", "name", "cause", "needs", "status"):
        t.add_column(c)
    for s in specs.values():
        t.add_row(s.id, s.name, ", ".join(s.all_causes), ", ".join(s.requires), s.status)
    console.print(t)


def print_markdown(text: str) -> None:
    """Render Markdown (``advisor explain``); plain text when not a TTY."""
    console = Console(highlight=False)
    if console.is_terminal:
        console.print(Markdown(text))
    else:
        sys.stdout.write(text)


class Progress:
    """A progress line on stderr for long ingests (shown only after one second)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.console = Console(file=sys.stderr)
        self._status: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if time.perf_counter() - self.t0 < 1.0 and stage == "ingest" and done < total:
            return
        msg = f"{stage} {done}/{total}" if stage == "ingest" else stage
        if self._status is None:
            self._status = self.console.status(msg)
            self._status.start()
        else:
            self._status.update(msg)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
