"""AnalyzeOptions: the command line's parameters checked as one value before any profile is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from advisor.config import ConfigError
from advisor.options import AnalyzeOptions, LoadOptions, UsageFailure


def test_build_checks_nothing_of_the_profile(tmp_path: Path) -> None:
    """A profile that does not exist is the loader's business: the options alone are valid."""
    opts = AnalyzeOptions.build(tmp_path / "missing", outs=(tmp_path / "r.html", tmp_path / "r.json"),
                                fmt_given=False, budgets=("step_ms=120",), memory_limit="8GB",
                                sets=("COM001.min_wait_ratio=0.4",), select=("com001",), run=2)
    assert opts.targets == ((tmp_path / "r.html", "html"), (tmp_path / "r.json", "json"))
    assert dict(opts.budgets) == {"step_ms": 120.0}
    assert opts.memory_limit == "8GB"
    assert opts.cfg.select == ["COM001"]
    assert opts.cfg.overrides == {"COM001": {"min_wait_ratio": "0.4"}}
    assert opts.load == LoadOptions(run=2, follow_symlinks=False, workers=None, engine=None, memory_limit="8GB")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.rank = 1  # type: ignore[misc]


@pytest.mark.parametrize(("kwargs", "error", "text"), [
    ({"memory_limit": "lots"}, ConfigError, "--memory-limit 'lots'"),
    ({"budgets": ("speed=1",)}, ConfigError, "unknown budget 'speed'"),
    ({"max_regression": -1.0}, ConfigError, "--max-regression -1.0"),
    ({"select": ("NOPE999",)}, ConfigError, "NOPE999"),
    ({"sets": ("nodot=1",)}, ConfigError, "--set 'nodot=1'"),
    ({"outs": (Path("r.txt"),), "fmt_given": False}, UsageFailure, "no format for the extension .txt"),
    ({"outs": (Path("r.md"),), "fmt": "json"}, UsageFailure, "means --format md"),
])
def test_build_rejects_a_bad_option(tmp_path: Path, kwargs: dict[str, object], error: type[Exception],
                                    text: str) -> None:
    with pytest.raises(error, match=None) as exc:
        AnalyzeOptions.build(tmp_path / "missing", **kwargs)  # type: ignore[arg-type]
    assert text in str(exc.value)


def test_the_analyze_command_declares_what_build_takes() -> None:
    """The click options are the one declaration: each is a keyword of AnalyzeOptions.build, and
    build takes nothing else (but ``fmt_given``, which click's parameter source answers)."""
    import inspect

    from advisor.cli import analyze

    names = {p.name for p in analyze.params}
    keywords = set(inspect.signature(AnalyzeOptions.build).parameters) - {"cls", "fmt_given"}
    assert names == keywords
