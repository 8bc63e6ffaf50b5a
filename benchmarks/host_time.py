"""``python -m benchmarks host --out DIR``: the host's cost per call of a small GAE call on a GPU.

At ``benchmarks.cases.HOST_SHAPE`` (4096 × 128, fp32 rewards and values, bool terminations at 2%,
the ``[N]`` window-end values) the kernel takes a few µs of device time, so a call is host time: its
Python, the output allocation and the kernel's launch. Each call below is first checked against the
float64 oracle (the scoreboard's gate), then timed as 2000 calls back to back after 50 warm-up
calls, the clock read before the sync that ends them (best of ``--passes``):

* ``F.gae``, ``F.advantages``: ``rollbuf.functional.gae`` / ``advantages`` (a repeated call:
  validated, its launch found in the cache, launched through Triton's JIT call);
* ``Rollout.gae (adv+ret)``, ``Rollout.advantages (adv)``: the methods of a ``rollbuf.Rollout``
  filled by ``record`` and ``bootstrap`` (the same path on the rollout's fields);
* ``rl-triton compute_gae (adv)`` (when the peers are fetched), ``naive kernel (adv), Triton's
  launcher``: the competitors of the scoreboard's ``peers`` and ``naive`` grids, prepared as there.

Writes ``host.csv`` under ``--out`` (one row per call, with provenance) and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time

import torch

from benchmarks import oracles
from benchmarks.cases import HOST_SHAPE, PARAMS, Case
from benchmarks.competitors import Unsupported, naive_triton, rl_triton
from benchmarks.suite import TOLERANCE, gate_error, make_fields, provenance


def host_us(fn, passes=3, calls=2000):
    """Host µs per call: ``calls`` calls back to back after 50 warm-up calls, the clock read before
    the sync that ends them (best of ``passes``)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(passes):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / calls * 1e6)
    return best


def _rollout(f):
    """A ``Rollout`` holding ``f``, filled step by step as a trainer fills it."""
    from rollbuf import Rollout

    N, T = f["rewards"].shape
    ro = Rollout.empty(N, T, device=f["rewards"].device)
    for t in range(T):
        ro.record(t, rewards=f["rewards"][:, t], values=f["values"][:, t], terminated=f["terminated"][:, t])
    ro.bootstrap(f["bootstrap_values"])
    return ro


def calls(f) -> dict:
    """name -> (estimator whose outputs it writes, the call)."""
    from rollbuf import functional as F

    g, lam = PARAMS["gae"]["gamma"], PARAMS["gae"]["lam"]
    kw = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
              bootstrap_values=f["bootstrap_values"])
    ro = _rollout(f)
    out = {"F.gae": ("gae", lambda: F.gae(g, lam, **kw)),
           "F.advantages": ("advantages", lambda: F.advantages(g, lam, **kw)),
           "Rollout.gae (adv+ret)": ("gae", lambda: ro.gae(g, lam)),
           "Rollout.advantages (adv)": ("advantages", lambda: ro.advantages(g, lam))}
    for label, fn in (("rl-triton compute_gae (adv)", rl_triton), ("naive kernel (adv), Triton's launcher",
                                                                   naive_triton)):
        try:
            out[label] = ("advantages", fn.prepare("advantages", f, PARAMS["advantages"]))
        except Unsupported as e:
            print(f"{label}: not run ({e})")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks host", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for host.csv")
    ap.add_argument("--passes", type=int, default=3, help="passes of 2000 calls per call (best of)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the host time of a GPU call needs a CUDA GPU")
    N, T = HOST_SHAPE
    f = make_fields(Case("gae", N, T, mix="term-only"), "cuda")
    prov = provenance("cuda")
    rows = []
    for name, (est, fn) in calls(f).items():
        out = fn()
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        err = gate_error(out, oracles.outputs(est, f, **PARAMS[est]))
        row = dict(part="host", estimator="gae", n=N, t=T, competitor=name, clock="host", note=f"error {err:.1e}",
                   gpu=prov["device"], torch=prov["torch"], triton=prov["triton"], commit=prov["commit"],
                   date=prov["date"])
        if err < TOLERANCE[torch.float32]:
            row["us"] = host_us(fn, passes=args.passes)
        else:
            row["note"] += ": wrong, not timed"
        rows.append(row)
        print(f"{name:40s} {row.get('us', math.nan):8.2f} µs  ({row['note']})", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["part", "estimator", "n", "t", "competitor", "clock", "us", "note", "gpu",
                                           "torch", "triton", "commit", "date"], restval="")
        w.writeheader()
        w.writerows(rows)
    return 0 if all("us" in r for r in rows) else 1
