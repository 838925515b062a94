"""Canonical-row fixtures for the I/O rules IO002 (queue analysis) and IO003 (host-to-device copies).

Facts are planted by construction and asserted in ``tests/rules/cases/IO002.toml`` / ``IO003.toml``.
"""

from __future__ import annotations

from typing import Any

from tests.rules.fixtures_cpu import BASE, DEV, HOST, MS, STEP_NS, US, _ev, _steps

Rows = dict[str, list[dict[str, Any]]]


def _queue(name: str, sizes: list[int]) -> list[dict[str, Any]]:
    return [{"rank": 0, "queue": name, "ts_ns": BASE + i * MS, "size": s, "dur_ns": 100 * US} for i, s in enumerate(sizes)]


def _q(device_empty: int, host_empty: int | None, data_empty: int | None, n: int = 20) -> Rows:
    """n samples per queue; the first ``*_empty`` samples of a queue have size 0, the rest 4.

    Two 10 ms steps (CPU-only events) give the median step time (10 ms).
    """
    rows = _queue("device", [0] * device_empty + [4] * (n - device_empty))
    if host_empty is not None:
        rows += _queue("host", [0] * host_empty + [4] * (n - host_empty))
    if data_empty is not None:
        rows += _queue("data", [0] * data_empty + [4] * (n - data_empty))
    return {"events": _steps(2), "queues": rows}


def queues_processing() -> Rows:
    """Device queue empty 15/20 (0.75), host empty 18/20 (0.9), data empty 0/20: processing is slowest."""
    return _q(15, 18, 0)


def queues_fetching() -> Rows:
    """Device queue empty 12/20 (0.6), host empty 2/20 (0.1): fetching is slowest."""
    return _q(12, 2, 20)


def queues_reading() -> Rows:
    """Device 20/20, host 20/20, data 19/20 empty: reading is slowest."""
    return _q(20, 20, 19)


def queues_healthy() -> Rows:
    """Device queue empty in 1 of 20 samples (0.05): no I/O bottleneck."""
    return _q(1, 20, 20)


def queues_device_only() -> Rows:
    """Only the device queue was sampled, empty 10/20 (0.5): stage undecided."""
    return _q(10, None, None)


def _h2d(pinned_overlapped: bool) -> Rows:
    """3 steps of 10 ms. Per step: dataloader 0-1 ms; cudaMemcpyAsync 1.0-3.0 ms launching a 1.9 ms H2D copy
    (1.1-3.0 ms, 19,000,000 bytes = 10 GB/s); kernels 3.0-9.5 ms.

    Pageable variant: nothing overlaps the copy, 1.9 ms exposed per step (19 %).
    Pinned variant: a side-stream kernel runs 0.5-9.5 ms, so the copy is fully hidden (0 exposed).
    """
    ev = _steps(3)
    name = "Memcpy HtoD (Pinned -> Device)" if pinned_overlapped else "Memcpy HtoD (Pageable -> Device)"
    for s in range(3):
        t = BASE + s * STEP_NS
        corr = 1000 + s
        ev += [
            _ev("dataloader", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 1 * MS),
            _ev("runtime", "cudaMemcpyAsync", t + 1 * MS, 2 * MS, corr=corr),
            _ev("memcpy", name, t + 1100 * US, 1900 * US, DEV, corr=corr, bytes=19_000_000),
            _ev("kernel", "fwd_bwd_kernel", t + 3 * MS, 6500 * US, DEV),
        ]
        if pinned_overlapped:
            ev.append(_ev("kernel", "side_stream_kernel", t + 500 * US, 9 * MS, {**DEV, "tid": "8", "stream": 8}))
    return {"events": ev}


def h2d_pageable() -> Rows:
    """See :func:`_h2d`: 1.9 ms of exposed pageable H2D copy per 10 ms step."""
    return _h2d(False)


def h2d_pinned_overlapped() -> Rows:
    """See :func:`_h2d`: the pinned copy is hidden under a side-stream kernel."""
    return _h2d(True)


__all__ = ["HOST"]


def dataloader_waits_in_some_steps() -> Rows:
    """Twenty 10 ms steps (CPU-only, 1-20), each fetching its batch from a multi-process DataLoader
    at its start and running a 1 ms operator at 8.5 ms. Steps 1, 6, 11 and 16 wait 8 ms for the
    batch (the queue ran dry), the 16 others 20 µs (a batch was ready).

    Over the window: 4 x 8 ms + 16 x 0.02 ms = 32.32 ms of 200 ms waiting (16.16 %), 1.616 ms per
    step; the median step waits 20 µs (0.2 %).
    """
    ev = _steps(20)
    for i in range(20):
        t0 = BASE + i * STEP_NS
        wait = 8 * MS if i % 5 == 0 else 20 * US
        ev.append(_ev("dataloader", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t0 + 10 * US, wait))
        ev.append(_ev("host_op", "aten::linear", t0 + 8500 * US, MS))
    return {"events": ev}
