"""Shared test fixtures: paths to samples, JSON schema validation of every report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import advisor
from advisor.report_schema import SCHEMA_FILE

ROOT = Path(__file__).resolve().parents[1]
SHARED = (ROOT / ".." / "shared").resolve()
SAMPLES = SHARED / "samples"
# the report schema as the installed package ships it (``advisor schema`` prints it)
SCHEMA_PATH = Path(advisor.__file__).resolve().parent / SCHEMA_FILE
TRACES = ROOT / "tests" / "data" / "kineto"


def resolve_fixture(spec: str) -> Path:
    """'shared:NAME' -> ../shared/samples/NAME, else a path relative to the repo root."""
    if spec.startswith("shared:"):
        return SAMPLES / spec.split(":", 1)[1]
    return ROOT / spec


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
    if not SAMPLES.is_dir():
        pytest.skip("../shared/samples not present")
    return SAMPLES
