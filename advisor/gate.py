"""The CI gate: ``--fail-on SEVERITY``, ``--baseline``, ``--budget``. Exit 0 clean, 1 failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.config import ConfigError
from advisor.model import Report, Severity


@dataclass
class GateResult:
    """Outcome of the gate."""

    exit_code: int = 0
    messages: list[str] = field(default_factory=list)
    diff: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    def report_fields(self) -> dict[str, Any]:
        """Fields added to the JSON report."""
        out: dict[str, Any] = {}
        if self.checks or self.diff is not None:
            out["gate"] = {"status": "failed" if self.exit_code else "passed", "checks": self.checks, "messages": self.messages}
        if self.diff is not None:
            out["baseline_diff"] = self.diff
        return out


def parse_budgets(items: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``step_ms=120`` -> {"step_ms": 120.0}."""
    out: dict[str, float] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--budget {item!r}: expected NAME=VALUE, e.g. step_ms=120")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise ConfigError(f"--budget {item!r}: {v!r} is not a number") from None
    return out


def evaluate(report: Report, *, fail_on: str | None = None, baseline: Path | None = None,
             max_regression: float = 10.0, budgets: dict[str, float] | None = None) -> GateResult:
    """Apply the gate to a finished report."""
    res = GateResult()
    if fail_on:
        level = Severity.parse(fail_on)
        hits = [f for f in report.findings if f.severity >= level]
        res.checks.append({"check": "fail_on", "threshold": fail_on, "hits": len(hits), "passed": not hits})
        if hits:
            res.exit_code = 1
            res.messages.append(f"{len(hits)} finding(s) at or above {fail_on}: " + "; ".join(f"{f.rule} {f.title}" for f in hits[:3]))
    return res
