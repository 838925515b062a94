"""The CI gate: exit codes and the baseline diff, on real samples through the CLI (as CI runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.config import ConfigError
from advisor.gate import BUDGETS, baseline_diff, evaluate, parse_budgets, read_baseline
from tests.conftest import TRACES, validate_report
from tests.render_helpers import run_cli

# one worker runs this module: its module-scoped fixtures are built once
pytestmark = pytest.mark.xdist_group("gate")

SLOW = TRACES / "cpu_slow_dataloader"  # planted: num_workers=0 and 30 ms of sleep per step
HEALTHY = TRACES / "cpu_healthy"


@pytest.fixture(scope="module")
def healthy_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("baseline") / "healthy.json"
    res = run_cli(HEALTHY, "--format", "json", "--out", out)
    assert res.returncode == 0, res.stderr
    return out


def test_slow_dataloader_regresses_against_healthy(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run_cli(SLOW, "--baseline", HEALTHY, "--format", "json", "--out", out)
    assert res.returncode == 1, res.stderr
    assert "gate: step time +" in res.stderr
    data = json.loads(out.read_text())
    validate_report(data)
    diff = data["baseline_diff"]
    assert diff["regressed"] and diff["regression_pct"] > 50  # ~42 ms vs ~25 ms per step
    phases = {p["phase"]: p for p in diff["phases"]}
    assert phases["host_only_us"]["delta_us"] > 25_000  # the 30 ms sleep shows as host-only time
    assert phases["host_only_us"]["slower"]
    assert [f["rule"] for f in diff["new_findings"]] == ["IO001"]
    assert diff["gone_findings"] == []
    assert data["gate"]["status"] == "failed"
    assert {c["check"] for c in data["gate"]["checks"]} == {"baseline"}


def test_healthy_against_slow_is_an_improvement(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run_cli(HEALTHY, "--baseline", SLOW, "--format", "json", "--out", out)
    assert res.returncode == 0, res.stderr
    diff = json.loads(out.read_text())["baseline_diff"]
    assert diff["regression_pct"] < -30 and not diff["regressed"]
    assert [f["rule"] for f in diff["gone_findings"]] == ["IO001"]
    # the baseline's prediction for the gone finding against the mean step the trace files give
    cal = diff["calibration"]
    measured = _mean_profiler_step_us(SLOW) - _mean_profiler_step_us(HEALTHY)
    assert cal["measured_gain_us"] == pytest.approx(measured, rel=0.01)
    io = diff["gone_findings"][0]  # the baseline's finding as the diff keeps it
    [row] = cal["findings"]
    assert row["rule"] == "IO001" and row["predicted_saving_us"] == io["estimated_saving_us"]
    assert row["predicted_by"] in ("replay", "rule estimate")
    assert row["ratio"] == pytest.approx(measured / io["estimated_saving_us"], rel=0.01)
    from advisor.render import html, markdown, terminal

    data = json.loads(out.read_text())
    line = f"predicted −{io['estimated_saving_us'] / 1e3:.2f} ms"
    for text in (terminal.render_text(data, width=200), markdown.render(data), html.render(data)):
        assert line in text and f"measured −{cal['measured_gain_us'] / 1e3:.2f} ms" in text


def _mean_profiler_step_us(folder: Path) -> float:
    """Mean ``ProfilerStep#N`` duration of a one-file trace, read straight from its JSON."""
    import gzip

    [path] = folder.glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    durs = [e["dur"] for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    return sum(durs) / len(durs)


@pytest.mark.slow  # two whole analyses; the diff of equal reports is also checked on dicts below
def test_profile_against_itself_passes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run_cli(SLOW, "--baseline", SLOW, "--max-regression", "0", "--format", "json", "--out", out)
    assert res.returncode == 0, res.stderr
    diff = json.loads(out.read_text())["baseline_diff"]
    assert diff["regression_pct"] == 0 and not diff["new_findings"] and not diff["gone_findings"]


@pytest.mark.slow
def test_baseline_from_earlier_json_report(healthy_json: Path, tmp_path: Path) -> None:
    assert run_cli(HEALTHY, "--baseline", healthy_json, "--max-regression", "0").returncode == 0
    out = tmp_path / "r.json"
    res = run_cli(SLOW, "--baseline", healthy_json, "--format", "json", "--out", out)
    assert res.returncode == 1
    assert json.loads(out.read_text())["baseline_diff"]["baseline_kind"] == "report"
    # a generous limit lets the same regression pass
    assert run_cli(SLOW, "--baseline", healthy_json, "--max-regression", "500").returncode == 0


# the quick suite renders the Markdown form; the marked run every form
@pytest.mark.parametrize("fmt,marker", [pytest.param("terminal", "Against the baseline", marks=pytest.mark.slow),
                                        ("md", "### Against the baseline"),
                                        pytest.param("html", 'id="baseline-diff"', marks=pytest.mark.slow)])
def test_every_format_shows_the_diff(healthy_json: Path, fmt: str, marker: str) -> None:
    res = run_cli(SLOW, "--baseline", healthy_json, "--format", fmt)
    assert res.returncode == 1
    assert marker in res.stdout
    assert "IO001" in res.stdout
    assert ("regression" in res.stdout) or ("+66" in res.stdout) or ("%" in res.stdout)


def test_fail_on() -> None:
    assert run_cli(SLOW, "--fail-on", "high").returncode == 1
    assert run_cli(HEALTHY, "--fail-on", "low").returncode == 0
    assert run_cli(SLOW, "--fail-on", "bogus").returncode == 2


def test_budgets(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run_cli(SLOW, "--budget", "step_ms=30", "--budget", "host_only_ratio=0.9", "--budget", "findings_critical=0",
                  "--format", "json", "--out", out)
    assert res.returncode == 1
    checks = {c["name"]: c for c in json.loads(out.read_text())["gate"]["checks"]}
    assert not checks["step_ms"]["passed"] and 35 < checks["step_ms"]["value"] < 50
    assert checks["host_only_ratio"]["passed"]
    assert not checks["findings_critical"]["passed"]
    assert run_cli(HEALTHY, "--budget", "step_ms=1000", "--budget", "comm_only_ratio=0.15",
                   "--budget", "overlap_ratio_min=0.5").returncode == 0


@pytest.mark.parametrize("args", [
    ("--budget", "nonsense_ms=3"),
    ("--budget", "step_ms"),
    ("--budget", "step_ms=fast"),
    ("--budget", "comm_only_ratio=15"),
    ("--baseline", "/nonexistent/baseline"),
    ("--max-regression", "-1", "--baseline", str(HEALTHY)),
])
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    res = run_cli(HEALTHY, *args)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.startswith("advisor: ") and "Traceback" not in res.stderr


def test_baseline_json_of_another_schema_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"schema": "something/v9", "findings": []}))
    res = run_cli(HEALTHY, "--baseline", bad)
    assert res.returncode == 2 and "schema" in res.stderr


# ---- unit level (no analysis) -------------------------------------------------------------------


def _rows(rank: int, step_us: float, comm: float = 0.0, n: int = 3) -> list[dict]:
    return [{"rank": rank, "step": s, "step_us": step_us, "compute_only_us": step_us - comm, "overlapped_us": 0.0,
             "comm_only_us": comm, "host_only_us": 0.0, "free_us": 0.0, "overlap_ratio": 0.0 if comm else None}
            for s in range(n)]


def _report(rows: list[dict], findings: list[dict] | None = None) -> dict:
    return {"schema": "advisor.report/v1", "profile": {"path": "x"}, "breakdown": rows, "findings": findings or []}


def test_parse_budgets_names() -> None:
    for name in ("step_ms", "step_us", "compute_only_ratio", "comm_only_ratio", "host_only_ratio", "free_ratio",
                 "overlap_ratio_min", "findings_high", "findings_critical"):
        assert name in BUDGETS
    assert parse_budgets(["step_ms=120", "comm_only_ratio=0.15"]) == {"step_ms": 120.0, "comm_only_ratio": 0.15}
    with pytest.raises(ConfigError):
        parse_budgets(["steps=1"])


def test_budgets_use_the_worst_rank() -> None:
    rep = _report(_rows(0, 100_000.0, comm=10_000.0) + _rows(1, 150_000.0, comm=60_000.0))
    res = evaluate(rep, budgets={"step_ms": 120.0, "comm_only_ratio": 0.3, "overlap_ratio_min": 0.0})
    by = {c["name"]: c for c in res.checks}
    assert by["step_ms"]["value"] == pytest.approx(150.0) and not by["step_ms"]["passed"]
    assert by["comm_only_ratio"]["value"] == pytest.approx(0.4) and not by["comm_only_ratio"]["passed"]
    assert by["overlap_ratio_min"]["passed"]
    assert res.exit_code == 1 and len(res.messages) == 2


def test_budget_without_steps_fails() -> None:
    res = evaluate(_report([]), budgets={"step_ms": 100.0})
    assert res.exit_code == 1 and "cannot be measured" in res.messages[0]


def test_diff_matches_findings_by_rule_cause_ranks() -> None:
    f = {"rule": "COM001", "cause": "comm.slow_synchronization", "severity": "high", "title": "t", "ranks": [0, 1]}
    base = _report(_rows(0, 100.0), [f, {**f, "rule": "IO001", "cause": "io.slow_data_processing", "ranks": [0]}])
    cur = _report(_rows(0, 105.0), [{**f, "severity": "critical", "title": "other words"},
                                    {**f, "ranks": [3]}])
    d = baseline_diff(cur, base, max_regression=10.0)
    assert d["regression_pct"] == pytest.approx(5.0) and not d["regressed"]
    assert [x["ranks"] for x in d["new_findings"]] == [[3]]
    assert [x["rule"] for x in d["gone_findings"]] == ["IO001"]
    assert d["changed_findings"][0]["baseline_severity"] == "high"
    assert baseline_diff(_report(_rows(0, 111.0)), base, 10.0)["regressed"]
    same = baseline_diff(base, base, 0.0)  # a report against itself
    assert same["regression_pct"] == 0 and not same["regressed"]
    assert not same["new_findings"] and not same["gone_findings"] and not same["changed_findings"]


def test_gone_findings_carry_their_prediction_against_the_measured_gain() -> None:
    f = {"rule": "IO001", "cause": "io.slow_data_processing", "severity": "high", "title": "t", "ranks": [0],
         "estimated_saving_us": 40.0, "replay": {"estimated": True, "reproduced": True, "saving_us": 40.0}}
    g = {**f, "rule": "CPU004", "cause": "cpu.gc", "estimated_saving_us": 10.0, "replay": None}
    d = baseline_diff(_report(_rows(0, 70.0)), _report(_rows(0, 100.0), [f]), 10.0)
    [row] = d["calibration"]["findings"]
    assert d["calibration"]["measured_gain_us"] == pytest.approx(30.0)
    assert row["predicted_saving_us"] == 40.0 and row["predicted_by"] == "replay" and row["ratio"] == pytest.approx(0.75)
    two = baseline_diff(_report(_rows(0, 70.0)), _report(_rows(0, 100.0), [f, g]), 10.0)["calibration"]
    assert [r["predicted_by"] for r in two["findings"]] == ["replay", "rule estimate"]
    assert "joint" in two["note"] and two["largest_predicted_us"] == 40.0
    assert baseline_diff(_report(_rows(0, 70.0), [f]), _report(_rows(0, 100.0), [f]), 10.0)["calibration"] is None


# ---- baselines of another kind ------------------------------------------------------------------

TWO_RANKS = Path(__file__).resolve().parents[1] / "sample_profiles" / "kineto_two_ranks"  # GPU (NCCL), world 128
ASCEND = Path(__file__).resolve().parents[1] / "sample_profiles" / "ascend_pt_timeline"  # NPU (torch_npu)


@pytest.fixture(scope="module")
def two_ranks_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from advisor.analyze import analyze
    from advisor.render.json import render

    out = tmp_path_factory.mktemp("baseline") / "two_ranks.json"
    out.write_text(render(analyze(TWO_RANKS)))
    return out


@pytest.mark.parametrize(("current", "baseline", "said"), [
    (TWO_RANKS, "healthy_json", "the baseline is a CPU-only profile and this one has device events"),
    pytest.param(HEALTHY, "two_ranks_json", "the baseline has device events and this profile is CPU-only",
                 marks=pytest.mark.slow),
])
def test_device_against_cpu_only_is_not_judged(tmp_path: Path, request: pytest.FixtureRequest, current: Path,
                                               baseline: str, said: str) -> None:
    """A percent between a CPU-only step and a device step is not a regression: exit 2, said on
    stderr and in the report, which is still written with the diff for reading."""
    out = tmp_path / "r.json"
    res = run_cli(current, "--baseline", request.getfixturevalue(baseline), "--format", "json", "--out", out)
    assert res.returncode == 2, res.stderr
    gate_lines = [line for line in res.stderr.splitlines() if line.startswith("advisor: gate: ")]
    assert len(gate_lines) == 1 and "not comparable" in gate_lines[0] and said in gate_lines[0]
    assert "step time +" not in res.stderr  # no regression verdict either way
    data = json.loads(out.read_text())
    validate_report(data)
    diff = data["baseline_diff"]
    assert diff["comparable"] is False and diff["regressed"] is False and diff["mismatch"] == [said]
    assert diff["regression_pct"] is not None  # shown, not judged
    check = next(c for c in data["gate"]["checks"] if c["check"] == "baseline")
    assert check["passed"] is False and check["comparable"] is False and said in check["note"]
    assert data["gate"]["status"] == "failed"


def test_another_source_is_said_and_judged(tmp_path: Path, two_ranks_json: Path) -> None:
    """Ascend (torch_npu) against Kineto (CUDA): both have device events; the step is compared and
    the difference of source said."""
    out = tmp_path / "r.json"
    res = run_cli(ASCEND, "--baseline", two_ranks_json, "--format", "json", "--out", out)
    assert res.returncode in (0, 1), res.stderr
    assert "another source: baseline kineto, current ascend" in res.stderr
    data = json.loads(out.read_text())
    validate_report(data)
    diff = data["baseline_diff"]
    assert diff["comparable"] is True and diff["mismatch"] == ["another source: baseline kineto, current ascend"]
    assert diff["regressed"] == (res.returncode == 1)


def _kind(rows: list[dict], **profile: object) -> dict:
    rep = _report(rows)
    rep["profile"].update(profile)
    return rep


def test_kind_mismatch_world_size_and_exit_codes() -> None:
    from advisor.gate import kind_mismatch

    base = _kind(_rows(0, 100.0), world_size=8, sources=["kineto"], cpu_only=False)

    assert kind_mismatch(_kind([], world_size=16), base) == ([], ["another world size: baseline 8, current 16"])
    assert kind_mismatch(_kind([], world_size=None), base) == ([], [])  # unknown: not compared
    assert kind_mismatch(_kind([], sources=["ascend_ms"]), _kind([], sources=["ascend_pt"])) == ([], [])
    assert kind_mismatch(_kind([], cpu_only=True), base)[0]
    d = baseline_diff(_kind(_rows(0, 150.0), world_size=16), base, 10.0)
    assert d["comparable"] and d["regressed"] and "another world size" in d["notes"][0]
    d = baseline_diff(_kind(_rows(0, 150.0), cpu_only=True), base, 10.0)
    assert not d["comparable"] and not d["regressed"] and d["regression_pct"] == pytest.approx(50.0)


def test_an_incomparable_baseline_is_exit_2_even_when_a_budget_fails(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_kind(_rows(0, 100.0), cpu_only=False, world_size=8)))
    res = evaluate(_kind(_rows(0, 150.0), cpu_only=True), baseline=read_baseline(base), budgets={"step_ms": 0.1})
    assert res.exit_code == 2 and len(res.messages) == 2 and "not comparable" in res.messages[0]
    other = evaluate(_kind(_rows(0, 150.0), cpu_only=False, world_size=16), baseline=read_baseline(base), budgets={"step_ms": 0.1})
    assert other.exit_code == 1  # comparable: the +50 % step fails, and the budget
    assert "another world size: baseline 8, current 16" in other.messages[0]
    assert other.messages[1].startswith("step time +50.0%")


def test_budget_names_in_the_reports_words() -> None:
    """Reports say "idle" and "compute ∥ comm"; budgets accept them for free_* and overlapped_*."""
    assert parse_budgets(["idle_ratio=0.2", "compute_comm_ms=3", "idle_us=10"]) == {
        "free_ratio": 0.2, "overlapped_ms": 3.0, "free_us": 10.0}
    with pytest.raises(ConfigError, match="ratio between 0 and 1"):
        parse_budgets(["idle_ratio=2"])


@pytest.mark.parametrize(("typed", "meant"), [("idle_rato", "idle_ratio"), ("stepms", "step_ms"),
                                               ("comm_ony_ratio", "comm_only_ratio")])
def test_unknown_budget_says_did_you_mean(typed: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean {meant}"):
        parse_budgets([f"{typed}=1"])
    with pytest.raises(ConfigError) as err:
        parse_budgets(["zzz=1"])
    assert "did you mean" not in str(err.value) and "idle_* = free_*" in str(err.value)
