"""The reduce: the shards' results -> summary tables -> cluster rules -> merged findings.

:func:`gather` appends the shards' summaries to a fresh DuckDB, which never holds an event, and
runs the checks that compare ranks (runs, windows): the :class:`Summary`. The orchestrator reads
``--metrics`` files over it; :func:`reduce` then picks the focus, runs the rules of scope
``cluster`` and merges every shard's findings into one account: the :class:`Reduced`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.config import Config
from advisor.engine.combined import JOINED_KEY
from advisor.engine.combined import TABLE_KEY as COMBINED_TABLE
from advisor.engine.context import AnalysisContext
from advisor.engine.platform import Parts, reduce_platform
from advisor.engine.runner import account, choose, combine, execute
from advisor.ingest import check_run_spans, check_runs, connect, nothing_usable
from advisor.ingest.arrow import adopt, from_ipc
from advisor.ingest.base import Unit
from advisor.model import Finding, RuleOutcome, Warning_
from advisor.pipeline.map import BIG_TABLES, CARRIED_DERIVED, ShardResult
from advisor.schema import OWN_TABLES_SQL
from advisor.stages.sequence import CPU_ONLY, check_focus, choose_focus, empty_path


@dataclass
class Summary:
    """The shards' summaries in one DuckDB (``con``), and what the reduce needs of their results."""

    con: Any
    dones: list[dict[str, Any]] = field(default_factory=list)
    frames: list[Any] = field(default_factory=list)  # each shard's breakdown (pandas)
    candidates: list[ShardResult] = field(default_factory=list)  # each shard's focus and its critical path
    stage_warnings: list[Warning_] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)
    platforms: list[Parts] = field(default_factory=list)
    parse_seconds: float = 0.0
    stages_seconds: float = 0.0
    combined: dict[int, dict[str, Any]] = field(default_factory=dict)  # per rank: the changes replayed together
    joined: list[dict[str, Any]] = field(default_factory=list)  # every rank's changes replayed at once (a shard's)


@dataclass
class Reduced:
    """The reduce's result: a context over the summaries, and the findings and outcomes of every rule."""

    ctx: AnalysisContext
    findings: list[Finding]
    outcomes: list[RuleOutcome]


def gather(root: str, units: list[Unit], results: Iterator[ShardResult], warnings: list[Warning_],
           warn: Callable[..., None], *, memory_limit: str | None) -> Summary:
    """The shards' results appended to a fresh DuckDB, and the checks across ranks; their warnings
    go to ``warnings`` (``warn`` adds one). Raises :class:`advisor.ingest.SeveralRuns` when the ranks'
    traces belong to several runs, the loader's :class:`InputError` when no shard could be read."""
    first = next(results, None)
    if first is not None and first.db is not None:  # the only shard, mapped here: its DuckDB holds the summary
        con, first.db = first.db, None
    else:
        con = connect(memory_limit=memory_limit)
        con.create_tables()
        for name in BIG_TABLES:  # a cluster rule that reads one fails loudly (a rule error), not on no rows
            con.execute(f"DROP TABLE {name}")
    cur = con.cursor()
    out = Summary(con)
    next_id = 0
    spans: list[tuple[str, Any, Any]] = []
    worlds: dict[str, Any] = {}
    for res in itertools.chain([] if first is None else [first], results):
        warnings.extend(res.load_warnings)
        if not res.ranks:
            continue
        for name, data in res.tables.items():
            adopt(cur, name, data, next_id)
        next_id += res.file_ids
        out.stage_warnings.extend(res.stage_warnings)
        out.dones.append(res.done)
        out.frames.append(res.frame if res.frame is not None else from_ipc(res.breakdown).to_pandas())
        if res.critical_path is not None:
            out.candidates.append(ShardResult(ranks=res.ranks, load_warnings=[], focus=res.focus,
                                              critical_path=res.critical_path, cp_warnings=res.cp_warnings))
        for k, v in res.counts.items():
            out.counts[k] = out.counts.get(k, 0) + v
        spans.extend(res.spans)
        worlds.update(res.worlds)
        out.sources.update(res.sources)
        out.platforms.append(res.platform)
        out.parse_seconds += res.parse_seconds
        out.stages_seconds += res.stages_seconds
        out.combined.update(res.combined)
        if res.joined is not None:
            out.joined.append(res.joined)
    cur.close()
    if not out.dones:
        raise nothing_usable(Path(root), warnings, "no trace could be read")
    if len(units) >= 2:
        check_run_spans(units, spans, worlds, warn)
    check_runs(con, warn)
    return out


def reduce(root: str, summary: Summary, cfg: Config, warnings: list[Warning_], *, rank: int | None,
           step: int | None, debug: bool) -> Reduced:
    """The context over the summary, the focus (``rank`` / ``step`` checked against the profile),
    the cluster rules, and every rule's findings merged into one account."""
    import pandas as pd

    from advisor.stages import breakdown as breakdown_stage

    con = summary.con
    cur = con.cursor()
    ranks = [r[0] for r in cur.execute("SELECT DISTINCT rank FROM ranks ORDER BY rank").fetchall()]
    ctx = AnalysisContext(con=con, path=root, sources=sorted(summary.sources), ranks=ranks, warnings=warnings)
    ctx.extras["parse_seconds"] = summary.parse_seconds
    ctx.extras["stages_seconds"] = summary.stages_seconds
    ctx.extras["platform"] = reduce_platform(summary.platforms)
    ctx.extras[COMBINED_TABLE] = dict(summary.combined)
    # a joined replay holds only where one shard read every rank of the profile
    ctx.extras[JOINED_KEY] = next((j for j in summary.joined if set(j.get("ranks") or ()) >= set(ranks)), None)
    ctx._counts.update(summary.counts)
    bd = pd.concat(summary.frames, ignore_index=True) if summary.frames else None
    if bd is not None:
        breakdown_stage.store(con, bd)
    ctx.breakdown = bd
    _focus(ctx, summary, rank, step)
    specs, chosen = choose(cfg)
    cluster = {rid: s for rid, s in chosen.items() if s.scope == "cluster"}
    _declare_carried(ctx, cur, cluster)
    done = combine([*summary.dones, execute(ctx, cfg, cluster, debug)])
    findings, outcomes = account(specs, chosen, done, ctx.ranks, ctx.breakdown, warnings,
                                 replayed=ctx.extras[COMBINED_TABLE])
    cur.close()
    return Reduced(ctx, findings, outcomes)


def _focus(ctx: AnalysisContext, summary: Summary, rank: int | None, step: int | None) -> None:
    """The focus of the whole profile, and the critical path its shard computed; the shards' stage
    warnings, that path's, and the CPU-only one after the warnings so far."""
    check_focus(ctx, rank, step)
    ctx.focus_rank, ctx.focus_step = choose_focus(ctx, rank, step)
    cp = next((c for c in summary.candidates if c.focus == (ctx.focus_rank, ctx.focus_step)), None)
    ctx.critical_path = cp.critical_path if cp is not None else empty_path(ctx.focus_rank, ctx.focus_step)
    ctx.warnings.extend(summary.stage_warnings)
    if cp is not None:
        ctx.warnings.extend(cp.cp_warnings)
    if not ctx.has_device:
        ctx.warnings.append(Warning_("cpu_only", CPU_ONLY))


def _declare_carried(ctx: AnalysisContext, cur: Any, cluster: dict[str, Any]) -> None:
    """The tables the maps built for the cluster rules (rank parts, shared derived tables) are
    declared built, so that no rule builds them again over a reduce without events."""
    from advisor.engine.derived import DERIVED

    tables = cur.execute("SELECT table_name, NOT temporary AND database_name = current_database() "
                         "AND schema_name = current_schema() FROM duckdb_tables() "
                         f"WHERE {OWN_TABLES_SQL}").fetchall()
    have = {name for name, _ in tables}
    own = {name for name, default in tables if default}  # those an unqualified CREATE names
    creates: dict[str, str] = {}
    for spec in cluster.values():
        if spec.rank_part is not None:
            ctx._derived.add(f"rank_part:{spec.id}")
            for name, columns in spec.rank_part.tables.items():
                if name not in own:
                    creates.setdefault(name, f"CREATE TABLE IF NOT EXISTS {name} ({columns})")
    if creates:
        cur.execute("; ".join(creates.values()))
    for name in CARRIED_DERIVED:
        if name in DERIVED and name in have:
            ctx._derived.add(name)
