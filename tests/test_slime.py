"""rollbuf.integrations.slime against slime's own code, RESTATED below: slime imports Megatron-LM at the
top of its modules (and is not on PyPI), so CI cannot import it. Copied verbatim from THUDM/slime at
commit 624b824a8 (v0.3.1 and 38 commits):

* ``chunked_discounted_returns``, ``chunked_gae``, ``get_advantages_and_returns_batch``,
  ``get_reinforce_plus_plus_returns`` from ``slime/utils/ppo_utils.py``;
* ``distributed_masked_whiten`` from ``slime/utils/distributed_utils.py``;
* ``load_function`` from ``slime/utils/misc.py``;
* ``compute_advantages_and_returns`` from ``slime/backends/megatron_utils/loss.py``: the function that
  calls the custom advantage function (``--custom-advantage-function-path``) or its own branches.

``test_restatements_are_verbatim`` compares each with the shipped source (its AST) where
``ROLLBUF_ORACLE_SOURCES`` names a folder holding slime's source tree (a checkout); skipped without it.
Stand-ins: Megatron's ``mpu`` (one process: no context or pipeline parallelism), ``torch.distributed``'s
``all_reduce`` (one process) and the KL estimator (``compute_approx_kl``: slime's is ``torch.compile``d;
both paths call the stand-in alike). Compared: slime's ``ppo`` and ``reinforce_plus_plus`` branches
against the same function with ``args.custom_advantage_function_path`` naming rollbuf's, on random
samples (response lengths 1 to 40, loss masks with tool spans), with and without KL and whitening."""

from __future__ import annotations

import copy
import importlib
import sys
import types
from argparse import Namespace
from functools import cache

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from restated import assert_verbatim, needs_sources
from rollbuf.integrations import slime as R

RolloutBatch = dict
dist = types.SimpleNamespace(all_reduce=lambda tensor, group=None: None)  # one process
mpu = types.SimpleNamespace(is_pipeline_last_stage=lambda: True, get_context_parallel_world_size=lambda: 1,
                            get_context_parallel_rank=lambda: 0,
                            get_data_parallel_group=lambda with_context_parallel=False: None)


def compute_approx_kl(log_probs, log_probs_base, kl_loss_type):
    """A stand-in for slime's (k1)."""
    return log_probs.float() - log_probs_base.float()


def _not_taken(*args, **kwargs):
    raise AssertionError("a branch of slime's code that these tests do not take")


vanilla_gae = get_grpo_returns = get_reinforce_plus_plus_baseline_advantages = _not_taken
apply_opd_kl_to_advantages = get_logits_and_tokens_offset_with_cp = _not_taken


# ----------------------------------------- slime at 624b824a8, restated verbatim (see the docstring)

def chunked_discounted_returns(
    rewards: torch.Tensor,
    discount: float,
    chunk_size: int = 128,
) -> torch.Tensor:
    """
    Compute discounted returns using a parallel scan within fixed-size chunks.

    This reduces the sequential dependency length from O(T) to O(T / chunk_size),
    while keeping chunk computations fully parallelizable (O(C^2) per chunk).

    Args:
        rewards (Tensor): [B, T] reward sequence.
        discount (float): Discount factor applied at each step.
        chunk_size (int): sequence chunk length for parallel scan.

    Returns:
        Tensor: [B, T] discounted returns.
    """
    assert rewards.ndim == 2
    B, T = rewards.shape

    device = rewards.device
    dtype = rewards.dtype

    # Reformulate the backward recurrence as a forward scan on the reversed
    # sequence: S[i] = rewards[i] + discount * S[i - 1].
    rewards_rev = torch.flip(rewards, dims=[1])

    if T % chunk_size != 0:
        pad = chunk_size - (T % chunk_size)
        rewards_rev = F.pad(rewards_rev, (0, pad))
    else:
        pad = 0

    B, T_pad = rewards_rev.shape
    n_chunks = T_pad // chunk_size
    rewards_chunks = rewards_rev.view(B, n_chunks, chunk_size)

    idx = torch.arange(chunk_size, device=device)
    row = idx[:, None]
    col = idx[None, :]
    diff = col - row

    M = torch.zeros(chunk_size, chunk_size, device=device, dtype=dtype)
    mask = diff >= 0

    if discount == 0.0:
        M[mask & (diff == 0)] = 1.0
    else:
        M[mask] = discount ** diff[mask].to(dtype)

    if discount == 0.0:
        pow_vec = torch.zeros(chunk_size, device=device, dtype=dtype)
    else:
        pow_vec = discount ** torch.arange(1, chunk_size + 1, device=device, dtype=dtype)

    rewards_flat = rewards_chunks.reshape(B * n_chunks, chunk_size)
    S_local_flat = rewards_flat @ M
    S_local_chunks = S_local_flat.view(B, n_chunks, chunk_size)

    lengths = [chunk_size] * n_chunks
    if pad > 0:
        lengths[-1] = chunk_size - pad

    S_rev = rewards_rev.new_zeros(B, T_pad)
    s_prev = torch.zeros(B, device=device, dtype=dtype)

    for c in range(n_chunks):
        Lc = lengths[c]
        start = c * chunk_size
        end = start + Lc

        S_local = S_local_chunks[:, c, :Lc]
        S_global = S_local + s_prev.unsqueeze(1) * pow_vec[:Lc]

        S_rev[:, start:end] = S_global
        s_prev = S_global[:, -1]

    if pad > 0:
        S_rev = S_rev[:, :T]

    return torch.flip(S_rev, dims=[1])


def chunked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    gamma: float,
    lambd: float,
    chunk_size: int = 128,
):
    """Compute Generalized Advantage Estimation using a chunked scan."""
    assert rewards.ndim == 2 and values.ndim == 2
    B, T = rewards.shape
    assert values.shape == (B, T)

    next_values = torch.cat(
        [values[:, 1:], torch.zeros(B, 1, device=values.device, dtype=values.dtype)],
        dim=1,
    )
    deltas = rewards + gamma * next_values - values
    advantages = chunked_discounted_returns(deltas, gamma * lambd, chunk_size)
    returns = advantages + values

    return advantages, returns


def get_advantages_and_returns_batch(
    total_lengths,
    response_lengths,
    values_list,
    rewards_list,
    gamma,
    lambd,
    chunked: bool = True,
):
    """
    Batched GAE with CP support.
    Input:
        total_lengths:     list[int], each sample's total_len
        response_lengths:  list[int], each sample's response_len
        values_list:       list[Tensor], each shape = [resp_len_i]
        rewards_list:      list[Tensor], same shape
    Output:
        advantages_list:   list[Tensor], each shape = [resp_len_i]
        returns_list:      list[Tensor], same shape
    """

    from megatron.core import mpu

    with torch.no_grad():
        B = len(response_lengths)
        assert B == len(values_list)
        assert B == len(rewards_list)

        cp_size = mpu.get_context_parallel_world_size()
        device = values_list[0].device
        dtype = values_list[0].dtype

        if cp_size > 1:
            from slime.backends.megatron_utils.cp_utils import all_gather_with_cp

            full_values_list = []
            full_rewards_list = []

            for total_len, resp_len, v, r in zip(
                total_lengths, response_lengths, values_list, rewards_list, strict=False
            ):
                full_v = all_gather_with_cp(v, total_len, resp_len)
                full_r = all_gather_with_cp(r, total_len, resp_len)
                full_values_list.append(full_v)
                full_rewards_list.append(full_r)

            # full_values_list[i].shape = [total_len_i]
        else:
            full_values_list = values_list
            full_rewards_list = rewards_list

        # pad to max_len for batched GAE
        max_len = max(response_lengths)

        full_values = torch.zeros(B, max_len, device=device, dtype=dtype)
        full_rewards = torch.zeros(B, max_len, device=device, dtype=dtype)

        for i in range(B):
            L = response_lengths[i]
            full_values[i, :L] = full_values_list[i][:L]
            full_rewards[i, :L] = full_rewards_list[i][:L]

        if not chunked:
            full_advantages, full_returns = vanilla_gae(
                rewards=full_rewards,
                values=full_values,
                gamma=gamma,
                lambd=lambd,
            )
        else:
            full_advantages, full_returns = chunked_gae(
                rewards=full_rewards,
                values=full_values,
                gamma=gamma,
                lambd=lambd,
            )

        advantages_list = []
        returns_list = []

        if cp_size > 1:
            from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

            for total_len, resp_len, adv_row, ret_row in zip(
                total_lengths,
                response_lengths,
                full_advantages,
                full_returns,
                strict=False,
            ):
                adv_full = adv_row  # shape = [resp_len_i padded to max_len]
                ret_full = ret_row

                adv_sliced = slice_log_prob_with_cp(adv_full[:resp_len], total_len, resp_len)
                ret_sliced = slice_log_prob_with_cp(ret_full[:resp_len], total_len, resp_len)

                advantages_list.append(adv_sliced)
                returns_list.append(ret_sliced)

        else:
            for i in range(B):
                L = response_lengths[i]
                advantages_list.append(full_advantages[i, :L])
                returns_list.append(full_returns[i, :L])

    return advantages_list, returns_list


def get_reinforce_plus_plus_returns(
    rewards: torch.Tensor,
    kl: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    response_lengths: list[int],
    total_lengths: list[int],
    kl_coef: float,
    gamma: float,
) -> list[torch.Tensor]:
    """
    Calculates discounted returns for REINFORCE++ (https://arxiv.org/pdf/2501.03262)

    Args:
        rewards (Tensor): A tensor of scalar rewards for each sequence.
        kl (List[Tensor]): List of per-token KL divergence tensors for sequence chunks.
        loss_masks (List[Tensor]): List of response-only loss masks for each full sequence.
        response_lengths (List[int]): The full length of each response sequence.
        total_lengths (List[int]): The full length of each sequence (prompt + response).
        kl_coef (float): Coefficient for the KL penalty.
        gamma (float): The discount factor.

    Returns:
        List[torch.Tensor]: A list of return (G_t) tensors for the
                            local sequence chunks owned by the current GPU rank.
    """
    from megatron.core import mpu

    cp_size = mpu.get_context_parallel_world_size()

    token_level_rewards = []
    for i in range(len(rewards)):
        local_kl_chunk = kl[i]
        total_len, response_len = total_lengths[i], response_lengths[i]

        if cp_size > 1:
            # Step 1,2:Gather all chunks and token_offsets from all ranks and reconstruct the full response tensor by splitting and placing each part
            from slime.backends.megatron_utils.cp_utils import all_gather_with_cp

            full_kl_response = all_gather_with_cp(local_kl_chunk, total_len, response_len)
        else:
            full_kl_response = local_kl_chunk

        # Step 3: Compute returns on full response kl tensor.
        full_mask = loss_masks[i]
        assert full_mask.sum().item() > 0, f"Sequence at index {i} is fully masked."
        masked_kl = full_kl_response * full_mask
        rewards_for_seq = -kl_coef * masked_kl
        last_idx = full_mask.nonzero(as_tuple=True)[0][-1]
        rewards_for_seq[last_idx] += rewards[i]
        token_level_rewards.append(rewards_for_seq)

    if not token_level_rewards:
        return []

    max_len = max(rewards_for_seq.size(0) for rewards_for_seq in token_level_rewards)
    padded_rewards = token_level_rewards[0].new_zeros(len(token_level_rewards), max_len)
    for i, rewards_for_seq in enumerate(token_level_rewards):
        padded_rewards[i, : rewards_for_seq.size(0)] = rewards_for_seq

    padded_returns = chunked_discounted_returns(padded_rewards, gamma)

    final_returns_chunks = []
    for i, returns_for_seq in enumerate(padded_returns):
        returns_for_seq = returns_for_seq[: token_level_rewards[i].size(0)]
        if cp_size > 1:
            from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

            total_len, response_len = total_lengths[i], response_lengths[i]
            local_returns_chunk = slice_log_prob_with_cp(returns_for_seq, total_len, response_len)
        else:
            local_returns_chunk = returns_for_seq

        final_returns_chunks.append(local_returns_chunk)

    return final_returns_chunks


def distributed_masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    process_group: dist.ProcessGroup | None = None,
    shift_mean: bool = True,
    epsilon: float = 1e-8,
):
    """
    Performs whitening on a tensor using global statistics from all participating GPUs.

    It calculates the global mean and variance across all ranks in the default
    process group (the WORLD) and uses these global statistics to normalize the
    local data on each rank.

    Args:
        values (torch.Tensor): The local tensor of values to whiten.
        mask (torch.Tensor): The local mask corresponding to the values.
        process_group: The process group for all_reduce.
                      If None, uses the default world group.
        shift_mean (bool): If True, the output is zero-mean. Defaults to True.
        epsilon (float): A small value for numerical stability.

    Returns:
        torch.Tensor: The locally whitened tensor using global statistics.
    """
    # Calculate local intermediate statistics
    local_sum = (values * mask).sum()
    local_sum_sq = ((values**2) * mask).sum()
    local_mask_sum = mask.sum()

    stats_tensor = torch.tensor(
        [local_sum, local_sum_sq, local_mask_sum],
        device=values.device,
        dtype=torch.float32,
    )

    # Aggregate via all_reduce within the DP group
    dist.all_reduce(stats_tensor, group=process_group)

    # Calculate global stats from aggregated results
    global_sum, global_sum_sq, global_mask_sum = stats_tensor

    if global_mask_sum.item() == 0:
        raise ValueError("The global mask sum across all participating GPUs is zero.")

    global_mean = global_sum / global_mask_sum
    global_mean_sq = global_sum_sq / global_mask_sum
    global_var = global_mean_sq - global_mean**2

    # Bessel's correction for unbiased estimate
    if global_mask_sum.item() >= 2:
        bessel_correction = global_mask_sum / (global_mask_sum - 1)
        global_var = global_var * bessel_correction

    # Whiten local data using global stats
    whitened_values = (values - global_mean) * torch.rsqrt(global_var + epsilon)

    if not shift_mean:
        whitened_values += global_mean

    return whitened_values


@cache
def load_function(path):
    """
    Load a function from a module.
    :param path: The path to the function, e.g. "module.submodule.function".
    :return: The function object.
    """
    module_path, _, attr = path.rpartition(".")
    module = importlib.import_module(module_path)
    return getattr(module, attr)


def compute_advantages_and_returns(args: Namespace, rollout_data: RolloutBatch) -> None:
    """Compute advantages and returns in-place based on `args.advantage_estimator`.

    This function extracts rewards, log-probs, values, and masks from
    `rollout_data`, computes KL divergences, then applies the chosen advantage
    estimator. Supported methods: "grpo", "gspo", "cispo", "ppo",
    "reinforce_plus_plus", and "reinforce_plus_plus_baseline". When
    `args.normalize_advantages` is True, advantages are whitened across the
    data-parallel-with-context-parallel group using masked statistics.

    Early returns if both `log_probs` and `values` are None (intermediate
    pipeline stages).

    If ``args.custom_advantage_function_path`` is set, it is called after KL computation
    and must populate ``rollout_data["advantages"]`` and
    ``rollout_data["returns"]``.

    Args:
        args: Configuration specifying estimator type, KL coefficient,
            normalization settings, and other hyperparameters.
        rollout_data: Dict containing input lists ("log_probs", "ref_log_probs",
            "rewards", "values", "response_lengths", "loss_masks",
            "total_lengths"). Modified in-place to add "advantages" and
            "returns" keys, each mapping to lists of tensors per sample.
    """
    rollout_log_probs: list[torch.Tensor] | None = rollout_data.get("rollout_log_probs")
    log_probs: list[torch.Tensor] | None = (
        rollout_log_probs if args.use_rollout_logprobs else rollout_data.get("log_probs")
    )
    ref_log_probs: list[torch.Tensor] = rollout_data.get("ref_log_probs")
    rewards: list[float] = rollout_data.get("rewards")
    values: None | list[torch.Tensor] = rollout_data.get("values")
    response_lengths: list[int] = rollout_data.get("response_lengths")
    loss_masks: list[torch.Tensor] = rollout_data.get("loss_masks")
    total_lengths: list[int] = rollout_data.get("total_lengths")
    # return when not the last pp stage.
    if not mpu.is_pipeline_last_stage():
        return

    if args.kl_coef == 0 or not log_probs:
        # when kl_coef is 0, we won't compute ref_log_prob
        xs = log_probs or rollout_log_probs or values
        kl = [torch.zeros_like(x, dtype=torch.float32, device=x.device) for x in xs]
    else:
        kl = [
            compute_approx_kl(
                log_probs[i],
                ref_log_probs[i],
                kl_loss_type=args.kl_loss_type,
            )
            for i in range(len(log_probs))
        ]
    rollout_data["kl"] = kl

    if args.custom_advantage_function_path is not None:
        custom_adv_fn = load_function(args.custom_advantage_function_path)
        custom_adv_fn(args, rollout_data)
        advantages, returns = rollout_data["advantages"], rollout_data["returns"]

    elif args.advantage_estimator in ["grpo", "gspo", "cispo"]:
        rewards = torch.tensor(rewards, dtype=torch.float32, device=kl[0].device)
        returns = get_grpo_returns(rewards, kl)
        # TODO: is the copy necessary?
        advantages = [r for r in returns]

    elif args.advantage_estimator == "ppo":
        old_rewards = rewards
        rewards = []
        kl_coef = -args.kl_coef
        cp_rank = mpu.get_context_parallel_rank()
        for reward, per_token_kl in zip(old_rewards, kl, strict=False):
            token_level_rewards = per_token_kl * kl_coef
            if cp_rank == 0:
                token_level_rewards[-1] += reward
            rewards.append(token_level_rewards)
        advantages, returns = get_advantages_and_returns_batch(
            total_lengths, response_lengths, values, rewards, args.gamma, args.lambd
        )

    elif args.advantage_estimator == "reinforce_plus_plus":
        rewards = torch.tensor(rewards, dtype=torch.float32, device=kl[0].device)
        returns = get_reinforce_plus_plus_returns(
            rewards=rewards,
            kl=kl,
            loss_masks=loss_masks,
            response_lengths=response_lengths,
            total_lengths=total_lengths,
            kl_coef=args.kl_coef,
            gamma=args.gamma,
        )
        advantages = [r for r in returns]

    elif args.advantage_estimator == "reinforce_plus_plus_baseline":
        rewards = torch.tensor(rewards, dtype=torch.float32, device=kl[0].device)
        advantages = get_reinforce_plus_plus_baseline_advantages(
            rewards=rewards,
            kl=kl,
            loss_masks=loss_masks,
            kl_coef=args.kl_coef,
        )
        returns = advantages

    else:
        raise NotImplementedError(f"advantage_estimator {args.advantage_estimator} is not supported. ")

    # Apply on-policy distillation KL penalty to advantages (orthogonal to advantage estimator)
    if args.use_opd:
        apply_opd_kl_to_advantages(
            args=args,
            rollout_data=rollout_data,
            advantages=advantages,
            student_log_probs=log_probs,
        )

    # TODO: OpenRLHF always does advantages normalization but veRL doesn't seem to do it.
    if args.normalize_advantages:
        all_advs = torch.cat(advantages)
        cp_size = mpu.get_context_parallel_world_size()
        if cp_size == 1:
            all_masks = torch.cat(loss_masks)
        else:
            mask_chunks = []
            for i in range(len(advantages)):
                total_len = total_lengths[i]
                response_len = response_lengths[i]
                prompt_len = total_len - response_len
                _, _, _, token_offsets = get_logits_and_tokens_offset_with_cp(total_len, response_len)

                # Convert global offsets to response-space offsets
                s0, e0 = token_offsets[0]
                s1, e1 = token_offsets[1]
                res_s0, res_e0 = max(0, s0 - prompt_len), max(0, e0 - prompt_len)
                res_s1, res_e1 = max(0, s1 - prompt_len), max(0, e1 - prompt_len)

                local_mask_parts = []
                full_mask = loss_masks[i]
                if res_e0 > res_s0:
                    local_mask_parts.append(full_mask[res_s0:res_e0])
                if res_e1 > res_s1:
                    local_mask_parts.append(full_mask[res_s1:res_e1])

                # Concatenate the parts to form the final mask chunk for this rank and this sequence
                local_mask_chunk = (
                    torch.cat(local_mask_parts)
                    if local_mask_parts
                    else torch.tensor([], device=all_advs.device, dtype=full_mask.dtype)
                )
                mask_chunks.append(local_mask_chunk)

            all_masks = torch.cat(mask_chunks)

        assert (
            all_advs.size() == all_masks.size()
        ), f"Shape mismatch before whitening: advantages {all_advs.size()}, masks {all_masks.size()}"
        # `all_advs` / `all_masks` only cover the tokens this CP rank owns, so the
        # statistics must be reduced over the DP group *with* context parallel.
        # The CP-excluding group makes every CP rank whiten its own zigzag slice
        # with its own mean/var, i.e. the two halves of one sequence get
        # different affine transforms.
        #
        # This has to stay unconditional: a CP rank can legitimately own zero
        # response tokens (prompt-heavy sequences put both of its chunks inside
        # the prompt), and skipping the collective on just that rank would
        # desync the all_reduce. `distributed_masked_whiten` handles an empty
        # local tensor — it contributes 0 to the reduced sums.
        dp_cp_group = mpu.get_data_parallel_group(with_context_parallel=True)

        whitened_advs_flat = distributed_masked_whiten(
            all_advs,
            all_masks,
            process_group=dp_cp_group,
            shift_mean=True,
        )
        chunk_lengths = [chunk.size(0) for chunk in advantages]
        advantages = list(torch.split(whitened_advs_flat, chunk_lengths))

    rollout_data["advantages"] = advantages
    rollout_data["returns"] = returns


# ------------------------------------------------------------------------------------ the harness

RESTATED = {"slime/utils/ppo_utils.py": [chunked_discounted_returns, chunked_gae, get_advantages_and_returns_batch,
                                         get_reinforce_plus_plus_returns],
            "slime/utils/distributed_utils.py": [distributed_masked_whiten],
            "slime/utils/misc.py": [load_function.__wrapped__],
            "slime/backends/megatron_utils/loss.py": [compute_advantages_and_returns]}


@needs_sources
def test_restatements_are_verbatim():
    assert_verbatim(RESTATED)


@pytest.fixture(autouse=True)
def megatron(monkeypatch):
    """``from megatron.core import mpu`` (inside slime's functions) finds the stand-in."""
    for name in ("megatron", "megatron.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["megatron.core"].mpu = mpu


def rollout(seed, S=9, kl=True):
    g = np.random.default_rng(seed)
    lengths = [int(n) for n in g.integers(1, 41, S)]
    lengths[0], lengths[1] = 1, 2
    f = lambda n: torch.tensor(g.normal(size=n), dtype=torch.float32)  # noqa: E731
    masks = []
    for n in lengths:
        m = torch.ones(n, dtype=torch.int32)
        if n > 3 and g.random() < 0.6:  # a tool span
            a = int(g.integers(1, n - 1))
            m[a:a + int(g.integers(1, 4))] = 0
        masks.append(m)
    data = {"rewards": [float(x) for x in g.normal(size=S)], "values": [f(n) for n in lengths],
            "response_lengths": lengths, "loss_masks": masks, "total_lengths": [n + 5 for n in lengths],
            "log_probs": [-f(n).abs() for n in lengths]}
    data["ref_log_probs"] = [-f(n).abs() for n in lengths] if kl else None
    return data


def _args(estimator, custom=None, kl_coef=0.1, normalize=False, gamma=0.95, lambd=0.9):
    return Namespace(advantage_estimator=estimator, custom_advantage_function_path=custom, kl_coef=kl_coef,
                     kl_loss_type="k1", use_rollout_logprobs=False, use_opd=False, normalize_advantages=normalize,
                     gamma=gamma, lambd=lambd)


def close(ours, theirs, what):
    """float32: within 1e-5 of the sample's scale (its largest magnitude, at least 1)."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape, ours.dtype)
    bad = (ours - theirs).abs() > 1e-5 * theirs.abs().max().clamp(min=1)
    assert not bad.any(), f"{what}: {ours[bad][:5]} vs {theirs[bad][:5]}"


# ----------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("estimator,ours", [("ppo", "gae"), ("reinforce_plus_plus", "reinforce_plus_plus")])
@pytest.mark.parametrize("kl_coef,normalize", [(0.0, False), (0.1, False), (0.1, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_custom_function_equals_slime(estimator, ours, kl_coef, normalize, seed):
    data = rollout(seed, kl=kl_coef != 0)
    want, got = copy.deepcopy(data), copy.deepcopy(data)
    compute_advantages_and_returns(_args(estimator, kl_coef=kl_coef, normalize=normalize), want)
    compute_advantages_and_returns(_args("grpo", f"rollbuf.integrations.slime.{ours}", kl_coef, normalize), got)
    for key in ("advantages", "returns"):
        assert len(got[key]) == len(want[key]) == len(data["response_lengths"])
        for i, (a, b) in enumerate(zip(got[key], want[key])):
            close(a, b, f"{estimator} {key}[{i}]")


@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.0, 0.5), (0.9, 0.0)])
def test_gae_hyper_parameters(gamma, lambd):
    data = rollout(5)
    want, got = copy.deepcopy(data), copy.deepcopy(data)
    compute_advantages_and_returns(_args("ppo", gamma=gamma, lambd=lambd), want)
    got["kl"] = want["kl"]
    R.gae(_args("ppo", gamma=gamma, lambd=lambd), got)
    for a, b in zip(got["advantages"], want["advantages"]):
        close(a, b, f"advantages gamma={gamma} lambd={lambd}")


def test_bad_inputs_name_the_argument():
    data = rollout(2)
    data["kl"] = [torch.zeros(n) for n in data["response_lengths"]]
    args = _args("ppo")
    with pytest.raises(ValueError, match="values"):
        R.gae(args, data | {"values": None})
    with pytest.raises(ValueError, match="context-parallel"):
        R.gae(args, data | {"values": [v[:1] for v in data["values"]]})
    with pytest.raises(ValueError, match="rewards"):
        R.gae(args, data | {"rewards": data["rewards"][:-1]})
    with pytest.raises(ValueError, match="response_lengths"):
        R.gae(args, data | {"response_lengths": [0] * len(data["values"])})
    masks = [m.clone() for m in data["loss_masks"]]
    masks[3][:] = 0
    with pytest.raises(ValueError, match=r"loss_masks'\]\[3\] is all zeros"):
        R.reinforce_plus_plus(args, data | {"loss_masks": masks})


def test_the_path_slime_loads():
    """slime's ``load_function`` (module path, then the attribute) finds rollbuf's functions."""
    for name in ("gae", "reinforce_plus_plus"):
        assert load_function(f"rollbuf.integrations.slime.{name}") is getattr(importlib.import_module(
            "rollbuf.integrations.slime"), name)
