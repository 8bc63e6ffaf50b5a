"""rollbuf.integrations.llm against plain loops that follow verl's multi-turn semantics.

The oracles are written here from verl's loop (``verl/trainer/ppo/core_algos.py``,
``compute_gae_advantage_return``): t from T−1 down, ``delta = r_t + γ·nextvalues − V_t``,
``lastgaelam_ = delta + γλ·lastgaelam``, and across ``response_mask = 0`` positions ``nextvalues``
and ``lastgaelam`` are carried unchanged; ``returns = advantages + values``. The row end is
terminal (``nextvalues = 0`` at the start), or bootstraps (``nextvalues = V(s')``) for a truncated
row. They compute in float64 and select with ``torch.where`` so that NaN at masked positions stays
out (verl's literal ``x * mask`` arithmetic is checked to agree on finite inputs).

``python tests/test_llm.py`` prints the worked-example block of docs/llm.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rollbuf
import rollbuf.functional as F
from benchmarks.oracles import verl_multi_turn_gae
from rollbuf import backends
from rollbuf.integrations import llm

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


# ----------------------------------------------------------------------------------- oracles


def verl_gae_loop(rewards, values, mask, gamma, lam, bootstrap=None):
    """verl's multi-turn GAE, float64, NaN-safe; ``bootstrap`` [B] (None: terminal row ends)."""
    r, v = rewards.double(), values.double()
    m = mask != 0
    B, T = r.shape
    nextvalues = torch.zeros(B, dtype=torch.float64) if bootstrap is None else bootstrap.double().clone()
    lastgaelam = torch.zeros(B, dtype=torch.float64)
    adv = torch.zeros(B, T, dtype=torch.float64)
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = torch.where(m[:, t], v[:, t], nextvalues)
        lastgaelam = torch.where(m[:, t], lastgaelam_, lastgaelam)
        adv[:, t] = lastgaelam
    return adv, adv + v


def verl_gae_literal(token_level_rewards, values, response_mask, gamma, lam):
    """verl's code as written (mask arithmetic, no bootstrap); finite inputs only."""
    return verl_multi_turn_gae(token_level_rewards, values, response_mask, gamma, lam)


def returns_loop(rewards, mask, gamma, bootstrap=None):
    """Discounted returns with masked tokens skipped; masked tokens hold the carried return of the
    next model token (0 if none)."""
    r = rewards.double()
    m = mask != 0
    B, T = r.shape
    running = torch.zeros(B, dtype=torch.float64) if bootstrap is None else bootstrap.double().clone()
    seen = torch.zeros(B, dtype=torch.bool)
    out = torch.zeros(B, T, dtype=torch.float64)
    for t in reversed(range(T)):
        running = torch.where(m[:, t], r[:, t] + gamma * running, running)
        seen = seen | m[:, t]
        out[:, t] = torch.where(seen, running, 0.0)
    return out


def reinforce_pp_literal(token_level_rewards, response_mask, gamma):
    """verl's REINFORCE++ returns loop as written (reset at masked tokens)."""
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    return returns


def whiten_by_hand(x, mask):
    sel = x.double()[mask != 0]
    mean = sel.mean()
    var = sel.var(correction=1)
    return (x.double() - mean) / torch.sqrt(var + 1e-8)


def zero_masked(x, mask):
    return torch.where(mask != 0, x, torch.zeros((), dtype=x.dtype))


# ----------------------------------------------------------------------------------- data


def multi_turn_batch(B=6, T=97, seed=0, garbage=NAN, dtype=torch.float32):
    """Rows of model turns and tool spans, trailing padding, one all-masked row, one row with no
    padding; ``garbage`` at every masked position of rewards and values."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        if b == 1:
            continue  # all masked
        length = T if b == 2 else int(torch.randint(T // 2, T, (1,), generator=g))
        t = 0
        model = True
        while t < length:
            span = int(torch.randint(1, 12, (1,), generator=g))
            if model:
                mask[b, t:min(t + span, length)] = True
            t += span
            model = not model
    rewards = torch.randn(B, T, generator=g) * 0.1
    values = torch.randn(B, T, generator=g)
    rewards = torch.where(mask, rewards, torch.full((), garbage))
    values = torch.where(mask, values, torch.full((), garbage))
    return rewards.to(dtype), values.to(dtype), mask


def assert_close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)


# ------------------------------------------------------------------------- verl drop-in (padded)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.99, 0.9), (0.5, 0.0)])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_gae_matches_verl_loop(gamma, lam, mask_dtype):
    r, v, m = multi_turn_batch(seed=1)
    adv, ret = llm.compute_gae_advantage_return(r, v, m.to(mask_dtype), gamma, lam)
    e_adv, e_ret = verl_gae_loop(r, v, m, gamma, lam)
    assert adv.dtype == torch.float32 and adv.shape == r.shape
    assert_close(adv, zero_masked(e_adv, m))
    assert_close(ret, zero_masked(e_ret, m))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()  # NaN garbage never leaks
    assert (adv[1] == 0).all() and (ret[1] == 0).all()  # the all-masked row


def test_fill_masked_carry_is_verls_full_output():
    r, v, m = multi_turn_batch(seed=2, garbage=3.0)  # finite garbage: verl's returns read it
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, fill_masked="carry")
    e_adv, e_ret = verl_gae_loop(r, v, m, 0.99, 0.95)
    assert_close(adv, e_adv)
    assert_close(ret, e_ret)
    # NaN garbage: advantages stay finite; returns = A + V read the masked V, as verl's do
    r, v, m = multi_turn_batch(seed=2)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, fill_masked="carry")
    e_adv, e_ret = verl_gae_loop(r, v, m, 0.99, 0.95)
    assert_close(adv, e_adv)
    assert_close(ret, e_ret)


def test_nan_safe_loop_is_verls_literal_code():
    r, v, m = multi_turn_batch(B=4, T=40, seed=3, garbage=-7.0, dtype=torch.float64)
    a1, r1 = verl_gae_loop(r, v, m, 0.97, 0.9)
    a2, r2 = verl_gae_literal(r, v, m.double(), 0.97, 0.9)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(r1, r2)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.97, 0.9, fill_masked="carry")
    torch.testing.assert_close(adv, a2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret, r2, rtol=1e-6, atol=1e-6)


def test_trailing_padding_does_not_move_the_end():
    r, v, m = multi_turn_batch(B=3, T=50, seed=4)
    pad = torch.zeros(3, 30, dtype=torch.bool)
    r2 = torch.cat([r, torch.full((3, 30), NAN)], 1)
    v2 = torch.cat([v, torch.full((3, 30), NAN)], 1)
    m2 = torch.cat([m, pad], 1)
    a1, g1 = llm.compute_gae_advantage_return(r, v, m, 1.0, 0.9)
    a2, g2 = llm.compute_gae_advantage_return(r2, v2, m2, 1.0, 0.9)
    assert_close(a2[:, :50], a1, rtol=0, atol=0)
    assert_close(g2[:, :50], g1, rtol=0, atol=0)
    assert (a2[:, 50:] == 0).all()


def test_truncated_rows_bootstrap():
    r, v, m = multi_turn_batch(seed=5)
    tr = torch.tensor([True, True, False, True, False, True])
    boot = torch.tensor([0.7, -1.0, NAN, 2.5, NAN, 0.3])  # NaN where not truncated: never read
    for fill in ("zero", "carry"):
        adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=boot,
                                                    fill_masked=fill)
        e_adv, e_ret = verl_gae_loop(r, v, m, 0.99, 0.95, bootstrap=torch.where(tr, boot, 0.0))
        if fill == "zero":
            e_adv, e_ret = zero_masked(e_adv, m), zero_masked(e_ret, m)
        assert_close(adv, e_adv)
        assert_close(ret, e_ret)
        assert torch.isfinite(adv).all()
    # the truncated rows differ from the terminal version exactly by the bootstrap term
    a_term, _ = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95)
    adv, _ = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=boot)
    assert not torch.allclose(adv[0], a_term[0]) and torch.equal(adv[2], a_term[2])
    assert (adv[1] == 0).all()  # truncated but all masked: no row end, nothing to bootstrap


def test_gae_accepts_tensor_hyperparameters_and_uint8_flags():
    r, v, m = multi_turn_batch(B=2, T=30, seed=6)
    a1, _ = llm.compute_gae_advantage_return(r, v, m, torch.tensor(0.99, dtype=torch.float64),
                                             torch.tensor(0.95, dtype=torch.float64))
    a2, _ = llm.compute_gae_advantage_return(r, v, m.to(torch.uint8), 0.99, 0.95,
                                             truncated=torch.tensor([0, 0], dtype=torch.uint8),
                                             bootstrap_values=torch.tensor([NAN, NAN]))
    assert_close(a1, a2, rtol=0, atol=0)


def test_whiten_matches_hand_written_masked_whitening():
    r, v, m = multi_turn_batch(seed=7, garbage=4.0)
    adv_raw, ret_raw = llm.compute_gae_advantage_return(r, v, m, 1.0, 0.95, fill_masked="carry")
    for fill in ("zero", "carry"):
        adv, ret = llm.compute_gae_advantage_return(r, v, m, 1.0, 0.95, whiten=True, fill_masked=fill)
        expected = whiten_by_hand(adv_raw, m)  # statistics over model tokens only
        if fill == "zero":
            expected = zero_masked(expected, m)
        assert_close(adv, expected, rtol=1e-5, atol=1e-5)
        sel = adv.double()[m]
        assert abs(sel.mean().item()) < 1e-5 and abs(sel.std().item() - 1) < 1e-4
        # returns are taken before whitening
        assert_close(ret, ret_raw if fill == "carry" else zero_masked(ret_raw, m), rtol=0, atol=0)


def test_masked_whiten_ignores_nan_and_shift_mean():
    x = torch.tensor([[1.0, 2.0, NAN], [3.0, NAN, 5.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    w = llm.masked_whiten(x, m)
    e = whiten_by_hand(torch.nan_to_num(x), m)
    assert_close(w[m != 0], e[m != 0])
    w2 = llm.masked_whiten(x, m, shift_mean=False)
    assert_close(w2[m != 0], e[m != 0] + 2.75)
    # fewer than two masked-in entries: the variance is undefined; NaN, not a host read (check_finite: an error)
    for few in (torch.tensor([[1, 0, 0], [0, 0, 0]]), torch.zeros(2, 3, dtype=torch.int64)):
        assert llm.masked_whiten(x, few).isnan().all()
        with rollbuf.check_finite(), pytest.raises(ValueError, match="at least two"):
            llm.masked_whiten(x, few)


def test_masked_whiten_reads_no_data():
    """The count and the Bessel correction are tensor arithmetic: masked_whiten runs on tensors
    without data (meta), where any host read would raise; so does the verl drop-in with whitening."""
    x = torch.zeros(4, 9, device="meta")
    m = torch.ones(4, 9, dtype=torch.bool, device="meta")
    assert llm.masked_whiten(x, m).device.type == "meta"
    adv, _ = llm.compute_gae_advantage_return(x, x, m, 1.0, 0.95, whiten=True, backend="torch")
    assert adv.device.type == "meta" and adv.shape == (4, 9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_accumulate_in_fp32(dtype):
    r, v, m = multi_turn_batch(B=4, T=300, seed=8, dtype=dtype)
    e_adv, e_ret = verl_gae_loop(r, v, m, 1.0, 0.99)  # float64 on the same (rounded) inputs
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 1.0, 0.99)
    assert adv.dtype == dtype and ret.dtype == dtype
    tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    assert_close(adv, zero_masked(e_adv, m), rtol=tol, atol=tol * 4)
    adv32, ret32 = llm.compute_gae_advantage_return(r, v, m, 1.0, 0.99, out_dtype=torch.float32)
    assert adv32.dtype == torch.float32
    assert_close(adv32, zero_masked(e_adv, m), rtol=1e-5, atol=1e-5)  # fp32 accumulation, not bf16
    assert_close(ret32, zero_masked(e_ret, m), rtol=1e-5, atol=1e-5)


def test_leading_batch_dims_and_empty_rows():
    r, v, m = multi_turn_batch(B=6, T=20, seed=9)
    a1, _ = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8)
    a2, _ = llm.compute_gae_advantage_return(r.reshape(2, 3, 20), v.reshape(2, 3, 20), m.reshape(2, 3, 20), 0.9, 0.8)
    assert_close(a2.reshape(6, 20), a1, rtol=0, atol=0)
    a0, g0 = llm.compute_gae_advantage_return(torch.zeros(0, 5), torch.zeros(0, 5), torch.zeros(0, 5), 1.0, 1.0)
    assert a0.shape == (0, 5) and g0.shape == (0, 5)


def test_validation_errors():
    r, v, m = multi_turn_batch(B=2, T=10, seed=10)
    with pytest.raises(ValueError, match="bootstrap_values"):
        llm.compute_gae_advantage_return(r, v, m, 1.0, 1.0, truncated=torch.tensor([True, False]))
    with pytest.raises(ValueError, match="without truncated"):
        llm.compute_gae_advantage_return(r, v, m, 1.0, 1.0, bootstrap_values=torch.zeros(2))
    with pytest.raises(ValueError, match="truncated must have shape"):
        llm.compute_gae_advantage_return(r, v, m, 1.0, 1.0, truncated=torch.zeros(2, 10, dtype=torch.bool),
                                         bootstrap_values=torch.zeros(2))
    with pytest.raises(ValueError, match="fill_masked"):
        llm.compute_gae_advantage_return(r, v, m, 1.0, 1.0, fill_masked="nan")
    with pytest.raises(ValueError, match="values must have shape"):
        llm.compute_gae_advantage_return(r, v[:, :5], m, 1.0, 1.0)
    with pytest.raises(TypeError, match="token_level_rewards"):
        llm.compute_gae_advantage_return(r.long(), v, m, 1.0, 1.0)
    with pytest.raises(ValueError, match="gamma"):
        llm.compute_gae_advantage_return(r, v, m, 1.5, 1.0)


def test_same_through_rollout_with_a_mask():
    from rollbuf import Rollout

    r, v, m = multi_turn_batch(B=4, T=33, seed=18)
    zeros = torch.zeros(4, 33, dtype=torch.bool)
    ro = Rollout(rewards=r, values=v, terminated=zeros, mask=m, batch_size=[4, 33])  # no truncation
    adv, ret = ro.gae(0.99, 0.95, window_end="terminal")
    e_adv, e_ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95)
    assert_close(adv, e_adv, rtol=0, atol=0)
    assert_close(ret, e_ret, rtol=0, atol=0)
    g = ro.discounted_returns(0.99, bootstrap=False)
    assert_close(g, llm.discounted_returns(r, m, 0.99))


# --------------------------------------------------------------------------- discounted returns


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.0])
def test_discounted_returns_across_masked_spans(gamma):
    r, _, m = multi_turn_batch(seed=11)
    e = returns_loop(r, m, gamma)
    assert_close(llm.discounted_returns(r, m, gamma), zero_masked(e, m))
    assert_close(llm.discounted_returns(r, m, gamma, fill_masked="carry"), e)
    tr = torch.tensor([True, False, True, False, True, False])
    boot = torch.tensor([0.5, NAN, -2.0, NAN, 1.0, NAN])
    e = returns_loop(r, m, gamma, bootstrap=torch.where(tr, boot, 0.0))
    g = llm.discounted_returns(r, m, gamma, truncated=tr, bootstrap_values=boot)
    assert_close(g, zero_masked(e, m))


def test_discounted_returns_agree_with_reinforce_pp_on_trailing_padding():
    g = torch.Generator().manual_seed(12)
    B, T = 5, 40
    lengths = torch.tensor([40, 1, 17, 33, 0])
    m = torch.arange(T) < lengths[:, None]
    r = torch.randn(B, T, generator=g)
    r = torch.where(m, r, torch.randn(B, T, generator=g))  # finite garbage in the padding
    ours = llm.discounted_returns(r, m, 0.97)
    verl = reinforce_pp_literal(r.double(), m.double(), 0.97)
    assert_close(ours, zero_masked(verl, m))
    # a tool span inside a row: verl's loop resets there, rollbuf carries across (documented)
    m2 = m.clone()
    m2[0, 10:15] = False
    ours = llm.discounted_returns(r, m2, 0.97)
    verl = reinforce_pp_literal(r.double(), m2.double(), 0.97)
    assert not torch.allclose(ours[0, :10].double(), verl[0, :10])
    assert_close(ours[0, 15:], verl[0, 15:])


# -------------------------------------------------------------------------------- packed rows


def pack(rewards, values, mask, lengths, extra=0):
    """Padded rows [S, L] → one packed row (each row's first ``lengths[s]`` tokens), plus
    ``extra`` trailing tokens of no sequence (garbage)."""
    parts_r = [rewards[s, :n] for s, n in enumerate(lengths.tolist())]
    parts_v = [values[s, :n] for s, n in enumerate(lengths.tolist())]
    parts_m = [mask[s, :n] for s, n in enumerate(lengths.tolist())]
    if extra:
        parts_r.append(torch.full((extra,), 9.0, dtype=rewards.dtype))
        parts_v.append(torch.full((extra,), 9.0, dtype=values.dtype))
        parts_m.append(torch.ones(extra, dtype=torch.bool))  # marked, but past cu_seqlens[-1]
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return torch.cat(parts_r), torch.cat(parts_v), torch.cat(parts_m), cu


def unpack(x, lengths, L):
    out = torch.zeros(len(lengths), L, dtype=x.dtype)
    pos = 0
    for s, n in enumerate(lengths.tolist()):
        out[s, :n] = x[pos:pos + n]
        pos += n
    return out


def packed_case(seed=13):
    r, v, m = multi_turn_batch(B=8, T=60, seed=seed)
    # sequence lengths: full, short, zero, one whose tail is masked (the end is not the last token)
    lengths = torch.tensor([60, 25, 0, 60, 1, 44, 60, 7])
    m[3, 50:] = False  # trailing masked tokens inside the sequence
    m[4, 0] = True
    return r, v, m, lengths


@pytest.mark.parametrize("shape", ["1d", "2d"])
@pytest.mark.parametrize("fill", ["zero", "carry"])
def test_packed_equals_padded(shape, fill):
    r, v, m, lengths = packed_case()
    L = r.shape[1]
    mpad = m & (torch.arange(L) < lengths[:, None])
    tr = torch.tensor([False, True, True, True, False, False, True, False])
    boot = torch.tensor([NAN, 0.4, 1.0, -0.6, NAN, NAN, 2.0, NAN])
    pr, pv, pm, cu = pack(r, v, mpad, lengths, extra=5)
    if shape == "2d":
        pr, pv, pm = pr[None], pv[None], pm[None]
    for truncated, bootstrap in ((None, None), (tr, boot)):
        adv, ret = llm.packed_gae(pr, pv, pm, cu, 0.99, 0.95, truncated, bootstrap, fill_masked=fill)
        assert adv.shape == pr.shape
        pad_adv, pad_ret = llm.compute_gae_advantage_return(
            torch.nan_to_num(r, 0.0), torch.nan_to_num(v, 0.0), mpad, 0.99, 0.95,
            truncated=truncated, bootstrap_values=bootstrap, fill_masked=fill)
        flat_adv = adv.reshape(-1)
        flat_ret = ret.reshape(-1)
        total = int(cu[-1])
        assert_close(unpack(flat_adv[:total], lengths, L), zero_masked(pad_adv, torch.arange(L) < lengths[:, None]))
        if fill == "zero":
            assert_close(unpack(flat_ret[:total], lengths, L), pad_ret)
        else:  # masked returns read the masked values: compare on the finite ones
            ok = torch.isfinite(unpack(flat_ret[:total], lengths, L)) & (torch.arange(L) < lengths[:, None])
            assert_close(unpack(flat_ret[:total], lengths, L)[ok], pad_ret[ok])
        assert (flat_adv[total:] == 0).all()  # tokens past cu_seqlens[-1]: no sequence
        e_adv, _ = verl_gae_loop(r, v, mpad, 0.99, 0.95,
                                 bootstrap=None if truncated is None else torch.where(tr, boot, 0.0))
        assert_close(unpack(flat_adv[:total], lengths, L)[mpad], e_adv[mpad])


def test_packed_sequences_do_not_leak_into_each_other():
    # two sequences: the first ends with two masked tokens; its end is its last model token
    r = torch.tensor([0.0, 1.0, NAN, NAN, 0.0, 5.0])
    v = torch.tensor([0.5, 0.5, NAN, NAN, 3.0, 3.0])
    m = torch.tensor([1, 1, 0, 0, 1, 1])
    cu = torch.tensor([0, 4, 6], dtype=torch.int32)
    adv, _ = llm.packed_gae(r, v, m, cu, 1.0, 1.0)
    # seq 0: A_1 = 1 − 0.5 = 0.5 (terminal), A_0 = 0 + 0.5 − 0.5 + A_1 = 0.5
    # seq 1: A_5 = 5 − 3 = 2, A_4 = 0 + 3 − 3 + 2 = 2
    assert_close(adv, torch.tensor([0.5, 0.5, 0.0, 0.0, 2.0, 2.0]), rtol=0, atol=1e-7)
    adv, _ = llm.packed_gae(r, v, m, cu, 1.0, 1.0, fill_masked="carry")
    assert_close(adv, torch.tensor([0.5, 0.5, 0.0, 0.0, 2.0, 2.0]), rtol=0, atol=1e-7)  # no carry across seqs
    adv, _ = llm.packed_gae(r, v, m, cu, 1.0, 1.0, torch.tensor([True, False]), torch.tensor([10.0, NAN]))
    assert_close(adv, torch.tensor([10.5, 10.5, 0.0, 0.0, 2.0, 2.0]), rtol=0, atol=1e-6)


def test_packed_discounted_returns_equal_padded():
    r, v, m, lengths = packed_case(seed=14)
    L = r.shape[1]
    mpad = m & (torch.arange(L) < lengths[:, None])
    tr = torch.tensor([True, False, False, True, False, True, False, False])
    boot = torch.tensor([1.0, NAN, NAN, -1.0, NAN, 0.5, NAN, NAN])
    pr, _, pm, cu = pack(r, v, mpad, lengths)
    for fill in ("zero", "carry"):
        g = llm.packed_discounted_returns(pr, pm, cu, 0.95, tr, boot, fill_masked=fill)
        e = llm.discounted_returns(torch.nan_to_num(r, 0.0), mpad, 0.95, truncated=tr, bootstrap_values=boot,
                                   fill_masked=fill)
        assert_close(unpack(g, lengths, L), zero_masked(e, torch.arange(L) < lengths[:, None]))


def test_packed_whiten_and_bf16():
    r, v, m, lengths = packed_case(seed=15)
    L = r.shape[1]
    mpad = m & (torch.arange(L) < lengths[:, None])
    pr, pv, pm, cu = pack(r, v, mpad, lengths)
    adv, _ = llm.packed_gae(pr, pv, pm, cu, 1.0, 0.95, whiten=True)
    pad_adv, _ = llm.compute_gae_advantage_return(r, v, mpad, 1.0, 0.95, whiten=True)
    assert_close(unpack(adv, lengths, L), pad_adv, rtol=1e-5, atol=1e-5)  # same statistics
    adv16, _ = llm.packed_gae(pr.bfloat16(), pv.bfloat16(), pm, cu, 1.0, 0.95, out_dtype=torch.float32)
    e_adv, _ = verl_gae_loop(r.bfloat16(), v.bfloat16(), mpad, 1.0, 0.95)
    assert_close(unpack(adv16, lengths, L)[mpad], e_adv[mpad])


def test_packed_is_one_functional_call(monkeypatch):
    calls = []
    real = F.gae

    def spy(*args, **kwargs):
        calls.append(kwargs["rewards"].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(llm.F, "gae", spy)
    r, v, m, lengths = packed_case(seed=16)
    pr, pv, pm, cu = pack(r, v, m & (torch.arange(60) < lengths[:, None]), lengths)
    llm.packed_gae(pr[None], pv[None], pm[None], cu, 1.0, 1.0)
    assert calls == [pr[None].shape]


def test_packed_validation():
    r = torch.zeros(6)
    m = torch.ones(6, dtype=torch.bool)
    # cu_seqlens that break the convention: checked on the device (every output NaN, no host read);
    # under check_finite an error naming cu_seqlens; check=False skips the check
    for bad in ([1, 6], [0, 4, 2], [0, 7]):
        cu = torch.tensor(bad, dtype=torch.int32)
        adv, ret = llm.packed_gae(r, r, m, cu, 1.0, 1.0)
        assert adv.isnan().all() and ret.isnan().all(), bad
        assert llm.packed_discounted_returns(r, m, cu, 1.0).isnan().all(), bad
        with rollbuf.check_finite(), pytest.raises(ValueError, match="cu_seqlens"):
            llm.packed_gae(r, r, m, cu, 1.0, 1.0)
        with rollbuf.check_finite(), pytest.raises(ValueError, match="cu_seqlens"):
            llm.packed_discounted_returns(r, m, cu, 1.0)
    good = torch.tensor([0, 2, 6], dtype=torch.int32)
    assert not llm.packed_gae(r, r, m, good, 1.0, 1.0).advantages.isnan().any()
    assert not llm.packed_gae(r, r, m, torch.tensor([0, 7], dtype=torch.int32), 1.0, 1.0,
                              check=False).advantages.isnan().all()
    with pytest.raises(ValueError, match="cu_seqlens"):
        llm.packed_gae(r, r, m, torch.tensor([0.0, 6.0]), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"\[1, total\]"):
        llm.packed_gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([0, 3], dtype=torch.int32),
                       1.0, 1.0)
    with pytest.raises(ValueError, match="both truncated"):
        llm.packed_gae(r, r, m, torch.tensor([0, 6], dtype=torch.int32), 1.0, 1.0, torch.tensor([True]))
    adv, _ = llm.packed_gae(r, r, m, torch.tensor([0], dtype=torch.int32), 1.0, 1.0)  # no sequence
    assert (adv == 0).all()


# ------------------------------------------------------------------ mask modes: OpenRLHF, NeMo-RL
#
# The loops below restate the frameworks' code line by line (their modules import ray /
# transformers, so the tests cannot call them); docs/llm.md section 1 (mask modes) states the rules.


def openrlhf_gae_loop(values, rewards, action_mask, gamma, lambd, bootstrap=None):
    """OpenRLHF 0.11 ``get_advantages_and_returns`` (openrlhf/trainer/ppo_utils/experience_maker.py)
    as written, in float64 (finite inputs: it multiplies by the mask). ``bootstrap`` [B]: rollbuf's
    extension, the ``nextvalues`` after the last position (OpenRLHF: 0)."""
    values, rewards = values.double(), rewards.double()
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    if action_mask is not None:
        values = action_mask * values
        rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        last = 0.0 if bootstrap is None else bootstrap.double()
        nextvalues = values[:, t + 1] if t < response_length - 1 else last
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns


def openrlhf_returns_loop(rewards, action_mask, gamma, bootstrap=None):
    """OpenRLHF 0.11 ``get_cumulative_returns`` as written, float64 (``bootstrap`` as above)."""
    rewards = rewards.double()
    response_length = rewards.size(1)
    returns = torch.zeros_like(rewards)
    cumulative_return = torch.zeros(rewards.size(0), dtype=torch.float64)
    if bootstrap is not None:
        cumulative_return = bootstrap.double().clone()
    if action_mask is not None:
        rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        cumulative_return = rewards[:, t] + gamma * cumulative_return
        returns[:, t] = cumulative_return
    return returns


def nemo_rl_gae_loop(token_level_rewards, values, mask, gamma, lam, normalize_advantages):
    """NeMo-RL 0.7 ``GeneralizedAdvantageEstimator`` (nemo_rl/algorithms/advantage_estimator.py):
    ``_compute_gae`` (carry-forward masking) and the end of ``compute_advantage`` (optional
    ``_reward_whiten`` over the mask, then ``masked_fill`` of the masked advantages), float64."""
    token_level_rewards, values, mask = token_level_rewards.double(), values.double(), mask.double()
    gen_len = token_level_rewards.shape[-1]
    next_values = torch.zeros(values.shape[0], dtype=values.dtype)
    last_gae_lam = torch.zeros_like(next_values)
    advantages_reversed = []
    for t in reversed(range(gen_len)):
        delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
        new_gae_lam = delta + gamma * lam * last_gae_lam
        m = mask[:, t]
        next_values = values[:, t] * m + (1 - m) * next_values
        last_gae_lam = new_gae_lam * m + (1 - m) * last_gae_lam
        advantages_reversed.append(last_gae_lam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    if normalize_advantages:  # _reward_whiten: masked_mean (/ (n + 1e-8)), masked_var (unbiased)
        n = mask.sum()
        mean = (advantages * mask).sum() / (n + 1e-8)
        var = ((advantages - mean) ** 2 * mask).sum() / (n + 1e-8) * (n / (n - 1))
        advantages = (advantages - mean) * torch.rsqrt(var + 1e-8)
    advantages = torch.masked_fill(advantages, ~(mask.bool()), 0)
    return advantages, returns


MASK_MODE_BACKENDS = ["reference", "torch", "numba", "triton"]


def _backend_or_skip(backend):
    import os

    if backend == "numba" and not backends.numba_available():
        pytest.skip("numba not installed")
    if backend == "triton":
        if not backends.triton_available():
            pytest.skip("triton not importable")
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("no CUDA and TRITON_INTERPRET is not set")
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("backend", MASK_MODE_BACKENDS)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.9), (0.5, 0.0)])
def test_zero_mode_is_openrlhf_gae(backend, gamma, lam):
    dev = _backend_or_skip(backend)
    r, v, m = multi_turn_batch(B=5, T=37, seed=40, garbage=3.0)  # finite garbage: OpenRLHF multiplies it by 0
    e_adv, e_ret = openrlhf_gae_loop(v, r, m.double(), gamma, lam)
    for mask in (m, m.long(), m.float()):
        adv, ret = llm.compute_gae_advantage_return(r.to(dev), v.to(dev), mask.to(dev), gamma, lam, mask_mode="zero",
                                                    fill_masked="keep", backend=backend)
        assert_close(adv.cpu(), e_adv)
        assert_close(ret.cpu(), e_ret)
    adv, ret = llm.compute_gae_advantage_return(r.to(dev), v.to(dev), m.to(dev), gamma, lam, mask_mode="zero",
                                                backend=backend)
    assert_close(adv.cpu(), zero_masked(e_adv, m))
    assert_close(ret.cpu(), zero_masked(e_ret, m))
    # it is not the skip recursion: a tool span inside a row changes the model tokens before it
    # (except at γ = λ = 1, where both telescope to Σ r − V_t on model tokens)
    skip, _ = llm.compute_gae_advantage_return(r, v, m, gamma, lam)
    assert torch.allclose(adv.cpu()[m], skip[m], atol=1e-5) == (gamma == lam == 1.0)


def test_zero_mode_nan_at_masked_tokens_never_leaks():
    """OpenRLHF multiplies by the mask (NaN·0 = NaN spreads along the row); rollbuf selects."""
    r, v, m = multi_turn_batch(B=5, T=37, seed=41)  # NaN at every masked position
    clean_r, clean_v = torch.nan_to_num(r, 0.0), torch.nan_to_num(v, 0.0)
    e_adv, e_ret = openrlhf_gae_loop(clean_v, clean_r, m.double(), 0.99, 0.95)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, mask_mode="zero", fill_masked="keep")
    assert_close(adv, e_adv)
    assert_close(ret, e_ret)
    assert openrlhf_gae_loop(v, r, m.double(), 0.99, 0.95)[0].isnan().any()  # (the literal code does leak)
    g = llm.discounted_returns(r, m, 0.99, mask_mode="zero", fill_masked="keep")
    assert_close(g, openrlhf_returns_loop(clean_r, m.double(), 0.99))


def test_zero_mode_truncated_rows_and_whitening():
    r, v, m = multi_turn_batch(B=6, T=41, seed=42, garbage=-2.0)
    tr = torch.tensor([True, True, False, True, False, False])
    boot = torch.tensor([0.7, -1.0, NAN, 2.5, NAN, NAN])  # NaN where not truncated: never read
    e_adv, e_ret = openrlhf_gae_loop(v, r, m.double(), 0.99, 0.95, bootstrap=torch.where(tr, boot, 0.0))
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=boot,
                                                mask_mode="zero", fill_masked="keep")
    assert_close(adv, e_adv)
    assert_close(ret, e_ret)
    for fill in ("zero", "keep"):
        w, ret_w = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=boot,
                                                    mask_mode="zero", fill_masked=fill, whiten=True)
        expected = whiten_by_hand(e_adv, m)  # statistics over the model tokens only
        assert_close(w, zero_masked(expected, m) if fill == "zero" else expected)
        assert_close(ret_w, zero_masked(e_ret, m) if fill == "zero" else e_ret)  # taken before whitening


def test_zero_and_skip_agree_on_trailing_padding_and_differ_by_the_span_discount():
    """docs/llm.md, mask modes: on rows whose only masked tokens are trailing padding (not truncated)
    the two modes agree on model tokens; across a span of k masked tokens "zero" scales what lies
    beyond the span by (γλ)^k (returns: γ^k)."""
    g = torch.Generator().manual_seed(47)
    B, T, gamma, lam = 4, 23, 0.9, 0.8
    m = torch.arange(T) < torch.tensor([23, 9, 1, 15])[:, None]
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    for mode in ("skip", "zero"):
        a, ret = llm.compute_gae_advantage_return(r, v, m, gamma, lam, mask_mode=mode)
        if mode == "skip":
            a_skip, ret_skip = a, ret
    assert_close(a, a_skip)
    assert_close(ret, ret_skip)
    assert_close(llm.discounted_returns(r, m, gamma, mask_mode="zero"), llm.discounted_returns(r, m, gamma))
    # one span of k = 3 masked tokens after token t = 4, the next model token at t = 8
    k, t = 3, 4
    m = torch.ones(1, 12, dtype=torch.bool)
    m[0, t + 1:t + 1 + k] = False
    r, v = r[:1, :12], v[:1, :12]
    a_skip, _ = llm.compute_gae_advantage_return(r, v, m, gamma, lam)
    a_zero, _ = llm.compute_gae_advantage_return(r, v, m, gamma, lam, mask_mode="zero")
    nxt = t + k + 1
    beyond = gamma * v[0, nxt] + gamma * lam * a_skip[0, nxt]
    assert_close(a_skip[0, t], r[0, t] - v[0, t] + beyond)
    assert_close(a_zero[0, t], r[0, t] - v[0, t] + (gamma * lam) ** k * beyond)
    g_skip, g_zero = llm.discounted_returns(r, m, gamma), llm.discounted_returns(r, m, gamma, mask_mode="zero")
    assert_close(g_zero[0, t], r[0, t] + gamma ** (k + 1) * g_skip[0, nxt])
    assert_close(g_skip[0, t], r[0, t] + gamma * g_skip[0, nxt])


@pytest.mark.parametrize("backend", MASK_MODE_BACKENDS)
@pytest.mark.parametrize("gamma", [1.0, 0.97, 0.0])
def test_zero_mode_is_openrlhf_cumulative_returns(backend, gamma):
    dev = _backend_or_skip(backend)
    r, _, m = multi_turn_batch(B=5, T=37, seed=43, garbage=5.0)
    tr = torch.tensor([False, True, True, False, True])
    boot = torch.tensor([NAN, 0.5, -2.0, NAN, 1.0])
    for truncated, bootstrap in ((None, None), (tr, boot)):
        e = openrlhf_returns_loop(r, m.double(), gamma,
                                  bootstrap=None if truncated is None else torch.where(tr, boot, 0.0))
        kw = {} if truncated is None else dict(truncated=truncated.to(dev), bootstrap_values=bootstrap.to(dev))
        g = llm.discounted_returns(r.to(dev), m.to(dev), gamma, mask_mode="zero", fill_masked="keep",
                                   backend=backend, **kw)
        assert_close(g.cpu(), e)
        g = llm.discounted_returns(r.to(dev), m.to(dev), gamma, mask_mode="zero", backend=backend, **kw)
        assert_close(g.cpu(), zero_masked(e, m))


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9)])
def test_skip_mode_is_nemo_rl_carry_forward(normalize, gamma, lam):
    """NeMo-RL's carry-forward GAE is the skip recursion: its advantages are
    ``fill_masked="zero"``'s (whitened like ``whiten=True``), its returns ``fill_masked="carry"``'s."""
    r, v, m = multi_turn_batch(B=6, T=45, seed=44, garbage=4.0)  # finite: NeMo-RL multiplies by the mask
    e_adv, e_ret = nemo_rl_gae_loop(zero_masked(r, m), v, m, gamma, lam, normalize)  # its rewards are r·mask
    adv, _ = llm.compute_gae_advantage_return(r, v, m, gamma, lam, whiten=normalize)
    _, ret = llm.compute_gae_advantage_return(r, v, m, gamma, lam, fill_masked="carry")
    assert_close(adv, e_adv)
    assert_close(ret, e_ret)


@pytest.mark.parametrize("fill", ["zero", "keep"])
def test_packed_zero_mode_is_each_sequence_as_its_own_row(fill):
    r, v, m, lengths = packed_case(seed=45)
    L = r.shape[1]
    in_len = torch.arange(L) < lengths[:, None]
    r, v = torch.where(in_len, r, 0.0), torch.where(in_len, v, 0.0)
    tr = torch.tensor([False, True, True, True, False, False, True, False])
    boot = torch.tensor([NAN, 0.4, 1.0, -0.6, NAN, NAN, 2.0, NAN])
    pr, pv, pm, cu = pack(r, v, m & in_len, lengths, extra=3)
    for truncated, bootstrap in ((None, None), (tr, boot)):
        adv, ret = llm.packed_gae(pr, pv, pm, cu, 0.99, 0.95, truncated, bootstrap, mask_mode="zero",
                                  fill_masked=fill)
        g = llm.packed_discounted_returns(pr, pm, cu, 0.99, truncated, bootstrap, mask_mode="zero", fill_masked=fill)
        for s, n in enumerate(lengths.tolist()):
            a, b = int(cu[s]), int(cu[s + 1])
            kw = {} if truncated is None else dict(truncated=tr[s:s + 1], bootstrap_values=boot[s:s + 1])
            e_adv, e_ret = llm.compute_gae_advantage_return(r[s:s + 1, :n], v[s:s + 1, :n], m[s:s + 1, :n], 0.99,
                                                            0.95, mask_mode="zero", fill_masked=fill, **kw)
            e_g = llm.discounted_returns(r[s:s + 1, :n], m[s:s + 1, :n], 0.99, mask_mode="zero", fill_masked=fill,
                                         **kw)
            assert_close(adv[a:b], e_adv[0])
            assert_close(ret[a:b], e_ret[0])
            assert_close(g[a:b], e_g[0])
        total = int(cu[-1])
        assert (adv[total:] == 0).all() and (g[total:] == 0).all()  # tokens of no sequence


def test_mask_mode_validation():
    r, v, m = multi_turn_batch(B=2, T=10, seed=46)
    with pytest.raises(ValueError, match="mask_mode must be one of"):
        llm.compute_gae_advantage_return(r, v, m, 1.0, 1.0, mask_mode="carry")
    with pytest.raises(ValueError, match="fill_masked='keep' does not go with mask_mode='skip'"):
        llm.compute_gae_advantage_return(r, v, m, 1.0, 1.0, fill_masked="keep")
    with pytest.raises(ValueError, match="fill_masked='carry' does not go with mask_mode='zero'"):
        llm.discounted_returns(r, m, 1.0, mask_mode="zero", fill_masked="carry")
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="mask_mode"):
        llm.packed_gae(r[0], v[0], m[0], cu, 1.0, 1.0, mask_mode="deleted")
    with pytest.raises(ValueError, match="fill_masked"):
        llm.packed_discounted_returns(r[0], m[0], cu, 1.0, fill_masked="keep")


# -------------------------------------------------- per-row γ and λ, a separate λ for the returns (VAPO)
#
# The oracle of a per-row call is the scalar oracle above run on each row alone with that row's γ, λ:
# the loops are the ones the scalar path is tested against, so nothing here is computed the way the
# per-row path computes it (per-token δ and β, one affine scan).

GAMMAS = torch.tensor([0.9, 1.0, 0.0, 0.5, 1.0, 0.97, 0.3])  # 0 and 1 included
LAMS = torch.tensor([0.0, 1.0, 0.95, 1.0, 0.3, 0.0, 0.8])
LAM_RETURNS = torch.tensor([1.0, 0.0, 0.5, 0.9, 1.0, 0.2, 0.0])
TRUNC = torch.tensor([True, False, True, True, False, True, False])
BOOT = torch.tensor([0.7, NAN, -1.0, 2.5, NAN, 0.3, NAN])  # NaN where not truncated: never read


def gae_rows(r, v, m, gammas, lams, mode="skip", bootstrap=None):
    """verl's loop (``"skip"``) or OpenRLHF's (``"zero"``) on each row with its own γ and λ."""
    outs = []
    for b in range(r.shape[0]):
        boot = None if bootstrap is None else bootstrap[b:b + 1]
        g, lam = float(gammas[b]), float(lams[b])
        if mode == "skip":
            outs.append(verl_gae_loop(r[b:b + 1], v[b:b + 1], m[b:b + 1], g, lam, bootstrap=boot))
        else:
            outs.append(openrlhf_gae_loop(v[b:b + 1], r[b:b + 1], m[b:b + 1].double(), g, lam, bootstrap=boot))
    return torch.cat([a for a, _ in outs]), torch.cat([ret for _, ret in outs])


def returns_rows(r, m, gammas, mode="skip", bootstrap=None):
    loop = returns_loop if mode == "skip" else (lambda r, m, g, bootstrap: openrlhf_returns_loop(r, m.double(), g,
                                                                                                bootstrap))
    return torch.cat([loop(r[b:b + 1], m[b:b + 1], float(gammas[b]), bootstrap=None if bootstrap is None else
                           bootstrap[b:b + 1]) for b in range(r.shape[0])])


MODES = [("skip", "zero"), ("skip", "carry"), ("zero", "zero"), ("zero", "keep")]


@pytest.mark.parametrize("mode,fill", MODES)
@pytest.mark.parametrize("truncated", [False, True])
def test_per_row_gamma_lam_and_lam_returns_equal_the_loop_row_by_row(mode, fill, truncated):
    # NaN garbage where nothing reads it; finite where the oracle multiplies it (OpenRLHF) or the
    # returns read it (carry: returns = carried A + V[t], as verl)
    r, v, m = multi_turn_batch(B=7, T=41, seed=60, garbage=NAN if (mode, fill) == ("skip", "zero") else 3.0)
    kw = dict(truncated=TRUNC, bootstrap_values=BOOT) if truncated else {}
    boot = torch.where(TRUNC, BOOT, 0.0) if truncated else None
    e_adv, e_ret0 = gae_rows(r, v, m, GAMMAS, LAMS, mode, boot)
    _, e_ret = gae_rows(r, v, m, GAMMAS, LAM_RETURNS, mode, boot)
    e_g = returns_rows(r, m, GAMMAS, mode, boot)
    if fill == "zero":
        e_adv, e_ret0, e_ret, e_g = (zero_masked(x, m) for x in (e_adv, e_ret0, e_ret, e_g))
    opts = dict(mask_mode=mode, fill_masked=fill, **kw)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, GAMMAS, LAMS, lam_returns=LAM_RETURNS, **opts)
    assert adv.dtype == torch.float32 and adv.shape == r.shape
    assert_close(adv, e_adv)
    assert_close(ret, e_ret)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, GAMMAS, LAMS, **opts)  # returns with λ itself
    assert_close(adv, e_adv)
    assert_close(ret, e_ret0)
    assert_close(llm.discounted_returns(r, m, GAMMAS, **opts), e_g)
    if (mode, fill) == ("skip", "zero"):
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all()  # NaN garbage never leaks
        assert (adv[1] == 0).all()  # the all-masked row


def test_lam_returns_alone_is_gae_with_that_lambda_plus_values():
    r, v, m = multi_turn_batch(B=5, T=50, seed=61)
    tr, boot = torch.tensor([True, False, True, False, False]), torch.tensor([1.5, NAN, -0.5, NAN, NAN])
    for lam_returns in (1.0, 0.0, 0.5, torch.tensor(0.5)):
        adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.9, lam_returns=lam_returns, truncated=tr,
                                                    bootstrap_values=boot)
        a_fused, _ = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.9, truncated=tr, bootstrap_values=boot)
        _, r_fused = llm.compute_gae_advantage_return(r, v, m, 0.99, float(lam_returns), truncated=tr,
                                                      bootstrap_values=boot)
        assert_close(adv, a_fused)
        assert_close(ret, r_fused)
    # λ_returns = 1: Monte-Carlo value targets, the discounted returns (+ the bootstrap)
    _, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.9, lam_returns=1.0, truncated=tr,
                                              bootstrap_values=boot)
    assert_close(ret, llm.discounted_returns(r, m, 0.99, truncated=tr, bootstrap_values=boot))


def test_per_row_equal_values_are_the_fused_scalar_path():
    r, v, m = multi_turn_batch(B=4, T=33, seed=62)
    for mode, fill in MODES:
        fused = llm.compute_gae_advantage_return(r, v, m, 0.95, 0.9, mask_mode=mode, fill_masked=fill)
        rowwise = llm.compute_gae_advantage_return(r, v, m, torch.full((4,), 0.95), torch.full((4,), 0.9),
                                                   mask_mode=mode, fill_masked=fill)
        for a, b in zip(fused, rowwise):
            assert_close(a, b)
    # a one-element tensor that is not [B] stays a number (today's behaviour), a [B] one is per row
    a1, _ = llm.compute_gae_advantage_return(r, v, m, torch.tensor([0.95]), 0.9)
    a2, _ = llm.compute_gae_advantage_return(r[:1], v[:1], m[:1], torch.tensor([0.95]), torch.tensor([0.9]))
    assert_close(a1[:1], a2)


def test_per_row_whiten_batch_dims_dtypes_and_gradients():
    r, v, m = multi_turn_batch(B=6, T=30, seed=63, garbage=2.0)
    g6, l6 = torch.rand(6, generator=torch.Generator().manual_seed(0)), torch.linspace(0, 1, 6)
    raw, _ = llm.compute_gae_advantage_return(r, v, m, g6, l6, fill_masked="carry")
    for fill in ("zero", "carry"):
        adv, _ = llm.compute_gae_advantage_return(r, v, m, g6, l6, whiten=True, fill_masked=fill)
        e = whiten_by_hand(raw, m)
        assert_close(adv, zero_masked(e, m) if fill == "zero" else e)
    flat = llm.compute_gae_advantage_return(r, v, m, g6, l6)
    batched = llm.compute_gae_advantage_return(r.reshape(2, 3, 30), v.reshape(2, 3, 30), m.reshape(2, 3, 30),
                                               g6.reshape(2, 3), l6.reshape(2, 3))
    for a, b in zip(flat, batched):
        assert_close(a, b.reshape(6, 30), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"gamma must be a number or a tensor of shape \(2, 3\)"):
        llm.compute_gae_advantage_return(r.reshape(2, 3, 30), v.reshape(2, 3, 30), m.reshape(2, 3, 30), g6, 0.9)
    adv16, _ = llm.compute_gae_advantage_return(r.bfloat16(), v.bfloat16(), m, g6, l6)
    adv32, _ = llm.compute_gae_advantage_return(r.bfloat16(), v.bfloat16(), m, g6, l6, out_dtype=torch.float32)
    assert adv16.dtype == torch.bfloat16 and adv32.dtype == torch.float32
    e_adv, _ = gae_rows(r.bfloat16(), v.bfloat16(), m, g6, l6)
    assert_close(adv32, zero_masked(e_adv, m))  # fp32 accumulation of the bf16 inputs
    a64, _ = llm.compute_gae_advantage_return(r.double(), v.double(), m, g6, l6)
    assert a64.dtype == torch.float64
    assert_close(a64, zero_masked(gae_rows(r, v, m, g6, l6)[0], m), rtol=1e-12, atol=1e-12)
    # gradients: the per-row path is differentiable and agrees with each row's fused call
    rg, vg = r.double().requires_grad_(), v.double().requires_grad_()
    adv, ret = llm.compute_gae_advantage_return(rg, vg, m, g6, l6, lam_returns=l6.flip(0))
    (adv.square().sum() + ret.sum()).backward()
    for b in range(6):
        rb, vb = r[b:b + 1].double().requires_grad_(), v[b:b + 1].double().requires_grad_()
        a, _ = llm.compute_gae_advantage_return(rb, vb, m[b:b + 1], float(g6[b]), float(l6[b]))
        _, rt = llm.compute_gae_advantage_return(rb, vb, m[b:b + 1], float(g6[b]), float(l6.flip(0)[b]))
        (a.square().sum() + rt.sum()).backward()
        assert_close(rg.grad[b:b + 1], rb.grad, rtol=1e-9, atol=1e-9)
        assert_close(vg.grad[b:b + 1], vb.grad, rtol=1e-9, atol=1e-9)


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_per_row_property_against_the_loop(data):
    B = data.draw(st.integers(1, 4), label="B")
    T = data.draw(st.integers(0, 13), label="T")
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    unit = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))
    gammas = torch.tensor(data.draw(st.lists(unit, min_size=B, max_size=B), label="gammas"))
    lams = torch.tensor(data.draw(st.lists(unit, min_size=B, max_size=B), label="lams"))
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    m = torch.rand(B, T, generator=g) < 0.6
    r, v = torch.where(m, r, NAN), torch.where(m, v, NAN)
    e_adv, e_ret = gae_rows(r, v, m, gammas, lams)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, gammas, lams)
    assert_close(adv, zero_masked(e_adv, m), rtol=1e-10, atol=1e-10)
    assert_close(ret, zero_masked(e_ret, m), rtol=1e-10, atol=1e-10)
    assert_close(llm.discounted_returns(r, m, gammas), zero_masked(returns_rows(r, m, gammas), m),
                 rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fill", ["zero", "carry"])
def test_packed_per_sequence_gamma_lam_equal_padded(fill):
    r, v, m, lengths = packed_case(seed=64)
    L, S = r.shape[1], len(lengths)
    in_len = torch.arange(L) < lengths[:, None]
    mpad = m & in_len
    gam, lam, lam_ret = (torch.cat([x[:S - 1], torch.tensor([last])]) for x, last in
                         ((GAMMAS, 0.8), (LAMS, 1.0), (LAM_RETURNS, 0.4)))
    tr = torch.tensor([False, True, True, True, False, False, True, False])
    boot = torch.tensor([NAN, 0.4, 1.0, -0.6, NAN, NAN, 2.0, NAN])
    pr, pv, pm, cu = pack(r, v, mpad, lengths, extra=5)
    for truncated, bootstrap in ((None, None), (tr, boot)):
        adv, ret = llm.packed_gae(pr[None], pv[None], pm[None], cu, gam, lam, truncated, bootstrap,
                                  lam_returns=lam_ret, fill_masked=fill)
        assert adv.shape == (1, pr.shape[0])
        e_boot = None if truncated is None else torch.where(tr, boot, 0.0)
        e_adv, _ = gae_rows(r, v, mpad, gam, lam, bootstrap=e_boot)
        _, e_ret = gae_rows(r, v, mpad, gam, lam_ret, bootstrap=e_boot)
        total = int(cu[-1])
        got_adv, got_ret = unpack(adv[0, :total], lengths, L), unpack(ret[0, :total], lengths, L)
        if fill == "zero":
            assert_close(got_adv, zero_masked(e_adv, mpad))
            assert_close(got_ret, zero_masked(e_ret, mpad))
        else:  # the carry stays inside each sequence: 0 after its last model token
            assert_close(got_adv, zero_masked(e_adv, in_len))
            ok = in_len & torch.isfinite(got_ret)
            assert_close(got_ret[ok], e_ret[ok])
        assert (adv[0, total:] == 0).all()  # tokens of no sequence
        g = llm.packed_discounted_returns(pr, pm, cu, gam, truncated, bootstrap, fill_masked=fill)
        e_g = returns_rows(r, mpad, gam, bootstrap=e_boot)
        assert_close(unpack(g[:total], lengths, L), zero_masked(e_g, mpad if fill == "zero" else in_len))


def test_packed_per_sequence_zero_mode_is_each_sequence_as_its_own_row():
    r, v, m, lengths = packed_case(seed=65)
    L, S = r.shape[1], len(lengths)
    in_len = torch.arange(L) < lengths[:, None]
    r, v = torch.nan_to_num(r, 3.0), torch.nan_to_num(v, -2.0)  # finite garbage: OpenRLHF multiplies it by 0
    gam, lam = torch.linspace(0, 1, S), torch.linspace(1, 0, S)
    pr, pv, pm, cu = pack(r, v, m & in_len, lengths, extra=3)
    adv, ret = llm.packed_gae(pr, pv, pm, cu, gam, lam, lam_returns=lam.flip(0), mask_mode="zero", fill_masked="keep")
    for s, n in enumerate(lengths.tolist()):
        a, b = int(cu[s]), int(cu[s + 1])
        if n == 0:
            continue
        e_adv, _ = openrlhf_gae_loop(v[s:s + 1, :n], r[s:s + 1, :n], m[s:s + 1, :n].double(), float(gam[s]),
                                     float(lam[s]))
        _, e_ret = openrlhf_gae_loop(v[s:s + 1, :n], r[s:s + 1, :n], m[s:s + 1, :n].double(), float(gam[s]),
                                     float(lam.flip(0)[s]))
        assert_close(adv[a:b], e_adv[0])
        assert_close(ret[a:b], e_ret[0])
    assert (adv[int(cu[-1]):] == 0).all()


def test_per_row_hyperparameters_are_checked():
    r, v, m = multi_turn_batch(B=3, T=12, seed=66)
    good = torch.full((3,), 0.9)
    calls = [
        ("gamma", lambda x: llm.compute_gae_advantage_return(r, v, m, x, 0.9)),
        ("lam", lambda x: llm.compute_gae_advantage_return(r, v, m, 0.9, x)),
        ("lam_returns", lambda x: llm.compute_gae_advantage_return(r, v, m, good, 0.9, lam_returns=x)),
        ("gamma", lambda x: llm.discounted_returns(r, m, x)),
        ("gamma", lambda x: llm.turn_returns(r, m, x)),
        ("lam", lambda x: llm.turn_gae(r, v, m, 0.9, x)),
    ]
    for name, call in calls:
        for shape in ((4,), (3, 1), (1, 3)):  # nothing is broadcast
            with pytest.raises(ValueError, match=rf"{name} must be a number or a tensor of shape \(3,\)"):
                call(torch.full(shape, 0.9))
        with pytest.raises(TypeError, match=f"{name} must be a floating-point tensor"):
            call(torch.ones(3, dtype=torch.int64))
        for bad in (1.5, -0.1, NAN, math.inf):
            with pytest.raises(ValueError, match=rf"{name} must lie in \[0, 1\]"):
                call(torch.tensor([0.9, bad, 0.5]))
        with pytest.raises(ValueError, match=f"{name} is on meta"):
            call(torch.full((3,), 0.9, device="meta"))
    with pytest.raises(ValueError, match=r"lam_returns must lie in \[0, 1\]"):
        llm.compute_gae_advantage_return(r, v, m, 0.9, 0.9, lam_returns=1.5)
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\]"):  # a number on the per-row path
        llm.compute_gae_advantage_return(r, v, m, 1.5, good)
    with pytest.raises(TypeError, match="out_dtype"):
        llm.compute_gae_advantage_return(r, v, m, good, 0.9, out_dtype=torch.int32)
    pr, pm, cu = r.reshape(-1), m.reshape(-1), torch.tensor([0, 10, 36], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"gamma must be a number or a tensor of shape \(2,\)"):
        llm.packed_gae(pr, pr, pm, cu, good, 0.9)
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\], got -1.0 at row 0"):
        llm.packed_gae(pr, pr, pm, cu, 0.9, torch.tensor([-1.0, 0.5]))
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\], got 2.0 at row 1"):
        llm.packed_discounted_returns(pr, pm, cu, torch.tensor([0.5, 2.0]))
    # the per-row path reads no data on a device without it (meta): the range check is left to the
    # arithmetic there (a bad row's outputs NaN, on a GPU), as rollbuf's other data checks
    x = torch.zeros(3, 12, device="meta")
    mm = torch.ones(3, 12, dtype=torch.bool, device="meta")
    adv, ret = llm.compute_gae_advantage_return(x, x, mm, torch.full((3,), 0.9, device="meta"), 0.9, lam_returns=1.0,
                                                whiten=True, backend="torch")
    assert adv.device.type == "meta" and ret.shape == (3, 12)


def test_per_row_values_out_of_range_give_nan_rows_where_not_read_back():
    """Where the values are not read back (a GPU, or as here under torch.compile, which traces without
    host reads), a row (a sequence) whose γ or λ is outside [0, 1] or NaN gets NaN outputs; the
    others are the eager result."""
    r, v, m = multi_turn_batch(B=4, T=15, seed=69)
    gam, lam = torch.tensor([0.9, 1.5, 0.5, 1.0]), torch.tensor([0.8, 0.5, NAN, 0.0])
    adv, ret = torch.compile(llm.compute_gae_advantage_return, backend="eager")(r, v, m, gam, lam, lam_returns=1.0)
    ok = torch.tensor([True, False, False, True])
    assert adv[~ok].isnan().all() and ret[~ok].isnan().all()
    e_adv, e_ret = llm.compute_gae_advantage_return(r[ok], v[ok], m[ok], gam[ok], lam[ok], lam_returns=1.0)
    assert_close(adv[ok], e_adv)
    assert_close(ret[ok], e_ret)
    pr, pm, cu = r.reshape(-1), m.reshape(-1), torch.tensor([0, 20, 45, 60], dtype=torch.int32)
    g = torch.compile(llm.packed_discounted_returns, backend="eager")(pr, pm, cu, torch.tensor([0.9, -0.5, 1.0]))
    assert g[20:45].isnan().all() and not g[:20].isnan().any() and not g[45:].isnan().any()  # nothing leaks


def test_length_adaptive_lam():
    m = torch.zeros(5, 300, dtype=torch.bool)
    for b, n in enumerate([0, 10, 20, 100, 300]):
        m[b, :n] = True
    m[4, 150] = False  # a tool token: not counted
    lam = llm.length_adaptive_lam(m, 0.05)
    expected = torch.tensor([0.0, 0.0, 0.0, 1 - 1 / 5, 1 - 1 / (0.05 * 299)])  # < 1/α tokens: clamped to 0
    assert lam.dtype == torch.float32 and lam.shape == (5,)
    assert_close(lam, expected, rtol=1e-6, atol=1e-7)
    n = m.sum(-1).double()
    assert_close(llm.length_adaptive_lam(m.float(), 1.0), torch.where(n > 0, 1 - 1 / n, 0.0))  # a 0/1 float mask
    # packed: per sequence, the same numbers
    lengths = torch.tensor([300, 120, 0, 300, 37])
    _, _, pm, cu = pack(torch.zeros(5, 300), torch.zeros(5, 300), m, lengths, extra=4)
    packed = llm.length_adaptive_lam(pm[None], 0.05, cu_seqlens=cu)
    assert_close(packed, llm.length_adaptive_lam(m & (torch.arange(300) < lengths[:, None]), 0.05), rtol=0, atol=0)
    # it feeds lam directly
    r, v, mt = multi_turn_batch(B=4, T=60, seed=67)
    lam = llm.length_adaptive_lam(mt, 0.1)
    adv, _ = llm.compute_gae_advantage_return(r, v, mt, 1.0, lam, lam_returns=1.0)
    assert_close(adv, zero_masked(gae_rows(r, v, mt, torch.ones(4), lam)[0], mt))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        llm.length_adaptive_lam(m, 0.0)
    with pytest.raises(ValueError, match="response_mask"):
        llm.length_adaptive_lam(m.sum(-1)[0], 0.05)
    with pytest.raises(ValueError, match=r"\[1, total\]"):
        llm.length_adaptive_lam(m, 0.05, cu_seqlens=cu)


@pytest.mark.skipif(not backends.triton_available(), reason="triton not importable")
def test_per_row_paths_on_the_triton_backend():
    """The per-row path's scan on the fused affine kernel (CUDA, or Triton's interpreter on a CPU
    machine), tiny odd shapes."""
    dev = _backend_or_skip("triton")
    r, v, m = multi_turn_batch(B=3, T=19, seed=68)
    gam, lam = torch.tensor([0.9, 1.0, 0.0]), torch.tensor([0.0, 0.7, 1.0])
    tr, boot = torch.tensor([True, False, True]), torch.tensor([0.5, NAN, -2.0])
    e_adv, _ = gae_rows(r, v, m, gam, lam, bootstrap=torch.where(tr, boot, 0.0))
    _, e_ret = gae_rows(r, v, m, gam, torch.ones(3), bootstrap=torch.where(tr, boot, 0.0))

    def to(*xs):
        return [x.to(dev) for x in xs]

    adv, ret = llm.compute_gae_advantage_return(*to(r, v, m, gam, lam), lam_returns=1.0,
                                                **dict(zip(("truncated", "bootstrap_values"), to(tr, boot))),
                                                backend="triton")
    assert_close(adv.cpu(), zero_masked(e_adv, m))
    assert_close(ret.cpu(), zero_masked(e_ret, m))
    lengths = torch.tensor([19, 5, 13])
    pr, pv, pm, cu = pack(r, v, m & (torch.arange(19) < lengths[:, None]), lengths, extra=2)
    got = llm.packed_gae(*to(pr, pv, pm, cu, gam, lam), backend="triton")
    want = llm.packed_gae(pr, pv, pm, cu, gam, lam, backend="torch")
    for a, b in zip(got, want):
        assert_close(a.cpu(), b)
    got = llm.packed_discounted_returns(*to(pr, pm, cu, gam), backend="triton")
    assert_close(got.cpu(), llm.packed_discounted_returns(pr, pm, cu, gam, backend="reference"))



# ------------------------------------------------------------------- the GPU path, interpreted


@pytest.mark.skipif(not backends.triton_available(), reason="triton not importable")
def test_triton_backend_matches(monkeypatch):
    """The fused-kernel path (CUDA in production; Triton's interpreter on a CPU machine)."""
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and TRITON_INTERPRET is not set")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    r, v, m = multi_turn_batch(B=3, T=40, seed=17)
    tr = torch.tensor([True, False, False])
    boot = torch.tensor([0.5, NAN, NAN])
    r, v, m, tr, boot = (x.to(dev) for x in (r, v, m, tr, boot))
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=boot,
                                                backend="triton")
    e_adv, e_ret = verl_gae_loop(r.cpu(), v.cpu(), m.cpu(), 0.99, 0.95,
                                 bootstrap=torch.where(tr, boot, 0.0).cpu())
    assert_close(adv.cpu(), zero_masked(e_adv, m.cpu()))
    assert_close(ret.cpu(), zero_masked(e_ret, m.cpu()))
    lengths = torch.tensor([40, 12, 30])
    pr, pv, pm, cu = pack(r.cpu(), v.cpu(), m.cpu() & (torch.arange(40) < lengths[:, None]), lengths)
    padv, _ = llm.packed_gae(pr.to(dev), pv.to(dev), pm.to(dev), cu.to(dev), 0.99, 0.95, backend="triton")
    tadv, _ = llm.packed_gae(pr, pv, pm, cu, 0.99, 0.95, backend="torch")
    assert_close(padv.cpu(), tadv)


# ---------------------------------------------------------------------------- docs/llm.md


WORKED = dict(
    role=["model", "model", "model", "tool", "tool", "tool", "model", "model", "model", "model"],
    mask=[1, 1, 1, 0, 0, 0, 1, 1, 1, 1],
    rewards=[0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    values=[0.4, 0.5, 0.6, 0.3, 0.3, 0.3, 0.7, 0.6, 0.8, 0.9],
    bootstrap=1.0,
    gamma=1.0,
    lam=0.9,
)


def render_worked_example() -> str:
    """The tables of docs/llm.md's worked example, computed by rollbuf.integrations.llm."""
    w = WORKED
    r = torch.tensor([w["rewards"]], dtype=torch.float64)
    v = torch.tensor([w["values"]], dtype=torch.float64)
    m = torch.tensor([w["mask"]])
    T = r.shape[1]
    kw = dict(truncated=torch.tensor([True]), bootstrap_values=torch.tensor([w["bootstrap"]], dtype=torch.float64))
    g, lam = w["gamma"], w["lam"]
    adv_tr, ret_tr = llm.compute_gae_advantage_return(r, v, m, g, lam, **kw)
    adv_tr_c, ret_tr_c = llm.compute_gae_advantage_return(r, v, m, g, lam, fill_masked="carry", **kw)
    adv_eos, ret_eos = llm.compute_gae_advantage_return(r, v, m, g, lam)
    adv_eos_c, _ = llm.compute_gae_advantage_return(r, v, m, g, lam, fill_masked="carry")
    adv_w, _ = llm.compute_gae_advantage_return(r, v, m, g, lam, whiten=True, **kw)

    def num(x):
        s = f"{x:.4f}"
        return "0" if s in ("0.0000", "-0.0000") else s

    head = "|  | " + " | ".join(f"t={t}" for t in range(T)) + " |"
    sep = "|---" * (T + 1) + "|"
    lines = [
        f"Inputs (one row, `[1, {T}]`; γ = {g}, λ = {lam}; the row is cut by the token limit after t={T - 1}, "
        f"`bootstrap_values = [{w['bootstrap']}]`):",
        "",
        head,
        sep,
        "| token | " + " | ".join(w["role"]) + " |",
        "| `response_mask` | " + " | ".join(str(x) for x in w["mask"]) + " |",
        "| `token_level_rewards` | " + " | ".join(f"{x:g}" for x in w["rewards"]) + " |",
        "| `values` | " + " | ".join(f"{x:g}" for x in w["values"]) + " |",
        "",
        "Outputs (`rollbuf.integrations.llm.compute_gae_advantage_return`, float64):",
        "",
        head,
        sep,
    ]
    rows = [
        ("advantages, truncated row", adv_tr),
        ("returns, truncated row", ret_tr),
        ("advantages, truncated, `fill_masked=\"carry\"`", adv_tr_c),
        ("returns, truncated, `fill_masked=\"carry\"`", ret_tr_c),
        ("advantages, truncated, `whiten=True`", adv_w),
        ("advantages, if it had ended with EOS (terminal)", adv_eos),
        ("returns, if it had ended with EOS", ret_eos),
        ("verl's loop (terminal) = EOS, `fill_masked=\"carry\"`", adv_eos_c),
    ]
    for name, x in rows:
        lines.append(f"| {name} | " + " | ".join(num(float(x[0, t])) for t in range(T)) + " |")
    return "\n".join(lines)


def test_worked_example_in_docs():
    text = (ROOT / "docs" / "llm.md").read_text(encoding="utf-8")
    begin, end = "<!-- BEGIN LLM WORKED EXAMPLE -->", "<!-- END LLM WORKED EXAMPLE -->"
    assert text.count(begin) == 1 and text.count(end) == 1
    pasted = text[text.index(begin) + len(begin):text.index(end)].strip()
    assert pasted == render_worked_example().strip(), (
        "docs/llm.md's worked example is out of date: paste the output of `python tests/test_llm.py`"
    )


def test_worked_example_by_hand():
    w = WORKED
    r = torch.tensor([w["rewards"]], dtype=torch.float64)
    v = torch.tensor([w["values"]], dtype=torch.float64)
    m = torch.tensor([w["mask"]])
    adv, _ = llm.compute_gae_advantage_return(r, v, m, 1.0, 0.9, truncated=torch.tensor([True]),
                                              bootstrap_values=torch.tensor([1.0], dtype=torch.float64))
    e, _ = verl_gae_loop(r, v, m, 1.0, 0.9, bootstrap=torch.tensor([1.0]))
    assert_close(adv, zero_masked(e, m), rtol=0, atol=1e-12)
    assert math.isclose(float(adv[0, 9]), 0.0 + 1.0 * 1.0 - 0.9, abs_tol=1e-12)
    # t=2 reaches across the tool span to V_6: δ_2 = 0.5 + 0.7 − 0.6
    assert math.isclose(float(adv[0, 2]), 0.6 + 0.9 * float(adv[0, 6]), abs_tol=1e-12)


if __name__ == "__main__":
    print(render_worked_example())
