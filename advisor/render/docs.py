"""Rule documentation from one source: the rule module's docstring and its Thresholds."""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.causes import causes


def thresholds_table(spec: Any) -> str:
    """Markdown table of a rule's thresholds."""
    fields = spec.threshold_fields()
    if not fields:
        return "_No thresholds._\n"
    lines = ["| threshold | default | meaning | source |", "|---|---|---|---|"]
    for f in fields:
        default = f.default if f.default is not dataclasses.MISSING else "-"
        lines.append(f"| `{spec.id}.{f.name}` | `{default}` | {f.metadata.get('help', '')} | {f.metadata.get('source', '') or '-'} |")
    return "\n".join(lines) + "\n"


def rule_markdown(spec: Any) -> str:
    """``advisor explain ID``: summary, sections, thresholds, causes and their optimizations."""
    parts = [f"# {spec.id} {spec.name}", "", spec.doc.summary, ""]
    for k, v in spec.doc.sections.items():
        parts += [f"## {k}", v, ""]
    parts += ["## Thresholds", thresholds_table(spec)]
    parts += [f"## Needs\n{', '.join(spec.requires)}", ""]
    for cid in spec.all_causes:
        c = causes().get(cid)
        if c:
            parts += [f"## Cause `{cid}`: {c.meaning}"]
            parts += [f"{i}. **{o.title}** — {o.how}" for i, o in enumerate(c.optimizations, 1)]
            parts.append("")
    return "\n".join(parts).strip() + "\n"


def rules_markdown(specs: dict[str, Any]) -> str:
    """All rules as one Markdown page."""
    out = ["# advisor rules", "", "| id | name | cause | needs | status |", "|---|---|---|---|---|"]
    for s in specs.values():
        out.append(f"| {s.id} | {s.name} | {', '.join(s.all_causes)} | {', '.join(s.requires)} | {s.status} |")
    out.append("")
    for s in specs.values():
        out.append(rule_markdown(s).replace("\n# ", "\n## "))
    return "\n".join(out)
