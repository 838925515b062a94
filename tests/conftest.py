"""Shared test fixtures: paths to samples, JSON schema validation of every report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import advisor
from advisor.report_schema import SCHEMA_FILE

ROOT = Path(__file__).resolve().parents[1]
# the sample profiles shipped with the repository (each folder's README.md gives its provenance)
SAMPLES = ROOT / "sample_profiles"
# the report schema as the installed package ships it (``advisor schema`` prints it)
SCHEMA_PATH = Path(advisor.__file__).resolve().parent / SCHEMA_FILE
TRACES = ROOT / "tests" / "data" / "kineto"


def resolve_fixture(spec: str) -> Path:
    """'sample:NAME' -> sample_profiles/NAME, else a path relative to the repo root.

    'shared:NAME' is the older spelling of 'sample:NAME' (the samples were once read from outside the repository).
    """
    kind, sep, name = spec.partition(":")
    if sep and kind in ("sample", "shared"):
        return SAMPLES / name
    return ROOT / spec


def sample_dirs(pattern: str = "*") -> list[Path]:
    """The folders of sample_profiles/ matching ``pattern``, less the copies of traces that tests take from
    tests/data/kineto (their README names that folder as the provenance), so no profile is tested twice."""
    out = []
    for p in sorted(SAMPLES.glob(pattern)):
        readme = p / "README.md"
        if p.is_dir() and not (readme.is_file() and "Provenance: tests/data/kineto/" in readme.read_text()):
            out.append(p)
    return out


_VALIDATOR = None


def validate_report(data: dict) -> None:
    """Validate a JSON report against the report schema shipped in the package (raises on error)."""
    global _VALIDATOR
    import jsonschema

    from advisor.report_schema import load_schema

    if _VALIDATOR is None:
        schema = load_schema()
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        _VALIDATOR = cls(schema)
    errors = sorted(_VALIDATOR.iter_errors(data), key=lambda e: list(e.path))
    if errors:
        msgs = "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
        raise AssertionError(f"report does not match report.schema.json: {msgs}")


def report_json(report) -> dict:
    """Render a Report to strict JSON, parse it back, validate it, return the dict."""
    from advisor.render.json import render

    text = render(report)
    data = json.loads(text)
    validate_report(data)
    return data


@pytest.fixture(scope="session")
def samples() -> Path:
    assert SAMPLES.is_dir(), f"{SAMPLES} is missing"
    return SAMPLES
