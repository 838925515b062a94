"""The rule runner: rules run a few at a time (beside the stages), yet outcomes and warnings come out in rule order."""

from __future__ import annotations

import time
from typing import Any

import pytest

from advisor.config import Config
from advisor.engine.registry import discover
from advisor.engine.runner import run_rules
from advisor.model import Report
from advisor.testing import context_from_tables


def test_outcomes_and_warnings_keep_rule_order_when_rules_finish_out_of_order() -> None:
    ctx = context_from_tables({"events": [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 10, "dur_ns": 50},
    ]})
    specs = discover()
    first, second = "CPU001", "CPU002"  # consecutive: the pool runs them at the same time

    def slow(rctx):
        time.sleep(0.3)
        rctx.warn("finished last")
        return []

    def fast(rctx):
        rctx.warn("finished first")
        raise RuntimeError("planted failure")

    originals = {first: specs[first].func, second: specs[second].func}
    object.__setattr__(specs[first], "func", slow)  # RuleSpec is frozen
    object.__setattr__(specs[second], "func", fast)
    try:
        _, outcomes = run_rules(ctx, Config(select=[first, second]))
    finally:
        for rid, func in originals.items():
            object.__setattr__(specs[rid], "func", func)
    ran = [(o.rule, o.status) for o in outcomes if o.status != "not_selected"]
    assert ran == [(first, "ran"), (second, "error")]
    messages = [w.message for w in ctx.warnings if w.code in ("rule_undecided", "rule_error")]
    assert messages[0].startswith(f"{first} ") and "finished last" in messages[0]
    assert messages[1].startswith(f"{second} ") and "planted failure" in messages[1]
    assert [o.rule for o in outcomes] == list(specs)


def _report_without_timings(rep: Report) -> dict[str, Any]:
    from advisor.render.json import report_dict

    d = report_dict(rep)
    d.pop("config", None)  # named by analyze() from its options; analyze_context() is given none
    d["profile"].pop("parse_seconds", None)
    d["profile"].pop("analyze_seconds", None)
    for r in d["rules"]:
        r.pop("seconds", None)
    return d


@pytest.mark.slow
def test_stages_beside_the_rules_give_the_report_of_stages_before_them() -> None:
    """analyze() runs the breakdown and critical path in a thread beside the rules; the report
    (findings, warnings and their order, focus, critical path) is the one of running them first."""
    from advisor.analyze import analyze, analyze_context, build_context
    from tests.conftest import SAMPLES, TRACES

    for path, rank, step in ((SAMPLES / "kineto_two_ranks", 1, 552), (TRACES / "cpu_slow_dataloader", 0, 3)):
        for focus in ({}, {"rank": rank, "step": step}):
            beside = analyze(path, **focus)
            ctx = build_context(path, **focus)
            assert ctx._stages is None and ctx.breakdown is not None
            before = analyze_context(ctx, **focus)
            assert _report_without_timings(beside) == _report_without_timings(before), (path, focus)


def test_an_error_in_the_stages_thread_is_raised_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing stage beside the rules surfaces as the analysis's error, as it did inline."""
    import advisor.stages.breakdown as breakdown_stage
    from advisor.analyze import analyze
    from tests.conftest import TRACES

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("planted stage failure")

    monkeypatch.setattr(breakdown_stage, "compute", boom)
    with pytest.raises(RuntimeError, match="planted stage failure"):
        analyze(TRACES / "cpu_healthy")


def test_rank_runs_and_merged_rank_notes() -> None:
    from advisor.engine.merge import merge_rank_notes, rank_runs

    assert rank_runs([3, 0, 1, 2, 7, 9, 10, 9]) == "0–3, 7, 9–10"
    notes = ["rank 0: device unknown", "rank 1: device unknown", "no group names", "rank 3: device unknown",
             "rank 2: 5 µs undecided", "rank 4: 6 µs undecided", "rank 5: once"]
    assert merge_rank_notes(notes) == ["ranks 0–1, 3: device unknown", "no group names", "rank 2: 5 µs undecided",
                                       "rank 4: 6 µs undecided", "rank 5: once"]


def test_the_same_note_from_several_rules_or_ranks_is_one_warning() -> None:
    """A per-rank note repeated on every rank is one warning naming the ranks; a note several rules
    give (kernel time not tied to operators ...) is one warning naming the rules, where the first was."""
    ctx = context_from_tables({"events": [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 10, "dur_ns": 50},
    ]})
    specs = discover()
    ids = ["CPU001", "CPU002", "CPU003"]

    def shared(rctx):
        rctx.warn("kernel time not tied")
        for rank in (0, 1, 2, 5):
            rctx.warn(f"rank {rank}: device unknown")
        return []

    def own(rctx):
        rctx.warn("a note of its own")
        rctx.warn("kernel time not tied")
        return []

    originals = {rid: specs[rid].func for rid in ids}
    for rid, func in zip(ids, (shared, own, shared), strict=True):
        object.__setattr__(specs[rid], "func", func)
    try:
        run_rules(ctx, Config(select=ids))
    finally:
        for rid, func in originals.items():
            object.__setattr__(specs[rid], "func", func)
    names = {rid: f"{rid} ({specs[rid].name})" for rid in ids}
    assert [w.message for w in ctx.warnings if w.code == "rule_undecided"] == [
        f"{names['CPU001']}, {names['CPU002']}, {names['CPU003']}: kernel time not tied",
        f"{names['CPU001']}, {names['CPU003']}: ranks 0–2, 5: device unknown",
        f"{names['CPU002']}: a note of its own",
    ]
