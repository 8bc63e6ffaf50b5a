"""``python -m benchmarks distributed``: what rollbuf.distributed's exchange costs next to the
local work, per rank.

    python -m benchmarks distributed --world 2 [--n 16 --t 65536] [--estimator gae] [--nccl]

Starts ``--world`` processes (gloo on the CPU, or NCCL with one GPU per rank), shards ``[n, t]``
rows evenly in time, and reports, per rank (median of ``--iters`` calls, the slowest rank):

* ``all_gather``: the collective alone, on a payload of the size the estimator sends;
* ``local``: ``rollbuf.functional`` on the rank's shard with a given carry (no exchange);
* ``distributed``: ``rollbuf.distributed`` on the shard (map + exchange + local run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

K = {"gae": 4, "vtrace": 8}  # payload numbers per row (docs/distributed.md)


def _fields(n, t, seed, device):
    g = torch.Generator().manual_seed(seed)
    f = dict(rewards=torch.randn(n, t, generator=g), values=torch.randn(n, t, generator=g),
             terminated=torch.rand(n, t, generator=g) < 0.001,
             log_probs=-torch.rand(n, t, generator=g), target_log_probs=-torch.rand(n, t, generator=g))
    f = {k: v.to(device) for k, v in f.items()}
    f["bootstrap_values"] = torch.randn(n, generator=g).to(device)
    return f


def _worker(rank, world, init, args, out):
    import torch.distributed as dist

    import rollbuf.distributed as D
    import rollbuf.functional as F

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cuda", rank) if args.nccl else torch.device("cpu")
    if args.nccl:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.nccl else "gloo", init_method=f"file://{init}",
                            rank=rank, world_size=world)
    t_r = args.t // world
    f = _fields(args.n, t_r, rank, device)
    extra = {}
    if args.estimator == "vtrace":
        extra = dict(target_log_probs=f.pop("target_log_probs"))
    else:
        f.pop("log_probs"), f.pop("target_log_probs")
    carry = torch.zeros((args.n, 2) if args.estimator == "vtrace" else (args.n,), device=device)
    payload = torch.zeros(args.n, K[args.estimator], device=device)
    bufs = [torch.empty_like(payload) for _ in range(world)]
    fn_d, fn_f = getattr(D, args.estimator), getattr(F, args.estimator)
    first = (0.99,) if args.estimator == "vtrace" else (0.99, 0.95)

    def sync():
        if args.nccl:
            torch.cuda.synchronize()

    def timed(call):
        times = []
        for i in range(args.iters + 3):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    kw = {k: v for k, v in f.items() if k != "bootstrap_values"}
    res = {
        "all_gather": timed(lambda: dist.all_gather(bufs, payload)),
        "local": timed(lambda: fn_f(*extra.values(), *first, **kw, carry=carry)),
        "distributed": timed(lambda: fn_d(*extra.values(), *first, **f)),
    }
    t = torch.tensor([res[k] for k in res], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out, "w") as fh:
            fh.write(" ".join(f"{v:.6g}" for v in t.tolist()))
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks distributed", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="processes (ranks)")
    ap.add_argument("--n", type=int, default=16, help="rows")
    ap.add_argument("--t", type=int, default=65536, help="steps, over all ranks")
    ap.add_argument("--estimator", choices=sorted(K), default="gae")
    ap.add_argument("--iters", type=int, default=20, help="timed calls (median)")
    ap.add_argument("--nccl", action="store_true", help="NCCL with one GPU per rank (default: gloo on the CPU)")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    d = tempfile.mkdtemp()
    out = os.path.join(d, "res")
    mp.start_processes(_worker, args=(args.world, os.path.join(d, "init"), args, out),
                       nprocs=args.world, start_method="spawn")
    with open(out) as fh:
        ag, local, dist_ = (float(x) for x in fh.read().split())
    backend = "nccl" if args.nccl else "gloo"
    payload = args.n * K[args.estimator] * 4
    print(f"| {backend} | {args.world} | {args.estimator} | {args.n}x{args.t} | {payload} B/rank | "
          f"{ag * 1e6:.0f} µs | {local * 1e3:.2f} ms | {dist_ * 1e3:.2f} ms |")

    return 0
