"""slime's custom advantage functions (``--custom-advantage-function-path``, called as
``fn(args, rollout_data)`` after slime has put the per-token KL in ``rollout_data["kl"]``; each sets
``rollout_data["advantages"]`` and ``["returns"]``, lists of ``[response_length]`` tensors). The
samples are packed end to end (``cu_seqlens``) and each estimator is one
:mod:`rollbuf.integrations.llm` call over the pack, with the numbers of slime's own branch
(``slime/backends/megatron_utils/loss.py``, ``compute_advantages_and_returns``). slime whitens the
result afterwards as usual (``--normalize-advantages``). Without context parallelism only: every
sample's tensors must hold its whole response. docs/howto/slime_skyrl.md.
"""

from __future__ import annotations

import torch

from rollbuf.integrations import llm

__all__ = ["gae", "reinforce_plus_plus"]


def _pack(rollout_data, *keys):
    """The tensors of ``keys`` packed end to end ``[total]``, ``cu_seqlens`` ``[S + 1]`` and the lengths."""
    lengths = [int(n) for n in rollout_data["response_lengths"]]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"rollout_data['response_lengths'] must hold one positive length per sample, got {lengths}")
    packed = []
    for key in keys:
        xs = rollout_data.get(key)
        if xs is None:
            raise ValueError(f"rollout_data[{key!r}] is missing" + (" (GAE needs a critic)" if key == "values" else ""))
        if len(xs) != len(lengths) or any(x.numel() != n for x, n in zip(xs, lengths, strict=False)):
            raise ValueError(f"rollout_data[{key!r}] must hold one [response_length] tensor per sample (lengths "
                             f"{lengths}), got {[x.numel() for x in xs]}: context-parallel shards are not supported")
        packed.append(torch.cat([x.reshape(-1) for x in xs]))
    cu = torch.tensor([0, *lengths], device=packed[0].device).cumsum(0).to(torch.int32)
    return packed, cu, lengths


def _scores(rollout_data, like):
    r = torch.as_tensor(rollout_data["rewards"], dtype=torch.float32, device=like.device)
    if r.shape != (len(rollout_data["response_lengths"]),):
        raise ValueError(f"rollout_data['rewards'] must hold one number per sample, got shape {tuple(r.shape)}")
    return r


def gae(args, rollout_data):
    """slime's ``ppo`` estimator: token rewards ``−args.kl_coef · kl`` plus the sample's reward at its
    last response token, GAE(``args.gamma``, ``args.lambd``) over every response token (slime's GAE
    does not read the loss mask), each response ending terminally; ``returns = advantages + values``.
    One :func:`rollbuf.integrations.llm.packed_gae` call; outputs in the values' dtype."""
    (kl, values), cu, lengths = _pack(rollout_data, "kl", "values")
    r = (kl * -args.kl_coef).index_add(0, cu[1:].long() - 1, _scores(rollout_data, kl).to(kl.dtype)).to(values.dtype)
    adv, ret = llm.packed_gae(r, values, torch.ones_like(r, dtype=torch.bool), cu, args.gamma, args.lambd,
                              check=False)
    rollout_data["advantages"], rollout_data["returns"] = list(adv.split(lengths)), list(ret.split(lengths))


def reinforce_plus_plus(args, rollout_data):
    """slime's ``reinforce_plus_plus`` estimator: token rewards ``−args.kl_coef · kl · loss_mask`` plus
    the sample's reward at its last unmasked token, discounted (``args.gamma``) through every response
    token, a masked one adding nothing (``mask_mode="zero"``); ``advantages`` are the returns. One
    :func:`rollbuf.integrations.llm.packed_discounted_returns` call. A sample whose loss mask is all
    zeros is a ``ValueError`` (slime asserts)."""
    (kl, mask), cu, lengths = _pack(rollout_data, "kl", "loss_masks")
    m = mask != 0
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=m.device), cu.diff().long())
    pos = torch.arange(m.numel(), device=m.device)
    last = pos.new_full((len(lengths),), -1).scatter_reduce(0, seg, torch.where(m, pos, -1), "amax")
    if bool((last < 0).any()):
        raise ValueError(f"rollout_data['loss_masks'][{int((last < 0).nonzero()[0])}] is all zeros: "
                         "the sample's reward has no token to go to")
    r = (kl * -args.kl_coef).index_add(0, last, _scores(rollout_data, kl).to(kl.dtype))
    g = llm.packed_discounted_returns(r, m, cu, args.gamma, mask_mode="zero", fill_masked="keep", check=False)
    rollout_data["returns"] = list(g.split(lengths))
    rollout_data["advantages"] = list(rollout_data["returns"])
