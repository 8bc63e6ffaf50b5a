"""Peak extra device memory of one call (target P4: the outputs, nothing else).

    python -m rollbuf.bench --experiment memory [--out DIR] [--device cpu]

For each case (every strategy: tiles of short rows, rows walked in chunks, rows split across
programs with the look-back chain, a single row in three passes, time-major tiles and time-major
split tiles; masked rows) it measures, with the caching allocator's statistics, the peak memory
allocated during a call beyond what was allocated before it, on the first call (which also creates
the per-device split workspace, kept for later calls) and on a second call, and the bytes of the
outputs the call returns, each rounded up to the 512-byte blocks the caching allocator hands out (a
``[1]`` carry takes 512 bytes). A second call whose extra memory is no more than that meets P4.
Needs CUDA; ``--device cpu`` is a dry run of the same cases at 3 × 37 (calls and output sizes only,
no memory statistics). Table last, CSV under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os

import torch

from rollbuf.bench.competitors import COMPETITORS
from rollbuf.bench.suite import PARAMS, Case, make_fields, provenance

CASES = [  # (estimator, N, T, mix, layout): the strategy each one takes, in the comment
    ("gae", 32768, 8, "term+trunc", "env"),  # tiles of short rows
    ("gae", 4096, 128, "term+trunc", "env"),
    ("gae", 16384, 4096, "term+trunc", "env"),  # rows walked in chunks
    ("gae", 256, 1 << 20, "term+trunc", "env"),  # split rows, look-back chain
    ("gae", 1, 1 << 20, "term+trunc", "env"),  # one row: three passes
    ("gae", 1, 1 << 24, "term+trunc", "env"),
    ("gae", 256, 1 << 20, "mask", "env"),
    ("vtrace", 1, 1 << 20, "term+trunc", "env"),
    ("vtrace", 256, 131072, "term+trunc", "env"),
    ("retrace", 1, 1 << 20, "term+trunc", "env"),
    ("eligibility_traces", 1, 1 << 20, "term+trunc", "env"),
    ("gae", 4096, 128, "term+trunc", "time"),  # time-major 16 x T tiles
    ("gae", 512, 4096, "term+trunc", "time"),  # time-major split tiles, look-back chain
    ("gae", 1024, 1024, "term+trunc", "time"),
    ("vtrace", 512, 4096, "term+trunc", "time"),
]


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
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment memory",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run at 3 x 37 (Triton's interpreter)")
    args = ap.parse_args(argv)
    if args.device == "cpu":  # tensors on the CPU through backend="triton": Triton's interpreter
        from rollbuf.bench.experiments._common import interpreted

        rc = interpreted("rollbuf.bench.experiments.memory", argv)
        if rc is not None:
            return rc
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("the memory experiment measures device memory: it needs a CUDA GPU (or --device cpu)")
    prov = provenance(args.device)
    dry = args.device == "cpu"
    rows = [dict(measure(Case(e, 3 if dry else n, 37 if dry else t, mix=m, layout=lay), args.device), **prov)
            for e, n, t, m, lay in CASES]
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


if __name__ == "__main__":
    raise SystemExit(main())
