"""The rule runner: rules run two at a time, yet outcomes and warnings come out in rule order."""

from __future__ import annotations

import time

from advisor.config import Config
from advisor.engine.registry import discover
from advisor.engine.runner import run_rules
from advisor.testing import context_from_tables


def test_outcomes_and_warnings_keep_rule_order_when_rules_finish_out_of_order() -> None:
    ctx = context_from_tables({"events": [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 10, "dur_ns": 50},
    ]})
    specs = discover()
    first, second = "CPU001", "CPU002"  # consecutive: the pool runs them at the same time

    def slow(rctx):  # noqa: ANN001, ANN202
        time.sleep(0.3)
        rctx.warn("finished last")
        return []

    def fast(rctx):  # noqa: ANN001, ANN202
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
