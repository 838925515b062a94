"""The training loop waits for the next batch: data loading takes a large share of each step.

## Why it matters
While the host builds the next batch (``DataLoader.__next__``) the device has nothing to do.
Hermes counts I/O causes in 8.9 % of its 135 production cases; with ``num_workers=0`` the whole
read/decode/augment pipeline runs inside the training step.

## How it is detected
For every (rank, step), the union of the dataloader's ``enumerate(DataLoader)#...__next__``
intervals on the host is compared with the step time. On traces with a device, only the part
of that time when the device was idle counts (``host_only`` time aligned with data loading),
because loading that overlaps device work is already hidden. The rule fires when the median
share over steps reaches ``min_share``. It then classifies the stage (Hermes Fig. 5, queue-based
analysis by the evidence a Kineto trace has). Steps can differ in kind: most find a batch
ready while a few wait long (an epoch's workers starting, a queue run dry). Then the median step
waits nothing, so the rule also fires when the waits over the window, summed, reach ``min_share``
of the steps' total time; the saving is then that sum per step, and the finding names the steps
that wait.

* **processing** (``io.slow_data_processing``): the time is spent inside ``__next__`` on the
  training process itself – the single-process iterator (``_SingleProcessDataLoaderIter``, i.e.
  ``num_workers=0``) or an iterator whose ``__next__`` contains the operators that build the batch;
* **reading** (``io.slow_data_reading``): multi-process iterator waiting on empty worker queues
  with no batch-building work inside ``__next__`` (the workers themselves cannot keep up: on a
  trace alone reading and processing in workers look the same, so the finding says so);
* **fetching** (``io.slow_data_fetching``) is not decided here: host-to-device copies of the batch
  are measured by IO003 (``io.host-to-device-copy``), and queue states by IO002.

Where the trace records call stacks (``events.stack``, or Kineto's Python frames with
``with_stack=True``), the finding names the user's source line that waits: the innermost frame
enclosing the longest wait outside the framework, the standard library and installed packages,
i.e. the training loop's ``for batch in loader`` / ``next(it)``.

The saving is the median per-step dataloader time that the device spent idle (CPU-only: the
whole dataloader time), an upper bound on what hiding data loading can give back; where the what-if
replay of the steps without the time in ``__next__`` reproduces every step, the replayed saving
instead.

## What to do
Raise ``num_workers`` (and ``prefetch_factor``, ``persistent_workers``), move decoding off the
hot path, pin memory and prefetch to the device. See the optimizations listed with the cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.model import Finding
from rules.cpu._common import python_stack_sql, source_of

#: the counterfactual (advisor.stages.replay): the next batch is ready when the loop asks for it, so the
#: host spends no time in ``DataLoader.__next__`` (loading moved to workers that keep up)
COUNTERFACTUAL = (Change("remove", Select(kinds=("dataloader",), device=False)),)
ASSUMPTION = "if the next batch were ready whenever the loop asks for it (no time in DataLoader.__next__)"


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for IO001."""

    min_share: float = knob(0.10, "median share of the step spent waiting for data (device idle) that fires the rule",
                            "Hermes §4.2.2 I/O analysis; msprof-analyze advisor dataloader check uses 10 %")


SQL = """
WITH dl AS (
    SELECT e.rank, e.step, e.name, e.start_ns, e.start_ns + e.dur_ns AS end_ns
    FROM events e WHERE e.kind = 'dataloader' AND NOT e.device AND e.step IS NOT NULL
),
per_step AS (
    SELECT b.rank, b.step, b.step_us, b.dataloader_us, b.host_only_us, b.kernel_us
    FROM breakdown b
),
inner_ops AS (  -- operators run inside __next__ (batch building on the training process)
    SELECT d.rank, d.step, count(*) AS n_ops, sum(o.dur_ns) / 1000.0 AS ops_us
    FROM dl d JOIN events o ON o.rank = d.rank AND NOT o.device AND o.kind = 'host_op'
         AND o.start_ns >= d.start_ns AND o.start_ns + o.dur_ns <= d.end_ns
    GROUP BY ALL
),
names AS (SELECT rank, step, string_agg(DISTINCT name, ' | ') AS names FROM dl GROUP BY ALL)
SELECT p.*, coalesce(i.n_ops, 0) AS n_ops, coalesce(i.ops_us, 0) AS ops_us, n.names
FROM per_step p LEFT JOIN names n USING (rank, step) LEFT JOIN inner_ops i USING (rank, step)
WHERE p.rank IN (SELECT rank FROM names)
ORDER BY rank, step
"""

# the longest wait for data of each rank: the call whose source line the finding names
WAIT_SQL = """
SELECT row_number() OVER (ORDER BY rank) AS id, rank, pid, tid, start_ns, start_ns + dur_ns AS end_ns, stack
FROM (SELECT *, row_number() OVER (PARTITION BY rank ORDER BY dur_ns DESC, start_ns) AS k
      FROM events WHERE kind = 'dataloader' AND NOT device AND step IS NOT NULL)
WHERE k = 1
"""


@rule("IO001", "io.dataloader-wait", cause="io.slow_data_processing",
      causes=("io.slow_data_reading",),
      requires=("events", "steps", "breakdown"), thresholds=Thresholds, derived=("event_names",))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """Fire per rank when data loading takes a large share of the step."""
    if not ctx.scalar("SELECT count(*) FROM event_names WHERE kind = 'dataloader' AND NOT device"):
        return  # no data loading recorded
    df = ctx.df(SQL)
    if df.empty:
        return
    has_device = ctx.has_device
    sources: dict[int, str] | None = None
    for rank, every in df.groupby("rank"):
        # time the device could not use because it waited for data, per step
        waits = (every["dataloader_us"].clip(upper=every["host_only_us"]) if has_device
                 else every["dataloader_us"]).fillna(0.0)
        g = every[every["names"].notna()]
        waiting = waits[every["names"].notna()]
        share = (waiting / g["step_us"]).median()
        # steps that differ in kind (most find a batch ready, some wait long): judged on what the waits
        # cost over the window, the steps' total
        total_us = float(every["step_us"].sum())
        window_share = float(waits.sum()) / total_us if total_us > 0 else 0.0
        by_window = share < ctx.t.min_share
        if by_window and window_share < ctx.t.min_share:
            continue
        if by_window:
            slow = every[waits >= ctx.t.min_share * every["step_us"]]
            g = every[every["step"].isin(slow["step"]) | every["names"].notna()]
        names = "; ".join(sorted(set("; ".join(g["names"].dropna()).split(" | "))))
        single = "_SingleProcessDataLoaderIter" in names
        multi = "_MultiProcessingDataLoaderIter" in names
        ops_share = float((g["ops_us"] / g["dataloader_us"].where(g["dataloader_us"] > 0)).median() or 0.0)
        if single or not multi:
            cause, stage, why = ("io.slow_data_processing", "processing",
                                 "the batch is built inside the training process (num_workers=0)" if single
                                 else "data loading runs inside the training step")
        else:
            cause, stage, why = ("io.slow_data_reading", "reading or processing in workers",
                                 ("worker processes cannot keep the queue filled (a trace alone cannot tell reading from "
                                  "processing inside workers)"))
        if by_window:
            saving = float(waits.sum()) / len(every)
            step_us = float(every["step_us"].mean())
            slow_steps = [int(x) for x in slow["step"]]
            head = (f"Rank {rank} waits for data {float(waits.sum()) / 1e6:.1f} s of the {total_us / 1e6:.1f} s its "
                    f"{len(every)} steps take ({window_share:.0%}), in {len(slow_steps)} of them (the others find a "
                    "batch ready)")
        else:
            saving = float(waiting.median())
            step_us = float(g["step_us"].median())
            slow_steps = [int(x) for x in g["step"]]
            head = f"Rank {rank} waits {share:.0%} of each step for data ({saving / 1000:.1f} ms of {step_us / 1000:.1f} ms)"
        if sources is None:
            sources = _sources(ctx)
        source = sources.get(int(rank))
        yield ctx.finding(
            cause=cause,
            title=f"{head}; {why}" + (f"; the loop waits at {source}" if source else ""),
            evidence={
                **({"source": source} if source else {}),
                "dataloader_share": round(float(share), 4),
                "window_share": round(window_share, 4),
                "judged_on": "window" if by_window else "median step",
                "waiting_us_total": round(float(waits.sum()), 1),
                "min_share": ctx.t.min_share,
                "dataloader_us_median": round(float(g["dataloader_us"].median()), 1),
                "device_idle_while_loading_us_median": round(saving, 1) if has_device else None,
                "step_us_median": round(step_us, 1),
                "iterator": "single-process (num_workers=0)" if single else ("multi-process" if multi else "unknown"),
                "ops_inside_next_share": round(ops_share, 4),
                "stage": stage,
                "steps": len(g),
            },
            saving_us=saving,
            step_us=step_us,
            saving_basis=(("data-loading time during which the device was idle" if has_device
                           else "data-loading time (CPU-only trace)")
                          + " summed over the window, per step (most steps wait little, some long)") if by_window
            else ("median per-step data-loading time during which the device was idle" if has_device
                  else "median per-step data-loading time (CPU-only trace)"),
            ranks=[int(rank)],
            steps=slow_steps,
            ops=[n for n in names.split("; ") if n][:5],
            replay=ctx.what_if(int(rank), COUNTERFACTUAL, ASSUMPTION),
        )


def _sources(ctx: RuleContext[Thresholds]) -> dict[int, str]:
    """Per rank, the user's source line that waits for the next batch (the ``for batch in loader`` / ``next(it)``
    frame): from the call stack of the longest wait when the export records one, else from the Python frames
    enclosing it (Kineto ``with_stack``), framework and library frames skipped."""
    waits = ctx.df(WAIT_SQL)
    if waits.empty:
        return {}
    frames = {r["id"]: r["frames"] for r in ctx.query_frames(
        python_stack_sql("_io001_waits"),
        {"_io001_waits": pd.DataFrame(waits[["id", "rank", "pid", "tid", "start_ns", "end_ns"]])})}
    out: dict[int, str] = {}
    for r in waits.itertuples():
        found = source_of(r.stack if isinstance(r.stack, str) else None, frames.get(r.id))
        if found:
            out[int(r.rank)] = found
    return out
