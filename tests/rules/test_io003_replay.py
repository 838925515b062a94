"""IO003's counterfactual replayed on the planted H2D copy (tests/rules/fixtures_io._h2d)."""

from __future__ import annotations

import pytest

from advisor.analyze import analyze_context
from advisor.config import Config
from advisor.testing import context_from_tables
from tests.rules import fixtures_io


def test_the_exposed_copy_replayed_away() -> None:
    """Per 10 ms step the 1.9 ms pageable copy (1.1-3.0 ms) holds the stream the 6.5 ms kernel (3.0-9.5 ms)
    runs on, and nothing overlaps it. With the copy taking no time the kernel, next on its stream, starts at
    1.1 ms and ends at 7.6 ms: the step, which ended with that kernel 0.5 ms before its end, is 1.9 ms shorter."""
    rep = analyze_context(context_from_tables(fixtures_io.h2d_pageable()), Config())
    f = next(x for x in rep.findings if x.rule == "IO003")
    assert f.replay is not None and f.replay["estimated"] and f.replay["reproduced"]
    assert f.estimated_saving_us == pytest.approx(1900.0, abs=0.5)
    assert f.evidence["saving_before_replay_us"] == pytest.approx(1900.0, abs=0.5)
