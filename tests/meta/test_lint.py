"""The tree stays lint- and type-clean (docs/style.md): ruff on everything, ``mypy --strict`` on
``advisor/`` and ``rules/``. Both come with the ``test`` extra (pinned: a new release may add
checks); without them installed the tests are skipped."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (pip install -e '.[test]')")
def test_ruff_passes() -> None:
    res = _run("ruff", "check", "--no-cache", "advisor", "rules", "tests", "benchmarks", "scripts")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy not installed (pip install -e '.[test]')")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="type-checked on 3.11+ only: pandas-stubs, pandas 3 and numpy 2.3+ need it")
def test_mypy_strict_passes() -> None:
    res = _run("mypy", "--strict", "--cache-dir=/dev/null", "advisor", "rules")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
