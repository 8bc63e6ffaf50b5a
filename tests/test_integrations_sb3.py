"""rollbuf.integrations.sb3 against Stable-Baselines3's own RolloutBuffer.compute_returns_and_advantage.

Both run on copies of one filled buffer: random rewards and values, observation-aligned episode
starts (inside the window, at its first step, and after it through ``dones``). SB3 computes in
float32 with a loop over time; rollbuf in float32 with a scan, so the two agree to float32
rounding. A short PPO run with the buffer class checks that SB3 calls it and learns with it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3", reason="the test extra installs stable-baselines3")

from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer as SB3DictRolloutBuffer
from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

from rollbuf.integrations import sb3

TOL = dict(rtol=1e-5, atol=1e-5)


def filled(T, N, gamma, lam, seed, p_start=0.1, cls=SB3RolloutBuffer, obs_space=None):
    rng = np.random.default_rng(seed)
    obs_space = obs_space or spaces.Box(-1, 1, (3,), dtype=np.float32)
    buf = cls(T, obs_space, spaces.Discrete(2), device="cpu", gamma=gamma, gae_lambda=lam, n_envs=N)
    buf.rewards[:] = rng.normal(size=(T, N))
    buf.values[:] = rng.normal(size=(T, N))
    buf.episode_starts[:] = rng.random((T, N)) < p_start
    buf.episode_starts[0] = 1.0  # the first observation after a reset
    buf.pos, buf.full = T, True
    last_values = torch.as_tensor(rng.normal(size=(N, 1)), dtype=torch.float32)  # as SB3 passes them
    dones = rng.random(N) < 0.5
    return buf, last_values, dones


def both(buf, last_values, dones):
    theirs = copy.deepcopy(buf)
    SB3RolloutBuffer.compute_returns_and_advantage(theirs, last_values.clone(), dones.copy())
    advantages, returns = buf.advantages, buf.returns
    sb3.compute_returns_and_advantage(buf, last_values, dones)
    assert buf.advantages is advantages and buf.returns is returns  # filled in place
    return buf, theirs


@pytest.mark.parametrize("T,N", [(1, 1), (1, 5), (17, 1), (128, 8), (257, 3)])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.98, 0.8), (1.0, 1.0), (0.0, 0.5), (0.9, 0.0)])
def test_equals_sb3(T, N, gamma, lam):
    buf, theirs = both(*filled(T, N, gamma, lam, seed=T * 31 + N + int(gamma * 100) + int(lam * 10)))
    for name in ("advantages", "returns"):
        ours, want = getattr(buf, name), getattr(theirs, name)
        assert ours.shape == want.shape == (T, N) and ours.dtype == want.dtype == np.float32
        np.testing.assert_allclose(ours, want, **TOL)
    # the inputs are untouched
    for name in ("rewards", "values", "episode_starts"):
        np.testing.assert_array_equal(getattr(buf, name), getattr(theirs, name))


def test_every_step_an_episode_start_and_none():
    for p in (0.0, 1.0):
        buf, theirs = both(*filled(33, 4, 0.99, 0.95, seed=int(p), p_start=p))
        np.testing.assert_allclose(buf.advantages, theirs.advantages, **TOL)
        np.testing.assert_allclose(buf.returns, theirs.returns, **TOL)


def test_subclasses_use_it():
    for cls, base, space in [(sb3.RolloutBuffer, SB3RolloutBuffer, None),
                             (sb3.DictRolloutBuffer, SB3DictRolloutBuffer,
                              spaces.Dict({"a": spaces.Box(-1, 1, (2,), dtype=np.float32)}))]:
        assert issubclass(cls, base)
        buf, last_values, dones = filled(40, 3, 0.99, 0.9, seed=7, cls=cls, obs_space=space)
        theirs = copy.deepcopy(buf)
        base.compute_returns_and_advantage(theirs, last_values.clone(), dones.copy())
        buf.compute_returns_and_advantage(last_values, dones)
        assert type(buf).compute_returns_and_advantage is not base.compute_returns_and_advantage
        np.testing.assert_allclose(buf.advantages, theirs.advantages, **TOL)
        np.testing.assert_allclose(buf.returns, theirs.returns, **TOL)


def test_ppo_trains_with_the_buffer():
    """SB3's PPO collects into rollbuf's buffer and calls its method (compared with SB3's on every
    rollout); the policy improves on CartPole within a few thousand steps."""
    from stable_baselines3 import PPO

    calls = []

    class Checked(sb3.RolloutBuffer):
        def compute_returns_and_advantage(self, last_values, dones):
            theirs = copy.deepcopy(self)
            SB3RolloutBuffer.compute_returns_and_advantage(theirs, last_values.clone(), dones.copy())
            super().compute_returns_and_advantage(last_values, dones)
            np.testing.assert_allclose(self.advantages, theirs.advantages, **TOL)
            np.testing.assert_allclose(self.returns, theirs.returns, **TOL)
            calls.append(int(self.episode_starts[1:].sum()))

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=128, batch_size=64, n_epochs=4, seed=0, device="cpu",
                rollout_buffer_class=Checked)
    model.learn(128 * 4)
    assert len(calls) == 4 and sum(calls) > 0  # episode ends inside the windows were compared


def test_errors_name_the_argument():
    buf, last_values, dones = filled(8, 2, 0.99, 0.95, seed=9)
    with pytest.raises(ValueError, match="last_values"):
        sb3.compute_returns_and_advantage(buf, torch.zeros(3), dones)
    with pytest.raises(ValueError, match="dones"):
        sb3.compute_returns_and_advantage(buf, last_values, np.zeros(3, dtype=bool))
    with pytest.raises(TypeError, match="dones"):
        sb3.compute_returns_and_advantage(buf, last_values, [True, False])
    with pytest.raises(TypeError, match="RolloutBuffer"):
        sb3.compute_returns_and_advantage(object(), last_values, dones)
    bad = copy.deepcopy(buf)
    bad.gamma = 1.5
    with pytest.raises(ValueError, match="gamma"):
        sb3.compute_returns_and_advantage(bad, last_values, dones)
    list(buf.get(4))  # flattens the arrays for sampling
    with pytest.raises(ValueError, match="flattened"):
        sb3.compute_returns_and_advantage(buf, last_values, dones)


@pytest.mark.parametrize("T,N", [(1, 1), (2, 3), (9, 16), (33, 40)])
def test_equals_the_converter_and_gae_bitwise(T, N):
    """The drop-in builds ``done`` itself (time-major, read in place by the loop); its numbers are
    those of ``F.gae`` on ``done_from_episode_starts`` of the ``[N, T]`` views, bit for bit, with
    flags that are not 0/1 (nonzero = True) in the rows order (N < 16) and the lanes order."""
    from rollbuf import functional as F
    from rollbuf.boundary.conventions import done_from_episode_starts

    buf, last_values, dones = filled(T, N, 0.99, 0.95, seed=T + N)
    rng = np.random.default_rng(T * N)
    buf.episode_starts[:] *= rng.choice([0.0, 2.5, -1.0], size=(T, N))
    dones = dones * rng.choice([1, 3, -2], size=N)  # integer flags
    starts = torch.from_numpy(buf.episode_starts.copy()).mT
    done = done_from_episode_starts(starts, torch.from_numpy(dones != 0))
    v = torch.from_numpy(buf.values.copy()).mT
    want = F.gae(0.99, 0.95, rewards=torch.from_numpy(buf.rewards.copy()).mT, values=v, terminated=done,
                 bootstrap_values=last_values.reshape(-1), backend="numba").advantages
    sb3.compute_returns_and_advantage(buf, last_values, dones)
    assert buf.advantages.tobytes() == want.mT.contiguous().numpy().tobytes()
    assert buf.returns.tobytes() == (want.mT.numpy() + buf.values).tobytes()


def test_empty_buffer_names_episode_starts():
    buf, last_values, dones = filled(1, 2, 0.99, 0.95, seed=0)
    for name in ("rewards", "values", "episode_starts", "advantages", "returns"):
        setattr(buf, name, np.zeros((0, 2), np.float32))
    with pytest.raises(ValueError, match="episode_starts must have at least one time step"):
        sb3.compute_returns_and_advantage(buf, last_values, dones)
