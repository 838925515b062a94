"""The shipped contract holds the developers' contract unchanged: the report schema inside the package
(``advisor/report.schema.json``, what ``advisor schema`` prints) and the cause vocabulary
(``rules/causes.toml``) contain everything in ``../shared/contract/`` (they may add to it).

``../shared/`` exists on the developers' machines only; without it these tests skip. ``ADVISOR_CONTRACT_DIR``
names the contract folder when the checkout is elsewhere (a git worktree, say)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from advisor.causes import causes
from advisor.report_schema import load_schema

CONTRACT = Path(os.environ.get("ADVISOR_CONTRACT_DIR") or Path(__file__).resolve().parents[2] / ".." / "shared" / "contract")

needs_contract = pytest.mark.skipif(not CONTRACT.is_dir(),
                                    reason="../shared/contract not present (developers' machines only)")


def _missing(contract: Any, shipped: Any, where: str = "$") -> list[str]:
    """Where ``shipped`` lacks or changes something of ``contract``: objects may gain keys and
    properties, ``required`` lists may gain names; every other value must be equal."""
    if isinstance(contract, dict):
        if not isinstance(shipped, dict):
            return [f"{where}: {type(shipped).__name__} instead of an object"]
        out = []
        for key, value in contract.items():
            if key not in shipped:
                out.append(f"{where}.{key}: missing")
            elif key == "required" and isinstance(value, list):
                out += [f"{where}.required: {name!r} missing" for name in value if name not in shipped[key]]
            else:
                out += _missing(value, shipped[key], f"{where}.{key}")
        return out
    if isinstance(contract, list) and isinstance(shipped, list) and len(contract) == len(shipped):
        return [m for i, (c, s) in enumerate(zip(contract, shipped, strict=True)) for m in _missing(c, s, f"{where}[{i}]")]
    return [] if contract == shipped else [f"{where}: {shipped!r} instead of {contract!r}"]


@needs_contract
def test_shipped_contract_contains_the_developers_contract() -> None:
    """The schema inside the package holds the contract schema, and ``rules/causes.toml`` every cause id of
    CAUSES.md (one test: it is the one that skips where ``../shared`` is absent)."""
    contract = json.loads((CONTRACT / "report.schema.json").read_text())
    assert contract["properties"], "the contract schema has no properties"
    assert _missing(contract, load_schema()) == []
    text = (CONTRACT / "CAUSES.md").read_text()
    ids = re.findall(r"^\| ([a-z]+\.[a-z0-9_]+) \|", text, re.MULTILINE)
    assert len(ids) >= 29
    # the ids are the contract (a finding's ``cause``); causes.toml words some meanings more fully
    assert [cid for cid in ids if cid not in causes()] == []


def test_the_comparison_sees_a_change() -> None:
    contract = {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}, "b": {"enum": [1, 2]}}}
    added = {"type": "object", "required": ["a", "c"], "properties": {"a": {"type": "string"}, "b": {"enum": [1, 2]},
                                                                      "c": {"type": "integer"}}}
    assert _missing(contract, added) == []
    assert _missing(contract, {**added, "required": ["c"]}) == ["$.required: 'a' missing"]
    assert _missing(contract, {**added, "properties": {"a": {"type": "number"}, "b": {"enum": [1, 2]}}}) == [
        "$.properties.a.type: 'number' instead of 'string'"]
    assert _missing(contract, {**added, "properties": {"a": {"type": "string"}, "b": {"enum": [1]}}}) == [
        "$.properties.b.enum: [1] instead of [1, 2]"]
