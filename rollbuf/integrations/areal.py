"""AReaL 1.0.4's advantage computation (``PPOActor._compute_advantages`` in
``areal/trainer/ppo/actor.py``) with its GAE loop over token positions replaced by one
:func:`rollbuf.integrations.llm.compute_gae_advantage_return` call (:func:`gae`), AReaL's conventions
kept: the loss mask rolled left by one (position ``t`` holds the action that produces token ``t + 1``),
masked positions skipped (the value and the advantage carried across them), the last position never
in the recursion, a sequence that fills the padded width (no EOS) bootstrapping from the value at the
last position. :func:`patch` puts :func:`compute_advantages` on AReaL's ``PPOActor``. Conventions and
differences: docs/howto/areal.md.
"""

from __future__ import annotations

import torch

from rollbuf.integrations import llm

__all__ = ["gae", "compute_advantages", "patch", "unpatch"]

_saved: dict = {}  # patched class -> its own _compute_advantages (None: inherited)


def gae(rewards, values, loss_mask, seq_no_eos_mask, discount, gae_lambda):
    """AReaL's GAE loop as one scan → ``(advantages, returns)`` ``[bs, max_seqlen]``. ``loss_mask``:
    the rolled mask (AReaL's at that point of ``_compute_advantages``); ``seq_no_eos_mask`` ``[bs]``:
    the rows that bootstrap from ``values[:, -1]``. As AReaL's loop: masked positions carry the next
    unmasked position's advantage (0 after the last), the last position's advantage is 0, and
    ``returns = advantages + values`` at every position."""
    if not isinstance(loss_mask, torch.Tensor) or loss_mask.dim() != 2 or loss_mask.shape[1] < 1:
        raise ValueError(f"loss_mask must be a [bs, max_seqlen] tensor, got {getattr(loss_mask, 'shape', loss_mask)}")
    if not isinstance(values, torch.Tensor) or values.shape != loss_mask.shape:
        raise ValueError(f"values must have loss_mask's shape {tuple(loss_mask.shape)}, "
                         f"got {tuple(getattr(values, 'shape', ())) or type(values).__name__}")
    m = torch.nn.functional.pad((loss_mask != 0)[:, :-1], (0, 1))  # the loop never visits the last position
    return llm.compute_gae_advantage_return(rewards, values, m, discount, gae_lambda, truncated=seq_no_eos_mask,
                                            bootstrap_values=values[:, -1], fill_masked="carry")


def _reward_score(self, data):
    """The sequence rewards after AReaL's overlong penalty, bias, scaling, clip and normalisation."""
    cfg = self.config
    if cfg.overlong_reward_penalty:
        from areal.utils.functional import reward_overlong_penalty

        if cfg.overlong_tokens is None or cfg.overlong_penalty_factor is None:
            raise ValueError("config.overlong_tokens and config.overlong_penalty_factor are required by "
                             "config.overlong_reward_penalty")
        data = reward_overlong_penalty(data, overlong_tokens=cfg.overlong_tokens,
                                       overlong_penalty_factor=cfg.overlong_penalty_factor,
                                       max_response_length=cfg.max_new_tokens)
    score = torch.clip((data["rewards"] + self.reward_bias) * self.reward_scaling, max=self.reward_clip,
                       min=-self.reward_clip)
    return (self.reward_norm(score) if self.reward_norm else score), data


def _old_logp(self, data):
    """AReaL's old log-probabilities (rolled, unless recomputed), ``data["prox_logp"]`` set as AReaL does."""
    cfg = self.config
    if not cfg.use_decoupled_loss and cfg.recompute_logprob:
        if data["prox_logp"] is None:
            raise ValueError("prox_logp is None but recompute_logprob=True. "
                             "This indicates compute_logp() was skipped incorrectly.")
        data["logprobs"] = data["prox_logp"]
        return data["logprobs"]
    old_logp = torch.roll(data["logprobs"], shifts=-1, dims=-1)
    if not cfg.use_decoupled_loss:
        data["prox_logp"] = old_logp
    return old_logp


def compute_advantages(self, data):
    """``PPOActor._compute_advantages`` (``self``: AReaL's ``PPOActor``, ``data``: its padded batch
    dict) with :func:`gae` in place of the loop; the rest is AReaL's, step for step: reward shaping,
    the rolled loss mask and log-probabilities, KL rewards (0 at the position after the last token,
    the score at the position before it), advantage normalisation, the keys it writes."""
    bs = data["input_ids"].shape[0]
    batch_indices = torch.arange(bs, device=data["input_ids"].device, dtype=torch.long)
    reward_score, data = _reward_score(self, data)
    loss_mask = torch.roll(data["loss_mask"].float(), shifts=-1, dims=-1)
    old_logp = _old_logp(self, data)
    ref_logp = data.get("ref_logp")
    if ref_logp is None:
        ref_logp = torch.zeros_like(old_logp)
    ref_logp *= loss_mask
    old_logp *= loss_mask
    attn_mask = data["attention_mask"]
    seqlens = attn_mask.sum(-1).long()
    seq_no_eos_mask = seqlens == attn_mask.shape[1]
    rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp)
    kl_rewards = rewards.clone()
    rewards[batch_indices, seqlens - 1] = 0  # no KL reward at the position after the last token
    indices = torch.clip(seqlens - 2, min=0)
    rewards[batch_indices, indices] += torch.where(seq_no_eos_mask, 0, reward_score) \
        if self.mask_no_eos_with_zero else reward_score
    values = data["values"] if "values" in data else torch.zeros_like(rewards)
    advantages, data["returns"] = gae(rewards, values, loss_mask, seq_no_eos_mask, self.discount, self.gae_lambda)
    if self.adv_norm is not None:
        advantages = self.adv_norm(advantages, loss_mask)
    data.update(advantages=advantages, kl_rewards=kl_rewards, tot_rewards=rewards, loss_mask=loss_mask,
                logprobs=old_logp)
    return data


def _actor():
    from areal.trainer.ppo.actor import PPOActor

    return PPOActor


def patch(cls=None):
    """Make :func:`compute_advantages` the ``_compute_advantages`` of AReaL's ``PPOActor`` (or ``cls``);
    returns the class. It changes the class in the process it runs in: run it in each process that
    computes advantages (the training engine's). Patching twice keeps the first original;
    :func:`unpatch` restores it."""
    cls = _actor() if cls is None else cls
    _saved.setdefault(cls, vars(cls).get("_compute_advantages"))
    cls._compute_advantages = compute_advantages
    return cls


def unpatch(cls=None):
    """Give ``cls`` (default AReaL's ``PPOActor``) its own ``_compute_advantages`` back."""
    cls = _actor() if cls is None else cls
    if cls in _saved:
        fn = _saved.pop(cls)
        if fn is None:
            del cls._compute_advantages
        else:
            cls._compute_advantages = fn
