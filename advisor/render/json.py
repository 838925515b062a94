"""Report -> JSON (contract ``advisor.report/v1``; extra fields allowed, none renamed or dropped)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from advisor.config import ConfigError
from advisor.model import SCHEMA_ID, Finding, Report, clean

__all__ = ["clean", "finding_dict", "read_report", "render", "report_dict"]


def finding_dict(f: Finding) -> dict[str, Any]:
    """One finding in contract form plus extra fields (id, saving basis, top rows; its scope where
    --rank narrowed the report and the finding is not about the chosen rank alone)."""
    return {
        "id": f.id,
        "rule": f.rule,
        "bottleneck": f.bottleneck,
        "cause": f.cause,
        "severity": f.severity.label,
        "title": f.title,
        "detail": f.detail,
        "evidence": dict(f.evidence),
        "ranks": list(f.ranks),
        "steps": list(f.steps),
        "ops": list(f.ops),
        "estimated_saving_us": f.estimated_saving_us,
        "saving_fraction": f.saving_fraction,
        "saving_basis": f.saving_basis,
        "optimizations": [{"id": o.id, "title": o.title, "how": o.how} for o in f.optimizations],
        "top": [dict(t) for t in f.top],
        "explains": list(f.explains),
        "explained_by": list(f.explained_by),
        "root": f.root,
        "root_id": f.root_id,
        **({"replay": dict(f.replay)} if f.replay is not None else {}),
        **({"scope": f.scope} if f.scope else {}),
    }


def report_dict(report: Report) -> dict[str, Any]:
    """The whole report as a JSON-ready dict."""
    out: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "tool": {"name": "advisor", "version": report.tool_version},
        "profile": report.profile,
        "breakdown": report.breakdown,
        "critical_path": report.critical_path,
        "findings": [finding_dict(f) for f in report.findings],
        "warnings": [w.to_json() for w in report.warnings],
        "rules": [
            {"rule": o.rule, "status": o.status, "reason": o.reason, "findings": o.findings, "seconds": round(o.seconds, 4),
             "applicable": o.applicable}
            for o in report.rules
        ],
        "step_times": report.step_times,
    }
    if report.savings is not None:
        out["total_saving_us"] = report.total_saving_us
        out["savings"] = report.savings
    if report.comm_matrix:
        out["comm_matrix"] = report.comm_matrix
    if report.gate is not None:
        out["gate"] = report.gate
    if report.baseline_diff is not None:
        out["baseline_diff"] = report.baseline_diff
    if report.variability is not None:
        out["variability"] = report.variability
    if report.parallel_groups:
        out["parallel_groups"] = report.parallel_groups
    if report.step_matrix:
        out["step_matrix"] = report.step_matrix
    if report.window_phases:
        out["window_phases"] = report.window_phases
    if report.rule_docs:
        out["rule_docs"] = dict(sorted(report.rule_docs.items()))
    if report.hardware is not None:
        out["hardware"] = report.hardware
    if report.config is not None:
        out["config"] = report.config
    return cast(dict[str, Any], clean(out))


def render(report: Report | Mapping[str, Any]) -> str:
    """Strict JSON text (allow_nan=False: a NaN that slipped through is a bug, not output) of a
    Report, or of the dict of a JSON report (written again as it is)."""
    d = report_dict(report) if isinstance(report, Report) else clean(dict(report))
    return json.dumps(d, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def read_report(path: Path) -> dict[str, Any]:
    """A JSON report written earlier (``--format json``), as the dict every renderer takes; a file
    that is not one is a :class:`~advisor.config.ConfigError` naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a JSON report (advisor analyze reads profiles)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON file: {exc}") from None
    if not isinstance(data, dict) or "schema" not in data:
        raise ConfigError(f"{path}: not an advisor JSON report (no 'schema' field; advisor analyze reads profiles)")
    if data.get("schema") != SCHEMA_ID:
        raise ConfigError(f"{path}: report schema {data.get('schema')!r}, expected {SCHEMA_ID!r}")
    if not isinstance(data.get("breakdown"), list) or not isinstance(data.get("findings"), list):
        raise ConfigError(f"{path}: report lacks 'breakdown' or 'findings'")
    return data
