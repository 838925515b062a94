#!/usr/bin/env python
"""Record twins: one small job with a planted cause, and the same job with the cause fixed.

Usage:
    python tests/data/twins/make_twins.py                   # record every twin (both sides)
    python tests/data/twins/make_twins.py slow_dataloader   # record only these twins
    python tests/data/twins/make_twins.py --summary [twin]  # only print the measured figures

Recorded with torch==2.13.0 (CPU wheel, ``pip install torch==2.13.0``) on a 2-core machine without
a GPU, with the helpers of ``tests/data/kineto/make_traces.py``.  Each side of a twin runs in a fresh
interpreter and writes ``<twin>/{cause,fixed}/*.pt.trace.json.gz`` next to this script (the old
traces of that side are deleted first).  The two sides run the same code with the same seeds; only
the planted cause differs (``fixed`` is the only argument that changes).  ``--summary`` prints, per
side, the mean ``ProfilerStep#N`` duration (per step, the slowest rank's) read from the raw JSON, and
the step change the fix measured.  See README.md for the figures of the committed traces.
"""

from __future__ import annotations

import gc
import glob
import gzip
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kineto"))

import torch
from make_traces import _free_port, fixed_name_handler, mlp, seed_all, train_step
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset


def side_dir(twin: str, fixed: bool) -> str:
    d = os.path.join(HERE, twin, "fixed" if fixed else "cause")
    os.makedirs(d, exist_ok=True)
    for f in glob.glob(os.path.join(d, "*.pt.trace.json*")):
        os.remove(f)
    return d


#: the job every single-process twin trains: an MLP of 2x Linear(512, 512) + Linear(512, 10) on
#: batches of 128 rows (about 6 ms a step on one thread here), one intra-op thread
WIDTH, DEPTH, BATCH = 512, 2, 128


def _trace(d: str, name: str = "trace") -> object:
    return fixed_name_handler(os.path.join(d, f"{name}.pt.trace.json.gz"))


# --------------------------------------------------------------------------
# slow data loader: num_workers=0 and a costly __getitem__ / the batch ready
# --------------------------------------------------------------------------

class _Samples(Dataset):
    """``rows x dim`` samples; with ``decode_s`` each ``__getitem__`` first spends that long (a decode)."""

    def __init__(self, n: int, rows: int, dim: int, decode_s: float) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, rows, dim, generator=g)
        self.y = torch.randint(0, 10, (n, rows), generator=g)
        self.decode_s = decode_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.decode_s:
            time.sleep(self.decode_s)
        return self.x[i], self.y[i]


def slow_dataloader(fixed: bool) -> None:
    """Cause: each of the 8 samples (16 rows) of a batch takes 4 ms to decode in the training process
    (num_workers=0). Fixed: the samples are already decoded (the loader only collates)."""
    d = side_dir("slow_dataloader", fixed)
    seed_all(0)
    torch.set_num_threads(1)
    batch, n_iter = 8, 10
    model = mlp(WIDTH, DEPTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(_Samples(batch * n_iter, BATCH // batch, WIDTH, 0.0 if fixed else 0.004),
                        batch_size=batch, shuffle=False, num_workers=0)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=8),
                 on_trace_ready=_trace(d), record_shapes=True) as prof:
        for x, y in loader:
            train_step(model, opt, x.flatten(0, 1), y.flatten())
            prof.step()


# --------------------------------------------------------------------------
# .item() in the loop / the loss kept on the device
# --------------------------------------------------------------------------

def host_sync(fixed: bool) -> None:
    """Cause: ``loss.item()`` three times per step. Fixed: the loss is kept as a tensor
    (``loss.detach()``), read after the loop."""
    d = side_dir("host_sync", fixed)
    seed_all(0)
    torch.set_num_threads(1)
    model = mlp(WIDTH, DEPTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = BATCH, 7
    xs = torch.randn(n_iter, batch, WIDTH)
    ys = torch.randint(0, 10, (n_iter, batch))
    history: list[object] = []
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=5),
                 on_trace_ready=_trace(d), record_shapes=True, with_stack=True) as prof:
        for it in range(n_iter):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(xs[it]), ys[it])
            history.append(loss.detach() if fixed else loss.item())
            loss.backward()
            history.append(loss.detach() if fixed else loss.item())
            opt.step()
            history.append(loss.detach() if fixed else loss.item())
            prof.step()


# --------------------------------------------------------------------------
# GC pressure: cyclic garbage with the collector on / off
# --------------------------------------------------------------------------

GC_NODES_PER_STEP = 20_000


def python_gc(fixed: bool) -> None:
    """Each step builds and drops a graph of 20,000 dicts with reference cycles. Cause: the cyclic
    GC is on. Fixed: ``gc.freeze()`` after set-up and ``gc.disable()`` (the same garbage is built)."""
    d = side_dir("python_gc", fixed)
    seed_all(0)
    torch.set_num_threads(1)
    model = mlp(WIDTH, DEPTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = BATCH, 8
    xs = torch.randn(n_iter, batch, WIDTH)
    ys = torch.randint(0, 10, (n_iter, batch))
    gc.collect()
    if fixed:
        gc.freeze()
        gc.disable()
    cfg = torch._C._profiler._ExperimentalConfig(record_python_gc_info=True)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=6),
                 on_trace_ready=_trace(d), record_shapes=True, with_stack=True,
                 experimental_config=cfg) as prof:
        for it in range(n_iter):
            graph = [None] * GC_NODES_PER_STEP
            prev: dict = {}
            for i in range(GC_NODES_PER_STEP):
                node = {"prev": prev, "payload": [i, i, i]}
                prev["next"] = node
                graph[i] = node
                prev = node
            del graph, prev, node
            train_step(model, opt, xs[it], ys[it])
            prof.step()


# --------------------------------------------------------------------------
# tiny ops: one op per 8-element tensor / the same math on the stacked tensor
# --------------------------------------------------------------------------

TINY_TENSORS, TINY_ROUNDS = 100, 15


def tiny_ops(fixed: bool) -> None:
    """Per step, 100 feature vectors of 8 elements get 15 rounds of ``x * scale + shift`` (no grad),
    then the MLP trains on its batch. Cause: one mul and one add per vector and round (3000 tiny
    ops). Fixed: the same math on the stacked 100x8 tensor (30 ops). Recorded without shapes, to
    keep the cause's file small."""
    d = side_dir("tiny_ops", fixed)
    seed_all(0)
    torch.set_num_threads(1)
    n_iter = 5
    model = mlp(WIDTH, DEPTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = torch.randn(n_iter, BATCH, WIDTH)
    ys = torch.randint(0, 10, (n_iter, BATCH))
    feats = torch.randn(n_iter, TINY_TENSORS, 8)
    scale, shift = torch.full((8,), 1.0001), torch.full((8,), 0.0001)
    kept = []
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=_trace(d)) as prof:
        for it in range(n_iter):
            with torch.no_grad():
                if fixed:
                    f = feats[it].clone()
                    for _ in range(TINY_ROUNDS):
                        f = f.mul(scale).add(shift)
                else:
                    vecs = list(feats[it].clone().unbind(0))
                    for _ in range(TINY_ROUNDS):
                        vecs = [v.mul(scale).add(shift) for v in vecs]
                    f = torch.stack(vecs)
            kept.append(f)
            train_step(model, opt, xs[it], ys[it])
            prof.step()


# --------------------------------------------------------------------------
# dynamic shapes: torch.compile recompiles for every new batch size / compiled dynamic once
# --------------------------------------------------------------------------

DYN_BATCHES = (8, 16, 24, 32, 40, 48, 56)


def dynamic_shapes(fixed: bool) -> None:
    """A new batch size every step through ``torch.compile(backend="aot_eager")``. Cause: the batch
    dimension is static, so every step recompiles. Fixed: the batch dimension is marked dynamic
    (``torch._dynamo.mark_dynamic``), so the one compile happens in the first (unrecorded) step."""
    import torch._dynamo

    d = side_dir("dynamic_shapes", fixed)
    seed_all(0)
    torch.set_num_threads(1)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(b, 64, generator=g) for b in DYN_BATCHES]
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=5),
                 on_trace_ready=_trace(d), record_shapes=True) as prof:
        for x in xs:
            if fixed:
                torch._dynamo.mark_dynamic(x, 0)
            opt.zero_grad(set_to_none=True)
            compiled(x).pow(2).mean().backward()
            opt.step()
            prof.step()


# --------------------------------------------------------------------------
# one-step outlier: one step sleeps 200 ms more / it does not
# --------------------------------------------------------------------------

def step_outlier(fixed: bool) -> None:
    """8 recorded steps of the MLP. Cause: in ProfilerStep#6, a ``checkpoint`` range sleeps 200 ms
    after the train step. Fixed: no checkpoint range."""
    d = side_dir("step_outlier", fixed)
    seed_all(0)
    torch.set_num_threads(1)
    model = mlp(WIDTH, DEPTH)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = BATCH, 10
    xs = torch.randn(n_iter, batch, WIDTH)
    ys = torch.randint(0, 10, (n_iter, batch))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=8),
                 on_trace_ready=_trace(d), record_shapes=True) as prof:
        for it in range(n_iter):
            train_step(model, opt, xs[it], ys[it])
            if it == 6 and not fixed:
                with record_function("checkpoint"):
                    time.sleep(0.2)
            prof.step()


# --------------------------------------------------------------------------
# gloo, 2 ranks: a straggler rank; small DDP buckets
# --------------------------------------------------------------------------

GLOO_EXTRA_MM = 40


def _gloo_worker(rank: int, world: int, port: int, out_dir: str, twin: str, fixed: bool) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    seed_all(0)
    if twin == "ddp_buckets":
        # 16 layers of 64x64: 32 gradient tensors, 0.27 MB; 10 KB buckets hold one weight (16 KB) each
        net = nn.Sequential(*[m for _ in range(16) for m in (nn.Linear(64, 64), nn.ReLU())])
        model = DDP(net, bucket_cap_mb=25 if fixed else 0.01)
        width = 64
    else:
        model = DDP(mlp(512, 2))
        width = 512
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 64, 7 if twin == "ddp_buckets" else 10
    g = torch.Generator().manual_seed(100 + rank)
    xs = torch.randn(n_iter, batch, width, generator=g)
    ys = torch.randint(0, 10, (n_iter, batch), generator=g) if twin != "ddp_buckets" else None
    a = torch.randn(256, 256, generator=g)
    # shapes only where the rule reads message sizes (the buckets' all-reduce), to keep files small
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=n_iter - 2),
                 on_trace_ready=_trace(out_dir, f"rank{rank}"), record_shapes=twin == "ddp_buckets") as prof:
        for it in range(n_iter):
            if twin == "straggler" and rank == 1 and not fixed:
                with record_function("extra_compute"):
                    acc = a
                    for _ in range(GLOO_EXTRA_MM):
                        acc = torch.mm(acc, a).tanh_()
            if twin == "ddp_buckets":
                opt.zero_grad(set_to_none=True)
                model(xs[it]).pow(2).mean().backward()
                opt.step()
            else:
                train_step(model, opt, xs[it], ys[it])
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def _gloo(twin: str, fixed: bool) -> None:
    import torch.multiprocessing as mp

    d = side_dir(twin, fixed)
    mp.spawn(_gloo_worker, args=(2, _free_port(), d, twin, fixed), nprocs=2, join=True)


def straggler(fixed: bool) -> None:
    """DDP over gloo, 2 ranks. Cause: rank 1 runs 40 extra 256x256 matmuls before each step's
    forward. Fixed: it does not."""
    _gloo("straggler", fixed)


def ddp_buckets(fixed: bool) -> None:
    """DDP over gloo, 2 ranks, 16 layers of 64x64. Cause: ``bucket_cap_mb=0.01``, an all-reduce per
    weight. Fixed: 25 MB buckets (one all-reduce)."""
    _gloo("ddp_buckets", fixed)


#: the sides whose planted cause makes the steps uneven on purpose (a spike, GC passes, compiles)
UNEVEN = {("step_outlier", "cause"), ("python_gc", "cause"), ("dynamic_shapes", "cause")}
#: a side is re-recorded (up to ``TRIES`` times) while its steps spread more than this share of
#: their median ((max - min) / median): other processes on the shared 2-core machine, not the job
STEADY_SPREAD, TRIES = 0.3, 4


GLOO = {"straggler", "ddp_buckets"}


def spread(side: str) -> float:
    v = sorted(step_durations(side).values())
    return (v[-1] - v[0]) / v[len(v) // 2] if v else 0.0


def _uneven(twin: str, fixed: bool) -> bool:
    s = "fixed" if fixed else "cause"
    sp = spread(os.path.join(HERE, twin, s))
    if (twin, s) in UNEVEN or sp <= STEADY_SPREAD:
        return False
    print(f"  {twin}/{s}: steps spread {sp:.0%} of their median: recording again", flush=True)
    return True


TWINS = {f.__name__: f for f in (slow_dataloader, host_sync, python_gc, tiny_ops, dynamic_shapes,
                                  step_outlier, straggler, ddp_buckets)}


# --------------------------------------------------------------------------
# the measured figures, from the raw JSON
# --------------------------------------------------------------------------

def step_durations(side: str) -> dict[str, float]:
    """ProfilerStep#N -> its duration (us), per step the slowest rank's (one file per rank)."""
    out: dict[str, float] = defaultdict(float)
    for p in sorted(glob.glob(os.path.join(side, "*.pt.trace.json.gz"))):
        with gzip.open(p, "rt") as fh:
            ev = json.load(fh)["traceEvents"]
        for e in ev:
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                out[e["name"]] = max(out[e["name"]], float(e["dur"]))
    return dict(out)


def summarize(names: list[str]) -> None:
    for name in names:
        means = {}
        for s in ("cause", "fixed"):
            side = os.path.join(HERE, name, s)
            steps = step_durations(side)
            sizes = [round(os.path.getsize(p) / 1024, 1) for p in sorted(glob.glob(os.path.join(side, "*.gz")))]
            means[s] = sum(steps.values()) / len(steps) if steps else float("nan")
            print(f"{name}/{s}: steps (ms) {[round(v / 1000, 1) for v in steps.values()]} "
                  f"mean {means[s] / 1000:.2f} ms; files KB {sizes}")
        print(f"{name}: measured change {(means['cause'] - means['fixed']) / 1000:.2f} ms")


def main(argv: list[str]) -> None:
    names = [a for a in argv if not a.startswith("--")] or list(TWINS)
    unknown = [n for n in names if n not in TWINS]
    if unknown:
        sys.exit(f"unknown twin(s): {unknown}; known: {list(TWINS)}")
    if "--in-process" in argv:  # internal: one side of one twin here
        TWINS[names[0]]("--fixed" in argv)
        return
    if "--summary" not in argv:
        print("torch", torch.__version__)
        for n in names:
            # the single-process twins record both sides at once, one process each, so both see the
            # same load from other processes; the gloo twins (two processes a side) one after the other
            together = n not in GLOO
            for t in range(TRIES):
                if t:
                    uneven = [_uneven(n, f) for f in (False, True)]  # both checked, both said
                    if not any(uneven):
                        break
                print("recording", n, f"(try {t + 1})", flush=True)
                run = [[sys.executable, os.path.abspath(__file__), n, "--in-process", *(["--fixed"] if f else [])]
                       for f in (False, True)]
                if together:
                    procs = [subprocess.Popen(c) for c in run]
                    if any(p.wait() for p in procs):
                        sys.exit(f"recording {n} failed")
                else:
                    for c in run:
                        subprocess.run(c, check=True)
    summarize(names)


if __name__ == "__main__":
    main(sys.argv[1:])
