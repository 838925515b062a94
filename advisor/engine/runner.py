"""Run the selected rules; a rule that lacks inputs is skipped with its reason, one that crashes is a rule error."""

from __future__ import annotations

import time
import traceback
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


def run_rules(ctx: AnalysisContext, cfg: Config, debug: bool = False) -> tuple[list[Finding], list[RuleOutcome]]:
    """Run every selected rule against ``ctx``; warnings for skips/errors go into ``ctx.warnings``."""
    from advisor.engine.registry import LOAD_ERRORS

    specs = discover()
    for err in LOAD_ERRORS:
        ctx.warnings.append(Warning_("rule_error", f"rule not loaded: {err}"))
    chosen = selected(specs, cfg)
    thresholds = {rid: build_thresholds(rid, s.thresholds, cfg.overrides.get(rid, {})) for rid, s in chosen.items()}
    findings: list[Finding] = []
    outcomes: list[RuleOutcome] = []
    for rid, spec in specs.items():
        if rid not in chosen:
            outcomes.append(RuleOutcome(rid, "not_selected"))
            continue
        reasons = [r for r in (ctx.missing(req) for req in spec.requires) if r]
        if reasons:
            reason = "; ".join(reasons)
            outcomes.append(RuleOutcome(rid, "skipped", reason))
            ctx.warnings.append(Warning_("rule_skipped", f"{rid} ({spec.name}) not run: {reason}"))
            continue
        rctx: RuleContext[Any] = RuleContext(spec, ctx, thresholds[rid])
        t0 = time.perf_counter()
        try:
            got = list(iter_findings(spec.func(rctx)))
        except Exception as exc:  # a broken rule must not take the others down
            if debug:
                traceback.print_exc()
            msg = f"{rid} ({spec.name}) failed: {type(exc).__name__}: {exc}"
            outcomes.append(RuleOutcome(rid, "error", msg, seconds=time.perf_counter() - t0))
            ctx.warnings.append(Warning_("rule_error", msg))
            continue
        for note in rctx.notes:
            ctx.warnings.append(Warning_("rule_undecided", f"{rid} ({spec.name}): {note}"))
        findings.extend(got)
        outcomes.append(RuleOutcome(rid, "ran", findings=len(got), seconds=time.perf_counter() - t0))
    if len(ctx.ranks) >= 3:
        from advisor.engine.merge import merge_per_rank

        findings = merge_per_rank(findings)
    if findings and ctx.breakdown is not None and not ctx.breakdown.empty:
        from advisor.engine.explain import annotate

        steps_by_rank = {int(r): {int(s) for s in g["step"] if int(s) >= 0} for r, g in ctx.breakdown.groupby("rank")}
        try:
            findings = annotate(findings, steps_by_rank=steps_by_rank)
        except Exception as exc:  # cross-referencing is a nicety; never lose the findings over it
            ctx.warnings.append(Warning_("rule_error", f"cross-referencing findings failed: {type(exc).__name__}: {exc}"))
    findings.sort(key=lambda f: (f.estimated_saving_us is None, -(f.estimated_saving_us or 0), -f.severity, f.rule))
    return findings, outcomes
