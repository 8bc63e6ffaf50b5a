"""rollbuf.integrations.areal against AReaL 1.0.4's own code, RESTATED below: AReaL's modules import
its training stack (its engines, its RPC layer, their GPU dependencies) at the top, so CI cannot import
them. Copied verbatim from the areal 1.0.4 wheel:

* ``PPOActor._compute_advantages`` from ``areal/trainer/ppo/actor.py``;
* ``KLEstimator`` from ``areal/utils/data.py`` (the KL rewards' estimator);
* ``reward_overlong_penalty`` from ``areal/utils/functional/functional.py``.

``test_restatements_are_verbatim`` compares each with the shipped source (its AST) where
``ROLLBUF_ORACLE_SOURCES`` names a folder holding the unpacked wheel's ``areal`` package; skipped
without it. AReaL's ``Normalization`` (``adv_norm``, ``reward_norm``) is an object on the actor that
both sides call alike: a stand-in here.

The restated class lives in a stand-in ``areal.trainer.ppo.actor`` module put in ``sys.modules``, so
``rollbuf.integrations.areal.patch()`` runs its real import. Compared: the restated
``_compute_advantages`` and the patched one on random padded batches (prompts and responses of random
lengths, multi-turn loss masks, rows that fill the width and so have no EOS, rows with no response
token, widths 1, 2 and odd), over AReaL's configuration switches; every key of the returned dict."""

from __future__ import annotations

import copy
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch

from restated import assert_verbatim, needs_sources
from rollbuf.integrations import areal as R

# ------------------------------------------------ AReaL 1.0.4, restated verbatim (see the docstring)

def reward_overlong_penalty(
    data: dict[str, Any],
    overlong_tokens: int,
    overlong_penalty_factor: float,
    max_response_length: int,
) -> dict[str, Any]:
    reward_score = data["rewards"]
    input_ids = data["input_ids"]
    response_lengths = (data["loss_mask"].sum(dim=-1)).long()
    batch_size = input_ids.shape[0]
    for sample_idx in range(batch_size):
        reward_score_cur = reward_score[sample_idx]
        response_length_cur = response_lengths[sample_idx]
        expected_len = max_response_length - overlong_tokens
        exceed_len = response_length_cur - expected_len
        overlong_reward = min(
            -exceed_len / overlong_tokens * overlong_penalty_factor, 0
        )
        reward_score_cur += overlong_reward
        reward_score[sample_idx] = reward_score_cur

    data["rewards"] = reward_score
    return data


class KLEstimator:
    """
    KL divergence estimator, supports k1, k2 and k3.
    """

    def __init__(self, kl_estimator: str = "k1", apply_clamp: bool = True):
        self.kl_estimator = kl_estimator
        if kl_estimator not in ["k1", "k2", "k3"]:
            raise ValueError(
                f"Invalid KL estimator: {kl_estimator}. Valid choices: k1, k2, k3"
            )
        self.apply_clamp = apply_clamp

    def __call__(
        self, log_probs: torch.Tensor, log_probs_base: torch.Tensor
    ) -> torch.Tensor:
        return self._compute_approx_kl(
            log_probs, log_probs_base, self.kl_estimator, self.apply_clamp
        )

    # adapted from https://github.com/OpenRLHF/OpenRLHF/blob/main/openrlhf/models/utils.py#L7
    @staticmethod
    def _compute_approx_kl(
        log_probs: torch.Tensor,
        log_probs_base: torch.Tensor,
        kl_estimator: str = "k1",
        apply_clamp: bool = True,
    ) -> torch.Tensor:
        """
        Compute the approximate KL divergence between two distributions.
        Schulman blog: http://joschu.net/blog/kl-approx.html

        Args:
            log_probs: Log probabilities of the new distribution.
            log_probs_base: Log probabilities of the base distribution.
        """

        if kl_estimator == "k1":
            log_ratio = log_probs.float() - log_probs_base.float()

        # The k2 estimator is the non negative kl approximation in
        # http://joschu.net/blog/kl-approx.html
        # The k2_loss is approximately equivalent to the
        # one-step KL divergence penalty with the k1 estimator
        # used in https://arxiv.org/pdf/2310.10505.
        if kl_estimator == "k2":
            log_ratio = log_probs.float() - log_probs_base.float()
            log_ratio = log_ratio**2 / 2.0

        # The k3 estimator is the non negative kl approximation in
        # http://joschu.net/blog/kl-approx.html
        if kl_estimator == "k3":
            log_ratio = log_probs.float() - log_probs_base.float()
            log_ratio = -log_ratio
            log_ratio = log_ratio.exp() - 1 - log_ratio

        if apply_clamp:
            log_ratio = log_ratio.clamp(min=-10, max=10)
        return log_ratio


class PPOActor:
    def _compute_advantages(self, data: dict[str, Any]) -> dict[str, Any]:
        bs = data["input_ids"].shape[0]
        max_seqlen = data["input_ids"].shape[1]
        batch_indices = torch.arange(
            bs, device=data["input_ids"].device, dtype=torch.long
        )

        # Reward Penalty on length
        if self.config.overlong_reward_penalty:
            overlong_tokens = self.config.overlong_tokens
            overlong_penalty_factor = self.config.overlong_penalty_factor

            assert overlong_tokens is not None
            assert overlong_penalty_factor is not None
            data = reward_overlong_penalty(
                data,
                overlong_tokens=overlong_tokens,
                overlong_penalty_factor=overlong_penalty_factor,
                max_response_length=self.config.max_new_tokens,
            )

        # Reward Scaling
        reward_score = data["rewards"]
        reward_score = (reward_score + self.reward_bias) * self.reward_scaling
        reward_score = torch.clip(
            reward_score, max=self.reward_clip, min=-self.reward_clip
        )
        if self.reward_norm:
            reward_score = self.reward_norm(reward_score)

        loss_mask = data["loss_mask"].float()
        loss_mask = torch.roll(loss_mask, shifts=-1, dims=-1)
        # Apply the mask to log probabilities.
        if not self.config.use_decoupled_loss and self.config.recompute_logprob:
            # Overwrite logprobs produced by the inference engine
            prox_logp_value = data["prox_logp"]
            if prox_logp_value is None:
                raise ValueError(
                    "prox_logp is None but recompute_logprob=True. "
                    "This indicates compute_logp() was skipped incorrectly."
                )
            old_logp = data["logprobs"] = prox_logp_value
        else:
            old_logp = torch.roll(data["logprobs"], shifts=-1, dims=-1)
            if not self.config.use_decoupled_loss:
                # prox logp not available, use inferenced logp
                data["prox_logp"] = old_logp
        ref_logp = data.get("ref_logp")
        if ref_logp is None:
            ref_logp = torch.zeros_like(old_logp)
        ref_logp *= loss_mask
        old_logp *= loss_mask

        # Compute KL-regularized rewards.
        attn_mask = data["attention_mask"]
        seqlens = attn_mask.sum(-1).long()
        seq_no_eos_mask = seqlens == attn_mask.shape[1]
        rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp)
        kl_rewards = rewards.clone()
        # KL rewards at the next token after eos is zero.
        rewards[batch_indices, seqlens - 1] = 0
        indices = torch.clip(seqlens - 2, min=0)
        if self.mask_no_eos_with_zero:
            rewards[batch_indices, indices] += torch.where(
                seq_no_eos_mask, 0, reward_score
            )
        else:
            rewards[batch_indices, indices] += reward_score

        # Compute GAE.
        if "values" not in data:
            values = torch.zeros_like(rewards)
        else:
            values = data["values"]
        advantages_reversed = [
            torch.zeros(bs, dtype=torch.float32, device=values.device)
        ]
        lastgaelam = 0
        nextvalues = values[:, max_seqlen - 1] * seq_no_eos_mask
        for t in reversed(range(max_seqlen - 1)):
            delta = rewards[:, t] + self.discount * nextvalues - values[:, t]
            newgaelam = delta + self.discount * self.gae_lambda * lastgaelam

            # Skip tokens that do not contribute to the loss
            mask = loss_mask[:, t]
            nextvalues = nextvalues * (1 - mask) + values[:, t] * mask
            lastgaelam = lastgaelam * (1 - mask) + newgaelam * mask
            advantages_reversed.append(lastgaelam)

        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        data["returns"] = advantages + values

        # Optionally perform advantage normalization.
        if self.adv_norm is not None:
            advantages = self.adv_norm(advantages, loss_mask)

        # Store data in the dict.
        data["advantages"] = advantages
        data["kl_rewards"] = kl_rewards
        data["tot_rewards"] = rewards
        data["loss_mask"] = loss_mask
        # because we have rolled old_logp by -1
        data["logprobs"] = old_logp

        return data


# ------------------------------------------------------------------------------------ the harness

RESTATED = {"areal/trainer/ppo/actor.py": [PPOActor._compute_advantages],
            "areal/utils/data.py": [KLEstimator.__init__, KLEstimator.__call__, KLEstimator._compute_approx_kl],
            "areal/utils/functional/functional.py": [reward_overlong_penalty]}


@needs_sources
def test_restatements_are_verbatim():
    assert_verbatim(RESTATED)


@pytest.fixture
def actor_module(monkeypatch):
    """Stand-ins for ``areal.trainer.ppo.actor`` (its ``PPOActor`` a fresh subclass of the restated
    one) and ``areal.utils.functional``."""
    for name in ("areal", "areal.trainer", "areal.trainer.ppo", "areal.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    mod = types.ModuleType("areal.trainer.ppo.actor")
    mod.PPOActor = type("PPOActor", (PPOActor,), {})
    functional = types.ModuleType("areal.utils.functional")
    functional.reward_overlong_penalty = reward_overlong_penalty
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, functional.__name__, functional)
    yield mod
    R.unpatch(mod.PPOActor)


def _norm(x, loss_mask=None):
    """A stand-in for AReaL's Normalization: whitening over the masked-in entries."""
    m = torch.ones_like(x) if loss_mask is None else loss_mask
    mean = (x * m).sum() / m.sum()
    return (x - mean) / (((x - mean) ** 2 * m).sum() / m.sum() + 1e-5).sqrt()


def _actor(cls, *, decoupled=False, recompute=False, mask_no_eos=False, overlong=False, norms=False,
           discount=0.9, gae_lambda=0.8):
    a = cls.__new__(cls)
    a.config = types.SimpleNamespace(overlong_reward_penalty=overlong, overlong_tokens=4, overlong_penalty_factor=0.5,
                                     max_new_tokens=12, use_decoupled_loss=decoupled, recompute_logprob=recompute)
    a.reward_bias, a.reward_scaling, a.reward_clip = -0.5, 2.0, 5.0
    a.kl_ctl, a.kl_estimator = 0.1, KLEstimator("k3")
    a.adv_norm = a.reward_norm = _norm if norms else None
    a.discount, a.gae_lambda, a.mask_no_eos_with_zero = discount, gae_lambda, mask_no_eos
    return a


def batch(seed, bs=7, L=17, values=True, ref=True):
    """AReaL's padded batch: prompt then response, right padding; some rows fill the width (no EOS),
    one has no response token, one no prompt, some have masked tool spans inside the response."""
    g = np.random.default_rng(seed)
    seqlens = torch.tensor(g.integers(1, L + 1, bs))
    seqlens[: max(1, bs // 3)] = L  # no EOS
    prompt = torch.minimum(torch.tensor(g.integers(1, max(2, L // 2), bs)), seqlens)
    prompt[1] = 0  # no prompt: the rolled loss mask's last position is 1 (AReaL's loop never reads it)
    pos = torch.arange(L)
    attn = (pos < seqlens[:, None]).long()
    loss_mask = ((pos >= prompt[:, None]) & (pos < seqlens[:, None])).long()
    loss_mask[-1] = 0  # no response token
    for i in range(bs):
        if g.random() < 0.5 and L > 4:
            a = int(g.integers(1, L - 1))
            loss_mask[i, a:a + int(g.integers(1, 3))] = 0
    f = lambda *shape: torch.tensor(g.normal(size=shape), dtype=torch.float32)  # noqa: E731
    data: dict[str, Any] = {"input_ids": torch.zeros(bs, L, dtype=torch.long), "attention_mask": attn,
                            "loss_mask": loss_mask, "logprobs": -f(bs, L).abs(), "rewards": f(bs),
                            "prox_logp": -f(bs, L).abs()}
    if values:
        data["values"] = f(bs, L)
    if ref:
        data["ref_logp"] = -f(bs, L).abs()
    return data


def close(ours, theirs, what):
    """float32: within 1e-5 of the row's scale (its largest magnitude, at least 1)."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape, ours.dtype)
    scale = theirs.abs().amax(-1, keepdim=True).clamp(min=1) if theirs.dim() else theirs.abs().clamp(min=1)
    bad = (ours - theirs).abs() > 1e-5 * scale
    assert not bad.any(), f"{what}: {ours[bad][:5]} vs {theirs[bad][:5]}"


def _compare(actor_module, data, **kw):
    want = _actor(PPOActor, **kw)._compute_advantages(copy.deepcopy(data))
    got = _actor(R.patch(), **kw)._compute_advantages(copy.deepcopy(data))
    assert set(got) == set(want), (set(got) ^ set(want))
    for key, b in want.items():
        a = got[key]
        if isinstance(b, torch.Tensor):
            close(a, b, f"{key} {kw}")
        else:
            assert a is None and b is None, key


# ----------------------------------------------------------------------------------------- tests

SWITCHES = [dict(), dict(decoupled=True), dict(recompute=True), dict(mask_no_eos=True), dict(overlong=True),
            dict(norms=True), dict(discount=1.0, gae_lambda=1.0), dict(discount=0.0, gae_lambda=0.5)]


@pytest.mark.parametrize("kw", SWITCHES, ids=lambda kw: ",".join(kw) or "defaults")
@pytest.mark.parametrize("seed", [0, 1])
def test_compute_advantages_equals_areal(actor_module, kw, seed):
    _compare(actor_module, batch(seed), **kw)


@pytest.mark.parametrize("L", [1, 2, 5, 31])
@pytest.mark.parametrize("values,ref", [(True, True), (False, False)])
def test_widths_and_missing_values(actor_module, L, values, ref):
    _compare(actor_module, batch(L, bs=5, L=L, values=values, ref=ref), norms=True)


def test_gae_alone_carries_and_bootstraps():
    """AReaL's conventions, by hand: a masked position carries the next unmasked advantage, the last
    position is 0, a row without EOS bootstraps from its last value, one with EOS does not."""
    r = torch.tensor([[1.0, 0.0, 2.0, 0.0]] * 2)
    v = torch.tensor([[0.5, 9.0, 0.25, 4.0]] * 2)
    m = torch.tensor([[1, 0, 1, 1]] * 2)  # the last position's flag is never read
    adv, ret = R.gae(r, v, m, torch.tensor([False, True]), 0.5, 1.0)
    a2 = torch.tensor([2.0 - 0.25, 2.0 + 0.5 * 4.0 - 0.25])  # terminal; bootstrapped from V = 4
    a0 = 1.0 + 0.5 * 0.25 - 0.5 + 0.5 * a2
    want = torch.stack([a0, a2, a2, torch.zeros(2)], 1)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, want + v)


def test_bad_inputs_name_the_argument(actor_module):
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="loss_mask"):
        R.gae(r, r, torch.ones(3), torch.zeros(2, dtype=torch.bool), 1.0, 1.0)
    with pytest.raises(ValueError, match="values"):
        R.gae(r, torch.zeros(2, 4), torch.ones(2, 3), torch.zeros(2, dtype=torch.bool), 1.0, 1.0)
    with pytest.raises(ValueError, match="truncated"):
        R.gae(r, r, torch.ones(2, 3), torch.zeros(3, dtype=torch.bool), 1.0, 1.0)
    actor = _actor(R.patch(), recompute=True)
    data = batch(0)
    data["prox_logp"] = None
    with pytest.raises(ValueError, match="prox_logp"):
        actor._compute_advantages(data)
    actor = _actor(R.patch(), overlong=True)
    actor.config.overlong_tokens = None
    with pytest.raises(ValueError, match="overlong_tokens"):
        actor._compute_advantages(batch(0))


def test_patch_and_unpatch(actor_module):
    cls = actor_module.PPOActor
    assert R.patch() is cls and R.patch() is cls and cls._compute_advantages is R.compute_advantages
    R.unpatch()
    assert cls._compute_advantages is PPOActor._compute_advantages and "_compute_advantages" not in vars(cls)
    own = type("Own", (), {"_compute_advantages": lambda self, data: data})
    saved = own._compute_advantages
    R.patch(own)
    R.unpatch(own)
    assert own._compute_advantages is saved
