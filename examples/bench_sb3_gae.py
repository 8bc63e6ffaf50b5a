"""Time Stable-Baselines3's ``RolloutBuffer.compute_returns_and_advantage`` against rollbuf's.

    python examples/bench_sb3_gae.py
    python examples/bench_sb3_gae.py --shapes 2048x1,32x8 --repeats 50

For each ``buffer_size × n_envs`` shape one SB3 ``RolloutBuffer`` is filled with random rewards,
values and episode starts (about 1 in 50 steps); then SB3's method (a NumPy loop over the steps)
and ``rollbuf.integrations.sb3.compute_returns_and_advantage`` (one ``rollbuf.functional.gae``
call, ``backend="auto"``: the CPU backend) are timed on it, each as SB3 calls it: the full call,
from the ``last_values`` tensor to ``advantages`` and ``returns`` written into the buffer. The table
shows the median over ``--repeats`` calls, and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer

import rollbuf
from rollbuf.integrations import sb3


def filled(T, N, seed=0):
    rng = np.random.default_rng(seed)
    buf = RolloutBuffer(T, spaces.Box(-1, 1, (4,), dtype=np.float32), spaces.Discrete(2), device="cpu",
                        gamma=0.99, gae_lambda=0.95, n_envs=N)
    buf.rewards[:] = rng.normal(size=(T, N))
    buf.values[:] = rng.normal(size=(T, N))
    buf.episode_starts[:] = rng.random((T, N)) < 0.02
    buf.pos, buf.full = T, True
    return buf, torch.as_tensor(rng.normal(size=(N, 1)), dtype=torch.float32), rng.random(N) < 0.5


def median_time(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fmt(seconds):
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None):
    import stable_baselines3

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", default="32x8,128x8,2048x1,2048x16,512x64,256x1024",
                   help="comma-separated TxN shapes (buffer_size x n_envs)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    p.add_argument("--repeats", type=int, default=30, help="timed calls (the median is shown)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (SB3's loop is single-threaded NumPy; 0 = torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores visible, torch threads {torch.get_num_threads()}; "
          f"numpy {np.__version__}, torch {torch.__version__}, stable-baselines3 {stable_baselines3.__version__}, "
          f"rollbuf {rollbuf.__version__} at commit {commit()}")
    print(f"full call against full call, median of {args.repeats} after {args.warmup} warm-up calls\n")
    print("| buffer_size × n_envs | SB3 (NumPy loop) | rollbuf | speedup | max abs diff (advantages) |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        T, N = (int(x) for x in shape.lower().split("x"))
        buf, last_values, dones = filled(T, N)
        RolloutBuffer.compute_returns_and_advantage(buf, last_values, dones)
        want = buf.advantages.copy()
        sb3.compute_returns_and_advantage(buf, last_values, dones)
        diff = float(np.abs(buf.advantages - want).max())
        t_sb3 = median_time(lambda: RolloutBuffer.compute_returns_and_advantage(buf, last_values, dones),
                            args.warmup, args.repeats)
        t_ours = median_time(lambda: sb3.compute_returns_and_advantage(buf, last_values, dones),
                             args.warmup, args.repeats)
        print(f"| {T} × {N} | {fmt(t_sb3)} | {fmt(t_ours)} | {t_sb3 / t_ours:.1f}× | {diff:.1e} |")


if __name__ == "__main__":
    main()
