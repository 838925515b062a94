"""The README stays what a user needs first (the two commands verbatim, a report excerpt, Adding a rule,
the Layout) and points to the reference under docs/; every relative link of the README and docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL = "pip install -e . && advisor analyze sample_profiles/kineto_resnet50_num_workers_0"
TESTS = "pip install -e '.[test]' && python -m pytest"  # the command .ci/run runs


def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_two_commands_are_the_first_commands_verbatim() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = [b.strip() for b in re.findall(r"^    (\S.*)$", text, re.MULTILINE)]
    commands = [b for b in blocks if b.startswith("pip ")]
    assert commands[:2] == [INSTALL, TESTS]
    assert TESTS in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # the virtual environment comes before the install
    assert text.index("python3 -m venv .venv && . .venv/bin/activate") < text.index(INSTALL)


def test_the_readme_is_short_and_links_the_reference() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.split()) < 2500, "the reference belongs under docs/"
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    for h in ("The two commands", "What a report looks like", "Usage", "Adding a rule", "Layout"):
        assert h in headings, h
    for doc in ("usage.md", "numbers.md", "ci-gate.md", "bad-input.md", "clusters.md", "CAUSES.md", "testing.md"):
        assert f"(docs/{doc})" in text, doc


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in _pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_report_screenshot_is_shipped_and_small() -> None:
    png = ROOT / "docs" / "report.png"
    assert "(docs/report.png)" in README.read_text(encoding="utf-8")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 300_000


def test_the_terminal_excerpt_is_the_tools_own_output_shape() -> None:
    """The excerpt shows what the first command prints: its header, verdict, breakdown and findings."""
    text = README.read_text(encoding="utf-8")
    excerpt = text.split("```console", 1)[1].split("```", 1)[0]
    for line in ("advisor analyze sample_profiles/kineto_resnet50_num_workers_0", "Verdict: CRITICAL",
                 "Step breakdown (mean per step)", "Findings (1)", "IO001", "→ More dataloader workers"):
        assert line in excerpt, line
