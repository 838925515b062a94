"""Meta tests: every rule is documented, tested both ways, and every contract cause is covered."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from advisor.causes import causes
from advisor.engine.registry import LOAD_ERRORS, discover

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CASES = Path(__file__).resolve().parents[1] / "rules" / "cases"


def test_all_rule_modules_load() -> None:
    discover()
    assert not LOAD_ERRORS


@pytest.mark.parametrize("rule_id", sorted(discover()))
def test_rule_has_firing_and_quiet_cases_and_docs(rule_id: str) -> None:
    spec = discover()[rule_id]
    path = CASES / f"{rule_id}.toml"
    assert path.is_file(), f"{rule_id} has no case file {path.name}"
    kinds = {c["expect"] for c in tomllib.loads(path.read_text())["case"]}
    assert {"fires", "quiet"} <= kinds, f"{rule_id} needs a firing and a quiet case, has {kinds}"
    assert spec.doc.summary and all(spec.doc.sections[s].strip() for s in ("Why it matters", "How it is detected", "What to do"))
    for f in spec.threshold_fields():
        assert f.metadata.get("help"), f"{rule_id}.{f.name} lacks help text"


def test_every_contract_cause_has_a_rule_and_optimizations() -> None:
    # the vocabulary as shipped (rules/causes.toml); tests/meta/test_contract.py checks it holds the contract's
    contract = sorted(causes())
    assert len(contract) >= 29
    covered = {c for spec in discover().values() for c in spec.all_causes}
    assert not [c for c in contract if c not in covered]
    for cid in contract:
        assert causes()[cid].optimizations, f"{cid} has no optimizations in rules/causes.toml"


def test_no_orphan_causes() -> None:
    used = {c for spec in discover().values() for c in spec.all_causes}
    assert not set(causes()) - used, "causes in rules/causes.toml that no rule can report"


def test_rules_use_the_rule_context_not_the_analysis() -> None:
    """Rules read the profile through RuleContext helpers (query, scalar, step_us, breakdown ...),
    never the analysis object, its connection or the stages / analyze modules."""
    import re

    rules_dir = Path(__file__).resolve().parents[2] / "rules"
    pattern = re.compile(r"ctx\.(analysis|con|extras)\b|ctx\.breakdown\b(?!\()|from advisor\.(stages|analyze)\b"
                         r"|import advisor\.(stages|analyze)\b")
    offenders = [f"{p.relative_to(rules_dir)}:{i}: {line.strip()}"
                 for p in sorted(rules_dir.rglob("*.py"))
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not offenders, "\n".join(offenders)


def _rule_sql_text(module_name: str) -> str:
    """A rule module's source plus the strings and helper functions it imports from the rule packages
    (shared SQL fragments live in ``rules/<category>/_common.py``)."""
    import inspect
    import re

    mod = sys.modules[module_name]
    # without the @rule(...) declaration itself
    texts = [re.sub(r"^@rule\(.*?\)\n(?=def )", "", inspect.getsource(mod), flags=re.DOTALL | re.MULTILINE)]
    for obj in vars(mod).values():
        if isinstance(obj, str):
            texts.append(obj)
        elif callable(obj) and str(getattr(obj, "__module__", "")).startswith("rules.") \
                and obj.__module__ != module_name:
            try:
                texts.append(inspect.getsource(obj))
            except (OSError, TypeError):
                pass
            # the SQL constants that helper (or a function nested in it) reads from its own module
            glb = getattr(obj, "__globals__", {})
            codes = [obj.__code__] if hasattr(obj, "__code__") else []
            while codes:
                code = codes.pop()
                texts += [glb[n] for n in code.co_names if isinstance(glb.get(n), str)]
                codes += [c for c in code.co_consts if inspect.iscode(c)]
    return "\n".join(texts)


@pytest.mark.parametrize("rule_id", sorted(discover()))
def test_rule_declares_the_derived_tables_its_sql_reads(rule_id: str) -> None:
    """The runner builds only the derived tables a rule declares (``@rule(derived=...)``): every one its
    SQL names must be declared, and every declared one named (else it is built for nothing)."""
    import re

    from advisor.engine.derived import DERIVED

    spec = discover()[rule_id]
    named = set(re.findall(r"\b(" + "|".join(map(re.escape, DERIVED)) + r")\b", _rule_sql_text(spec.module)))
    declared = {*spec.derived, *(spec.rank_part.derived if spec.rank_part else ())}  # its own, its rank part's
    assert named <= declared, f"{rule_id} reads {sorted(named - declared)} without declaring them"
    assert declared <= named, f"{rule_id} declares {sorted(declared - named)} but never reads them"
