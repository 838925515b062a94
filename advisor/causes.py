"""The cause -> optimization map, loaded from ``rules/causes.toml`` (data, not code)."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from advisor.model import Optimization

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CAUSES_FILE = Path(__file__).resolve().parent.parent / "rules" / "causes.toml"


@dataclass(frozen=True, slots=True)
class Cause:
    """A cause id, what it means, and its ordered optimizations."""

    id: str
    meaning: str
    optimizations: tuple[Optimization, ...]


@functools.cache
def causes() -> dict[str, Cause]:
    """All causes by id."""
    data = tomllib.loads(CAUSES_FILE.read_text(encoding="utf-8"))
    out: dict[str, Cause] = {}
    for cid, body in data["causes"].items():
        opts = tuple(Optimization(o["id"], o["title"], o.get("how", "")) for o in body.get("optimizations", []))
        out[cid] = Cause(cid, body.get("meaning", ""), opts)
    return out


def optimizations_for(cause_id: str) -> tuple[Optimization, ...]:
    """Ordered optimizations for a cause (empty for an unknown cause)."""
    c = causes().get(cause_id)
    return c.optimizations if c else ()
