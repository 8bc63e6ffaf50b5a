"""LLM-RL GAE on the CPU: verl's multi-turn token loop against rollbuf.llm (``torch`` backend).

    python -m rollbuf.bench --experiment llm-cpu [--sizes 8x8192,64x32768,256x131072] [--budget 60]
                                                 [--out benchmarks/results/llm_cpu.csv]

Inputs: ``[B, T]`` float32 multi-turn rows: model turns and tool spans of random lengths (about 64
tokens on average), trailing padding after a random response length, finite values at masked tokens
(the critic's outputs there; verl's loop multiplies them by the mask, so they must be finite).

* **loop**: verl's ``compute_gae_advantage_return`` (multi-turn version) as written in
  ``verl/trainer/ppo/core_algos.py`` — a Python loop over tokens of batched torch ops, on the CPU,
  with its ``masked_whiten`` left out (rollbuf's is timed separately in ``whiten`` below); best of
  3 calls (1 call above 2^22 tokens).
* **rollbuf**: ``rollbuf.llm.compute_gae_advantage_return(..., backend="torch")``: the vectorised
  scan; best of 11 / 5 / 3 / 2 calls (≤ 2^20, ≤ 2^22, ≤ 2^24, more tokens; whiten and packed: 1
  call above 2^24) after a warm-up (none above 2^24), median recorded too. The machine may be
  shared: best-of is the least disturbed call.
* **rollbuf packed**: ``rollbuf.llm.packed_gae`` on the same tokens packed into one row of
  ``B·T`` tokens (``cu_seqlens`` of B sequences): one long-row scan.
* **err**: max |rollbuf − loop| over model tokens (the loop in float32, as verl runs it).

A size whose run (loop and rollbuf calls) is predicted from the previous size to take more than
``--budget`` seconds is skipped and reported as such.
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

from rollbuf.integrations import llm
from rollbuf.bench.experiments._common import RESULTS
from rollbuf.oracles import verl_multi_turn_gae as _verl_loop


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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment llm-cpu")
    ap.add_argument("--sizes", default="8x8192,64x32768,256x131072")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds allowed for one size")
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--out", default=str(RESULTS / "llm_cpu.csv"))
    args = ap.parse_args(argv)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    gamma, lam = args.gamma, args.lam
    prov = dict(commit=git_commit(), date=_dt.date.today().isoformat(), threads=torch.get_num_threads(),
                cpus=os.cpu_count(), cpu=platform.processor() or platform.machine(), torch=torch.__version__)
    rows = []
    per_step = None  # loop seconds per token-step (per row batch), from the previous size
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
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as fh:
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


if __name__ == "__main__":
    raise SystemExit(main())
