"""The window rules (rollbuf.windows) against plain loops, and the kernels' in-register version of
them against the module: where each row's window ends, where bootstrap_values is read, and the
window-end value V(s_T) that enters the scan carry."""

from __future__ import annotations

import pytest
import torch

from rollbuf import backends, windows
from rollbuf import functional as F
from rollbuf.testing import make_rollout

BACKENDS = (["torch"] + (["numba"] if backends.numba_available() else [])
            + (["triton"] if backends.triton_available() else []))


def _loop_window_end(mask, N, T):
    out = []
    for n in range(N):
        live = [t for t in range(T) if mask is None or bool(mask[n, t])]
        out.append(live[-1] if live else -1)
    return out


@pytest.mark.parametrize("T", [0, 1, 2, 17, 64])
@pytest.mark.parametrize("p_masked", [None, 0.3, 0.9, 1.0])
def test_window_end_index_is_the_last_unmasked_step(T, p_masked):
    f = make_rollout(5, T, seed=T, p_masked=p_masked)
    got = windows.window_end_index(f["mask"], (5, T))
    assert got.tolist() == _loop_window_end(f["mask"], 5, T)


@pytest.mark.parametrize("seed", range(4))
def test_bootstrap_read_is_truncated_not_terminated_unmasked(seed):
    f = make_rollout(4, 29, seed=seed, p_terminated=0.3, p_truncated=0.3, p_masked=0.3)
    got = windows.bootstrap_read(f["terminated"], f["truncated"], f["mask"])
    for n in range(4):
        for t in range(29):
            want = bool(f["truncated"][n, t]) and not bool(f["terminated"][n, t]) and bool(f["mask"][n, t])
            assert bool(got[n, t]) == want, (n, t)
    assert windows.bootstrap_read(f["terminated"], None, f["mask"]) is None


@pytest.mark.parametrize("per_step", [True, False], ids=["boot-NT", "boot-N"])
@pytest.mark.parametrize("seed", range(3))
def test_window_end_value_against_a_loop(per_step, seed):
    N, T = 6, 23
    f = make_rollout(N, T, seed=seed, p_terminated=0.3, p_masked=0.5)
    bv = f["bootstrap_values"] if per_step else torch.randn(N, dtype=torch.float32)
    got = windows.window_end_value(bv, f["terminated"], f["mask"], (N, T))
    for n, j in enumerate(_loop_window_end(f["mask"], N, T)):
        col = j if j >= 0 else T - 1
        k_end = j >= 0 and bool(f["terminated"][n, j])
        want = 0.0 if k_end else float(bv[n, col] if per_step else bv[n])
        assert float(got[n]) == pytest.approx(want, nan_ok=True), n


def test_window_end_value_of_an_empty_window():
    bv = torch.tensor([1.5, -2.0])
    assert windows.window_end_value(bv, None, None, (2, 0)).tolist() == [1.5, -2.0]
    assert windows.window_end_value(torch.zeros(2, 0), None, None, (2, 0)).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_step", [True, False], ids=["boot-NT", "boot-N"])
@pytest.mark.parametrize("T", [1, 5, 37])
def test_backends_read_the_window_end_where_the_module_says(backend, per_step, T):
    """With r = 0 and γ = 1, the return at each row's window-end step is exactly the window-end
    value that entered the scan carry (0 where that step terminated, ``bootstrap_values`` at it
    where it is truncated): so the backend found the same window end and the same value as
    rollbuf.windows. The triton backend finds the window end of a masked row in the kernel."""
    N = 7
    f = make_rollout(N, T, seed=T + per_step, p_terminated=0.2, p_truncated=0.0, p_masked=0.5)
    r = torch.zeros(N, T)
    bv = f["bootstrap_values"] if per_step else torch.randn(N)
    tr = torch.zeros(N, T, dtype=torch.bool)
    if per_step:  # truncations anywhere, also at window ends (they read their own column)
        tr = torch.rand(N, T, generator=torch.Generator().manual_seed(T)) < 0.2
        bv = torch.where(windows.bootstrap_read(f["terminated"], tr, f["mask"]), torch.randn(N, T), bv)
    ends = windows.window_end_index(f["mask"], (N, T))
    want = windows.window_end_value(bv, f["terminated"], f["mask"], (N, T))
    bv_end = bv.gather(-1, ends.clamp(min=0).unsqueeze(-1)).squeeze(-1) if per_step else bv
    # a NaN bootstrap column at a terminated window end must not leak: keep only what is read
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    ret = F.lambda_returns(1.0, 0.5, rewards=r.to(dev), values=torch.zeros(N, T, device=dev),
                           terminated=f["terminated"].to(dev), truncated=tr.to(dev), bootstrap_values=bv.to(dev),
                           mask=None if f["mask"] is None else f["mask"].to(dev), backend=backend).cpu()
    for n in range(N):
        j = int(ends[n])
        if j < 0:
            continue
        k = bool(f["terminated"][n, j])
        expect = 0.0 if k else float(bv_end[n])
        assert float(want[n]) == pytest.approx(expect, nan_ok=True)
        assert float(ret[n, j]) == pytest.approx(float(want[n]), abs=1e-6), (n, j)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_window_carry_is_the_window_end_value(backend):
    """A T = 0 window passes V(s_T) straight through as its carry on every backend (chaining an
    empty window changes nothing)."""
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    bv = torch.tensor([0.5, -1.25, 3.0], device=dev)
    _, carry = F.gae(0.9, 0.8, rewards=torch.zeros(3, 0, device=dev), values=torch.zeros(3, 0, device=dev),
                     terminated=torch.zeros(3, 0, dtype=torch.bool, device=dev), bootstrap_values=bv,
                     return_carry=True, backend=backend)
    assert carry.tolist() == bv.tolist()


# ---------------------------------------------------------------------------------------------
# an empty window's carry is V(s_T): a [*B, 0] bootstrap_values has no column for it
# ---------------------------------------------------------------------------------------------

ALL_BACKENDS = (["reference", "torch"] + (["numba"] if backends.numba_available() else [])
                + (["triton"] if backends.triton_available() else []))


def _empty_window_call(name, T, cut, dev, bootstrap_values, **kw):
    """``name`` on steps ``cut:`` of the reproducer's row (r = 1, V = 0, γ = λ = 1, no flags)."""
    r, v = torch.ones(1, T, device=dev), torch.zeros(1, T, device=dev)
    k = torch.zeros(1, T, dtype=torch.bool, device=dev)
    s = slice(cut, None)
    args = dict(rewards=r[:, s], values=v[:, s], terminated=k[:, s], bootstrap_values=bootstrap_values, **kw)
    if name in ("vtrace", "retrace"):
        args.update(log_probs=v[:, s], target_log_probs=v[:, s])
    if name == "retrace":
        args.update(q_values=v[:, s])
    params = dict(gamma=1.0) if name in ("discounted_returns", "vtrace", "retrace") else dict(gamma=1.0, lam=1.0)
    return getattr(F, name)(**params, **args)


@pytest.mark.parametrize("name", ["gae", "advantages", "lambda_returns", "discounted_returns", "vtrace", "retrace"])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_empty_window_with_per_step_bootstrap_values_refuses_its_carry(backend, name):
    """A T = 0 window's carry is V(s_T) itself; bootstrap_values of shape [*B, 0] has no column for
    it, so return_carry=True is a ValueError naming bootstrap_values and the [*B] column to pass
    (it used to return 0: the window before it then bootstrapped from 0)."""
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    b = torch.full((1, 3), 10.0, device=dev)
    with pytest.raises(ValueError, match=r"bootstrap_values of shape \(1, 0\).*\[\*B\] column"):
        _empty_window_call(name, 3, 3, dev, b[:, 3:], return_carry=True, backend=backend)
    if backend == "reference":  # whole windows only: nothing to chain
        return
    # the [*B] column passes V(s_T) through, and chaining at the split k = T is the one-shot row
    _, carry = _empty_window_call(name, 3, 3, dev, b[:, 2], return_carry=True, backend=backend)
    want = [[0.0, 10.0]] if name == "vtrace" else [10.0]
    assert carry.tolist() == want
    chained = _empty_window_call(name, 3, 0, dev, None, carry=carry, backend=backend)
    one_shot = _empty_window_call(name, 3, 0, dev, b, backend=backend)
    for a, c in zip(chained if isinstance(chained, tuple) else (chained,),
                    one_shot if isinstance(one_shot, tuple) else (one_shot,)):
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    if name in ("gae", "lambda_returns", "discounted_returns"):
        assert (one_shot.returns if name == "gae" else one_shot).tolist() == [[13.0, 12.0, 11.0]]
    # what stays as it was: no carry asked for, a terminal window end, Monte-Carlo returns
    out = _empty_window_call(name, 3, 3, dev, b[:, 3:], backend=backend)
    assert all(o.shape == (1, 0) for o in (out if isinstance(out, tuple) else (out,)))
    _, zero = _empty_window_call(name, 3, 3, dev, b[:, 3:], window_end="terminal", return_carry=True,
                                 backend=backend)
    assert not zero.any()
    if name == "discounted_returns":
        _, zero = _empty_window_call(name, 3, 3, dev, b[:, 3:], bootstrap=False, return_carry=True,
                                     backend=backend)
        assert not zero.any()


def test_interior_truncation_names_a_missing_truncated():
    """``windows.interior_truncation`` reads the truncations: without them it says so (it raised an
    AttributeError on ``None`` before)."""
    k = torch.zeros(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="truncated"):
        windows.interior_truncation(k, None, None)
    tr = k.clone()
    tr[0, 1] = tr[1, 4] = True
    assert windows.interior_truncation(k, tr, None).tolist() == [[False, True, False, False, False], [False] * 5]
