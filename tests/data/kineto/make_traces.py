#!/usr/bin/env python
"""Record small, real PyTorch profiler (Kineto) traces with planted causes.

Usage:
    python tests/data/kineto/make_traces.py                 # record every scenario
    python tests/data/kineto/make_traces.py cpu_healthy ... # record only these
    python tests/data/kineto/make_traces.py --summary [scenario ...]
                                                           # only print facts

Recorded with torch==2.13.0 (CPU wheel, ``pip install torch==2.13.0``) on a
2-core machine without a GPU.  Every scenario lives in its own directory next
to this script and holds one or more ``*.pt.trace.json.gz`` files.  Recording a
scenario first deletes the old trace files of that scenario.

Seeds are fixed (torch, random), so the models, data and shape sequences are
the same on every run; timings of course are not.  See README.md for the
planted causes and the facts measured on the committed traces.
"""

from __future__ import annotations

import gc
import glob
import gzip
import io
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader, Dataset, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def scenario_dir(name: str) -> str:
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    for f in glob.glob(os.path.join(d, "*.pt.trace.json*")):
        os.remove(f)
    return d


def fixed_name_handler(path: str):
    """on_trace_ready that writes one trace to a fixed, deterministic path."""

    def handler(prof) -> None:
        prof.export_chrome_trace(path)  # ".gz" suffix => gzip-compressed

    return handler


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)


def mlp(width: int, depth: int, out: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


def train_step(model, opt, x, y, loss_fn=nn.functional.cross_entropy):
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = loss_fn(out, y)
    loss.backward()
    opt.step()
    return loss


# --------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------

def cpu_healthy() -> None:
    """Control: few long ops per step, in-memory data, no syncs, fixed shapes."""
    d = scenario_dir("cpu_healthy")
    seed_all(0)
    torch.set_num_threads(2)
    model = mlp(1024, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n_iter, batch = 8, 256
    xs = torch.randn(n_iter * batch, 1024)
    ys = torch.randint(0, 10, (n_iter * batch,))
    # The whole batch is fetched with one __getitem__ call (BatchSampler as
    # sampler, batch_size=None), so loading is a handful of ops per step.
    ds = TensorDataset(xs, ys)
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(ds), batch_size=batch, drop_last=True
    )
    loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=0)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=fixed_name_handler(os.path.join(d, "cpu_healthy.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for x, y in loader:
            train_step(model, opt, x, y)
            prof.step()


class SlowDataset(Dataset):
    """Each __getitem__ sleeps SLEEP_S seconds (simulated slow decode)."""

    SLEEP_S = 0.003

    def __init__(self, n: int, rows: int, dim: int):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, rows, dim, generator=g)
        self.y = torch.randint(0, 10, (n, rows), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.SLEEP_S)
        return self.x[i], self.y[i]


def cpu_slow_dataloader() -> None:
    d = scenario_dir("cpu_slow_dataloader")
    seed_all(0)
    torch.set_num_threads(2)
    batch, n_iter = 10, 8
    model = mlp(1024, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # each sample is 8 rows x 1024 features; a batch is 10 samples = 80 rows
    loader = DataLoader(SlowDataset(batch * n_iter, 8, 1024), batch_size=batch,
                        shuffle=False, num_workers=0)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=fixed_name_handler(
            os.path.join(d, "cpu_slow_dataloader.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for x, y in loader:
            train_step(model, opt, x.flatten(0, 1), y.flatten())
            prof.step()


def cpu_host_sync() -> None:
    """Every step: 3x loss.item(), 3x torch.nonzero(...), 3x .tolist()."""
    d = scenario_dir("cpu_host_sync")
    seed_all(0)
    torch.set_num_threads(2)
    model = mlp(1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 128, 8
    xs = torch.randn(n_iter, batch, 1024)
    ys = torch.randint(0, 10, (n_iter, batch))
    history: list[float] = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=fixed_name_handler(os.path.join(d, "cpu_host_sync.pt.trace.json.gz")),
        record_shapes=True,
        with_stack=True,
    ) as prof:
        for it in range(n_iter):
            x, y = xs[it], ys[it]
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            history.append(loss.item())            # sync 1 (aten::item)
            loss.backward()
            for k in range(3):
                idx = torch.nonzero(out[:, k] > 0)  # sync: aten::nonzero
                _ = idx.flatten().tolist()         # sync: tolist
            history.append(loss.item())            # sync 2
            opt.step()
            history.append(loss.item())            # sync 3
            prof.step()


def cpu_python_gc() -> None:
    """Lots of cyclic Python garbage per step, so the cyclic GC runs often."""
    d = scenario_dir("cpu_python_gc")
    seed_all(0)
    torch.set_num_threads(2)
    gc.enable()
    model = mlp(1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 256, 10
    xs = torch.randn(n_iter, batch, 1024)
    ys = torch.randint(0, 10, (n_iter, batch))
    n_nodes = GC_NODES_PER_STEP
    gc.collect()  # start from a clean heap / zeroed generation counters
    cfg = torch._C._profiler._ExperimentalConfig(record_python_gc_info=True)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=8),
        on_trace_ready=fixed_name_handler(os.path.join(d, "cpu_python_gc.pt.trace.json.gz")),
        record_shapes=True,
        # Python GC events are only emitted by the Python tracer, i.e. only
        # with with_stack=True (verified on torch 2.13.0).
        with_stack=True,
        experimental_config=cfg,
    ) as prof:
        for it in range(n_iter):
            # Per-step "bookkeeping" that builds a graph of n_nodes dicts with
            # reference cycles and drops it at the end of the step.  No
            # Python-level calls inside the loop (the Python tracer would
            # record each one), only dict/list literals and item stores.
            graph = [None] * n_nodes
            prev = {}
            for i in range(n_nodes):
                node = {"prev": prev, "payload": [i, i, i]}
                prev["next"] = node
                graph[i] = node
                prev = node
            del graph, prev, node
            train_step(model, opt, xs[it], ys[it])
            prof.step()


GC_NODES_PER_STEP = 20_000


def cpu_dynamic_shapes() -> None:
    """Batch size and sequence length change every step (random, seeded)."""
    d = scenario_dir("cpu_dynamic_shapes")
    seed_all(0)
    torch.set_num_threads(2)
    rng = random.Random(1234)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n_iter = 10
    shapes = [(rng.choice(range(4, 33, 4)), rng.choice(range(16, 257, 16)))
              for _ in range(n_iter)]
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=8),
        on_trace_ready=fixed_name_handler(
            os.path.join(d, "cpu_dynamic_shapes.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for b, t in shapes:
            x = torch.randn(b, t, 128)
            target = torch.randn(b, t, 128)
            train_step(model, opt, x, target, nn.functional.mse_loss)
            prof.step()
    print("  (batch, seq_len) per iteration:", shapes)


def cpu_dispatch_bound() -> None:
    """Thousands of tiny elementwise ops on 8-element tensors per step."""
    d = scenario_dir("cpu_dispatch_bound")
    seed_all(0)
    torch.set_num_threads(2)
    n_iter = 6
    w = torch.full((8,), 0.99, requires_grad=True)
    b = torch.zeros(8, requires_grad=True)
    opt = torch.optim.SGD([w, b], lr=0.01)
    xs = torch.randn(n_iter, 8)
    scale = torch.full((8,), 1.0001)  # tensor operands: no scalar->tensor wraps
    shift = torch.full((8,), 0.0001)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=4),
        on_trace_ready=fixed_name_handler(
            os.path.join(d, "cpu_dispatch_bound.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for it in range(n_iter):
            # "feature engineering": DISPATCH_PRE tiny no-grad ops
            with torch.no_grad():
                x = xs[it].clone()
                for _ in range(DISPATCH_PRE // 2):
                    x = x.mul(scale)
                    x = x.add(shift)
            # tiny recurrent model: DISPATCH_RNN steps of (mul, add, tanh)
            opt.zero_grad(set_to_none=True)
            h = x
            for _ in range(DISPATCH_RNN):
                h = torch.tanh(h * w + b)
            loss = h.pow(2).mean()
            loss.backward()
            opt.step()
            prof.step()


DISPATCH_PRE = 1000
DISPATCH_RNN = 80


def cpu_step_fluctuation() -> None:
    """10 active steps; the 7th active step (ProfilerStep#8) checkpoints."""
    d = scenario_dir("cpu_step_fluctuation")
    seed_all(0)
    torch.set_num_threads(2)
    model = mlp(1024, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 256, 12
    xs = torch.randn(n_iter, batch, 1024)
    ys = torch.randint(0, 10, (n_iter, batch))
    big = torch.randn(4 * 1024 * 1024)  # 16 MB of "optimizer state"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=10),
        on_trace_ready=fixed_name_handler(
            os.path.join(d, "cpu_step_fluctuation.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for it in range(n_iter):
            train_step(model, opt, xs[it], ys[it])
            if it == 8:  # 7th active step: wait=#0, warmup=#1, active=#2..#11
                with record_function("checkpoint"):
                    buf = io.BytesIO()
                    torch.save({"model": model.state_dict(), "state": big}, buf)
                    time.sleep(0.2)
            prof.step()


def _gloo_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size)
    seed_all(0)
    model = DDP(mlp(512, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 128, 8
    g = torch.Generator().manual_seed(100 + rank)
    xs = torch.randn(n_iter, batch, 512, generator=g)
    ys = torch.randint(0, 10, (n_iter, batch), generator=g)
    a = torch.randn(256, 256, generator=g)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=fixed_name_handler(
            os.path.join(out_dir, f"rank{rank}.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for it in range(n_iter):
            if rank == 1:
                # straggler: extra compute before the step's forward/backward
                with record_function("extra_compute"):
                    acc = a
                    for _ in range(GLOO_EXTRA_MM):
                        acc = torch.mm(acc, a).tanh_()
            train_step(model, opt, xs[it], ys[it])
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


GLOO_EXTRA_MM = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_slow_rank() -> None:
    import torch.multiprocessing as mp

    d = scenario_dir("gloo_slow_rank")
    mp.spawn(_gloo_worker, args=(2, _free_port(), d), nprocs=2, join=True)


def cpu_multi_cycle() -> None:
    """One rank, schedule repeat=2 + tensorboard_trace_handler => 2 files."""
    d = scenario_dir("cpu_multi_cycle")
    seed_all(0)
    torch.set_num_threads(2)
    model = mlp(1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 256, 8
    xs = torch.randn(n_iter, batch, 1024)
    ys = torch.randint(0, 10, (n_iter, batch))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(
            d, worker_name="worker0", use_gzip=True),
        record_shapes=True,
    ) as prof:
        for it in range(n_iter):
            train_step(model, opt, xs[it], ys[it])
            prof.step()


def cpu_no_step_marker() -> None:
    """Plain `with profile(...)`, no schedule, no prof.step()."""
    d = scenario_dir("cpu_no_step_marker")
    seed_all(0)
    torch.set_num_threads(2)
    model = mlp(1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 256, 5
    xs = torch.randn(n_iter, batch, 1024)
    ys = torch.randint(0, 10, (n_iter, batch))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for it in range(n_iter):
            train_step(model, opt, xs[it], ys[it])
    prof.export_chrome_trace(os.path.join(d, "cpu_no_step_marker.pt.trace.json.gz"))


SCENARIOS = {
    "cpu_healthy": cpu_healthy,
    "cpu_slow_dataloader": cpu_slow_dataloader,
    "cpu_host_sync": cpu_host_sync,
    "cpu_python_gc": cpu_python_gc,
    "cpu_dynamic_shapes": cpu_dynamic_shapes,
    "cpu_dispatch_bound": cpu_dispatch_bound,
    "cpu_step_fluctuation": cpu_step_fluctuation,
    "gloo_slow_rank": gloo_slow_rank,
    "cpu_multi_cycle": cpu_multi_cycle,
    "cpu_no_step_marker": cpu_no_step_marker,
}


# --------------------------------------------------------------------------
# independent verification straight from the raw JSON
# --------------------------------------------------------------------------

def load(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _inside(e, s) -> bool:
    return e["ts"] >= s["ts"] and e["ts"] + e.get("dur", 0) <= s["ts"] + s["dur"]


def summarize_file(path: str) -> None:
    t = load(path)
    ev = t["traceEvents"]
    top = {k: v for k, v in t.items() if k != "traceEvents"}
    print(f"== {os.path.relpath(path, HERE)}  ({os.path.getsize(path)} bytes gz)")
    print("  top-level:", json.dumps(top)[:400])
    print("  events by cat:", dict(Counter(e.get("cat") for e in ev)))
    steps = sorted((e for e in ev if e.get("name", "").startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    print("  steps:", [(e["name"].split("#")[1], round(e["dur"] / 1000, 1)) for e in steps])
    scen = os.path.basename(os.path.dirname(path))
    per_step = defaultdict(dict)
    for s in steps:
        n = s["name"].split("#")[1]
        inner = [e for e in ev if e.get("ph") == "X" and e is not s and _inside(e, s)
                 and e.get("tid") == s.get("tid")]
        ops = [e for e in inner if e.get("cat") == "cpu_op"]
        per_step[n]["cpu_ops"] = len(ops)
        dl = [e for e in inner if e["name"].startswith("enumerate(DataLoader)")]
        per_step[n]["dataloader_ms"] = round(sum(e["dur"] for e in dl) / 1000, 2)
        if scen == "cpu_host_sync":
            c = Counter(e["name"] for e in ops)
            per_step[n].update({k: c[k] for k in ("aten::item", "aten::_local_scalar_dense",
                                                  "aten::nonzero")})
        if scen == "cpu_python_gc":
            gcs = [e for e in inner if e["name"] == "Python GC"]
            per_step[n]["gc_n"] = len(gcs)
            per_step[n]["gc_ms"] = round(sum(e["dur"] for e in gcs) / 1000, 2)
            per_step[n]["gc_over_10ms"] = [round(e["dur"] / 1000, 1) for e in gcs
                                           if e["dur"] > 10_000]
        if scen == "cpu_dynamic_shapes":
            mm = [e for e in ops if e["name"] == "aten::addmm"]
            per_step[n]["addmm_dims"] = mm[0]["args"].get("Input Dims") if mm else None
        if scen == "cpu_step_fluctuation":
            ck = [e for e in inner if e["name"] == "checkpoint"]
            per_step[n]["checkpoint_ms"] = round(sum(e["dur"] for e in ck) / 1000, 1)
        if scen == "gloo_slow_rank":
            ex = [e for e in inner if e["name"] == "extra_compute"]
            per_step[n]["extra_compute_ms"] = round(sum(e["dur"] for e in ex) / 1000, 1)
            # gloo:all_reduce runs on a pt_gloo_runloop thread: match by start
            ar = sorted((e for e in ev if e.get("name") == "gloo:all_reduce"
                         and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]),
                        key=lambda e: e["ts"])
            per_step[n]["gloo_all_reduce_ms"] = [round(e["dur"] / 1000, 1) for e in ar]
            per_step[n]["gloo_all_reduce_numel"] = [e["args"]["Input Dims"][0][0] for e in ar]
            # main-thread busy time: union of top-level ops/annotations
            tops = sorted((e for e in inner if e.get("cat") in ("cpu_op", "user_annotation")),
                          key=lambda e: e["ts"])
            busy, end = 0.0, s["ts"]
            for e in tops:
                a, b = max(e["ts"], end), e["ts"] + e["dur"]
                if b > a:
                    busy += b - a
                    end = b
            per_step[n]["main_thread_busy_ms"] = round(busy / 1000, 1)
        if s["dur"]:
            per_step[n]["dataloader_share"] = round(
                per_step[n]["dataloader_ms"] * 1000 / s["dur"], 3)
    for n, v in per_step.items():
        print(f"  step {n}: {v}")
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    if not steps:
        print("  no ProfilerStep; cpu_ops:", len(ops),
              "span_ms:", round((max(e["ts"] + e["dur"] for e in ops)
                                 - min(e["ts"] for e in ops)) / 1000, 1))
        t0 = min(e["ts"] for e in ops)
        print("  user_annotations (name, start ms, dur ms):",
              [(e["name"], round((e["ts"] - t0) / 1000, 1), round(e["dur"] / 1000, 2))
               for e in sorted((e for e in ev if e.get("cat") == "user_annotation"),
                               key=lambda e: e["ts"])])
    # top-level cpu_ops (not nested in another cpu_op), per step
    top, end = [], -1.0
    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            top.append(e)
            end = e["ts"] + e["dur"]
    if top and steps:
        td = sorted(e["dur"] for e in top)
        print(f"  top-level cpu_ops per step: {len(top) / len(steps):.0f}, "
              f"median dur {td[len(td) // 2]:.2f} us, "
              f"sum per step {sum(td) / len(steps) / 1000:.2f} ms")
    if scen == "cpu_dynamic_shapes":
        dims = defaultdict(set)
        for e in ops:
            dims[e["name"]].add(json.dumps(e["args"].get("Input Dims")))
        print("  distinct Input Dims:", {k: len(dims[k]) for k in
                                         ("aten::linear", "aten::addmm", "aten::mm",
                                          "aten::relu", "aten::mse_loss")})
    if scen == "cpu_step_fluctuation":
        ck = [e for e in ev if e.get("name") == "checkpoint"]
        for c in ck:
            inn = [e for e in ops if c["ts"] <= e["ts"] <= c["ts"] + c["dur"]]
            print(f"  checkpoint {c['dur'] / 1000:.1f} ms holds {len(inn)} cpu_ops "
                  f"{dict(Counter(e['name'] for e in inn))} "
                  f"summing {sum(e['dur'] for e in inn) / 1000:.2f} ms")
    if scen == "cpu_python_gc":
        gcs = sorted(e["dur"] for e in ev if e.get("name") == "Python GC")
        print(f"  Python GC events: {len(gcs)}, median {gcs[len(gcs) // 2]:.1f} us, "
              f"max {gcs[-1] / 1000:.1f} ms, total {sum(gcs) / 1000:.1f} ms")


def summarize(names) -> None:
    for name in names:
        for p in sorted(glob.glob(os.path.join(HERE, name, "*.pt.trace.json.gz"))):
            summarize_file(p)


def main(argv: list[str]) -> None:
    only_summary = "--summary" in argv
    names = [a for a in argv if not a.startswith("--")] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario(s): {unknown}; known: {list(SCENARIOS)}")
    if "--in-process" in argv:  # internal: record exactly one scenario here
        SCENARIOS[names[0]]()
        return
    if not only_summary:
        print("torch", torch.__version__)
        for n in names:
            # one fresh interpreter per scenario, so no scenario inherits heap,
            # thread-pool or profiler state from another
            print("recording", n, flush=True)
            subprocess.run([sys.executable, os.path.abspath(__file__), n, "--in-process"],
                           check=True)
    summarize(names)



# --------------------------------------------------------------------------
# scenarios added for the CPU rules (CPU001 compilation, CPU005 contention)
# --------------------------------------------------------------------------

RECOMPILE_BATCHES = (8, 16, 24, 32, 40, 48, 56, 64)


def cpu_torch_recompile() -> None:
    """torch.compile(dynamic=False) with a new batch size every step: a recompile per step.

    The aot_eager backend needs no C++ compiler, so this records on any CPU machine; the
    Dynamo/AOTAutograd compile markers (``entire_frame_compile``, ``... (dynamo_timed)``,
    ``Torch-Compiled Region: 0/N``) are the same as with inductor.
    """
    import torch._dynamo

    d = scenario_dir("cpu_torch_recompile")
    seed_all(0)
    torch.set_num_threads(2)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=fixed_name_handler(os.path.join(d, "cpu_torch_recompile.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for b in RECOMPILE_BATCHES:
            x = torch.randn(b, 64)
            opt.zero_grad(set_to_none=True)
            loss = compiled(x).pow(2).mean()
            loss.backward()
            opt.step()
            prof.step()


CONTENTION_ITERS = (5, 6, 7)  # iterations (= ProfilerStep numbers) run next to CPU hogs
CONTENTION_HOGS = 4


def cpu_contention() -> None:
    """Healthy MLP loop; during steps #5-#7 four busy-loop processes compete for the 2 cores."""
    d = scenario_dir("cpu_contention")
    seed_all(0)
    torch.set_num_threads(2)
    model = mlp(1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, n_iter = 256, 10
    xs = torch.randn(n_iter, batch, 1024)
    ys = torch.randint(0, 10, (n_iter, batch))
    hogs: list[subprocess.Popen] = []
    try:
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=8),
            on_trace_ready=fixed_name_handler(os.path.join(d, "cpu_contention.pt.trace.json.gz")),
            record_shapes=True,
        ) as prof:
            for it in range(n_iter):
                if it == CONTENTION_ITERS[0]:
                    hogs = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"])
                            for _ in range(CONTENTION_HOGS)]
                if it == CONTENTION_ITERS[-1] + 1:
                    for h in hogs:
                        h.kill()
                    for h in hogs:
                        h.wait()
                    hogs = []
                train_step(model, opt, xs[it], ys[it])
                prof.step()
    finally:
        for h in hogs:
            h.kill()
            h.wait()


SCENARIOS.update({"cpu_torch_recompile": cpu_torch_recompile, "cpu_contention": cpu_contention})



# --------------------------------------------------------------------------
# scenario added for the parallel rules (PAR002 pipeline bubble)
# --------------------------------------------------------------------------

PIPE_WIDTH, PIPE_DEPTH, PIPE_BATCH = 1024, 3, 256


def _gloo_pipeline_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Two-stage pipeline, ONE micro-batch per step (GPipe with m = 1): each stage idles in recv."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size)
    seed_all(0)
    layers: list[nn.Module] = []
    for _ in range(PIPE_DEPTH):
        layers += [nn.Linear(PIPE_WIDTH, PIPE_WIDTH), nn.ReLU()]
    stage = nn.Sequential(*layers)
    opt = torch.optim.SGD(stage.parameters(), lr=0.01)
    n_iter = 8
    g = torch.Generator().manual_seed(200)
    xs = torch.randn(n_iter, PIPE_BATCH, PIPE_WIDTH, generator=g)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=6),
        on_trace_ready=fixed_name_handler(
            os.path.join(out_dir, f"rank{rank}.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for it in range(n_iter):
            opt.zero_grad(set_to_none=True)
            if rank == 0:  # first stage: forward, send activations, wait for their gradient
                act = stage(xs[it])
                dist.send(act.detach(), 1)
                grad = torch.empty_like(act)
                dist.recv(grad, 1)
                act.backward(grad)
            else:  # last stage: wait for activations, forward + loss + backward, send the gradient back
                inp = torch.empty(PIPE_BATCH, PIPE_WIDTH)
                dist.recv(inp, 0)
                inp.requires_grad_()
                stage(inp).pow(2).mean().backward()
                dist.send(inp.grad, 0)
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def gloo_pipeline_bubble() -> None:
    import torch.multiprocessing as mp

    d = scenario_dir("gloo_pipeline_bubble")
    mp.spawn(_gloo_pipeline_worker, args=(2, _free_port(), d), nprocs=2, join=True)


SCENARIOS.update({"gloo_pipeline_bubble": gloo_pipeline_bubble})


# --------------------------------------------------------------------------
# scenario added for the computation rules (CMP003 affinity APIs)
# --------------------------------------------------------------------------

UNFUSED_LAYERS, UNFUSED_DIM, UNFUSED_HEADS, UNFUSED_SEQ, UNFUSED_BATCH = 1, 64, 4, 32, 4


class _UnfusedBlock(nn.Module):
    """A pre-norm transformer block written with generic ops: hand-made RMSNorm, rotate-half RoPE,
    matmul-softmax-matmul attention (with an explicit transpose + contiguous), SiLU-times-gate MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)
        self.n1 = nn.Parameter(torch.ones(dim))
        self.n2 = nn.Parameter(torch.ones(dim))

    @staticmethod
    def rms(x, w):  # RMSNorm by hand: pow -> mean -> add -> rsqrt -> mul (-> mul)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    @staticmethod
    def rope(x, cos, sin):  # rotate-half RoPE: slice, slice, neg, cat, mul, mul, add
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.rms(x, self.n1)
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)  # matmul -> softmax -> matmul
        o = (att @ v).transpose(1, 2).contiguous().view(b, s, d)  # transpose -> contiguous copy
        x = x + self.proj(o)
        h = self.rms(x, self.n2)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))  # silu -> mul


def cpu_unfused_transformer() -> None:
    """Tiny transformer with unfused RMSNorm / RoPE / SwiGLU / attention and a per-parameter AdamW."""
    d = scenario_dir("cpu_unfused_transformer")
    seed_all(0)
    torch.set_num_threads(2)
    dim, heads, seq = UNFUSED_DIM, UNFUSED_HEADS, UNFUSED_SEQ
    blocks = nn.ModuleList(_UnfusedBlock(dim, heads) for _ in range(UNFUSED_LAYERS))
    head = nn.Linear(dim, 10)
    params = [*blocks.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)  # one set of per-tensor ops per parameter
    pos = torch.arange(seq).float()[:, None] * torch.arange(dim // heads).float()[None, :] / (dim // heads)
    cos, sin = pos.cos(), pos.sin()
    xs = torch.randn(8, UNFUSED_BATCH, seq, dim)
    ys = torch.randint(0, 10, (8, UNFUSED_BATCH))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3),
        on_trace_ready=fixed_name_handler(os.path.join(d, "cpu_unfused_transformer.pt.trace.json.gz")),
        record_shapes=True,
    ) as prof:
        for it in range(5):
            opt.zero_grad(set_to_none=True)
            x = xs[it]
            for blk in blocks:
                x = blk(x, cos, sin)
            nn.functional.cross_entropy(head(x.mean(1)), ys[it]).backward()
            opt.step()
            prof.step()


SCENARIOS.update({"cpu_unfused_transformer": cpu_unfused_transformer})


if __name__ == "__main__":
    main(sys.argv[1:])
