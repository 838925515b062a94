"""CLI surface of the rule engine: --set / --rule / --skip / advisor.toml, rules, explain, rule errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.config import Config, ConfigError
from tests.cli_run import cli
from tests.conftest import ROOT, TRACES, validate_report

SLOW_DL = TRACES / "cpu_slow_dataloader"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``advisor ARGS`` in-process (the usage errors of a real process: tests/test_outputs.py)."""
    return cli(*args, cwd=cwd)


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
    pytest.param(["analyze", "sample_profiles/kineto_two_ranks"], 0, marks=pytest.mark.slow),
    pytest.param(["analyze", "sample_profiles/kineto_two_ranks", "--format", "json"], 0, marks=pytest.mark.slow),
    (["analyze", "sample_profiles/kineto_two_ranks", "--fail-on", "low"], 1),  # PAR001 fires: the gate still decides
    (["rules"], 0),
    pytest.param(["explain", "CMP001"], 0, marks=pytest.mark.slow),
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
    assert kept[0].con.execute("SELECT count(*) > 0 FROM ranks").fetchone() == (True,)
    validate_report(json.loads(out.read_text()))


# ---- options that mean what they say: --rank / --step, --set, --memory-limit, --format --------------------------

HEALTHY = TRACES / "cpu_healthy"  # README: steps #2..#7, one rank
FLUCT = TRACES / "cpu_step_fluctuation"  # README: steps #2..#11, #8 = 241.5 ms, the others 22.7-25.1 ms
MISSING = ROOT / "no" / "such" / "profile"


def one_line_usage_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor: "), p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(("profile", "args", "listed"), [
    (HEALTHY, ["--step", "999"], "has steps 2-7"),
    (HEALTHY, ["--rank", "7"], "has rank 0"),
    (TRACES / "gloo_slow_rank", ["--rank", "1", "--step", "30"], "rank 1 of"),  # README: world size 2, steps 2-7
    # README: no ProfilerStep# events, 5 iterations: steps 0-4 inferred (the one-window case: test_step_inference.py)
    (TRACES / "cpu_no_step_marker", ["--step", "30"], "has steps 0-4"),
])
def test_a_rank_or_step_the_profile_lacks_is_a_usage_error(profile: Path, args: list[str], listed: str) -> None:
    p = run("analyze", str(profile), *args)
    one_line_usage_error(p, args[-2] + " " + args[-1], listed)
    assert p.stdout == ""  # no report of something else than what was asked


def test_spans_compress_long_lists() -> None:
    from advisor.text import spans

    assert spans(list(range(64))) == "0-63"
    assert spans([12, 3, 4, 5, 6, 7, 8, 9, 10, 11]) == "3-12"
    assert spans([0, 2, 3, 7]) == "0, 2-3, 7"
    assert spans(list(range(0, 40, 2))).endswith("... (20 in all)")


def test_a_valid_step_narrows_breakdown_findings_and_verdict() -> None:
    """cpu_step_fluctuation: the only planted fault is step #8 (241.5 ms against ~23 ms). Focused on
    step 3 the report is one of a normal step; focused on step 8 it is the slow step's."""
    from advisor.analyze import analyze
    from advisor.render.terminal import render_text
    from advisor.render.view import verdict
    from tests.conftest import report_json

    reports, texts = {}, {}
    for step in (3, 8):
        report = analyze(FLUCT, step=step)
        reports[step] = d = report_json(report)
        texts[step] = render_text(report)
        assert {(r["rank"], r["step"]) for r in d["breakdown"]} == {(0, step)}
        assert [s["steps"] for s in d["step_times"]] == [1]
        assert d["profile"]["focus"] == {"rank": 0, "step": step} and d["critical_path"]["step"] == step
        assert all(step in f["steps"] for f in d["findings"] if f["steps"])
    normal, slow = reports[3], reports[8]
    assert normal["breakdown"][0]["step_us"] == pytest.approx(23_800, abs=300)  # README: #3 = 23.8 ms
    assert slow["breakdown"][0]["step_us"] == pytest.approx(241_500, abs=2_500)  # README: #8 = 241.5 ms
    assert normal["findings"] == [] and verdict(normal)["kind"] == "clean"  # a normal step: no alarm
    assert verdict(slow)["rule"] == "CLU003"  # the step-fluctuation finding names step 8
    assert "fluctuates" not in texts[3] and "fluctuates" in texts[8]


@pytest.mark.parametrize(("args", "needles"), [
    (["--set", "IO001.min_shar=0.5"], ["IO001.min_shar", "did you mean 'min_share'"]),
    (["--set", "IO01.min_share=0.5"], ["unknown rule 'IO01'", "did you mean 'IO001'"]),
    (["--set", "IO001.min_share=lots"], ["IO001.min_share", "is not a float"]),
    (["--rule", "IO0001"], ["unknown rule 'IO0001'", "did you mean 'IO001'"]),
    (["--memory-limit", "lots"], ["--memory-limit 'lots'", "8GB"]),
    (["--memory-limit", "8"], ["--memory-limit '8'"]),
    (["--memory-limit", "0GB"], ["more than 0"]),
    (["--memory-limit", "150%"], ["at most 100%"]),
])
def test_bad_options_are_refused_before_the_profile_is_read(args: list[str], needles: list[str]) -> None:
    """The profile does not exist: the option's error, not the missing file's, shows it was checked first."""
    p = run("analyze", str(MISSING), *args)
    one_line_usage_error(p, *needles)
    assert "no such file" not in p.stderr


def test_a_bad_toml_threshold_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "advisor.toml").write_text('[thresholds.IO001]\nmin_share = "high"\n')
    one_line_usage_error(run("analyze", str(MISSING), cwd=tmp_path), "IO001.min_share", "is not a float")
    (tmp_path / "advisor.toml").write_text('[thresholds.IO001]\nmin_share = [1]\n')
    one_line_usage_error(run("analyze", str(MISSING), cwd=tmp_path), "IO001.min_share", "is not a float")


def test_memory_limits_are_those_duckdb_reads() -> None:
    import duckdb

    from advisor.config import parse_memory_limit

    for text, expected in [("8GB", "8GB"), ("512MB", "512MB"), ("1.5 GiB", "1.5GiB"), ("4g", "4g"), ("80%", "80%")]:
        assert parse_memory_limit(text) == expected
        duckdb.connect().execute(f"SET memory_limit = '{expected}'")  # DuckDB takes what passes the check
    for bad in ("lots", "8", "-1GB", "8GB'; DROP TABLE x; --", "1e3MB", "none"):
        with pytest.raises(ConfigError):
            parse_memory_limit(bad)


def test_a_memory_limit_is_applied() -> None:
    from advisor.analyze import analyze

    kept: list = []
    analyze(HEALTHY, memory_limit="2 GB", keep=kept)
    assert kept[0].con.execute("SELECT current_setting('memory_limit')").fetchone() == ("1.8 GiB",)  # 2e9 B


@pytest.mark.parametrize("args", [
    ["--format", "xml"], ["--bogus"], ["--rank", "one"], [],
])
def test_click_usage_errors_are_one_line(args: list[str]) -> None:
    p = run("analyze", *([str(HEALTHY)] if args else []), *args)
    one_line_usage_error(p, "advisor: analyze: ")
    assert "Usage:" not in p.stderr and "Try " not in p.stderr


def test_the_groups_own_usage_errors_are_one_line() -> None:
    one_line_usage_error(run("--bogus"), "advisor: No such option '--bogus'")
    one_line_usage_error(run("anlyze", "x"), "advisor: No such command 'anlyze'")
    assert run("analyze", "--help").stdout.startswith("Usage: ")


def test_python_analyze_with_a_bad_override_raises(tmp_path: Path) -> None:
    """In a subprocess: an abort of the interpreter (exit 134, a DuckDB thread still running
    while the exception ends the program) would take pytest down with it."""
    script = ("import sys\nfrom advisor.analyze import analyze\nfrom advisor.config import Config, ConfigError\n"
              "cfg = Config()\ncfg.add_set('IO001.nope=1')\n"
              "try:\n    analyze(sys.argv[1], cfg)\nexcept ConfigError as exc:\n    print(type(exc).__name__, exc)\n"
              "    raise\n")
    p = subprocess.run([sys.executable, "-c", script, str(TRACES / "gloo_slow_rank")], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, check=False)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stdout.startswith("ConfigError IO001.nope: no such threshold")
    assert "FATAL" not in p.stderr and "terminate called" not in p.stderr


def test_an_error_beside_the_stages_waits_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception from the rules leaves analyze() only once the stages' thread has ended (it
    may be inside DuckDB, which an ending interpreter aborts under)."""
    import threading
    import time

    import advisor.analyze as an
    from advisor.pipeline import map as pmap
    from advisor.stages import breakdown

    real_stages = breakdown.compute  # the first stage of the per-rank map

    def slow_stages(*a: object, **k: object) -> object:
        time.sleep(0.5)
        return real_stages(*a, **k)  # type: ignore[arg-type]

    def failing_rules(*a: object, **k: object) -> None:
        raise RuntimeError("planted rules failure")

    monkeypatch.setattr(breakdown, "compute", slow_stages)
    monkeypatch.setattr(pmap, "execute", failing_rules)
    with pytest.raises(RuntimeError, match="planted rules failure"):
        an.analyze(HEALTHY)
    assert not [t for t in threading.enumerate() if t.name == "advisor-stages" and t.is_alive()]
