"""LLM-RL GAE on the GPU: verl's multi-turn token loop against rollbuf.llm; table last, CSV under $OUT.

    python -m rollbuf.bench --experiment llm-gpu [--sizes 8x8192,...] [--out DIR]

Same inputs as the ``llm-cpu`` experiment (multi-turn rows with tool spans and trailing padding,
float32, γ = 1, λ = 0.95). Per size:

* **loop (GPU)** / **loop (CPU)**: verl's multi-turn ``compute_gae_advantage_return`` loop as written
  (one token per Python iteration, batched torch ops), on CUDA tensors and on the host's CPU; one
  call each (they take seconds), synchronised;
* **rollbuf**: ``rollbuf.llm.compute_gae_advantage_return(..., backend="triton")``: full call
  (``triton.testing.do_bench`` median) and device time (CUDA-graph replay); the same with bf16
  rewards/values, with ``whiten=True``, and ``packed_gae`` on the tokens packed into one row;
* **rollbuf CPU**: the ``torch`` backend on the host CPU (best of 3), the path for frameworks that
  compute advantages on the driver;
* **err**: max |rollbuf − loop| over model tokens (both float32).
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import torch

from rollbuf.integrations import llm
from rollbuf.bench.experiments._common import provenance
from rollbuf.bench.experiments.llm_cpu import make_batch, verl_multi_turn_gae
from rollbuf.bench.suite import time_cuda  # do_bench median; CUDA-graph device time


def wall(fn, reps=1):
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment llm-gpu")
    ap.add_argument("--sizes", default="8x8192,64x32768,256x131072")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-cpu-loop", action="store_true")
    args = ap.parse_args(argv)
    gamma, lam = 1.0, 0.95
    prov = dict(provenance(), cpus=os.cpu_count(), threads=torch.get_num_threads())
    rows = []
    for B, T in [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]:
        r_c, v_c, m_c = make_batch(B, T)
        r, v, m = r_c.cuda(), v_c.cuda(), m_c.cuda()
        mf = m.float()
        call = lambda: llm.compute_gae_advantage_return(r, v, m, gamma, lam, backend="triton")  # noqa: E731
        adv, _ = call()
        out = {}
        t_loop = wall(lambda: out.__setitem__("adv", verl_multi_turn_gae(r, v, mf, gamma, lam)[0]))
        err = (adv - out["adv"])[m].abs().max().item()
        del out
        t_call, t_dev, _ = time_cuda([call])
        rb, vb = r.bfloat16(), v.bfloat16()
        t_bf16 = time_cuda([lambda: llm.compute_gae_advantage_return(rb, vb, m, gamma, lam, backend="triton")])[1]
        t_white = do_bench(lambda: llm.compute_gae_advantage_return(r, v, m, gamma, lam, whiten=True,
                                                                      backend="triton"),
                           warmup=5, rep=50, return_mode="median") * 1e-3
        cu = torch.zeros(B + 1, dtype=torch.int32, device="cuda")
        cu[1:] = torch.cumsum(torch.full((B,), T, device="cuda"), 0)
        pr, pv, pm = r.reshape(1, -1), v.reshape(1, -1), m.reshape(1, -1)
        padv, _ = llm.packed_gae(pr, pv, pm, cu, gamma, lam, backend="triton")
        err = max(err, (padv.reshape(B, T) - adv)[m].abs().max().item())
        t_packed = do_bench(lambda: llm.packed_gae(pr, pv, pm, cu, gamma, lam, backend="triton"),
                            warmup=5, rep=50, return_mode="median") * 1e-3
        t_cpu_rb = min(wall(lambda: llm.compute_gae_advantage_return(r_c, v_c, m_c, gamma, lam, backend="torch"))
                       for _ in range(3))
        t_cpu_loop = float("nan")
        if not args.no_cpu_loop:
            t_cpu_loop = wall(lambda: verl_multi_turn_gae(r_c, v_c, m_c.float(), gamma, lam))
        row = dict(B=B, T=T, tokens=B * T, loop_gpu_s=t_loop, loop_cpu_s=t_cpu_loop, call_us=t_call * 1e6,
                   device_us=t_dev * 1e6, bf16_device_us=t_bf16 * 1e6, whiten_call_us=t_white * 1e6,
                   packed_call_us=t_packed * 1e6, rollbuf_cpu_s=t_cpu_rb,
                   speedup_vs_gpu_loop=t_loop / t_call, speedup_vs_cpu_loop=t_cpu_loop / t_call,
                   max_abs_err=err, **prov)
        rows.append(row)
        print(row, flush=True)
        del r, v, m, mf, rb, vb, pr, pv, pm, adv, padv
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "llm_gpu.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{prov}\n")
    print("| B × T | verl loop, GPU | verl loop, CPU | rollbuf full call | device | speedup vs GPU loop "
          "| vs CPU loop | bf16 device | + whiten | packed (1 row) | rollbuf CPU | max abs err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for q in rows:
        print(f"| {q['B']} × {q['T']} | {q['loop_gpu_s']:.2f} s | {q['loop_cpu_s']:.2f} s | {q['call_us']:.0f} µs "
              f"| {q['device_us']:.0f} µs | {q['speedup_vs_gpu_loop']:.0f}× | {q['speedup_vs_cpu_loop']:.0f}× "
              f"| {q['bf16_device_us']:.0f} µs | {q['whiten_call_us']:.0f} µs | {q['packed_call_us']:.0f} µs "
              f"| {q['rollbuf_cpu_s'] * 1e3:.0f} ms | {q['max_abs_err']:.1e} |")

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
