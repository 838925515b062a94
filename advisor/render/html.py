"""Report -> one self-contained HTML file (jinja2, autoescape on, inline SVG, no network fetch).

The page's first screen answers "what limits the step, by how much, and how sure are we":
the verdict (top finding and its saving), the step-time breakdown, and what could not be
analysed. Charts are inline SVG whose geometry comes from :mod:`advisor.render.charts`; the
templates draw them with autoescaping, so operator names from a profile are always text.

A Content-Security-Policy meta tag (``default-src 'none'``) forbids any fetch; the one inline
script (table sorting, expand/collapse) is allowed by its SHA-256 hash only.

Optional inputs the page uses when present:

* ``report.baseline_diff`` and ``report.gate`` (from :mod:`advisor.gate`);
* ``report.comm_matrix``: a list of ``{"src": rank, "dst": rank, "bandwidth_gbps" |
  "time_us" | "bytes": value}`` (or ``{"links": [...]}``) -> communication heat map;
* finding ``top`` rows with ``intensity`` (FLOP/byte) and ``achieved_tflops`` (and ``name``) ->
  roofline scatter; the roof is drawn when a finding's evidence has ``peak_tflops`` and
  ``peak_bandwidth_gbps`` (or ``peak_bandwidth_tbps``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from advisor.model import Report
from advisor.render import charts, variability_text
from advisor.render.hardware import view as hardware_view
from advisor.render.view import (
    PHASE_LABEL,
    PHASES,
    SEVERITIES,
    breakdown_summary,
    calibration_lines,
    combined_line,
    compact_ints,
    confidence,
    config_line,
    cp_edges,
    display_data,
    explained_note,
    fmt_bytes,
    fmt_evidence,
    fmt_ratio,
    fmt_us,
    fmt_value,
    is_threshold_key,
    scope_line,
    scope_note,
    short_name,
    slow_steps,
    truncate,
    verdict,
    whole_window_note,
    window_note,
)
from advisor.text import printable

SCRIPT_TEMPLATE = "_script.js.j2"
MAX_TOP_ROWS = 25
MAX_OPS_LISTED = 30


def templates_dir() -> Path:
    """Where the templates live: ``templates/`` beside the ``advisor`` package in a source tree (an
    editable install of another checkout must not lend its templates to this one's code), else the
    installed ``advisor_templates`` package."""
    source = Path(__file__).resolve().parents[2] / "templates"
    if (source / "report.html.j2").is_file():
        return source
    try:
        import advisor_templates  # type: ignore[import-not-found]  # installed: pyproject maps it to templates/

        return Path(advisor_templates.__file__).resolve().parent
    except ImportError:
        return Path(__file__).resolve().parents[2] / "templates"


def _visible(value: Any) -> Any:
    """Every printed value through :func:`advisor.text.printable`: control characters and
    bidirectional overrides become U+FFFD (HTML forbids the controls). Markup the templates
    build (a macro's output) stays Markup."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    if text == value:
        return value
    return markupsafe.Markup(text) if isinstance(value, markupsafe.Markup) else text


def environment(override: str | Path | None = None) -> jinja2.Environment:
    """The jinja environment; templates in ``override`` (if given) win over the built-in ones.
    One environment per template directory, so each template is compiled once per process
    (jinja reloads a template whose file changed)."""
    return _environment(None if override is None else str(Path(override).resolve()))


@functools.lru_cache(maxsize=8)
def _environment(override: str | None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = []
    if override is not None:
        loaders.append(jinja2.FileSystemLoader(str(override)))
    loaders.append(jinja2.FileSystemLoader(str(templates_dir())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        autoescape=True,  # every template, whatever its extension: profile strings are never markup
        undefined=jinja2.ChainableUndefined,  # optional keys of older/newer JSON reports render as empty
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_visible,
    )
    env.filters.update(us=fmt_us, pct=fmt_ratio, val=fmt_value, ints=compact_ints, trunc=truncate, short=short_name)
    return env


def _csp(env: jinja2.Environment) -> str:
    script = env.get_template(SCRIPT_TEMPLATE).render()
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
            "base-uri 'none'; form-action 'none'")


_INLINE = re.compile(r"(`[^`]+`|\*\*[^*]+\*\*)")


def _inline(text: str) -> list[dict[str, str]]:
    """Markdown inline code and bold as tokens (the template wraps them; nothing becomes markup)."""
    out = []
    for part in _INLINE.split(text):
        if not part:
            continue
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append({"t": "code", "s": part[1:-1]})
        elif part.startswith("**") and part.endswith("**") and len(part) > 3:
            out.append({"t": "b", "s": part[2:-2]})
        else:
            out.append({"t": "text", "s": part})
    return out


def md_blocks(text: str) -> list[dict[str, Any]]:
    """A small Markdown subset (headings, lists, tables, paragraphs) as blocks for the explain text."""
    blocks: list[dict[str, Any]] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            blocks.append({"type": "p", "parts": _inline(" ".join(para))})
            para.clear()

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            flush()
            continue
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if m:
            flush()
            blocks.append({"type": "h", "level": min(6, len(m.group(1)) + 3), "parts": _inline(m.group(2))})
        elif line.lstrip().startswith("|"):
            flush()
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(re.fullmatch(r":?-{2,}:?", c) for c in cells if c):
                continue
            if blocks and blocks[-1]["type"] == "table":
                blocks[-1]["rows"].append([_inline(c) for c in cells])
            else:
                blocks.append({"type": "table", "head": [_inline(c) for c in cells], "rows": []})
        elif re.match(r"^\s*([-*]|\d+\.)\s+", line):
            flush()
            item = re.sub(r"^\s*([-*]|\d+\.)\s+", "", line)
            if blocks and blocks[-1]["type"] == "list":
                blocks[-1]["entries"].append(_inline(item))
            else:
                blocks.append({"type": "list", "ordered": bool(re.match(r"^\s*\d", line)), "entries": [_inline(item)]})
        else:
            para.append(line.strip())
    flush()
    return blocks


def explain_texts(docs: Mapping[str, Any], rule_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """``advisor explain`` text of each rule (the report's ``rule_docs``), as blocks; rules the
    report has no text for are left out."""
    return {rid: md_blocks(str(docs[rid])) for rid in sorted(rule_ids) if isinstance(docs.get(rid), str)}


# Unit suffixes of evidence keys: (suffix, unit written after the value, or None where
# view.fmt_evidence writes it; a word the label gains for the quantity). The label drops the unit,
# the value carries it. Ratios and shares keep their word: "time share 82.3%".
_UNIT_SUFFIXES: tuple[tuple[str, str | None, str], ...] = (
    ("_us", None, ""), ("_ms", None, ""), ("_ns", None, ""), ("_bytes", None, "size"), ("_flop_per_byte", "FLOP/B", ""),
    ("_tflops", "TFLOP/s", "throughput"), ("_gbps", "GB/s", "bandwidth"), ("_tbps", "TB/s", "bandwidth"),
    ("_pct", "%", ""), ("_mhz", "MHz", "frequency"),
)


def _unit_split(key: str) -> tuple[str, str | None, str] | None:
    """(label stem, unit, quantity word) of a key ending in a unit (times also inside: ``time_us_per_step``)."""
    for suf, unit, word in _UNIT_SUFFIXES:
        if key.endswith(suf) and len(key) > len(suf):
            return key[: -len(suf)], unit, word
        if suf in ("_us", "_ms") and suf + "_" in key:
            head, tail = key.split(suf + "_", 1)
            return f"{head}_{tail}", unit, word
    return None


def evidence_label(key: str) -> str:
    """A human name for an evidence key: ``total_us`` -> ``total``, ``time_us_per_step`` -> ``time per step``,
    ``peak_gbps`` -> ``peak bandwidth`` (the unit goes with the value)."""
    split = _unit_split(key)
    stem = split[0] if split else key
    words = " ".join(stem.replace("_", " ").split())
    if split and split[2] and split[2] not in words:
        words = f"{words} {split[2]}"
    return words or key


def evidence_labels(keys: list[str]) -> dict[str, str]:
    """:func:`evidence_label` of each key, a time key whose label another key already has named
    ``... time`` (``step`` and ``step_us`` -> ``step`` and ``step time``)."""
    labels = {k: evidence_label(k) for k in keys}
    counts: dict[str, int] = {}
    for lab in labels.values():
        counts[lab] = counts.get(lab, 0) + 1
    for k, lab in labels.items():
        split = _unit_split(k)
        if counts[lab] > 1 and split and split[0] == k[: len(split[0])] and k.endswith(("_us", "_ms", "_ns")):
            labels[k] = f"{lab} time"
    return labels


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def evidence_value(key: str, v: Any) -> str:
    """An evidence value with its unit (from the key's suffix); a whole number as an integer."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return fmt_evidence(key, v)
    if key == "bytes":
        return fmt_bytes(float(v))
    split = _unit_split(key)
    if split and split[1]:
        return f"{fmt_value(v)} {split[1]}"
    text = fmt_evidence(key, v)
    if text == fmt_value(v) and isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"  # no unit: a count
    return text


def _sev(s: Any) -> str:
    return s if s in SEVERITIES else "info"


def finding_view(f: Mapping[str, Any], step_us: float | None) -> dict[str, Any]:
    """Everything one finding card shows, formatted."""
    ev = dict(f.get("evidence") or {})
    ev_labels = evidence_labels(list(ev))
    rows = [{"key": k, "label": ev_labels[k], "value": evidence_value(k, v), "raw": v,
             "cls": "num" if _is_number(v) else "text"} for k, v in ev.items()]
    measured = [r for r in rows if not is_threshold_key(r["key"])]
    limits = [r for r in rows if is_threshold_key(r["key"])]
    top = [dict(t) for t in (f.get("top") or [])][:MAX_TOP_ROWS]
    cols: list[str] = []
    for t in top:
        for k in t:
            if k not in cols and len(cols) < 10:
                cols.append(k)
    top_rows = [[{"text": truncate(evidence_value(c, t.get(c)), 90), "full": fmt_value(t.get(c)),
                  "num": t.get(c) if isinstance(t.get(c), (int, float)) and not isinstance(t.get(c), bool) else None}
                 for c in cols] for t in top]
    saving = f.get("estimated_saving_us")
    frac = f.get("saving_fraction")
    if frac is None and saving and step_us:
        frac = saving / step_us
    ops = [str(o) for o in (f.get("ops") or [])]
    return {
        **f,
        "severity": _sev(f.get("severity")),
        "anchor": "f-" + re.sub(r"[^A-Za-z0-9_-]", "", str(f.get("id") or f.get("rule") or "x")),
        "measured": measured,
        "limits": limits,
        "top_cols": cols,
        "top_labels": [evidence_labels(cols)[c] for c in cols],
        "top_rows": top_rows,
        "top_more": max(0, len(f.get("top") or []) - len(top)),
        "ranks_text": compact_ints(f.get("ranks")),
        "steps_text": compact_ints(f.get("steps")),
        "ops_list": ops[:MAX_OPS_LISTED],
        "ops_more": max(0, len(ops) - MAX_OPS_LISTED),
        "saving_text": fmt_us(saving) if saving else None,
        "saving_share": fmt_ratio(frac, 0) if frac else None,
        "saving_w": round(min(1.0, max(0.0, frac or 0.0)) * 100, 2),
    }


def context(report: Report | Mapping[str, Any]) -> dict[str, Any]:
    """The template context: the JSON form of the report plus chart geometry and formatted views."""
    d = display_data(report)
    prof = d.get("profile") or {}
    bd = d.get("breakdown") or []
    summary = breakdown_summary(d)
    step_us = summary["step_us"] if summary else None
    outl, outl_basis = slow_steps(d)
    raw = d.get("findings") or []
    verdict_id = verdict(d).get("finding_id")
    findings = [{**finding_view(f, step_us), "open": i < 3, "explained_note": explained_note(f, raw, verdict_id)}
                for i, f in enumerate(raw)]
    first_bar = None
    if summary and summary["step_us"] > 0:
        x = 0.0
        first_bar = []
        for p in summary["phases"]:
            w = 100.0 * p["us"] / summary["step_us"]
            if w > 0:
                first_bar.append({"x": round(x, 3), "w": round(w, 3), "cls": "ph-" + p["key"][:-3],
                                  "title": f"{p['label']}: {fmt_us(p['us'])} ({fmt_ratio(p['share'])})"})
                x += w
    extras_known = {"gate", "baseline_diff", "comm_matrix", "total_saving_us", "savings", "rule_docs", "hardware",
                    "config"}
    return {
        "d": d,
        "profile": prof,
        "verdict": verdict(d),
        "window_note": window_note(d),
        "combined_line": combined_line(d),
        "summary": summary,
        "whole_window_note": whole_window_note(d),
        "first_bar": first_bar,
        "confidence": confidence(d),
        "config_line": config_line(d),
        "gate": d.get("gate"),
        "diff": d.get("baseline_diff"),
        "calibration": calibration_lines(d.get("baseline_diff") or {}),
        "findings": findings,
        "scope_note": scope_note(d),
        "scope_line": scope_line(d),
        "sev_counts": {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITIES},
        "explain": explain_texts(d.get("rule_docs") or {}, {str(f.get("rule")) for f in findings}),
        "outliers": sorted(outl),
        "charts": {
            "breakdown": charts.breakdown_bars(bd, outl, outl_basis),
            "ranks": charts.rank_comparison(bd),
            "series": charts.step_series(bd, outl, outl_basis),
            "cp_ops": charts.cp_ops(d.get("critical_path") or {}),
            "cp_timeline": charts.cp_timeline(d.get("critical_path") or {}),
            "roofline": charts.roofline(d.get("findings") or []),
            "comm": charts.comm_matrix(d),
        },
        "cp": d.get("critical_path") or {},
        "cp_edges": cp_edges(d),
        "phases": [{"key": k, "cls": "ph-" + k[:-3], "label": PHASE_LABEL[k]} for k in PHASES],
        "kinds": [{"cls": charts.kind_class(k), "label": charts.KIND_LABEL[k]} for k in charts.KINDS],
        "step_stats": d.get("step_times") or [],
        "variability_summary": variability_text.summary(d["variability"]) if d.get("variability") else [],
        "variability_shares": bool(d.get("variability")) and variability_text.shares_known(d["variability"]),
        "rules": d.get("rules") or [],
        "hwv": hardware_view(d.get("hardware")),
        "unknown_extras": sorted(k for k in d if k not in extras_known and k not in (
            "schema", "tool", "profile", "breakdown", "critical_path", "findings", "warnings", "rules", "step_times")),
    }


def overlay_link(html_path: str | Path, overlay_path: str | Path) -> dict[str, str]:
    """The HTML report's link to an overlay written beside it: ``href``, the overlay's path
    relative to the HTML file's directory, percent-encoded (a file name is never markup, a query,
    a fragment or a scheme); ``name``, that path as shown (printable; the template escapes it)."""
    html_dir = Path(os.path.abspath(html_path)).parent
    rel = Path(os.path.relpath(os.path.abspath(overlay_path), html_dir)).as_posix()
    return {"href": urllib.parse.quote(rel, safe="/"), "name": printable(rel)}


def render(report: Report | Mapping[str, Any], *, templates: str | Path | None = None,
           overlay: Mapping[str, str] | None = None) -> str:
    """The HTML report as one string (a Report, or the dict of a JSON report). ``overlay``: the
    Chrome-trace overlay written in the same run (:func:`overlay_link`), linked from the page;
    without it the page says how to write one."""
    env = environment(templates)
    ctx = context(report)
    ctx["overlay"] = dict(overlay) if overlay else None
    ctx["csp"] = _csp(env)
    return env.get_template("report.html.j2").render(**ctx)
