"""Shared test fixtures: paths to samples, JSON schema validation of every report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = (ROOT / ".." / "shared").resolve()
SAMPLES = SHARED / "samples"
SCHEMA_PATH = SHARED / "contract" / "report.schema.json"
TRACES = ROOT / "tests" / "data" / "kineto"


def resolve_fixture(spec: str) -> Path:
    """'shared:NAME' -> ../shared/samples/NAME, else a path relative to the repo root."""
    if spec.startswith("shared:"):
        return SAMPLES / spec.split(":", 1)[1]
    return ROOT / spec


_VALIDATOR = None


def validate_report(data: dict) -> None:
    """Validate a JSON report against ../shared/contract/report.schema.json (raises on error)."""
    global _VALIDATOR
    import jsonschema

    if _VALIDATOR is None:
        schema = json.loads(SCHEMA_PATH.read_text())
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
