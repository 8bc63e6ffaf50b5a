"""Device time of the turn-level estimators against the token-level masked GAE on the same rows.

    python -m benchmarks.turn_device --out DIR [--size 256 131072] [--turns 120]

At ``size`` (rows × tokens, ~``turns`` turns per row: runs of model tokens between tool replies),
``torch.profiler`` over ten calls each of ``compute_gae_advantage_return`` (masked, the token level),
``turn_returns`` and ``turn_gae`` (their defaults: the turn kernels on a GPU), per kernel; and the turn
GAE's outputs against the torch path's. Writes ``turn_device.csv``; prints the table last. CUDA only.
"""

from __future__ import annotations

import argparse
import csv
import os

import torch


def main(argv=None) -> int:
    from benchmarks.clocks import kernel_times
    from benchmarks.llm_agents import provenance, turn_batch
    from rollbuf.integrations import llm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, nargs=2, default=(256, 131072))
    ap.add_argument("--turns", type=int, default=120)
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    (B, L), turns = args.size, args.turns
    r, v, m = turn_batch(B, L, turns, "cuda", g)
    rows = []
    for name, fn in (("masked_gae", lambda: llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95)),
                     ("turn_returns", lambda: llm.turn_returns(r, m, 0.99)),
                     ("turn_gae", lambda: llm.turn_gae(r, v, m, 0.99, 0.95))):
        per: dict = {}
        for k, t in kernel_times(fn, reps=10, warmup=3).items():  # names cut to 28 characters, summed
            per[k[:28]] = per.get(k[:28], 0.0) + t
        per = {k: t for k, t in per.items() if t > 0}
        rows.append((name, sum(per.values()), per))
    a, b = llm.turn_gae(r, v, m, 0.99, 0.95), llm.turn_gae(r, v, m, 0.99, 0.95, backend="torch")
    diff = max(float((a[0] - b[0]).abs().max()), float((a[1] - b[1]).abs().max()))
    prov = provenance("cuda")
    os.makedirs(args.out, exist_ok=True)
    base = rows[0][1]
    with open(os.path.join(args.out, "turn_device.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["case", "size", "device_us", "x_masked_gae", "kernels", *prov])
        for name, tot, per in rows:
            w.writerow([name, f"{B}x{L}", f"{tot:.1f}", f"{tot / base:.3f}",
                        "; ".join(f"{k} {t:.1f}" for k, t in per.items()), *prov.values()])
    print(f"device us per call at {B} x {L} ({', '.join(f'{k}={x}' for k, x in prov.items())})")
    for name, tot, per in rows:
        kernels = ", ".join(f"{k} {t:.1f}" for k, t in per.items())
        print(f"{name:14s} {tot:9.1f} us  {tot / base:5.2f}x masked GAE  {kernels}")
    print(f"turn_gae against the torch path: max abs diff {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
