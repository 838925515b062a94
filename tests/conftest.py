"""Shared test fixtures: paths to samples, JSON schema validation of every report."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The suite starts many interpreters (pytest-xdist workers, CLI processes, process pools): with
# PYTHONDONTWRITEBYTECODE set, each one compiles the package and rewrites the test modules' asserts
# again. Bytecode caches (git-ignored __pycache__ folders) let them share that work.
if sys.dont_write_bytecode:
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import advisor
from advisor.report_schema import SCHEMA_FILE

ROOT = Path(__file__).resolve().parents[1]
# the sample profiles shipped with the repository (each folder's README.md gives its provenance)
SAMPLES = ROOT / "sample_profiles"
# the report schema as the installed package ships it (``advisor schema`` prints it)
SCHEMA_PATH = Path(advisor.__file__).resolve().parent / SCHEMA_FILE
TRACES = ROOT / "tests" / "data" / "kineto"


def slow(*values: Any, id: str | None = None) -> Any:
    """A parameter set that runs with the marked long tests only: the quick suite keeps a cheaper
    one showing the same mechanism."""
    return pytest.param(*values, marks=pytest.mark.slow, id=id)


_SHARED_REPORTS: dict[Path, Any] = {}


def shared_report(path: Path) -> Any:
    """``analyze(path)`` at default settings, built once per test process and shared by the tests
    that only read it (renderers must not change a report). A load error is raised each time."""
    from advisor.analyze import analyze

    key = Path(path).resolve()
    if key not in _SHARED_REPORTS:
        try:
            _SHARED_REPORTS[key] = analyze(key)
        except Exception as exc:  # noqa: BLE001 - kept, and raised to every test asking
            _SHARED_REPORTS[key] = exc
    got = _SHARED_REPORTS[key]
    if isinstance(got, Exception):
        raise got
    return got


def profile_group(path: Path | str) -> Any:
    """The xdist group of the tests reading one profile: they run on one worker, which analyses it
    once (:func:`shared_report`)."""
    p = Path(path).resolve()
    return pytest.mark.xdist_group("profile:" + (str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)))


def profile_params(paths: list[Path]) -> list[Any]:
    """One parameter a profile directory, id its name, in the profile's xdist group."""
    return [pytest.param(p, id=p.name, marks=profile_group(p)) for p in paths]


def resolve_fixture(spec: str) -> Path:
    """'sample:NAME' -> sample_profiles/NAME, else a path relative to the repo root."""
    kind, sep, name = spec.partition(":")
    if sep and kind == "sample":
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
    over = saving_problems(data)
    if over:
        raise AssertionError("saving above the step of its ranks: " + "; ".join(over[:5]))


def saving_problems(data: dict) -> list[str]:
    """Every saving the report claims above the step of the ranks it names (of every rank for a
    finding that names none; per rank the larger of its median and mean step), from the report's own
    step_times; the total saving above the median step of its rank."""
    import statistics

    cap = {int(s["rank"]): max(float(s["median_us"]), float(s["mean_us"])) for s in data.get("step_times") or []}
    med = {int(s["rank"]): float(s["median_us"]) for s in data.get("step_times") or []}
    out = []
    for f in data.get("findings") or []:
        saving = f.get("estimated_saving_us")
        vals = [cap[r] for r in (f.get("ranks") or cap) if r in cap]
        if saving is not None and vals and saving > statistics.median(vals) * (1 + 1e-6) + 1e-3:
            out.append(f"{f.get('id', f['rule'])}: {saving} µs > {statistics.median(vals)} µs")
    total, rank = data.get("total_saving_us"), (data.get("savings") or {}).get("total_saving_rank")
    if total is not None and rank in med and total > med[rank] * (1 + 1e-6) + 1e-3:
        out.append(f"total_saving_us: {total} µs > rank {rank}'s median step {med[rank]} µs")
    return out


def report_json(report) -> dict:
    """Render a Report to strict JSON, parse it back, validate it, return the dict."""
    from advisor.render.json import render

    text = render(report)
    data = json.loads(text)
    validate_report(data)
    return data


@pytest.fixture(autouse=True)
def _no_terminal_size_from_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose the terminal width themselves: a ``COLUMNS`` / ``LINES`` from the caller's shell
    (or pytest-xdist's workers, which set 80 x 24) would change the width of piped output."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(scope="session")
def samples() -> Path:
    assert SAMPLES.is_dir(), f"{SAMPLES} is missing"
    return SAMPLES


_OVER_SAVINGS: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _check_every_report() -> Iterator[None]:
    """Every Report the suite builds (analyze, analyze_context, the CLI in-process) is checked for
    savings above the step of their ranks (:func:`saving_problems`)."""
    import advisor.pipeline.report as analyze_mod
    from advisor.render.json import report_dict

    orig = analyze_mod.build_report

    def checked(*args: Any, **kwargs: Any) -> Any:
        report = orig(*args, **kwargs)
        _OVER_SAVINGS.extend(f"{report.profile.get('path')}: {p}" for p in saving_problems(report_dict(report)))
        return report

    analyze_mod.build_report = checked
    yield
    analyze_mod.build_report = orig


@pytest.fixture(autouse=True)
def _no_saving_above_step() -> Iterator[None]:
    """Fail the test that built a report claiming a saving above its step."""
    _OVER_SAVINGS.clear()
    yield
    if _OVER_SAVINGS:
        over, _OVER_SAVINGS[:] = list(_OVER_SAVINGS), []
        pytest.fail("saving above the median step of its ranks: " + "; ".join(over[:5]))
