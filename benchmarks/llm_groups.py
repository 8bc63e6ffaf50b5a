"""``python -m benchmarks llm-groups``: verl's vectorized GRPO and RLOO against
``rollbuf.integrations.verl`` on the GPU, same inputs, same outputs.

    python -m benchmarks llm-groups [--sizes 256x1024,...] [--group-size 8] [--out DIR]

Inputs: ``[B, L]`` float32 token rewards (a score at each row's last response token, small
per-token terms elsewhere), a ``response_mask`` of EOS-cut rows (random response lengths) and
verl's ``index``: a NumPy array of string uids, ``B / group_size`` groups.

* **verl**: ``compute_grpo_vectorized_outcome_advantage`` and ``compute_rloo_vectorized_outcome_advantage``
  of verl 0.9.1, restated below with the helpers they call (``as_torch_index``'s string path,
  ``group_mean_std``); ``tests/test_verl.py`` checks the restatements equal verl's own functions;
* **rollbuf**: the same names from :mod:`rollbuf.integrations.verl`, with verl's NumPy ``index``
  (converted on the host per call, as verl does) and with an integer tensor ``index`` (no host work,
  capturable in a CUDA graph).

Columns: the full call (back-to-back calls, synchronised at the end, the three competitors' batches
interleaved; ``benchmarks.suite.wall_times``),
the device time of one call (the sum of its kernels' times from the profiler, mean of 20 calls: verl's
calls read device values back, so they cannot be graphed) and, for rollbuf with a tensor ``index``,
the replay of a CUDA graph of the call (``benchmarks.suite.graph_time``: the median of 6 batches);
the largest difference of the advantages from verl's.
"""

from __future__ import annotations

import argparse
import csv
import os

import numpy as np
import torch

from benchmarks.suite import graph_time, provenance, wall_times
from rollbuf.integrations import verl as rb

SIZES = ((256, 1024), (256, 32768), (1024, 8192), (4096, 1024), (4096, 8192), (4096, 32768))


# ---- verl 0.9.1, restated (verl/utils: as_torch_index, group_mean_std; verl/trainer/ppo/core_algos.py)


def verl_as_torch_index(index, device):
    """verl's ``as_torch_index`` for a NumPy array of string uids: factorised with ``np.unique``."""
    arr = np.asarray(index, dtype=object)
    try:
        return torch.from_numpy(arr.astype(np.int64)).to(device=device)
    except (TypeError, ValueError):
        pass
    _, inv = np.unique(arr, return_inverse=True)
    return torch.from_numpy(inv.astype(np.int64, copy=False)).to(device=device)


@torch.no_grad()
def verl_group_mean_std(scores, gidx, eps=1e-6):
    scores = scores.reshape(-1).to(dtype=torch.float32)
    gidx = gidx.reshape(-1).to(dtype=torch.long)
    G = int(torch.max(gidx).item()) + 1
    ones = torch.ones_like(scores, dtype=torch.float32)
    count = torch.zeros(G, device=scores.device, dtype=torch.float32).index_add_(0, gidx, ones)
    s1 = torch.zeros(G, device=scores.device, dtype=torch.float32).index_add_(0, gidx, scores)
    mean = s1 / count.clamp_min(1.0)
    centered = scores - mean[gidx]
    var_num = torch.zeros(G, device=scores.device, dtype=torch.float32).index_add_(0, gidx, centered * centered)
    std = torch.sqrt(torch.clamp(var_num / (count - 1.0).clamp_min(1.0), min=eps))
    single = count <= 1.0
    if torch.any(single):
        mean, std = mean.clone(), std.clone()
        mean[single], std[single] = 0.0, 1.0
    return mean, std, count


def verl_grpo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        g = verl_as_torch_index(index, scores.device)
        mean_g, std_g, _ = verl_group_mean_std(scores, g, eps=0.0)
        scalars = (scores - mean_g[g]) / (std_g[g] + epsilon) if norm_adv_by_std_in_grpo else scores - mean_g[g]
        advantages = scalars.unsqueeze(-1) * response_mask
        return advantages, advantages


def verl_rloo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6):
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        inv = torch.from_numpy(np.unique(index, return_inverse=True)[1]).to(scores.device)
        c = torch.bincount(inv)[inv].to(scores.dtype)
        adv = ((c * scores - torch.bincount(inv, weights=scores)[inv]) / (c - 1).clamp_min(1)) * (c > 1)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


# ---- the run


def make_batch(B, L, group_size, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None, :] < lengths[:, None]).float()
    rewards = 0.01 * torch.randn(B, L, generator=g) * mask
    rewards[torch.arange(B), lengths - 1] += torch.randint(0, 2, (B,), generator=g).float()
    uid = np.array([f"prompt-{i // group_size:06d}" for i in range(B)], dtype=object)
    return rewards.to(device), mask.to(device), uid


def device_us(fn, reps=20):
    """Mean device time of one call: the sum of its kernels' times (profiler)."""
    from benchmarks.clocks import kernel_times

    return sum(kernel_times(fn, reps).values())


def run(args):
    prov = provenance("cuda")
    rows = []
    for B, L in [tuple(map(int, s.split("x"))) for s in args.sizes.split(",")]:
        r, m, uid = make_batch(B, L, args.group_size, "cuda")
        ids = torch.as_tensor(np.unique(uid, return_inverse=True)[1].reshape(-1), device="cuda")
        for name, verl_fn, rb_fn in (("grpo", verl_grpo_vectorized, rb.compute_grpo_vectorized_outcome_advantage),
                                     ("rloo", verl_rloo_vectorized, rb.compute_rloo_vectorized_outcome_advantage)):
            ref = verl_fn(r, m, uid)[0]
            err = max((rb_fn(r, m, uid)[0] - ref).abs().max().item(), (rb_fn(r, m, ids)[0] - ref).abs().max().item())
            del ref
            calls = {"verl": lambda f=verl_fn: f(r, m, uid), "rollbuf": lambda f=rb_fn: f(r, m, uid),
                     "rollbuf, tensor index": lambda f=rb_fn: f(r, m, ids)}
            t = wall_times({k: [fn] for k, fn in calls.items()}, torch.cuda.synchronize)
            t = {k: v * 1e6 for k, v in t.items()}
            d = {k: device_us(fn) for k, fn in calls.items()}
            row = dict(estimator=name, B=B, L=L, group_size=args.group_size, verl_call_us=t["verl"],
                       rollbuf_call_us=t["rollbuf"], rollbuf_tensor_call_us=t["rollbuf, tensor index"],
                       verl_device_us=d["verl"], rollbuf_device_us=d["rollbuf"],
                       rollbuf_tensor_device_us=d["rollbuf, tensor index"],
                       rollbuf_graph_us=graph_time([calls["rollbuf, tensor index"]], reps=50)[0] * 1e6,
                       max_abs_err=err, **prov)
            rows.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k not in prov},
                  flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "llm_groups_gpu.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{prov}\n")
    print("| estimator | B × L | verl full call | rollbuf full call (uid array) | (tensor index) | verl device "
          "| rollbuf device | graph replay | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for q in rows:
        print(f"| {q['estimator']} | {q['B']} × {q['L']} | {q['verl_call_us']:.0f} µs | {q['rollbuf_call_us']:.0f} µs "
              f"| {q['rollbuf_tensor_call_us']:.0f} µs | {q['verl_device_us']:.1f} µs "
              f"| {q['rollbuf_device_us']:.1f} µs | {q['rollbuf_graph_us']:.1f} µs | {q['max_abs_err']:.1e} |")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks llm-groups", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--sizes", default=",".join(f"{b}x{t}" for b, t in SIZES), help="BxL,BxL,...")
    ap.add_argument("--group-size", type=int, default=8, help="responses per prompt")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for llm_groups_gpu.csv")
    return run(ap.parse_args(argv))
