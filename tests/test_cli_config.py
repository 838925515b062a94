"""CLI surface of the rule engine: --set / --rule / --skip / advisor.toml, rules, explain, rule errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.config import Config, ConfigError
from tests.conftest import ROOT, TRACES, validate_report

SLOW_DL = TRACES / "cpu_slow_dataloader"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor.cli", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=300, check=False)


def analyze_json(tmp_path: Path, *args: str, cwd: Path | None = None) -> dict:
    out = tmp_path / "r.json"
    p = run("analyze", str(SLOW_DL), "--format", "json", "--out", str(out), *args, cwd=cwd)
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    validate_report(data)
    return data


def test_set_threshold_silences_a_rule(tmp_path: Path) -> None:
    # README of the trace: __next__ takes 73-76 % of each step; a 0.9 threshold must silence IO001
    fired = analyze_json(tmp_path, "--rule", "IO001")
    assert [f["rule"] for f in fired["findings"]] == ["IO001"]
    quiet = analyze_json(tmp_path, "--rule", "IO001", "--set", "IO001.min_share=0.9")
    assert quiet["findings"] == []
    assert {r["rule"]: r["status"] for r in quiet["rules"]}["CPU004"] == "not_selected"


def test_skip_and_config_file(tmp_path: Path) -> None:
    data = analyze_json(tmp_path, "--skip", "IO001")
    assert "IO001" not in {f["rule"] for f in data["findings"]}
    (tmp_path / "advisor.toml").write_text('[rules]\nselect = ["IO001"]\n[thresholds.IO001]\nmin_share = 0.95\n')
    data = analyze_json(tmp_path, cwd=tmp_path)  # ./advisor.toml is picked up
    assert data["findings"] == []
    assert {r["rule"] for r in data["rules"] if r["status"] != "not_selected"} == {"IO001"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "IO001.nope=1"], "no such threshold"),
        (["--set", "IO001.min_share=abc"], "is not a float"),
        (["--rule", "XYZ999"], "unknown rule"),
        (["--set", "garbage"], "expected RULE.param=value"),
    ],
)
def test_bad_overrides_are_usage_errors(args: list[str], message: str) -> None:
    p = run("analyze", str(SLOW_DL), "--format", "json", *args)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_config_parsing() -> None:
    cfg = Config()
    cfg.add_set("io001.min_share=0.3")
    assert cfg.overrides == {"IO001": {"min_share": "0.3"}}
    with pytest.raises(ConfigError):
        cfg.add_set("min_share=0.3")


def test_rules_and_explain_commands() -> None:
    p = run("rules", "--format", "json")
    assert p.returncode == 0
    rules = json.loads(p.stdout)
    assert {"IO001", "CPU004", "COM001", "CLU001", "CMP001", "PAR001"} <= {r["id"] for r in rules}
    e = run("explain", "IO001")
    assert e.returncode == 0
    for section in ("## Why it matters", "## How it is detected", "## What to do", "## Thresholds", "IO001.min_share"):
        assert section in e.stdout
    assert run("explain", "NOPE001").returncode == 2


def test_a_crashing_rule_is_reported_and_the_others_run() -> None:
    from advisor.analyze import analyze
    from advisor.engine.registry import discover

    spec = discover()["CPU004"]
    original = spec.func

    def boom(ctx):
        raise RuntimeError("planted failure")

    object.__setattr__(spec, "func", boom)  # RuleSpec is frozen
    try:
        report = analyze(SLOW_DL)
    finally:
        object.__setattr__(spec, "func", original)
    outcomes = {o.rule: o for o in report.rules}
    assert outcomes["CPU004"].status == "error" and "planted failure" in outcomes["CPU004"].reason
    assert any(w.code == "rule_error" for w in report.warnings)
    assert "IO001" in {f.rule for f in report.findings}


@pytest.mark.parametrize("args, code", [
    (["analyze", "sample_profiles/kineto_two_ranks"], 0),
    (["analyze", "sample_profiles/kineto_two_ranks", "--format", "json"], 0),
    (["analyze", "sample_profiles/kineto_two_ranks", "--fail-on", "low"], 1),  # PAR001 fires: the gate still decides
    (["rules"], 0),
    (["explain", "CMP001"], 0),
])
def test_a_reader_that_stops_early_is_not_an_error(args: list[str], code: int) -> None:
    """``advisor ... | head``: the reader goes away before the output is written (here: closed at once)."""
    proc = subprocess.Popen([sys.executable, "-m", "advisor.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == code
    assert "Traceback" not in err and "Broken pipe" not in err and "internal error" not in err


def test_the_cli_run_keeps_the_analysis_context_until_the_process_ends(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The console entry point keeps the analysis context (its in-memory database) alive: tearing
    it down before the report is written only costs time in a process that ends with os._exit.
    In-process callers (main, analyze) get the default: nothing is kept."""
    from click.testing import CliRunner

    from advisor import cli

    out = tmp_path / "r.json"
    args = ["analyze", str(SLOW_DL), "--format", "json", "--out", str(out)]
    assert cli._KEPT is None
    assert CliRunner().invoke(cli.main, args).exit_code == 0
    kept: list = []
    monkeypatch.setattr(cli, "_KEPT", kept)  # what run() sets
    assert CliRunner().invoke(cli.main, args).exit_code == 0
    assert len(kept) == 1
    assert kept[0].con.execute("SELECT count(*) > 0 FROM events").fetchone() == (True,)
    validate_report(json.loads(out.read_text()))
