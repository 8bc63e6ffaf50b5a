"""What the experiments share: the results folder, provenance, the copy bandwidth, and the
synthetic inputs of the kernel experiments (1% terminations, 1% truncations, a finite
``bootstrap_values`` at every step, so that gradients reach every slot)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: The committed results (CSVs and GPU test logs) of the checkout: ``benchmarks/results/``.
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def provenance(device="cuda") -> dict:
    """device, torch, triton, commit, date (``ROLLBUF_COMMIT`` overrides the git commit)."""
    from rollbuf.bench.suite import provenance as prov

    return prov(device)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (1 GiB of fp32 copied, ``do_bench`` median)."""
    from triton.testing import do_bench

    a = torch.empty(2**28, device="cuda").uniform_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def make_inputs(N, T, dtype, trunc, seed, device="cuda") -> dict:
    """Random ``[N, T]`` fields: rewards, values, 1% terminated, 1% truncated (or None), a finite
    bootstrap value at every step, log-probabilities, Q-values; ``x`` = rewards."""
    g = torch.Generator(device=device).manual_seed(seed)
    r = torch.randn(N, T, device=device, generator=g).to(dtype)
    v = torch.randn(N, T, device=device, generator=g).to(dtype)
    k = torch.rand(N, T, device=device, generator=g) < 0.01
    tr = (torch.rand(N, T, device=device, generator=g) < 0.01) if trunc else None
    bv = torch.randn(N, T, device=device, generator=g).to(dtype)
    lp = (torch.randn(N, T, device=device, generator=g) * 0.3).to(dtype)
    tlp = (lp.float() + torch.randn(N, T, device=device, generator=g) * 0.1).to(dtype)
    q = torch.randn(N, T, device=device, generator=g).to(dtype)
    return dict(rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, log_probs=lp,
                target_log_probs=tlp, q_values=q, x=r)


def out_dir(default=".") -> str:
    return os.environ.get("OUT", default)


def interpreted(module: str, argv) -> int | None:
    """Triton's interpreter must be chosen before rollbuf's kernels are imported. When
    ``TRITON_INTERPRET=1`` is set already, returns None (run here); otherwise runs
    ``python -m module argv`` with it set and returns its exit status."""
    import subprocess
    import sys

    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    argv = sys.argv[1:] if argv is None else list(argv)
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.call([sys.executable, "-m", module, *argv], env=env)
