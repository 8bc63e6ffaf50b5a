"""TorchRL interop: ``Rollout.from_torchrl(td)`` / ``Rollout.to_torchrl()``.

The round-trip tests need only tensordict. The comparison with TorchRL's own functional estimators
(``generalized_advantage_estimate``, ``td_lambda_return_estimate``) needs ``torchrl``, which the test
extra installs (torchrl 0.14, with tensordict 0.14.3), so CI runs it; on a bare install without
torchrl it is skipped with the reason shown in the ``-ra`` summary. The drop-in estimators built on
this mapping are tested in tests/test_integrations_torchrl.py.

(The methods are not called ``from_tensordict``/``to_tensordict``: those names are tensorclass's own
API, see ``test_tensorclass_api_untouched``.)
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from rollbuf import Rollout
from rollbuf.testing import make_rollout, rollouts

try:
    from torchrl.objectives.value.functional import generalized_advantage_estimate, td_lambda_return_estimate

    HAVE_TORCHRL = True
except Exception as exc:  # ImportError, or a torchrl built against another torch failing to load
    HAVE_TORCHRL = False
    TORCHRL_ERROR = f"{type(exc).__name__}: {exc}"

needs_torchrl = pytest.mark.skipif(
    not HAVE_TORCHRL,
    reason="torchrl is not importable, so rollbuf is not compared with TorchRL's estimators here "
    "(pip install -e '.[test]' installs it); "
    + ("" if HAVE_TORCHRL else TORCHRL_ERROR),
)

FIELDS = ("rewards", "values", "terminated", "truncated", "log_probs", "mask")


def rollout_of(f: dict) -> Rollout:
    return Rollout(**{k: f[k] for k in (*FIELDS, "bootstrap_values")}, batch_size=list(f["rewards"].shape))


def read_slots(ro: Rollout) -> torch.Tensor:
    """Where rollbuf reads bootstrap_values: truncated (not terminated) agent steps, and the window
    end (last unmasked step) unless terminated."""
    from rollbuf.testing import window_end_index

    live = torch.ones_like(ro.terminated, dtype=torch.bool) if ro.mask is None else ro.mask != 0
    term, trunc = ro.terminated != 0, ro.truncated != 0
    end = window_end_index(ro.mask, ro.rewards.shape)
    at_end = torch.arange(ro.rewards.shape[-1]) == end.unsqueeze(-1)
    return live & ~term & (trunc | at_end)


# ------------------------------------------------------------------------------ layout


def test_to_torchrl_layout():
    f = make_rollout(3, 5, seed=1, p_terminated=0.2, p_truncated=0.2, p_masked=0.3)
    ro = rollout_of(f)
    td = ro.to_torchrl()
    assert td.batch_size == torch.Size([3, 5])
    for key in (("next", "reward"), "state_value", ("next", "state_value"), ("next", "terminated"),
                ("next", "truncated"), ("next", "done")):
        assert td.get(key).shape == (3, 5, 1), key
    assert td["action_log_prob"].shape == (3, 5)
    assert torch.equal(td["next", "done"].squeeze(-1), (ro.terminated != 0) | (ro.truncated != 0))
    assert torch.equal(td["collector", "mask"], ro.mask != 0)
    assert td["next", "terminated"].dtype == torch.bool
    # a custom log-prob key, and no mask entry for a rollout without one
    td2 = rollout_of(make_rollout(2, 4, seed=2)).to_torchrl(log_prob_key="sample_log_prob")
    assert "sample_log_prob" in td2.keys() and "action_log_prob" not in td2.keys()
    assert ("collector", "mask") not in td2.keys(include_nested=True)


def test_next_state_value_is_filled_for_torchrl():
    """("next", "state_value") is V(s'_t) at every step: the next agent step's value inside an
    episode, bootstrap_values at truncations and the window end, 0 after a termination/when masked."""
    nan = float("nan")
    ro = Rollout(
        rewards=torch.zeros(1, 6),
        values=torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]),
        terminated=torch.tensor([[False, True, False, False, False, False]]),
        truncated=torch.tensor([[False, False, False, True, False, False]]),
        bootstrap_values=torch.tensor([[nan, nan, nan, 40.0, 50.0, nan]]),
        mask=torch.tensor([[True, True, True, True, True, False]]),
        batch_size=[1, 6],
    )
    nv = ro.to_torchrl()["next", "state_value"].squeeze(-1)
    # t=0: V(s_1)=2; t=1 terminated: 0; t=2: V(s_3)=4; t=3 truncated: 40; t=4 window end: 50; t=5 masked: 0
    assert nv.tolist() == [[2.0, 0.0, 4.0, 40.0, 50.0, 0.0]]
    # masked steps in between are skipped: the next *unmasked* step's value
    ro.mask = torch.tensor([[True, False, False, True, True, True]])
    ro.terminated = torch.zeros(1, 6, dtype=torch.bool)
    ro.truncated = torch.zeros(1, 6, dtype=torch.bool)
    ro.bootstrap_values = torch.tensor([[nan, nan, nan, nan, nan, 60.0]])
    nv = ro.to_torchrl()["next", "state_value"].squeeze(-1)
    assert nv.tolist() == [[4.0, 0.0, 0.0, 5.0, 6.0, 60.0]]


def test_no_bootstrap_values_no_next_state_value():
    ro = Rollout(rewards=torch.zeros(2, 3), values=torch.zeros(2, 3), terminated=torch.zeros(2, 3, dtype=torch.bool),
                 truncated=torch.zeros(2, 3, dtype=torch.bool), batch_size=[2, 3])
    td = ro.to_torchrl()
    assert ("next", "state_value") not in td.keys(include_nested=True)
    assert "action_log_prob" not in td.keys()


# --------------------------------------------------------------------------- round trip


@given(f=rollouts(max_n=3, max_t=40, dtypes=(torch.float32, torch.float64)),
       gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]), lam=st.sampled_from([0.0, 0.95, 1.0]))
def test_round_trip(f, gamma, lam):
    ro = rollout_of(f)
    back = Rollout.from_torchrl(ro.to_torchrl())
    assert back.batch_size == ro.batch_size
    for name in ("rewards", "values", "log_probs"):
        torch.testing.assert_close(getattr(back, name), getattr(ro, name), equal_nan=True, rtol=0, atol=0)
    for name in ("terminated", "truncated"):
        assert back.__getattr__(name).dtype == torch.bool
        assert torch.equal(getattr(back, name), getattr(ro, name) != 0)
    if ro.mask is None:
        assert back.mask is None
    else:
        assert torch.equal(back.mask, ro.mask != 0)
    read = read_slots(ro)
    assert torch.equal(back.bootstrap_values[read], ro.bootstrap_values[read])
    # hence every estimator gives the same numbers
    for a, b in zip(back.gae(gamma, lam), ro.gae(gamma, lam)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(back.discounted_returns(gamma), ro.discounted_returns(gamma), rtol=0, atol=0)
    target = f["target_log_probs"]
    torch.testing.assert_close(back.vtrace(target, gamma).vs, ro.vtrace(target, gamma).vs, rtol=0, atol=0)


def test_from_torchrl_reads_torchrl_keys():
    """A TensorDict as TorchRL writes it: [*B, T, 1] entries, "sample_log_prob", the padding mask of
    split_trajectories; a multi-dim batch [2, 3, T]."""
    g = torch.Generator().manual_seed(0)
    B, T = (2, 3), 5
    done = torch.rand(*B, T, 1, generator=g) < 0.3
    term = done & (torch.rand(*B, T, 1, generator=g) < 0.5)
    td = TensorDict({
        "state_value": torch.randn(*B, T, 1, generator=g),
        "sample_log_prob": -torch.rand(*B, T, generator=g),
        "observation": torch.randn(*B, T, 4, generator=g),
        "collector": {"mask": torch.ones(*B, T, dtype=torch.bool)},
        "next": {"reward": torch.randn(*B, T, 1, generator=g), "done": done, "terminated": term,
                 "truncated": done & ~term, "state_value": torch.randn(*B, T, 1, generator=g)},
    }, batch_size=[*B, T])
    ro = Rollout.from_torchrl(td)
    assert ro.batch_size == torch.Size([*B, T])
    assert torch.equal(ro.rewards, td["next", "reward"].squeeze(-1))
    assert torch.equal(ro.log_probs, td["sample_log_prob"])
    assert torch.equal(ro.terminated, term.squeeze(-1)) and torch.equal(ro.truncated, (done & ~term).squeeze(-1))
    assert ro.mask is not None and ro.mask.all()
    # views of td's entries, not copies
    assert ro.values.data_ptr() == td["state_value"].data_ptr()
    assert Rollout.from_torchrl(td, mask_key=None).mask is None
    with pytest.raises(ValueError, match="state_value"):
        Rollout.from_torchrl(td.exclude(("next", "state_value")))


def test_tensorclass_api_untouched():
    """Rollout's tensorclass conversions keep their meaning (field-keyed TensorDicts)."""
    ro = rollout_of(make_rollout(2, 4, seed=3))
    td = ro.to_tensordict()
    assert {"rewards", "values", "terminated", "truncated"} <= set(td.keys())
    again = Rollout.from_tensordict(td)
    assert torch.equal(again.rewards, ro.rewards)
    assert torch.equal(Rollout.from_dict(dict(td.items()), batch_size=[2, 4]).values, ro.values)


# -------------------------------------------------------------------- against TorchRL itself


def torchrl_td(B, T, seed, dtype=torch.float64):
    """What a TorchRL collector + value network produce: V(s'_t) at every step, equal to V(s_{t+1})
    inside an episode, the final state's value after a done, V(s_T) at the window end."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(*B, T, generator=g) < 0.15
    term = done & (torch.rand(*B, T, generator=g) < 0.5)
    v = torch.randn(*B, T, generator=g, dtype=dtype)
    final = torch.randn(*B, T, generator=g, dtype=dtype)  # V(final obs) where done, V(s_T) at the end
    nxt = torch.cat([v[..., 1:], final[..., -1:]], -1)
    nxt = torch.where(done, final, nxt)
    r = torch.randn(*B, T, generator=g, dtype=dtype)
    return TensorDict({
        "state_value": v.unsqueeze(-1),
        "next": {"reward": r.unsqueeze(-1), "done": done.unsqueeze(-1), "terminated": term.unsqueeze(-1),
                 "truncated": (done & ~term).unsqueeze(-1), "state_value": nxt.unsqueeze(-1)},
    }, batch_size=[*B, T])


# TorchRL builds gamma·(1 − terminated) and gamma·lam·(1 − done) as int flags times a Python float,
# i.e. in float32 whatever the data's dtype: the float64 data agree to float32 rounding of gamma.
TOL = dict(rtol=1e-5, atol=1e-5)


def torchrl_estimates(td, gamma, lam):
    adv, target = generalized_advantage_estimate(
        gamma, lam, td["state_value"], td["next", "state_value"], td["next", "reward"],
        td["next", "done"], td["next", "terminated"])
    lret = td_lambda_return_estimate(gamma, lam, td["next", "state_value"], td["next", "reward"],
                                     td["next", "done"], td["next", "terminated"])
    return adv.squeeze(-1), target.squeeze(-1), lret.squeeze(-1)


@needs_torchrl
@pytest.mark.parametrize("B", [(1,), (4,), (2, 3)])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.0, 0.5)])
def test_from_torchrl_matches_torchrl_estimators(B, gamma, lam):
    td = torchrl_td(B, 37, seed=sum(B) * 100 + int(gamma * 10) + int(lam * 100))
    adv, target, lret = torchrl_estimates(td, gamma, lam)
    ro = Rollout.from_torchrl(td)
    ours = ro.gae(gamma, lam)
    torch.testing.assert_close(ours.advantages, adv, **TOL)
    torch.testing.assert_close(ours.returns, target, **TOL)
    torch.testing.assert_close(ro.lambda_returns(gamma, lam), lret, **TOL)


@needs_torchrl
@given(f=rollouts(max_n=3, max_t=40, masks=False, dtypes=(torch.float64,)),
       gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]), lam=st.sampled_from([0.0, 0.95, 1.0]))
def test_to_torchrl_matches_torchrl_estimators(f, gamma, lam):
    """A rollout filled the rollbuf way (bootstrap_values NaN where unread) converts into a TensorDict
    on which TorchRL's estimators give rollbuf's numbers."""
    ro = rollout_of(f)
    adv, target, lret = torchrl_estimates(ro.to_torchrl(), gamma, lam)
    ours = ro.gae(gamma, lam)
    torch.testing.assert_close(ours.advantages, adv, **TOL)
    torch.testing.assert_close(ours.returns, target, **TOL)
    torch.testing.assert_close(ro.lambda_returns(gamma, lam), lret, **TOL)
