"""Run every rule case file (tests/rules/cases/<ID>.toml): each rule fires on its planted case
and stays quiet on its control. One parametrized test, ids ``<ID>-<case>``.

Case format::

    [[case]]
    name = "slow_dataloader"
    expect = "fires"                     # or "quiet" (no finding of this rule at/above quiet_below)
    fixture = "tests/data/kineto/cpu_slow_dataloader"   # or "sample:NAME" (sample_profiles/NAME)
    # or generator = "module:func": func(tmp_dir) writes a profile there (returns its path or None)
    # or tables = "module:func": func() returns canonical rows {table: [row dicts]} (advisor.testing)
    set = { min_share = 0.2 }            # optional threshold overrides
    severity_at_least = "medium"         # optional checks on the rule's findings
    cause = "io.slow_data_processing"
    ranks = [1]
    steps = [8]
    evidence = { dataloader_share = [0.70, 0.80] }   # numeric [lo, hi] or exact string
    finding_cause = "io.slow_data_processing"  # optional: the checks above read the first finding of this cause
                                           # (default: the rule's first finding)
    saving_us = [900.0, 1100.0]          # the first finding's estimated_saving_us (replayed where the rule replays)
    where = { transport = "HCCS" }       # check the first finding whose evidence holds these values (default: the first)
    quiet_below = "low"                  # for quiet cases: findings below this severity are tolerated (default: any finding fails)
    slow = true                          # optional: over ~1 CPU-s; runs with the marked tests (-m slow), not the quick suite
"""

from __future__ import annotations

import importlib
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path
from typing import Any

import pytest

from advisor.config import Config
from advisor.model import Severity
from tests.conftest import ROOT, profile_group, report_json, resolve_fixture, shared_report

CASES_DIR = Path(__file__).parent / "cases"


def _cases() -> list[Any]:
    out = []
    for f in sorted(CASES_DIR.glob("*.toml")):
        data = tomllib.loads(f.read_text())
        for case in data.get("case", []):
            marks = [pytest.mark.slow] if case.get("slow") else []
            if "set" not in case and "fixture" in case:
                # the cases of one profile run on one worker, which analyses it once (shared_report)
                marks.append(profile_group(resolve_fixture(case["fixture"])))
            elif "generator" in case:
                marks.append(pytest.mark.xdist_group(case["generator"]))
            elif "tables" in case:
                marks.append(pytest.mark.xdist_group(case["tables"]))
            out.append(pytest.param(f.stem, case, id=f"{f.stem}-{case['name']}", marks=marks))
    return out


_GEN_CACHE: dict[str, Path] = {}
_JSON_CACHE: dict[int, tuple[Any, dict[str, Any]]] = {}


def _shared_json(report: Any) -> dict[str, Any]:
    """The validated JSON of a shared report, once per worker (the cases only read it)."""
    key = id(report)
    if key not in _JSON_CACHE or _JSON_CACHE[key][0] is not report:
        _JSON_CACHE[key] = (report, report_json(report))
    return _JSON_CACHE[key][1]
_TABLES_CACHE: dict[str, Any] = {}


def _tables_context(key: str) -> Any:
    """The context built from ``module:func``'s canonical rows, once per worker: the rules only
    read it, so each case runs its own rule (and thresholds) on the same context."""
    from advisor.testing import context_from_tables

    if key not in _TABLES_CACHE:
        mod, func = key.split(":")
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        _TABLES_CACHE[key] = context_from_tables(getattr(importlib.import_module(mod), func)())
    return _TABLES_CACHE[key]


def _fixture_path(case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "generator" in case:
        key = case["generator"]
        if key not in _GEN_CACHE:
            mod, func = key.split(":")
            if str(ROOT) not in sys.path:
                sys.path.insert(0, str(ROOT))
            out = tmp_path_factory.mktemp(func)
            _GEN_CACHE[key] = Path(getattr(importlib.import_module(mod), func)(out) or out)
        return _GEN_CACHE[key]
    path = resolve_fixture(case["fixture"])
    if not path.exists():
        pytest.skip(f"fixture {path} not present")
    return path


@pytest.mark.parametrize(("rule_id", "case"), _cases())
def test_rule_case(rule_id: str, case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    from advisor.analyze import analyze, analyze_context

    cfg = Config(select=[rule_id], overrides={rule_id: dict(case.get("set", {}))} if case.get("set") else {})
    if "tables" in case and "set" in case:
        # the rank parts' tables are built once per context with the thresholds of that run: a case that
        # sets thresholds gets a context of its own
        from advisor.testing import context_from_tables

        mod, func = case["tables"].split(":")
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        report = analyze_context(context_from_tables(getattr(importlib.import_module(mod), func)()), cfg)
    elif "tables" in case:
        report = analyze_context(_tables_context(case["tables"]), cfg)
    elif "set" not in case:
        # every rule at default thresholds, once per worker: the case reads its own rule's
        # outcome and findings (a rule's findings do not depend on which other rules run)
        report = shared_report(_fixture_path(case, tmp_path_factory))
    else:
        report = analyze(_fixture_path(case, tmp_path_factory), cfg)
    data = _shared_json(report) if "tables" not in case and "set" not in case else report_json(report)
    outcome = next(o for o in report.rules if o.rule == rule_id)
    assert outcome.status != "error", outcome.reason
    mine = [f for f in data["findings"] if f["rule"] == rule_id]
    if case["expect"] == "quiet":
        tolerated = Severity.parse(case["quiet_below"]) if "quiet_below" in case else None
        bad = [f for f in mine if tolerated is None or Severity.parse(f["severity"]) >= tolerated]
        assert not bad, f"{rule_id} fired on a quiet case: {[f['title'] for f in bad]}"
        return
    assert case["expect"] == "fires"
    assert outcome.status == "ran", f"{rule_id} did not run: {outcome.reason}"
    assert mine, f"{rule_id} did not fire; warnings: {[w['message'] for w in data['warnings']][:5]}"
    if "where" in case:  # the finding checked: the first whose evidence holds these values
        mine = [x for x in mine if all(x["evidence"].get(k) == v for k, v in case["where"].items())]
        assert mine, f"no {rule_id} finding with evidence {case['where']}"
    f = mine[0] if "finding_cause" not in case else next(x for x in mine if x["cause"] == case["finding_cause"])
    if "cause" in case:
        assert any(x["cause"] == case["cause"] for x in mine), [x["cause"] for x in mine]
    if "severity_at_least" in case:
        assert Severity.parse(f["severity"]) >= Severity.parse(case["severity_at_least"]), f["severity"]
    if "saving_us" in case:
        lo, hi = case["saving_us"]
        assert f["estimated_saving_us"] is not None and lo <= f["estimated_saving_us"] <= hi, (
            f["estimated_saving_us"], f.get("replay"))
    if "ranks" in case:
        assert set(case["ranks"]) <= {r for x in mine for r in x["ranks"]}, [x["ranks"] for x in mine]
    if "steps" in case:
        assert set(case["steps"]) <= {s for x in mine for s in x["steps"]}, [x["steps"] for x in mine]
    for key, want in case.get("evidence", {}).items():
        got = f["evidence"].get(key)
        if isinstance(want, list):
            assert got is not None and want[0] <= got <= want[1], f"evidence {key}={got}, want {want}"
        else:
            assert got == want, f"evidence {key}={got!r}, want {want!r}"
    assert f["optimizations"], "a finding must carry optimizations from the cause map"
    assert f["evidence"], "a finding must carry evidence"
