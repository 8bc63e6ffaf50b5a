"""Turn-level returns and GAE (rollbuf.integrations.llm.turn_returns, turn_gae, and packed_turn_returns,
packed_turn_gae on cu_seqlens) against a float64 loop over each row's turns: turns as maximal runs of
model tokens and as explicit turn ids (a turn interrupted by tool tokens), empty rows, rows of one
turn, truncated rows, both value positions, per-row γ, λ and λ_returns (the loop run on each row with
its own), packed sequences against the same sequences padded."""

from __future__ import annotations

import pytest
import torch

import rollbuf
from rollbuf.integrations import llm


def _turn_list(on, ids):
    """The turns of one row: lists of model-token positions, in row order."""
    turns, prev = [], None
    for t in range(len(on)):
        if not on[t]:
            if ids is None:
                prev = None
            continue
        key = t if ids is None else int(ids[t])
        if turns and (prev is not None if ids is None else int(ids[turns[-1][-1]]) == key):
            turns[-1].append(t)
        else:
            turns.append([t])
        prev = key
    return turns


def _loop(r, v, m, gamma, lam, ids=None, value_at="first", trunc=None, boot=None):
    """(turn returns, turn advantages, turn GAE returns) by a float64 loop over turns."""
    B, T = r.shape
    R, A, G = (torch.zeros(B, T, dtype=torch.float64) for _ in range(3))
    for b in range(B):
        turns = _turn_list(m[b].tolist(), None if ids is None else ids[b])
        nxt_ret, nxt_adv, nxt_v = 0.0, 0.0, None
        for k in reversed(range(len(turns))):
            tok = turns[k]
            rk = float(r[b, tok[-1]])
            vk = float(v[b, tok[0] if value_at == "first" else tok[-1]])
            ret = rk + gamma * nxt_ret
            if k == len(turns) - 1:
                v_next = float(boot[b]) if trunc is not None and trunc[b] else 0.0
                adv = rk + gamma * v_next - vk
            else:
                adv = rk + gamma * nxt_v - vk + gamma * lam * nxt_adv
            for t in tok:
                R[b, t], A[b, t], G[b, t] = ret, adv, adv + vk
            nxt_ret, nxt_adv, nxt_v = ret, adv, vk
    return R, A, G


def _rows(seed, B=9, T=23):
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = torch.rand(B, T, generator=g) < 0.6
    m[0] = False  # an empty row
    m[1] = False
    m[1, 3:9] = True  # one turn
    ids = torch.cumsum(torch.rand(B, T, generator=g) < 0.15, -1)  # turns that span tool tokens
    return r, v, m, ids


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_turn_returns_and_gae_equal_the_loop(seed, explicit):
    r, v, m, ids = _rows(seed)
    ids = ids if explicit else None
    for value_at in ("first", "last"):
        R, A, G = _loop(r.double(), v.double(), m, 0.9, 0.8, ids, value_at)
        torch.testing.assert_close(llm.turn_returns(r, m, 0.9, turn_ids=ids).double(), R, rtol=1e-5, atol=1e-5)
        adv, ret = llm.turn_gae(r, v, m, 0.9, 0.8, turn_ids=ids, value_at=value_at)
        torch.testing.assert_close(adv.double(), A, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ret.double(), G, rtol=1e-5, atol=1e-5)


DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel: on the GPU, else under the interpreter


@pytest.fixture
def kernel_calls(monkeypatch):
    """The families ``rollbuf.kernels.run`` was called with during the test (the turn paths call it)."""
    import rollbuf.kernels as K

    seen, run = [], K.run

    def spy(p):
        seen.append(str(p.family))
        return run(p)

    monkeypatch.setattr(K, "run", spy)
    return seen


@pytest.mark.parametrize("force", [{}, dict(split=True, presolve=False, block_t=16),
                                   dict(split=True, presolve=True, block_t=16), dict(block_t=16, split=False),
                                   dict(quads=True), dict(quads=True, block_t=16, split=True, presolve=False)],
                         ids=["table", "lookback", "three-pass", "walk", "quads", "quads-lookback"])
@pytest.mark.parametrize("seed", [0, 1])
def test_turn_returns_on_the_turn_kernel_equal_the_loop(seed, force, kernel_calls):
    """turn_returns on the turn kernel (the coefficients from the rewards and the model-token flags in
    registers) against the float64 loop: empty rows, one-turn rows, turns ending at the row's last token,
    odd lengths, every strategy of the table (one chunk, rows walked in chunks, split rows by the look-back
    and by three passes), NaN-filled outputs first; bool, int64 and 0/1 float masks, two batch dims, float64
    rewards, a bf16 output."""
    import rollbuf.kernels as K

    r, v, m, _ = _rows(seed, B=9, T=53)
    m[2, -5:] = True  # a turn that ends at the row's last token
    R, _, _ = _loop(r.double(), v.double(), m, 0.9, 0.8)
    with K.forced(poison=True, **force):
        for mask in (m, m.long(), m.float()):
            got = llm.turn_returns(r.to(DEV), mask.to(DEV), 0.9, backend="triton")
            torch.testing.assert_close(got.double().cpu(), R, rtol=1e-5, atol=1e-5)
        got = llm.turn_returns(r.reshape(3, 3, -1).double().to(DEV), m.reshape(3, 3, -1).to(DEV), 0.9,
                               backend="triton")
        assert got.dtype == torch.float64
        torch.testing.assert_close(got.reshape(9, -1).cpu(), R, rtol=1e-12, atol=1e-12)
        got = llm.turn_returns(r.to(DEV), m.to(DEV), 0.9, backend="triton", out_dtype=torch.bfloat16)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double().cpu(), R, rtol=1e-2, atol=1e-2)
    assert kernel_calls == ["turn"] * 5, kernel_calls


@pytest.mark.parametrize("force", [{}, dict(split=True, presolve=False, block_t=16),
                                   dict(split=True, presolve=True, block_t=16), dict(block_t=16, split=False),
                                   dict(block_t=16, split=True, presolve=False, shift_load=True),
                                   dict(quads=True), dict(quads=True, block_t=16, split=False)],
                         ids=["table", "lookback", "three-pass", "walk", "lookback-reload", "quads", "quads-walk"])
@pytest.mark.parametrize("seed", [0, 1])
def test_turn_gae_on_the_turn_kernels_equals_the_loop(seed, force, kernel_calls):
    """turn_gae on the turn kernels (one backward scan writing the returns and each turn's advantage at
    its first token, then the forward fill over the turn) against the float64 loop: NaN rewards and
    values wherever a turn does not read them (the kernel reads a reward at a turn's last token and a
    value at its first only), truncated rows bootstrapping from V(s') (NaN for the other rows), empty
    and one-turn rows, a turn ending at the row's last token, every strategy, NaN-filled outputs; the
    outputs' dtype the torch path's."""
    import rollbuf.kernels as K

    r, v, m, _ = _rows(seed, B=9, T=53)
    m[2, -5:] = True
    trunc = torch.zeros(9, dtype=torch.bool)
    trunc[2:6] = True
    boot = torch.where(trunc, torch.randn(9), float("nan"))
    _, A, G = _loop(r.double(), v.double(), m, 0.95, 0.9, trunc=trunc, boot=boot)
    ends = m & ~torch.nn.functional.pad(m, (0, 1))[:, 1:]
    starts = m & ~torch.nn.functional.pad(m, (1, 0))[:, :-1]
    r_g, v_g = r.masked_fill(~ends, float("nan")), v.masked_fill(~starts, float("nan"))
    with K.forced(poison=True, **force):
        for mask in (m, m.float()):
            adv, ret = llm.turn_gae(r_g.to(DEV), v_g.to(DEV), mask.to(DEV), 0.95, 0.9, truncated=trunc.to(DEV),
                                    bootstrap_values=boot.to(DEV), backend="triton")
            torch.testing.assert_close(adv.double().cpu(), A, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ret.double().cpu(), G, rtol=1e-5, atol=1e-5)
        _, A0, G0 = _loop(r.double(), v.double(), m, 0.95, 0.9)
        adv, ret = llm.turn_gae(r.double().to(DEV), v.double().to(DEV), m.to(DEV), 0.95, 0.9, backend="triton")
        want = llm.turn_gae(r.double(), v.double(), m, 0.95, 0.9, backend="torch")
        assert adv.dtype == ret.dtype == want.advantages.dtype == torch.float64
        torch.testing.assert_close(adv.cpu(), A0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ret.cpu(), G0, rtol=1e-12, atol=1e-12)
        adv, ret = llm.turn_gae(r.to(DEV), v.half().to(DEV), m.to(DEV), 0.95, 0.9, backend="triton")
        assert adv.dtype == llm.turn_gae(r, v.half(), m, 0.95, 0.9, backend="torch").advantages.dtype
    assert kernel_calls == ["turn_gae", "turn_fill"] * 4, kernel_calls


def test_the_turn_kernels_leave_to_the_torch_path(kernel_calls):
    """The turn kernels are not taken where the torch path does something they do not: a gradient asked
    for (of the rewards, the values or bootstrap_values), ``rollbuf.check_finite`` (the torch path names a
    non-finite input), per-row γ; and the kernel path's outputs have the torch path's dtype with a
    ``bootstrap_values`` of a wider dtype."""
    r, v, m, _ = _rows(4, B=6, T=31)
    trunc = torch.ones(6, dtype=torch.bool)
    boot = torch.randn(6, dtype=torch.float64)
    args = [x.to(DEV) for x in (r, v, m)]
    kw = dict(truncated=trunc.to(DEV), bootstrap_values=boot.to(DEV), backend="triton")
    got = llm.turn_gae(*args, 0.9, 0.8, **kw)
    want = llm.turn_gae(r, v, m, 0.9, 0.8, truncated=trunc, bootstrap_values=boot, backend="torch")
    assert kernel_calls == ["turn_gae", "turn_fill"], kernel_calls
    assert got.advantages.dtype == got.returns.dtype == want.advantages.dtype == torch.float64
    torch.testing.assert_close(got.advantages.cpu(), want.advantages, rtol=1e-5, atol=1e-5)
    kernel_calls.clear()
    b = boot.to(DEV).requires_grad_()
    res = llm.turn_gae(*args, 0.9, 0.8, truncated=trunc.to(DEV), bootstrap_values=b, backend="triton")
    res.returns.sum().backward()
    assert b.grad is not None
    llm.turn_returns(args[0].requires_grad_(), args[2], 0.9, backend="triton")
    llm.turn_returns(args[0].detach(), args[2], torch.full((6,), 0.9, device=DEV), backend="triton")
    bad = args[0].detach().clone()
    bad[2, m[2].nonzero()[-1, 0]] = float("nan")
    with rollbuf.check_finite():
        llm.turn_returns(args[0].detach(), args[2], 0.9, backend="triton")
        with pytest.raises(ValueError, match="rewards"):
            llm.turn_gae(bad, args[1], args[2], 0.9, 0.8, backend="triton")
    assert not [f for f in kernel_calls if f.startswith("turn")], kernel_calls  # the generic scans only


def test_truncated_rows_bootstrap_their_last_turn():
    r, v, m, _ = _rows(3)
    trunc = torch.zeros(r.shape[0], dtype=torch.bool)
    trunc[2:5] = True
    boot = torch.randn(r.shape[0])
    _, A, G = _loop(r.double(), v.double(), m, 0.95, 0.9, trunc=trunc, boot=boot)
    adv, ret = llm.turn_gae(r, v, m, 0.95, 0.9, truncated=trunc, bootstrap_values=boot)
    torch.testing.assert_close(adv.double(), A, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), G, rtol=1e-5, atol=1e-5)


def test_turn_arguments_are_checked():
    r, v, m, ids = _rows(0)
    with pytest.raises(ValueError, match="turn_ids"):
        llm.turn_returns(r, m, 0.9, turn_ids=ids.float())
    with pytest.raises(ValueError, match="turn_ids"):
        llm.turn_returns(r, m, 0.9, turn_ids=ids[:, :-1])
    with pytest.raises(ValueError, match="value_at"):
        llm.turn_gae(r, v, m, 0.9, 0.9, value_at="middle")
    with pytest.raises(ValueError, match="response_mask"):
        llm.turn_returns(r, None, 0.9)


# ------------------------------------------------------- per-row γ, λ and λ_returns; packed rows


def _loop_rows(r, v, m, gammas, lams, ids=None, value_at="first", trunc=None, boot=None):
    """:func:`_loop` on each row alone with that row's γ and λ."""
    outs = [_loop(r[b:b + 1], v[b:b + 1], m[b:b + 1], float(gammas[b]), float(lams[b]),
                  None if ids is None else ids[b:b + 1], value_at, None if trunc is None else trunc[b:b + 1],
                  None if boot is None else boot[b:b + 1]) for b in range(r.shape[0])]
    return tuple(torch.cat(parts) for parts in zip(*outs))


GAMMAS = torch.tensor([0.9, 1.0, 0.0, 0.5, 1.0, 0.97, 0.3, 0.8, 0.0])  # 0 and 1 included
LAMS = torch.tensor([0.0, 1.0, 0.95, 1.0, 0.3, 0.0, 0.8, 1.0, 0.5])
LAM_RETURNS = torch.tensor([1.0, 0.0, 0.5, 0.9, 1.0, 0.2, 0.0, 0.6, 1.0])


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("value_at", ["first", "last"])
def test_per_row_gamma_lam_and_lam_returns_equal_the_loop(explicit, value_at):
    r, v, m, ids = _rows(4)
    ids = ids if explicit else None
    trunc = torch.tensor([False, True, False, True, True, False, False, True, False])
    boot = torch.where(trunc, torch.randn(9, generator=torch.Generator().manual_seed(1)), float("nan"))
    R, A, G0 = _loop_rows(r.double(), v.double(), m, GAMMAS, LAMS, ids, value_at, trunc, boot)
    _, _, G = _loop_rows(r.double(), v.double(), m, GAMMAS, LAM_RETURNS, ids, value_at, trunc, boot)
    torch.testing.assert_close(llm.turn_returns(r, m, GAMMAS, turn_ids=ids).double(), R, rtol=1e-5, atol=1e-5)
    kw = dict(turn_ids=ids, value_at=value_at, truncated=trunc, bootstrap_values=boot)
    adv, ret = llm.turn_gae(r, v, m, GAMMAS, LAMS, lam_returns=LAM_RETURNS, **kw)
    torch.testing.assert_close(adv.double(), A, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), G, rtol=1e-5, atol=1e-5)
    adv, ret = llm.turn_gae(r, v, m, GAMMAS, LAMS, **kw)
    torch.testing.assert_close(adv.double(), A, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), G0, rtol=1e-5, atol=1e-5)


def _pack(x, lengths):
    return torch.cat([x[s, :n] for s, n in enumerate(lengths.tolist())])


def _unpack(x, lengths, T):
    out = torch.zeros(len(lengths), T, dtype=x.dtype)
    cu = [0, *torch.cumsum(lengths, 0).tolist()]
    for s, n in enumerate(lengths.tolist()):
        out[s, :n] = x[cu[s]:cu[s + 1]]
    return out


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("per_seq", [False, True])
def test_packed_turns_equal_the_padded_rows(explicit, per_seq):
    """Each packed sequence gives what it gives as its own padded row. Sequences 0, 2 and 3 meet on
    model tokens (a turn must not run on into the next sequence); one is empty, one has no model
    token, one ends in tool tokens, one is a single run of model tokens."""
    r, v, m, ids = _rows(5)
    T = r.shape[1]
    lengths = torch.tensor([23, 0, 9, 23, 1, 17, 23, 4, 12])
    m[0, -1] = m[2, 0] = m[2, 8] = m[3, 0] = True  # model tokens at both sides of sequence boundaries
    m[5, 10:] = False  # tool tokens at the end
    m[7] = False  # no model token
    m[8, :] = True  # one run of model tokens across the whole sequence
    ids = ids if explicit else None
    inl = torch.arange(T) < lengths[:, None]
    mp = m & inl
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lengths, 0).to(torch.int32)])
    pr, pv, pm = _pack(r, lengths), _pack(v, lengths), _pack(mp, lengths)
    pids = None if ids is None else _pack(ids, lengths)
    gam, lam, lam_ret = (GAMMAS, LAMS, LAM_RETURNS) if per_seq else (0.9, 0.8, None)
    trunc = torch.tensor([True, True, False, True, False, True, False, True, False])
    boot = torch.where(trunc, torch.linspace(-1, 1, 9), float("nan"))
    for value_at in ("first", "last"):
        adv, ret = llm.packed_turn_gae(pr[None], pv[None], pm[None], cu, gam, lam, trunc, boot, lam_returns=lam_ret,
                                       turn_ids=None if pids is None else pids[None], value_at=value_at)
        e_adv, e_ret = llm.turn_gae(r, v, mp, gam, lam, lam_returns=lam_ret, turn_ids=ids, value_at=value_at,
                                    truncated=trunc, bootstrap_values=boot)
        assert adv.shape == (1, pr.shape[0])
        torch.testing.assert_close(_unpack(adv[0], lengths, T), e_adv, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(_unpack(ret[0], lengths, T), e_ret, rtol=1e-5, atol=1e-5)
    got = llm.packed_turn_returns(pr, pm, cu, gam, turn_ids=pids)
    torch.testing.assert_close(_unpack(got, lengths, T), llm.turn_returns(r, mp, gam, turn_ids=ids), rtol=1e-5,
                               atol=1e-5)
    # and the float64 loop over turns, directly
    g_rows, l_rows = (torch.full((9,), x) if not torch.is_tensor(x) else x for x in (gam, lam))
    R, A, _ = _loop_rows(r.double(), v.double(), mp, g_rows, l_rows, ids, "first", trunc, boot)
    torch.testing.assert_close(_unpack(got, lengths, T).double(), R, rtol=1e-5, atol=1e-5)
    adv, _ = llm.packed_turn_gae(pr, pv, pm, cu, gam, lam, trunc, boot, turn_ids=pids)
    torch.testing.assert_close(_unpack(adv, lengths, T).double(), A, rtol=1e-5, atol=1e-5)


def test_packed_turns_at_sequence_boundaries_by_hand():
    # two sequences of model tokens only, back to back: two turns, not one
    r = torch.tensor([0.0, 1.0, 0.0, 2.0, 9.0])
    m = torch.tensor([1, 1, 1, 1, 1])
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)  # the fifth token: no sequence
    assert llm.packed_turn_returns(r, m, cu, 0.5).tolist() == [1.0, 1.0, 2.0, 2.0, 0.0]
    assert llm.turn_returns(r[None, :4], m[None, :4], 0.5).tolist() == [[2.0] * 4]  # one row: one turn
    g = llm.packed_turn_returns(r, m, cu, torch.tensor([0.5, 0.0]), turn_ids=torch.tensor([0, 1, 1, 1, 1]))
    assert g.tolist() == [0.5, 1.0, 2.0, 2.0, 0.0]  # ids split sequence 0 (0 + 0.5·1); sequence 1 is one turn


def test_packed_turn_arguments_are_checked():
    r = torch.zeros(6)
    m = torch.ones(6, dtype=torch.bool)
    for bad in ([1, 6], [0, 4, 2], [0, 7]):  # cu_seqlens off the convention: every output NaN
        cu = torch.tensor(bad, dtype=torch.int32)
        assert llm.packed_turn_returns(r, m, cu, 0.9).isnan().all()
        adv, ret = llm.packed_turn_gae(r, r, m, cu, 0.9, 0.9)
        assert adv.isnan().all() and ret.isnan().all()
        with rollbuf.check_finite(), pytest.raises(ValueError, match="cu_seqlens"):
            llm.packed_turn_gae(r, r, m, cu, 0.9, 0.9)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="response_mask must be a flag tensor of token_level_rewards' shape"):
        llm.packed_turn_returns(r, m[None], cu, 0.9)
    with pytest.raises(ValueError, match="turn_ids"):
        llm.packed_turn_returns(r, m, cu, 0.9, turn_ids=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"gamma must be a number or a tensor of shape \(2,\)"):
        llm.packed_turn_returns(r, m, cu, torch.full((6,), 0.9))
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\]"):
        llm.packed_turn_gae(r, r, m, cu, 0.9, torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="value_at"):
        llm.packed_turn_gae(r, r, m, cu, 0.9, 0.9, value_at="middle")


def test_length_adaptive_lam_in_turns():
    """``turns=True`` counts a row's (a sequence's) turns as turn_gae takes them: VAPO's λ with the
    turn as the time step."""
    _, _, m, ids = _rows(6)
    for explicit in (None, ids):
        n = torch.tensor([len(_turn_list(m[b].tolist(), None if explicit is None else explicit[b]))
                          for b in range(m.shape[0])], dtype=torch.float64)
        lam = llm.length_adaptive_lam(m, 0.4, turns=True, turn_ids=explicit)
        e = torch.where(n > 0, (1 - 1 / (0.4 * n.clamp(min=1))).clamp(min=0), 0.0)
        torch.testing.assert_close(lam.double(), e, rtol=1e-6, atol=1e-7)
        assert (lam > 0).any() and (lam == 0).any()
        lengths = torch.tensor([23, 0, 9, 23, 1, 17, 23, 4, 12])
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lengths, 0).to(torch.int32)])
        mp = m & (torch.arange(m.shape[1]) < lengths[:, None])
        packed = llm.length_adaptive_lam(_pack(mp, lengths), 0.4, turns=True,
                                         turn_ids=None if explicit is None else _pack(explicit, lengths), cu_seqlens=cu)
        torch.testing.assert_close(packed, llm.length_adaptive_lam(mp, 0.4, turns=True, turn_ids=explicit))
    with pytest.raises(ValueError, match="turn_ids is read with turns=True only"):
        llm.length_adaptive_lam(m, 0.4, turn_ids=ids)
    with pytest.raises(TypeError, match="turns must be a bool"):
        llm.length_adaptive_lam(m, 0.4, turns=1)


@pytest.mark.parametrize("backend", ["torch", "numba", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_turn_returns_backends_dtypes_and_rewards_off_the_turn_ends(backend, dtype):
    """turn_returns is one affine scan: every CPU backend gives the loop's numbers in the rewards' dtype
    (``out_dtype`` overrides it); rewards away from a turn's last token and at tool tokens are not read
    (NaN there changes nothing)."""
    r, _, m, _ = _rows(7)
    r = r.to(dtype)
    end = m & ~torch.nn.functional.pad(m, (0, 1))[..., 1:]  # each run's last model token
    got = llm.turn_returns(r, m, 0.9, backend=backend)
    assert got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), _loop(r.double(), r.double(), m, 0.9, 1.0)[0], rtol=tol, atol=tol)
    noisy = llm.turn_returns(torch.where(end, r, float("nan")), m, 0.9, backend=backend)
    torch.testing.assert_close(noisy, got, rtol=0, atol=0)
    assert llm.turn_returns(r, m, 0.9, out_dtype=torch.float64, backend=backend).dtype == torch.float64
    with pytest.raises(TypeError, match="out_dtype"):
        llm.turn_returns(r, m, 0.9, out_dtype=torch.int64)
    with pytest.raises(ValueError, match="token_level_rewards"):
        llm.turn_returns(r[:, :-1], m, 0.9)
