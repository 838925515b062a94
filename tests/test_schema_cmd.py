"""The report schema ships inside the package: ``advisor schema`` prints it, it is a valid JSON
Schema, and a built wheel carries it (users validate their dashboards against it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import main
from advisor.model import SCHEMA_ID
from advisor.report_schema import SCHEMA_FILE, load_schema
from tests.conftest import ROOT, SCHEMA_PATH


def test_schema_command_prints_the_shipped_schema() -> None:
    import jsonschema

    res = CliRunner().invoke(main, ["schema"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.output)
    assert printed == load_schema() == json.loads(SCHEMA_PATH.read_text())
    jsonschema.validators.validator_for(printed).check_schema(printed)
    # the schema describes the reports this version writes
    assert printed["$id"] == printed["properties"]["schema"]["const"] == SCHEMA_ID
    assert {"schema", "tool", "profile", "breakdown", "critical_path", "findings", "warnings"} <= set(printed["required"])


def test_the_tests_validate_against_the_package_copy() -> None:
    assert SCHEMA_PATH.name == SCHEMA_FILE and SCHEMA_PATH.parent.name == "advisor" and SCHEMA_PATH.is_file()
    assert ".." not in SCHEMA_PATH.parts


@pytest.mark.slow
def test_wheel_carries_the_schema(tmp_path: Path) -> None:
    # built from a copy: setuptools writes build/ and *.egg-info/ beside the sources
    src = tmp_path / "src"
    for name in ("advisor", "rules", "templates"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # pip fetches the build backend (setuptools) as a user's pip install would
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
                         capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0 and "No matching distribution found for setuptools" in res.stderr:
        pytest.skip("cannot build a wheel here: no package index to fetch setuptools from")
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("advisor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert json.loads(zf.read(f"advisor/{SCHEMA_FILE}")) == load_schema()
        assert "rules/causes.toml" in zf.namelist()
