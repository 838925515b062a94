"""The shared derived tables (advisor/engine/derived.py): contents worked out by hand, built once, when asked for."""

from __future__ import annotations

from advisor.engine import derived
from advisor.testing import context_from_tables


def _ctx():
    k = {"kind": "kernel", "device": True, "name": "k"}
    return context_from_tables({"events": [
        {"rank": 0, "start_ns": 0, "dur_ns": 10, **k},
        {"rank": 0, "start_ns": 5, "dur_ns": 15, **k},  # overlaps: one period [0, 20)
        {"rank": 0, "start_ns": 20, "dur_ns": 5, "kind": "memcpy", "device": True, "name": "m"},  # touches: [0, 25)
        {"rank": 0, "start_ns": 40, "dur_ns": 10, **k},
        {"rank": 0, "start_ns": 60, "dur_ns": 0, **k},  # no duration: no period
        {"rank": 0, "start_ns": 0, "dur_ns": 100, "kind": "host_op", "device": False, "name": "aten::mm"},
        {"rank": 1, "start_ns": 100, "dur_ns": 10, **k},
        {"rank": 1, "start_ns": 130, "dur_ns": 10, "kind": "comm", "device": True, "name": "nccl"},
    ]}, run_stages=False)


def test_busy_periods_merge_per_rank_and_count_earlier_busy_time() -> None:
    ctx = _ctx()
    ctx.ensure_derived(("device_busy", "kernel_busy"))
    got = ctx.query("SELECT rank, s, e, before FROM device_busy ORDER BY rank, s")
    assert [tuple(r.values()) for r in got] == [(0, 0, 25, 0), (0, 40, 50, 25), (1, 100, 110, 0), (1, 130, 140, 10)]
    got = ctx.query("SELECT rank, s, e, before FROM kernel_busy ORDER BY rank, s")
    assert [tuple(r.values()) for r in got] == [(0, 0, 20, 0), (0, 40, 50, 20), (1, 100, 110, 0)]


def test_event_names_counts_each_kind_device_and_name() -> None:
    ctx = _ctx()
    ctx.ensure_derived(("event_names",))
    got = ctx.query("SELECT kind, device, name, n FROM event_names ORDER BY kind::VARCHAR, name")
    assert [tuple(r.values()) for r in got] == [
        ("comm", True, "nccl", 1), ("host_op", False, "aten::mm", 1), ("kernel", True, "k", 5), ("memcpy", True, "m", 1)]


def test_built_once_and_only_when_asked_for(monkeypatch) -> None:
    ctx = _ctx()
    built: list[str] = []
    for name, d in list(derived.DERIVED.items()):
        monkeypatch.setitem(derived.DERIVED, name, derived.Derived(
            d.doc, lambda con, n, b=d.build: (built.append(n), b(con, n)), d.needs))
    ctx.query("SELECT count(*) FROM events")
    assert built == []
    ctx.ensure_derived(("device_busy",))
    ctx.ensure_derived(("device_busy", "event_names"))
    assert built == ["device_busy", "event_names"]
    assert ctx.scalar("SELECT count(*) FROM device_busy b JOIN event_names n ON true") == 4 * 4  # periods x names


def test_a_table_is_built_after_the_tables_its_builder_reads(monkeypatch) -> None:
    from rules.compute._common import KERNEL_OPS

    ctx = _ctx()
    built: list[str] = []
    for name, d in list(derived.DERIVED.items()):
        monkeypatch.setitem(derived.DERIVED, name, derived.Derived(
            d.doc, lambda con, n, b=d.build: (built.append(n), b(con, n)), d.needs))
    ctx.ensure_derived((KERNEL_OPS,))
    assert built == ["host_op_top", KERNEL_OPS]


def test_an_unknown_derived_table_is_an_error() -> None:
    import pytest

    with pytest.raises(KeyError, match="no_such_table"):
        _ctx().ensure_derived(("no_such_table",))


def test_the_runner_builds_what_a_rule_declares() -> None:
    from advisor.config import Config
    from advisor.engine.registry import discover
    from advisor.engine.runner import run_rules

    spec = discover()["CPU002"]
    assert spec.derived == ("device_busy",)
    ctx = context_from_tables({"events": [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "host_op", "name": "aten::mm", "start_ns": 10, "dur_ns": 50},
        {"rank": 0, "kind": "kernel", "device": True, "name": "k", "start_ns": 20, "dur_ns": 10},
    ]})
    run_rules(ctx, Config(select=["CPU002"]))
    assert "device_busy" in ctx._derived
    assert "kernel_busy" not in ctx._derived


def test_host_op_top_keeps_operators_no_earlier_one_covers() -> None:
    op = {"kind": "host_op", "device": False, "rank": 0, "step": 1}
    ctx = context_from_tables({"events": [
        {**op, "tid": "1", "name": "aten::linear", "start_ns": 0, "dur_ns": 100},
        {**op, "tid": "1", "name": "aten::addmm", "start_ns": 10, "dur_ns": 80},  # inside linear
        {**op, "tid": "1", "name": "aten::relu", "start_ns": 100, "dur_ns": 5},  # starts where linear ends
        {**op, "tid": "2", "name": "aten::add", "start_ns": 50, "dur_ns": 10},  # another thread
        {**op, "tid": "1", "name": "aten::cat", "start_ns": 102, "dur_ns": 1},  # inside relu
        {"kind": "runtime", "device": False, "rank": 0, "tid": "1", "name": "cudaLaunchKernel", "start_ns": 0, "dur_ns": 500},
    ]}, run_stages=False)
    ctx.ensure_derived(("host_op_top",))
    got = ctx.query("SELECT tid, name FROM host_op_top ORDER BY tid, start_ns")
    assert [(r["tid"], r["name"]) for r in got] == [("1", "aten::linear"), ("1", "aten::relu"), ("2", "aten::add")]



def test_a_rule_reading_an_undeclared_derived_table_is_a_rule_error_saying_so() -> None:
    from advisor.config import Config
    from advisor.engine.registry import discover
    from advisor.engine.runner import run_rules

    ctx = context_from_tables({"events": [
        {"rank": 0, "kind": "step", "name": "ProfilerStep#1", "start_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "kernel", "device": True, "name": "k", "start_ns": 20, "dur_ns": 10},
    ]})
    spec = discover()["CPU002"]
    original = spec.func

    def reads_undeclared(rctx):
        return rctx.query("SELECT count(*) AS n FROM kernel_busy")

    object.__setattr__(spec, "func", reads_undeclared)  # RuleSpec is frozen
    try:
        _, outcomes = run_rules(ctx, Config(select=["CPU002"]))
    finally:
        object.__setattr__(spec, "func", original)
    assert [o.status for o in outcomes if o.rule == "CPU002"] == ["error"]
    msg = next(w.message for w in ctx.warnings if w.code == "rule_error")
    assert "derived=('kernel_busy', ...)" in msg
