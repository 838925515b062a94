"""The profile's platform (:func:`advisor.engine.rule.platform_of`) told from its shards' parts."""

from __future__ import annotations

from typing import Any

from advisor.engine.rule import _RUNTIME_PLATFORM_SQL, platform_of

#: A shard's platform and its runtime-call counts by platform.
Parts = tuple[str | None, list[tuple[str, int]]]


def platform_parts(ctx: Any) -> Parts:
    """The shard's platform (:func:`advisor.engine.rule.platform_of`) and its runtime-call counts
    by platform, from which :func:`reduce_platform` tells the profile's."""
    platform = platform_of(ctx)
    counts: list[tuple[str, int]] = []
    if platform not in (None, "ascend", "cpu"):
        sql = _RUNTIME_PLATFORM_SQL.replace("ORDER BY n DESC LIMIT 1", "")
        counts = [(str(r["p"]), int(r["n"])) for r in ctx.query(sql)]
    return platform, counts


def reduce_platform(parts: list[Parts]) -> str | None:
    """:func:`advisor.engine.rule.platform_of` of the whole profile from its shards'."""
    known = [p for p, _ in parts]
    if not parts or None in known:
        return None
    if "ascend" in known:
        return "ascend"
    if all(p == "cpu" for p in known):
        return "cpu"
    totals: dict[str, int] = {}
    for _p, counts in parts:
        for name, n in counts:
            totals[name] = totals.get(name, 0) + n
    if not totals:
        return "gpu"
    return max(sorted(totals), key=lambda k: totals[k])
