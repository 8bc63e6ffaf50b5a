"""Time TorchRL's value estimators against rollbuf's drop-ins: full module call against full call.

    python examples/bench_torchrl_gae.py                 # CUDA if available, else the CPU
    python examples/bench_torchrl_gae.py --device cpu --shapes 64x128,256x1024

The defaults depend on the device (``--device cpu --help`` shows the CPU's): on a CPU the shapes of
the CPU table of docs/howto/torchrl.md (16x128, 256x128, 1024x128, 64x1024), one torch thread and the
median of 15 calls; on CUDA the GPU table's shapes (16384x8, 4096x128, 1024x1024, 512x4096), torch's
threads and the median of 20 calls; 3 warm-up calls on both.

For each ``[N, T]`` shape, one collector-shaped TensorDict (``"state_value"``,
``("next", "state_value")``, ``("next", "reward")``, ``("next", "done")``,
``("next", "terminated")`` with terminations and truncations, ``[N, T, 1]``, float32) is made on the
device, and each estimator is called on it as a TorchRL training loop calls it
(``value_network=None``: the values are already in the TensorDict). Every call is a full call: the
module's Python, its checks, the estimator and the writes of ``"advantage"`` and ``"value_target"``,
timed from before the call to after a device synchronisation; the table shows the median over
``--repeats`` calls after ``--warmup``. The last column is the largest difference between the two
advantages (the drop-in must give TorchRL's numbers). Versions and the device are printed first.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from tensordict import TensorDict

import rollbuf
from rollbuf.integrations import torchrl as rt


def collector_td(N, T, device, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(N, T, 1, generator=g) < 0.02
    term = done & (torch.rand(N, T, 1, generator=g) < 0.5)
    v = torch.randn(N, T, 1, generator=g, dtype=dtype)
    final = torch.randn(N, T, 1, generator=g, dtype=dtype)
    nv = torch.where(done, final, torch.cat([v[:, 1:], final[:, -1:]], 1))
    td = TensorDict({
        "state_value": v,
        "next": {"reward": torch.randn(N, T, 1, generator=g, dtype=dtype), "done": done, "terminated": term,
                 "truncated": done & ~term, "state_value": nv},
    }, batch_size=[N, T])
    return td.to(device)


def time_call(fn, device, warmup, repeats):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fmt(seconds):
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def commit():
    if os.environ.get("ROLLBUF_COMMIT"):  # set where the checkout's git metadata is not the code's (a copied tree)
        return os.environ["ROLLBUF_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# the defaults per device type: those of the tables in docs/howto/torchrl.md
DEFAULTS = {
    "cpu": dict(shapes="16x128,256x128,1024x128,64x1024", repeats=15, threads=1),
    "cuda": dict(shapes="16384x8,4096x128,1024x1024,512x4096", repeats=20, threads=0),
}


def parse_args(argv=None):
    """The arguments; ``--shapes``, ``--repeats`` and ``--threads`` default to ``DEFAULTS`` of the
    device's type (``--device`` is read first)."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(first.parse_known_args(argv)[0].device)
    d = DEFAULTS.get(device.type, DEFAULTS["cpu"])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default=str(device), help="torch device (the other defaults follow its type)")
    p.add_argument("--shapes", default=d["shapes"], help="comma-separated NxT shapes ([num_envs, horizon])")
    p.add_argument("--estimators", default="GAE,TDLambdaEstimator", help="comma-separated class names")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    p.add_argument("--repeats", type=int, default=d["repeats"], help="timed calls (the median is shown)")
    p.add_argument("--threads", type=int, default=d["threads"], help="torch.set_num_threads (0: torch's default)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    import torchrl
    from torchrl.objectives import value as tv

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"device: {device} ({name}); torch {torch.__version__}, torchrl {torchrl.__version__}, "
          f"rollbuf {rollbuf.__version__} at commit {commit()}; float32, value_network=None, "
          f"torch threads {torch.get_num_threads()}")
    print(f"full module call against full call, median of {args.repeats} after {args.warmup} warm-up calls\n")
    print("| estimator | N × T | TorchRL | rollbuf drop-in | speedup | max abs diff (advantage) |")
    print("|---|---|---|---|---|---|")
    for est in args.estimators.split(","):
        for shape in args.shapes.split(","):
            N, T = (int(x) for x in shape.lower().split("x"))
            td = collector_td(N, T, device)
            theirs = getattr(tv, est)(gamma=0.99, lmbda=0.95, value_network=None, device=device)
            ours = getattr(rt, est)(gamma=0.99, lmbda=0.95, value_network=None, device=device)
            a, b = theirs(td.clone()), ours(td.clone())
            diff = float((a["advantage"] - b["advantage"]).abs().max())
            t_theirs = time_call(lambda: theirs(td), device, args.warmup, args.repeats)
            t_ours = time_call(lambda: ours(td), device, args.warmup, args.repeats)
            print(f"| {est} | {N} × {T} | {fmt(t_theirs)} | {fmt(t_ours)} | {t_theirs / t_ours:.1f}× | {diff:.1e} |")


if __name__ == "__main__":
    main()
