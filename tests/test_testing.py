"""The testing kit itself (:mod:`rollbuf.testing`): what it generates, and that its checks can fail."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from rollbuf.testing import (
    assert_close_to_reference,
    assert_matches_reference,
    gammas,
    lams,
    make_rollout,
    rollouts,
    window_end_index,
)


def user_gae(gamma, lam, rewards, values, terminated, truncated, bootstrap_values, ignore_truncation=False):
    """A user's own GAE: a plain loop over time, no mask support (the module docstring's example)."""
    N, T = rewards.shape
    adv = torch.zeros(N, T, dtype=torch.float64)
    for n in range(N):
        a = 0.0
        for t in reversed(range(T)):
            k = bool(terminated[n, t])
            tr = bool(truncated[n, t]) and not ignore_truncation
            end = t == T - 1
            if k:
                v_next = 0.0
            elif tr or end:
                v_next = float(bootstrap_values[n, t])
            else:
                v_next = float(values[n, t + 1])
            done = k or tr or end
            a = float(rewards[n, t]) + gamma * v_next - float(values[n, t]) + (0.0 if done else gamma * lam * a)
            adv[n, t] = a
    return adv.to(rewards.dtype), (adv + values.double()).to(rewards.dtype)


@given(f=rollouts(max_t=20, masks=False), gamma=gammas(), lam=lams())
def test_property_docstring_example_user_gae(f, gamma, lam):
    out = user_gae(gamma, lam, f["rewards"], f["values"], f["terminated"], f["truncated"], f["bootstrap_values"])
    assert_matches_reference("gae", out, f, gamma=gamma, lam=lam)


def test_mismatch_report_names_row_step_and_boundary():
    f = make_rollout(2, 12, seed=0, p_terminated=0.0, p_truncated=0.0)
    f["truncated"][1, 5] = True
    f["bootstrap_values"][1, 5] = 3.0
    out = user_gae(0.9, 0.9, f["rewards"], f["values"], f["terminated"], f["truncated"], f["bootstrap_values"],
                   ignore_truncation=True)
    with pytest.raises(AssertionError) as info:
        assert_matches_reference("gae", out, f, gamma=0.9, lam=0.9)
    msg = str(info.value)
    assert "gae.advantages" in msg
    assert "first at row 1, step 5" in msg  # the truncated step is the first (row-major) to differ
    assert "step 5: terminated=0 truncated=1   <- t, bootstrap_values[5] = 3" in msg
    assert "t is not the window end (window end of this row: step 11)" in msg


def test_report_for_masked_window_end_and_final():
    f = make_rollout(1, 6, seed=1, p_terminated=0.0, p_truncated=0.0, p_masked=0.0)
    f["mask"][0, 4:] = False
    bad = torch.zeros(1, 6)
    with pytest.raises(AssertionError, match=r"t is the window end \(last unmasked step of the row\)"):
        assert_close_to_reference(bad, torch.tensor([[0, 0, 0, 1.0, 0, 0]], dtype=torch.float64), f)
    with pytest.raises(AssertionError, match=r"row 0 \(per-row output\)"):
        assert_close_to_reference(torch.zeros(1), torch.ones(1).double(), f, name="final")


def test_close_to_reference_rules():
    e = torch.tensor([[1.0, float("inf"), 100.0]], dtype=torch.float64)
    assert_close_to_reference(torch.tensor([[1.0, float("inf"), 100.004]]), e)  # rtol 1e-4 of 100
    with pytest.raises(AssertionError, match="shape"):
        assert_close_to_reference(torch.zeros(1, 2), e)
    with pytest.raises(AssertionError, match="1 NaN/inf mismatches"):
        assert_close_to_reference(torch.tensor([[float("nan"), float("inf"), 100.0]]), e)
    nan = torch.tensor([[float("nan")]])
    with pytest.raises(AssertionError):
        assert_close_to_reference(nan, nan.double())  # a NaN reference is a broken test by default
    assert_close_to_reference(nan, nan.double(), equal_nan=True)
    # tolerance follows the dtype: bf16 passes where fp32 fails
    assert_close_to_reference(torch.tensor([[1.01]], dtype=torch.bfloat16), torch.tensor([[1.0]]).double())
    with pytest.raises(AssertionError):
        assert_close_to_reference(torch.tensor([[1.01]]), torch.tensor([[1.0]]).double())


@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.uint8, torch.float32])
def test_make_rollout_invariants(flag_dtype):
    f = make_rollout(4, 50, seed=3, p_terminated=0.1, p_truncated=0.2, p_masked=0.4, flag_dtype=flag_dtype,
                     features=(3,))
    m, k, tr = f["mask"].bool(), f["terminated"].bool(), f["truncated"].bool()
    assert f["terminated"].dtype == flag_dtype and f["x"].shape == (4, 50, 3)
    end = window_end_index(f["mask"], m.shape)
    at_end = (torch.arange(50) == end.unsqueeze(-1)) & m & ~k
    read = (tr & ~k & m) | at_end
    assert torch.isfinite(f["bootstrap_values"][read]).all()
    assert f["bootstrap_values"][~read].isnan().all()
    for name in ("rewards", "values", "log_probs", "target_log_probs", "q_values"):
        assert torch.isfinite(f[name][m]).all()
        assert not torch.isfinite(f[name][~m]).all() or (~m).sum() == 0, f"no garbage in masked {name}"
    assert (~m).any() and (k & ~m).any(), "masked steps carry random flags"
    same = make_rollout(4, 50, seed=3, p_terminated=0.1, p_truncated=0.2, p_masked=0.4, flag_dtype=flag_dtype,
                        features=(3,))
    assert all(torch.equal(same[n].nan_to_num(), f[n].nan_to_num()) for n in f)


def test_unknown_estimator_name():
    f = make_rollout(1, 3)
    with pytest.raises(ValueError, match="unknown estimator 'gea'"):
        assert_matches_reference("gea", f["rewards"], f, gamma=0.9)
