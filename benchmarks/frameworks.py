"""``python -m benchmarks frameworks``: the token loops of OpenRLHF 0.11.2 and AReaL 1.0.4 against the rollbuf
calls that replace them (``rollbuf.integrations.openrlhf``, ``rollbuf.integrations.areal``), same inputs,
outputs checked first.

    python -m benchmarks frameworks [--out DIR]          # a CUDA GPU: rows of 8,192 and 32,768 tokens
    python -m benchmarks frameworks --dry-run --out DIR  # the same plumbing on the CPU, tiny sizes

* **OpenRLHF GAE**: ``RemoteExperienceMaker.get_advantages_and_returns`` (a loop over token positions,
  ``openrlhf/trainer/ppo_utils/experience_maker.py``) restated below, against
  ``openrlhf.get_advantages_and_returns``;
* **OpenRLHF REINFORCE**: ``get_cumulative_returns`` (a loop) against ``openrlhf.get_cumulative_returns``;
* **AReaL GAE**: the GAE loop of ``PPOActor._compute_advantages`` (``areal/trainer/ppo/actor.py``) restated
  below from ``lastgaelam = 0`` to ``returns``, against ``areal.gae`` on the same rolled loss mask.

The restated loops are the frameworks' lines (tests/test_bench.py holds them equal to the copies of
tests/test_openrlhf.py and tests/test_areal.py, which are the shipped functions verbatim). Every time is
the full call (synchronised before and after, median of batches). CSV ``DIR/frameworks.csv``; a table
printed last with the device, versions and commit.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.llm_agents import _diff, _time, report
from rollbuf.integrations import areal, openrlhf

# ---- the frameworks' loops, restated


def openrlhf_gae(values, rewards, action_mask, gamma, lambd):
    """OpenRLHF 0.11.2 ``get_advantages_and_returns``'s body."""
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    if action_mask is not None:
        values = action_mask * values
        rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages.detach(), returns


def openrlhf_returns(rewards, action_mask, gamma):
    """OpenRLHF 0.11.2 ``get_cumulative_returns``'s body."""
    response_length = rewards.size(1)
    returns = torch.zeros_like(rewards)
    cumulative_return = torch.zeros(rewards.size(0), device=rewards.device)
    if action_mask is not None:
        rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        cumulative_return = rewards[:, t] + gamma * cumulative_return
        returns[:, t] = cumulative_return
    return returns


def areal_gae(rewards, values, loss_mask, seq_no_eos_mask, discount, gae_lambda):
    """AReaL 1.0.4 ``PPOActor._compute_advantages``'s GAE lines (``loss_mask`` already rolled)."""
    bs, max_seqlen = rewards.shape
    advantages_reversed = [torch.zeros(bs, dtype=torch.float32, device=values.device)]
    lastgaelam = 0
    nextvalues = values[:, max_seqlen - 1] * seq_no_eos_mask
    for t in reversed(range(max_seqlen - 1)):
        delta = rewards[:, t] + discount * nextvalues - values[:, t]
        newgaelam = delta + discount * gae_lambda * lastgaelam
        mask = loss_mask[:, t]
        nextvalues = nextvalues * (1 - mask) + values[:, t] * mask
        lastgaelam = lastgaelam * (1 - mask) + newgaelam * mask
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


# ---- inputs and cases


def _batch(B, L, device, g):
    """Rows of ``L`` tokens: responses cut at random lengths with tool replies inside (mask 0)."""
    r = torch.randn(B, L, generator=g) * 0.1
    v = torch.randn(B, L, generator=g)
    lengths = torch.randint(L // 4, L + 1, (B,), generator=g)
    m = (torch.arange(L) < lengths[:, None]) & (torch.rand(B, L, generator=g) > 0.2)
    no_eos = lengths == L
    return r.to(device), v.to(device), m.float().to(device), no_eos.to(device)


def _cases(r, v, m, no_eos):
    rolled = torch.roll(m, shifts=-1, dims=-1)
    return (("openrlhf_gae", lambda: openrlhf.get_advantages_and_returns(None, v, r, m, 0.99, 0.95),
             lambda: openrlhf_gae(v, r, m, 0.99, 0.95)),
            ("openrlhf_returns", lambda: openrlhf.get_cumulative_returns(None, r, m, 0.99),
             lambda: openrlhf_returns(r, m, 0.99)),
            ("areal_gae", lambda: areal.gae(r, v, rolled, no_eos, 0.99, 0.95),
             lambda: areal_gae(r, v, rolled, no_eos, 0.99, 0.95)))


def rows_for(sizes, device, budget_s):
    g = torch.Generator().manual_seed(0)
    out = []
    for B, L in sizes:
        batch = _batch(B, L, device, g)
        for name, ours, theirs in _cases(*batch):
            a, b = ours(), theirs()
            a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
            diff = _diff(a, b)
            t_ours, t_theirs = _time(ours, device, budget_s), _time(theirs, device, budget_s)
            out.append(dict(case=name, size=f"{B}x{L}", rollbuf_ms=t_ours * 1e3, loop_ms=t_theirs * 1e3,
                            speedup=t_theirs / t_ours, max_rel_diff=diff))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", required=True, help="the results folder")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors, tiny sizes: the plumbing only")
    ap.add_argument("--budget-s", type=float, default=2.0, help="seconds of timing per competitor and case")
    args = ap.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    sizes = [(8, 37)] if args.dry_run else [(256, 8192), (64, 32768)]
    rows = rows_for(sizes, device, min(args.budget_s, 0.05) if args.dry_run else args.budget_s)
    return report(rows, args.out, "frameworks.csv", device, widths=(18, 12))

if __name__ == "__main__":
    raise SystemExit(main())
