"""rollbuf.integrations.gym.StepConverter: vector-env step outputs → Rollout.record arguments.

A scripted fake vector env reproduces Gymnasium 1.x's two autoreset modes exactly (the semantics of
``gymnasium.vector.SyncVectorEnv.step``), so the unit tests need no Gymnasium; with Gymnasium
importable, the same checks run on CartPole-v1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rollbuf import Rollout
from rollbuf.integrations.gym import NEXT_STEP, SAME_STEP, StepConverter, autoreset_mode

GAMMA, LAM = 0.9, 0.8
MODES = [NEXT_STEP, SAME_STEP]


# ------------------------------------------------------------------------------ the fake env


def reward_of(i, e, k):
    """Reward for env i's action at step k of its episode e."""
    return 1.0 + 0.1 * k + 0.01 * e + i


def obs_of(i, e, k):
    """Observation of env i at step k of episode e (k = the episode's length: its final obs)."""
    return np.array([i, e, k], dtype=np.float32)


def value_np(o):
    o = np.asarray(o, dtype=np.float64)
    return 0.5 * o[..., 0] + 0.3 * o[..., 1] + 0.07 * o[..., 2] + 0.2


def value_fn(batch):
    return torch.as_tensor(value_np(batch))


class FakeVectorEnv:
    """``scripts[i]`` = env i's episodes, ``[(length, "term" | "trunc"), ...]`` (cycled)."""

    def __init__(self, scripts, mode):
        self.scripts = scripts
        self.num_envs = len(scripts)
        self.mode = mode
        self.metadata = {"autoreset_mode": mode}

    def _episode(self, i):
        s = self.scripts[i]
        return s[self.e[i] % len(s)]

    def reset(self, seed=None):
        n = self.num_envs
        self.e, self.k = [0] * n, [0] * n
        self.autoreset = np.zeros(n, dtype=bool)
        return np.stack([obs_of(i, 0, 0) for i in range(n)]), {}

    def step(self, actions):
        n = self.num_envs
        obs = np.zeros((n, 3), dtype=np.float32)
        rew = np.zeros(n)
        te, tr = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        info = {}
        for i in range(n):
            if self.mode == NEXT_STEP and self.autoreset[i]:  # the reset step: action ignored
                self.e[i] += 1
                self.k[i] = 0
                obs[i] = obs_of(i, self.e[i], 0)
                continue
            rew[i] = reward_of(i, self.e[i], self.k[i])
            self.k[i] += 1
            length, kind = self._episode(i)
            if self.k[i] == length:
                te[i], tr[i] = kind == "term", kind == "trunc"
            obs[i] = obs_of(i, self.e[i], self.k[i])
            if self.mode == SAME_STEP and (te[i] or tr[i]):
                if "final_obs" not in info:
                    info["final_obs"] = np.full(n, None, dtype=object)
                    info["_final_obs"] = np.zeros(n, dtype=bool)
                info["final_obs"][i] = obs[i].copy()
                info["_final_obs"][i] = True
                self.e[i] += 1
                self.k[i] = 0
                obs[i] = obs_of(i, self.e[i], 0)
        self.autoreset = te | tr
        return obs, rew, te, tr, info


SCRIPTS = [
    [(3, "term"), (2, "trunc"), (4, "term")],
    [(2, "trunc"), (5, "trunc")],
    [(1, "term"), (6, "trunc"), (1, "trunc")],
    [(50, "term")],  # no boundary in the window
]


# ------------------------------------------------------------------------- hand-built reference


def agent_steps(i, script, count):
    """Env i's first ``count`` agent steps, from the script alone: (r, v, term, trunc, v_final, v_after)."""
    out, e = [], 0
    while len(out) < count:
        length, kind = script[e % len(script)]
        for k in range(length):
            end = k == length - 1
            v_next = value_np(obs_of(i, e, k + 1))
            out.append(dict(r=reward_of(i, e, k), v=float(value_np(obs_of(i, e, k))),
                            term=end and kind == "term", trunc=end and kind == "trunc",
                            v_next=float(v_next)))
        e += 1
    return out[:count]


def hand_gae(steps):
    """GAE of a window of agent steps, written out: the window ends by bootstrapping V(next obs)."""
    adv, a = [0.0] * len(steps), 0.0
    for t in reversed(range(len(steps))):
        s = steps[t]
        if s["term"]:
            nv, cont = 0.0, 0.0
        elif s["trunc"] or t == len(steps) - 1:
            nv, cont = s["v_next"], 0.0  # V(final obs) / V(s_T)
        else:
            nv, cont = steps[t + 1]["v"], 1.0
        a = s["r"] + GAMMA * nv - s["v"] + GAMMA * LAM * cont * a
        adv[t] = a
    return adv


def collect(env, conv, ro, next_obs, T):
    for t in range(T):
        v = value_fn(next_obs)
        next_obs, r, te, tr, info = env.step(np.zeros(env.num_envs, dtype=np.int64))
        ro.record(t, values=v, log_probs=torch.zeros(env.num_envs, dtype=ro.values.dtype),
                  **conv(next_obs, r, te, tr, info))
    ro.bootstrap(value_fn(next_obs))
    return next_obs


# ------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("mode", MODES)
def test_terminated_vs_truncated(mode):
    env = FakeVectorEnv([[(2, "term")], [(2, "trunc")], [(5, "term")]], mode)
    calls = []

    def vf(batch):
        calls.append(np.array(batch))
        return value_fn(batch)

    conv = StepConverter.from_env(env, vf)
    obs, _ = env.reset()
    env.step(np.zeros(3))  # step 0: no boundary
    obs, r, te, tr, info = env.step(np.zeros(3))  # step 1: env 0 terminates, env 1 is truncated
    out = conv(obs, r, te, tr, info)
    assert out["terminated"].tolist() == [True, False, False]
    assert out["truncated"].tolist() == [False, True, False]
    assert out["rewards"].tolist() == pytest.approx([reward_of(0, 0, 1), reward_of(1, 0, 1), reward_of(2, 0, 1)])
    bv = out["bootstrap_values"]
    assert math.isnan(bv[0]) and math.isnan(bv[2])  # never read: terminated / no boundary
    assert bv[1].item() == pytest.approx(value_np(obs_of(1, 0, 2)))  # V(final obs of env 1)
    # value_fn saw the truncated env's final observation only, whatever the mode put in `obs`
    assert len(calls) == 1 and np.array_equal(calls[0], obs_of(1, 0, 2)[None])
    if mode == SAME_STEP:
        assert np.array_equal(obs[1], obs_of(1, 1, 0))  # `obs` is already the reset observation
        assert bv[1].item() != pytest.approx(value_np(obs[1]))
        assert "mask" not in out
    else:
        assert np.array_equal(obs[1], obs_of(1, 0, 2))  # `obs` is the final observation
        assert out["mask"].all()


def test_no_truncation_no_value_call():
    env = FakeVectorEnv([[(1, "term")], [(3, "term")]], SAME_STEP)
    conv = StepConverter.from_env(env, lambda b: pytest.fail("value_fn called without a truncation"))
    env.reset()
    out = conv(*env.step(np.zeros(2)))
    assert out["terminated"].tolist() == [True, False] and torch.isnan(out["bootstrap_values"]).all()


def test_terminated_and_truncated_together_is_terminal():
    conv = StepConverter(lambda b: pytest.fail("no bootstrap after a termination"), 1, SAME_STEP)
    info = {"final_obs": np.array([obs_of(0, 0, 1)], dtype=object), "_final_obs": np.array([True])}
    out = conv(np.zeros((1, 3)), np.ones(1), np.array([True]), np.array([True]), info)
    assert out["terminated"].item() and out["truncated"].item() and math.isnan(out["bootstrap_values"].item())


def test_next_step_masks_the_reset_step():
    env = FakeVectorEnv([[(2, "term")], [(3, "trunc")]], NEXT_STEP)
    conv = StepConverter.from_env(env, value_fn)
    assert conv.needs_mask
    env.reset()
    masks, rewards = [], []
    for _ in range(7):
        out = conv(*env.step(np.zeros(2)))
        masks.append(out["mask"].tolist())
        rewards.append(out["rewards"].tolist())
    # env 0: episodes of 2 steps, each followed by a reset step; env 1: 3 steps, then a reset step
    assert [m[0] for m in masks] == [True, True, False, True, True, False, True]
    assert [m[1] for m in masks] == [True, True, True, False, True, True, True]
    assert all(r[0] == 0.0 for r, m in zip(rewards, masks) if not m[0])


def test_reset_forgets_pending_autoresets():
    env = FakeVectorEnv([[(1, "term")]], NEXT_STEP)
    conv = StepConverter.from_env(env, value_fn)
    env.reset()
    conv(*env.step(np.zeros(1)))  # the episode ends: the next step would be a reset step
    env.reset()
    conv.reset()
    assert conv(*env.step(np.zeros(1)))["mask"].item()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("T", [1, 4, 7])
def test_gae_equals_hand_built_reference(mode, T):
    """Two consecutive windows; every agent step's advantage equals the written-out GAE over that
    env's agent steps of the window, in both autoreset modes (reset steps masked, advantage 0)."""
    env = FakeVectorEnv(SCRIPTS, mode)
    conv = StepConverter.from_env(env, value_fn, dtype=torch.float64)
    obs, _ = env.reset()
    done_steps = [0] * env.num_envs
    for _ in range(2):
        ro = Rollout.empty(env.num_envs, T, dtype=torch.float64, with_mask=conv.needs_mask)
        obs = collect(env, conv, ro, obs, T)
        adv = ro.gae(GAMMA, LAM).advantages
        agent = ro.mask if ro.mask is not None else torch.ones(env.num_envs, T, dtype=torch.bool)
        for i, script in enumerate(SCRIPTS):
            K = int(agent[i].sum())
            steps = agent_steps(i, script, done_steps[i] + K)[done_steps[i]:]
            done_steps[i] += K
            torch.testing.assert_close(adv[i][agent[i]], torch.tensor(hand_gae(steps), dtype=torch.float64))
            assert (adv[i][~agent[i]] == 0).all()
    if mode == SAME_STEP:
        assert done_steps == [2 * T] * env.num_envs


def test_modes_give_the_same_agent_steps():
    T = 9
    fields = {}
    for mode in MODES:
        env = FakeVectorEnv(SCRIPTS, mode)
        conv = StepConverter.from_env(env, value_fn, dtype=torch.float64)
        obs, _ = env.reset()
        ro = Rollout.empty(env.num_envs, T, dtype=torch.float64, with_mask=conv.needs_mask)
        collect(env, conv, ro, obs, T)
        fields[mode] = ro
    nxt, same = fields[NEXT_STEP], fields[SAME_STEP]
    for i in range(len(SCRIPTS)):
        m = nxt.mask[i]
        K = int(m.sum())
        for name in ("rewards", "values", "terminated", "truncated"):
            assert torch.equal(getattr(nxt, name)[i][m], getattr(same, name)[i, :K]), name
        tr = same.truncated[i, :K]
        assert torch.equal(nxt.bootstrap_values[i][m][tr], same.bootstrap_values[i, :K][tr])


def test_mode_mismatch_is_an_error():
    info = {"final_obs": np.array([obs_of(0, 0, 1)], dtype=object), "_final_obs": np.array([True])}
    args = (np.zeros((1, 3)), np.ones(1), np.array([False]), np.array([True]))
    with pytest.raises(ValueError, match="SAME_STEP"):
        StepConverter(value_fn, 1, NEXT_STEP)(*args, info)
    with pytest.raises(ValueError, match="final_obs"):
        StepConverter(value_fn, 1, SAME_STEP)(*args, {})


def test_autoreset_mode_parsing():
    class Mode:  # stands for gymnasium.vector.AutoresetMode
        def __init__(self, value):
            self.value = value

    class Envs:
        def __init__(self, metadata):
            self.metadata, self.num_envs = metadata, 2

    assert autoreset_mode(Envs({})) == NEXT_STEP  # Gymnasium 1.x's default
    assert autoreset_mode(Envs({"autoreset_mode": Mode("SameStep")})) == SAME_STEP
    for spelling in ("SameStep", "same_step", "SAME_STEP", "samestep"):
        assert StepConverter(value_fn, 1, spelling).mode == SAME_STEP
    assert StepConverter(value_fn, 1, "next_step").mode == NEXT_STEP
    with pytest.raises(ValueError, match="DISABLED"):
        autoreset_mode(Envs({"autoreset_mode": Mode("Disabled")}))
    with pytest.raises(ValueError, match="autoreset_mode"):
        StepConverter(value_fn, 1, "whenever")


def test_bad_inputs():
    conv = StepConverter(value_fn, 2, NEXT_STEP)
    with pytest.raises(ValueError, match="terminated"):
        conv(np.zeros((2, 3)), np.zeros(2), np.zeros(3, dtype=bool), np.zeros(2, dtype=bool), {})
    with pytest.raises(ValueError, match="reward"):
        conv(np.zeros((2, 3)), np.zeros(3), np.zeros(2, dtype=bool), np.zeros(2, dtype=bool), {})
    bad = StepConverter(lambda b: torch.zeros(5), 2, NEXT_STEP)
    with pytest.raises(ValueError, match="value_fn returned 5 values"):
        bad(np.zeros((2, 3)), np.zeros(2), np.zeros(2, dtype=bool), np.array([True, False]), {})
    with pytest.raises(TypeError):
        StepConverter(None, 2)
    with pytest.raises(ValueError):
        StepConverter(value_fn, 0)


@pytest.mark.parametrize("mode", MODES)
def test_dict_observations_and_column_values(mode):
    """Dict observation spaces: value_fn gets a dict batch of the truncated envs; a [k, 1] result is fine."""
    seen = []

    def vf(batch):
        seen.append(batch)
        return torch.as_tensor(batch["x"].sum(-1, keepdims=True))  # [k, 1]

    conv = StepConverter(vf, 3, mode)
    obs = {"x": np.arange(6.0).reshape(3, 2), "y": np.zeros((3, 1))}
    te, tr = np.array([False, False, True]), np.array([True, False, True])
    info = {}
    if mode == SAME_STEP:
        final = np.full(3, None, dtype=object)
        final[0] = {"x": np.array([10.0, 20.0]), "y": np.zeros(1)}
        final[2] = {"x": np.array([1.0, 1.0]), "y": np.zeros(1)}
        info = {"final_obs": final, "_final_obs": np.array([True, False, True])}
    out = conv(obs, np.ones(3), te, tr, info)
    expect = 30.0 if mode == SAME_STEP else 1.0  # env 0's final obs
    assert out["bootstrap_values"][0].item() == expect
    assert torch.isnan(out["bootstrap_values"][1:]).all()  # env 2 is terminated (and truncated)
    assert set(seen[0]) == {"x", "y"} and seen[0]["x"].shape == (1, 2)


def test_torch_observations():
    conv = StepConverter(lambda b: b[:, 0] * 2, 2, NEXT_STEP)
    out = conv(torch.tensor([[1.0], [3.0]]), torch.ones(2), torch.tensor([False, False]),
               torch.tensor([False, True]), {})
    assert out["bootstrap_values"][1].item() == 6.0 and out["truncated"].dtype == torch.bool


# ------------------------------------------------------------------------- with Gymnasium itself


def _cartpole(mode, n=4, limit=12):
    gym = pytest.importorskip("gymnasium", reason="gymnasium is not installed (pip install -e '.[examples]')")
    m = {NEXT_STEP: gym.vector.AutoresetMode.NEXT_STEP, SAME_STEP: gym.vector.AutoresetMode.SAME_STEP}[mode]
    return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": m}, max_episode_steps=limit)


def _policy(obs):
    # envs 0, 2 balance (and hit the 12-step time limit: truncated); envs 1, 3 always push left
    # (and fall over: terminated)
    act = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    act[1::2] = 0
    return act


W = torch.tensor([0.3, -0.2, 1.5, 0.7], dtype=torch.float64)


def _cart_value(obs):
    return torch.as_tensor(np.asarray(obs), dtype=torch.float64) @ W + 1.0


def test_cartpole_both_modes():
    T = 40
    runs = {}
    for mode in MODES:
        envs = _cartpole(mode)
        conv = StepConverter.from_env(envs, _cart_value, dtype=torch.float64)
        assert conv.mode == mode
        obs, _ = envs.reset(seed=3)
        ro = Rollout.empty(4, T, dtype=torch.float64, with_mask=conv.needs_mask)
        v_after = torch.zeros(4, T, dtype=torch.float64)  # V(returned obs), for re-cutting windows
        for t in range(T):
            v = _cart_value(obs)
            obs, r, te, tr, info = envs.step(_policy(obs))
            ro.record(t, values=v, **conv(obs, r, te, tr, info))
            v_after[:, t] = _cart_value(obs)
        ro.bootstrap(_cart_value(obs))
        envs.close()
        runs[mode] = (ro, v_after)

    nxt, _ = runs[NEXT_STEP]
    same, same_after = runs[SAME_STEP]
    assert nxt.truncated.any() and nxt.terminated.any() and (~nxt.mask).any()
    adv_next = nxt.gae(GAMMA, LAM).advantages
    for i in range(4):
        m = nxt.mask[i]
        K = int(m.sum())
        # the same agent steps in both modes, and the same V(final obs) at truncations
        for name in ("rewards", "values", "terminated", "truncated"):
            torch.testing.assert_close(getattr(nxt, name)[i][m], getattr(same, name)[i, :K])
        tr = same.truncated[i, :K]
        torch.testing.assert_close(nxt.bootstrap_values[i][m][tr], same.bootstrap_values[i, :K][tr])
        # SAME_STEP's first K steps, closed with V(obs after step K), give NEXT_STEP's advantages
        sub = same[i, :K].clone()
        sub.bootstrap(same_after[i, K - 1])
        torch.testing.assert_close(adv_next[i][m], sub.gae(GAMMA, LAM).advantages)
        # and both equal the written-out loop on the agent steps
        steps = [dict(r=sub.rewards[t].item(), v=sub.values[t].item(), term=bool(sub.terminated[t]),
                      trunc=bool(sub.truncated[t]),
                      v_next=(sub.bootstrap_values[t].item() if t == K - 1 or sub.truncated[t] else None))
                 for t in range(K)]
        torch.testing.assert_close(adv_next[i][m], torch.tensor(hand_gae(steps), dtype=torch.float64))
