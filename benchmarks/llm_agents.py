"""``python -m benchmarks llm-agents``: the multi-turn agent estimators against the loops they replace,
same inputs, outputs checked equal first.

    python -m benchmarks llm-agents [--out DIR]          # a CUDA GPU: the sizes of the issue's bounds
    python -m benchmarks llm-agents --dry-run --out DIR  # the same plumbing on the CPU, tiny sizes

* **OTB, TIR-OTB**: ``rollbuf.integrations.verl``'s against verl 0.9.1's
  ``compute_optimal_token_baseline_advantage`` and ``compute_multi_turn_optimal_token_baseline_advantage``
  restated below as the loops they are (a loop over groups with a host read per group; TIR-OTB also
  two loops over the rows), on ``[B, L]`` float32 inputs with EOS-cut and multi-turn masks, string
  uids in groups of ``--group``; ``tests/test_bench.py`` checks the restatements equal verl's.
* **GiGPO**: ``rollbuf.integrations.verl_agent.compute_gigpo_outcome_advantage`` against verl-agent's
  function restated (a loop over rows and uids), at ``--gigpo-rows`` step rows in episode groups of 8
  trajectories.
* **turn-level**: ``llm.turn_returns`` and ``llm.turn_gae`` against the token-level masked GAE
  (``llm.compute_gae_advantage_return``) on the same rows (100+ turns per row).

Every time is the full call (back-to-back calls, synchronised before and after, median of batches).
CSV ``DIR/llm_agents.csv``; a table printed last with the device, versions and commit.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from collections import defaultdict

import numpy as np
import torch

from benchmarks.suite import provenance
from rollbuf.integrations import llm, verl_agent
from rollbuf.integrations import verl as rb

# ---- verl 0.9.1's optimal token baselines, restated as loops (verl/trainer/ppo/core_algos.py)


def _otb_inputs(rewards, mask, old_log_probs, sum_pi_squared, is_weights):
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights**2
    return returns, (w * mask).cumsum(-1)


def _zero_tail(baselines, rows, lengths):
    """verl's tail rule: a group's unique longest row gets baseline 0 from the second longest's length."""
    order = torch.sort(lengths).values
    top, second = int(order[-1].item()), int(order[-2].item())
    at = (lengths == top).nonzero(as_tuple=True)[0]
    if at.numel() == 1 and top > second:
        baselines[rows[int(at[0])], second:] = 0.0


def verl_otb(rewards, mask, index, old_log_probs, sum_pi_squared, is_weights=None, zero_tail=True, eps=1e-8):
    """OTB as verl's loop: per group, the per-position weighted mean of the returns."""
    returns, wc = _otb_inputs(rewards, mask, old_log_probs, sum_pi_squared, is_weights)
    groups = defaultdict(list)
    for i in range(rewards.shape[0]):
        groups[index[i]].append(i)
    base = torch.zeros_like(returns)
    for rows in groups.values():
        if len(rows) == 1:
            continue
        at = torch.tensor(rows, device=rewards.device)
        m = mask[at]
        b = (returns[at] * wc[at] * m).sum(0) / ((wc[at] * m).sum(0) + eps)
        base[at] = b.unsqueeze(0).expand(len(rows), -1)
        if zero_tail:
            _zero_tail(base, rows, m.sum(-1))
    return (returns - base) * mask, returns


def verl_tir_otb(rewards, mask, index, old_log_probs, sum_pi_squared, is_weights=None, zero_tail=True, eps=1e-8):
    """TIR-OTB as verl's loops: each row's response tokens packed to its front, OTB per group, back."""
    returns, wc = _otb_inputs(rewards, mask, old_log_probs, sum_pi_squared, is_weights)
    lengths = mask.sum(-1).long()
    width = int(lengths.max().item()) if lengths.numel() else 0
    pw, pr = wc.new_zeros(len(lengths), width), wc.new_zeros(len(lengths), width)
    for i in range(len(lengths)):
        n = int(lengths[i].item())
        if n:
            on = mask[i].bool()
            pw[i, :n], pr[i, :n] = wc[i, on], returns[i, on]
    groups = defaultdict(list)
    for i in range(len(lengths)):
        if lengths[i] != 0:
            groups[index[i]].append(i)
    base = torch.zeros_like(pr)
    for rows in groups.values():
        if len(rows) == 1:
            continue
        at = torch.tensor(rows, device=rewards.device)
        base[at] = ((pr[at] * pw[at]).sum(0) / (pw[at].sum(0) + eps)).to(base.dtype)
        if zero_tail:
            _zero_tail(base, rows, lengths[at])
    adv_packed = pr - base
    adv = torch.zeros_like(returns)
    for i in range(len(lengths)):
        n = int(lengths[i].item())
        if n:
            adv[i, mask[i].bool()] = adv_packed[i, :n]
    return adv * mask, returns


# ---- verl-agent's GiGPO, restated as its loops (gigpo/core_gigpo.py; not on PyPI)


def _norm_loop(scores, keys, eps, std_norm, own_mean):
    by = defaultdict(list)
    for i, k in enumerate(keys):
        by[k].append(scores[i])
    out = scores.clone()
    stats = {}
    for k, vals in by.items():
        v = torch.stack(vals)
        stats[k] = (v.mean(), v.std()) if len(vals) > 1 else (None, torch.tensor(1.0))
    for i, k in enumerate(keys):
        mean, std = stats[k]
        if mean is None:
            mean = scores[i] if own_mean else torch.tensor(0.0)
        out[i] = (scores[i] - mean) / (std + eps) if std_norm else scores[i] - mean
    return out


def verl_agent_gigpo(rewards, step_rewards, mask, anchor, index, w=1.0, mode="mean_norm", eps=1e-6):
    std_norm = mode == "mean_std_norm"
    episode = _norm_loop(rewards.sum(-1), list(index), eps, std_norm, False)
    step = _norm_loop(step_rewards.clone(), [(index[i], anchor[i]) for i in range(len(index))], eps, std_norm, True)
    return episode[:, None] * mask + w * (step[:, None] * mask)


# ---- inputs and clocks


def _rows(B, L, device, g, multi_turn=True):
    lengths = torch.randint(L // 4, L + 1, (B,), generator=g)
    mask = (torch.arange(L) < lengths[:, None])
    if multi_turn:  # tool replies inside the responses
        mask &= torch.rand(B, L, generator=g) > 0.2
    return mask.float().to(device)


def _uids(B, group, rng):
    uids = np.array([f"uid-{i:08d}" for i in range(B // group)], dtype=object)
    out = np.repeat(uids, group)
    rng.shuffle(out)
    return out


def _time(fn, device, budget_s):
    """Median wall seconds per call of ``fn`` (synchronised before and after each batch)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, min(50, int(budget_s / 5 / one)))
    out = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def _diff(a, b, per_row=True, scale=None):
    """Largest difference relative to each row's scale (``per_row``) or to the batch's: a GiGPO row holds
    one number, so its own scale is that number, and a row whose advantage is near 0 would measure
    float32 rounding against almost nothing. ``scale``: the rows' scale from another tensor (OTB: the
    returns, of which the baseline is a weighted mean; rollbuf's kernel sums in float64, verl in
    float32, where a group's ``Σ W`` can cancel)."""
    ref = b if scale is None else scale
    scale = (ref.abs().amax(-1, keepdim=True) if per_row else ref.abs().amax()).clamp_min(1e-6)
    return float(((a.float() - b.float()).abs() / scale).max())


def _otb_rows(args, device, g, rng):
    out = []
    for B, L in args.otb_sizes:
        r = torch.randn(B, L, generator=g).to(device) * 0.1
        m = _rows(B, L, device, g)
        lp, spi2 = (-3 * torch.rand(B, L, generator=g)).to(device), (0.5 * torch.rand(B, L, generator=g)).to(device)
        idx = _uids(B, args.group, rng)
        for name, ours, theirs in (("otb", rb.compute_optimal_token_baseline_advantage, verl_otb),
                                   ("tir_otb", rb.compute_multi_turn_optimal_token_baseline_advantage, verl_tir_otb)):
            a = ours(r, m, idx, old_log_probs=lp, sum_pi_squared=spi2)[0]
            b, returns = theirs(r, m, idx, lp, spi2)
            t_ours = _time(lambda o=ours: o(r, m, idx, old_log_probs=lp, sum_pi_squared=spi2), device, args.budget_s)
            t_theirs = _time(lambda t=theirs: t(r, m, idx, lp, spi2), device, args.budget_s)
            out.append(dict(case=name, size=f"{B}x{L}", rollbuf_ms=t_ours * 1e3, loop_ms=t_theirs * 1e3,
                            speedup=t_theirs / t_ours, max_rel_diff=_diff(a, b, scale=returns)))
    return out


def _gigpo_rows(args, device, g, rng):
    out = []
    for rows in args.gigpo_rows:
        L = 64
        groups = max(1, rows // 32)  # episode groups of 8 trajectories of 4 steps
        index = np.repeat(np.array([f"e{k}" for k in range(groups)], dtype=object), rows // groups)[:rows]
        anchor = np.array([f"obs {int(v)}" for v in rng.integers(0, 6, rows)], dtype=object)
        r = torch.randn(rows, L, generator=g).to(device) * 0.1
        m = _rows(rows, L, device, g, multi_turn=False)
        s = torch.randn(rows, generator=g).to(device)
        a = verl_agent.compute_gigpo_outcome_advantage(r, s, m, anchor, index, index)[0]
        b = verl_agent_gigpo(r, s, m, anchor, index)
        t_ours = _time(lambda: verl_agent.compute_gigpo_outcome_advantage(r, s, m, anchor, index, index), device,
                       args.budget_s)
        t_theirs = _time(lambda: verl_agent_gigpo(r, s, m, anchor, index), device, args.budget_s)
        out.append(dict(case="gigpo", size=f"{rows} rows", rollbuf_ms=t_ours * 1e3, loop_ms=t_theirs * 1e3,
                        speedup=t_theirs / t_ours, max_rel_diff=_diff(a, b, per_row=False)))
    return out


def turn_batch(B, L, turns, device, g):
    """``(rewards, values, mask)`` ``[B, L]``: ~``turns`` turns per row, runs of model tokens between tool
    replies (the turn rows here and in benchmarks/turn_device.py)."""
    r = torch.randn(B, L, generator=g).to(device)
    v = torch.randn(B, L, generator=g).to(device)
    cut = torch.rand(B, L, generator=g) < 2 * turns / L
    return r, v, (torch.cumsum(cut, -1) % 2 == 0).to(device)


def _turn_rows(args, device, g):
    B, L = args.turn_size
    r, v, m = turn_batch(B, L, args.turns, device, g)
    token = _time(lambda: llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95), device, args.budget_s)
    out = []
    for name, fn in (("turn_returns", lambda backend="auto": llm.turn_returns(r, m, 0.99, backend=backend)),
                     ("turn_gae", lambda backend="auto": llm.turn_gae(r, v, m, 0.99, 0.95, backend=backend))):
        t = _time(fn, device, args.budget_s)
        # the default (the turn kernels on a GPU) against the torch path's coefficients and affine scan
        got, want = fn(), fn("torch")
        diff = max(_diff(a, b) for a, b in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (got, want)),
                                               strict=True))
        out.append(dict(case=name, size=f"{B}x{L}", rollbuf_ms=t * 1e3, loop_ms=token * 1e3,
                        speedup=token / t, max_rel_diff=diff))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", required=True, help="the results folder")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors, tiny sizes: the plumbing only")
    ap.add_argument("--group", type=int, default=8, help="responses per uid (OTB)")
    ap.add_argument("--budget-s", type=float, default=2.0, help="seconds of timing per competitor and case")
    args = ap.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        args.otb_sizes, args.gigpo_rows, args.turn_size, args.turns = [(16, 12)], [64], (4, 64), 5
        args.budget_s = min(args.budget_s, 0.05)
    else:
        args.otb_sizes, args.gigpo_rows = [(512, 2048), (4096, 8192)], [4096, 16384, 65536]
        args.turn_size, args.turns = (256, 131072), 120
    g, rng = torch.Generator().manual_seed(0), np.random.default_rng(0)
    rows = _otb_rows(args, device, g, rng) + _gigpo_rows(args, device, g, rng) + _turn_rows(args, device, g)
    return report(rows, args.out, "llm_agents.csv", device, "; turn rows: 'loop' is the token-level masked GAE on "
                  "the same rows")


def report(rows, out, name, device, note="", widths=(14, 14)):
    """Write ``rows`` (with the run's provenance) to ``out/name``, print the table last; 1 if any case's
    outputs differ (max relative difference above 1e-4), else 0."""
    prov = provenance(device)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*rows[0], *prov])
        w.writeheader()
        for row in rows:
            w.writerow({**row, **prov})
    c, z = widths
    print(f"full calls, ms ({', '.join(f'{k}={v}' for k, v in prov.items())}){note}")
    print(f"{'case':{c}s} {'size':{z}s} {'rollbuf':>10s} {'loop':>10s} {'speedup':>9s} {'max rel diff':>12s}")
    for r in rows:
        print(f"{r['case']:{c}s} {r['size']:{z}s} {r['rollbuf_ms']:10.3f} {r['loop_ms']:10.3f} {r['speedup']:9.1f} "
              f"{r['max_rel_diff']:12.2e}")
    bad = [r for r in rows if r["max_rel_diff"] > 1e-4]
    if bad:
        print(f"outputs differ: {[(r['case'], r['size']) for r in bad]}")
    return 1 if bad else 0

if __name__ == "__main__":
    raise SystemExit(main())
