"""Outputs that fit where they go: a Markdown report that fits a pull-request comment, terminal
tables that never cut a number or a rank (in a real pseudo-terminal and piped with ``COLUMNS``),
and ``--out`` whose format follows the file's extension."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TRACES, report_json, validate_report
from tests.render_helpers import run_cli

GLOO = TRACES / "gloo_slow_rank"  # two ranks (rank0 / rank1 files), rank 1 the straggler
COMMENT_LIMIT = 60_000  # under GitHub's 65,536 characters per comment, with room for a heading
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
#: A number cut short by an ellipsis ("617.…", "29…") or continued after one ("…5 ms").
CUT_NUMBER = re.compile(r"\d[.,]?…|…[.,]?\d")

_REPORTS: dict[Path, dict[str, Any]] = {}


def _data(path: Path) -> dict[str, Any]:
    """The JSON report of a profile (analysed once per test session), schema-validated."""
    if path not in _REPORTS:
        from advisor.analyze import analyze

        _REPORTS[path] = report_json(analyze(path))
    return copy.deepcopy(_REPORTS[path])


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def _huge(d: dict[str, Any], ranks: int = 64, steps: int = 300, findings: int = 120) -> dict[str, Any]:
    """A report as large as a profile can make one: many ranks and steps, many long findings with
    wide evidence and top tables, many optimisations, warnings, skipped rules, gate checks and
    baseline changes. Every field keeps the shape of the JSON report (it validates)."""
    base = d["breakdown"][0]
    d["breakdown"] = [{**base, "rank": r, "step": s, "step_us": base["step_us"] * (1 + (r * 7 + s) % 13 / 50)}
                      for r in range(ranks) for s in range(steps)]
    d["profile"]["ranks"] = list(range(ranks))
    d["profile"]["steps"] = list(range(steps))
    proto = d["findings"][0]
    long = "x" * 30 + " <b>|name|</b> " + "y" * 400
    d["findings"] = []
    for i in range(findings):
        f = copy.deepcopy(proto)
        f.update(id=f"{proto['rule']}-{i:08x}", title=f"finding {i}: {long}", detail=long * 3,
                 ranks=list(range(0, ranks, 2)), steps=list(range(0, steps, 3)), ops=[f"op{j} {long}" for j in range(40)],
                 evidence={f"measure_{j}_us": 1000.0 + j for j in range(60)},
                 top=[{f"col{c}_{long[:20]}": f"{long}" for c in range(12)} for _ in range(60)],
                 optimizations=[{"id": f"fix{j}", "title": f"fix {j} {long[:100]}", "how": long} for j in range(30)])
        d["findings"].append(f)
    d["warnings"] = [{"code": "bad_file", "message": f"warning {i} {long}", "path": f"/p/{long}/{i}"} for i in range(5000)]
    d["rules"] = [*d["rules"], *({"rule": f"X{i:03d}", "status": "skipped", "reason": long} for i in range(200))]
    d["gate"] = {"status": "failed", "exit_code": 1,
                 "checks": [{"check": "budget", "name": f"step_ms_{i}", "threshold": 1.0, "value": 2.0, "passed": False,
                             "bound": "max"} for i in range(80)],
                 "messages": [f"message {i} {long}" for i in range(200)]}
    return d


@pytest.mark.slow
def test_markdown_of_a_huge_report_fits_a_comment_in_order() -> None:
    """Whatever the profile holds, the default Markdown stays under 60,000 characters, in the order
    verdict, gate, breakdown, findings (evidence, first fixes, ``advisor explain ID``), confidence
    and the skipped-rule and warning lists last; what is left out is counted."""
    from advisor.render.markdown import render

    d = _huge(_data(GLOO))
    validate_report(d)
    md = render(d)
    assert len(md) < COMMENT_LIMIT
    marks = ["## advisor: ", "### CI gate", "### Step time", "### Findings (120)", "### Critical path",
             "### Confidence", "rule(s) could not run", "input warning(s)"]
    pos = [md.index(m) for m in marks]
    assert pos == sorted(pos), dict(zip(marks, pos))
    assert "16 slowest of 64 ranks shown" in md
    assert "… 100 more findings in the HTML/JSON report." in md
    assert re.search(r"The details of \d+ more findings are in the JSON / HTML report", md)
    assert "more in the JSON report" in md  # warnings and skipped rules are counted, not listed
    assert "**What to do**" in md and f"`advisor explain {d['findings'][0]['rule']}`" in md
    assert "<b>" not in md.replace("<b>critical</b>", "").replace(f"<b>{d['findings'][0]['severity']}</b>", "")
    for line in md.splitlines():  # a sparkline of 300 steps is drawn in at most 40 characters
        assert not re.search("[▁▂▃▄▅▆▇█]{41}", line)


def test_markdown_with_a_baseline_diff_puts_it_before_the_breakdown() -> None:
    from advisor.render.markdown import render

    d = _data(GLOO)
    f = d["findings"][0]
    item = {"rule": f["rule"], "cause": f["cause"], "severity": f["severity"], "title": f["title"], "ranks": f["ranks"]}
    d["baseline_diff"] = {"baseline": "last.json", "regression_pct": 12.0, "max_regression_pct": 10.0, "regressed": True,
                          "notes": [], "phases": [], "new_findings": [item] * 25, "gone_findings": [],
                          "changed_findings": []}
    md = render(d)
    assert md.index("### Against the baseline") < md.index("### Step time") < md.index("### Findings")
    assert "**New findings (25)**" in md and "- … 15 more in the JSON / HTML report" in md


def test_markdown_names_explain_and_the_flag_embeds_the_docs(tmp_path: Path) -> None:
    """The default report names ``advisor explain ID`` and shows the first two fixes; ``--md-full``
    embeds each rule's documentation (its Thresholds section) and every fix."""
    compact, full = tmp_path / "c.md", tmp_path / "f.md"
    assert run_cli(GLOO, "--out", compact).returncode == 0
    res = run_cli(GLOO, "--out", full, "--md-full")
    assert res.returncode == 0, res.stderr
    c, f = compact.read_text(), full.read_text()
    data = _data(GLOO)
    for finding in data["findings"]:
        assert f"advisor explain {finding['rule']}" in c
        opts = finding["optimizations"]
        for o in opts[:2]:
            assert o["title"] in c
        for o in opts[2:]:
            assert o["title"] not in c and o["title"] in f
    assert "Thresholds" not in c and "Thresholds" in f
    assert len(c) < len(f)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["faults8", "cluster64", "layout_dp4_tp2_pp2"])
def test_markdown_of_generated_clusters_fits_a_comment(scenario: str, tmp_path: Path) -> None:
    """The 8-rank cluster with every planted fault and the 64-rank cluster (tests/ascend/gen_cluster.py)."""
    from tests.ascend.gen_cluster import generate

    generate(scenario, tmp_path / scenario)
    out = tmp_path / "r.md"
    res = run_cli(tmp_path / scenario, "--out", out, "--out", tmp_path / "r.json")
    assert res.returncode in (0, 1), res.stderr
    validate_report(json.loads((tmp_path / "r.json").read_text()))
    md = out.read_text()
    assert len(md) < COMMENT_LIMIT
    if scenario == "cluster64":
        assert "16 slowest of 64 ranks shown" in md
    if scenario == "layout_dp4_tp2_pp2":  # the parallel groups and the ranks x steps picture in one paragraph
        assert "4 dp groups of 4, 8 tp groups of 2, 8 pp groups of 2" in md and "Ranks x steps (16 ranks" in md


# ---------------------------------------------------------------------------------------------
# Terminal
# ---------------------------------------------------------------------------------------------


def _breakdown_ranks(text: str) -> list[str]:
    """Rank labels of the breakdown table's rows ("all", "0", "1 *", ...)."""
    block = text[text.index("Step breakdown"):]
    block = block[:block.index("\n\n")] if "\n\n" in block else block
    labels = []
    for line in block.splitlines()[1:]:
        # a row of the boxed table ("  1 * │ ..."), of the table without a box ("   18     1.01 s ...")
        # or of the paragraph layout ("rank 18: ...")
        m = re.match(r"\s*(all|\d+(?: \*)?)(?:\s+│|\s{2,}\S)", line) or re.match(r"\s*rank (all|\d+(?: \*)?):", line)
        if m:
            labels.append(m.group(1))
    return labels


def _check_terminal(text: str, width: int, ranks: list[int]) -> None:
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    body = text[text.index("Step breakdown"):text.index("Critical path") if "Critical path" in text else None]
    assert not CUT_NUMBER.search(body), CUT_NUMBER.search(body)
    shown = [label.rstrip(" *") for label in _breakdown_ranks(text)]
    assert shown[0] == "all" and sorted(int(r) for r in shown[1:]) == ranks
    assert "→ " in text  # the first optimisation of each finding, without -v


def _pty_run(args: list[str], columns: int) -> str:
    """``advisor analyze ARGS`` with a pseudo-terminal of ``columns`` columns as stdout."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "advisor.cli", "analyze", *args], stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, cwd=ROOT, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError("no output from advisor in 120 s")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode() if proc.stderr else ""
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return ANSI.sub("", text)


# a process each (~2 s): the quick suite runs one width, the marked run both
@pytest.mark.parametrize("columns", [80, pytest.param(100, marks=pytest.mark.slow)])
def test_terminal_in_a_pseudo_terminal_keeps_numbers_and_ranks(columns: int) -> None:
    text = _pty_run([str(GLOO)], columns)
    assert "Verdict: " in text
    _check_terminal(text, columns, [0, 1])


@pytest.mark.parametrize("columns", [pytest.param(80, marks=pytest.mark.slow), 100])
def test_piped_terminal_output_honours_columns(columns: int) -> None:
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "advisor.cli", "analyze", str(GLOO)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stdout
    _check_terminal(res.stdout, columns, [0, 1])


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120])
def test_terminal_many_ranks_at_any_width(width: int) -> None:
    """20 ranks with long step times: at every width the table (or, below any table, one paragraph
    per rank) shows the 16 ranks it picks, each number whole."""
    from advisor.render.terminal import render_text

    d = _data(GLOO)
    base = d["breakdown"][0]
    d["breakdown"] = [{**base, "rank": r, "step": 1, "step_us": 987_654.3 + 1000 * r, "comm_only_us": 617_123.4,
                       "compute_only_us": 290_000.0 + r, "free_us": 0.0} for r in range(20)]
    text = render_text(d, width=width)
    shown = [label.rstrip(" *") for label in _breakdown_ranks(text)]
    assert sorted(int(r) for r in shown[1:]) == list(range(4, 20))
    body = text[text.index("Step breakdown"):text.index("Findings")]
    assert not CUT_NUMBER.search(body), CUT_NUMBER.search(body)
    words = " ".join(body.split())  # a narrow paragraph may break between a number and its unit
    assert "617.12 ms" in words and "991.65 ms" in words  # rank 4's mean step: 987,654.3 + 4,000 µs
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width


def test_terminal_shows_the_first_optimisation_without_verbose() -> None:
    from advisor.render.terminal import render_text

    d = _data(GLOO)
    quiet, loud = render_text(d), render_text(d, verbose=True)
    for f in d["findings"]:
        opts = f["optimizations"]
        assert f"→ {opts[0]['title']}" in quiet
        for o in opts[1:]:
            assert o["title"] not in quiet and o["title"] in loud


# ---------------------------------------------------------------------------------------------
# --out
# ---------------------------------------------------------------------------------------------


def test_out_format_follows_the_extension_and_is_repeatable(tmp_path: Path) -> None:
    """One run writes HTML, Markdown and JSON; stdout holds the verdict line and one ``wrote`` per file."""
    outs = [tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json", tmp_path / "R.HTM"]
    res = run_cli(GLOO, *[a for p in outs for a in ("--out", p)])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Verdict: CRITICAL: ") and lines[1:] == [f"wrote {p}" for p in outs]
    assert outs[0].read_text().startswith("<!doctype html>") and outs[3].read_text() == outs[0].read_text()
    assert outs[1].read_text().startswith("## advisor: ")
    data = json.loads(outs[2].read_text())
    validate_report(data)
    root = next(f for f in data["findings"] if f["id"] == data["savings"]["verdict"])
    assert root["title"] in lines[0]


@pytest.mark.parametrize(("args", "message"), [
    (["--out", "r.html", "--format", "md"], "the extension .html means --format html, not --format md"),
    (["--out", "r.json", "--format", "terminal"], "the extension .json means --format json"),
    (["--out", "r.txt"], "no format for the extension .txt"),
    (["--out", "report"], "no format for the extension (none)"),
    (["--out", "r.md", "--out", "./r.md"], "given twice"),
])
def test_out_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    res = run_cli(GLOO, *args, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("advisor: --out ") and message in res.stderr
    assert "Traceback" not in res.stderr and not list(tmp_path.iterdir())


def test_out_with_an_unknown_extension_uses_format(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    res = run_cli(GLOO, "--format", "terminal", "--out", out)
    assert res.returncode == 0, res.stderr
    assert out.read_text().splitlines()[3].startswith("Verdict: ")
    assert res.stdout.splitlines()[1:] == [f"wrote {out}"]
