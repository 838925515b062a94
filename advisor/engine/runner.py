"""Run the selected rules; a rule that lacks inputs is skipped with its reason, one that crashes is a rule error."""

from __future__ import annotations

import time
import traceback
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
# (kernel_ops, host_op_top ...) leaves its core to a third (32 ranks x 10 MB: -0.08 s on average
# over alternating runs; more gave nothing)
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
    exception) and notes (per-rank repeats merged)."""
    rid = spec.id
    rctx: RuleContext[Any] = RuleContext(spec, ctx, thresholds)
    t0 = time.perf_counter()
    try:
        ctx.ensure_derived(spec.derived)
        got = list(iter_findings(spec.func(rctx)))
    except Exception as exc:  # noqa: BLE001 - a broken rule must not take the others down
        if debug:
            traceback.print_exc()
        msg = f"{rid} ({spec.name}) failed: {type(exc).__name__}: {exc}" + _undeclared_hint(spec, exc)
        return RuleOutcome(rid, "error", msg, seconds=time.perf_counter() - t0), [], [Warning_("rule_error", msg)], []
    from advisor.engine.merge import merge_rank_notes

    return RuleOutcome(rid, "ran", findings=len(got), seconds=time.perf_counter() - t0), got, [], merge_rank_notes(rctx.notes)


def run_rules(ctx: AnalysisContext, cfg: Config, debug: bool = False) -> tuple[list[Finding], list[RuleOutcome]]:
    """Run every selected rule against ``ctx``; warnings for skips/errors go into ``ctx.warnings``."""
    from advisor.engine.registry import LOAD_ERRORS

    specs = discover()
    chosen = selected(specs, cfg)
    thresholds = {rid: build_thresholds(rid, s.thresholds, cfg.overrides.get(rid, {})) for rid, s in chosen.items()}

    def run(rid: str) -> tuple[str, Any]:
        """("skipped", reason) when a requirement is not met, else ("ran", _run_one's result).
        Requirements are checked here, in the worker: one on the breakdown waits for the stages
        (which may still run beside the rules) without holding up the rules that need nothing."""
        reasons = [r for r in (ctx.missing(req) for req in chosen[rid].requires) if r]
        if reasons:
            return "skipped", "; ".join(reasons)
        return "ran", _run_one(specs[rid], ctx, thresholds[rid], debug)

    # rules are independent; a few at a time keep the cores busy (their queries release the GIL),
    # and their outcomes and warnings are still recorded in rule order
    with ThreadPoolExecutor(max_workers=RULE_WORKERS) as pool:
        done = dict(zip(chosen, pool.map(run, chosen), strict=True))
    ctx.wait_stages()  # their warnings come first, as when they run before the rules
    for err in LOAD_ERRORS:
        ctx.warnings.append(Warning_("rule_error", f"rule not loaded: {err}"))
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
        if status == "skipped":
            outcomes.append(RuleOutcome(rid, "skipped", got))
            ctx.warnings.append(Warning_("rule_skipped", f"{rid} ({spec.name}) not run: {got}"))
        else:
            outcome, rule_findings, errors, rule_notes = got
            outcomes.append(outcome)
            ctx.warnings.extend(errors)
            for text in dict.fromkeys(rule_notes):
                if text not in note_rules:
                    note_rules[text], note_at[text] = [], len(ctx.warnings)
                    ctx.warnings.append(Warning_("rule_undecided", ""))  # its message is set below
                note_rules[text].append(f"{rid} ({spec.name})")
            findings.extend(rule_findings)
    for text, by in note_rules.items():
        ctx.warnings[note_at[text]] = Warning_("rule_undecided", f"{', '.join(by)}: {text}")
    if len(ctx.ranks) >= 3:
        from advisor.engine.merge import merge_per_rank

        findings = merge_per_rank(findings)
    from advisor.engine import chain
    from advisor.schema import NO_STEP

    med_steps = chain.median_steps(ctx.breakdown, NO_STEP)
    # one account of savings: no saving above the median step of the ranks a finding names
    findings = chain.cap_savings(chain.unique_ids(findings), med_steps)
    if findings and ctx.breakdown is not None and not ctx.breakdown.empty:
        from advisor.engine.explain import annotate

        steps_by_rank = {int(r): {int(s) for s in g["step"] if int(s) >= 0} for r, g in ctx.breakdown.groupby("rank")}
        try:
            findings = annotate(findings, steps_by_rank=steps_by_rank)
        except Exception as exc:  # noqa: BLE001 - cross-referencing is a nicety; never lose the findings over it
            ctx.warnings.append(Warning_("rule_error", f"cross-referencing findings failed: {type(exc).__name__}: {exc}"))
    try:
        findings = chain.link(findings)
    except Exception as exc:  # noqa: BLE001 - linking is an account of the findings; never lose them over it
        ctx.warnings.append(Warning_("rule_error", f"linking findings into chains failed: {type(exc).__name__}: {exc}"))
    findings.sort(key=lambda f: (f.estimated_saving_us is None, -(f.estimated_saving_us or 0), -f.severity, f.rule))
    return findings, outcomes
