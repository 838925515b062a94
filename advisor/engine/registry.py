"""Rule discovery: import every module under the ``rules`` package, plus entry points."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import threading
from importlib.metadata import entry_points
from typing import Any

from advisor.engine.context import CAPABILITIES
from advisor.engine.rule import DOC_SECTIONS, RULE_ID_RE, RuleSpec, registered
from advisor.schema import TABLES

_DISCOVERED = False
_DISCOVER_LOCK = threading.Lock()  # discovery may run in the import thread while the profile loads
LOAD_ERRORS: list[str] = []  # rule modules that failed to import: reported, the others still run


class RegistryError(Exception):
    """A rule is declared wrongly."""


def validate(spec: RuleSpec[Any]) -> None:
    """Reject rules that break the conventions (see docs/style)."""
    from advisor.causes import causes

    if not RULE_ID_RE.match(spec.id):
        raise RegistryError(f"{spec.module}: rule id {spec.id!r} must match {RULE_ID_RE.pattern}")
    for req in spec.requires:
        if req not in TABLES and req not in CAPABILITIES:
            raise RegistryError(f"{spec.id}: requires unknown table or capability {req!r}")
    from advisor.engine.derived import DERIVED

    for name in spec.derived:
        if name not in DERIVED:
            raise RegistryError(f"{spec.id}: derived table {name!r} is not registered (advisor.engine.derived)")
    for c in spec.all_causes:
        if c not in causes():
            raise RegistryError(f"{spec.id}: cause {c!r} is not in rules/causes.toml")
    if not dataclasses.is_dataclass(spec.thresholds) or not spec.thresholds.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise RegistryError(f"{spec.id}: Thresholds must be a frozen dataclass")
    for f in dataclasses.fields(spec.thresholds):
        if not f.metadata.get("help"):
            raise RegistryError(f"{spec.id}: threshold {f.name} has no help text (use knob())")
    missing = [s for s in DOC_SECTIONS if s not in spec.doc.sections]
    if missing:
        raise RegistryError(f"{spec.id}: docstring lacks sections {missing}")


def discover() -> dict[str, RuleSpec[Any]]:
    """Import all rule modules once and return the registry, sorted by id."""
    with _DISCOVER_LOCK:
        return _discover()


def _discover() -> dict[str, RuleSpec[Any]]:
    global _DISCOVERED
    if not _DISCOVERED:
        import rules

        for mod in pkgutil.walk_packages(rules.__path__, prefix="rules.", onerror=lambda name: LOAD_ERRORS.append(f"{name}: cannot import")):
            if mod.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            try:
                importlib.import_module(mod.name)
            except Exception as exc:  # noqa: BLE001 - a broken rule module must not take the others down
                LOAD_ERRORS.append(f"{mod.name}: {type(exc).__name__}: {exc}")
        for ep in entry_points(group="advisor.rules"):
            try:
                ep.load()
            except Exception as exc:  # noqa: BLE001 - nor a broken plug-in
                LOAD_ERRORS.append(f"entry point {ep.name}: {type(exc).__name__}: {exc}")
        for rid, spec in list(registered().items()):
            try:
                validate(spec)
            except RegistryError as exc:
                LOAD_ERRORS.append(str(exc))
                del registered()[rid]
        _DISCOVERED = True
    return dict(sorted(registered().items()))
