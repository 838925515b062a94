"""The CI gate: ``--fail-on SEVERITY``, ``--baseline OTHER``, ``--budget NAME=VALUE``.

A pure function of reports: :func:`evaluate` compares a finished report with budgets and a
:class:`Baseline` *report*. A baseline given as a profile is analysed by the caller first (the CLI,
through :func:`advisor.analyze.analyze`); :func:`read_baseline` reads one given as a JSON report.

Exit codes: 0 clean, 1 the gate failed, 2 usage or input error (raised here as
:class:`~advisor.config.ConfigError`, which the CLI turns into one line on stderr and exit 2).

What is compared:

* **Baseline** — the mean step time and each phase of the breakdown (``compute_only``,
  ``overlapped``, ``comm_only``, ``host_only``, ``free``), as the mean over ranks of each
  rank's mean over its steps. The gate fails when the step got slower by more than
  ``--max-regression`` percent of the baseline step; the phases say where the time went.
  Findings are matched by rule, cause and ranks: *new* ones, *gone* ones, and ones whose
  severity changed.

  A baseline of another kind is named as such (:func:`kind_mismatch`). A CPU-only profile against
  one with device events is not judged: without a device timeline the breakdown counts host
  operators as compute, so the percent between them compares two different measurements, and
  the gate exits 2 (the wrong baseline is a usage error) after the report is written, with the
  diff shown for reading. Another world size or another source (Kineto against Ascend) is a
  warning: the step and its phases are defined alike, and comparing them is how one checks a
  scale-out or a port to another accelerator; the gate judges it and says what differs.
* **Budgets** — absolute limits on one profile, measured on the worst rank (the job runs at
  the pace of its slowest rank): ``step_ms``, ``<phase>_ms``/``_us``, ``<phase>_ratio``
  (share of the step), ``overlap_ratio_min`` (overlapped / communication, a lower bound) and
  ``findings_<severity>`` (most findings allowed at that severity or above). The reports' words
  are accepted too: ``idle_*`` for ``free_*``, ``compute_comm_*`` for ``overlapped_*``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.config import ConfigError
from advisor.model import SCHEMA_ID, Report, Severity
from advisor.render.view import PHASE_LABEL, PHASES, finding_key, overall_means, per_rank_means, report_data


@dataclass
class GateResult:
    """Outcome of the gate."""

    exit_code: int = 0
    messages: list[str] = field(default_factory=list)
    diff: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    def report_fields(self) -> dict[str, Any]:
        """Fields added to the JSON report (``gate`` and ``baseline_diff``)."""
        out: dict[str, Any] = {}
        if self.checks or self.diff is not None:
            out["gate"] = {"status": "failed" if self.exit_code else "passed", "checks": self.checks,
                           "messages": self.messages}
        if self.diff is not None:
            out["baseline_diff"] = self.diff
        return out

    def apply(self, report: Report) -> Report:
        """The report with the gate's outcome and the baseline diff."""
        fields = self.report_fields()
        return dataclasses.replace(report, gate=fields.get("gate"), baseline_diff=fields.get("baseline_diff"))

    def fail(self, message: str) -> None:
        """Record a failed check (exit 1, unless a usage error already set 2)."""
        self.exit_code = max(self.exit_code, 1)
        self.messages.append(message)


# ---------------------------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Budget:
    """One budget name: what it measures and whether the value is an upper or a lower bound."""

    name: str
    help: str
    measure: Callable[[Mapping[str, Any]], float | None]
    lower_bound: bool = False
    ratio: bool = False
    unit: str = ""


def _worst_phase(key: str, scale: float) -> Callable[[Mapping[str, Any]], float | None]:
    def measure(d: Mapping[str, Any]) -> float | None:
        pr = per_rank_means(d.get("breakdown") or [])
        return max(m[key] for m in pr.values()) / scale if pr else None

    return measure


def _worst_share(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    def measure(d: Mapping[str, Any]) -> float | None:
        pr = per_rank_means(d.get("breakdown") or [])
        shares = [m[key] / m["step_us"] for m in pr.values() if m["step_us"] > 0]
        return max(shares) if shares else None

    return measure


def _min_overlap(d: Mapping[str, Any]) -> float | None:
    pr = per_rank_means(d.get("breakdown") or [])
    vals = [m["overlap_ratio"] for m in pr.values() if m["overlap_ratio"] == m["overlap_ratio"]]  # skip NaN
    return min(vals) if vals else None


def _count_at_least(level: Severity) -> Callable[[Mapping[str, Any]], float | None]:
    def measure(d: Mapping[str, Any]) -> float | None:
        return float(sum(1 for f in d.get("findings") or [] if Severity.parse(f["severity"]) >= level))

    return measure


def _budgets() -> dict[str, Budget]:
    out: dict[str, Budget] = {}
    for key in ("step_us", *PHASES):
        base = key[:-3]
        label = PHASE_LABEL[key]
        out[f"{base}_ms"] = Budget(f"{base}_ms", f"mean {label} time per step on the worst rank, ms",
                                   _worst_phase(key, 1000.0), unit="ms")
        out[f"{base}_us"] = Budget(f"{base}_us", f"mean {label} time per step on the worst rank, µs",
                                   _worst_phase(key, 1.0), unit="µs")
        if key != "step_us":
            out[f"{base}_ratio"] = Budget(f"{base}_ratio", f"{label} share of the step on the worst rank (0..1)",
                                          _worst_share(key), ratio=True)
    out["overlap_ratio_min"] = Budget("overlap_ratio_min", "lowest overlapped / communication time of any rank (0..1)",
                                      _min_overlap, lower_bound=True, ratio=True)
    for sev in Severity:
        out[f"findings_{sev.label}"] = Budget(f"findings_{sev.label}",
                                              f"most findings allowed at severity {sev.label} or above",
                                              _count_at_least(sev))
    out["findings_total"] = Budget("findings_total", "most findings allowed in all", _count_at_least(Severity.INFO))
    return out


BUDGETS: dict[str, Budget] = _budgets()

#: The reports' words for two phases, accepted as budget names: ``idle`` is ``free`` and
#: ``compute_comm`` (compute ∥ comm) is ``overlapped``.
PHASE_ALIASES = {"idle": "free", "compute_comm": "overlapped"}
BUDGET_ALIASES: dict[str, str] = {
    f"{alias}{name[len(canon):]}": name
    for alias, canon in PHASE_ALIASES.items() for name in BUDGETS if name.startswith(canon + "_")
}


def budget_name(name: str) -> str:
    """The budget a name means (an alias resolved); unknown names are usage errors with a did-you-mean."""
    name = name.strip()
    if name in BUDGETS:
        return name
    if name in BUDGET_ALIASES:
        return BUDGET_ALIASES[name]
    close = difflib.get_close_matches(name.lower(), [*BUDGETS, *BUDGET_ALIASES], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    aliases = ", ".join(f"{a}_* = {c}_*" for a, c in PHASE_ALIASES.items())
    raise ConfigError(f"unknown budget {name!r}; {hint}known: {', '.join(BUDGETS)} ({aliases})")


def parse_budgets(items: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``step_ms=120`` -> {"step_ms": 120.0}; unknown names and bad values are usage errors."""
    out: dict[str, float] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--budget {item!r}: expected NAME=VALUE, e.g. step_ms=120")
        k, v = item.split("=", 1)
        try:
            k = budget_name(k)
        except ConfigError as exc:
            raise ConfigError(f"--budget {item!r}: {exc}") from None
        try:
            value = float(v)
        except ValueError:
            raise ConfigError(f"--budget {item!r}: {v!r} is not a number") from None
        if math.isnan(value) or value < 0:
            raise ConfigError(f"--budget {item!r}: must be a number >= 0")
        if BUDGETS[k].ratio and value > 1:
            raise ConfigError(f"--budget {item!r}: {k} is a ratio between 0 and 1 (e.g. 0.15 for 15 %)")
        out[k] = value
    return out


def _whole_window_ranks(d: Mapping[str, Any]) -> list[Any]:
    """Ranks whose breakdown is one window over the whole trace (no step window: ``step`` null)."""
    return sorted({r.get("rank") for r in d.get("breakdown") or [] if r.get("step") is None}, key=str)


def check_budgets(d: Mapping[str, Any], budgets: Mapping[str, float], res: GateResult) -> None:
    """Compare measured values with the budgets; an unmeasurable budget fails (a gate must not pass blind).

    A time budget (``_ms`` / ``_us``) cannot be measured on a rank without step windows: its one
    window is the whole trace, whose length says nothing of a step."""
    whole = _whole_window_ranks(d)
    for name, limit in budgets.items():
        b = BUDGETS[name]
        timed = bool(b.unit) and not name.startswith("findings_")
        value = None if timed and whole else b.measure(d)
        check: dict[str, Any] = {"check": "budget", "name": name, "threshold": limit, "value": value,
                                 "bound": "min" if b.lower_bound else "max"}
        if value is None and timed and whole:
            ranks = ", ".join(str(r) for r in whole[:8]) + (" ..." if len(whole) > 8 else "")
            check.update(passed=False, note=f"cannot be measured: no step windows on rank {ranks} (whole window)")
            res.fail(f"budget {name}={limit:g}: cannot be measured: no step windows on rank {ranks}; the whole "
                     "window is not a step (record ProfilerStep markers: prof.step() each iteration)")
        elif value is None:
            if name == "overlap_ratio_min":
                check.update(passed=True, note="no communication in this profile")
            else:
                check.update(passed=False, note="cannot be measured: no step windows")
                res.fail(f"budget {name}={limit:g}: cannot be measured (no step windows)")
        else:
            ok = value >= limit if b.lower_bound else value <= limit
            check["passed"] = ok
            if not ok:
                shown = f"{value:.3f}" if b.ratio else f"{value:.4g}"
                word = "below" if b.lower_bound else "over"
                res.fail(f"budget {name}: {shown}{b.unit and ' ' + b.unit} is {word} the budget {limit:g}{b.unit and ' ' + b.unit}")
        res.checks.append(check)


# ---------------------------------------------------------------------------------------------- baseline


def check_args(baseline: Path | None, max_regression: float) -> None:
    """What of ``--baseline`` / ``--max-regression`` can be checked before any profile is read."""
    if max_regression < 0 or math.isnan(max_regression):
        raise ConfigError(f"--max-regression {max_regression}: must be >= 0")
    if baseline is not None and not Path(baseline).exists():
        raise ConfigError(f"--baseline {baseline}: no such file or directory")


@dataclass(frozen=True)
class Baseline:
    """The report a run is compared with: ``path`` as given, its ``data`` (a report dict) and
    ``kind``: ``report`` (an earlier JSON report) or ``profile`` (a profile analysed for the gate)."""

    path: Path
    data: Mapping[str, Any]
    kind: str


def read_baseline(path: Path) -> Baseline | None:
    """A baseline given as a JSON report (checked: its schema, its breakdown and findings); None
    when ``path`` is a profile, which the caller analyses."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--baseline {path}: no such file or directory")
    if path.is_file() and path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"--baseline {path}: not a readable JSON file: {exc}") from None
        if isinstance(data, dict) and "schema" in data:
            if data.get("schema") != SCHEMA_ID:
                raise ConfigError(f"--baseline {path}: report schema {data.get('schema')!r}, expected {SCHEMA_ID!r}")
            if not isinstance(data.get("breakdown"), list) or not isinstance(data.get("findings"), list):
                raise ConfigError(f"--baseline {path}: report lacks 'breakdown' or 'findings'")
            return Baseline(path, data, "report")
    return None


def _family(source: str) -> str:
    """``ascend_pt`` / ``ascend_ms`` -> ``ascend`` (one device kind, two frameworks)."""
    return source.split("_", 1)[0]


def kind_mismatch(current: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """How ``base`` is of another kind than ``current``: (what makes the step times incomparable,
    what only needs saying). Fields an older report lacks are not compared."""
    cur_p, base_p = current.get("profile") or {}, base.get("profile") or {}
    blocking: list[str] = []
    noted: list[str] = []
    cur_cpu, base_cpu = cur_p.get("cpu_only"), base_p.get("cpu_only")
    if isinstance(cur_cpu, bool) and isinstance(base_cpu, bool) and cur_cpu != base_cpu:
        blocking.append("the baseline is a CPU-only profile and this one has device events" if base_cpu else
                        "the baseline has device events and this profile is CPU-only")
    cur_src = sorted({_family(str(x)) for x in cur_p.get("sources") or []})
    base_src = sorted({_family(str(x)) for x in base_p.get("sources") or []})
    if cur_src and base_src and cur_src != base_src:
        noted.append(f"another source: baseline {'+'.join(base_src)}, current {'+'.join(cur_src)}")
    cur_w, base_w = cur_p.get("world_size"), base_p.get("world_size")
    if isinstance(cur_w, int) and isinstance(base_w, int) and cur_w != base_w:
        noted.append(f"another world size: baseline {base_w}, current {cur_w}")
    return blocking, noted


def baseline_diff(current: Mapping[str, Any], base: Mapping[str, Any], max_regression: float) -> dict[str, Any]:
    """Step time per phase and findings of ``current`` against ``base``."""
    cur_m = overall_means(current.get("breakdown") or [])
    base_m = overall_means(base.get("breakdown") or [])
    phases: list[dict[str, Any]] = []
    regression_pct: float | None = None
    if cur_m and base_m:
        base_step = base_m["step_us"]
        for key in ("step_us", *PHASES):
            delta = cur_m[key] - base_m[key]
            pct = 100.0 * delta / base_step if base_step > 0 else None
            phases.append({"phase": key, "label": PHASE_LABEL[key], "baseline_us": round(base_m[key], 3),
                           "current_us": round(cur_m[key], 3), "delta_us": round(delta, 3),
                           "delta_pct_of_step": None if pct is None else round(pct, 2),
                           "slower": pct is not None and pct > max_regression})
        regression_pct = phases[0]["delta_pct_of_step"]
    ranks: list[dict[str, Any]] = []
    cur_r = per_rank_means(current.get("breakdown") or [])
    base_r = per_rank_means(base.get("breakdown") or [])
    for rank in sorted(set(cur_r) & set(base_r)):
        b, c = base_r[rank]["step_us"], cur_r[rank]["step_us"]
        ranks.append({"rank": rank, "baseline_step_us": round(b, 3), "current_step_us": round(c, 3),
                      "delta_pct": round(100.0 * (c - b) / b, 2) if b > 0 else None})
    ranks.sort(key=lambda r: -(r["delta_pct"] or 0.0))

    def brief(f: Mapping[str, Any]) -> dict[str, Any]:
        return {"key": finding_key(f), "rule": f.get("rule"), "cause": f.get("cause"), "severity": f.get("severity"),
                "title": f.get("title"), "ranks": list(f.get("ranks") or []),
                "estimated_saving_us": f.get("estimated_saving_us")}

    cur_f = {finding_key(f): f for f in current.get("findings") or []}
    base_f = {finding_key(f): f for f in base.get("findings") or []}
    changed = [
        {**brief(cur_f[k]), "baseline_severity": base_f[k].get("severity")}
        for k in cur_f
        if k in base_f and cur_f[k].get("severity") != base_f[k].get("severity")
    ]
    blocking, noted = kind_mismatch(current, base)
    gone = [f for k, f in base_f.items() if k not in cur_f]
    calibration = predicted_against_measured(gone, base_m, cur_m, comparable=not blocking)
    notes = []
    if blocking:
        notes.append("not comparable: " + "; ".join(blocking) + ": the step-time change is shown, not judged")
    if noted:
        notes.append("baseline of another kind: " + "; ".join(noted))
    if set(cur_r) != set(base_r):
        notes.append(f"rank sets differ: baseline {len(base_r)} ranks, current {len(cur_r)} ranks; "
                     "phase means are over each run's own ranks")
    return {
        "baseline": str((base.get("profile") or {}).get("path", "")),
        "max_regression_pct": max_regression,
        "regression_pct": regression_pct,
        "regressed": not blocking and regression_pct is not None and regression_pct > max_regression,
        "comparable": not blocking,
        "mismatch": blocking + noted,
        "phases": phases,
        "ranks": ranks[:64],
        "new_findings": [brief(f) for k, f in cur_f.items() if k not in base_f],
        "gone_findings": [brief(f) for k, f in base_f.items() if k not in cur_f],
        "changed_findings": changed,
        "calibration": calibration,
        "notes": notes,
    }


def _predicted(f: Mapping[str, Any]) -> tuple[float | None, str]:
    """A baseline finding's predicted saving per step and how it was predicted."""
    saving = f.get("estimated_saving_us")
    if not isinstance(saving, (int, float)) or isinstance(saving, bool):
        return None, "not estimated"
    rep = f.get("replay") or {}
    if rep.get("estimated") and rep.get("reproduced") and isinstance(rep.get("saving_us"), (int, float)) \
            and abs(float(rep["saving_us"]) - float(saving)) <= 1e-3 * max(1.0, abs(float(saving))):
        return float(saving), "replay"
    return float(saving), "rule estimate"


def predicted_against_measured(gone: list[Mapping[str, Any]], base_m: Mapping[str, float] | None,
                               cur_m: Mapping[str, float] | None, *, comparable: bool) -> dict[str, Any] | None:
    """What the baseline's findings that are gone now predicted against what the mean step gained.

    The measured gain is the whole step's (baseline mean step less this run's): where several
    findings went at once it is their joint gain, and it also holds any other change between the
    runs, so each row is a calibration point, not a proof. None when no finding went."""
    if not gone:
        return None
    measured = None
    if comparable and base_m and cur_m and base_m.get("step_us"):
        measured = round(float(base_m["step_us"]) - float(cur_m["step_us"]), 3)
    rows = []
    for f in gone:
        predicted, how = _predicted(f)
        rows.append({"key": finding_key(f), "rule": f.get("rule"), "cause": f.get("cause"), "title": f.get("title"),
                     "predicted_saving_us": None if predicted is None else round(predicted, 3),
                     "predicted_by": how,
                     "ratio": (round(measured / predicted, 3) if measured is not None and predicted else None)})
    predicted_total = [r["predicted_saving_us"] for r in rows if r["predicted_saving_us"] is not None]
    if measured is None:
        note = ("not measured: the runs are not comparable" if not comparable
                else "not measured: no step windows in one of the runs")
    elif len(rows) > 1:
        note = (f"{len(rows)} findings went at once: the measured gain is their joint one (predictions are "
                "not added: each is the step without its own cause)")
    else:
        note = "the measured gain is the whole step's: any other change between the runs is in it too"
    return {"measured_gain_us": measured, "baseline_step_us": None if not base_m else round(float(base_m["step_us"]), 3),
            "findings": rows, "largest_predicted_us": max(predicted_total) if predicted_total else None, "note": note}


# ---------------------------------------------------------------------------------------------- gate


def evaluate(report: Report | Mapping[str, Any], *, fail_on: str | None = None, baseline: Baseline | None = None,
             max_regression: float = 10.0, budgets: Mapping[str, float] | None = None) -> GateResult:
    """Apply the gate to a finished report (a Report or its JSON dict), against ``baseline``'s report."""
    res = GateResult()
    check_args(None, max_regression)
    d = report_data(report) if (fail_on or baseline or budgets) else {}
    if fail_on:
        level = Severity.parse(fail_on)
        hits = [f for f in d.get("findings") or [] if Severity.parse(f["severity"]) >= level]
        res.checks.append({"check": "fail_on", "threshold": level.label, "value": len(hits), "passed": not hits})
        if hits:
            res.fail(f"{len(hits)} finding(s) at or above {level.label}: "
                     + "; ".join(f"{f['rule']} {f['title']}" for f in hits[:3]))
    if baseline is not None:
        base = baseline.data
        diff = baseline_diff(d, base, max_regression)
        diff["baseline"] = str(baseline.path)
        diff["baseline_kind"] = baseline.kind
        res.diff = diff
        check = {"check": "baseline", "threshold": max_regression, "value": diff["regression_pct"],
                 "passed": not diff["regressed"] and diff["comparable"], "comparable": diff["comparable"]}
        blocking, noted = kind_mismatch(d, base)
        if blocking:
            check["note"] = "not comparable: " + "; ".join(blocking)
        elif diff["regression_pct"] is None:
            check["note"] = "no step windows in one of the runs: step times not compared"
        res.checks.append(check)
        if blocking:
            res.exit_code = 2
            res.messages.append(f"baseline {baseline.path} is not comparable: {'; '.join(blocking)}; "
                                "the step-time change is not judged (compare profiles of one kind)")
        elif noted:
            res.messages.append(f"baseline {baseline.path} is of another kind ({'; '.join(noted)}): "
                                "step times compared as they are")
        if diff["regressed"]:
            slower = [p for p in diff["phases"][1:] if p["delta_us"] > 0]
            slower.sort(key=lambda p: -p["delta_us"])
            where = ", ".join(f"{p['label']} +{p['delta_pct_of_step']:.1f}%" for p in slower[:3])
            res.fail(f"step time {diff['regression_pct']:+.1f}% against the baseline {baseline.path} "
                     f"(allowed {max_regression:g}%)" + (f"; slower: {where}" if where else ""))
    if budgets:
        check_budgets(d, budgets, res)
    return res
