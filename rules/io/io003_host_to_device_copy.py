"""Host-to-device copies of the batch hold up the device (slow data fetching), e.g. from pageable memory.

## Why it matters
After the dataloader hands over a batch it still has to reach the device. A copy from pageable
(not pinned) host memory is staged through a driver buffer and blocks the host, and a copy on
the compute stream without prefetching runs while no kernel can. Hermes' queue analysis calls
this stage *data fetching* (a full host queue with an empty device queue); on a Kineto trace it
shows directly as long ``Memcpy HtoD`` activity that no kernel overlaps.

## How it is detected
Device memcpy events whose name says host-to-device (``Memcpy HtoD``, ``HostToDevice``, ``H2D``),
with the source memory from the name (``Memcpy HtoD (Pageable -> Device)`` vs
``(Pinned -> Device)``). For each copy, the part during which no compute kernel ran is the time
the device spent only moving input; per step those parts are summed, and copies starting within
``after_dataloader_us`` after the end of a dataloader ``__next__`` are counted separately (the
batch's own copies). It fires when the median per-step un-overlapped H2D time is at least
``min_share`` of the step. The saving is that median time: with pinned memory, non-blocking
copies and a prefetcher on a side stream, the copy overlaps compute. Where the what-if replay of the
steps without the copies' time and without the host's waits for them reproduces every step, the
saving is the replayed one instead (the trace gives no pinned-memory bandwidth to replay the copies
at, so a copy that could not be fully hidden counts as hidden: an upper bound).

## What to do
``DataLoader(pin_memory=True)`` and ``.to(device, non_blocking=True)``; prefetch the next batch on
a side stream (a data prefetcher); batch many small tensors into one transfer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from advisor.engine.rule import Change, RuleContext, Select, knob, rule
from advisor.kinds import EdgeKind
from advisor.model import Finding
from rules.cpu._common import fmt_ms, step_table


@dataclass(frozen=True)
class Thresholds:
    """Thresholds for IO003."""

    min_share: float = knob(0.03, "median per-step H2D copy time not overlapped by kernels, as a share of the step, that fires",
                            "CAUSES.md: 3 % of the step is the 'medium' severity cut")
    after_dataloader_us: float = knob(50_000.0, "copies starting this soon after a dataloader __next__ ends count as the batch's copies",
                                      "first principles: the batch is moved to the device right after it is fetched")


H2D_RE = r"(?i)htod|host ?to ?device|h2d"

#: the counterfactual (advisor.stages.replay): the batch's copies run ahead on a side stream from pinned
#: memory, so they hold neither the compute stream nor the host: the copies take no time where they were,
#: and no host call waits for one of them
COPIES = Select(device=True, kinds=("memcpy",), name_re=H2D_RE)
COUNTERFACTUAL = (Change("remove", COPIES), Change("drop_edges", COPIES, edge=EdgeKind.SYNC_WAIT))
ASSUMPTION = ("if the host-to-device copies overlapped compute and the host did not wait for them (pinned memory, "
              "non_blocking copies prefetched on a side stream)")

SQL = """
WITH copies AS MATERIALIZED (  -- host-to-device copies, their names tested once each
    SELECT rank, step, name, start_ns, dur_ns, stream, bytes, corr FROM events
    WHERE device AND kind = 'memcpy'
      AND name IN (SELECT name FROM event_names WHERE device AND kind = 'memcpy' AND regexp_matches(name, $h2d_re))
),
c AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY rank, start_ns, dur_ns, stream, name) AS id, rank, step, name, start_ns AS s, start_ns + dur_ns AS e, dur_ns, bytes,
           regexp_matches(name, '(?i)pageable') AS pageable, regexp_matches(name, '(?i)pinned') AS pinned
    FROM copies WHERE step IS NOT NULL
),
busy_at AS (  -- kernel busy time up to each copy's start and end: two ASOF lookups, no range join
    SELECT c.id, p.which, coalesce(k.before, 0) + CASE WHEN k.s IS NULL THEN 0 ELSE greatest(0, least(p.t, k.e) - k.s) END AS b
    FROM c JOIN (SELECT id, 's' AS which, s AS t FROM c UNION ALL SELECT id, 'e', e FROM c) p USING (id)
    ASOF LEFT JOIN kernel_busy k ON k.rank = c.rank AND p.t >= k.s
),
ov AS (
    SELECT id, max(b) FILTER (WHERE which = 'e') - max(b) FILTER (WHERE which = 's') AS overlap_ns FROM busy_at GROUP BY id
),
launch AS (  -- host launch of each copy (correlation id), to place it after the dataloader
    SELECT d.start_ns AS dev_start, h.start_ns AS host_start, d.rank
    FROM copies d JOIN events h ON h.rank = d.rank AND NOT h.device AND h.corr = d.corr
    WHERE d.corr IS NOT NULL
),
dl AS (SELECT rank, start_ns + dur_ns AS dl_end FROM events WHERE kind = 'dataloader' AND NOT device),
after_dl AS (
    SELECT DISTINCT c.id FROM c
    JOIN launch l ON l.rank = c.rank AND l.dev_start = c.s
    JOIN dl ON dl.rank = c.rank AND l.host_start >= dl.dl_end AND l.host_start < dl.dl_end + $after_dataloader_us * 1000
)
SELECT c.*, c.dur_ns - ov.overlap_ns AS exposed_ns, c.id IN (SELECT id FROM after_dl) AS after_dataloader
FROM c JOIN ov USING (id)
"""


@rule("IO003", "io.host-to-device-copy", cause="io.slow_data_fetching",
      requires=("events", "steps", "breakdown", "device"), thresholds=Thresholds,
      derived=("event_names", "kernel_busy"))
def check(ctx: RuleContext[Thresholds]) -> Iterator[Finding]:
    """One finding per rank whose H2D copies keep the device from computing."""
    df = ctx.df(SQL, {"h2d_re": H2D_RE})
    if df.empty:
        return
    bd = step_table(ctx)
    # the share for every rank at once; the rest only for ranks that reach the threshold
    per_step = bd[["rank", "step", "step_us"]].merge(
        df.groupby(["rank", "step"], as_index=False)["exposed_ns"].sum(), on=["rank", "step"], how="left")
    shares = (per_step["exposed_ns"].fillna(0) / 1000.0 / per_step["step_us"]).groupby(per_step["rank"]).median()
    quiet = set(shares.index[shares < ctx.t.min_share])
    for rank, g in df.groupby("rank"):
        rank = int(rank)
        if rank in quiet:
            continue
        steps_r = bd[bd["rank"] == rank].set_index("step")
        per = g.groupby("step").agg(exposed=("exposed_ns", "sum"), total=("dur_ns", "sum"), n=("id", "size"))
        per = per.reindex(steps_r.index, fill_value=0)
        exposed = per["exposed"] / 1000.0
        share = float((exposed / steps_r["step_us"]).median())
        if share < ctx.t.min_share:
            continue
        saving = float(exposed.median())
        step_us = float(steps_r["step_us"].median())
        pageable = g[g["pageable"]]
        b = g["bytes"].dropna()
        gbps = float(b.sum()) / float(g.loc[b.index, "dur_ns"].sum()) if len(b) and g.loc[b.index, "dur_ns"].sum() else None
        src = "pageable" if len(pageable) and pageable["dur_ns"].sum() >= g["dur_ns"].sum() / 2 else (
            "pinned" if g["pinned"].any() else "unknown")
        yield ctx.finding(
            title=f"Rank {rank}: host-to-device copies keep the device from computing for {fmt_ms(saving)} per step "
            f"({share:.0%} of {fmt_ms(step_us)}); {len(g) / max(len(steps_r), 1):.0f} copies per step, mostly from {src} memory",
            evidence={
                "h2d_exposed_share": round(share, 4), "min_share": ctx.t.min_share,
                "h2d_exposed_us_median": round(saving, 1),
                "h2d_us_per_step": round(float(per["total"].median()) / 1000.0, 1),
                "copies_per_step": round(len(g) / max(len(steps_r), 1), 2),
                "pageable_share": round(float(pageable["dur_ns"].sum()) / max(float(g["dur_ns"].sum()), 1.0), 4),
                "after_dataloader_copies": int(g["after_dataloader"].sum()),
                "bandwidth_gbps": None if gbps is None else round(gbps, 3),
                "step_us_median": round(step_us, 1), "steps": len(steps_r),
            },
            saving_us=saving, step_us=step_us,
            saving_basis="median per-step host-to-device copy time during which no kernel ran",
            replay=ctx.what_if(rank, COUNTERFACTUAL, ASSUMPTION, steps=[int(s) for s in steps_r.index]),
            ranks=[rank], steps=[int(s) for s in per.index[per["n"] > 0]], ops=sorted(set(g["name"]))[:5],
        )
