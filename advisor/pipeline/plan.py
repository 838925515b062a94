"""Shards: consecutive ranks grouped by the size of their input files, and nothing else.

The same profile gives the same shards whatever runs them (the worker count or the engine never
enters), so every engine computes the same report.
"""

from __future__ import annotations

import os
from pathlib import Path

from advisor.ingest.base import Unit

#: Input bytes (uncompressed) of trace files per shard: consecutive ranks are grouped up to this
#: size (a rank larger than it is a shard of its own). Each shard pays a fixed cost (a DuckDB, ~30
#: rules' queries, the stages' set-up), which one rank of a few MB per shard would pay a thousand
#: times; a shard's memory, which the workers pay side by side, grows with this size.
SHARD_BYTES = 64 << 20

#: A profile of at most this many shards' worth of input is one shard: one load and one pass of the
#: rules over it cost less than the shards' fixed costs paid several times over (and the transport
#: of their summaries), and one DuckDB already keeps the cores busy while it parses and queries.
#: Larger profiles are cut into shards, which bound each map's memory.
ONE_SHARD_SHARDS = 8


def _file_size(path: Path) -> int:
    """Bytes of ``path`` once read: a gzip file's uncompressed size (its trailer holds it modulo
    2**32), any other file's size."""
    size = path.stat().st_size
    if path.suffix == ".gz" and size >= 18:
        with path.open("rb") as fh:
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
        return max(size, isize)
    return size


def unit_size(unit: Unit) -> int:
    """Bytes of a unit's files once read (a directory's files, for an export directory)."""
    total = 0
    for f in unit.files:
        try:
            total += _file_size(f) if f.is_file() else sum(_file_size(p) for p in f.rglob("*") if p.is_file())
        except OSError:
            pass
    return total


def plan_shards(units: list[Unit], max_bytes: int | None = None) -> list[list[Unit]]:
    """The units grouped by rank into shards of consecutive ranks, ascending, each holding at most
    ``max_bytes`` (default :data:`SHARD_BYTES`) of input files unless one rank alone is larger; one
    shard for a profile of at most :data:`ONE_SHARD_SHARDS` times that."""
    limit = SHARD_BYTES if max_bytes is None else max_bytes
    by_rank: dict[int, list[Unit]] = {}
    for u in sorted(units, key=lambda u: u.rank):
        by_rank.setdefault(u.rank, []).append(u)
    sizes = {rank: sum(unit_size(u) for u in us) for rank, us in by_rank.items()}
    if sum(sizes.values()) <= ONE_SHARD_SHARDS * limit:
        return [[u for _rank, us in sorted(by_rank.items()) for u in us]] if by_rank else []
    shards: list[list[Unit]] = []
    used = 0
    for rank, us in sorted(by_rank.items()):
        size = sizes[rank]
        if shards and used + size <= limit:
            shards[-1].extend(us)
            used += size
        else:
            shards.append(list(us))
            used = size
    return shards
