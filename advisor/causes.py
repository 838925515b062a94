"""The cause -> optimization map, loaded from ``rules/causes.toml`` (data, not code).

An optimization may say where it applies: ``platforms`` (a list of ``ascend``, ``cuda``, ``rocm``,
``gpu`` = any accelerator that is not Ascend, ``cpu`` = no device) keeps vendor APIs such as
``torch_npu`` off the reports of other platforms, and ``only_if_ops`` (a regular expression) keeps
advice about one mechanism (SyncBatchNorm, the caching allocator) to findings whose operators show
it. Without them an optimization applies everywhere.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from advisor.model import Optimization

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CAUSES_FILE = Path(__file__).resolve().parent.parent / "rules" / "causes.toml"


PLATFORMS = ("ascend", "cuda", "rocm", "gpu", "cpu")


@dataclass(frozen=True, slots=True)
class Applies:
    """Where an optimization applies: the platforms (empty: all) and an operator pattern (empty: any)."""

    platforms: tuple[str, ...] = ()
    only_if_ops: str = ""

    def holds(self, platform: str | None, ops: tuple[str, ...]) -> bool:
        """Whether the optimization fits a finding on ``platform`` (None: unknown) about ``ops``."""
        if self.platforms and platform is not None:
            fam = {platform} | ({"gpu"} if platform not in ("ascend", "cpu") else set())
            if not fam & set(self.platforms):
                return False
        if self.only_if_ops:
            rx = re.compile(self.only_if_ops)
            return any(rx.search(o) for o in ops)
        return True


@dataclass(frozen=True, slots=True)
class Cause:
    """A cause id, what it means, and its ordered optimizations."""

    id: str
    meaning: str
    optimizations: tuple[Optimization, ...]
    applies: tuple[Applies, ...] = ()


@functools.cache
def causes() -> dict[str, Cause]:
    """All causes by id."""
    data = tomllib.loads(CAUSES_FILE.read_text(encoding="utf-8"))
    out: dict[str, Cause] = {}
    for cid, body in data["causes"].items():
        items = body.get("optimizations", [])
        opts = tuple(Optimization(o["id"], o["title"], o.get("how", "")) for o in items)
        applies = tuple(Applies(tuple(o.get("platforms", ())), o.get("only_if_ops", "")) for o in items)
        out[cid] = Cause(cid, body.get("meaning", ""), opts, applies)
    return out


def optimizations_for(cause_id: str, platform: str | None = None, ops: tuple[str, ...] | None = None) -> tuple[Optimization, ...]:
    """Ordered optimizations for a cause (empty for an unknown cause) that fit ``platform`` (None:
    every platform's) and a finding about ``ops`` (None: no operator filter)."""
    c = causes().get(cause_id)
    if not c:
        return ()
    if platform is None and ops is None:
        return c.optimizations
    applies = c.applies or (Applies(),) * len(c.optimizations)

    def fits(a: Applies) -> bool:
        if not Applies(a.platforms).holds(platform, ()):
            return False
        return ops is None or not a.only_if_ops or a.holds(None, ops)

    return tuple(o for o, a in zip(c.optimizations, applies, strict=True) if fits(a))


_VENDOR_RE = re.compile(r"torch_npu|\bnpu_")
_VENDOR_PAREN_RE = re.compile(r"\s*\([^()]*(?:torch_npu|\bnpu_)[^()]*\)")


def for_platform(text: str, platform: str | None) -> str:
    """A rule's advice text without its Ascend-only alternatives (``torch_npu`` APIs) on another
    platform: `` / ``-separated alternatives and parenthesised asides naming them are dropped.
    Unchanged on Ascend or an unknown platform (None)."""
    if platform in (None, "ascend"):
        return text
    text = _VENDOR_PAREN_RE.sub("", text)
    kept = [p for p in text.split(" / ") if not _VENDOR_RE.search(p)]
    return " / ".join(kept) or text
