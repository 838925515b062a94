"""COM005's counterfactual: small collectives merged into buckets (rules/comm/com005_small_packet.py)."""

from __future__ import annotations

import pytest

from rules.comm.com005_small_packet import CallCost, bucket_bounds, fit_cost, messages_needed, packets


def test_the_fit_reads_the_fastest_call_of_each_size() -> None:
    """Calls of 1000 B take 110 and 500 µs, of 4000 B 140 and 900 µs (the slow ones waited): the fastest
    per size, 110 µs at 1000 B and 140 µs at 4000 B, give 30 µs per 3000 B (10 ns/B) and 100 µs per call."""
    c = fit_cost([1000, 1000, 4000, 4000], [110_000, 500_000, 140_000, 900_000], 1e6)
    assert c.per_call_ns == pytest.approx(100_000)
    assert c.ns_per_byte == pytest.approx(10.0)
    assert "least-squares" in c.basis


def test_one_size_falls_back_to_the_fastest_call_and_says_so() -> None:
    """Every call 16,640 B (150 and 400 µs): no fit; the per-call cost is the fastest call, 150 µs, and the
    bandwidth the one at which 1 MB costs as long in bytes: 150 µs / 1e6 B = 0.15 ns/B."""
    c = fit_cost([16_640, 16_640], [150_000, 400_000], 1e6)
    assert c.per_call_ns == pytest.approx(150_000)
    assert c.ns_per_byte == pytest.approx(0.15)
    assert "do not vary" in c.basis and "16640 B" in c.basis


def test_a_fit_that_is_not_a_cost_falls_back() -> None:
    """Larger calls faster than smaller ones (a negative time per byte): the fallback, the fastest call."""
    c = fit_cost([1000, 8000], [300_000, 100_000], 1e6)
    assert c.per_call_ns == pytest.approx(100_000)
    assert "no positive" in c.basis


def test_buckets_share_one_call_and_a_lone_collective_keeps_its_time() -> None:
    """Three works of 1000 B, buckets of 2500 B, 100 µs per call and 10 ns/B: the first two merge into one
    bucket of 2000 B taking 100 + 20 = 120 µs, 60 µs each (half its bytes); the third is alone: left out."""
    works = [{"bytes": 1000}, {"bytes": 1000}, {"bytes": 1000}]
    out = bucket_bounds(works, CallCost(100_000, 10.0, "test"), 2500)
    assert out == [(0, pytest.approx(60_000), 0.5), (1, pytest.approx(60_000), 0.5)]


def test_a_size_distribution_is_read_in_whatever_units_it_is_in() -> None:
    # the small_packets twin's TP all-gather: 64 packets of 65,536 B (0.065536 MB) in 202,880 ns (0.20288 ms)
    want = [(65_536.0, 64.0, 202_880.0)]
    got = packets('{"0.065536": [64, 0.20288]}', 4_194_304, 202_880)
    assert [tuple(round(x, 6) for x in p) for p in got] == want
    # the same in bytes and microseconds: scaled to the row's bytes and transit time alike
    got = packets({"65536": [64, 202.88]}, 4_194_304, 202_880)
    assert [tuple(round(x, 6) for x in p) for p in got] == want
    assert packets("not json", 1, 1) == [] and packets("{}", 1, 1) == [] and packets('{"1": [2, 0]}', 2, 5) == []


def test_the_messages_a_collective_needs() -> None:
    # 2 (8 - 1): the 14 packets of each all-reduce over an 8-NPU group in a real torch_npu DDP export
    # (Ascend-msinsight test data, ResNet level 1)
    assert messages_needed("allreduce", 8) == 14
    assert messages_needed("allGather", 2) == 1 and messages_needed("reduce_scatter", 4) == 3
    assert messages_needed("broadcast", 8) == 1 and messages_needed("allreduce", 1) == 1
    assert messages_needed("allreduce", None) is None
