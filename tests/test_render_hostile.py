"""Strings a profile or a report supplies reach no renderer as anything but text (issue 33).

The terminal gets no control character, escape sequence or bidirectional override from them and
reads none of them as Rich markup; Markdown gets no image, no link but http(s), no raw HTML from a
report's rule documentation, and a ``|`` inside a code span in a table does not split the row; the
HTML text carries no control character. The hostile strings are built here, in a hand-made report.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from advisor import cli
from advisor.model import SCHEMA_ID
from advisor.text import one_line, printable

ESC = "\x1b"
#: a colour no renderer of ours writes (blink, magenta, reverse), a bell, an OSC-8 hyperlink and a
#: window title, C1 CSI, a right-to-left override, CR and a backspace
COLOUR = f"{ESC}[5;35;7m"
HOSTILE = (f"op{COLOUR}RED{ESC}[0m\x07 {ESC}]8;;http://evil.example/{ESC}\\click{ESC}]8;;{ESC}\\ "
           f"{ESC}]0;pwned\x07 \x9b2J \u202eevil\u202c back\x08\rspace")
MARKUP = "[link=http://evil.example]X[/link][/oops] :smile:"
#: what none of the payloads may leave in any output: a raw control (but newline and tab), the
#: hyperlink and title introducers, C1 CSI, the bidi overrides
FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def hostile_report() -> dict[str, Any]:
    """A small JSON report (two ranks, three steps) whose every profile string is hostile."""
    bd = []
    for rank in (0, 1):
        for step in (1, 2, 3):
            bd.append({"rank": rank, "step": step, "step_us": 1000.0 + 100 * rank + step, "compute_only_us": 500.0,
                       "overlapped_us": 100.0, "comm_only_us": 200.0, "host_only_us": 100.0,
                       "free_us": 100.0 + 100 * rank + step, "overlap_ratio": 0.5})
    finding = {
        "id": "f1", "rule": MARKUP, "bottleneck": HOSTILE, "cause": f"cause|with`tick{HOSTILE}", "severity": "high",
        "title": f"title {HOSTILE} {MARKUP}", "detail": HOSTILE,
        "evidence": {"key|with`tick`": 1.5, f"k{COLOUR}": HOSTILE, "total_us": 10.0},
        "ranks": [1], "steps": [1, 2], "ops": [HOSTILE, MARKUP], "estimated_saving_us": 100.0,
        "saving_fraction": 0.1, "saving_basis": HOSTILE,
        "optimizations": [{"id": "o", "title": f"fix {HOSTILE}", "how": MARKUP}],
        "top": [{"name": HOSTILE, "time_us": 5.0}], "explains": [], "explained_by": [MARKUP], "root": True,
        "root_id": None,
    }
    return {
        "schema": SCHEMA_ID,
        "tool": {"name": "advisor", "version": f"0{COLOUR}"},
        "profile": {"path": f"/p/{HOSTILE}", "sources": ["kineto"], "ranks": [0, 1], "world_size": 2,
                    "steps": [1, 2, 3], "cpu_only": False},
        "breakdown": bd,
        "critical_path": {"rank": 1, "step": 2, "length_us": 1000.0,
                          "ops": [{"name": HOSTILE, "kind": "compute", "total_us": 600.0, "count": 2},
                                  {"name": MARKUP, "kind": MARKUP, "total_us": 400.0, "count": 1}]},
        "findings": [finding],
        "warnings": [{"code": "w", "path": f"/p/{HOSTILE}", "message": f"{HOSTILE} {MARKUP}"}],
        "rules": [{"rule": MARKUP, "status": "ran", "reason": "", "findings": 1, "seconds": 0.0},
                  {"rule": "X1", "status": "skipped", "reason": f"{HOSTILE} {MARKUP}", "findings": 0, "seconds": 0.0}],
        "step_times": [],
        "rule_docs": {MARKUP: "doc"},
    }


def _no_controls(text: str, where: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in FORBIDDEN.findall(text)})
    assert not bad, f"{where}: raw control / bidi characters {bad}"


# -- the one helper --------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "shown"), [
    (f"a{COLOUR}b", "a\ufffd[5;35;7mb"),                               # SGR colour: inert, visible
    (f"x{ESC}]8;;http://e/{ESC}\\y", "x\ufffd]8;;http://e/\ufffd\\y"),  # OSC-8 hyperlink
    (f"t{ESC}]0;title\x07u", "t\ufffd]0;title\ufffdu"),                # window title ended by BEL
    ("c\x9b2Jd", "c\ufffd2Jd"),                                         # C1 CSI (erase screen)
    ("\u202eevil", "\ufffdevil"),                                       # right-to-left override
    ("a\r\nb\rc\u2028d", "a\nb\nc\nd"),                                 # line ends become newlines
    ("tab\tand\nline", "tab\tand\nline"),                               # kept: the renderer decides
    ("plain [b]text[/b] é ∥", "plain [b]text[/b] é ∥"),
])
def test_printable(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert "\n" not in one_line(raw) and not FORBIDDEN.search(one_line(raw))


# -- terminal ----------------------------------------------------------------------------------------

def test_terminal_shows_hostile_strings_as_text() -> None:
    from advisor.render.terminal import render_text

    text = render_text(hostile_report(), verbose=True)
    _no_controls(text, "terminal")
    assert "[/oops]" in text and "[link=http://evil.example]" in text  # printed, not parsed
    assert ":smile:" in text  # no emoji substitution either
    assert "op\ufffd[5;35;7mRED" in text  # the sequence is inert and visible: the name stays recognisable
    header = text.splitlines()[0]
    assert header.startswith("advisor 0") and "/p/op" in header and header.endswith("space")  # a newline in a name breaks no line


def test_terminal_in_colour_writes_only_its_own_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    from advisor.render.terminal import print_report

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    buf = io.StringIO()
    print_report(hostile_report(), verbose=True, color=None, file=buf, width=120)
    out = buf.getvalue()
    assert f"{ESC}[" in out, "the test expects a colour console"
    for seq in (COLOUR, f"{ESC}]", "\x07", "\x9b", "\u202e", "\x08", "\r"):
        assert seq not in out, f"{seq!r} from the report reached the terminal"
    assert "[/oops]" in out


def test_render_command_prints_a_hostile_report_cleanly(tmp_path: Path) -> None:
    src = tmp_path / "r.json"
    src.write_text(json.dumps(hostile_report()), encoding="utf-8")
    for args in ([], ["-v"]):
        res = CliRunner().invoke(cli.main, ["render", str(src), *args])
        assert res.exit_code == 0, res.output
        _no_controls(res.output, f"render {args}")
        assert "[/oops]" in res.output


def test_analyze_verbose_prints_no_control_character(tmp_path: Path) -> None:
    """Operator names with colour codes, a bell and a hyperlink, in a trace: ``analyze -v``."""
    from tests.render_helpers import write_evil_trace

    trace = write_evil_trace(tmp_path / "prof")
    data = json.loads(trace.read_text())
    names = [f"op{COLOUR}red{ESC}[0m", f"bell\x07{ESC}]8;;http://evil.example/{ESC}\\x", MARKUP]
    for e, evil in zip([e for e in data["traceEvents"] if e.get("cat") == "cpu_op"], names * 100):
        e["name"] = evil
    trace.write_text(json.dumps(data))
    res = CliRunner().invoke(cli.main, ["analyze", str(tmp_path / "prof"), "-v"])
    assert res.exit_code == 0, res.output
    _no_controls(res.output, "analyze -v")
    assert "op\ufffd[5;35;7mred" in res.output and "[/oops]" in res.output


# -- Markdown ------------------------------------------------------------------------------------------

def test_markdown_has_no_control_and_keeps_table_rows_whole() -> None:
    from advisor.render.markdown import render

    for full in (False, True):
        text = render(hostile_report(), full=full)
        _no_controls(text, "markdown")
        # the evidence table: every row three cells, whatever the key holds ('|' and '`' included)
        table = text[text.index("| evidence |"):].split("\n\n", 1)[0].splitlines()
        for row in table:
            cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]
            assert len(cells) == 3, row
        row = next(r for r in table if "key" in r)
        assert "`` key\\|with`tick` ``" in row  # a two-backtick fence: the backticks in the key are text


def test_markdown_code_span_fences() -> None:
    from advisor.render.markdown import md_code

    assert md_code("a|b") == "`a|b`"
    assert md_code("a|b", cell=True) == "`a\\|b`"
    assert md_code("x``y") == "```x``y```"
    assert md_code("`start") == "`` `start ``"
    assert md_code("a" * 100, 10) == "`" + "a" * 9 + "…`"


HOSTILE_DOC = """# X1 rule

Read [the docs](https://example.org/docs) and [this](javascript:alert(1)) and [data](data:text/html,x).
![tracker](https://tracker.example/pixel.png?pr=1) ![ref tracker][t]
<img src="https://tracker.example/i.png"> <a href="javascript:alert(2)">x</a> <javascript:alert(3)>
[click][j]

[t]: https://tracker.example/ref.png
[j]: javascript:alert(4)

Inline `<b>code</b>` stays code.

```
<script>literal in a fence</script>
```
"""


def test_md_full_sanitises_a_reports_rule_docs() -> None:
    from advisor.render.markdown import render

    d = hostile_report()
    d["findings"][0]["rule"] = "X1"
    d["rule_docs"] = {"X1": HOSTILE_DOC}
    text = render(d, full=True)
    assert "[the docs](https://example.org/docs)" in text  # an http(s) link stays
    assert not re.search(r"\]\(\s*(javascript|data):", text) and "<javascript:" not in text  # no such link
    assert "javascript:alert(1)" not in text and "data:text" not in text and "[this]" not in text
    assert "![" not in text and "pixel.png" not in text
    assert "<img" not in text and "<a " not in text and "&lt;img" in text
    assert "[j]:" not in text  # the javascript: link definition is dropped; [t] is an image's, kept as a link target
    assert "`<b>code</b>`" in text and "<script>literal in a fence</script>" in text  # code shows literally


def test_installed_rule_docs_pass_the_sanitiser_unchanged() -> None:
    from advisor.engine.registry import discover
    from advisor.render.docs import rule_markdown
    from advisor.render.markdown import safe_doc

    for rid, spec in discover().items():
        doc = rule_markdown(spec)
        assert safe_doc(doc) == doc, rid


def test_render_command_takes_installed_rule_docs(tmp_path: Path) -> None:
    """A report that rewrote a known rule's docs: ``render`` shows the installed rule's own text."""
    from advisor.engine.registry import discover

    spec = discover()["CLU001"]
    d = hostile_report()
    d["findings"][0]["rule"] = "CLU001"
    d["rule_docs"] = {"CLU001": "Trust me: ![x](https://tracker.example/p.png) [fix](https://fix.example)"}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(d), encoding="utf-8")
    res = CliRunner().invoke(cli.main, ["render", str(src), "--format", "md", "--md-full"])
    assert res.exit_code == 0, res.output
    assert "Trust me" not in res.output and "tracker.example" not in res.output and "fix.example" not in res.output
    assert spec.doc.summary.split("\n")[0] in res.output
    res = CliRunner().invoke(cli.main, ["render", str(src), "--format", "json"])  # JSON: the report as it is
    assert json.loads(res.output)["rule_docs"] == d["rule_docs"]


# -- HTML ----------------------------------------------------------------------------------------------

def test_html_text_has_no_control_character() -> None:
    from advisor.render.html import render

    text = render(hostile_report())
    _no_controls(text, "html")
    assert "[/oops]" in text and "<script>" not in text.split("<script", 1)[0]


# -- render --out, several -----------------------------------------------------------------------------

def test_render_writes_every_out(tmp_path: Path) -> None:
    from advisor.render import html, markdown

    d = hostile_report()
    src = tmp_path / "r.json"
    src.write_text(json.dumps(d), encoding="utf-8")
    a, b, c = tmp_path / "a.html", tmp_path / "b.md", tmp_path / "c.json"
    res = CliRunner().invoke(cli.main, ["render", str(src), "--out", str(a), "--out", str(b), "--out", str(c)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"wrote {a}", f"wrote {b}", f"wrote {c}"]
    assert a.read_text(encoding="utf-8") == html.render(d)
    assert b.read_text(encoding="utf-8") == markdown.render(d)
    assert json.loads(c.read_text(encoding="utf-8")) == d
    res = CliRunner().invoke(cli.main, ["render", str(src), "--out", str(a), "--out", str(tmp_path / "no" / "x.md")])
    assert res.exit_code == 2 and "does not exist" in res.output
