"""docs/CAUSES.md, the cause list the README and ``advisor explain`` cite, is shipped, up to date with the
cause registry (scripts/causes_md.py writes it), and holds every cause id a rule declares or ``explain`` prints."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from click.testing import CliRunner

from advisor.causes import causes
from advisor.cli import main
from advisor.engine.registry import discover

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "CAUSES.md"


def _listed() -> set[str]:
    """The cause ids that have a row in docs/CAUSES.md's table."""
    return set(re.findall(r"^\| ([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*) \|", DOC.read_text(encoding="utf-8"), re.MULTILINE))


def test_the_cause_list_is_shipped_and_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("causes_md", ROOT / "scripts" / "causes_md.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert DOC.is_file(), "docs/CAUSES.md is missing: run python scripts/causes_md.py"
    assert DOC.read_text(encoding="utf-8") == mod.generate(), "docs/CAUSES.md is stale: run python scripts/causes_md.py"
    assert mod.main(["--check"]) == 0


def test_every_cause_of_the_registry_and_of_every_rule_is_listed() -> None:
    listed = _listed()
    assert set(causes()) <= listed
    declared = {(s.id, c) for s in discover().values() for c in s.all_causes}
    assert declared and [(rid, c) for rid, c in declared if c not in listed] == []


def test_every_cause_id_explain_prints_resolves() -> None:
    """Every ``area.name`` of a cause area that ``advisor explain`` prints (its cause sections and the
    ids its text cites; a rule's own name is of that form too and is not one) has a row in docs/CAUSES.md; the list itself is named where a threshold cites it."""
    listed = _listed()
    areas = {cid.split(".")[0] for cid in listed}
    specs = discover()
    rule_names = {s.name for s in specs.values()}  # a rule's own name (``compute.roofline``) is no cause
    runner = CliRunner()
    dangling: list[tuple[str, str]] = []
    seen = 0
    for rid in specs:
        res = runner.invoke(main, ["explain", rid])
        assert res.exit_code == 0, res.output
        for area, name in re.findall(r"(?<![\w.-])([a-z]+)\.([a-z][a-z0-9_]*)(?![\w-])", res.output):
            if area in areas and f"{area}.{name}" not in rule_names:
                seen += 1
                if f"{area}.{name}" not in listed:
                    dangling.append((rid, f"{area}.{name}"))
    assert seen >= len(specs)
    assert dangling == []


def test_the_readme_links_the_shipped_list() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/CAUSES.md" in readme
