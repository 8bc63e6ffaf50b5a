"""rollbuf.integrations.torchrl: the drop-ins against TorchRL's own estimators.

Every comparison runs TorchRL's class and rollbuf's subclass on copies of one tensordict. float64
data are compared with TorchRL's loop implementation (``vectorized=False``) to float64 rounding, and
with its default (vectorised) one to float32 rounding: TorchRL's vectorised GAE and TD(λ) build
their decay tables in float32 and drop terms below 1e-7, so they differ from its own loop by that
much. Collector-shaped data: real TorchRL collectors on CartPole (terminations, a step-count
truncation, window ends), and synthetic ``[*B, T]`` tensordicts with random flags and next values
that are *not* the next step's values (TorchRL reads them at every step; rollbuf must too).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

torchrl = pytest.importorskip("torchrl", reason="the test extra installs torchrl")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.objectives.value import GAE as TorchRLGAE  # noqa: E402
from torchrl.objectives.value import TDLambdaEstimator as TorchRLTDLambda  # noqa: E402
from torchrl.objectives.value import ValueEstimatorBase  # noqa: E402
from torchrl.objectives.value import VTrace as TorchRLVTrace  # noqa: E402

from rollbuf.integrations import torchrl as rt  # noqa: E402

TIGHT = dict(rtol=1e-10, atol=1e-10)  # float64 against TorchRL's loop
F32 = dict(rtol=1e-5, atol=1e-5)  # against TorchRL's vectorised path / float32 data


def synthetic(B, T, seed, dtype=torch.float64, consistent=False, p_done=0.15):
    """A ``[*B, T]`` tensordict as a collector + value network leave it; with ``consistent=False``
    the next values are unrelated to the next step's values (TorchRL reads them everywhere)."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(*B, T, 1, generator=g) < p_done
    term = done & (torch.rand(*B, T, 1, generator=g) < 0.5)
    v = torch.randn(*B, T, 1, generator=g, dtype=dtype)
    nv = torch.randn(*B, T, 1, generator=g, dtype=dtype)
    if consistent:
        nxt = torch.cat([v[..., 1:, :], nv[..., -1:, :]], -2)
        nv = torch.where(done, nv, nxt)
    r = torch.randn(*B, T, 1, generator=g, dtype=dtype)
    return TensorDict({
        "state_value": v,
        "sample_log_prob": -torch.rand(*B, T, generator=g, dtype=dtype),
        "next": {"reward": r, "done": done, "terminated": term, "truncated": done & ~term, "state_value": nv},
    }, batch_size=[*B, T])


def run_both(ours, theirs, td, **call):
    a, b = ours(td.clone(), **call), theirs(td.clone(), **call)
    return a, b


def assert_same(a, b, tol, keys=("advantage", "value_target")):
    for key in keys:
        assert a[key].shape == b[key].shape, key
        assert a[key].dtype == b[key].dtype, key
        torch.testing.assert_close(a[key], b[key], **tol, msg=lambda m: f"{key}: {m}")


PARAMS = [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.0, 0.5), (0.97, 0.9)]


# ------------------------------------------------------------------------------ the classes


def test_subclasses_and_signatures():
    """Same constructor (TorchRL's, inherited) and TorchRL's base classes: a loss takes them."""
    assert issubclass(rt.GAE, TorchRLGAE) and issubclass(rt.GAE, ValueEstimatorBase)
    assert issubclass(rt.TDLambdaEstimator, TorchRLTDLambda)
    assert issubclass(rt.VTrace, TorchRLVTrace)
    for ours, theirs in [(rt.GAE, TorchRLGAE), (rt.TDLambdaEstimator, TorchRLTDLambda), (rt.VTrace, TorchRLVTrace)]:
        assert ours.__init__ is theirs.__init__
    est = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None)
    assert est.out_keys == ["advantage", "value_target"]


# ---------------------------------------------------------------------- GAE and TD(λ), tensors


@pytest.mark.parametrize("B", [(1,), (4,), (2, 3)])
@pytest.mark.parametrize("gamma,lmbda", PARAMS)
@pytest.mark.parametrize("consistent", [True, False])
def test_gae_equals_torchrl(B, gamma, lmbda, consistent):
    td = synthetic(B, 37, seed=sum(B) * 7 + int(gamma * 100) + int(lmbda * 10), consistent=consistent)
    ours = rt.GAE(gamma=gamma, lmbda=lmbda, value_network=None)
    a, b = run_both(ours, TorchRLGAE(gamma=gamma, lmbda=lmbda, value_network=None, vectorized=False), td)
    assert_same(a, b, TIGHT)
    a, b = run_both(ours, TorchRLGAE(gamma=gamma, lmbda=lmbda, value_network=None), td)
    assert_same(a, b, F32)


@pytest.mark.parametrize("B", [(1,), (4,), (2, 3)])
@pytest.mark.parametrize("gamma,lmbda", PARAMS)
@pytest.mark.parametrize("consistent", [True, False])
def test_td_lambda_equals_torchrl(B, gamma, lmbda, consistent):
    td = synthetic(B, 29, seed=sum(B) * 11 + int(gamma * 100) + int(lmbda * 10), consistent=consistent)
    ours = rt.TDLambdaEstimator(gamma=gamma, lmbda=lmbda, value_network=None)
    a, b = run_both(ours, TorchRLTDLambda(gamma=gamma, lmbda=lmbda, value_network=None, vectorized=False), td)
    assert_same(a, b, TIGHT)
    if gamma * lmbda == 0.0:  # TorchRL 0.14.1's vectorised TD(λ) raises IndexError at γλ = 0; its loop is above
        with pytest.raises(IndexError):
            TorchRLTDLambda(gamma=gamma, lmbda=lmbda, value_network=None)(td.clone())
        return
    a, b = run_both(ours, TorchRLTDLambda(gamma=gamma, lmbda=lmbda, value_network=None), td)
    assert_same(a, b, F32)


def test_float32_data():
    td = synthetic((5,), 64, seed=3, dtype=torch.float32, consistent=True)
    for cls, tcls in [(rt.GAE, TorchRLGAE), (rt.TDLambdaEstimator, TorchRLTDLambda)]:
        a, b = run_both(cls(gamma=0.99, lmbda=0.95, value_network=None),
                        tcls(gamma=0.99, lmbda=0.95, value_network=None), td)
        assert_same(a, b, F32)


def test_edge_rows():
    """Every step done / terminated, none done, T = 1, a done on the last step."""
    g = torch.Generator().manual_seed(5)
    for T, done_all, term_all in [(1, False, False), (1, True, True), (1, True, False), (9, True, False),
                                  (9, True, True), (9, False, False)]:
        td = synthetic((3,), T, seed=T)
        td["next", "done"] = torch.full((3, T, 1), done_all)
        td["next", "terminated"] = torch.full((3, T, 1), term_all) & td["next", "done"]
        td["next", "reward"] = torch.randn(3, T, 1, generator=g, dtype=torch.float64)
        for cls, tcls in [(rt.GAE, TorchRLGAE), (rt.TDLambdaEstimator, TorchRLTDLambda)]:
            a, b = run_both(cls(gamma=0.9, lmbda=0.8, value_network=None),
                            tcls(gamma=0.9, lmbda=0.8, value_network=None, vectorized=False), td)
            assert_same(a, b, TIGHT)


def test_missing_terminated_means_done_is_terminal():
    td = synthetic((3,), 21, seed=8).exclude(("next", "terminated"), ("next", "truncated"))
    for cls, tcls in [(rt.GAE, TorchRLGAE), (rt.TDLambdaEstimator, TorchRLTDLambda)]:
        a, b = run_both(cls(gamma=0.95, lmbda=0.9, value_network=None),
                        tcls(gamma=0.95, lmbda=0.9, value_network=None, vectorized=False), td)
        assert_same(a, b, TIGHT)


def test_time_dim_and_named_time():
    """Time first (``[T, B]``, ``time_dim=0`` in the constructor or the call, or a dim named
    ``"time"``), and a feature dim wider than 1."""
    td = synthetic((4,), 23, seed=9).transpose(0, 1).contiguous()  # [T, B]
    for kw, call in [({"time_dim": 0}, {}), ({}, {"time_dim": 0})]:
        ours = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None, **kw)
        theirs = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None, vectorized=False, **kw)
        a, b = run_both(ours, theirs, td, **call)
        assert_same(a, b, TIGHT)
    named = td.clone()
    named.names = ["time", None]
    a, b = run_both(rt.GAE(gamma=0.99, lmbda=0.95, value_network=None),
                    TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None, vectorized=False), named)
    assert_same(a, b, TIGHT)
    a, b = run_both(rt.TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None, time_dim=0),
                    TorchRLTDLambda(gamma=0.99, lmbda=0.95, value_network=None, vectorized=False, time_dim=0), td)
    assert_same(a, b, TIGHT)
    # two value heads: every entry [B, T, 2]
    wide = synthetic((3,), 17, seed=10)
    for key in ("state_value", ("next", "state_value"), ("next", "reward")):
        wide[key] = torch.cat([wide[key], 2 * wide[key]], -1)
    for key in (("next", "done"), ("next", "terminated")):
        wide[key] = wide[key].expand(3, 17, 2).clone()
    a, b = run_both(rt.GAE(gamma=0.99, lmbda=0.95, value_network=None),
                    TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None, vectorized=False), wide)
    assert_same(a, b, TIGHT)


def test_average_gae_set_keys_auto_reset():
    td = synthetic((2, 3), 31, seed=11)
    ours = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None, average_gae=True)
    a, b = run_both(ours, TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None, average_gae=True,
                                     vectorized=False), td)
    assert_same(a, b, TIGHT)
    assert abs(float(a["advantage"].mean())) < 1e-12

    renamed = td.rename_key_(("next", "reward"), ("next", "r")).rename_key_("state_value", "v")
    renamed.rename_key_(("next", "state_value"), ("next", "v"))
    keys = dict(reward="r", value="v", advantage="adv", value_target="vt")
    ours = rt.GAE(gamma=0.9, lmbda=0.7, value_network=None)
    theirs = TorchRLGAE(gamma=0.9, lmbda=0.7, value_network=None, vectorized=False)
    ours.set_keys(**keys)
    theirs.set_keys(**keys)
    a, b = run_both(ours, theirs, renamed)
    assert_same(a, b, TIGHT, keys=("adv", "vt"))
    assert "advantage" not in a.keys()

    td = synthetic((4,), 25, seed=12, p_done=0.3)
    a, b = run_both(rt.GAE(gamma=0.99, lmbda=0.95, value_network=None, auto_reset_env=True),
                    TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None, auto_reset_env=True,
                               vectorized=False), td)
    assert_same(a, b, TIGHT)


def test_value_estimate_methods():
    td = synthetic((3,), 19, seed=13)
    ours = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None)
    theirs = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None)
    torch.testing.assert_close(ours.value_estimate(td.clone()), theirs.value_estimate(td.clone()), **F32)
    ours = rt.TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None)
    theirs = TorchRLTDLambda(gamma=0.99, lmbda=0.95, value_network=None, vectorized=False)
    nv = td["next", "state_value"]
    torch.testing.assert_close(ours.value_estimate(td.clone(), next_value=nv),
                               theirs.value_estimate(td.clone(), next_value=nv), **TIGHT)
    ours = rt.TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None, average_rewards=True)
    theirs = TorchRLTDLambda(gamma=0.99, lmbda=0.95, value_network=None, vectorized=False, average_rewards=True)
    a, b = run_both(ours, theirs, td)
    assert_same(a, b, TIGHT)


# ------------------------------------------------------------------------ with a value network


def cartpole_batch(num_envs=3, frames=60, max_steps=20, seed=0):
    """A real collector's batch ``[num_envs, T]``: CartPole terminations, a StepCounter
    truncation after ``max_steps``, random actions."""
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, SerialEnv, StepCounter, TransformedEnv

    torch.manual_seed(seed)
    env = SerialEnv(num_envs, lambda: TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=max_steps)))
    env.set_seed(seed)
    collector = Collector(env, policy=None, frames_per_batch=num_envs * frames, total_frames=num_envs * frames)
    td = next(iter(collector))
    collector.shutdown()
    assert td["next", "truncated"].any() and td["next", "terminated"].any()
    return td


@pytest.fixture(scope="module")
def collected():
    pytest.importorskip("gymnasium")
    return cartpole_batch()


def value_net(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    layers = [nn.Linear(4, 16), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else []) + [nn.Linear(16, 1)]
    return TensorDictModule(nn.Sequential(*layers), in_keys=["observation"], out_keys=["state_value"])


@pytest.mark.parametrize("cls,tcls", [(rt.GAE, TorchRLGAE), (rt.TDLambdaEstimator, TorchRLTDLambda)])
@pytest.mark.parametrize("shifted", [False, True])
def test_collector_with_value_network(collected, cls, tcls, shifted):
    net = value_net()
    ours = cls(gamma=0.99, lmbda=0.95, value_network=net, shifted=shifted)
    theirs = tcls(gamma=0.99, lmbda=0.95, value_network=net, shifted=shifted)
    a, b = run_both(ours, theirs, collected)
    assert_same(a, b, F32)
    assert_same(a, b, F32, keys=("state_value", ("next", "state_value")))


def test_collector_without_value_network(collected):
    """``value_network=None``: the values already in the tensordict (written by the net)."""
    net = value_net(1)
    td = collected.clone()
    with torch.no_grad():
        net(td)
        net(td["next"])
    a, b = run_both(rt.GAE(gamma=0.98, lmbda=0.9, value_network=None),
                    TorchRLGAE(gamma=0.98, lmbda=0.9, value_network=None), td)
    assert_same(a, b, F32)


def test_differentiable_gradients_match():
    """``differentiable=True``: gradients reach the values as in TorchRL (the value network itself
    is held out of the graph by TorchRL's code, which both classes run)."""
    td = synthetic((3,), 27, seed=17)
    grads = []
    for cls in (rt.GAE, TorchRLGAE):
        v = td["state_value"].clone().requires_grad_()
        nv = td["next", "state_value"].clone().requires_grad_()
        data = td.clone()
        data["state_value"], data["next", "state_value"] = v, nv
        out = cls(gamma=0.99, lmbda=0.95, value_network=None, differentiable=True)(data)
        ((out["advantage"] ** 2).sum() + out["value_target"].sum()).backward()
        grads.append((v.grad, nv.grad))
    for ga, gb in zip(*grads):
        torch.testing.assert_close(ga, gb, **TIGHT)
    out = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None)(td.clone().apply(lambda x: x.requires_grad_()
                                                                              if x.is_floating_point() else x))
    assert not out["advantage"].requires_grad  # differentiable=False (the default): no graph


def make_actor(seed):
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    torch.manual_seed(seed)
    return ProbabilisticActor(
        TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True,
    )


def test_clip_ppo_loss_takes_it(collected):
    """TorchRL's PPO loss with rollbuf's GAE as its value estimator gives TorchRL's loss values."""
    from torchrl.objectives import ClipPPOLoss

    actor = make_actor(0)
    td = collected.clone()
    with torch.no_grad():
        actor(td)  # the behaviour log-probabilities under the current policy
    losses = []
    for cls in (rt.GAE, TorchRLGAE):
        net = value_net(3)
        loss = ClipPPOLoss(actor, net)
        loss.make_value_estimator(cls(gamma=0.99, lmbda=0.95, value_network=net))
        assert isinstance(loss.value_estimator, cls)
        out = loss(td.clone())
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        total.backward()
        losses.append({k: out[k].detach() for k in ("loss_objective", "loss_critic", "loss_entropy")})
    for k in losses[0]:
        torch.testing.assert_close(losses[0][k], losses[1][k], **F32)
    # the class form of make_value_estimator works too
    loss = ClipPPOLoss(actor, value_net(3))
    loss.make_value_estimator(rt.GAE, gamma=0.99, lmbda=0.95, value_network=loss.critic_network)
    assert isinstance(loss.value_estimator, rt.GAE)
    assert torch.isfinite(loss(td.clone())["loss_critic"])


# ---------------------------------------------------------------------------------- V-trace


def vtrace_pair(rho_thresh=1.0, c_thresh=1.0, **kw):
    actor = make_actor(4)
    net = value_net(5)
    args = dict(gamma=0.99, actor_network=actor, value_network=net, rho_thresh=rho_thresh, c_thresh=c_thresh, **kw)
    return rt.VTrace(**args), TorchRLVTrace(**args), actor


@pytest.mark.parametrize("rho,c", [(1.0, 1.0), (0.8, 1.2), (2.0, 0.5)])
def test_vtrace_equals_torchrl(collected, rho, c):
    ours, theirs, actor = vtrace_pair(rho, c)
    td = collected.clone()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        actor(td)
    # a behaviour policy that is not the target one: perturbed log-probabilities
    td["action_log_prob"] = td["action_log_prob"] + 0.3 * torch.randn(td.shape, generator=g)
    a, b = run_both(ours, theirs, td)
    assert_same(a, b, F32)


def test_vtrace_inconsistent_next_values_and_average():
    """Synthetic data with next values unrelated to the next step's: TorchRL's numbers."""
    ours, theirs, _ = vtrace_pair(0.9, 1.1, average_adv=True)
    ours.value_network = theirs.value_network = None
    td = synthetic((3,), 33, seed=14, dtype=torch.float32)
    td["observation"] = torch.randn(3, 33, 4)
    td["action"] = nn.functional.one_hot(torch.randint(0, 2, (3, 33)), 2)
    td["action_log_prob"] = -torch.rand(3, 33)
    a, b = run_both(ours, theirs, td)
    assert_same(a, b, F32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vtrace_nan_log_prob_gives_nan_like_torchrl(dtype):
    """A NaN behaviour log-probability: min(ρ̄, NaN) is NaN, not ρ̄, so the value targets are NaN
    where TorchRL's are (that step and every earlier one of its row: both carry it across episode
    ends) and so are the advantages; elsewhere the numbers are TorchRL's. One difference, rollbuf's
    rule (docs/semantics.md, "Non-finite inputs"): the advantage at a done step before the NaN is
    NaN too (``0·NaN``), where TorchRL's selects the next value there. On CPU tensors the drop-in
    runs the ``auto`` backend: the compiled loops when numba is installed."""
    from rollbuf import backends

    if backends.numba_available():
        assert backends.resolve("auto", torch.device("cpu")) == "numba"
    ours, theirs, actor = vtrace_pair(1.0, 1.0)
    ours.value_network = theirs.value_network = None
    td = synthetic((3,), 21, seed=17, dtype=dtype, p_done=0.1)
    td["observation"] = torch.randn(3, 21, 4, dtype=dtype)
    td["action"] = nn.functional.one_hot(torch.randint(0, 2, (3, 21)), 2)
    lp = -torch.rand(3, 21, dtype=dtype)
    lp[1, 12] = float("nan")
    td["action_log_prob"] = lp
    actor.to(dtype)
    a, b = run_both(ours, theirs, td)
    done = td["next", "done"]
    assert done[1, :12].any()  # a done step before the NaN: the case where the two differ
    row1 = (torch.arange(3) == 1).reshape(3, 1, 1)
    before = (torch.arange(21) <= 12).reshape(1, 21, 1) & row1  # the NaN's step and the earlier ones
    done_before = (torch.arange(21) < 12).reshape(1, 21, 1) & row1 & done
    for key in ("advantage", "value_target"):
        nan_a, nan_b = torch.isnan(a[key]), torch.isnan(b[key])
        assert torch.equal(nan_a, before), key  # NaN at the step and every earlier one of its row
        extra = nan_a & ~nan_b
        assert torch.equal(extra, done_before & (key == "advantage")), key
        torch.testing.assert_close(a[key][~nan_a], b[key][~nan_a], **F32, msg=lambda m: f"{key}: {m}")


def test_torchrl_vtrace_functional_reads_the_next_value_at_every_done():
    """docs/semantics.md §7: TorchRL's ``vtrace_advantage_estimate`` reads ``vs_{t+1}`` in its
    policy-gradient term inside an episode and ``("next", "state_value")`` of the step at every done
    (``torch.where(done, next_state_value, vs_t_plus_1)``) and at the window end — rollbuf's ``V'_t``
    at every boundary. With the next values of a collector (``V_{t+1}`` inside an episode, the true
    final observation's value at a truncation), the functional and ``rollbuf.functional.vtrace``
    agree to float64 rounding at truncations too."""
    from torchrl.objectives.value.functional import vtrace_advantage_estimate

    from rollbuf import functional as F

    g = torch.Generator().manual_seed(23)
    N, T = 4, 29
    done = torch.rand(N, T, generator=g) < 0.15
    done[0, 10] = True  # at least one truncation ...
    term = done & (torch.rand(N, T, generator=g) < 0.5)
    term[0, 10] = False
    term[1, 5] = done[1, 5] = True  # ... and one termination
    v = torch.randn(N, T, generator=g, dtype=torch.float64)
    boot = torch.randn(N, T, generator=g, dtype=torch.float64)  # V(s'_t) of the true final observation
    nv = torch.where(done, boot, torch.cat([v[:, 1:], boot[:, -1:]], 1))
    nv[:, -1] = boot[:, -1]
    r = torch.randn(N, T, generator=g, dtype=torch.float64)
    lmu = -torch.rand(N, T, generator=g, dtype=torch.float64)
    lpi = lmu + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    f64 = functools.partial(torch.tensor, dtype=torch.float64)  # Python floats would be float32 there
    pg, vs = vtrace_advantage_estimate(f64(0.97), lpi[..., None], lmu[..., None], v[..., None], nv[..., None],
                                       r[..., None], done[..., None], term[..., None], rho_thresh=f64(0.9),
                                       c_thresh=f64(1.1))
    ours = F.vtrace(lpi, 0.97, 0.9, 1.1, rewards=r, values=v, log_probs=lmu, terminated=term,
                    truncated=done & ~term, bootstrap_values=boot, backend="reference")
    torch.testing.assert_close(ours.vs, vs[..., 0], **TIGHT)
    torch.testing.assert_close(ours.pg_advantages, pg[..., 0], **TIGHT)


# -------------------------------------------------------------------- gamma / lmbda buffer dtypes


@pytest.mark.parametrize("gamma_dtype,lmbda_dtype", [(torch.float64, torch.float64), (torch.float64, torch.float32),
                                                     (torch.float32, torch.float64), (torch.float32, torch.float32)])
@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (0.97, 0.9)])
def test_gae_with_tensor_gamma_lmbda_of_either_dtype(gamma_dtype, lmbda_dtype, gamma, lmbda):
    """TorchRL keeps the dtype of a ``gamma``/``lmbda`` tensor passed in and multiplies the two in
    their promoted dtype: float64 buffers give an unrounded float64 γλ, float32 ones a float32 γλ.
    On float64 data the drop-in gives TorchRL's loop's numbers to float64 rounding either way
    (``forward`` and ``value_estimate``); on float32 data TorchRL's dtype and numbers (those of its
    default GAE, the loop: TorchRL 0.14.1's ``vectorized=None`` selects it; its ``vectorized=True``
    path, which the drop-in does not follow, returns float64 there)."""
    g, lm = torch.tensor(gamma, dtype=gamma_dtype), torch.tensor(lmbda, dtype=lmbda_dtype)
    td = synthetic((3,), 53, seed=int(gamma * 100), consistent=False)
    ours = rt.GAE(gamma=g, lmbda=lm, value_network=None)
    theirs = TorchRLGAE(gamma=g, lmbda=lm, value_network=None, vectorized=False)
    assert ours.gamma.dtype == gamma_dtype and ours.lmbda.dtype == lmbda_dtype
    a, b = run_both(ours, theirs, td)
    assert_same(a, b, TIGHT)
    torch.testing.assert_close(ours.value_estimate(td.clone()), theirs.value_estimate(td.clone()), **TIGHT)
    td32 = synthetic((3,), 53, seed=int(gamma * 100) + 1, dtype=torch.float32, consistent=False)
    for other in (TorchRLGAE(gamma=g, lmbda=lm, value_network=None), theirs):
        a, b = run_both(ours, other, td32)
        assert_same(a, b, F32)


def _vtrace_synthetic(dtype, seed):
    td = synthetic((3,), 33, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    td["observation"] = torch.randn(3, 33, 4, generator=g)
    td["action"] = nn.functional.one_hot(torch.randint(0, 2, (3, 33), generator=g), 2)
    td["action_log_prob"] = -torch.rand(3, 33, generator=g, dtype=dtype)
    return td


@pytest.mark.parametrize("data_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma_dtype", [torch.float32, torch.float64])
def test_vtrace_with_tensor_gamma_of_either_dtype(data_dtype, gamma_dtype):
    """TorchRL's V-trace computes in the dtype ``gamma`` and the data promote to: float32 data with a
    float64 ``gamma`` give float64 outputs. The drop-in gives TorchRL's dtypes, and its numbers (to
    float64 rounding on float64 data; to float32 rounding where the log-probabilities, hence TorchRL's
    importance weights, are float32)."""
    actor = make_actor(4)
    args = dict(gamma=torch.tensor(0.99, dtype=gamma_dtype), actor_network=actor, value_network=None,
                rho_thresh=0.9, c_thresh=1.1)
    td = _vtrace_synthetic(data_dtype, seed=21)
    a, b = run_both(rt.VTrace(**args), TorchRLVTrace(**args), td)  # a float32 actor: float32 log π
    assert b["advantage"].dtype == functools.reduce(torch.promote_types, [data_dtype, gamma_dtype])
    assert_same(a, b, F32)
    if data_dtype == torch.float64:  # a float64 actor on float64 observations: everything float64
        actor.double()
        td["observation"] = td["observation"].double()
        assert_same(*run_both(rt.VTrace(**args), TorchRLVTrace(**args), td), TIGHT)


# ----------------------------------------------------------------------------------- errors


def test_errors_name_the_cause():
    td = synthetic((2,), 7, seed=15)
    est = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None)
    with pytest.raises(ValueError, match="steps_to_next_obs"):
        est(td.clone().set("steps_to_next_obs", torch.ones(2, 7, 1)))
    with pytest.raises(ValueError, match="gamma must be a scalar"):
        rt.GAE(gamma=torch.full((2, 7, 1), 0.9), lmbda=0.95, value_network=None)(td.clone())
    with pytest.raises(ValueError, match="one shape"):
        bad = td.clone()
        bad["next", "state_value"] = torch.zeros(2, 7, 2, dtype=torch.float64)
        est(bad)
    with pytest.raises(ValueError, match="'state_value'"):
        est(td.clone().exclude("state_value"))
    with pytest.raises(ValueError, match="gamma must lie in"):
        rt.GAE(gamma=1.5, lmbda=0.95, value_network=None)(td.clone())
    with pytest.raises(ValueError, match="at least one batch dimension"):
        est(TensorDict({}, batch_size=[]))


def test_gamma_buffer_read_once_and_followed():
    """γ is read from its buffer once, and again after the buffer changes."""
    td = synthetic((2,), 11, seed=16)
    est = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None)
    first = est(td.clone())["advantage"]
    est.gamma.fill_(0.5)  # in place: the cached value must not be used
    changed = est(td.clone())["advantage"]
    want = TorchRLGAE(gamma=0.5, lmbda=0.95, value_network=None, vectorized=False)(td.clone())["advantage"]
    torch.testing.assert_close(changed, want, **TIGHT)
    assert not torch.allclose(first, changed)
