"""Merge the same finding (or rule note) repeated rank by rank into one that names every rank.

Rules decide per rank; on a cluster the same cause often fires identically on many ranks (an AI
CPU operator, an unfused pattern), which would bury the report under copies. Findings of one
rule and cause about the same operators, each on a single rank, are merged when at least
``MIN_RANKS`` ranks share them: the merged finding keeps the evidence, saving and severity of
the worst rank, names every rank, and says how many ranks it covers.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

from advisor.model import Finding

MIN_RANKS = 3
# a title naming its rank first: "Rank 3: ...", "Rank 3 blocks ..." (group 2 set) or "Rank 3's ..." (not)
_RANK_TITLE = re.compile(r"Rank (\d+)(:\s*|\s+)?")


def _span(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")


def merge_per_rank(findings: list[Finding]) -> list[Finding]:
    """Return findings with per-rank copies merged (order is restored by the caller's sort)."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[Finding]] = defaultdict(list)
    rest: list[Finding] = []
    for f in findings:
        if len(f.ranks) == 1 and not f.explains:
            groups[(f.rule, f.cause, f.ops)].append(f)
        else:
            rest.append(f)
    out = list(rest)
    for items in groups.values():
        if len(items) < MIN_RANKS:
            out.extend(items)
            continue
        worst = max(items, key=lambda f: (f.estimated_saving_us or 0.0, f.severity))
        ranks = sorted({r for f in items for r in f.ranks})
        m = _RANK_TITLE.match(worst.title)
        if m and m.group(2) is not None:  # "Rank 3: body" or "Rank 3 verb ...": the body is about every rank
            title = f"Ranks {_span(ranks)}: {worst.title[m.end():]} (worst: rank {m.group(1)})"
        elif m:  # "Rank 3's device ...": the title speaks of the worst rank alone
            title = f"Ranks {_span(ranks)}: r{worst.title[1:]} (worst)"
        else:
            title = f"{worst.title} (and {len(ranks) - 1} more ranks: {_span(ranks)})"
        evidence = dict(worst.evidence)
        evidence["ranks_affected"] = len(ranks)
        evidence["worst_rank"] = worst.ranks[0]
        out.append(
            dataclasses.replace(
                worst,
                title=title,
                ranks=tuple(ranks),
                steps=tuple(sorted({s for f in items for s in f.steps})),
                evidence=evidence,
                severity=max(f.severity for f in items),
            )
        )
    return out


def rank_runs(ranks: list[int]) -> str:
    """Every rank, consecutive ones as a run: ``0–3, 7, 9–31``."""
    ranks = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


_RANK_NOTE = re.compile(r"rank (-?\d+): (.+)", re.DOTALL)


def merge_rank_notes(notes: list[str]) -> list[str]:
    """A rule's notes that differ only in a leading ``rank N:`` become one ``ranks ...:`` note,
    in the place of the first (a device unknown on 32 ranks is one warning, not 32)."""
    ranks: dict[str, list[int]] = {}
    order: list[str | tuple[str]] = []
    for note in notes:
        m = _RANK_NOTE.fullmatch(note)
        if m is None:
            order.append(note)
            continue
        text = m.group(2)
        if text not in ranks:
            ranks[text] = []
            order.append((text,))
        ranks[text].append(int(m.group(1)))
    out = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
        else:
            rs = ranks[item[0]]
            out.append(f"rank {rs[0]}: {item[0]}" if len(set(rs)) == 1 else f"ranks {rank_runs(rs)}: {item[0]}")
    return out


def merge_shards(per_shard: list[list[Finding]]) -> list[Finding]:
    """One finding for each (rule, cause, operators) that several shards of ranks gave (the
    per-rank map runs a rule once per shard): it names every rank of them and keeps the title,
    evidence and saving of the worst (largest saving, then severity), with ``ranks_affected``.
    A finding about a single rank is left to :func:`merge_per_rank`, as on one shard."""
    shards_of: dict[tuple[str, str, tuple[str, ...]], set[int]] = defaultdict(set)
    for i, findings in enumerate(per_shard):
        for f in findings:
            if len(f.ranks) != 1 and not f.explains:
                shards_of[(f.rule, f.cause, f.ops)].add(i)
    groups: dict[tuple[str, str, tuple[str, ...]], list[Finding]] = defaultdict(list)
    out: list[Finding] = []
    for findings in per_shard:
        for f in findings:
            key = (f.rule, f.cause, f.ops)
            if len(f.ranks) != 1 and not f.explains and len(shards_of[key]) > 1:
                groups[key].append(f)
            else:
                out.append(f)
    for items in groups.values():
        worst = max(items, key=lambda f: (f.estimated_saving_us or 0.0, f.severity))
        ranks = sorted({r for f in items for r in f.ranks})
        others = [r for r in ranks if r not in worst.ranks]
        title = worst.title
        if others:
            title = f"{worst.title} (and {len(others)} more rank{'s' * (len(others) != 1)}: {rank_runs(others)})"
        evidence = dict(worst.evidence)
        if ranks:
            evidence["ranks_affected"] = len(ranks)
        out.append(dataclasses.replace(
            worst, title=title, ranks=tuple(ranks), steps=tuple(sorted({s for f in items for s in f.steps})),
            evidence=evidence, severity=max(f.severity for f in items)))
    return out
