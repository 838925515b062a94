"""The JSON report's schema (``advisor.report/v1``), shipped inside the package.

``advisor schema`` prints it; dashboards and tests validate ``--format json`` reports against it.
Fields may be added to the report and to this schema; none it lists is ever renamed or dropped.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, cast

SCHEMA_FILE = "report.schema.json"


def schema_text() -> str:
    """The schema as shipped (JSON text)."""
    return resources.files("advisor").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


def load_schema() -> dict[str, Any]:
    """The schema, parsed."""
    return cast(dict[str, Any], json.loads(schema_text()))
