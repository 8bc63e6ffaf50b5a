"""``python -m benchmarks memory``: peak extra device memory of one call (the aim: the outputs,
nothing else).

    python -m benchmarks memory [--out DIR] [--device cpu]

For each case of ``benchmarks.cases.MEMORY_CASES`` (every kernel strategy: tiles of short rows, rows
walked in chunks, rows split across programs with the look-back chain, a single row in three passes,
time-major tiles and time-major split tiles; masked rows) it measures, with the caching allocator's
statistics, the peak memory allocated during a call beyond what was allocated before it, on the
first call (which also creates the per-device split workspace, kept for later calls) and on a
second call, and the bytes of the outputs the call returns, each rounded up to the 512-byte blocks
the caching allocator hands out (a ``[1]`` carry takes 512 bytes). A second call whose extra memory
is no more than that meets the aim. Needs CUDA; ``--device cpu`` is a dry run of the same cases at
3 × 37 under Triton's interpreter (calls and output sizes only, no memory statistics). Table last,
``memory.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os

import attrs
import torch

from benchmarks.cases import MEMORY_CASES, PARAMS, Case
from benchmarks.competitors import COMPETITORS
from benchmarks.suite import interpreted, make_fields, provenance


def measure(case: Case, device: str) -> dict:
    f = make_fields(case, device)
    call = COMPETITORS["rollbuf-triton"]
    cuda = device != "cpu"
    row = dict(estimator=case.estimator, n=case.n, t=case.t, mix=case.mix, layout=case.layout)
    for i in (1, 2):
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        outs = call(case.estimator, f, PARAMS[case.estimator])
        if cuda:
            torch.cuda.synchronize()
        row[f"extra_call{i}"] = torch.cuda.max_memory_allocated() - base if cuda else -1
        row["output_bytes"] = sum(o.numel() * o.element_size() for o in outs)
        row["output_alloc_bytes"] = sum(-(-o.numel() * o.element_size() // 512) * 512 for o in outs)
        del outs
    row["met"] = 0 <= row["extra_call2"] <= row["output_alloc_bytes"]
    del f
    if cuda:
        torch.cuda.empty_cache()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks memory", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for memory.csv")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run at 3 x 37 (Triton's interpreter)")
    args = ap.parse_args(argv)
    if args.device == "cpu":  # tensors on the CPU through backend="triton": Triton's interpreter
        rc = interpreted("memory", argv)
        if rc is not None:
            return rc
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("the memory experiment measures device memory: it needs a CUDA GPU (or --device cpu)")
    prov = provenance(args.device)
    dry = args.device == "cpu"
    rows = [dict(measure(attrs.evolve(c, n=3, t=37) if dry else c, args.device), **prov) for c in MEMORY_CASES]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "memory.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    mib = 2**20
    print("| estimator | N × T | mix | layout | outputs MiB | extra, 1st call MiB | extra, 2nd call MiB | P4 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['estimator']} | {r['n']} × {r['t']} | {r['mix']} | {r['layout']} | "
              f"{r['output_bytes'] / mib:.2f} | {r['extra_call1'] / mib:.2f} | {r['extra_call2'] / mib:.2f} | "
              f"{'met' if r['met'] else 'not met'} |")
    return 0
