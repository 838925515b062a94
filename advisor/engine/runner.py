"""Run the selected rules; a rule that lacks inputs is skipped with its reason, one that crashes is a rule error."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from advisor.config import Config, ConfigError, build_thresholds
from advisor.engine.context import AnalysisContext
from advisor.engine.registry import discover
from advisor.engine.rule import RuleContext, RuleSpec, iter_findings
from advisor.model import Finding, RuleOutcome, Warning_


def selected(specs: dict[str, RuleSpec[Any]], cfg: Config) -> dict[str, RuleSpec[Any]]:
    """Rules to run: ``--rule`` picks by id, ``--skip`` drops, experimental only with --all or by name."""
    for rid in [*cfg.select, *cfg.skip, *cfg.overrides]:
        if rid not in specs:
            raise ConfigError(f"unknown rule {rid!r} (see 'advisor rules')")
    out = {}
    for rid, spec in specs.items():
        if cfg.select and rid not in cfg.select:
            continue
        if rid in cfg.skip:
            continue
        if spec.status == "experimental" and not cfg.all_rules and rid not in cfg.select:
            continue
        out[rid] = spec
    return out


# one more than two cores: a rule waiting for a shared table another rule is building
# (kernel_ops, host_op_top ...) leaves its core to a third
RULE_WORKERS = 3


def _undeclared_hint(spec: RuleSpec[Any], exc: BaseException) -> str:
    """A hint when a rule failed because its SQL reads a shared derived table it did not declare."""
    from advisor.engine.derived import DERIVED

    text = str(exc)
    missing = [name for name in DERIVED if name not in spec.derived and f"Table with name {name} does not exist" in text]
    return f" (declare it: @rule(..., derived=({missing[0]!r}, ...)))" if missing else ""


def _run_one(spec: RuleSpec[Any], ctx: AnalysisContext, thresholds: Any,
             debug: bool) -> tuple[RuleOutcome, list[Finding], list[Warning_], list[str]]:
    """Run one rule: its outcome, findings, error warning (a crash is an outcome, not an
    exception) and notes (as the rule gave them: :func:`collect` merges per-rank repeats)."""
    rid = spec.id
    rctx: RuleContext[Any] = RuleContext(spec, ctx, thresholds)
    t0 = time.perf_counter()
    try:
        ctx.ensure_derived(spec.derived)
        build_rank_part(spec, ctx, thresholds)
        got = list(iter_findings(spec.func(rctx)))
    except Exception as exc:  # noqa: BLE001 - a broken rule must not take the others down
        if debug:
            traceback.print_exc()
        msg = f"{rid} ({spec.name}) failed: {type(exc).__name__}: {exc}" + _undeclared_hint(spec, exc)
        return RuleOutcome(rid, "error", msg, seconds=time.perf_counter() - t0), [], [Warning_("rule_error", msg)], []
    return RuleOutcome(rid, "ran", findings=len(got), seconds=time.perf_counter() - t0), got, [], list(rctx.notes)


def build_rank_part(spec: RuleSpec[Any], ctx: AnalysisContext, thresholds: Any) -> None:
    """Create the tables of ``spec``'s rank part (:class:`advisor.engine.rule.RankPart`) from the
    ranks ``ctx`` holds, once per analysis; a context given them already (the cluster reduce) lists
    them as built."""
    part = spec.rank_part
    if part is None:
        return
    key = f"rank_part:{spec.id}"
    if key in ctx._derived:
        return
    with ctx._building.setdefault(key, threading.Lock()):
        if key in ctx._derived:
            return
        from advisor.schema import insert_rows

        ctx.ensure_derived(part.derived)
        got = part.build(RuleContext(spec, ctx, thresholds))
        cur = ctx._cursor()  # this thread's (a new cursor costs a statement)
        for name, columns in part.tables.items():
            cur.execute(f"CREATE OR REPLACE TABLE {name} ({columns})")
            rows = [tuple(r) for r in got.get(name, ())]
            if rows:
                insert_rows(cur, name, rows)
        ctx._derived.add(key)


#: What running one rule gave: ("skipped", reason) when a requirement it needs is not met,
#: ("not_applicable", reason) when an unmet requirement is one the profile cannot meet by its
#: nature (:func:`inapplicable`: the rule cannot apply whatever else it lacks), else ("ran", (outcome, findings, error warnings, notes)). Plain
#: values: a worker process returns them.
Done = tuple[str, Any]

#: Tables only a vendor (Ascend) export or a ``--metrics`` file holds: on a profile read from
#: Kineto traces alone, a rule needing them has nothing to apply to
VENDOR_TABLES = ("comm_bandwidth", "queues", "kernels", "hw_metrics")
#: Tables derived from communication events: a profile without any has no communication to judge
COMM_TABLES = ("comm_matrix", "comm_ops")


def inapplicable(ctx: AnalysisContext, requirement: str) -> bool:
    """Whether an unmet ``requirement`` means the rule cannot apply to this profile (one rank, a
    CPU-only trace, no communication, a vendor-export table on a Kineto trace) rather than that
    data it needs is missing (fewer than two steps, no breakdown, an export without the file)."""
    if requirement in ("multi_rank", "device"):
        return True
    if requirement == "kernel_detail":
        return not ctx.has_device
    if requirement in COMM_TABLES:
        if any(ctx.rows(t) for t in COMM_TABLES):
            return False
        def comm_events() -> int:
            try:  # the events, where this context holds them (a cluster reduce holds the per-rank tables only)
                return int(ctx.scalar("SELECT count(*) FROM (SELECT 1 FROM events WHERE kind = 'comm' LIMIT 1)") or 0)
            except Exception:  # noqa: BLE001 - no events table: the communication tables are all there is
                return 0

        return not ctx._kept("_comm_events", comm_events)
    if requirement in VENDOR_TABLES:
        return bool(ctx.sources) and all(s == "kineto" for s in ctx.sources)
    return False


def choose(cfg: Config, scope: str | None = None) -> tuple[dict[str, RuleSpec[Any]], dict[str, RuleSpec[Any]]]:
    """Every rule discovered, and those ``cfg`` selects (of ``scope`` only, when given)."""
    specs = discover()
    chosen = selected(specs, cfg)
    if scope is not None:
        chosen = {rid: s for rid, s in chosen.items() if s.scope == scope}
    return specs, chosen


def execute(ctx: AnalysisContext, cfg: Config, chosen: dict[str, RuleSpec[Any]], debug: bool = False) -> dict[str, Done]:
    """Run the ``chosen`` rules against ``ctx``, a few at a time; what each gave, by rule id."""
    thresholds = {rid: build_thresholds(rid, s.thresholds, cfg.overrides.get(rid, {})) for rid, s in chosen.items()}

    def run(rid: str) -> Done:
        """Requirements are checked here, in the worker: one on the breakdown waits for the stages
        (which may still run beside the rules) without holding up the rules that need nothing."""
        unmet = [(req, r) for req, r in ((req, ctx.missing(req)) for req in chosen[rid].requires) if r]
        if unmet:
            status = "not_applicable" if any(inapplicable(ctx, req) for req, _r in unmet) else "skipped"
            return status, "; ".join(r for _req, r in unmet)
        return "ran", _run_one(chosen[rid], ctx, thresholds[rid], debug)

    # rules are independent; a few at a time keep the cores busy (their queries release the GIL),
    # and their outcomes and warnings are still recorded in rule order
    with ThreadPoolExecutor(max_workers=RULE_WORKERS) as pool:
        return dict(zip(chosen, pool.map(run, chosen), strict=True))


def combine(parts: list[dict[str, Done]]) -> dict[str, Done]:
    """What each rule gave on several shards of ranks, as if it had run once: it ran if it ran on
    any shard (its notes and time added up, its findings too, those several shards gave merged:
    :func:`advisor.engine.merge.merge_shards`; an error on one shard is the rule's outcome), and is
    skipped, with the first shard's reason, only if it was skipped on every one (not applicable
    when it was so on every shard)."""
    from advisor.engine.merge import merge_shards

    out: dict[str, Done] = {}
    for rid in dict.fromkeys(rid for part in parts for rid in part):
        ran = [part[rid][1] for part in parts if rid in part and part[rid][0] == "ran"]
        if not ran:
            got = [part[rid] for part in parts if rid in part]
            out[rid] = next((g for g in got if g[0] == "skipped"), got[0])
            continue
        findings = merge_shards([r[1] for r in ran]) if len(ran) > 1 else ran[0][1]
        errors = [w for r in ran for w in r[2]]
        notes = [n for r in ran for n in r[3]]
        failed = [r[0] for r in ran if r[0].status == "error"]
        seconds = sum(r[0].seconds for r in ran)
        outcome = (RuleOutcome(rid, "error", failed[0].reason, findings=len(findings), seconds=seconds) if failed
                   else RuleOutcome(rid, "ran", findings=len(findings), seconds=seconds))
        out[rid] = ("ran", (outcome, findings, errors, notes))
    return out


def collect(specs: dict[str, RuleSpec[Any]], chosen: dict[str, RuleSpec[Any]], done: dict[str, Done],
            warnings: list[Warning_]) -> tuple[list[Finding], list[RuleOutcome]]:
    """The findings and outcomes of every rule, in rule order; skips, errors and notes are added
    to ``warnings``."""
    from advisor.engine.merge import merge_rank_notes

    findings: list[Finding] = []
    outcomes: list[RuleOutcome] = []
    # a note several rules give (e.g. kernel time not tied to operators, read by three compute
    # rules) is one warning naming them all, in the place of the first
    note_rules: dict[str, list[str]] = {}  # note -> the rules that gave it, in rule order
    note_at: dict[str, int] = {}  # note -> index of its warning
    for rid, spec in specs.items():
        if rid not in chosen:
            outcomes.append(RuleOutcome(rid, "not_selected"))
            continue
        status, got = done[rid]
        if status in ("skipped", "not_applicable"):
            outcomes.append(RuleOutcome(rid, "skipped", got, applicable=status == "skipped"))
            warnings.append(Warning_("rule_skipped", f"{rid} ({spec.name}) not run: {got}"))
        else:
            outcome, rule_findings, errors, rule_notes = got
            outcomes.append(outcome)
            warnings.extend(errors)
            for text in dict.fromkeys(merge_rank_notes(rule_notes)):
                if text not in note_rules:
                    note_rules[text], note_at[text] = [], len(warnings)
                    warnings.append(Warning_("rule_undecided", ""))  # its message is set below
                note_rules[text].append(f"{rid} ({spec.name})")
            findings.extend(rule_findings)
    for text, by in note_rules.items():
        warnings[note_at[text]] = Warning_("rule_undecided", f"{', '.join(by)}: {text}")
    return findings, outcomes


def run_rules(ctx: AnalysisContext, cfg: Config, debug: bool = False) -> tuple[list[Finding], list[RuleOutcome]]:
    """Run every selected rule against ``ctx``; warnings for skips/errors go into ``ctx.warnings``."""
    specs, chosen = choose(cfg)
    done = execute(ctx, cfg, chosen, debug)
    ctx.wait_stages()  # their warnings come first, as when they run before the rules
    from advisor.engine.combined import of_done

    try:
        replayed = of_done(ctx, done)
    except Exception as exc:  # noqa: BLE001 -- links are then decided as without a replay, the headline summed
        ctx.warnings.append(Warning_("rule_error", f"replaying the findings' changes together failed: "
                                     f"{type(exc).__name__}: {exc}"))
        replayed = {}
    return account(specs, chosen, done, ctx.ranks, ctx.breakdown, ctx.warnings, replayed=replayed)


def account(specs: dict[str, RuleSpec[Any]], chosen: dict[str, RuleSpec[Any]], done: dict[str, Done],
            ranks: list[int], breakdown: Any, warnings: list[Warning_],
            replayed: Mapping[int, Mapping[str, Any]] | None = None) -> tuple[list[Finding], list[RuleOutcome]]:
    """The one account of what the rules gave: rule modules that failed to load, each rule's
    outcome (:func:`collect`) and the findings as the report gives them (:func:`finish`; ``replayed``:
    the rank rules' changes replayed together, :func:`advisor.engine.combined.replay_combinations`)."""
    from advisor.engine.registry import LOAD_ERRORS

    for err in LOAD_ERRORS:
        warnings.append(Warning_("rule_error", f"rule not loaded: {err}"))
    findings, outcomes = collect(specs, chosen, done, warnings)
    return finish(findings, ranks, breakdown, warnings, replayed), outcomes


def finish(findings: list[Finding], ranks: list[int], breakdown: Any, warnings: list[Warning_],
           replayed: Mapping[int, Mapping[str, Any]] | None = None) -> list[Finding]:
    """The findings of every rule as the report gives them: per-rank copies merged, savings capped
    at the step, cross-referenced, linked into chains (a declared pair whose changes were
    ``replayed`` together on a shared rank linked by that replay), most saving first."""
    if len(ranks) >= 3:
        from advisor.engine.merge import merge_per_rank

        findings = merge_per_rank(findings)
    from advisor.engine import chain
    from advisor.schema import NO_STEP

    findings = order_fixes(findings, ranks)
    # one account of savings: no saving above the step (median or mean) of the ranks a finding names
    findings = chain.cap_savings(chain.unique_ids(findings), chain.cap_steps(breakdown, NO_STEP))
    if findings and breakdown is not None and not breakdown.empty:
        from advisor.engine.explain import annotate

        steps_by_rank = {int(r): {int(s) for s in g["step"] if int(s) >= 0} for r, g in breakdown.groupby("rank")}
        try:
            findings = annotate(findings, steps_by_rank=steps_by_rank)
        except Exception as exc:  # noqa: BLE001 - cross-referencing is a nicety; never lose the findings over it
            warnings.append(Warning_("rule_error", f"cross-referencing findings failed: {type(exc).__name__}: {exc}"))
    try:
        findings = chain.link(findings, replayed=replayed)
    except Exception as exc:  # noqa: BLE001 - linking is an account of the findings; never lose them over it
        warnings.append(Warning_("rule_error", f"linking findings into chains failed: {type(exc).__name__}: {exc}"))
    findings.sort(key=lambda f: (f.estimated_saving_us is None, -(f.estimated_saving_us or 0), -f.severity, f.rule))
    return findings


def order_fixes(findings: list[Finding], ranks: list[int]) -> list[Finding]:
    """Each finding's optimizations ordered by what its evidence supports (the cause map's
    ``prefer_if``, :func:`advisor.causes.order_by_evidence`): supported fixes first, none dropped."""
    from dataclasses import replace

    from advisor.causes import order_by_evidence

    out = []
    for f in findings:
        ordered = order_by_evidence(f.cause, f.optimizations, f.evidence,
                                    {"ranks": len(ranks), "finding_ranks": len(f.ranks)})
        out.append(f if ordered == tuple(f.optimizations) else replace(f, optimizations=ordered))
    return out
