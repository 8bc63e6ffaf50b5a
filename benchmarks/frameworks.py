"""``python -m benchmarks frameworks``: the advantage code of OpenRLHF 0.11.2, AReaL 1.0.4, SkyRL, slime and TRL
1.16.0 against the rollbuf calls that replace it (``rollbuf.integrations.*``), same inputs, outputs checked
first.

    python -m benchmarks frameworks [--out DIR]          # a CUDA GPU: rows of 8,192 and 32,768 tokens
    python -m benchmarks frameworks --dry-run --out DIR  # the same plumbing on the CPU, tiny sizes

* **OpenRLHF GAE**: ``RemoteExperienceMaker.get_advantages_and_returns`` (a loop over token positions,
  ``openrlhf/trainer/ppo_utils/experience_maker.py``) restated below, against
  ``openrlhf.get_advantages_and_returns``;
* **OpenRLHF REINFORCE**: ``get_cumulative_returns`` (a loop) against ``openrlhf.get_cumulative_returns``;
* **AReaL GAE**: the GAE loop of ``PPOActor._compute_advantages`` (``areal/trainer/ppo/actor.py``) restated
  below from ``lastgaelam = 0`` to ``returns``, against ``areal.gae`` on the same rolled loss mask;
* **SkyRL GAE**: ``compute_gae_advantage_return`` (a loop over token positions, then the masked whitening),
  as tests/test_skyrl.py holds it verbatim, against ``skyrl.compute_gae_advantage_return``;
* **slime PPO / REINFORCE++**: slime's ``compute_advantages_and_returns`` (a list of samples in, per-sample
  tensors out: ``get_advantages_and_returns_batch``'s chunked scan, ``get_reinforce_plus_plus_returns``'
  loop over samples), as tests/test_slime.py holds it verbatim (Megatron's ``mpu`` a one-process stand-in),
  its own branch against the same function calling ``slime.gae`` / ``slime.reinforce_plus_plus`` through
  ``--custom-advantage-function-path``; rows of 256 and 64 samples of up to ``L`` tokens;
* **TRL GRPO**: the advantages of ``GRPOTrainer._generate_and_score_completions`` (``scale_rewards="group"``,
  one reward function; restated below with TRL's ``nanstd``), against ``trl.grpo_advantages``, on
  ``B · L / 256`` completions in groups of 16 (TRL's statistics are vectorised torch, not a loop); left
  out where TRL is not installed.

The restated loops are the frameworks' lines (tests/test_bench.py holds them equal to the copies of
tests/test_openrlhf.py and tests/test_areal.py, which are the shipped functions verbatim, and ``nanstd`` to
TRL's); SkyRL's and slime's are loaded from their test files. Every time is
the full call (synchronised before and after, median of batches). CSV ``DIR/frameworks.csv``; a table
printed last with the device, versions and commit.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from argparse import Namespace
from functools import cache
from pathlib import Path

import torch

from benchmarks.llm_agents import _diff, _time, report
from rollbuf.integrations import areal, openrlhf, skyrl

try:  # the drop-in subclasses TRL's trainer: without TRL (the GPU machine) its case is left out
    from rollbuf.integrations import trl as rb_trl
except ImportError:
    rb_trl = None

TESTS = Path(__file__).resolve().parents[1] / "tests"

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


def nanstd(tensor: torch.Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> torch.Tensor:
    """
    Compute the standard deviation of a tensor, ignoring NaNs.

    Args:
        tensor (`torch.Tensor`):
            Input tensor.
        dim (`int` or `tuple[int, ...]`, *optional*):
            Dimension(s) to reduce. Defaults to all dimensions.
        keepdim (`bool`, *optional*, defaults to `False`):
            Whether to keep reduced dimensions.

    Returns:
        `torch.Tensor`:
            Standard deviation of the tensor, ignoring NaNs.
    """
    # Compute variance ignoring NaNs
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)  # count of non-NaN values
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction  # Bessel's correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    if dim is None:
        return std.squeeze()
    if isinstance(dim, int):
        return std.squeeze(dim)
    dims = [(d if d >= 0 else d + std.ndim) for d in dim]
    for d in sorted(dims, reverse=True):
        std = std.squeeze(d)
    return std


def trl_grpo(rewards_per_func, reward_weights, num_generations):
    """TRL 1.16.0's advantage lines of ``GRPOTrainer._generate_and_score_completions`` for
    ``multi_objective_aggregation="sum_then_normalize"`` and ``scale_rewards="group"`` (the trainer's
    attributes as arguments; its logging and the final ``nan_to_num`` left out)."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
    std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    advantages = advantages / (std_rewards + 1e-4)
    return advantages


@cache
def _restated(name):
    """tests/test_<name>.py as a module: the framework's functions it holds verbatim (slime's with Megatron's
    ``mpu`` found in a one-process stand-in)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    stub = name == "slime" and "megatron.core" not in sys.modules  # never replace a real Megatron's mpu
    if stub:
        for mod in ("megatron", "megatron.core"):
            sys.modules[mod] = types.ModuleType(mod)
    spec = importlib.util.spec_from_file_location(f"_rollbuf_restated_{name}", TESTS / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if stub:
        sys.modules["megatron.core"].mpu = module.mpu
    return module


def _samples(B, L, device, g):
    """slime's rollout data: ``B`` samples of 1 to ``L`` response tokens with tool spans, KL already set."""
    lengths = torch.randint(1, L + 1, (B,), generator=g).tolist()
    f = [torch.randn(n, generator=g).to(device) for n in lengths]
    masks = [(torch.rand(n, generator=g) > 0.2).to(torch.int32).to(device) for n in lengths]
    return {"rewards": torch.randn(B, generator=g).tolist(), "values": f, "response_lengths": lengths,
            "loss_masks": masks, "total_lengths": [n + 5 for n in lengths],
            "log_probs": [-(x * 0.1).abs() for x in f], "ref_log_probs": [-(x * 0.2).abs() for x in f]}


def _slime_case(data, estimator, custom):
    mod = _restated("slime")
    args = Namespace(advantage_estimator=estimator, custom_advantage_function_path=custom, kl_coef=0.1,
                     kl_loss_type="k1", use_rollout_logprobs=False, use_opd=False, normalize_advantages=False,
                     gamma=0.99, lambd=0.95)

    def run():
        d = dict(data)
        mod.compute_advantages_and_returns(args, d)
        return torch.cat(d["advantages"])[None]
    return run


# ---- inputs and cases


def _batch(B, L, device, g):
    """Rows of ``L`` tokens: responses cut at random lengths with tool replies inside (mask 0)."""
    r = torch.randn(B, L, generator=g) * 0.1
    v = torch.randn(B, L, generator=g)
    lengths = torch.randint(L // 4, L + 1, (B,), generator=g)
    m = (torch.arange(L) < lengths[:, None]) & (torch.rand(B, L, generator=g) > 0.2)
    no_eos = lengths == L
    return r.to(device), v.to(device), m.float().to(device), no_eos.to(device)


def _cases(r, v, m, no_eos, samples, scores):
    rolled = torch.roll(m, shifts=-1, dims=-1)
    sky = _restated("skyrl")
    w = torch.ones(1)
    return (("openrlhf_gae", lambda: openrlhf.get_advantages_and_returns(None, v, r, m, 0.99, 0.95),
             lambda: openrlhf_gae(v, r, m, 0.99, 0.95)),
            ("openrlhf_returns", lambda: openrlhf.get_cumulative_returns(None, r, m, 0.99),
             lambda: openrlhf_returns(r, m, 0.99)),
            ("areal_gae", lambda: areal.gae(r, v, rolled, no_eos, 0.99, 0.95),
             lambda: areal_gae(r, v, rolled, no_eos, 0.99, 0.95)),
            ("skyrl_gae", lambda: skyrl.compute_gae_advantage_return(r, v, m, 0.99, 0.95),
             lambda: sky.compute_gae_advantage_return(r, v, m, 0.99, 0.95)),
            ("slime_ppo", _slime_case(samples, "ppo", "rollbuf.integrations.slime.gae"),
             _slime_case(samples, "ppo", None)),
            ("slime_reinforce++", _slime_case(samples, "reinforce_plus_plus",
                                              "rollbuf.integrations.slime.reinforce_plus_plus"),
             _slime_case(samples, "reinforce_plus_plus", None)),
            *((("trl_grpo", lambda: rb_trl.grpo_advantages(scores, 16)[None], lambda: trl_grpo(scores, w, 16)[None]),)
              if rb_trl is not None else ()))


def rows_for(sizes, device, budget_s):
    g = torch.Generator().manual_seed(0)
    out = []
    for B, L in sizes:
        batch = _batch(B, L, device, g)
        samples = _samples(B, L, device, g)
        scores = torch.randn(max(16, B * L // 256 // 16 * 16), 1, generator=g).to(device)
        for name, ours, theirs in _cases(*batch, samples, scores):
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
