"""The cause registry: each cause's meaning, ordered optimizations and the causes it explains,
loaded from ``rules/causes.toml`` (data, not code) and validated once (:class:`CauseRegistry`);
a rule module may add its own causes with :func:`add_causes`.

An optimization may say where it applies: ``platforms`` (a list of ``ascend``, ``cuda``, ``rocm``,
``gpu`` = any accelerator that is not Ascend, ``cpu`` = no device) keeps vendor APIs such as
``torch_npu`` off the reports of other platforms, and ``only_if_ops`` (a regular expression) keeps
advice about one mechanism (SyncBatchNorm, the caching allocator) to findings whose operators show
it. Without them an optimization applies everywhere.

An optimization may also say when the finding's evidence supports it: ``prefer_if``, a list of
conditions ``<key> <op> <value>`` (``op`` one of ``>= <= > < == !=``, ``value`` a number, ``true``
or ``false``) on the finding's ``evidence.<name>``, ``ranks`` (ranks in the profile) or
``finding_ranks`` (ranks the finding names). The list is ordered, never cut
(:func:`order_by_evidence`): fixes whose conditions all hold first, then those without conditions
(or with a figure the finding lacks), then those the evidence speaks against, each group in the
map's order.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

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
    prefer_if: tuple[str, ...] = ()

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


# a cause id: ``bottleneck.name`` (CAUSES.md), both parts lower-case snake case
CAUSE_ID_RE = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
_CAUSE_KEYS = frozenset({"meaning", "explains", "optimizations"})
_OPTIMIZATION_KEYS = frozenset({"id", "title", "how", "platforms", "only_if_ops", "prefer_if"})
# one prefer_if condition: a key (ranks, finding_ranks, evidence.<name>), a comparison, a number or boolean
CONDITION_RE = re.compile(r"^\s*(ranks|finding_ranks|evidence\.[A-Za-z0-9_]+)\s*(>=|<=|==|!=|>|<)\s*"
                          r"(true|false|-?\d+(?:\.\d+)?)\s*$")
_COMPARE = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
            "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


class CauseError(ValueError):
    """The cause map (``rules/causes.toml`` or a cause a rule adds) is malformed."""


@dataclass(frozen=True, slots=True)
class Cause:
    """A cause id, what it means, its ordered optimizations (each with where it applies) and the
    causes a finding of this cause can explain (:mod:`advisor.engine.chain`)."""

    id: str
    meaning: str
    optimizations: tuple[Optimization, ...]
    applies: tuple[Applies, ...] = ()
    explains: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What is wrong with this cause on its own (the registry checks ``explains`` and duplicates)."""
        out: list[str] = []
        if not CAUSE_ID_RE.match(self.id):
            out.append(f"cause id {self.id!r} is not of the form bottleneck.name (lower-case snake case)")
        if self.applies and len(self.applies) != len(self.optimizations):
            out.append(f"{self.id}: {len(self.applies)} applies for {len(self.optimizations)} optimizations")
        applies = self.applies or (Applies(),) * len(self.optimizations)
        seen: dict[str, list[Applies]] = {}
        for o, a in zip(self.optimizations, applies, strict=False):
            if not o.id or not o.title:
                out.append(f"{self.id}: an optimization lacks an id or a title")
            bad = [p for p in a.platforms if p not in PLATFORMS]
            if bad:
                out.append(f"{self.id}: optimization {o.id!r}: unknown platforms {bad} (known: {', '.join(PLATFORMS)})")
            for cond in a.prefer_if:
                if not CONDITION_RE.match(cond):
                    out.append(f"{self.id}: optimization {o.id!r}: prefer_if condition {cond!r} is not "
                               "'<ranks|finding_ranks|evidence.NAME> <op> <number|true|false>'")
            if a.only_if_ops:
                try:
                    re.compile(a.only_if_ops)
                except re.error as exc:
                    out.append(f"{self.id}: optimization {o.id!r}: only_if_ops is not a regular expression: {exc}")
            # one id may appear once per platform (one text per platform), never twice on one
            for other in seen.get(o.id, []):
                if not a.platforms or not other.platforms or _overlap(a.platforms, other.platforms):
                    out.append(f"{self.id}: optimization id {o.id!r} appears twice for the same platforms")
            seen.setdefault(o.id, []).append(a)
        return out


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether two platform lists share a platform (``gpu`` covers ``cuda`` and ``rocm``)."""
    def expand(ps: tuple[str, ...]) -> set[str]:
        out = set(ps)
        if "gpu" in out:
            out |= {"cuda", "rocm"}
        return out

    return bool(expand(a) & expand(b))


@dataclass(frozen=True, slots=True)
class CauseRegistry:
    """Every cause by id, validated when built: id form, duplicate ids, ``explains`` naming known
    causes, platform vocabulary. Rules add causes with :func:`add_causes` (a new registry)."""

    by_id: Mapping[str, Cause]

    @classmethod
    def of(cls, items: Iterable[Cause]) -> CauseRegistry:
        """A validated registry of ``items`` (CauseError listing every problem otherwise)."""
        by_id: dict[str, Cause] = {}
        problems: list[str] = []
        for c in items:
            problems += c.problems()
            if c.id in by_id:
                problems.append(f"duplicate cause id {c.id!r}")
            by_id[c.id] = c
        for c in by_id.values():
            unknown = [e for e in c.explains if e not in by_id]
            if unknown:
                problems.append(f"{c.id}: explains unknown causes {unknown}")
        if problems:
            raise CauseError("; ".join(problems))
        return cls(MappingProxyType(by_id))

    @classmethod
    def from_toml(cls, text: str, source: str = "causes.toml") -> CauseRegistry:
        """Parse and validate a cause map in the ``rules/causes.toml`` format."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CauseError(f"{source}: not valid TOML: {exc}") from None
        extra = sorted(set(data) - {"causes"})
        if extra or not isinstance(data.get("causes"), dict):
            raise CauseError(f"{source}: expected only a [causes] table" + (f", found {extra}" if extra else ""))
        items: list[Cause] = []
        for cid, body in data["causes"].items():
            items.append(_cause_from_table(cid, body, source))
        try:
            return cls.of(items)
        except CauseError as exc:
            raise CauseError(f"{source}: {exc}") from None

    def __contains__(self, cause_id: object) -> bool:
        return cause_id in self.by_id

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_id)

    def __len__(self) -> int:
        return len(self.by_id)

    def __getitem__(self, cause_id: str) -> Cause:
        return self.by_id[cause_id]

    def get(self, cause_id: str) -> Cause | None:
        """The cause with this id (None when there is none)."""
        return self.by_id.get(cause_id)

    def with_causes(self, *items: Cause) -> CauseRegistry:
        """A registry with ``items`` added (validated; an id already present is an error)."""
        return CauseRegistry.of((*self.by_id.values(), *items))

    def explains_map(self) -> dict[str, tuple[str, ...]]:
        """cause id -> the causes a finding of it can explain."""
        return {cid: c.explains for cid, c in self.by_id.items()}


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CauseError(f"{what} must be a list of strings")
    return tuple(value)


def _cause_from_table(cid: str, body: object, source: str) -> Cause:
    """One ``[causes."bottleneck.name"]`` table as a Cause (CauseError on unknown keys or types)."""
    where = f"{source}: cause {cid!r}"
    if not isinstance(body, dict):
        raise CauseError(f"{where}: expected a table")
    unknown = sorted(set(body) - _CAUSE_KEYS)
    if unknown:
        raise CauseError(f"{where}: unknown keys {unknown} (known: {', '.join(sorted(_CAUSE_KEYS))})")
    meaning = body.get("meaning", "")
    if not isinstance(meaning, str):
        raise CauseError(f"{where}: meaning must be a string")
    explains = _strings(body.get("explains", []), f"{where}: explains")
    raw = body.get("optimizations", [])
    if not isinstance(raw, list):
        raise CauseError(f"{where}: optimizations must be a list of tables")
    opts: list[Optimization] = []
    applies: list[Applies] = []
    for i, o in enumerate(raw, 1):
        at = f"{where}: optimization {i}"
        if not isinstance(o, dict):
            raise CauseError(f"{at}: expected a table")
        unknown = sorted(set(o) - _OPTIMIZATION_KEYS)
        if unknown:
            raise CauseError(f"{at}: unknown keys {unknown} (known: {', '.join(sorted(_OPTIMIZATION_KEYS))})")
        for key in ("id", "title", "how", "only_if_ops"):
            if not isinstance(o.get(key, ""), str):
                raise CauseError(f"{at}: {key} must be a string")
        if "id" not in o or "title" not in o:
            raise CauseError(f"{at}: needs an id and a title")
        opts.append(Optimization(o["id"], o["title"], o.get("how", "")))
        applies.append(Applies(_strings(o.get("platforms", []), f"{at}: platforms"), o.get("only_if_ops", ""),
                               _strings(o.get("prefer_if", []), f"{at}: prefer_if")))
    return Cause(cid, meaning, tuple(opts), tuple(applies), explains)


_LOCK = threading.Lock()
_LOADED: CauseRegistry | None = None


def _loaded() -> CauseRegistry:
    """The registry, loading ``rules/causes.toml`` the first time (call with ``_LOCK`` held)."""
    global _LOADED
    if _LOADED is None:
        _LOADED = CauseRegistry.from_toml(CAUSES_FILE.read_text(encoding="utf-8"), str(CAUSES_FILE))
    return _LOADED


def registry() -> CauseRegistry:
    """The cause registry: ``rules/causes.toml`` (loaded and validated once) plus the causes rules added."""
    with _LOCK:
        return _loaded()


def add_causes(*items: Cause) -> None:
    """Add causes (a rule module's own, same ``bottleneck.name`` form; an existing id is an error)."""
    global _LOADED
    with _LOCK:
        _LOADED = _loaded().with_causes(*items)


def causes() -> CauseRegistry:
    """All causes by id (the registry)."""
    return registry()


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


def condition_holds(cond: str, evidence: Mapping[str, object], context: Mapping[str, object]) -> bool | None:
    """Whether one ``prefer_if`` condition holds for a finding's evidence and context (``ranks``,
    ``finding_ranks``); None when the figure it names is missing or not a number / boolean."""
    m = CONDITION_RE.match(cond)
    if not m:
        return None
    key, op, raw = m.groups()
    value = evidence.get(key[len("evidence."):]) if key.startswith("evidence.") else context.get(key)
    if isinstance(value, bool):
        got: float = float(value)
    elif isinstance(value, (int, float)):
        got = float(value)
    else:
        return None
    want = 1.0 if raw == "true" else 0.0 if raw == "false" else float(raw)
    return bool(_COMPARE[op](got, want))


def order_by_evidence(cause_id: str, optimizations: Iterable[Optimization], evidence: Mapping[str, object],
                      context: Mapping[str, object]) -> tuple[Optimization, ...]:
    """``optimizations`` (a finding's, from the map) reordered by what its evidence supports: those
    whose ``prefer_if`` conditions all hold, then those without conditions or whose figures are
    missing, then those a condition fails for; the map's order within each group. None is dropped."""
    opts = tuple(optimizations)
    c = causes().get(cause_id)
    if not c or not c.applies:
        return opts
    conds = {(o.id, o.title): a.prefer_if for o, a in zip(c.optimizations, c.applies, strict=True)}

    def group(o: Optimization) -> int:
        cs = conds.get((o.id, o.title), ())
        if not cs:
            return 1
        got = [condition_holds(x, evidence, context) for x in cs]
        if any(g is False for g in got):
            return 2
        return 0 if all(g is True for g in got) else 1

    return tuple(sorted(opts, key=group))
