"""``Rollout``: the TensorDict-backed window (SPEC §3): filling, closing, indexing, estimators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rollbuf import Rollout, backends
from rollbuf import functional as F
from rollbuf.testing import assert_matches_reference, make_rollout

NAN = float("nan")
FIELDS = ("rewards", "values", "terminated", "truncated", "log_probs", "bootstrap_values", "mask")


def _from_fields(f, **kw):
    """A Rollout built directly from a dict of :func:`make_rollout` fields."""
    shape = list(f["rewards"].shape)
    return Rollout(rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
                   truncated=f["truncated"], log_probs=f["log_probs"],
                   bootstrap_values=f["bootstrap_values"], mask=f["mask"], batch_size=shape, **kw)


# ---------------------------------------------------------------------------------------------
# empty / record / bootstrap
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty(dtype, with_mask):
    ro = Rollout.empty(4, 6, dtype=dtype, with_mask=with_mask)
    assert tuple(ro.batch_size) == (4, 6)
    for name in ("rewards", "values", "log_probs", "bootstrap_values"):
        x = getattr(ro, name)
        assert x.shape == (4, 6) and x.dtype == dtype and x.isnan().all(), name
    for name in ("terminated", "truncated"):
        x = getattr(ro, name)
        assert x.dtype == torch.bool and not x.any(), name
    if with_mask:
        assert ro.mask.dtype == torch.bool and ro.mask.all()
    else:
        assert ro.mask is None


def test_empty_leading_dims_and_errors():
    ro = Rollout.empty((2, 3), 5)
    assert tuple(ro.batch_size) == (2, 3, 5) and ro.rewards.shape == (2, 3, 5)
    with pytest.raises(ValueError, match="horizon"):
        Rollout.empty(2, -1)
    with pytest.raises(ValueError, match="horizon"):
        Rollout.empty(2, 5.0)
    with pytest.raises(TypeError, match="dtype"):
        Rollout.empty(2, 5, dtype=torch.int64)


def _filled():
    """Three envs, T = 3, r = 1 and V = 0 everywhere.

    env 0: terminated at t=1, truncated at t=2 with V(s'_2) = 10 recorded with the step;
    env 1: no flags;  env 2: terminated at t=2.
    """
    ro = Rollout.empty(3, 3)
    for t in range(3):
        ro.record(t, rewards=torch.ones(3), values=torch.zeros(3), log_probs=torch.zeros(3),
                  terminated=torch.tensor([t == 1, False, t == 2]),
                  truncated=torch.tensor([t == 2, False, False]))
    ro.record(2, bootstrap_values=torch.tensor([10.0, NAN, NAN]))
    return ro


def test_record_and_bootstrap_hand_checked():
    ro = _filled().bootstrap(torch.tensor([5.0, 7.0, 9.0]))
    bv = ro.bootstrap_values
    # env 0 is truncated at its last step: keeps the 10 recorded with it; env 1 gets 7;
    # env 2 is terminated at its last step: nothing written (never read)
    assert bv[:, -1].tolist()[:2] == [10.0, 7.0] and math.isnan(bv[2, -1])
    assert bv[:, :-1].isnan().all()
    # GAE with γ = 0.5, λ = 1 (δ = r + γ(1−k)V' − V; V = 0):
    # env 0: A2 = 1 + .5*10 = 6; A1 = 1 (terminal); A0 = 1 + .5*(V1 + A1) = 1.5
    # env 1: A2 = 1 + .5*7 = 4.5; A1 = 1 + .5*4.5 = 3.25; A0 = 1 + .5*3.25 = 2.625
    # env 2: A2 = 1; A1 = 1.5; A0 = 1.75
    adv, ret = ro.gae(0.5, 1.0, backend="torch")
    expected = torch.tensor([[1.5, 1.0, 6.0], [2.625, 3.25, 4.5], [1.75, 1.5, 1.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)  # V = 0


def test_bootstrap_with_mask_goes_to_the_window_end():
    """With trailing masked steps the window end is the last unmasked step: V(s_T) goes there."""
    ro = Rollout.empty(2, 4, with_mask=True)
    for t in range(4):
        ro.record(t, rewards=torch.ones(2), values=torch.zeros(2), log_probs=torch.zeros(2),
                  mask=torch.tensor([True, t < 2]))
    ro.bootstrap(torch.tensor([5.0, 7.0]))
    assert ro.bootstrap_values[0, 3] == 5.0 and ro.bootstrap_values[1, 1] == 7.0
    # γ = .5, λ = 1, r = 1, V = 0. env 1: A1 = 1 + .5*7 = 4.5, A0 = 1 + .5*4.5 = 3.25, masked 0;
    # env 0: A3 = 1 + .5*5 = 3.5, A2 = 2.75, A1 = 2.375, A0 = 2.1875
    adv = ro.advantages(0.5, 1.0, backend="torch")
    torch.testing.assert_close(adv[1], torch.tensor([3.25, 4.5, 0.0, 0.0]))
    torch.testing.assert_close(adv[0], torch.tensor([2.1875, 2.375, 2.75, 3.5]))


def test_bootstrap_errors_and_zero_length():
    ro = Rollout.empty(3, 4)
    with pytest.raises(ValueError, match=r"last_values.*\(3,\)"):
        ro.bootstrap(torch.zeros(4))
    with pytest.raises(TypeError, match="last_values"):
        ro.bootstrap([0.0, 0.0, 0.0])
    empty = Rollout.empty(3, 0).bootstrap(torch.zeros(3))
    assert empty.bootstrap_values.shape == (3, 0)


def test_bootstrap_allocates_bootstrap_values():
    ro = Rollout(rewards=torch.ones(2, 3), values=torch.zeros(2, 3), terminated=torch.zeros(2, 3, dtype=torch.bool),
                 truncated=torch.zeros(2, 3, dtype=torch.bool), batch_size=[2, 3])
    assert ro.bootstrap_values is None
    ro.bootstrap(torch.tensor([2.0, 4.0]))
    assert ro.bootstrap_values[:, -1].tolist() == [2.0, 4.0] and ro.bootstrap_values[:, :-1].isnan().all()
    # γ = 1: G = 3 + V(s_T)
    torch.testing.assert_close(ro.discounted_returns(1.0, backend="torch")[:, 0], torch.tensor([5.0, 7.0]))


def test_record_errors():
    ro = Rollout.empty(3, 4)
    with pytest.raises(ValueError, match=r"rewards.*\(3,\)"):
        ro.record(0, rewards=torch.zeros(4))
    with pytest.raises(ValueError, match=r"values.*\(3,\)"):
        ro.record(0, values=torch.zeros(3, 1))
    with pytest.raises(TypeError, match="reward"):
        ro.record(0, reward=torch.zeros(3))  # unknown field: the typo is named
    with pytest.raises(IndexError, match="t"):
        ro.record(4, rewards=torch.zeros(3))
    with pytest.raises(ValueError, match="mask"):
        ro.record(0, mask=torch.ones(3, dtype=torch.bool))  # not allocated (with_mask=False)
    ro.record(-1, rewards=torch.ones(3))  # negative indices count from the end
    assert ro.rewards[:, 3].tolist() == [1.0, 1.0, 1.0]


def test_record_accepts_lists_and_none():
    ro = Rollout.empty(2, 2)
    ro.record(0, rewards=[1.0, 2.0], values=None, terminated=[True, False])
    assert ro.rewards[:, 0].tolist() == [1.0, 2.0] and ro.values[:, 0].isnan().all()
    assert ro.terminated[:, 0].tolist() == [True, False]


# ---------------------------------------------------------------------------------------------
# construction, indexing, devices, leading dims
# ---------------------------------------------------------------------------------------------


def test_direct_construction_matches_functional():
    f = make_rollout(4, 33, seed=1, p_terminated=0.1, p_truncated=0.1, p_masked=0.3)
    ro = _from_fields(f)
    got = ro.gae(0.99, 0.95, backend="torch")
    assert_matches_reference("gae", got, f, gamma=0.99, lam=0.95)


def test_indexing_rows_and_time():
    f = make_rollout(4, 30, seed=2, p_terminated=0.1, p_truncated=0.1, p_masked=0.3)
    ro = _from_fields(f)
    whole = ro.gae(0.9, 0.8, backend="torch")
    head = ro[:2]
    assert tuple(head.batch_size) == (2, 30) and head.mask.shape == (2, 30)
    adv, _ = head.gae(0.9, 0.8, backend="torch")
    torch.testing.assert_close(adv, whole.advantages[:2], rtol=0, atol=0)
    # time slices: the later window's carry closes the earlier one (chained windows)
    first, second = ro[..., :12], ro[..., 12:]
    assert tuple(first.batch_size) == (4, 12)
    later, carry = second.gae(0.9, 0.8, backend="torch", return_carry=True)
    earlier = first.gae(0.9, 0.8, backend="torch", carry=carry)
    joined = torch.cat([earlier.advantages, later.advantages], -1)
    assert_matches_reference("advantages", joined, f, gamma=0.9, lam=0.8)


def test_to_device():
    ro = _filled().bootstrap(torch.zeros(3))
    moved = ro.to("cpu")
    assert moved.rewards.device.type == "cpu" and moved.terminated.dtype == torch.bool
    torch.testing.assert_close(moved.gae(0.5, 1.0, backend="torch").advantages,
                               ro.gae(0.5, 1.0, backend="torch").advantages)
    if torch.cuda.is_available():
        assert ro.to("cuda").rewards.device.type == "cuda"


def test_leading_batch_dims():
    f = make_rollout(batch_shape=(2, 3), t=17, seed=3, p_terminated=0.1, p_truncated=0.1)
    ro = _from_fields(f)
    assert tuple(ro.batch_size) == (2, 3, 17)
    adv, ret = ro.gae(0.9, 0.9, backend="torch")
    assert adv.shape == (2, 3, 17)
    flat = {k: (None if v is None else v.reshape(6, 17)) for k, v in f.items()}
    assert_matches_reference("gae", (adv.reshape(6, 17), ret.reshape(6, 17)), flat, gamma=0.9, lam=0.9)
    assert tuple(ro[1].batch_size) == (3, 17)
    torch.testing.assert_close(ro[1].gae(0.9, 0.9, backend="torch").advantages, adv[1], rtol=0, atol=0)


def test_stack_and_cat():
    a, b = _filled(), _filled()
    assert tuple(torch.stack([a, b]).batch_size) == (2, 3, 3)
    assert tuple(torch.cat([a, b], dim=-1).batch_size) == (3, 6)


# ---------------------------------------------------------------------------------------------
# every estimator method = the functional call
# ---------------------------------------------------------------------------------------------


def _method_cases():
    q = torch.randn(3, 21, generator=torch.Generator().manual_seed(7))
    tlp = torch.randn(3, 21, generator=torch.Generator().manual_seed(8)) * 0.3
    x = torch.randn(3, 21, 2, generator=torch.Generator().manual_seed(9))
    return {
        "gae": (lambda ro: ro.gae(0.9, 0.8), lambda f: F.gae(0.9, 0.8, **f), "gae", dict(gamma=0.9, lam=0.8)),
        "advantages": (lambda ro: ro.advantages(0.9, 0.8), lambda f: F.advantages(0.9, 0.8, **f),
                       "advantages", dict(gamma=0.9, lam=0.8)),
        "lambda_returns": (lambda ro: ro.lambda_returns(0.9, 0.7), lambda f: F.lambda_returns(0.9, 0.7, **f),
                           "lambda_returns", dict(gamma=0.9, lam=0.7)),
        "discounted_returns": (lambda ro: ro.discounted_returns(0.9),
                               lambda f: F.discounted_returns(0.9, **f), "discounted_returns", dict(gamma=0.9)),
        "monte_carlo_returns": (lambda ro: ro.discounted_returns(0.9, bootstrap=False),
                                lambda f: F.discounted_returns(0.9, bootstrap=False, **f),
                                "monte_carlo_returns", dict(gamma=0.9)),
        "vtrace": (lambda ro: ro.vtrace(tlp, 0.9, rho_bar=1.2, c_bar=0.8, lam=0.9),
                   lambda f: F.vtrace(tlp, 0.9, 1.2, 0.8, None, 0.9, **f), "vtrace",
                   dict(target_log_probs=tlp, gamma=0.9, rho_bar=1.2, c_bar=0.8, lam=0.9)),
        "retrace": (lambda ro: ro.retrace(q, tlp, 0.9, lam=0.8, c_bar=1.0),
                    lambda f: F.retrace(q, tlp, 0.9, 0.8, 1.0, **f), "retrace",
                    dict(q_values=q, target_log_probs=tlp, gamma=0.9, lam=0.8, c_bar=1.0)),
        "eligibility_traces": (lambda ro: ro.eligibility_traces(x, 0.9, 0.8),
                               lambda f: F.eligibility_traces(x, 0.9, 0.8, **_flags(f)), "eligibility_traces",
                               dict(gamma=0.9, lam=0.8)),
        "episodic_sums": (lambda ro: ro.episodic_sums(), lambda f: F.episodic_sums(rewards=f["rewards"], **_flags(f)),
                          "episodic_sums", {}),
    }, x


def _flags(f):
    return {k: f[k] for k in ("terminated", "truncated", "mask")}


@pytest.mark.parametrize("name", list(_method_cases()[0]))
def test_estimator_methods_equal_functional(name):
    cases, x = _method_cases()
    method, functional, ref_name, ref_params = cases[name]
    f = make_rollout(3, 21, seed=4, p_terminated=0.1, p_truncated=0.1, p_masked=0.3)
    ro = _from_fields(f)
    keys = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")
    fkw = {k: f[k] for k in keys}
    if name in ("vtrace", "retrace"):
        fkw["log_probs"] = f["log_probs"]
    if name == "monte_carlo_returns":
        fkw.pop("bootstrap_values")
    got, want = method(ro), functional(fkw)
    got_t = (got,) if isinstance(got, torch.Tensor) else tuple(got)
    want_t = (want,) if isinstance(want, torch.Tensor) else tuple(want)
    assert type(got) is type(want)
    for a, b in zip(got_t, want_t):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and against the oracle (with the extra inputs the method was given)
    fields = dict(f)
    params = dict(ref_params)
    for k in ("target_log_probs", "q_values"):
        if k in params:
            fields[k] = params.pop(k)
    if name == "eligibility_traces":
        fields["x"] = x
    assert_matches_reference(ref_name, got, fields, **params)


@pytest.mark.parametrize("call", [lambda ro: ro.vtrace(torch.zeros(2, 3), 0.9),
                                  lambda ro: ro.retrace(torch.zeros(2, 3), torch.zeros(2, 3), 0.9)],
                         ids=["vtrace", "retrace"])
def test_missing_log_probs_is_named(call):
    ro = Rollout(rewards=torch.ones(2, 3), values=torch.zeros(2, 3), terminated=torch.zeros(2, 3, dtype=torch.bool),
                 truncated=torch.zeros(2, 3, dtype=torch.bool), bootstrap_values=torch.zeros(2, 3),
                 batch_size=[2, 3])
    with pytest.raises(ValueError, match="log_probs"):
        call(ro)


def test_unfilled_rollout_gives_nan_not_silent_zeros():
    """A step never recorded stays NaN, so forgetting to record shows in the outputs."""
    ro = Rollout.empty(2, 3)
    for t in range(2):  # step 2 never recorded
        ro.record(t, rewards=torch.ones(2), values=torch.zeros(2))
    ro.bootstrap(torch.zeros(2))
    assert ro.gae(0.9, 0.9, backend="torch").advantages.isnan().any()


def test_truncated_is_optional_for_rows_that_never_truncate():
    """verl-style rows: terminal response ends, masks, no truncation flags and no bootstrap values."""
    from rollbuf import functional as F

    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 17, generator=g), torch.randn(3, 17, generator=g)
    k = torch.zeros(3, 17, dtype=torch.bool)
    m = torch.rand(3, 17, generator=g) < 0.7
    ro = Rollout(rewards=r, values=v, terminated=k, mask=m, batch_size=[3, 17])
    assert ro.truncated is None
    adv, ret = ro.gae(0.9, 0.8, window_end="terminal", backend="torch")
    ref = F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, mask=m, window_end="terminal", backend="reference")
    torch.testing.assert_close(adv, ref.advantages.float())
    torch.testing.assert_close(ret, ref.returns.float())


# ---- repeated calls: every method call reads the rollout's fields as they are now ----------------


def _bound_rollout(n=5, t=23, seed=0, backend_device="cpu"):
    f = make_rollout(n, t, seed=seed, p_terminated=0.1, p_truncated=0.1, p_masked=0.3, device=backend_device)
    return _from_fields(f)


def _same_results(a, b):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


def _first(x):
    return x[0] if isinstance(x, tuple) else x


@pytest.mark.parametrize("backend", ["torch", "numba", "reference", "auto"])
@pytest.mark.parametrize("call", ["gae", "advantages", "lambda_returns", "discounted_returns", "monte_carlo"])
def test_methods_follow_in_place_writes_and_replaced_fields(call, backend):
    """A repeated call reads what ``record`` wrote in place since the last one; a replaced field, one
    given new storage in place (``x.data = y``, ``set_``), other arguments and another rollout are
    all seen; every result equals the functional one. ``auto``: the calls name no backend, as a
    training loop writes them."""
    kw = {} if backend == "auto" else {"backend": backend}
    fn = {"gae": lambda ro, g: ro.gae(g, 0.8, **kw),
          "advantages": lambda ro, g: ro.advantages(g, 0.8, **kw),
          "lambda_returns": lambda ro, g: ro.lambda_returns(g, 0.8, **kw),
          "discounted_returns": lambda ro, g: ro.discounted_returns(g, **kw),
          "monte_carlo": lambda ro, g: ro.discounted_returns(g, bootstrap=False, **kw)}[call]

    def functional(ro, g):
        f = ro.estimator_fields()
        if call == "monte_carlo":
            f["bootstrap_values"] = None
            return F.discounted_returns(g, bootstrap=False, **f, backend=backend)
        name = "discounted_returns" if call == "discounted_returns" else call
        args = (g,) if call == "discounted_returns" else (g, 0.8)
        return getattr(F, name)(*args, **f, backend=backend)

    ro = _bound_rollout()
    _same_results(fn(ro, 0.9), functional(ro, 0.9))
    before = _first(fn(ro, 0.9))
    ro.record(3, rewards=torch.full((5,), 7.0), values=torch.full((5,), -2.0))  # in place
    after = _first(fn(ro, 0.9))
    _same_results(after, _first(functional(ro, 0.9)))
    assert not torch.equal(before[:, :4], after[:, :4])
    _same_results(fn(ro, 0.5), functional(ro, 0.5))  # other arguments
    ro.rewards = ro.rewards * 3  # a replaced field
    _same_results(fn(ro, 0.9), functional(ro, 0.9))
    before = _first(fn(ro, 0.9))
    ro.rewards.data = ro.rewards.data * 2  # the same tensor object, new storage
    _same_results(fn(ro, 0.9), functional(ro, 0.9))
    assert not torch.equal(before, _first(fn(ro, 0.9)))
    before = _first(fn(ro, 0.9))
    ro.values.set_(ro.values.detach() - 1.0)  # set_: new storage again
    _same_results(fn(ro, 0.9), functional(ro, 0.9))
    if call not in ("discounted_returns", "monte_carlo"):  # (they do not read values)
        assert not torch.equal(before, _first(fn(ro, 0.9)))
    other = _bound_rollout(seed=1)
    _same_results(fn(other, 0.9), functional(other, 0.9))
    _same_results(fn(ro, 0.9), functional(ro, 0.9))


def test_methods_keep_every_error_and_the_checks_that_read_data():
    from rollbuf import check_finite

    ro = _bound_rollout()
    with pytest.raises(ValueError, match="gamma"):
        ro.gae(1.5, 0.9)
    with pytest.raises(TypeError, match="unexpected keyword"):
        ro.gae(0.9, 0.9, bogus=1)
    ro.gae(0.9, 0.9, backend="torch")
    ro.rewards[0, 2] = float("nan")
    if ro.mask is not None:
        ro.mask[0, 2] = True
    with check_finite(), pytest.raises(ValueError, match="rewards"):
        ro.gae(0.9, 0.9, backend="torch")  # the repeated call runs the data check


def test_methods_take_the_autograd_path_when_a_field_starts_requiring_grad():
    ro = _bound_rollout()
    ro.gae(0.9, 0.8, backend="torch")
    ro.values.requires_grad_(True)
    adv, ret = ro.gae(0.9, 0.8, backend="torch")
    assert adv.requires_grad
    (g,) = torch.autograd.grad(adv.sum(), ro.values)
    v = ro.values.detach().clone().requires_grad_(True)
    f = dict(ro.estimator_fields(), values=v)
    (want,) = torch.autograd.grad(F.gae(0.9, 0.8, **f, backend="torch").advantages.sum(), v)
    torch.testing.assert_close(g, want)


@pytest.mark.filterwarnings("ignore:The method:UserWarning")  # tensorclass's deepcopy fallback
def test_copies_of_a_rollout_compute_from_their_own_fields():
    """Copies, deep copies, unpickled and cloned rollouts compute from their own fields, and the
    original from its own, after calls on either."""
    import copy
    import pickle

    ro = _bound_rollout()
    ro.gae(0.9, 0.8, backend="torch")
    for i, other in enumerate((copy.copy(ro), copy.deepcopy(ro), pickle.loads(pickle.dumps(ro)), ro.clone())):
        other.rewards.add_(i + 1.0)
        _same_results(other.gae(0.9, 0.8, backend="torch"), F.gae(0.9, 0.8, **other.estimator_fields(), backend="torch"))
        _same_results(ro.gae(0.9, 0.8, backend="torch"), F.gae(0.9, 0.8, **ro.estimator_fields(), backend="torch"))


@pytest.mark.filterwarnings("ignore:The method:UserWarning")
@pytest.mark.interpret
def test_methods_on_the_triton_backend_follow_writes_and_copies():
    """Under the interpreter (compiled on a GPU): the triton backend's calls read the current
    contents, in place writes and new storage alike, on the rollout and on its copies."""
    import copy
    import pickle

    ro = _bound_rollout(n=4, t=37, seed=3, backend_device="cuda" if torch.cuda.is_available() else "cpu")

    def reference(r):
        cpu = {k: (None if v is None else v.cpu()) for k, v in r.estimator_fields().items()}
        return F.advantages(0.9, 0.8, **cpu, backend="reference")

    adv = ro.advantages(0.9, 0.8, backend="triton")
    torch.testing.assert_close(adv.cpu(), reference(ro).to(adv.dtype), rtol=1e-5, atol=1e-5)
    ro.record(36, rewards=torch.full((4,), 3.0, device=ro.device))
    again = ro.advantages(0.9, 0.8, backend="triton")
    torch.testing.assert_close(again.cpu(), reference(ro).to(adv.dtype), rtol=1e-5, atol=1e-5)
    assert not torch.equal(adv, again)
    ro.values.data = ro.values.data + 1.0
    torch.testing.assert_close(ro.advantages(0.9, 0.8, backend="triton").cpu(), reference(ro).to(adv.dtype),
                               rtol=1e-5, atol=1e-5)
    for other in (copy.deepcopy(ro), pickle.loads(pickle.dumps(ro))):
        other.rewards.mul_(2.0)
        torch.testing.assert_close(other.advantages(0.9, 0.8, backend="triton").cpu(),
                                   reference(other).to(adv.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ro.advantages(0.9, 0.8, backend="triton").cpu(), reference(ro).to(adv.dtype),
                               rtol=1e-5, atol=1e-5)


def test_a_slice_sees_writes_through_the_parent():
    """A slice of an [E, A, T] rollout cannot be flattened to [E·A', T] without a copy: its calls
    flatten a copy each time, so writes into the parent (the slice's own storage) are always seen."""
    ro = Rollout.empty((4, 3), 16)
    g = torch.Generator().manual_seed(1)
    for t in range(16):
        ro.record(t, rewards=torch.randn(4, 3, generator=g), values=torch.randn(4, 3, generator=g))
    ro.bootstrap(torch.randn(4, 3, generator=g))
    team = ro[:, :2]
    first = team.advantages(0.9, 0.8, backend="torch")
    ro.record(5, rewards=torch.full((4, 3), 100.0))
    again = team.advantages(0.9, 0.8, backend="torch")
    _same_results(again, F.advantages(0.9, 0.8, **team.estimator_fields(), backend="torch"))
    assert not torch.equal(first, again)


def test_a_field_given_again_to_a_method_is_an_error():
    ro = _bound_rollout()
    for name in ("truncated", "mask", "bootstrap_values"):
        with pytest.raises(TypeError, match="multiple values"):
            ro.gae(0.9, 0.8, **{name: None})


def test_a_rollout_holds_no_replaced_field():
    """A schedule of γ keeps nothing on the rollout, and a replaced field is not kept alive by it."""
    import gc
    import weakref

    ro = _bound_rollout()
    for i in range(20):
        ro.gae(0.5 + i / 100, 0.8, backend="torch")
    refs = []
    for i in range(5):
        refs.append(weakref.ref(ro.values))
        ro.values = ro.values.clone()
        ro.gae(0.9, 0.8 - i / 100, backend="torch")
    gc.collect()
    assert sum(r() is not None for r in refs[:-1]) == 0


def test_the_rollout_reads_its_fields_through_the_public_tensorclass_api():
    """The estimator methods read the rollout's fields with ``to_dict()`` (tensorclass's public API),
    the very tensors the rollout holds, absent ones ``None``."""
    ro = _bound_rollout()
    f = ro.estimator_fields()
    assert all(f[k] is getattr(ro, k) for k in f)
    ro2 = Rollout(rewards=torch.ones(2, 3), values=torch.zeros(2, 3), terminated=torch.zeros(2, 3, dtype=torch.bool),
                  batch_size=[2, 3])
    assert ro2.estimator_fields()["truncated"] is None and ro2.estimator_fields()["mask"] is None


def test_truncated_flags_written_outside_torch_ops_are_read():
    """Every estimator method reads the rollout's truncated flags as they are, however they were written:
    flags written through a NumPy view (no version counter moves) still truncate (an optimisation that
    passed the never-written all-False flags as ``None`` was dropped for this)."""
    ro = Rollout.empty(1, 4)
    for t in range(4):
        ro.record(t, rewards=torch.ones(1), values=torch.zeros(1))
    ro.bootstrap(torch.zeros(1))
    ro.truncated.numpy()[0, 1] = True
    ro.bootstrap_values.numpy()[0, 1] = 100.0
    assert ro.estimator_fields()["truncated"] is ro.truncated
    want = F.gae(0.99, 0.95, **ro.estimator_fields()).advantages
    torch.testing.assert_close(ro.gae(0.99, 0.95).advantages, want, rtol=0, atol=0)
    assert want[0, 1] == 100.0  # the truncated step bootstraps from V(s'_1) = 100


# ---- a field never written: the estimator names it and the call that writes it ----------------

ROLLOUT_BACKENDS = ["reference", "torch"] + (["numba"] if backends.numba_available() else []) + (
    ["triton"] if backends.triton_available() else [])

_METHODS = {  # name -> (call, whether it reads values, whether it reads log_probs)
    "gae": (lambda ro, **kw: ro.gae(0.9, 0.8, **kw), True, False),
    "advantages": (lambda ro, **kw: ro.advantages(0.9, 0.8, **kw), True, False),
    "lambda_returns": (lambda ro, **kw: ro.lambda_returns(0.9, 0.8, **kw), True, False),
    "discounted_returns": (lambda ro, **kw: ro.discounted_returns(0.9, **kw), False, False),
    "vtrace": (lambda ro, **kw: ro.vtrace(torch.zeros(ro.batch_size, device=ro.rewards.device), 0.9, **kw), True, True),
    "retrace": (lambda ro, **kw: ro.retrace(torch.zeros(ro.batch_size, device=ro.rewards.device),
                                            torch.zeros(ro.batch_size, device=ro.rewards.device), 0.9, **kw), True, True),
}


def _collected(n=3, t=4, device="cpu", log_probs=True, **extra):
    """A window filled as a Gymnasium loop fills it: every step recorded, bootstrap_values included
    (NaN where not truncated), but not closed with bootstrap()."""
    ro = Rollout.empty(n, t, device=device)
    for s in range(t):
        ro.record(s, rewards=torch.ones(n), values=torch.full((n,), 0.5), terminated=torch.zeros(n, dtype=torch.bool),
                  truncated=torch.zeros(n, dtype=torch.bool), bootstrap_values=torch.full((n,), NAN),
                  log_probs=torch.zeros(n) if log_probs else None, **extra)
    return ro


@pytest.mark.parametrize("backend", ROLLOUT_BACKENDS)
@pytest.mark.parametrize("name", list(_METHODS))
def test_forgetting_bootstrap_is_an_error_naming_it(name, backend):
    """Rollout.empty fills bootstrap_values with NaN; an estimator that reads the window end of a
    window never closed raises (it used to return NaN advantages), naming bootstrap_values and
    Rollout.bootstrap(last_values). Recorded bootstrap values (V(s'_t) after truncations) do not
    close the window; bootstrap() does, and the results then equal the functional ones."""
    call = _METHODS[name][0]
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    ro = _collected(device=dev)
    for _ in range(2):  # the second call raises too: nothing was remembered
        with pytest.raises(ValueError, match=r"bootstrap_values.*Rollout\.bootstrap\(last_values\)"):
            call(ro, backend=backend)
    if backend != "reference":  # chained: the window end is not read
        assert not _as_tuple(call(ro, carry=torch.zeros((3, 2) if name == "vtrace" else (3,), device=dev),
                                  backend=backend))[0].isnan().any()
    assert not _as_tuple(call(ro, window_end="terminal", backend=backend))[0].isnan().any()
    if name == "discounted_returns":
        assert not ro.discounted_returns(0.9, bootstrap=False, backend=backend).isnan().any()
    ro.bootstrap(torch.full((3,), 2.0, device=dev))
    got = call(ro, backend=backend)
    assert not _as_tuple(got)[0].isnan().any()
    want = call(_from_fields({**ro.estimator_fields(), "log_probs": ro.log_probs}), backend=backend)  # built from tensors
    _same_results(got, want)
    _same_results(call(ro, backend=backend), want)  # again


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("name", list(_METHODS))
def test_a_field_never_recorded_is_named_with_the_call_that_writes_it(name):
    call, reads_values, reads_log_probs = _METHODS[name]
    ro = Rollout.empty(3, 4).bootstrap(torch.zeros(3))
    with pytest.raises(ValueError, match=r"rewards.*record\(t, rewards=\.\.\.\)"):
        call(ro, backend="torch")
    ro.record(0, rewards=torch.ones(3))  # one step is enough to count as written (a missed step is NaN)
    ro.bootstrap(torch.zeros(3))  # recorded since the window was closed: closed again
    if reads_values:
        with pytest.raises(ValueError, match=r"values.*record\(t, values=\.\.\.\)"):
            call(ro, backend="torch")
    ro.values.zero_()  # written in place: counts
    if reads_log_probs:
        with pytest.raises(ValueError, match=r"log_probs.*record\(t, log_probs=\.\.\.\)"):
            call(ro, backend="torch")
        ro.log_probs = torch.zeros(3, 4)  # assigned: counts
    call(ro, backend="torch")


def test_episodic_sums_of_rewards_never_recorded_is_named():
    ro = Rollout.empty(2, 3)
    with pytest.raises(ValueError, match=r"rewards.*record\(t, rewards=\.\.\.\)"):
        ro.episodic_sums()
    assert ro.episodic_sums(torch.ones(2, 3)).sums[:, -1].tolist() == [3.0, 3.0]  # x given: rewards unread
    with pytest.raises(TypeError, match="unexpected keyword argument 'rewards'"):
        ro.episodic_sums(torch.ones(2, 3), rewards=torch.ones(2, 3))


def test_the_written_check_reads_no_data():
    """The check tracks writes on the host (version counters), never the values: it works on a
    device whose data cannot be read back at all (meta), so on CUDA it costs no sync."""
    ro = _collected(device="meta")
    with pytest.raises(ValueError, match=r"Rollout\.bootstrap\(last_values\)"):
        ro.gae(0.9, 0.8, backend="torch")
    ro = Rollout.empty(2, 3, device="meta")
    with pytest.raises(ValueError, match="rewards"):
        ro.vtrace(torch.zeros(2, 3, device="meta"), 0.9, backend="torch")


def test_rollouts_built_from_tensors_count_as_written():
    """The constructor, from_torchrl and rollouts made from another (indexing, clone, .to) hold
    tensors the caller gave: nothing is a placeholder, NaN or not (check_finite finds NaN values)."""
    f = make_rollout(3, 5, seed=0)
    f["bootstrap_values"] = torch.full((3, 5), NAN)
    ro = _from_fields(f)
    assert ro.gae(0.9, 0.8, backend="torch").advantages.isnan().any()
    ro = _collected()
    for other in (ro[:2], ro.clone(), ro[..., :3]):
        assert other.gae(0.9, 0.8, backend="torch").advantages.isnan().any()
    td = pytest.importorskip("tensordict")
    data = td.TensorDict({"state_value": torch.zeros(2, 3), "next": td.TensorDict(
        {"reward": torch.ones(2, 3), "terminated": torch.zeros(2, 3, dtype=torch.bool),
         "truncated": torch.zeros(2, 3, dtype=torch.bool), "state_value": torch.zeros(2, 3)}, [2, 3])}, [2, 3])
    assert not Rollout.from_torchrl(data).gae(0.9, 0.8, backend="torch").advantages.isnan().any()


def test_assigning_or_new_storage_writes_a_field():
    ro = Rollout.empty(2, 3)
    ro.rewards = torch.ones(2, 3)
    ro.values.data = torch.zeros(2, 3)  # the same tensor object, new storage: written
    ro.bootstrap_values = torch.zeros(2, 3)  # assigned: the window end too
    assert ro.gae(0.9, 0.8, backend="torch").advantages.tolist() == F.gae(
        0.9, 0.8, **ro.estimator_fields(), backend="torch").advantages.tolist()


# ---- NumPy and tensor integers, NumPy arrays, complex values ------------------------------------


@pytest.mark.parametrize("horizon", ["np.int64", "np.int32", "tensor"])
def test_empty_takes_integer_scalars_for_horizon(horizon):
    np = pytest.importorskip("numpy")
    h = {"np.int64": np.int64(4), "np.int32": np.int32(4), "tensor": torch.tensor(4)}[horizon]
    ro = Rollout.empty(3, h)
    assert tuple(ro.batch_size) == (3, 4) and type(ro.batch_size[-1]) is int
    assert tuple(Rollout.empty(np.int64(3), h).batch_size) == (3, 4)


@pytest.mark.parametrize("horizon", ["bool", "np.bool_", "bool tensor", "float tensor", "1-d tensor", "np.float"])
def test_empty_refuses_horizons_that_are_not_integers(horizon):
    np = pytest.importorskip("numpy")
    h = {"bool": True, "np.bool_": np.bool_(True), "bool tensor": torch.tensor(True),
         "float tensor": torch.tensor(4.0), "1-d tensor": torch.tensor([4]), "np.float": np.float64(4.0)}[horizon]
    with pytest.raises(ValueError, match="horizon must be a non-negative int"):
        Rollout.empty(3, h)


@pytest.mark.parametrize("field", ["rewards", "values", "log_probs", "bootstrap_values", "terminated"])
def test_record_refuses_complex_values_naming_the_field(field):
    np = pytest.importorskip("numpy")
    ro = Rollout.empty(2, 4)
    before = getattr(ro, field).clone()
    for value in (np.array([1 + 2j, 0]), torch.ones(2, dtype=torch.complex64), [1j, 0.0]):
        with pytest.raises(TypeError, match=f"{field} at step 1 must be real.*complex"):
            ro.record(1, **{field: value})
    torch.testing.assert_close(getattr(ro, field), before, rtol=0, atol=0, equal_nan=True)  # nothing written


def test_bootstrap_takes_numpy_arrays_as_record_does():
    np = pytest.importorskip("numpy")
    a, b = _collected(), _collected()
    a.bootstrap(np.array([1.0, 2.0, 3.0]))
    b.bootstrap(torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(a.bootstrap_values, b.bootstrap_values, rtol=0, atol=0, equal_nan=True)
    _same_results(a.gae(0.9, 0.8, backend="torch"), b.gae(0.9, 0.8, backend="torch"))
    with pytest.raises(ValueError, match=r"last_values must have shape \(3,\)"):
        _collected().bootstrap(np.zeros(4))
    with pytest.raises(TypeError, match="last_values must be real"):
        _collected().bootstrap(np.ones(3, dtype=np.complex128))
    one = Rollout.empty((), 3)  # no batch dims: V(s_T) is a 0-d array or a NumPy scalar
    one.bootstrap(np.float32(5.0))
    assert one.bootstrap_values[-1].item() == 5.0


def test_a_window_recorded_again_must_be_closed_again():
    """A second window recorded over a closed one does not reuse the first window's V(s_T): an estimator
    that reads the window end refuses it until bootstrap() closes the new window (passing the old
    value again is the explicit way to keep it); one that does not read it runs."""
    ro = Rollout.empty(2, 3)
    for t in range(3):
        ro.record(t, rewards=torch.ones(2), values=torch.zeros(2), terminated=torch.zeros(2, dtype=torch.bool))
    ro.bootstrap(torch.full((2,), 5.0))
    first = ro.gae(0.9, 0.8, backend="torch")
    ro.record(0, rewards=torch.full((2,), 2.0))
    for method in (lambda: ro.gae(0.9, 0.8), lambda: ro.discounted_returns(0.9)):
        with pytest.raises(ValueError, match=r"recorded again since Rollout\.bootstrap closed it"):
            method()
    ro.gae(0.9, 0.8, window_end="terminal")  # the window end is not read
    ro.discounted_returns(0.9, bootstrap=False)
    ro.bootstrap(torch.full((2,), 5.0))
    again = ro.gae(0.9, 0.8, backend="torch")
    assert torch.allclose(again.advantages[:, 1:], first.advantages[:, 1:])
    assert not torch.allclose(again.advantages[:, 0], first.advantages[:, 0])


def test_record_takes_flags_by_the_estimators_rule():
    """Flags are bool, uint8 or floating point (nonzero = set), as every estimator reads them; an
    int64 flag is refused naming the field, as the estimators refuse it."""
    ro = Rollout.empty(2, 3)
    with pytest.raises(TypeError, match="terminated at step 0 must be a bool, uint8 or floating-point"):
        ro.record(0, terminated=torch.tensor([0, 2]))
    with pytest.raises(TypeError, match="truncated"):
        ro.record(0, truncated=[0, 1])
    with pytest.raises(TypeError, match="terminated"):
        F.gae(0.9, 0.8, rewards=torch.zeros(2, 3), values=torch.zeros(2, 3),
              terminated=torch.zeros(2, 3, dtype=torch.int64), window_end="terminal")
    ro.record(1, terminated=torch.tensor([0.0, 0.5]), truncated=np.array([True, False]))
    assert ro.terminated[:, 1].tolist() == [False, True] and ro.truncated[:, 1].tolist() == [True, False]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_empty_on_a_device_that_is_not_there_names_it():
    with pytest.raises(ValueError, match=r"Rollout\.empty: device='cuda'"):
        Rollout.empty(2, 3, device="cuda")
