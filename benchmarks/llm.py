"""``python -m benchmarks llm``: LLM-RL GAE over multi-turn token rows, verl's token loop against
``rollbuf.integrations.llm``.

    python -m benchmarks llm --device cpu [--sizes 8x8192,64x32768,256x131072] [--budget 60] [--out DIR]
    python -m benchmarks llm --device cuda [--sizes ...] [--out DIR] [--no-cpu-loop]

Inputs: ``[B, T]`` float32 multi-turn rows: model turns and tool spans of random lengths (about 64
tokens on average), trailing padding after a random response length, finite values at masked tokens
(the critic's outputs there; verl's loop multiplies them by the mask, so they must be finite);
γ = 1, λ = 0.95 by default.

* **loop**: verl's ``compute_gae_advantage_return`` (multi-turn version, :mod:`benchmarks.oracles`) as
  written in ``verl/trainer/ppo/core_algos.py`` — a Python loop over tokens of batched torch ops,
  with its ``masked_whiten`` left out;
* **rollbuf**: ``rollbuf.integrations.llm.compute_gae_advantage_return`` (the ``torch`` backend on
  the CPU, ``triton`` on the GPU), the same with ``whiten=True``, and ``packed_gae`` on the same
  tokens packed into one row of ``B·T`` tokens (``cu_seqlens`` of B sequences);
* **err**: max |rollbuf − loop| over model tokens (the loop in float32, as verl runs it).

**CPU** (``llm_cpu.csv``): best of 11 / 5 / 3 / 2 rollbuf calls (≤ 2^20, ≤ 2^22, ≤ 2^24, more
tokens; whiten and packed: 1 call above 2^24) after a warm-up (none above 2^24), median recorded
too; the loop best of 3 calls (1 above 2^22 tokens). The machine may be shared: best-of is the
least disturbed call. A size whose run is predicted from the previous size to take more than
``--budget`` seconds is skipped and reported as such.

**GPU** (``llm_gpu.csv``): the loop once on CUDA tensors and once on the host CPU (synchronised;
they take seconds); rollbuf's full call (the scoreboard's back-to-back clock) and device time
(CUDA-graph replay), the device time with bf16 rewards and values, ``whiten=True`` and the packed
row (``do_bench`` medians), and the ``torch`` backend on the host CPU (best of 3).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import os
import platform
import statistics
import subprocess
import time

import torch

from benchmarks.cases import LLM_SIZES, parse_shapes
from benchmarks.oracles import verl_multi_turn_gae as _verl_loop
from benchmarks.suite import provenance, time_cuda
from rollbuf.integrations import llm


def verl_multi_turn_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's multi-turn GAE loop (without the final masked_whiten)."""
    with torch.no_grad():
        return _verl_loop(token_level_rewards, values, response_mask, gamma, lam)


def make_batch(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    toggles = torch.rand(B, T, generator=g) < 1 / 64  # a new turn / tool span every ~64 tokens
    turn = torch.cumsum(toggles, dim=-1)
    length = torch.randint(T // 2, T + 1, (B, 1), generator=g)
    mask = (turn % 2 == 0) & (torch.arange(T) < length)
    rewards = torch.randn(B, T, generator=g) * 0.01
    rewards[torch.arange(B), (length[:, 0] - 1).clamp(min=0)] += 1.0  # a final score
    values = torch.randn(B, T, generator=g)
    return rewards, values, mask


def timings(fn, reps, warmup=True):
    """(min, median) wall time of ``reps`` calls. The machine is shared: the minimum is the least
    disturbed call, the median shows the contention."""
    if warmup:
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    except Exception:  # pragma: no cover
        return "unknown"


def run_cpu(args):
    sizes = parse_shapes(args.sizes)
    gamma, lam = args.gamma, args.lam
    prov = dict(commit=git_commit(), date=_dt.date.today().isoformat(), threads=torch.get_num_threads(),
                cpus=os.cpu_count(), cpu=platform.processor() or platform.machine(), torch=torch.__version__)
    rows = []
    per_step = prev_B = per_token = None  # loop seconds per token-step (per row batch), from the previous size
    for B, T in sizes:
        big = B * T > 2 ** 24
        reps = 11 if B * T <= 2 ** 20 else 5 if B * T <= 2 ** 22 else 3 if not big else 2
        side_reps = reps if not big else 1  # whiten, packed
        if per_step is not None:
            # the loop: time per token-step grows slowly with B; rollbuf: linear in tokens
            predicted = per_step * T * max(1.0, B / prev_B) ** 0.5
            calls = reps + 2 * side_reps + (0 if big else 3) + 2
            predicted += per_token * B * T * calls
            if predicted > args.budget:
                print(f"{B}x{T}: skipped (loop predicted {predicted:.0f} s > budget {args.budget:.0f} s)", flush=True)
                rows.append(dict(B=B, T=T, tokens=B * T, loop_s="", loop_median_s="", loop_reps=0,
                                 rollbuf_s="", rollbuf_median_s="", rollbuf_reps=0, packed_s="", whiten_s="",
                                 speedup="", packed_speedup="", max_abs_err="",
                                 note=f"skipped: loop predicted {predicted:.0f} s", **prov))
                continue
        r, v, m = make_batch(B, T)
        mf = m.float()
        warm = not big  # the largest size runs after the others: no warm-up call
        t_rb, t_rb_med = timings(lambda: llm.compute_gae_advantage_return(r, v, m, gamma, lam, backend="torch"),
                                 reps, warm)
        t_w, _ = timings(lambda: llm.compute_gae_advantage_return(r, v, m, gamma, lam, whiten=True,
                                                                  backend="torch"), side_reps, warm)
        cu = torch.zeros(B + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.full((B,), T), 0)
        pr, pv, pm = r.reshape(1, -1), v.reshape(1, -1), m.reshape(1, -1)
        t_pk, _ = timings(lambda: llm.packed_gae(pr, pv, pm, cu, gamma, lam, backend="torch"), side_reps, warm)
        out = {}

        def loop():
            out["adv"] = verl_multi_turn_gae(r, v, mf, gamma, lam)[0]

        loop_reps = 3 if B * T <= 2 ** 22 else 1
        t_loop, t_loop_med = timings(loop, loop_reps, warmup=False)
        e_adv = out["adv"]
        per_step, prev_B, per_token = t_loop / T, B, t_rb_med / (B * T)
        adv, _ = llm.compute_gae_advantage_return(r, v, m, gamma, lam, backend="torch")
        padv, _ = llm.packed_gae(pr, pv, pm, cu, gamma, lam, backend="torch")
        err = max((adv - e_adv)[m].abs().max().item(), (padv.reshape(B, T) - e_adv)[m].abs().max().item())
        row = dict(B=B, T=T, tokens=B * T, loop_s=t_loop, loop_median_s=t_loop_med, loop_reps=loop_reps,
                   rollbuf_s=t_rb, rollbuf_median_s=t_rb_med, rollbuf_reps=reps, packed_s=t_pk,
                   whiten_s=t_w, speedup=t_loop / t_rb, packed_speedup=t_loop / t_pk, max_abs_err=err,
                   note="", **prov)
        rows.append(row)
        print(f"{B}x{T}: loop {t_loop:.3f} s (median {t_loop_med:.3f}), rollbuf {t_rb * 1e3:.1f} ms "
              f"(median {t_rb_med * 1e3:.1f}; {t_loop / t_rb:.0f}x), packed {t_pk * 1e3:.1f} ms "
              f"({t_loop / t_pk:.0f}x), +whiten {t_w * 1e3:.1f} ms, err {err:.1e}", flush=True)
        del r, v, m, mf, e_adv, adv, padv, pr, pv, pm
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "llm_cpu.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\nCPU: {prov['cpu']}, {prov['cpus']} cores, torch {prov['torch']} ({prov['threads']} threads), "
          f"commit {prov['commit']}, {prov['date']}; γ = {gamma}, λ = {lam}, float32\n")
    print("Best of n calls (median in parentheses); speedups are best over best.\n")
    print("| B × T | tokens | verl loop | rollbuf (padded) | speedup | rollbuf packed (1 row) | speedup "
          "| padded + whiten | max abs err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r_ in rows:
        if r_["note"]:
            print(f"| {r_['B']} × {r_['T']} | {r_['tokens']:,} | {r_['note']} | | | | | | |")
            continue
        print(f"| {r_['B']} × {r_['T']} | {r_['tokens']:,} | {r_['loop_s']:.2f} s ({r_['loop_median_s']:.2f}) "
              f"| {r_['rollbuf_s'] * 1e3:.1f} ms ({r_['rollbuf_median_s'] * 1e3:.1f}) "
              f"| {r_['speedup']:.0f}× | {r_['packed_s'] * 1e3:.1f} ms | {r_['packed_speedup']:.0f}× "
              f"| {r_['whiten_s'] * 1e3:.1f} ms | {r_['max_abs_err']:.1e} |")

    return 0


def wall(fn, reps=1):
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def run_gpu(args):
    from triton.testing import do_bench

    gamma, lam = args.gamma, args.lam
    prov = dict(provenance("cuda"), cpus=os.cpu_count(), threads=torch.get_num_threads())
    rows = []
    for B, T in parse_shapes(args.sizes):
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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks llm", description=__doc__.splitlines()[0].replace("``", ""),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"),
                    help="cpu: the torch backend against the loop on the CPU; cuda: the Triton kernels")
    ap.add_argument("--sizes", default=",".join(f"{b}x{t}" for b, t in LLM_SIZES), help="BxT,BxT,...")
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--budget", type=float, default=60.0, help="CPU: seconds allowed for one size")
    ap.add_argument("--no-cpu-loop", action="store_true", help="GPU: do not time the loop on the host CPU")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for llm_cpu.csv / llm_gpu.csv")
    args = ap.parse_args(argv)
    return run_gpu(args) if args.device == "cuda" else run_cpu(args)
