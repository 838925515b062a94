"""Run every malformed / hostile profile of the corpus through the CLI in a subprocess (issue 6).

For each case (see ``corpus.py``) and each of its formats: ``python -m advisor.cli analyze CASE
--format FMT --out OUT`` runs in an empty CWD with empty HOME and TMPDIR, under a timeout, and
the checks below apply to every run:

* it ends (no hang) with exit 0 or 2 (1 is the gate; a signal is a crash);
* stderr holds only printable one-line messages starting with ``advisor:``, never ``Traceback``
  nor ``internal error`` (an exception the tool did not expect);
* nothing on stdout (the report goes to ``--out``), a report only when it exits 0, and it is strict
  JSON valid against the contract schema;
* peak RSS stays under the case's cap (2 GB);
* nothing is written anywhere but ``--out``: the case directory (profile and anything it links
  to), the CWD, HOME and TMPDIR are the same before and after, and the output directory holds
  only the report.

Then the case's own expectation (error / partial / ok / escaped / tolerated) is checked.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from advisor.ingest.base import one_line
from tests.conftest import validate_report
from tests.robustness.corpus import (
    HOSTILE_FILE,
    HOSTILE_NAMES,
    Case,
    Run,
    all_cases,
    healthy_steps,
    run_cli,
    snapshot,
    strict_json,
)

NEEDS = {
    "ascend": ("advisor.ingest.ascend", "the Ascend reader (advisor/ingest/ascend.py) is not there yet"),
    "html": ("advisor.render.html", "the HTML renderer (advisor/render/html.py) is not there yet"),
    "md": ("advisor.render.markdown", "the Markdown renderer (advisor/render/markdown.py) is not there yet"),
}

# Cases that fail today, with what goes wrong; the lead fixes advisor/ and removes the entry.
# Keep the reasons short: the full observations are in the robustness report.
KNOWN_FAILURES: dict[str, str] = {
}


def _available(need: str) -> bool:
    mod = NEEDS[need][0]
    try:
        return importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="session")
def bomb_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bomb_cache")


def describe(run: Run) -> str:
    """What happened, for assertion messages (command, exit code, stderr excerpt, time, memory)."""
    err = run.stderr if len(run.stderr) < 3000 else run.stderr[:1500] + "\n[...]\n" + run.stderr[-1500:]
    cmd = " ".join(repr(a) if (" " in a or not a.isprintable()) else a for a in run.command[1:])
    return (f"\n  command: python {cmd}\n  exit: {run.returncode}{' (timed out)' if run.timed_out else ''}"
            f"  time: {run.seconds:.1f}s  peak RSS: {run.peak_rss_mb:.0f} MB\n  stderr:\n{err}")


def _strings(value: Any) -> list[str]:
    """Every string (keys and values) in a parsed JSON document."""
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out.extend(map(str, v.keys()))
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def _report_ranks(data: dict[str, Any]) -> set[int]:
    return set(data.get("profile", {}).get("ranks") or [])


def check_universal(case: Case, run: Run, out: Path, out_dir: Path) -> Any:
    """The checks every run passes; returns the parsed JSON report (or None)."""
    ctx = describe(run)
    assert not run.timed_out, f"hung: killed after {case.timeout:.0f}s{ctx}"
    assert run.returncode in (0, 2), f"exit code {run.returncode} (expected 0 or 2; negative = killed by a signal){ctx}"
    assert "Traceback" not in run.stderr, f"traceback on stderr{ctx}"
    assert "internal error" not in run.stderr, f"an unexpected exception (internal error){ctx}"
    lines = run.stderr.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        assert line.startswith("advisor:"), f"stderr line does not start with 'advisor:': {line[:200]!r}{ctx}"
        assert all(ch.isprintable() for ch in line), f"control character in stderr line {line[:200]!r}{ctx}"
    if run.returncode == 2:
        assert any(not ln.startswith("advisor: warning:") for ln in lines), f"exit 2 without an error line{ctx}"
    # with --out, stdout holds only the verdict line and "wrote OUT" (nothing when the run failed)
    expected = [] if run.returncode == 2 else ["Verdict: ", f"wrote {out}"]
    got = run.stdout.splitlines()
    assert len(got) == len(expected) and all(g.startswith(e) for g, e in zip(got, expected)), \
        f"stdout is not the verdict and 'wrote {out}' although --out was given: {run.stdout[:300]!r}{ctx}"
    assert run.peak_rss_mb < case.max_rss_mb, f"peak RSS {run.peak_rss_mb:.0f} MB >= {case.max_rss_mb} MB{ctx}"
    leftovers = sorted(p.name for p in out_dir.iterdir() if p != out)
    assert not leftovers, f"files left beside the report: {leftovers}{ctx}"
    data = None
    if run.returncode == 0:
        assert out.is_file(), f"exit 0 but no report at --out{ctx}"
        text = out.read_text(encoding="utf-8")
        if out.suffix == ".json":
            data = strict_json(text)
            validate_report(data)
        for s in case.absent:
            assert s not in text, f"{s!r} appears in the report (content from outside the profile?){ctx}"
    else:
        assert not out.exists(), f"exit {run.returncode} but a report was written{ctx}"
    for s in case.absent:
        assert s not in run.stderr, f"{s!r} appears on stderr{ctx}"
    return data


def _names_in(text: str, names: tuple[str, ...]) -> bool:
    return any(n in text or one_line(n, 10_000) in text for n in names)


def check_expectation(case: Case, run: Run, data: Any) -> None:
    ctx = describe(run)
    lines = [ln for ln in run.stderr.split("\n") if ln]
    if case.expect == "error":
        assert run.returncode == 2, f"expected exit 2 (error), got {run.returncode}{ctx}"
        errors = [ln for ln in lines if not ln.startswith("advisor: warning:")]
        assert len(errors) == 1, f"expected exactly one error line, got {len(errors)}{ctx}"
        if case.names:
            assert _names_in(errors[0], case.names), f"the error line does not name {case.names}{ctx}"
        if case.problem:
            assert re.search(case.problem, errors[0], re.IGNORECASE), f"the error line does not match /{case.problem}/{ctx}"
        return
    if case.expect == "tolerated":
        if run.returncode == 2 and case.names:
            errors = [ln for ln in lines if not ln.startswith("advisor: warning:")]
            assert any(_names_in(ln, case.names) for ln in errors), f"the error line does not name {case.names}{ctx}"
        return
    assert run.returncode == 0, f"expected exit 0 ({case.expect}), got {run.returncode}{ctx}"
    assert data is not None
    ranks = _report_ranks(data)
    if case.ranks is not None:
        assert set(case.ranks) <= ranks, f"ranks {sorted(ranks)} lack {sorted(set(case.ranks) - ranks)}{ctx}"
        if case.exact_ranks:
            assert ranks == set(case.ranks), f"ranks {sorted(ranks)}, expected exactly {list(case.ranks)}{ctx}"
    srcs = set(data["profile"].get("sources") or [])
    assert set(case.sources) <= srcs, f"sources {sorted(srcs)} lack {sorted(set(case.sources) - srcs)}{ctx}"
    if case.steps_like_healthy:
        got = sorted({r["step"] for r in data["breakdown"] if r["rank"] == 1 and r["step"] is not None})
        assert got == list(healthy_steps()), f"rank 1 steps {got}, expected {list(healthy_steps())}{ctx}"
    if case.expect == "partial":
        warned = [w for w in data["warnings"] if w.get("path") and _names_in(w["path"], case.names)]
        if case.or_analysed and set(case.or_analysed) <= ranks:
            return
        if case.message_re and any(re.search(case.message_re, w.get("message", ""), re.IGNORECASE) for w in data["warnings"]):
            return
        assert warned, (f"no warning names {case.names} (warnings: "
                        f"{[(w['code'], w.get('path')) for w in data['warnings']]}){ctx}")
        for w in warned:
            assert w.get("code") and w.get("message"), f"warning without code/message: {w}{ctx}"
        if case.codes:
            assert any(w["code"] in case.codes for w in warned), (
                f"warning codes {[w['code'] for w in warned]}, expected one of {case.codes}{ctx}")
        assert any(ln.startswith("advisor: warning:") and _names_in(ln, case.names) for ln in lines), (
            f"the warning about {case.names} is not on stderr{ctx}")
    if case.expect == "escaped":
        strings = _strings(data)
        for s in ("<script>alert(1)</script>", "{{ 7*7 }}", '" onmouseover="x'):
            assert any(s in v for v in strings), (
                f"hostile op name {s!r} did not reach the JSON report: the case no longer tests escaping{ctx}")
        assert any(HOSTILE_FILE in v for v in strings), f"hostile file name not in the JSON warnings{ctx}"


RAW_MARKUP = ("<script>alert(1)", "<img src=x", "<svg onload", 'onmouseover="x', "<b>bold</b>", "<i>gloo</i>")


def check_escaped(fmt: str, text: str, run: Run, controls: bool = False) -> None:
    ctx = describe(run)
    if controls:  # control characters from profile strings show visibly (e.g. as \x1b or U+241B), never raw
        raw = sorted({f"U+{ord(ch):04X}" for ch in text if ord(ch) < 32 and ch not in "\n\r\t"})
        assert not raw, f"raw control characters {raw} in the {fmt} report{ctx}"
        return
    if fmt == "html":
        for s in RAW_MARKUP:
            assert s not in text, f"unescaped {s!r} in the HTML report{ctx}"
        assert "7*7" in text, f"the op name '{{{{ 7*7 }}}}' does not show as text in the HTML report (evaluated?){ctx}"
    elif fmt == "md":
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        prose = re.sub(r"(`+)(?:(?!\1).)+?\1", "", prose, flags=re.DOTALL)  # inline code spans are safe
        for s in RAW_MARKUP:
            if s.startswith("<"):  # a quote in Markdown prose is harmless; raw tags are not
                assert s not in prose, f"unescaped {s!r} outside code in the Markdown report{ctx}"
        assert "7*7" in text.replace("\\", ""), f"the op name '{{{{ 7*7 }}}}' does not show in the Markdown report{ctx}"
        assert not any(ln.startswith("second line") for ln in text.splitlines()), (
            f"a newline in an op name broke a Markdown line{ctx}")


# A few cases run in the quick suite, each a CLI process of its own (~2 s): an unreadable file, a missing path, a
# file name with control characters, a corrupt .db. The whole corpus (bad
# values, duplicate ranks, FIFOs, hostile strings in every format, the gzip bombs and the fuzzers' finds) runs
# with the marked tests (-m slow); escaping in every renderer is also checked in-process by
# tests/test_render_hostile.py and tests/test_render_formats.py.
QUICK_CASES = frozenset({
    "alone_truncated_gzip", "missing_path", "control_chars_in_file_name", "ascend_corrupt_db_only",
})


@pytest.mark.parametrize("case", [c if c.id in QUICK_CASES else pytest.param(c, marks=pytest.mark.slow)
                                  for c in all_cases()], ids=lambda c: c.id)
def test_corpus_case(case: Case, tmp_path: Path, bomb_cache: Path, request: pytest.FixtureRequest) -> None:
    for need in case.needs:
        if not _available(need):
            request.applymarker(pytest.mark.xfail(reason=NEEDS[need][1], strict=False))
    if case.id in KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILURES[case.id], strict=False))
    root = tmp_path / "case"
    root.mkdir()
    build = case.cache_build(bomb_cache) if case.cache_build else case.build
    profile = build(root)
    env_dirs = {"HOME": tmp_path / "home", "TMPDIR": tmp_path / "tmp", "TEMP": tmp_path / "tmp", "TMP": tmp_path / "tmp"}
    cwd = tmp_path / "cwd"
    out_dir = tmp_path / "out"
    for d in (cwd, out_dir, *env_dirs.values()):
        d.mkdir(exist_ok=True)
    watched = {"case directory": root, "CWD": cwd, "HOME": env_dirs["HOME"], "TMPDIR": env_dirs["TMPDIR"]}
    before = {k: snapshot(v) for k, v in watched.items()}

    for fmt in case.formats:
        if fmt != "json" and fmt in NEEDS and not _available(fmt):
            pytest.xfail(NEEDS[fmt][1])
        out = out_dir / f"report.{fmt}"
        args = ["analyze", str(profile), "--format", fmt, "--out", str(out), *case.args]
        run = run_cli(args, cwd=cwd, env_dirs=env_dirs, timeout=case.timeout)
        data = check_universal(case, run, out, out_dir)
        if fmt == "json":
            check_expectation(case, run, data)
        elif case.expect == "escaped":
            assert run.returncode == 0, f"expected exit 0, got {run.returncode}{describe(run)}"
            check_escaped(fmt, out.read_text(encoding="utf-8"), run, controls=bool(case.extra.get("controls")))
        after = {k: snapshot(v) for k, v in watched.items()}
        for k in watched:
            added = sorted(set(after[k]) - set(before[k]))
            changed = sorted(p for p in set(after[k]) & set(before[k]) if after[k][p] != before[k][p])
            removed = sorted(set(before[k]) - set(after[k]))
            assert not (added or changed or removed), (
                f"the run wrote outside --out, in the {k}: added {added[:10]}, changed {changed[:10]}, "
                f"removed {removed[:10]}{describe(run)}")
        if out.exists():
            out.unlink()


def test_corpus_ids_unique() -> None:
    ids = [c.id for c in all_cases()]
    assert len(ids) == len(set(ids))
    assert set(KNOWN_FAILURES) <= set(ids), sorted(set(KNOWN_FAILURES) - set(ids))
    assert QUICK_CASES <= set(ids), sorted(QUICK_CASES - set(ids))


def test_hostile_names_cover_the_issue() -> None:
    """The escaping case carries the strings issue 6 names."""
    names = set(HOSTILE_NAMES.values())
    assert "{{ 7*7 }}" in names and "<script>alert(1)</script>" in names and '" onmouseover="x' in names
    assert any("\n" in n for n in names) and any("\x1b" in n for n in names)
