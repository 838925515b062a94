"""Queue-based I/O analysis (Hermes Fig. 5): which data-pipeline stage leaves the device waiting.

## Why it matters
Training data goes through three stages: read from storage, processed on the CPU, fetched to the
device. Each stage hands its output to a queue (data queue → host queue → device queue). When
the device queue runs empty the device waits for data, and the first non-empty queue upstream
tells which stage is too slow. Hermes (§4.2.2, Fig. 5 and its ResNet-50 case) uses exactly these
queue states.

## How it is detected
From the ``queues`` table (queue-depth samples of the data, host and device queues, as Ascend /
MindSpore data-pipeline profiling exports them), per rank: the share of samples in which each
queue is empty (``size <= 0``).

1. Device queue empty in fewer than ``min_device_empty_share`` of its samples: enough data
   reaches the device, no I/O bottleneck (quiet).
2. Otherwise the host queue decides: if it is mostly non-empty (empty share below
   ``queue_empty_share``), batches are ready but not transferred: **fetching**
   (``io.slow_data_fetching``).
3. Otherwise the data queue: mostly non-empty means read data waits for the CPU transforms:
   **processing** (``io.slow_data_processing``); mostly empty as well means storage reads cannot
   keep up: **reading** (``io.slow_data_reading``).

A queue with no samples cannot decide: the rule stops at the last stage it can judge and says
so in a warning. The evidence names the queue state that decided. The saving is the device
queue's empty share times the median step (when steps exist): the share of time the device had
no data, assuming samples are spread evenly over time.

## What to do
Fetching: pinned memory, prefetch to the device, larger transfers. Processing: more workers,
cheaper transforms, no archive formats in the hot path, fix CPU binding. Reading: faster or
local storage, read only the rank's shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import RuleContext, knob, rule
from advisor.model import Finding, Severity


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for IO002."""

    min_device_empty_share: float = knob(0.2, "share of device-queue samples that are empty for the device to count as waiting for data",
                                         "first principles: an empty device queue means an idle device; 20 % of the time is a 'critical' loss by CAUSES.md")
    queue_empty_share: float = knob(0.5, "a host / data queue empty in at least this share of samples counts as empty",
                                    "Hermes Fig. 5: a queue is judged empty or not; the majority of samples decides")
    min_samples: int = knob(3, "samples a queue needs to be judged", "first principles")


SQL = """
SELECT rank, lower(queue) AS queue, count(*) AS n, avg((coalesce(size, 0) <= 0)::INTEGER) AS empty_share,
       avg(size) FILTER (WHERE size >= 0) AS mean_size, max(size) AS max_size
FROM queues GROUP BY ALL
"""

STAGES = {
    "fetching": ("io.slow_data_fetching", "host queue holds batches but the device queue is empty: host-to-device transfer is slowest"),
    "processing": ("io.slow_data_processing", "data queue holds read samples but host and device queues are empty: CPU processing is slowest"),
    "reading": ("io.slow_data_reading", "data, host and device queues are all empty: reading from storage is slowest"),
}


@rule("IO002", "io.queue-analysis", cause="io.slow_data_processing",
      causes=("io.slow_data_reading", "io.slow_data_fetching"), requires=("queues",), thresholds=Thresholds)
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose device queue is often empty, classified by the upstream queues."""
    df = ctx.df(SQL)
    for rank, g in df.groupby("rank"):
        rank = int(rank)
        q = {r.queue: r for r in g.itertuples() if r.n >= ctx.t.min_samples}
        if "device" not in q:
            ctx.warn(f"rank {rank}: no device-queue samples (or fewer than {ctx.t.min_samples}): queue analysis needs the device queue")
            continue
        dev = q["device"]
        if dev.empty_share < ctx.t.min_device_empty_share:
            continue
        host, data = q.get("host"), q.get("data")
        evidence: dict[str, object] = {
            "device_queue_empty_share": round(float(dev.empty_share), 4),
            "min_device_empty_share": ctx.t.min_device_empty_share,
            "host_queue_empty_share": None if host is None else round(float(host.empty_share), 4),
            "data_queue_empty_share": None if data is None else round(float(data.empty_share), 4),
            "queue_empty_share": ctx.t.queue_empty_share,
            "device_queue_samples": int(dev.n),
            "host_queue_samples": 0 if host is None else int(host.n),
            "data_queue_samples": 0 if data is None else int(data.n),
        }
        if host is None:
            ctx.warn(f"rank {rank}: device queue empty in {dev.empty_share:.0%} of samples but no host-queue samples: "
                     "the slow stage (fetching / processing / reading) cannot be told")
            stage, decided = None, "device queue empty; host queue not sampled"
        elif host.empty_share < ctx.t.queue_empty_share:
            stage, decided = "fetching", f"host queue non-empty in {1 - host.empty_share:.0%} of samples"
        elif data is None:
            ctx.warn(f"rank {rank}: host queue empty too but no data-queue samples: processing and reading cannot be told apart")
            stage, decided = None, "device and host queues empty; data queue not sampled"
        elif data.empty_share < ctx.t.queue_empty_share:
            stage, decided = "processing", f"host queue empty in {host.empty_share:.0%}, data queue non-empty in {1 - data.empty_share:.0%} of samples"
        else:
            stage, decided = "reading", f"host queue empty in {host.empty_share:.0%}, data queue empty in {data.empty_share:.0%} of samples"
        evidence["stage"] = stage or "undecided"
        evidence["decided_by"] = decided
        step_us = ctx.step_us(rank)
        saving = float(dev.empty_share) * step_us if step_us else None
        cause, why = STAGES[stage] if stage else ("io.slow_data_processing", "the upstream queues were not sampled")
        yield ctx.finding(
            cause=cause,
            title=f"Rank {rank}: the device queue is empty in {dev.empty_share:.0%} of samples, so the device waits for data; "
            f"{'slowest stage: ' + stage if stage else 'stage undecided'} ({decided})",
            evidence=evidence, saving_us=saving, step_us=step_us,
            severity=None if saving is not None else (Severity.HIGH if dev.empty_share >= 0.5 else Severity.MEDIUM),
            saving_basis="device-queue empty share x median step time (samples assumed even in time)" if saving is not None
            else "no step times: severity from the device-queue empty share",
            detail=why, ranks=[rank], ops=[f"{k} queue" for k in ("device", "host", "data") if k in q],
        )
