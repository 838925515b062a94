"""Where the maps run, and their results in shard order: the only module that opens an executor.

:func:`run_maps` runs the same map (:func:`advisor.pipeline.map.map_shard`) on the same shards in
this process one after the other (each DuckDB dropped before the next), or in this process and
worker processes side by side (spawn), or on a Dask cluster (:mod:`advisor.pipeline.executors`),
and hands each result on as soon as it and those before it are in: the three give the same report.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from typing import Any

from advisor.config import Config
from advisor.ingest.base import InputError, Unit, one_line
from advisor.pipeline.executors import (
    InDirExecutor,
    is_remote,
    lost_worker,
    lost_worker_errors,
    open_executor,
    portable,
    share_of,
)
from advisor.pipeline.map import ShardResult, map_shard
from advisor.pipeline.plan import unit_size


def pool_workers(workers: int | None, n_shards: int) -> int:
    """Processes running the maps: ``workers`` when given (at most one per shard), else one per
    core when there are at least two shards and two cores; 1 (in-process) otherwise."""
    if workers is not None:
        return max(1, min(int(workers), n_shards))
    cores = os.cpu_count() or 1
    if n_shards < 2 or cores < 2:
        return 1
    return min(cores, n_shards)


def run_maps(root: str, shards: list[list[Unit]], cfg: Config, *, workers: int, engine: str | None = None,
             rank: int | None, step: int | None, memory_limit: str | None, max_events: int | None,
             debug: bool, progress: Callable[[str, int, int], None] | None = None,
             phases: bool = False) -> Generator[ShardResult, None, None]:
    """The maps of ``shards``, in shard order (each result as soon as it and those before it are in);
    ``phases``: hand the device's busy periods to the reduce (``--metrics`` files are read there).

    ``workers`` processes run them on this machine: the main process and ``workers - 1`` spawned
    ones, each taking the next shard when it is free (the main process would otherwise only wait,
    and it has the map's modules imported already); on a Dask engine, the cluster's workers."""
    total = sum(len(s) for s in shards)
    done = 0
    parts = shard_parts(shards)
    if is_remote(engine):
        maps: Iterator[ShardResult] = _remote_maps(root, shards, cfg, engine, parts, rank=rank, step=step,
                                                   memory_limit=memory_limit, max_events=max_events, debug=debug,
                                                   phases=phases)
    elif workers > 1:
        maps = _local_maps(root, shards, cfg, workers, parts, rank=rank, step=step, memory_limit=memory_limit,
                           max_events=max_events, debug=debug, phases=phases)
    else:  # in this process: the only shard's DuckDB becomes the reduce's (its summary need not travel)
        maps = (map_shard(root, shard, cfg, rank=rank, step=step, memory_limit=memory_limit, max_events=max_events,
                          debug=debug, phases=phases, keep_db=len(shards) == 1, part=part)
                for shard, part in zip(shards, parts, strict=True))
    try:
        for shard, res in zip(shards, maps):
            yield res
            done += len(shard)
            if progress:
                progress("ingest", done, total)
    finally:
        close = getattr(maps, "close", None)
        if close is not None:
            close()


def shard_parts(shards: list[list[Unit]]) -> list[float]:
    """Each shard's share of the profile's bytes (1.0 for the only shard): a map's replays get that
    share of the replay budget's floor, so that the profile's replays cost the same however cut."""
    if len(shards) == 1:
        return [1.0]
    sizes = [sum(unit_size(u) for u in shard) for shard in shards]
    whole = sum(sizes)
    return [s / whole if whole else 1.0 / len(shards) for s in sizes]


def _lost(shard: list[Unit], exc: BaseException) -> InputError:
    """The error of a map whose worker ended under it (killed for memory, crashed, or never started)."""
    return lost_worker(f"{one_line(shard[0].label)}: the worker process reading ranks {shard[0].rank}-{shard[-1].rank}")


def _remote_maps(root: str, shards: list[list[Unit]], cfg: Config, engine: str | None, parts: list[float], *,
                 memory_limit: str | None, **kw: Any) -> Generator[ShardResult, None, None]:
    """The maps on a Dask cluster, all submitted at once (the cluster decides how many run), in
    shard order; ``memory_limit`` is shared out among the maps the cluster runs at once."""
    with open_executor(engine, None) as ex:
        assert ex is not None
        kw["memory_limit"] = share_of(memory_limit, ex.slots if isinstance(ex, InDirExecutor) else 1)
        futures: list[Future[ShardResult] | None] = [
            ex.submit(map_shard, root, [portable(u) for u in shard], cfg, part=part, **kw)
            for shard, part in zip(shards, parts, strict=True)]
        try:
            for i, shard in enumerate(shards):
                fut = futures[i]
                assert fut is not None
                futures[i] = None  # the reduce keeps what it needs of a result: the bytes go with it
                try:
                    yield fut.result()
                except lost_worker_errors() as exc:  # killed (out of memory) or crashed: no exception to pass on
                    raise _lost(shard, exc) from exc
        finally:
            for f in futures:
                if f is not None:
                    f.cancel()


class _Shards:
    """The shards handed out one at a time, in order, to whoever is free, and their outcomes
    (a result, or the exception its map raised) until they are taken in order."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.next = 0
        self.stopped = False
        self.outcomes: dict[int, tuple[ShardResult | None, BaseException | None]] = {}

    def take(self, *, main: bool = False) -> int | None:
        """The next shard nobody has taken (None when none is left, or for a worker once stopped)."""
        with self.cond:
            if self.next >= self.n or (self.stopped and not main):
                return None
            self.next += 1
            return self.next - 1

    def put(self, i: int, res: ShardResult | None, exc: BaseException | None) -> None:
        with self.cond:
            self.outcomes[i] = (res, exc)
            self.cond.notify_all()

    def ready(self, i: int) -> tuple[ShardResult | None, BaseException | None] | None:
        with self.cond:
            return self.outcomes.pop(i, None)

    def wait(self, i: int) -> tuple[ShardResult | None, BaseException | None]:
        with self.cond:
            self.cond.wait_for(lambda: i in self.outcomes)
            return self.outcomes.pop(i)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True


def _local_maps(root: str, shards: list[list[Unit]], cfg: Config, workers: int, parts: list[float], *,
                memory_limit: str | None, **kw: Any) -> Generator[ShardResult, None, None]:
    """The maps in the main process and ``workers - 1`` spawned processes side by side, in shard order.

    One thread of the main process feeds each spawned worker a shard at a time (so that no shard
    waits in a busy worker's queue while another process is free); the main process runs the next
    shard nobody has taken whenever the result it must hand on next is not in yet."""
    cores = os.cpu_count() or 1
    kw["threads"] = max(1, cores // workers)
    kw["memory_limit"] = share_of(memory_limit, workers)
    todo = _Shards(len(shards))
    with open_executor(None, workers - 1, pool_from=1) as ex:
        assert ex is not None

        def feed() -> None:
            while (i := todo.take()) is not None:
                try:
                    res = ex.submit(map_shard, root, [portable(u) for u in shards[i]], cfg, part=parts[i],
                                    **kw).result()
                except BaseException as exc:  # noqa: BLE001 -- handed on in shard order
                    todo.put(i, None, exc)
                else:
                    todo.put(i, res, None)

        feeders = [threading.Thread(target=feed, name=f"advisor-map-feed-{n}", daemon=True)
                   for n in range(workers - 1)]
        for t in feeders:
            t.start()
        try:
            for i, shard in enumerate(shards):
                outcome = todo.ready(i)
                while outcome is None:
                    j = todo.take(main=True)
                    if j is None:
                        outcome = todo.wait(i)
                        break
                    try:
                        mine = map_shard(root, shards[j], cfg, part=parts[j], **kw)
                    except Exception as exc:  # noqa: BLE001 -- raised in shard order, as in-process
                        todo.put(j, None, exc)
                    else:
                        todo.put(j, mine, None)
                    outcome = todo.ready(i)
                res, failed = outcome
                if failed is not None:
                    if isinstance(failed, lost_worker_errors()):  # killed (out of memory) or crashed
                        raise _lost(shard, failed) from failed
                    raise failed
                assert res is not None
                del outcome
                yield res
                del res
        finally:
            # no shard is queued in the pool (each feeder waits for its one): the feeders end with
            # the maps they run, then the pool's end waits for its processes to exit (a process
            # that ends with os._exit would otherwise leave them behind, unreaped)
            todo.stop()
            for t in feeders:
                t.join()
