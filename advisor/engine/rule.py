"""How a rule is declared: ``@rule(...)`` on a function that yields findings.

A rule module's docstring is its documentation, in fixed sections::

    \"\"\"<one-line summary>

    ## Why it matters
    ...
    ## How it is detected
    ...
    ## What to do
    ...
    \"\"\"

Thresholds are a frozen dataclass whose fields are declared with :func:`knob` (default, help,
and where one exists the source of the number). ``--set RULE.field=value`` and ``advisor.toml``
override them.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from advisor.causes import optimizations_for
from advisor.kinds import Source
from advisor.model import Finding, Severity, severity_for_fraction
from advisor.stages.replay import Change, Select

#: what a rule module imports from here: the rule's declaration, its context, and its counterfactual as
#: data (:mod:`advisor.stages.replay`)
__all__ = ["SAVING_FROM_REPLAY", "Change", "NoThresholds", "RankPart", "RuleContext", "RuleDoc", "RuleSpec", "Select", "iter_findings",
           "knob", "platform_of", "registered", "rule", "straggler_summary"]

if TYPE_CHECKING:
    from advisor.engine.context import AnalysisContext

T = TypeVar("T")
T2 = TypeVar("T2")

#: The one switch that makes a finding's ``estimated_saving_us`` (hence its severity, the ranking and the
#: verdict) the replayed saving of its counterfactual where the replay estimated one on steps that all
#: reproduced (the rule's own figure then stays in ``evidence.saving_before_replay_us``). Off: the
#: replay is reported beside the rule's figure only (``Finding.replay``).
SAVING_FROM_REPLAY = True

RULE_ID_RE = re.compile(r"^[A-Z]{2,4}\d{3}$")
DOC_SECTIONS = ("Why it matters", "How it is detected", "What to do")
SCOPES = ("rank", "cluster")


def knob(default: Any, help: str, source: str = "") -> Any:
    """Declare a threshold field with its default, help text and the source of the number."""
    return field(default=default, metadata={"help": help, "source": source})


@dataclass(frozen=True)
class NoThresholds:
    """For rules without tunable numbers."""


@dataclass(frozen=True, slots=True)
class RuleDoc:
    """A rule's documentation, parsed from its module docstring."""

    summary: str
    sections: Mapping[str, str]

    @classmethod
    def parse(cls, text: str) -> RuleDoc:
        """Split a docstring into its summary line and ``## Heading`` sections."""
        text = (text or "").strip()
        lines = text.splitlines()
        summary = lines[0].strip() if lines else ""
        sections: dict[str, list[str]] = {}
        current: str | None = None
        for line in lines[1:]:
            m = re.match(r"^##\s+(.*\S)\s*$", line)
            if m:
                current = m.group(1)
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
        return cls(summary, {k: "\n".join(v).strip() for k, v in sections.items()})

    def markdown(self) -> str:
        """The doc as Markdown."""
        parts = [self.summary, ""]
        for k, v in self.sections.items():
            parts += [f"## {k}", v, ""]
        return "\n".join(parts).strip() + "\n"


@dataclass(frozen=True)
class RankPart:
    """What a cluster rule needs from each rank's own data (events, kernels ...), which its cluster
    part cannot read: ``build`` runs where a rank's tables are (the per-rank map, on each shard of
    ranks; or before the rule, on a context holding every rank) and returns rows of the small
    tables ``tables`` (name -> column definitions); the rule reads them like canonical tables."""

    tables: Mapping[str, str]
    build: Callable[[RuleContext[Any]], Mapping[str, Iterable[tuple[Any, ...]]]]
    derived: tuple[str, ...] = ()  # shared derived tables ``build`` reads (built first, where the ranks are)


@dataclass(frozen=True)
class RuleSpec(Generic[T]):
    """A registered rule."""

    id: str
    name: str
    cause: str
    requires: tuple[str, ...]
    thresholds: type
    func: Callable[[RuleContext[Any]], Iterable[Finding]]
    doc: RuleDoc
    module: str
    status: str = "stable"
    causes: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()  # shared derived tables its SQL reads (advisor.engine.derived)
    # "rank": decides on each rank's own data and runs in the per-rank map, on a shard of ranks;
    # "cluster": compares ranks, groups or links and runs once in the cluster reduce, where only
    # the summary tables are (advisor.pipeline.map.SUMMARY_TABLES), never events or kernels
    scope: str = "rank"
    rank_part: RankPart | None = None  # a cluster rule's per-rank inputs (see RankPart)

    @property
    def all_causes(self) -> tuple[str, ...]:
        """The main cause and any others the rule may report."""
        return (self.cause, *[c for c in self.causes if c != self.cause])

    def threshold_fields(self) -> list[dataclasses.Field[Any]]:
        """The Thresholds dataclass fields."""
        return list(dataclasses.fields(self.thresholds))


_REGISTRY: dict[str, RuleSpec[Any]] = {}


def registered() -> dict[str, RuleSpec[Any]]:
    """Rules registered so far (see :func:`advisor.engine.registry.discover`)."""
    return _REGISTRY


def rule(
    id: str,
    name: str,
    *,
    cause: str,
    requires: Sequence[str] = ("events", "steps"),
    thresholds: type = NoThresholds,
    status: str = "stable",
    causes: Sequence[str] = (),
    derived: Sequence[str] = (),
    scope: str = "rank",
    rank_part: RankPart | None = None,
) -> Callable[[Callable[[RuleContext[Any]], Iterable[Finding]]], Callable[[RuleContext[Any]], Iterable[Finding]]]:
    """Register a rule function. See the module docstring."""

    def deco(func: Callable[[RuleContext[Any]], Iterable[Finding]]) -> Callable[[RuleContext[Any]], Iterable[Finding]]:
        import sys

        if scope not in SCOPES:
            raise ValueError(f"rule {id}: scope {scope!r} is not one of {', '.join(SCOPES)}")
        module = sys.modules[func.__module__]
        spec: RuleSpec[Any] = RuleSpec(
            id=id,
            name=name,
            cause=cause,
            requires=tuple(requires),
            thresholds=thresholds,
            func=func,
            doc=RuleDoc.parse(module.__doc__ or func.__doc__ or ""),
            module=func.__module__,
            status=status,
            causes=tuple(causes),
            derived=tuple(derived),
            scope=scope,
            rank_part=rank_part,
        )
        if id in _REGISTRY and _REGISTRY[id].module != spec.module:
            raise ValueError(f"duplicate rule id {id} in {spec.module} and {_REGISTRY[id].module}")
        _REGISTRY[id] = spec
        return func

    return deco


class RuleContext(Generic[T]):
    """What a rule sees: the analysis context, its thresholds, and a finding factory."""

    def __init__(self, spec: RuleSpec[T], analysis: AnalysisContext, thresholds: T) -> None:
        self.spec = spec
        self.analysis = analysis
        self.t = thresholds
        self.notes: list[str] = []
        self._budget: Any = None  # the replay budget (:meth:`_replay_budget`)

    # -- data access -------------------------------------------------------------------
    @property
    def con(self) -> Any:
        """The DuckDB connection holding the canonical tables."""
        return self.analysis.con

    def _params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """The threshold fields, then ``params`` (which win)."""
        return {**dataclasses.asdict(self.t), **(params or {})}  # type: ignore[call-overload]

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run SQL with named parameters ($name); threshold fields are bound automatically."""
        return self.analysis.query(sql, {**dataclasses.asdict(self.t), **(params or {})}, used_only=True)  # type: ignore[call-overload]

    def df(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """Like :meth:`query` but return a pandas DataFrame."""
        return self.analysis.df(sql, {**dataclasses.asdict(self.t), **(params or {})})  # type: ignore[call-overload]

    def arrays(self, sql: str, params: Mapping[str, Any] | None = None, codes: Iterable[str] = ()) -> Any:
        """Like :meth:`query` but return the columns as numpy arrays (:class:`advisor.engine.context.Arrays`),
        those named in ``codes`` as integer codes into ``result.names[column]``."""
        return self.analysis.arrays(sql, self._params(params), codes)

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """Like :meth:`query` but return the first column of the first row (None without rows)."""
        return self.analysis.scalar(sql, self._params(params))

    def query_frames(self, sql: str, frames: Mapping[str, Any],
                     params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run SQL that also reads pandas DataFrames, each under the name given in ``frames``
        (registered on a cursor of this query only), and return rows as dicts."""
        from advisor.engine.context import bind

        self.analysis.prepare(sql)
        cur = self.analysis.con.cursor()
        try:
            for name, frame in frames.items():
                cur.register(name, frame)
            res = cur.execute(sql, bind(sql, self._params(params)))
            cols = [d[0] for d in res.description]
            return [dict(zip(cols, row, strict=True)) for row in res.fetchall()]
        finally:
            for name in frames:
                cur.unregister(name)

    def rows(self, table: str) -> int:
        """Row count of a canonical table (or of the breakdown): 0 when the profile has none."""
        return self.analysis.rows(table)

    @property
    def has_device(self) -> bool:
        """Some rank has device (accelerator) events."""
        return bool(self.analysis.has_device)

    @property
    def device_ranks(self) -> frozenset[int]:
        """The ranks with device (accelerator) events."""
        return self.once("device_ranks", lambda: frozenset(
            int(r["rank"]) for r in self.analysis.query("SELECT rank FROM ranks WHERE has_device")))

    @property
    def vendor_kernels(self) -> int:
        """Rows of ``kernels`` from a vendor's per-operator export (Ascend), not Kineto launch grids."""
        return int(self.analysis.vendor_kernels)

    @property
    def platform(self) -> str | None:
        """The profile's platform for advice: ``ascend``, ``cpu``, ``cuda``, ``rocm`` or ``gpu``
        (None when it cannot be told); see :func:`platform_of`."""
        return platform_of(self.analysis)

    @property
    def has_breakdown(self) -> bool:
        """The stages produced a per-(rank, step) breakdown with at least one row."""
        bd = self.analysis.breakdown
        return bd is not None and not bd.empty

    def breakdown(self, rank: int | None = None, step: int | None = None) -> Any:
        """The breakdown (pandas DataFrame, one row per (rank, step): step_us, comm_us ...), optionally
        of one rank and / or step; an empty frame with the key columns when there is none."""
        import pandas as pd

        bd = self.analysis.breakdown
        if bd is None:
            return pd.DataFrame(columns=["rank", "step", "step_us"])
        if rank is not None:
            bd = bd[bd["rank"] == rank]
        if step is not None:
            bd = bd[bd["step"] == step]
        return bd

    def step_us(self, rank: int | None = None, step: int | None = None) -> float | None:
        """Step time in µs from the breakdown: one (rank, step), the median over a rank's steps, or
        over every rank; None when the breakdown does not have it."""
        return self.analysis.step_us(rank, step) or None

    def median_step_us(self, ranks: Iterable[int]) -> float | None:
        """Median step time in µs over the steps of ``ranks`` (None when the breakdown has none)."""
        bd = self.analysis.breakdown
        if bd is None or bd.empty:
            return None
        sel = bd[bd["rank"].isin([int(r) for r in ranks])]["step_us"]
        return float(sel.median()) if len(sel) else None

    def hardware(self) -> Any:
        """The hardware stage's result over ``hw_metrics`` (:class:`advisor.stages.hardware.Hardware`),
        computed once per analysis."""
        from advisor.stages import hardware

        return hardware.get(self.analysis)

    def once(self, key: str, compute: Callable[[], T2]) -> T2:
        """``compute()`` once per analysis under ``key``: a figure several rules read."""
        cache = self.analysis.extras
        if key not in cache:
            # rules run in threads: one that asks while another computes it waits for that answer
            building = getattr(self.analysis, "_building", None)
            lock = building.setdefault("once:" + key, threading.Lock()) if building is not None else None
            if lock is None:
                cache[key] = compute()
            else:
                with lock:
                    if key not in cache:
                        cache[key] = compute()
        return cast(T2, cache[key])

    def parallel_groups(self) -> dict[str, Any] | None:
        """The job's parallel groups, their kind and its pipeline stages (:func:`advisor.stages.groups.reconstruct`),
        once per analysis; None when no communication names its group."""
        from advisor.stages import groups

        return groups.of_context(self.analysis)

    def warn(self, message: str) -> None:
        """Say that part of the rule could not decide on the data it has (shown in warnings)."""
        self.notes.append(message)

    # -- findings ----------------------------------------------------------------------
    def finding(
        self,
        *,
        title: str,
        evidence: Mapping[str, Any],
        saving_us: float | None = None,
        step_us: float | None = None,
        ranks: Iterable[int] = (),
        steps: Iterable[int] = (),
        ops: Iterable[str] = (),
        cause: str | None = None,
        severity: Severity | None = None,
        saving_basis: str = "",
        detail: str = "",
        top: Iterable[Mapping[str, Any]] = (),
        replay: Mapping[str, Any] | None = None,
    ) -> Finding:
        """Build a finding. Severity comes from saving/step_us (CAUSES.md) unless given.

        ``saving_us`` is per step (an upper bound, its basis in ``saving_basis``); ``step_us`` the
        step time it is a share of. A rule that cannot estimate a saving passes ``severity``.
        """
        cause = cause or self.spec.cause
        if SAVING_FROM_REPLAY and replay is not None and replay.get("estimated") and replay.get("reproduced"):
            evidence = {**evidence, "saving_before_replay_us": None if saving_us is None else round(float(saving_us), 3)}
            saving_us = float(replay["saving_us"])
            saving_basis = f"replayed step without the cause: {replay.get('assumption', '')}"
        elif SAVING_FROM_REPLAY and saving_us is not None:
            why = "the rule states no counterfactual" if replay is None else str(
                replay.get("reason") or f"its replay estimates {replay.get('steps_replayed')} of its "
                f"{replay.get('steps')} steps (" + str(replay.get("steps_not_replayed") or "the others do not reproduce "
                "the measured step: see the warnings") + ")")
            evidence = {**evidence, "saving_not_replayed": why}
        fraction = None
        if saving_us is not None and step_us:
            fraction = max(0.0, min(1.0, saving_us / step_us))
        if severity is None:
            severity = severity_for_fraction(fraction)
        return Finding(
            rule=self.spec.id,
            cause=cause,
            severity=severity,
            title=title,
            evidence=dict(evidence),
            ranks=tuple(sorted({int(r) for r in ranks})),
            steps=tuple(sorted({int(s) for s in steps if s is not None and int(s) >= 0})),
            ops=tuple(dict.fromkeys(str(o) for o in ops)),
            estimated_saving_us=None if saving_us is None else round(float(saving_us), 3),
            saving_fraction=None if fraction is None else round(fraction, 4),
            saving_basis=saving_basis,
            detail=detail,
            optimizations=optimizations_for(cause, self.platform,
                                            (title, *(str(o) for o in ops), *(str(v) for x in top for v in x.values()))),
            top=tuple(dict(x) for x in top),
            replay=None if replay is None else dict(replay),
        )

    # -- what-if replay ----------------------------------------------------------------
    def what_if(self, rank: int, changes: Sequence[Change], assumption: str,
                steps: Iterable[int] | None = None) -> dict[str, Any]:
        """The finding's ``replay`` object: rank ``rank``'s step windows (``steps``, default those of the
        breakdown) replayed without and with ``changes`` (:class:`advisor.stages.replay.Change`), the
        graphs built once per analysis. A step whose no-change replay does not reproduce the measured
        step is left out of the saving, and said in a warning; a cluster rule (no events where it runs)
        gets ``estimated: false``. The changes are kept for the report's "fix these three", which
        replays the top findings' changes together (:mod:`advisor.engine.combined`)."""
        from advisor.stages import replay as replay_stage

        if self.spec.scope != "rank":
            return {"estimated": False, "reason": "a cluster rule runs where no events are; its rank part replays"}
        results = self.replay_steps(rank, changes, steps)
        from advisor.engine.combined import record

        # for "fix these three": the steps replayed here (those over the budget have no graph; the
        # combinations replay on the graphs this rule had built)
        record(self.analysis.extras, self.spec.id, int(rank),
               [int(r.step) for r in results if r.step is not None and not r.over_budget], changes)
        out = replay_stage.summary(results, assumption)
        bad = [r for r in results if not r.reproduced]
        if bad:
            self.warn(f"rank {rank}: the replay of {len(bad)} of {len(results)} steps does not reproduce the measured "
                      f"step within {replay_stage.REPRODUCE_WITHIN:.0%} (worst {max(r.error for r in bad):.1%}); "
                      "their what-if saving is not estimated")
        unsure = sorted({str(r.reason) for r in results if r.reason})
        if unsure:
            self.warn(f"rank {rank}: the what-if saving is not estimated ({'; '.join(unsure)}); the finding keeps "
                      "the rule's own estimate")
        return out

    def straggler_replay(self, steps: Iterable[int], min_lead_share: float) -> list[dict[str, Any]]:
        """:meth:`joined_straggler_replay` of the steps where the rank with the longest own time (the step less
        its not-overlapped communication, from the breakdown) leads the others' median own time by
        ``min_lead_share`` of the step (a straggler worth naming); the other steps listed with the reason.
        Nothing where this context holds fewer ranks than the world: a group's ranks are only joined where
        they were read together."""
        seen = self.analysis.query("SELECT count(DISTINCT rank) AS n, max(world_size) AS w FROM ranks")[0]
        if seen["w"] is not None and int(seen["n"]) < int(seen["w"]):
            return []
        bd = self.breakdown()
        want = {int(x) for x in steps}
        if bd is None or bd.empty or not want:
            return []
        lead: set[int] = set()
        for step, rows in bd[bd["step"].isin(sorted(want))].groupby("step"):
            own = sorted((rows["step_us"] - rows["comm_only_us"]).tolist())
            if len(own) < 2:
                continue
            others, m = own[:-1], (len(own) - 1) // 2
            median = others[m] if len(others) % 2 else (others[m - 1] + others[m]) / 2
            if own[-1] - median >= min_lead_share * float(rows["step_us"].median()):
                lead.add(int(step))
        done: dict[int, dict[str, Any]] = self.analysis.extras.setdefault("straggler_replay", {})
        todo = sorted(lead - set(done))
        for row in self.joined_straggler_replay(todo) if todo else []:
            done[int(row["step"])] = row
        out = [dict(done[s]) for s in sorted(lead) if s in done]
        ranks = ",".join(str(int(r)) for r in sorted(set(bd["rank"].tolist())))
        why = NO_LEAD.format(share=min_lead_share)
        out += [{"step": step, "rank": None, "ranks": ranks, "measured_ns": None, "saving_ns": None, "error": None,
                 "factor": None, "reason": why} for step in sorted(want - lead)]
        return out

    def joined_straggler_replay(self, steps: Iterable[int]) -> list[dict[str, Any]]:
        """Per step of ``steps``, the ranks of this context joined by their collectives
        (:func:`advisor.stages.replay.cluster_replay`) and replayed with the rank whose own time is longest
        at its peers' median own speed (:func:`advisor.stages.replay.straggler_changes`): ``step``,
        ``rank`` (that straggler), ``ranks`` (the ranks joined, comma separated), ``measured_ns`` (the
        cluster's step: its slowest rank), ``saving_ns`` (the joined no-change replay less the replay with
        the change; None with ``reason`` when not estimated), ``error`` (the joined no-change replay against
        the measured cluster step) and ``factor`` (the straggler's scale). Only where the ranks' events are
        (a cluster rule's rank part)."""
        from advisor.stages import replay as replay_stage

        want = sorted({int(x) for x in steps})
        rows = self.analysis.query(
            "SELECT rank, step, start_ns, end_ns FROM steps WHERE end_ns > start_ns AND step IN (SELECT unnest($steps)) "
            "ORDER BY rank, step", {"steps": want})
        by_rank: dict[int, list[tuple[int, int, int]]] = {}
        for r in rows:
            by_rank.setdefault(int(r["rank"]), []).append((int(r["step"]), int(r["start_ns"]), int(r["end_ns"])))
        per_step: dict[int, dict[int, Any]] = {}
        refused: dict[int, str] = {}  # step -> why its ranks are not replayed (the rule's replay budget)
        cur = self.analysis.con.cursor()
        try:
            # a step's ranks are replayed together or not at all: the step's events of every rank are charged at once
            counts = {rank: replay_stage.window_events(cur, self.analysis.extras, rank, wins)
                      for rank, wins in by_rank.items()}
            budget = self._replay_budget(cur)
            for step in want:
                need = sum(n for rank, wins in by_rank.items()
                           for (s, _a, _b), n in zip(wins, counts[rank], strict=True) if s == step)
                if not budget.take(need):
                    refused[step] = budget.refusal(need)
            for rank, wins in by_rank.items():
                for g in replay_stage.graphs(cur, self.analysis.extras, rank, [w for w in wins if w[0] not in refused]):
                    if g.step is not None:
                        per_step.setdefault(int(g.step), {})[rank] = g
        finally:
            cur.close()
        out: list[dict[str, Any]] = []
        for step in want:
            gs = per_step.get(step, {})
            row: dict[str, Any] = {"step": step, "rank": None, "ranks": ",".join(map(str, sorted(gs))),
                                   "measured_ns": max((g.length for g in gs.values()), default=0),
                                   "saving_ns": None, "error": None, "factor": None, "reason": None}
            out.append(row)
            if step in refused:
                row["ranks"] = ",".join(str(r) for r in sorted(by_rank))
                row["reason"] = f"step {step}: " + refused[step]
                continue
            colls = replay_stage.collectives_of(gs) if len(gs) >= 2 else []
            if not colls:
                row["reason"] = ("no collective of this step joins two ranks read together (only device collectives "
                                 "recorded as one task are joined: not host calls such as gloo's, nor a collective "
                                 "recorded as several tasks, as Ascend HCCL records it)")
                continue
            own = replay_stage.own_times(gs, colls)
            rank = max(own, key=lambda r: (own[r], -r))
            row["rank"] = rank
            before = max(replay_stage.cluster_replay(gs, colls).values())
            row["error"] = abs(before - row["measured_ns"]) / row["measured_ns"] if row["measured_ns"] else 0.0
            if row["error"] > replay_stage.REPRODUCE_WITHIN:
                row["reason"] = (f"the ranks' joined replay does not reproduce the measured step within "
                                 f"{replay_stage.REPRODUCE_WITHIN:.0%}")
                continue
            changes = replay_stage.straggler_changes(gs, colls, rank)
            row["factor"] = replay_stage.straggler_factor(gs, colls, rank)
            after = max(replay_stage.cluster_replay(gs, colls, changes).values()) if changes else before
            row["saving_ns"] = before - after
        return out

    def replay_steps(self, rank: int, changes: Sequence[Change], steps: Iterable[int] | None = None) -> list[Any]:
        """Rank ``rank``'s step windows (``steps``, default those of the breakdown) replayed without and with
        ``changes``: one :class:`advisor.stages.replay.StepResult` per step. Only where the rank's events are
        (a rank rule, a cluster rule's rank part)."""
        from advisor.stages import replay as replay_stage

        if steps is None:
            bd = self.breakdown(rank)
            steps = [int(x) for x in bd["step"]] if len(bd) else None
        windows = [(int(r["step"]), int(r["start_ns"]), int(r["end_ns"])) for r in self.analysis.query(
            "SELECT step, start_ns, end_ns FROM steps WHERE rank = $rank AND end_ns > start_ns ORDER BY step",
            {"rank": int(rank)})]
        if steps is not None:
            want = {int(x) for x in steps}
            windows = [w for w in windows if w[0] in want]
        cur = self.analysis.con.cursor()
        try:
            budget = self._replay_budget(cur)
            kept, out = [], []
            for w, n in zip(windows, replay_stage.window_events(cur, self.analysis.extras, int(rank), windows),
                            strict=True):
                if budget.take(n):
                    kept.append(w)
                else:
                    out.append(replay_stage.StepResult(int(rank), w[0], w[2] - w[1], 0.0, None, False,
                                                       f"step {w[0]}: " + budget.refusal(n), over_budget=True))
            results = replay_stage.what_if(replay_stage.graphs(cur, self.analysis.extras, int(rank), kept), changes)
            return sorted([*results, *out], key=lambda r: (r.step is None, r.step))
        finally:
            cur.close()

    def _replay_budget(self, cur: Any) -> Any:
        """This rule's replay budget (:class:`advisor.stages.replay.Budget`), made on first use."""
        from advisor.stages import replay as replay_stage

        if self._budget is None:
            self._budget = replay_stage.budget_for(cur, self.analysis.extras)
        return self._budget


#: :meth:`RuleContext.straggler_replay`'s reason for a step in which no rank is late: every rank's own time
#: (outside the communication no computation hides) within ``share`` of the step of its peers' median
NO_LEAD = "no rank's own time leads the others' median by {share:.0%} of the step: not replayed"
_NO_LEAD_HEAD = NO_LEAD.split("{", 1)[0]

#: a finding ``replay``'s ``change`` where its counterfactual is the straggler at its peers' median speed
#: (:func:`advisor.stages.replay.straggler_changes`): the headline replays it with the rank rules' changes
STRAGGLER_CHANGE = "straggler"


def straggler_summary(rows: Sequence[Mapping[str, Any]], ranks: Iterable[int], steps: Sequence[int],
                      slowest: int) -> dict[str, Any]:
    """A finding's ``replay`` for a group of ``ranks`` waiting for ``slowest`` over ``steps``, from the rows
    :meth:`RuleContext.straggler_replay` gave (one or more shards'): per step, the cluster's step (its
    slowest rank) replayed with the group's ranks joined by their collectives, less the same with
    ``slowest`` at its peers' median own speed; the mean over the steps where that replay holds every rank
    of the group and names ``slowest`` as the rank to speed up. ``no_straggler``: True where the group's
    ranks were replayed together in every one of ``steps`` and in none of them was any rank late (its own
    time leading its peers'): the members' waits are not for a late member."""
    assumption = f"if rank {slowest} ran at its peers' median speed (its own time outside the collectives scaled to theirs)"
    want = {int(s) for s in steps}
    rows = [r for r in rows if int(r["step"]) in want]
    group = set(ranks)
    savings, errors, factors, reasons = [], [], [], set()
    no_lead: set[int] = set()
    for r in rows:
        joined = {int(x) for x in str(r["ranks"] or "").split(",") if x}
        if not group <= joined:
            continue  # another shard's partial view of the group
        if r["saving_ns"] is None and str(r["reason"] or "").startswith(_NO_LEAD_HEAD):
            no_lead.add(int(r["step"]))
        if r["error"] is not None:
            errors.append(float(r["error"]))
        if r["saving_ns"] is None:
            reasons.add(str(r["reason"]))
        elif r["rank"] is None or int(r["rank"]) != slowest:
            reasons.add(f"the replay's slowest rank in step {int(r['step'])} is rank {r['rank']}, not rank {slowest}")
        else:
            savings.append((int(r["saving_ns"]), int(r["measured_ns"])))
            if r["factor"] is not None:
                factors.append(float(r["factor"]))
    if not savings:
        why = "; ".join(sorted(reasons)) or "the group's ranks were not read together (several shards): not joined"
        return {"estimated": False, "assumption": assumption, "reason": why,
                "no_straggler": bool(want) and no_lead == want}
    saving_us = sum(sv for sv, _ in savings) / len(savings) / 1000.0
    step_us_ = sum(m for _, m in savings) / len(savings) / 1000.0
    if factors:
        assumption = assumption.replace("scaled to theirs", f"× {sum(factors) / len(factors):.2f}")
    out = {"estimated": True, "saving_us": round(max(saving_us, 0.0), 3),
           "saving_fraction": round(max(saving_us, 0.0) / step_us_, 4) if step_us_ else None,
           "assumption": assumption, "change": STRAGGLER_CHANGE, "reproduced": len(savings) == len(steps),
           "reproduction_error": round(max(errors), 4) if errors else 0.0,
           "steps": len(steps), "steps_replayed": len(savings)}
    if len(savings) < len(steps):
        out["steps_not_replayed"] = "; ".join(sorted(reasons)) or "not read together with the group's other ranks"
    return out


# runtime API prefixes -> the platform a Kineto trace was recorded on
_RUNTIME_PLATFORM_SQL = """
SELECT CASE WHEN name LIKE 'hip%' THEN 'rocm' WHEN name LIKE 'cu%' THEN 'cuda' ELSE 'gpu' END AS p, count(*) AS n
FROM event_names WHERE NOT device AND kind IN ('runtime', 'sync') GROUP BY p ORDER BY n DESC LIMIT 1
"""


def platform_of(analysis: Any) -> str | None:
    """The profile's platform for advice (see :mod:`advisor.causes`): ``ascend`` for Ascend exports,
    ``cpu`` without device events, else ``cuda`` / ``rocm`` from the runtime calls (``gpu`` when they
    name neither); None when it cannot be told (no ranks table). Computed once per analysis."""
    extras = getattr(analysis, "extras", None)
    if extras is not None and "platform" in extras:
        return cast(str | None, extras["platform"])
    platform: str | None = None
    try:
        analysis.ensure_derived(("event_names",))
        rows = analysis.query("SELECT source, has_device, device_name FROM ranks")
        if any(r["source"] in (Source.ASCEND_PT, Source.ASCEND_MS) or "ascend" in str(r["device_name"] or "").lower()
               for r in rows):
            platform = "ascend"
        elif rows and not any(r["has_device"] for r in rows):
            platform = "cpu"
        elif rows:
            found = analysis.query(_RUNTIME_PLATFORM_SQL)
            platform = str(found[0]["p"]) if found else "gpu"
    except Exception:  # noqa: BLE001 -- a context without these tables (unit tests): advice for every platform
        platform = None
    if extras is not None:
        extras["platform"] = platform
    return platform


def iter_findings(result: Iterable[Finding] | None) -> Iterator[Finding]:
    """Normalise what a rule function returned."""
    if result is None:
        return iter(())
    return iter(result)
