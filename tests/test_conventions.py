"""Converters between user conventions and rollbuf's fields (rollbuf.boundary.conventions)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rollbuf.boundary.conventions import (
    done_from_episode_starts,
    episode_starts_from_done,
    fields_from_torchrl,
    fields_from_verl,
    from_time_major,
    to_time_major,
    torchrl_from_fields,
)

LEAD = (2, 3)  # leading batch dims [2, 3, T]


def _bools(data, shape):
    n = 1
    for s in shape:
        n *= s
    bits = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return torch.tensor(bits, dtype=torch.bool).reshape(shape)


# ----------------------------------------------------------------- hand-checked tiny examples


def test_done_from_episode_starts_hand_checked():
    # env 0: episode ends after step 1 and after step 2; env 1: ends after step 0 only.
    starts = torch.tensor([[True, False, True], [False, True, False]])
    next_start = torch.tensor([True, False])
    done = done_from_episode_starts(starts, next_start)
    assert done.dtype == torch.bool
    assert done.tolist() == [[False, True, True], [True, False, False]]


def test_first_episode_start_is_not_used():
    starts = torch.tensor([[False, False, True]])
    flipped = starts.clone()
    flipped[..., 0] = True
    nxt = torch.tensor([False])
    assert torch.equal(done_from_episode_starts(starts, nxt), done_from_episode_starts(flipped, nxt))


def test_episode_starts_from_done_hand_checked():
    done = torch.tensor([[False, True, True], [True, False, False]])
    starts, nxt = episode_starts_from_done(done, torch.tensor([True, False]))
    assert starts.tolist() == [[True, False, True], [False, True, False]]
    assert nxt.tolist() == [True, False]
    assert nxt.data_ptr() == done[..., -1].data_ptr()  # a view of done


def test_single_step_window():
    done = done_from_episode_starts(torch.tensor([[True]]), torch.tensor([True]))
    assert done.tolist() == [[True]]
    starts, nxt = episode_starts_from_done(torch.tensor([[True]]), torch.tensor([False]))
    assert starts.tolist() == [[False]] and nxt.tolist() == [True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.int64], ids=str)
def test_cleanrl_float_flags(dtype):
    # CleanRL: dones = torch.zeros((num_steps, num_envs)); next_done = torch.zeros(num_envs)
    dones_tn = torch.tensor([[1, 0], [0, 0], [1, 1]], dtype=dtype)  # [T=3, N=2]
    next_done = torch.tensor([0, 1], dtype=dtype)
    done = done_from_episode_starts(from_time_major(dones_tn), next_done)
    assert done.dtype == torch.bool
    assert done.tolist() == [[False, True, False], [False, True, True]]


def _cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """CleanRL ppo.py, verbatim logic: [T, N], dones observation-aligned (the loop of
    docs/examples/cleanrl_gae.py, which the CleanRL how-to is tested against too)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "cleanrl_gae.py"
    spec = importlib.util.spec_from_file_location("_docs_cleanrl_gae", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cleanrl_loop(rewards, values, dones, next_value, next_done, gamma, lam)[0]


def _gae_transition_aligned(rewards, values, terminated, bootstrap_last, gamma, lam):
    """SPEC §2 GAE on [N, T] with terminated only (no truncation), window end bootstrapped."""
    N, T = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(N, dtype=rewards.dtype)
    for t in reversed(range(T)):
        k = terminated[:, t].to(rewards.dtype)
        nxt = bootstrap_last if t == T - 1 else values[:, t + 1]
        delta = rewards[:, t] + gamma * (1 - k) * nxt - values[:, t]
        cont = 0.0 if t == T - 1 else 1.0
        adv[:, t] = last = delta + gamma * lam * (1 - k) * cont * last
    return adv


def test_cleanrl_gae_equals_transition_aligned_gae_with_done_as_terminated():
    g = torch.Generator().manual_seed(0)
    T, N = 9, 4
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    dones = (torch.rand(T, N, generator=g) < 0.3).to(torch.float64)
    next_done = (torch.rand(N, generator=g) < 0.5).to(torch.float64)
    next_value = torch.randn(N, generator=g, dtype=torch.float64)
    expected = _cleanrl_gae(rewards, values, dones, next_value, next_done, 0.97, 0.9)

    r, v, d = from_time_major(rewards, values, dones)
    done = done_from_episode_starts(d, next_done)
    got = _gae_transition_aligned(r, v, done, next_value, 0.97, 0.9)
    torch.testing.assert_close(to_time_major(got), expected)


# --------------------------------------------------------------- round trips (hypothesis)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 17), data=st.data())
def test_round_trip_starts_to_done_to_starts(T, data):
    starts = _bools(data, LEAD + (T,))
    nxt = _bools(data, LEAD)
    done = done_from_episode_starts(starts, nxt)
    assert done.shape == LEAD + (T,)
    starts2, nxt2 = episode_starts_from_done(done, starts[..., 0])
    assert torch.equal(starts2, starts)
    assert torch.equal(nxt2, nxt)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 17), data=st.data())
def test_round_trip_done_to_starts_to_done(T, data):
    done = _bools(data, LEAD + (T,))
    first = _bools(data, LEAD)
    starts, nxt = episode_starts_from_done(done, first)
    assert torch.equal(starts[..., 0], first)
    assert torch.equal(done_from_episode_starts(starts, nxt), done)
    # float (CleanRL) flags give the same answer
    assert torch.equal(done_from_episode_starts(starts.float(), nxt.float()), done)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 17), with_lp=st.booleans(), data=st.data())
def test_round_trip_fields_to_torchrl_to_fields(T, with_lp, data):
    shape = LEAD + (T,)
    terminated = _bools(data, shape)
    truncated = _bools(data, shape)
    g = torch.Generator().manual_seed(T)
    rewards, values, boot, lp = (torch.randn(shape, generator=g) for _ in range(4))
    td = torchrl_from_fields(
        rewards, values, terminated, truncated, bootstrap_values=boot, log_probs=lp if with_lp else None
    )
    assert td.batch_size == torch.Size(shape)
    assert td["next", "reward"].shape == shape + (1,)
    assert td["next", "done"].dtype == torch.bool
    assert torch.equal(td["next", "done"].squeeze(-1), terminated | truncated)

    f = fields_from_torchrl(td)
    assert set(f) == {"rewards", "values", "terminated", "truncated", "bootstrap_values"} | (
        {"log_probs"} if with_lp else set()
    )
    for name, ref in [("rewards", rewards), ("values", values), ("terminated", terminated),
                      ("truncated", truncated), ("bootstrap_values", boot)] + (
                          [("log_probs", lp)] if with_lp else []):
        assert f[name].shape == shape, name
        assert torch.equal(f[name], ref), name
    # views all the way: nothing was copied
    assert f["rewards"].data_ptr() == rewards.data_ptr()
    assert f["terminated"].data_ptr() == terminated.data_ptr()


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 12), data=st.data())
def test_round_trip_torchrl_to_fields_to_torchrl(T, data):
    shape = LEAD + (T,)
    terminated = _bools(data, shape)
    truncated = _bools(data, shape)
    g = torch.Generator().manual_seed(T)
    td = TensorDict(
        {
            "state_value": torch.randn(shape + (1,), generator=g),
            "action_log_prob": torch.randn(shape, generator=g),
            "next": {
                "reward": torch.randn(shape + (1,), generator=g),
                "terminated": terminated.unsqueeze(-1),
                "truncated": truncated.unsqueeze(-1),
                "done": (terminated | truncated).unsqueeze(-1),
                "state_value": torch.randn(shape + (1,), generator=g),
            },
        },
        batch_size=shape,
    )
    td2 = torchrl_from_fields(**fields_from_torchrl(td))
    assert set(td2.keys(include_nested=True, leaves_only=True)) == set(
        td.keys(include_nested=True, leaves_only=True)
    )
    for key in td.keys(include_nested=True, leaves_only=True):
        assert td2[key].shape == td[key].shape, key
        assert torch.equal(td2[key], td[key]), key


# ------------------------------------------------------------------------------ TorchRL details


def _td(T=3, lead=(2,), singleton=True, drop=()):
    """Episode terminates after step 1, is truncated after step T-1; optional trailing [.., 1]."""
    shape = lead + (T,)
    g = torch.Generator().manual_seed(1)
    terminated = torch.zeros(shape, dtype=torch.bool)
    terminated[..., 1] = True
    done = terminated.clone()
    done[..., -1] = True

    def feat(x):
        return x.unsqueeze(-1).clone() if singleton else x

    entries = {
        "state_value": feat(torch.randn(shape, generator=g)),
        ("next", "reward"): feat(torch.randn(shape, generator=g)),
        ("next", "terminated"): feat(terminated),
        ("next", "done"): feat(done),
        ("next", "truncated"): feat(done & ~terminated),
        ("next", "state_value"): feat(torch.randn(shape, generator=g)),
    }
    td = TensorDict({}, batch_size=shape)
    for k, v in entries.items():
        if k not in drop:
            td.set(k, v)
    return td


def test_torchrl_hand_checked():
    td = TensorDict(
        {
            "state_value": torch.tensor([[0.5], [0.6], [0.7]]),
            "next": {
                "reward": torch.tensor([[1.0], [2.0], [3.0]]),
                "terminated": torch.tensor([[False], [True], [False]]),
                "truncated": torch.tensor([[False], [False], [True]]),
                "state_value": torch.tensor([[0.6], [0.0], [0.9]]),
            },
        },
        batch_size=[3],
    )
    f = fields_from_torchrl(td)
    assert f["rewards"].tolist() == [1.0, 2.0, 3.0]
    assert f["values"].tolist() == pytest.approx([0.5, 0.6, 0.7])
    assert f["bootstrap_values"].tolist() == pytest.approx([0.6, 0.0, 0.9])
    assert f["terminated"].tolist() == [False, True, False]
    assert f["truncated"].tolist() == [False, False, True]
    assert "log_probs" not in f


@pytest.mark.parametrize("singleton", [True, False], ids=["T1-feature", "no-feature"])
def test_torchrl_singleton_squeeze_is_a_view(singleton):
    td = _td(singleton=singleton)
    f = fields_from_torchrl(td)
    for name, key in [("rewards", ("next", "reward")), ("values", "state_value"),
                      ("terminated", ("next", "terminated")), ("truncated", ("next", "truncated")),
                      ("bootstrap_values", ("next", "state_value"))]:
        assert f[name].shape == td.batch_size, name
        assert f[name].data_ptr() == td[key].data_ptr(), name
        assert torch.equal(f[name], td[key].reshape(td.batch_size)), name


def test_torchrl_truncated_derived_from_done():
    td = _td(drop=[("next", "truncated")])
    f = fields_from_torchrl(td)
    assert f["terminated"][0].tolist() == [False, True, False]
    assert f["truncated"][0].tolist() == [False, False, True]
    # terminated wins: done & terminated is not a truncation
    assert not (f["truncated"] & f["terminated"]).any()


def test_torchrl_truncated_all_false_without_done():
    td = _td(drop=[("next", "truncated"), ("next", "done")])
    f = fields_from_torchrl(td)
    assert f["truncated"].dtype == torch.bool
    assert f["truncated"].shape == td.batch_size
    assert not f["truncated"].any()


def test_torchrl_log_prob_keys():
    td = _td()
    lp = torch.randn(td.batch_size)
    td.set("sample_log_prob", lp)
    assert fields_from_torchrl(td)["log_probs"] is lp
    td.set("action_log_prob", lp + 1)
    with pytest.raises(ValueError, match="log_prob_key"):
        fields_from_torchrl(td)
    torch.testing.assert_close(fields_from_torchrl(td, log_prob_key="action_log_prob")["log_probs"], lp + 1)
    torch.testing.assert_close(fields_from_torchrl(td, log_prob_key="sample_log_prob")["log_probs"], lp)
    with pytest.raises(ValueError, match="'my_lp'"):
        fields_from_torchrl(td, log_prob_key="my_lp")


def test_torchrl_custom_log_prob_key_written():
    r = torch.zeros(2, 3)
    f = torch.zeros(2, 3, dtype=torch.bool)
    td = torchrl_from_fields(r, r, f, f, bootstrap_values=r, log_probs=r, log_prob_key="sample_log_prob")
    assert "sample_log_prob" in td.keys() and "action_log_prob" not in td.keys()
    assert td["sample_log_prob"].shape == (2, 3)


@pytest.mark.parametrize(
    "missing, pattern",
    [
        (("next", "terminated"), r"\('next', 'terminated'\)"),
        (("next", "reward"), r"\('next', 'reward'\)"),
        ("state_value", r"'state_value'"),
        (("next", "state_value"), r"\('next', 'state_value'\)"),
    ],
    ids=["terminated", "reward", "state_value", "next-state_value"],
)
def test_torchrl_missing_key_is_named(missing, pattern):
    with pytest.raises(ValueError, match=pattern):
        fields_from_torchrl(_td(drop=[missing]))


def test_torchrl_bad_inputs():
    with pytest.raises(TypeError, match="td must be a TensorDict"):
        fields_from_torchrl({"next": {}})
    with pytest.raises(ValueError, match="td must have at least one batch dimension"):
        fields_from_torchrl(TensorDict({}, batch_size=[]))
    td = _td()
    td.set(("next", "reward"), torch.zeros(td.batch_size + (2,)))
    with pytest.raises(ValueError, match=r"td\[\('next', 'reward'\)\] must have shape"):
        fields_from_torchrl(td)
    td = _td()
    td.set("state_value", torch.zeros(td.batch_size, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"td\['state_value'\] must be a floating-point"):
        fields_from_torchrl(td)
    td = _td()
    td.set("sample_log_prob", TensorDict({"a": torch.zeros(td.batch_size)}, batch_size=td.batch_size))
    with pytest.raises(TypeError, match=r"td\['sample_log_prob'\] must be a tensor"):
        fields_from_torchrl(td)


def _fields(shape=(2, 3)):
    r = torch.zeros(shape)
    f = torch.zeros(shape, dtype=torch.bool)
    return dict(rewards=r, values=r.clone(), terminated=f, truncated=f.clone())


@pytest.mark.parametrize(
    "name, bad, exc",
    [
        ("rewards", torch.zeros(2, 3, dtype=torch.int64), TypeError),
        ("rewards", [[0.0] * 3] * 2, TypeError),
        ("rewards", torch.tensor(0.0), ValueError),
        ("values", torch.zeros(2, 4), ValueError),
        ("values", torch.zeros(3), ValueError),  # no broadcasting
        ("terminated", torch.zeros(2, 3, 1, dtype=torch.bool), ValueError),
        ("truncated", torch.zeros(2, 3, dtype=torch.complex64), TypeError),
        ("bootstrap_values", torch.zeros(2), ValueError),
        ("bootstrap_values", torch.zeros(2, 3, dtype=torch.bool), TypeError),
        ("log_probs", torch.zeros(2, 3, dtype=torch.int32), TypeError),
        ("values", torch.zeros(2, 3, device="meta"), ValueError),  # device mismatch
    ],
    ids=["rewards-int", "rewards-list", "rewards-0d", "values-shape", "values-broadcast",
         "terminated-shape", "truncated-complex", "bootstrap-shape", "bootstrap-bool",
         "log_probs-int", "values-device"],
)
def test_torchrl_from_fields_errors_name_argument(name, bad, exc):
    kw = _fields()
    kw[name] = bad
    with pytest.raises(exc, match=rf"^{name}\b"):
        torchrl_from_fields(**kw)


# ----------------------------------------------------------------------------------- time-major


def test_from_time_major_is_a_view():
    x = torch.arange(6.0).reshape(3, 2).clone()  # [T=3, N=2], owns its storage
    y = from_time_major(x)
    assert y.shape == (2, 3)
    assert y._base is x
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x.mT)
    y[0, 1] = 100.0  # writes through: same storage
    assert x[1, 0] == 100.0


def test_from_time_major_several_and_features():
    r = torch.randn(5, 4)
    obs = torch.randn(5, 4, 7)  # [T, N, *F] → [N, T, *F]
    r2, obs2 = from_time_major(r, obs)
    assert r2.shape == (4, 5) and obs2.shape == (4, 5, 7)
    assert r2._base is r and obs2._base is obs
    assert obs2.untyped_storage().data_ptr() == obs.untyped_storage().data_ptr()
    assert torch.equal(obs2[2, 3], obs[3, 2])
    back_r, back_obs = to_time_major(r2, obs2)
    assert back_r.data_ptr() == r.data_ptr() and torch.equal(back_r, r)
    assert torch.equal(back_obs, obs)


def test_time_major_errors():
    with pytest.raises(ValueError, match=r"tensors\[1\] must have at least 2 dimensions"):
        from_time_major(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match=r"^tensor must have at least 2 dimensions"):
        to_time_major(torch.zeros(3))
    with pytest.raises(TypeError, match=r"tensors\[0\] must be a torch.Tensor"):
        from_time_major([1.0], torch.zeros(3, 2))
    with pytest.raises(TypeError, match="at least one tensor"):
        from_time_major()


# ----------------------------------------------------------------------------------- verl


def test_verl_hand_checked():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    v = torch.tensor([[0.2, 0.9, 0.4], [0.1, 0.2, 0.3]])
    m = torch.tensor([[1, 0, 1], [1, 1, 0]])
    f = fields_from_verl(r, v, m)
    assert f["rewards"] is r and f["values"] is v
    assert f["mask"].dtype == torch.bool
    assert f["mask"].tolist() == [[True, False, True], [True, True, False]]
    assert f["window_end"] == "terminal"
    mb = m.bool()
    assert fields_from_verl(r, v, mb)["mask"] is mb  # bool masks pass through


def _verl_gae(rewards, values, response_mask, gamma, lam):
    """verl core_algos.compute_gae_advantage_return (multi-turn), without the whitening."""
    nextvalues, lastgaelam, out = 0, 0, []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        out.append(lastgaelam)
    return torch.stack(out[::-1], dim=1)


def test_verl_mask_is_deletion_with_terminal_window_end():
    """The documented claim: verl's loop = GAE on the kept tokens, last kept token terminal."""
    g = torch.Generator().manual_seed(3)
    B, T, gamma, lam = 5, 11, 0.95, 0.8
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = (torch.rand(B, T, generator=g) < 0.6).long()
    expected = _verl_gae(r, v, m, gamma, lam)
    f = fields_from_verl(r, v, m)
    for b in range(B):
        keep = f["mask"][b]
        rr, vv = f["rewards"][b][keep], f["values"][b][keep]
        adv, last = torch.zeros_like(rr), 0.0
        for t in reversed(range(rr.shape[0])):
            nxt = vv[t + 1] if t + 1 < rr.shape[0] else 0.0  # window_end="terminal"
            adv[t] = last = rr[t] + gamma * nxt - vv[t] + gamma * lam * last
        torch.testing.assert_close(expected[b][keep], adv)


@pytest.mark.parametrize(
    "name, bad, exc",
    [
        ("token_level_rewards", torch.zeros(2, 3, dtype=torch.int64), TypeError),
        ("token_level_rewards", torch.tensor(1.0), ValueError),
        ("values", torch.zeros(2, 4), ValueError),
        ("values", None, TypeError),
        ("response_mask", torch.ones(2, 3, dtype=torch.complex64), TypeError),
        ("response_mask", torch.ones(3), ValueError),
    ],
    ids=["rewards-int", "rewards-0d", "values-shape", "values-none", "mask-complex", "mask-shape"],
)
def test_verl_errors_name_argument(name, bad, exc):
    kw = dict(token_level_rewards=torch.zeros(2, 3), values=torch.zeros(2, 3),
              response_mask=torch.ones(2, 3, dtype=torch.int64))
    kw[name] = bad
    with pytest.raises(exc, match=rf"^{name}\b"):
        fields_from_verl(**kw)


# ----------------------------------------------------------------------------- episode-start errors


@pytest.mark.parametrize(
    "fn, name, args, exc",
    [
        (done_from_episode_starts, "episode_starts", ([[True]], torch.tensor([True])), TypeError),
        (done_from_episode_starts, "episode_starts",
         (torch.zeros(2, 3, dtype=torch.complex64), torch.zeros(2)), TypeError),
        (done_from_episode_starts, "episode_starts", (torch.tensor(True), torch.tensor(True)), ValueError),
        (done_from_episode_starts, "episode_starts",
         (torch.zeros(2, 0, dtype=torch.bool), torch.zeros(2, dtype=torch.bool)), ValueError),
        (done_from_episode_starts, "next_episode_start",
         (torch.zeros(2, 3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)), ValueError),
        (done_from_episode_starts, "next_episode_start",
         (torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 1, dtype=torch.bool)), ValueError),
        (done_from_episode_starts, "next_episode_start",
         (torch.zeros(2, 3, dtype=torch.bool), True), TypeError),
        (done_from_episode_starts, "next_episode_start",
         (torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, dtype=torch.bool, device="meta")), ValueError),
        (episode_starts_from_done, "done", (None, torch.zeros(2, dtype=torch.bool)), TypeError),
        (episode_starts_from_done, "done",
         (torch.zeros(2, 0, dtype=torch.bool), torch.zeros(2, dtype=torch.bool)), ValueError),
        (episode_starts_from_done, "first_episode_start",
         (torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool)), ValueError),
        (episode_starts_from_done, "first_episode_start",
         (torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, dtype=torch.complex64)), TypeError),
    ],
    ids=["starts-list", "starts-complex", "starts-0d", "starts-T0", "next-shape", "next-extra-dim",
         "next-python-bool", "next-device", "done-none", "done-T0", "first-shape", "first-complex"],
)
def test_episode_start_errors_name_argument(fn, name, args, exc):
    with pytest.raises(exc, match=rf"^{name}\b"):
        fn(*args)


# ---------------------------------------------------------------------------------- no syncs


def test_converters_never_read_values():
    """Meta tensors have no data: any host read (.item(), bool(), .any()) would raise."""
    shape = LEAD + (5,)
    meta = dict(device="meta")
    f = torch.empty(shape, dtype=torch.bool, **meta)
    x = torch.empty(shape, **meta)
    done = done_from_episode_starts(torch.empty(shape, **meta), torch.empty(LEAD, **meta))
    assert done.device.type == "meta" and done.shape == shape
    starts, nxt = episode_starts_from_done(f, torch.empty(LEAD, dtype=torch.bool, **meta))
    assert starts.shape == shape and nxt.shape == LEAD
    td = torchrl_from_fields(x, x, f, f, bootstrap_values=x, log_probs=x)
    td.del_(("next", "truncated"))
    out = fields_from_torchrl(td)
    assert out["truncated"].device.type == "meta"
    assert fields_from_verl(x, x, x)["mask"].device.type == "meta"
