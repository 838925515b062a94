"""Report -> GitHub-flavoured Markdown for a pull-request comment (the same content as the HTML first screen).

Every string that comes from a profile (operator names, paths, titles that quote them, warning
messages) goes through :func:`md_escape`: Markdown punctuation is backslash-escaped, ``& < >`` become
entities (so ``<script>`` is text, not HTML), and newlines collapse to spaces so a name cannot break
a table row. Rule documentation (``advisor explain``) is kept as Markdown, through :func:`safe_doc` (a
report may carry anything in ``rule_docs``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from advisor.model import Report
from advisor.render.view import (
    breakdown_summary,
    calibration_lines,
    combined_line,
    compact_ints,
    confidence,
    config_line,
    cp_edges,
    display_data,
    explained_note,
    fmt_evidence,
    fmt_ratio,
    fmt_us,
    fmt_value,
    is_threshold_key,
    per_rank_means,
    scope_note,
    short_name,
    slow_steps,
    step_text,
    steps_text,
    truncate,
    verdict,
    whole_window_note,
    window_note,
)
from advisor.text import printable

# Markdown punctuation that can start markup mid-line (emphasis, code, links, tables, strikethrough,
# mentions / issue refs); the rest only matters at the start of a line, which renderers never give a profile string.
_MD_PUNCT = re.compile(r"([\\`*_\[\]{}#|~@$])")
_SPARK = "▁▂▃▄▅▆▇█"


def _printable(text: str) -> str:
    """Escape sequences from a profile go (:func:`advisor.text.printable`); every other character
    that is not printable becomes U+FFFD (controls are invalid in HTML and break tables)."""
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in printable(text))


def md_escape(value: Any, limit: int | None = None) -> str:
    """Text safe inside Markdown paragraphs and table cells: one line, no markup, no HTML."""
    s = " ".join(str(value).split())  # newlines, tabs, CR -> single spaces
    s = _printable(s)
    if limit is not None:
        s = truncate(s, limit)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_PUNCT.sub(r"\\\1", s)
    return s.replace("://", ":\\/\\/").replace("www.", "www\\.")  # no autolinks


def html_text(value: Any, limit: int | None = None) -> str:
    """Text for inside raw HTML tags such as ``<summary>`` (Markdown is not parsed there)."""
    s = _printable(" ".join(str(value).split()))
    if limit is not None:
        s = truncate(s, limit)
    return html.escape(s, quote=True)


def _bar(share: float | None, width: int = 20) -> str:
    if not share or share <= 0:
        return ""
    n = max(1, round(min(1.0, share) * width))
    return "█" * n


def spark(values: list[float], width: int = 40) -> str:
    """A sparkline of step times (▁ … █), at most ``width`` characters: more steps than that are
    drawn in equal groups, each by its slowest step."""
    if not values:
        return ""
    if len(values) > width:
        n = len(values)
        values = [max(values[i * n // width:(i + 1) * n // width]) for i in range(width)]
    lo, hi = min(values), max(values)
    if hi <= lo:
        return _SPARK[0] * len(values)
    return "".join(_SPARK[min(7, int((v - lo) / (hi - lo) * 7.999))] for v in values)


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


#: A GitHub comment holds 65,536 characters: the default report stays under this, whatever the profile.
MD_LIMIT = 60_000
#: Room kept for the confidence section (rules that ran, were skipped or failed; input warnings), which comes last.
_TAIL_BUDGET = 12_000
_FIRST_FIXES = 2  # optimisations shown per finding in the compact report (all with ``full``)


def render(report: Report | Mapping[str, Any], *, max_findings: int = 20, full: bool = False) -> str:
    """The Markdown report (a Report, or the dict of a JSON report) for a pull-request comment.

    In this order: verdict, CI gate, baseline diff, step-time breakdown, findings (evidence, the
    first fixes, ``advisor explain ID``), critical path, then confidence and the skipped rules and
    input warnings. Every table and list is capped (the rest is counted and left to the JSON / HTML
    report) and the findings' details fill what the other sections leave of :data:`MD_LIMIT`
    characters, so the report fits a GitHub comment for any profile. ``full`` embeds each rule's
    documentation and every optimisation instead, without that bound.
    """
    d = display_data(report)
    head = _head(d)
    gate = d.get("gate")
    if gate:
        head += _gate(gate)
    diff = d.get("baseline_diff")
    if diff:
        head += _diff(diff)
    head += _breakdown(d) + _groups(d)
    tail = _hardware(d) + _critical_path(d) + _variability(d) + _confidence(d)
    findings = d.get("findings") or []
    budget = None if full else MD_LIMIT - _size(head) - _size(tail) - 2_000
    body = _findings(findings, max_findings=max_findings, full=full, budget=budget, docs=d.get("rule_docs"),
                    savings=d.get("savings"))
    text = "\n".join(head + body + tail).rstrip() + "\n"
    if not full and len(text) > MD_LIMIT:  # a last resort: every section above is capped on its own
        cut = text.rfind("\n", 0, MD_LIMIT - 200)
        text = text[:cut] + "\n\n… the rest of this report is in the JSON / HTML report.\n"
    return text


def _groups(d: Mapping[str, Any]) -> list[str]:
    """The parallel groups and the ranks x steps picture, in one paragraph."""
    from advisor.render.groups import summary

    text = summary(dict(d))
    return [md_escape(text, 1200), ""] if text else []


def _size(lines: list[str]) -> int:
    return sum(len(x) + 1 for x in lines)


def _capped(items: list[str], budget: int, more: str, max_items: int | None = None) -> list[str]:
    """``items`` while their total length stays within ``budget`` (and at most ``max_items``), then
    one line counting the rest (``more`` with ``{n}`` for that count)."""
    out: list[str] = []
    used = 0
    for i, item in enumerate(items):
        if used + len(item) + 1 > budget or (max_items is not None and i >= max_items):
            out.append(more.format(n=len(items) - i))
            break
        out.append(item)
        used += len(item) + 1
    return out


def _head(d: Mapping[str, Any]) -> list[str]:
    prof = d.get("profile") or {}
    out: list[str] = []
    v = verdict(d)
    out.append("## advisor: " + md_escape(v["title"], 300))
    out.append("")
    if v["kind"] == "finding":
        line = f"**{v['severity'].upper()}** · {md_escape(v['rule'])} {md_code(v['cause'])}"
        if v.get("saving_us"):
            line += f" · **up to {fmt_us(v['saving_us'])} per step**"
            if v.get("saving_fraction"):
                line += f" ({fmt_ratio(v['saving_fraction'], 0)} of {v.get('of_step') or 'the step'})"
        if v.get("scope"):
            line += " · cluster-wide, not narrowed"
        if v["others"]:
            line += f" · {v['others']} more finding{'s' if v['others'] != 1 else ''}"
        out.append(line)
        out.append("")
    if fix := combined_line(d):
        out += [md_escape(fix, 1000), ""]
    if note := window_note(d):
        out += [md_escape(note, 1000), ""]
    ranks = prof.get("ranks") or []
    out.append(f"Profile {md_escape(prof.get('path', ''), 200)} · {md_escape(', '.join(prof.get('sources') or []) or '?', 100)}"
               f" · {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
               + (f" (world size {prof['world_size']})" if prof.get("world_size") else "")
               + f" · steps {steps_text(prof.get('steps'))}" + (" (inferred)" if prof.get("steps_inferred") else "")
               + (" · CPU-only" if prof.get("cpu_only") else "")
               + f" · advisor {md_escape((d.get('tool') or {}).get('version', '?'), 40)}")
    out.append("")
    cfg_line = config_line(d)
    if cfg_line:
        out += [md_escape(cfg_line, 1000), ""]
    if scope_note(d):
        out += [f"*{md_escape(scope_note(d), 600)}.*", ""]
    return out


def _breakdown(d: Mapping[str, Any]) -> list[str]:
    summary = breakdown_summary(d)
    out = [f"### Step time{' — mean ' + fmt_us(summary['step_us']) if summary else ''}", ""]
    if not summary:
        return out + ["No step windows were found, so there is no breakdown.", ""]
    note = whole_window_note(d)
    if note:
        out += [md_escape(note), ""]
    out.append(_row("phase", "mean per step", "share", ""))
    out.append("|---|---:|---:|---|")
    for p in summary["phases"]:
        out.append(_row(p["label"], fmt_us(p["us"]), fmt_ratio(p["share"]), _bar(p["share"])))
    out.append("")
    return out + _ranks(d)


def _findings(findings: list[Mapping[str, Any]], *, max_findings: int, full: bool, budget: int | None,
              docs: Mapping[str, Any] | None = None, savings: Mapping[str, Any] | None = None) -> list[str]:
    out = [f"### Findings ({len(findings)})", ""]
    if not findings:
        return out + ["No rule fired on this profile.", ""]
    shown = findings[:max_findings]
    out.append(_row("severity", "rule", "finding", "saving / step", "ranks"))
    out.append("|---|---|---|---:|---|")
    verdict_id = verdict({"findings": findings, "savings": savings}).get("finding_id")
    for f in shown:
        saving = fmt_us(f.get("estimated_saving_us")) if f.get("estimated_saving_us") else "-"
        if f.get("estimated_saving_us") and f.get("saving_fraction"):
            saving += f" ({fmt_ratio(f['saving_fraction'], 0)})"
        note = explained_note(f, findings, verdict_id)
        title = md_escape(f.get("title"), 200) + (f" *({md_escape(note, 120)})*" if note else "")
        out.append(_row(f"**{md_escape(f.get('severity'), 20)}**", md_escape(f.get("rule"), 20),
                        title, saving, md_escape(compact_ints(f.get("ranks"), limit=6))))
    if len(findings) > max_findings:
        out.append(f"\n… {len(findings) - max_findings} more findings in the HTML/JSON report.")
    out.append("")
    explains = _explains(docs or {}, {str(f.get("rule")) for f in shown}) if full else {}
    used = _size(out)
    for i, f in enumerate(shown):
        block = _finding(f, explains.get(str(f.get("rule"))), full=full)
        if budget is not None and used + _size(block) > budget:
            rest = len(shown) - i
            out += [(f"The details of {rest} more finding{'s' if rest != 1 else ''} are in the JSON / HTML report "
                     "(`advisor explain ID` describes each rule)."), ""]
            break
        out += block
        used += _size(block)
    return out


def _confidence(d: Mapping[str, Any]) -> list[str]:
    """Confidence, failed and skipped rules, input warnings: the last section, capped at :data:`_TAIL_BUDGET`."""
    conf = confidence(d)
    out = [f"### Confidence: {conf['level']}", "", md_escape(conf["summary"]) + "."]
    items = [f"- {md_escape(n, 300)}" for n in conf["notes"]]
    items += [f"- **{md_escape(r.get('rule'), 20)}** failed: {md_escape(r.get('reason'), 300)}" for r in conf["errors"]]
    out += _capped(items, _TAIL_BUDGET // 4, "- … {n} more in the JSON report")
    out.append("")
    if conf["skipped"]:
        out.append(f"<details><summary>{len(conf['skipped'])} rule(s) could not run</summary>")
        out.append("")
        out += _capped([f"- **{md_escape(r.get('rule'), 20)}**: {md_escape(r.get('reason'), 200)}" for r in conf["skipped"]],
                       _TAIL_BUDGET // 3, "- … {n} more in the JSON report")
        out += ["", "</details>", ""]
    if conf["not_applicable"]:
        out.append(f"<details><summary>{len(conf['not_applicable'])} rule(s) not applicable to this profile</summary>")
        out.append("")
        out += _capped([f"- **{md_escape(r.get('rule'), 20)}**: {md_escape(r.get('reason'), 120)}"
                        for r in conf["not_applicable"]], _TAIL_BUDGET // 6, "- … {n} more in the JSON report")
        out += ["", "</details>", ""]
    if conf["shown_warnings"]:
        ws = conf["shown_warnings"]
        out.append(f"<details><summary>{len(ws)} input warning(s)</summary>")
        out.append("")
        lines = []
        for w in ws:
            where = f"{md_escape(w.get('path'), 100)}: " if w.get("path") else ""
            lines.append(f"- {md_escape(w.get('code'), 40)}: {where}{md_escape(w.get('message'), 200)}")
        out += _capped(lines, _TAIL_BUDGET // 3, "- … {n} more in the JSON report", max_items=30)
        out += ["", "</details>", ""]
    return out


def md_code(value: Any, limit: int | None = None, *, cell: bool = False) -> str:
    """``value`` as one inline code span, fences included: one line, cut to ``limit`` characters,
    fenced by one backtick more than its longest run of backticks (so a backtick in it is text),
    and in a table ``cell`` its ``|`` escaped (GitHub splits cells on ``|`` even inside code)."""
    s = _printable(" ".join(str(value).split()))
    if limit is not None:
        s = truncate(s, limit)
    if cell:
        s = s.replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall("`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _gate(gate: Mapping[str, Any]) -> list[str]:
    out = [f"### CI gate: {'❌ failed' if gate.get('status') == 'failed' else '✅ passed'}", ""]
    out.append(_row("check", "limit", "measured", "result"))
    out.append("|---|---|---:|---|")
    checks = list(gate.get("checks") or [])
    for c in checks[:30]:
        if c.get("check") == "fail_on":
            limit = f"no finding at or above {md_escape(c.get('threshold'))}"
        elif c.get("check") == "baseline":
            limit = f"step at most {fmt_value(c.get('threshold'))}% slower"
        else:
            limit = ("≥ " if c.get("bound") == "min" else "≤ ") + fmt_value(c.get("threshold"))
        value = c.get("value")
        shown = "-" if value is None else (f"{value:+.1f}%" if c.get("check") == "baseline" else fmt_value(value))
        name = f" {md_code(c['name'], 60, cell=True)}" if c.get("name") else ""
        note = f" ({md_escape(c['note'], 200)})" if c.get("note") else ""
        out.append(_row(f"{md_escape(c.get('check'), 40)}{name}", limit, shown,
                        ("pass" if c.get("passed") else "**fail**") + note))
    if len(checks) > 30:
        out.append(f"\n… {len(checks) - 30} more checks in the JSON report.")
    out.append("")
    out += _capped([f"- {md_escape(m, 500)}" for m in gate.get("messages") or []], 5_000,
                   "- … {n} more in the JSON report")
    out.append("")
    return out


def _ranks(d: Mapping[str, Any]) -> list[str]:
    """Per-rank step means with a sparkline of step times (at most 16 ranks: the slowest)."""
    bd = d.get("breakdown") or []
    pr = per_rank_means(bd)
    if not pr:
        return []
    outl, _basis = slow_steps(d)
    series: dict[int, list[tuple[int, float]]] = {}
    for r in bd:
        if r.get("step") is not None:
            series.setdefault(int(r["rank"]), []).append((int(r["step"]), float(r.get("step_us") or 0.0)))
    shown = sorted(pr, key=lambda r: -pr[r]["step_us"])[:16] if len(pr) > 16 else sorted(pr)
    out = [_row("rank", "steps", "mean step", "busy", "comm only", "idle", "step times", "outliers"),
           "|---:|---:|---:|---:|---:|---:|---|---|"]
    for rank in shown:
        m = pr[rank]
        busy = m["step_us"] - m["comm_only_us"] - m["free_us"]
        pts = sorted(series.get(rank, []))
        out_steps = [s for s, _ in pts if (rank, s) in outl]
        out.append(_row(rank, int(m["steps"]), fmt_us(m["step_us"]), fmt_us(busy), fmt_us(m["comm_only_us"]),
                        fmt_us(m["free_us"]), spark([v for _, v in pts]), compact_ints(out_steps) if out_steps else ""))
    if len(pr) > 16:
        means = sorted(pr, key=lambda r: pr[r]["step_us"])
        mid = pr[means[len(means) // 2]]["step_us"]
        out.append(f"\n16 slowest of {len(pr)} ranks shown. Mean step over the {len(pr)} ranks: "
                   f"fastest {fmt_us(pr[means[0]]['step_us'])} (rank {means[0]}), median {fmt_us(mid)}, "
                   f"slowest {fmt_us(pr[means[-1]]['step_us'])} (rank {means[-1]}).")
    out.append("")
    return out


def _diff(diff: Mapping[str, Any]) -> list[str]:
    out = [f"### Against the baseline {md_escape(diff.get('baseline', ''), 200)}", ""]
    if diff.get("regression_pct") is not None:
        out.append(f"Mean step **{diff['regression_pct']:+.1f}%** (allowed +{fmt_value(diff.get('max_regression_pct'))}%)"
                   + (" — **regression**" if diff.get("regressed") else "") + ".")
    else:
        out.append("Step times could not be compared (no step windows in one of the runs).")
    for n in (diff.get("notes") or [])[:5]:
        out.append(f"\n_{md_escape(n, 300)}_")
    out.append("")
    if diff.get("phases"):
        out.append(_row("phase", "baseline", "now", "change", "of baseline step"))
        out.append("|---|---:|---:|---:|---:|")
        for p in diff["phases"]:
            pct = p.get("delta_pct_of_step")
            delta = ("+" if p["delta_us"] > 0 else "") + fmt_us(p["delta_us"])
            if p.get("slower"):
                delta = f"**{delta}**"
            out.append(_row(p["label"], fmt_us(p["baseline_us"]), fmt_us(p["current_us"]), delta,
                            "-" if pct is None else f"{pct:+.1f}%"))
        out.append("")
    for label, key in (("New findings", "new_findings"), ("Gone findings", "gone_findings"),
                       ("Severity changed", "changed_findings")):
        items = diff.get(key) or []
        if items:
            out.append(f"**{label} ({len(items)})**")
            out.append("")
            for f in items[:10]:
                was = f" (was {md_escape(f['baseline_severity'], 20)})" if f.get("baseline_severity") else ""
                out.append(f"- **{md_escape(f.get('severity'), 20)}**{was} {md_escape(f.get('rule'), 20)} "
                           f"{md_code(f.get('cause'), 60)} ranks {md_escape(compact_ints(f.get('ranks'), limit=6))}: "
                           f"{md_escape(f.get('title'), 200)}")
            if len(items) > 10:
                out.append(f"- … {len(items) - 10} more in the JSON / HTML report")
            out.append("")
    cal = calibration_lines(diff)
    if cal:
        out += ["**Predicted against measured** (mean step)", ""]
        out += [f"- {md_escape(line, 300)}" for line in cal[:-1][:10]]
        out += ["", f"_{md_escape(cal[-1], 300)}_", ""]
    if not any(diff.get(k) for k in ("new_findings", "gone_findings", "changed_findings")):
        out += ["Same findings as the baseline.", ""]
    return out


def _explains(docs: Mapping[str, Any], rule_ids: set[str]) -> dict[str, str]:
    """Each rule's ``advisor explain`` text (the report's ``rule_docs``, through :func:`safe_doc`),
    its headings below the finding's."""
    out = {}
    for rid in rule_ids:
        text = docs.get(rid)
        if isinstance(text, str):
            out[rid] = re.sub(r"^(#{1,4}) ", lambda m: "#" * min(6, len(m.group(1)) + 3) + " ", safe_doc(text),
                              flags=re.MULTILINE)
    return out


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
_IMAGE = re.compile(r"!\[[^\]]*\](?:\([^)]*\)|\[[^\]]*\])?")
_LINK = re.compile(r"\[([^\]]*)\]\(\s*<?([^)\s>]*)>?[^)]*\)")
_LINK_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S*?)>?(?:\s.*)?$")
_WEB = re.compile(r"https?://", re.IGNORECASE)
#: a ``<`` that opens raw HTML (a tag, a closing tag, a comment, a declaration) or an autolink
_HTML_START = re.compile(r"<(?=[A-Za-z/!?])")


def _safe_inline(text: str) -> str:
    """Prose outside code: no image, a link only to an http(s) address (else its text), no HTML."""
    text = _IMAGE.sub("", text)
    text = _LINK.sub(lambda m: m.group(0) if _WEB.match(m.group(2)) else m.group(1), text)
    return _HTML_START.sub("&lt;", text)


def safe_doc(text: str) -> str:
    """Rule documentation taken from a report, as Markdown that can only show text: images go (a
    tracking pixel in a pull-request comment), links keep only http(s) addresses (no
    ``javascript:``, ``data:``), raw HTML and autolinks become text; code spans and fenced code,
    which Markdown shows literally, stay as they are. The installed rules' text passes unchanged."""
    out: list[str] = []
    fence: str | None = None
    for line in printable(text).split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        d = _LINK_DEF.match(line)
        if d:
            if _WEB.match(d.group(1)):
                out.append(line)
            continue
        parts, pos = [], 0
        for c in _CODE_SPAN.finditer(line):
            parts += [_safe_inline(line[pos:c.start()]), c.group(0)]
            pos = c.end()
        out.append("".join(parts) + _safe_inline(line[pos:]))
    return "\n".join(out)


def _finding(f: Mapping[str, Any], explain: str | None, *, full: bool = False) -> list[str]:
    """One finding's details: cause, ranks, saving, evidence, the first fixes and where its rule is
    documented (``advisor explain ID``; embedded, with every fix, when ``full``)."""
    saving = ""
    if f.get("estimated_saving_us"):
        saving = f" — save ≤ {html_text(fmt_us(f['estimated_saving_us']))}/step"
    rule = md_code(f"advisor explain {' '.join(str(f.get('rule')).split())[:20]}")
    summary = (f"<details><summary><b>{html_text(f.get('severity'), 20)}</b> {html_text(f.get('rule'), 20)}: "
               f"{html_text(f.get('title'), 200)}{saving}</summary>")
    out = [summary, ""]
    out.append(f"- cause: {md_code(f.get('cause'), 80)} ({md_escape(f.get('bottleneck'), 40)})")
    out.append(f"- ranks: {md_escape(compact_ints(f.get('ranks')))}; steps: {md_escape(compact_ints(f.get('steps')))}")
    if f.get("explained_by"):
        out.append("- explained by " + ", ".join(md_code(x) for x in f["explained_by"]))
    if f.get("estimated_saving_us"):
        basis = f": {md_escape(f['saving_basis'], 300)}" if f.get("saving_basis") else ""
        out.append(f"- estimated saving: up to {fmt_us(f['estimated_saving_us'])} per step"
                   + (f" ({fmt_ratio(f['saving_fraction'], 0)})" if f.get("saving_fraction") else "") + basis)
    ops = list(f.get("ops") or [])
    n_ops = 10 if full else 5
    if ops:
        out.append("- operators: " + ", ".join(md_escape(o, 100) for o in ops[:n_ops])
                   + (f", … {len(ops) - n_ops} more" if len(ops) > n_ops else ""))
    if f.get("detail"):
        out += ["", md_escape(f["detail"], 1000 if full else 500)]
    ev = list((f.get("evidence") or {}).items())
    n_ev = 30 if full else 12
    if ev:
        out += ["", _row("evidence", "value", ""), "|---|---:|---|"]
        for k, val in ev[:n_ev]:
            out.append(_row(md_code(k, 60, cell=True), md_escape(fmt_evidence(k, val), 120),
                            "threshold" if is_threshold_key(k) else "measured"))
        if len(ev) > n_ev:
            out.append(_row(f"… {len(ev) - n_ev} more", "", ""))
    top = list(f.get("top") or [])
    n_top = 10 if full else 5
    if top:
        cols: list[str] = []
        for t in top[:n_top]:
            cols += [k for k in t if k not in cols]
        cols = cols[:8 if full else 6]
        out += ["", _row(*(md_escape(c, 40) for c in cols)), "|" + "---|" * len(cols)]
        for t in top[:n_top]:
            out.append(_row(*(md_escape(fmt_evidence(c, t.get(c)), 80 if full else 60) for c in cols)))
        if len(top) > n_top:
            out += ["", f"… {len(top) - n_top} more rows in the JSON / HTML report."]
    opts = list(f.get("optimizations") or [])
    shown = opts if full else opts[:_FIRST_FIXES]
    if shown:
        out += ["", "**What to do**", ""]
        for i, o in enumerate(shown, 1):
            how = f" — {md_escape(o.get('how'), 600)}" if o.get("how") else ""
            out.append(f"{i}. **{md_escape(o.get('title'), 200)}**{how}")
    if explain:
        out += ["", f"<details><summary>advisor explain {html_text(f.get('rule'), 20)}</summary>", "", explain.strip(), "",
                "</details>"]
    else:
        more = len(opts) - len(shown)
        out += ["", (f"{more} more fix{'es' if more != 1 else ''} and the rule's documentation: " if more
                     else "The rule's documentation: ") + rule]
    out += ["", "</details>", ""]
    return out


def _critical_path(d: Mapping[str, Any]) -> list[str]:
    cp = d.get("critical_path") or {}
    ops = list(cp.get("ops") or [])
    length = float(cp.get("length_us") or 0.0)
    if not ops or length <= 0:
        return []
    out = [f"### Critical path — rank {md_escape(cp.get('rank'))}, {md_escape(step_text(cp.get('step')))}, {fmt_us(length)}",
           ""]
    out.append(_row("operator", "kind", "time on path", "share"))
    out.append("|---|---|---:|---:|")
    for o in ops[:10]:
        t = float(o.get("total_us") or 0.0)
        out.append(_row(md_escape(short_name(o.get("name"), 90)), md_escape(o.get("kind")), fmt_us(t), fmt_ratio(t / length)))
    out.append("")
    edges = cp_edges(d)
    if edges:
        out += [f"Edges followed: {md_escape(edges[0])}.", ""]
        if edges[1]:
            out += [f"Note: {md_escape(edges[1])}.", ""]
    return out


#: room for the hardware section (one line per metric, capped)
_HARDWARE_BUDGET = 6_000


def _hardware(d: Mapping[str, Any]) -> list[str]:
    """Hardware metric series: one line per metric (kept first), the dropped ones and the most diverging devices."""
    hw = d.get("hardware")
    if not isinstance(hw, Mapping) or not hw.get("metrics"):
        return []
    metrics = list(hw.get("metrics") or [])
    kept = [m for m in metrics if m.get("kept")]
    dropped = [m for m in metrics if not m.get("kept")]
    out = ["", "## Hardware metrics", "",
           (f"{hw.get('devices')} device(s), {len(metrics)} metric(s): {len(kept)} kept, {len(dropped)} dropped as "
           "constant or redundant (Moneo's variance filter and normalised distance)."), ""]
    items = [f"- {md_escape(m.get('summary', m.get('metric')), 300)}" for m in kept + dropped]
    out += _capped(items, _HARDWARE_BUDGET, "- … {n} more metrics in the JSON / HTML report")
    div = [x for x in (hw.get("diverging") or [])][:5]
    if div:
        out += ["", "Furthest from their peers' median series: " + ", ".join(
            f"{md_escape(x.get('device'), 60)} ({md_escape(x.get('metric'), 40)}, {fmt_value(x.get('distance'))})"
            for x in div) + "."]
    out.append("")
    return out


def _variability(d: Mapping[str, Any]) -> list[str]:
    """Variability: step-time spread, the top operators by contribution, the prediction table (a few KB at most)."""
    from advisor.render import variability_text as vt

    v = d.get("variability")
    if not v:
        return []
    out = ["### Variability", ""]
    out += [md_escape(line, 500) for line in vt.summary(v)]
    if v.get("note"):
        out.append(f"_Note: {md_escape(v['note'], 400)}_")
    out.append("")
    ops = (v.get("ops") or [])[:5]
    if ops and vt.shares_known(v):
        out += [_row("operator", "kind", "p50", "p95", "sigma", "share of variance"), "|---|---|---:|---:|---:|---:|"]
        out += [_row(md_escape(vt.op_label(o, 80), 120), md_escape(o.get("kind")), fmt_us(o.get("p50_us")),
                     fmt_us(o.get("p95_us")), fmt_us(o.get("sigma_us")), vt.pct(vt.share(o))) for o in ops]
        out.append("")
    rows = (v.get("prediction") or {}).get("rows") or []
    if rows:
        out += [_row("scale", "ranks", "median", "p95", "expected", "P(>+5 %)", "P(>+10 %)", "P(>+20 %)"),
                "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        out += [_row(f"{r['scale']}x", r["ranks"], fmt_us(r["p50_us"]), fmt_us(r["p95_us"]) + ("\\*" if r.get("extrapolated") else ""),
                     fmt_us(r["mean_us"]), *(vt.pct(r.get(f"p_slowdown_{x}")) for x in (5, 10, 20))) for r in rows]
        out += ["", f"_Assumption: {md_escape(v.get('assumption'), 600)}. \\* beyond the measured range (a lower bound)._"]
    pp = (v.get("sensitivity") or {}).get("pipeline") or {}
    if pp.get("stages"):
        out.append(f"Pipeline: a slow rank hurts stage {int(pp['most_sensitive_stage'])} most "
                   f"(least slack of {len(pp['stages'])} stages).")
    out.append("")
    return out
