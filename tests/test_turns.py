"""Turn-level returns and GAE (rollbuf.integrations.llm.turn_returns, turn_gae) against a float64 loop
over each row's turns: turns as maximal runs of model tokens and as explicit turn ids (a turn
interrupted by tool tokens), empty rows, rows of one turn, truncated rows, both value positions."""

from __future__ import annotations

import pytest
import torch

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
