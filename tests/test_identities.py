"""Identities between the estimators, and the boundary invariances of SPEC §1–2.

Each test relates outputs of a backend to each other (λ = 0 GAE is the TD error, a row equals its
episodes run apart, chained windows equal the unsplit row, masked garbage changes nothing, ...) and,
where the identity alone could hold for two equally wrong outputs, also to the float64 reference or
to a formula written out here. ``BACKENDS`` is ``["torch"]``, ``"numba"`` on a machine without CUDA (the
tensors here live on one device, and the compiled CPU loops take CPU tensors only), and ``"triton"``
when the kernels can run (CUDA, or ``TRITON_INTERPRET=1`` on the CPU); shapes stay small (T ≤ 70)
for the interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch

from rollbuf import functional as F
from rollbuf.backends import numba_available
from rollbuf.testing import (
    assert_close_to_reference,
    assert_matches_reference,
    make_rollout,
    run_estimator,
    window_end_index,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch"]
if DEVICE == "cpu" and numba_available():  # the compiled CPU loops take CPU tensors only
    BACKENDS.append("numba")
if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available():
    BACKENDS.append("triton")
backends = pytest.mark.parametrize("backend", BACKENDS)
pytestmark = pytest.mark.covering  # every pair of parameter values by default; -m exhaustive: the rest

NAMES = ["gae", "lambda_returns", "discounted_returns", "monte_carlo_returns", "vtrace", "retrace",
         "eligibility_traces", "episodic_sums"]
FORWARD = {"eligibility_traces", "episodic_sums"}
BACKWARD = [n for n in NAMES if n not in FORWARD]
PARAMS = {
    "gae": dict(gamma=0.97, lam=0.9),
    "lambda_returns": dict(gamma=0.97, lam=0.8),
    "discounted_returns": dict(gamma=0.95),
    "monte_carlo_returns": dict(gamma=0.95),
    "vtrace": dict(gamma=0.97, lam=0.95, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.2),
    "retrace": dict(gamma=0.97, lam=0.9, c_bar=1.1),
    "eligibility_traces": dict(gamma=0.97, lam=0.9),
    "episodic_sums": dict(),
}
# (p_terminated, p_truncated, p_masked)
MIXES = {"term": (0.1, 0.0, None), "trunc": (0.0, 0.1, None), "term+trunc": (0.1, 0.1, None),
         "term+trunc+mask": (0.1, 0.1, 0.3)}
NAN = float("nan")


def _t(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _rollout(mix, N=3, T=37, seed=0, **kw):
    p_term, p_trunc, p_mask = MIXES[mix]
    return make_rollout(N, T, seed=seed, p_terminated=p_term, p_truncated=p_trunc, p_masked=p_mask,
                        device=DEVICE, **kw)


def _successor_values(f, window_end="bootstrap"):
    """``V'_t`` and ``k_t`` of SPEC §1 written out for an unmasked rollout (float64)."""
    r = f["rewards"].double().cpu()
    v = f["values"].double().cpu()
    bv = f["bootstrap_values"].double().cpu()
    k = f["terminated"].bool().cpu() if f["terminated"] is not None else torch.zeros_like(r, dtype=torch.bool)
    tr = f["truncated"].bool().cpu() if f["truncated"] is not None else torch.zeros_like(k)
    end = torch.zeros_like(k)
    end[..., -1] = True
    if window_end == "terminal":
        k = k | (end & ~tr)
    next_v = torch.cat([v[..., 1:], torch.zeros_like(v[..., :1])], -1)
    vn = torch.where(tr | end, bv, next_v)
    vn = torch.where(k, 0.0, vn)  # terminated: V' is never read (and may be NaN)
    return r, v, k, vn


# ---------------------------------------------------------------------------------------------
# λ = 0, λ = 1, GAE + V, on-policy V-trace, TD(1)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window_end", ["bootstrap", "terminal"])
@pytest.mark.parametrize("mix", ["term", "term+trunc"])
@backends
def test_gae_lambda0_is_one_step_td_error(backend, mix, window_end):
    f = _rollout(mix, seed=1)
    adv, ret = F.gae(0.9, 0.0, window_end=window_end, backend=backend, **_fields(f))
    r, v, _, vn = _successor_values(f, window_end)
    delta = r + 0.9 * vn - v  # vn is 0 where terminated: δ = r + γ(1−k)V' − V
    assert_close_to_reference(adv, delta, f)
    assert_close_to_reference(ret, delta + v, f)


@pytest.mark.parametrize("mix", MIXES)
@backends
def test_gae_lambda1_is_bootstrapped_return_minus_values(backend, mix):
    f = _rollout(mix, seed=2)
    adv = F.gae(0.95, 1.0, backend=backend, **_fields(f)).advantages
    g = F.discounted_returns(0.95, backend=backend, **_fields(f))
    live = _live(f)
    assert_close_to_reference(adv, torch.where(live, g - f["values"], 0.0).double(), f)
    assert_matches_reference("discounted_returns", g, f, gamma=0.95)


@pytest.mark.parametrize("mix", ["term", "term+trunc+mask"])
@backends
def test_gae_lambda1_terminal_is_monte_carlo_minus_values(backend, mix):
    """With no truncation and a terminal window end nothing is bootstrapped: λ = 1 is MC − V."""
    f = _rollout(mix, seed=3)
    f["truncated"] = torch.zeros_like(f["terminated"])
    adv = F.gae(0.95, 1.0, window_end="terminal", backend=backend, **_fields(f)).advantages
    mc = F.discounted_returns(0.95, bootstrap=False, backend=backend, **_mc_fields(f))
    live = _live(f)
    assert_close_to_reference(adv, torch.where(live, mc - f["values"], 0.0).double(), f)
    assert_matches_reference("monte_carlo_returns", mc, f, gamma=0.95)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("mix", MIXES)
@backends
def test_gae_plus_values_is_lambda_returns(backend, mix, lam):
    f = _rollout(mix, seed=4)
    adv, ret = F.gae(0.97, lam, backend=backend, **_fields(f))
    tdl = F.lambda_returns(0.97, lam, backend=backend, **_fields(f))
    live = _live(f)
    assert_close_to_reference(torch.where(live, adv + f["values"], 0.0), tdl.double(), f)
    assert_close_to_reference(ret, tdl.double(), f)
    assert_matches_reference("lambda_returns", tdl, f, gamma=0.97, lam=lam)


@pytest.mark.parametrize("lam", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("mix", MIXES)
@backends
def test_on_policy_vtrace_is_lambda_returns(backend, mix, lam):
    """ρ̄ = c̄ = 1 and π = μ: ρ = 1, c = λ, so vs = TD(λ) returns; pg is the one-step TD of vs."""
    f = _rollout(mix, seed=5)
    vs, pg = F.vtrace(f["log_probs"], 0.97, 1.0, 1.0, None, lam, log_probs=f["log_probs"],
                      backend=backend, **_fields(f))
    tdl = F.lambda_returns(0.97, lam, backend=backend, **_fields(f))
    assert_close_to_reference(vs, tdl.double(), f)
    assert_matches_reference("lambda_returns", vs, f, gamma=0.97, lam=lam)
    if f["mask"] is None:  # pg_t = r_t + γ(1−k_t)·(vs_{t+1} if not done else V'_t) − V_t
        r, v, k, vn = _successor_values(f)
        done = k | f["truncated"].bool().cpu()
        done[..., -1] = True
        vs_next = torch.cat([vs.double().cpu()[..., 1:], torch.zeros_like(vn[..., :1])], -1)
        q = torch.where(done, vn, vs_next)
        assert_close_to_reference(pg, r + 0.97 * torch.where(k, 0.0, q) - v, f)


@pytest.mark.parametrize("mix", MIXES)
@backends
def test_bootstrapped_discounted_is_td1(backend, mix):
    f = _rollout(mix, seed=6)
    g = F.discounted_returns(0.9, backend=backend, **_fields(f))
    td1 = F.lambda_returns(0.9, 1.0, backend=backend, **_fields(f))
    gae1 = F.gae(0.9, 1.0, backend=backend, **_fields(f)).returns
    assert_close_to_reference(g, td1.double(), f)
    assert_close_to_reference(gae1, td1.double(), f)
    assert_matches_reference("discounted_returns", g, f, gamma=0.9)


# ---------------------------------------------------------------------------------------------
# a row with an interior done = its episodes run as separate rows
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("done_at", [0, 1, 17, 35])
@pytest.mark.parametrize("kind", ["terminated", "truncated"])
@pytest.mark.parametrize("name", NAMES)
@backends
def test_row_with_interior_done_equals_its_episodes(backend, name, kind, done_at):
    T = 37
    f = make_rollout(1, T, seed=100 + done_at, p_terminated=0.0, p_truncated=0.0, device=DEVICE)
    f[kind] = f[kind].clone()
    f[kind][0, done_at] = True
    if kind == "truncated":  # the truncation reads V(s'_t) there
        f["bootstrap_values"][0, done_at] = 0.75
    p = PARAMS[name]
    whole = _t(run_estimator(name, f, backend=backend, **p))
    first = _t(run_estimator(name, _cols(f, 0, done_at + 1), backend=backend, **p))
    second = _t(run_estimator(name, _cols(f, done_at + 1, T), backend=backend, **p))
    per_step = whole[:1] if name in FORWARD else whole
    for i, w in enumerate(per_step):
        joined = torch.cat([first[i], second[i]], -1)
        assert_close_to_reference(joined, w.double(), f, name=f"{name}[{i}]")
    if name in FORWARD:  # final: the first episode ends done; the second carries the row's state
        assert torch.equal(first[1], torch.zeros_like(first[1]))
        assert_close_to_reference(second[1], whole[1].double(), name=f"{name}.final")
    assert_matches_reference(name, whole, f, **p)


# ---------------------------------------------------------------------------------------------
# chained windows = the unsplit row
# ---------------------------------------------------------------------------------------------


def _chain_rollout(seed):
    """T = 40: a masked span at 10..14 (garbage, random flags), a termination at 20, sparse flags."""
    f = make_rollout(3, 40, seed=seed, p_terminated=0.05, p_truncated=0.05, device=DEVICE)
    mask = torch.ones(3, 40, dtype=torch.bool, device=DEVICE)
    mask[:, 10:15] = False
    mask[1, 30:36] = False  # row 1: a second masked span
    for k in ("rewards", "values", "log_probs", "target_log_probs", "q_values"):
        f[k] = torch.where(mask, f[k], NAN)
    f["terminated"] = f["terminated"].clone()
    f["truncated"] = f["truncated"].clone()
    f["terminated"][:, 20] = True
    f["terminated"][:, 12] = True  # masked: ignored
    f["mask"] = mask
    # bootstrap values only where read (truncated, not terminated, unmasked; window end)
    end = window_end_index(mask, mask.shape).to(DEVICE)
    read = (f["truncated"] & ~f["terminated"] & mask)
    read |= (torch.arange(40, device=DEVICE) == end.unsqueeze(-1)) & ~f["terminated"]
    gen = torch.Generator().manual_seed(seed)
    f["bootstrap_values"] = torch.where(read, torch.randn(3, 40, generator=gen).to(DEVICE), NAN)
    return f


CUTS = {"after-first": 1, "in-masked-span": 12, "at-masked-span-end": 15, "right-after-done": 21,
        "in-second-masked-span": 33, "before-last": 39}


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
@pytest.mark.parametrize("name", NAMES)
@backends
def test_chained_windows_equal_unsplit_row(backend, name, cut):
    f = _chain_rollout(seed=cut)
    T = f["rewards"].shape[-1]
    p = PARAMS[name]
    a, b = _cols(f, 0, cut), _cols(f, cut, T)
    whole = _t(run_estimator(name, f, backend="reference", **p))
    if name in FORWARD:
        first = run_estimator(name, a, backend=backend, **p)
        second = run_estimator(name, b, backend=backend, initial=first.final, **p)
        joined = (torch.cat([first[0], second[0]], 1), second.final)
    else:
        second, carry = run_estimator(name, b, backend=backend, return_carry=True, **p)
        first, carry_a = run_estimator(name, a, backend=backend, carry=carry, return_carry=True, **p)
        joined = tuple(torch.cat([x, y], -1) for x, y in zip(_t(first), _t(second)))
        _, carry_whole = run_estimator(name, f, backend=backend, return_carry=True, **p)
        assert_close_to_reference(carry_a, carry_whole.double(), name=f"{name} carry")
    for i, (o, e) in enumerate(zip(joined, whole)):
        assert_close_to_reference(o, e, f, name=f"{name}[{i}] chained at {cut}")


@pytest.mark.parametrize("name", BACKWARD)
@backends
def test_three_chained_windows(backend, name):
    """Carries pass through a middle window in both directions of use (carry in and out)."""
    f = _chain_rollout(seed=7)
    p = PARAMS[name]
    c, carry = run_estimator(name, _cols(f, 25, 40), backend=backend, return_carry=True, **p)
    b, carry = run_estimator(name, _cols(f, 11, 25), backend=backend, carry=carry, return_carry=True, **p)
    a = run_estimator(name, _cols(f, 0, 11), backend=backend, carry=carry, **p)
    joined = tuple(torch.cat(parts, -1) for parts in zip(_t(a), _t(b), _t(c)))
    assert_matches_reference(name, joined, f, **p)


# ---------------------------------------------------------------------------------------------
# masked steps: garbage changes nothing; the row equals the row with them deleted
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@backends
def test_masked_garbage_changes_nothing(backend, name):
    f = _rollout("term+trunc+mask", seed=8, features=(2,) if name in FORWARD else None)
    m = f["mask"]
    g = dict(f)
    gen = torch.Generator().manual_seed(1)
    for k in ("rewards", "values", "log_probs", "target_log_probs", "q_values", "x"):
        if k in f:
            other = torch.randn(f[k].shape, generator=gen).to(f[k].dtype).to(DEVICE) * 1e6
            mm = m.reshape(m.shape + (1,) * (f[k].dim() - 2))
            g[k] = torch.where(mm, f[k], other)
    for k in ("terminated", "truncated"):
        flip = torch.rand(m.shape, generator=gen).to(DEVICE) < 0.5
        g[k] = torch.where(m, f[k], flip)
    g["bootstrap_values"] = torch.where(f["bootstrap_values"].isnan(), 1e30, f["bootstrap_values"])
    p = PARAMS[name]
    out_f = _t(run_estimator(name, f, backend=backend, **p))
    out_g = _t(run_estimator(name, g, backend=backend, **p))
    for a, b in zip(out_f, out_g):
        assert torch.equal(a, b), "values or flags at masked steps changed an output"
        assert torch.isfinite(a).all()
    assert_matches_reference(name, out_f, f, **p)


@pytest.mark.parametrize("name", NAMES)
@backends
def test_mask_is_deletion(backend, name):
    """Each row equals the row with its masked steps deleted (outputs 0 at masked steps)."""
    f = _rollout("term+trunc+mask", seed=9, features=(2,) if name in FORWARD else None)
    p = PARAMS[name]
    out = _t(run_estimator(name, f, backend=backend, **p))
    m = f["mask"]
    for n in range(m.shape[0]):
        keep = m[n].nonzero().squeeze(-1)
        row = {k: (None if v is None else v[n:n + 1, keep]) for k, v in f.items()}
        row["mask"] = None
        if keep.numel() == 0:
            for o in out:
                if o.dim() >= 2 and o.shape[1] == m.shape[1]:
                    assert torch.equal(o[n], torch.zeros_like(o[n]))
            continue
        short = _t(run_estimator(name, row, backend=backend, **p))
        for i, (o, s) in enumerate(zip(out, short)):
            if name in FORWARD and i == 1:  # final
                assert_close_to_reference(o[n:n + 1], s.double(), name=f"{name} final, row {n}")
                continue
            assert_close_to_reference(o[n:n + 1, keep], s.double(), row, name=f"{name}[{i}] row {n}")
            masked = o[n, ~m[n]]
            assert torch.equal(masked, torch.zeros_like(masked)), "outputs at masked steps must be 0"


# ---------------------------------------------------------------------------------------------
# unread bootstrap values never leak
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("name", BACKWARD)
@backends
def test_nan_in_unread_bootstrap_slot_leaks_nowhere(backend, name, mix):
    f = _rollout(mix, seed=10)
    end = window_end_index(f["mask"], f["rewards"].shape).to(DEVICE)
    assert (end >= 0).all(), "this test wants a window end in every row"
    bv = f["bootstrap_values"]
    unread = bv.isnan()
    assert unread.any()
    p = PARAMS[name]
    res = {}
    for fill in (NAN, 0.0, -1e30):
        g = dict(f, bootstrap_values=torch.where(unread, fill, bv))
        out, carry = run_estimator(name, g, backend=backend, return_carry=True, **p)
        res[fill] = _t(out) + (carry,)
    for a, b, c in zip(res[NAN], res[0.0], res[-1e30]):
        assert torch.isfinite(a).all(), "a NaN in an unread bootstrap slot reached an output"
        assert torch.equal(a, b) and torch.equal(a, c)
    assert_matches_reference(name, res[NAN][:-1], f, **p)


@backends
@pytest.mark.parametrize("name", [n for n in BACKWARD if n != "monte_carlo_returns"])
def test_all_masked_row_carry_reads_nothing_masked_or_unread(backend, name):
    """A row with no unmasked step: outputs 0, and its carry is V(s_T) of its last column passed
    straight through (what the window before it bootstraps from): no masked flag and no other slot
    is read."""
    f = _rollout("term+trunc+mask", seed=11)
    carries = []
    for flag, fill in ((False, NAN), (True, 0.0)):
        g = dict(f, mask=f["mask"].clone(), terminated=f["terminated"].clone(),
                 bootstrap_values=f["bootstrap_values"].clone())
        g["mask"][1] = False  # row 1 has no unmasked step: nothing of it may be read but V(s_T)
        g["terminated"][1] = flag
        g["bootstrap_values"][1] = fill
        g["bootstrap_values"][1, -1] = 0.375
        out, carry = run_estimator(name, g, backend=backend, return_carry=True, **PARAMS[name])
        for o in _t(out):
            assert torch.equal(o[1], torch.zeros_like(o[1]))
        carries.append(carry[1])
    assert torch.isfinite(carries[0]).all(), f"carry of the all-masked row: {carries[0].tolist()}"
    assert torch.equal(carries[0], carries[1]), "the carry read a masked flag or an unread slot"
    expected = 0.0 if name == "monte_carlo_returns" else 0.375
    assert float(carries[0].reshape(-1)[-1]) == expected  # V-trace: (u, V) = (0, V(s_T))


@pytest.mark.parametrize("name", [n for n in BACKWARD if n != "monte_carlo_returns"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_chaining_over_an_all_masked_window(backend, name):
    """Row 1 of the later window is all masked (e.g. padding): chaining must still equal the row."""
    f = _chain_rollout(seed=13)
    f["mask"][1, 30:] = False  # row 1: steps 30..39 masked, window end 29
    T, cut, v_end = 40, 33, 0.625  # V(s') of row 1's window end = V(s_T): nothing in between
    f["bootstrap_values"][1, 29:] = NAN
    f["bootstrap_values"][1, 29] = v_end
    b = _cols(f, cut, T)
    b["bootstrap_values"] = b["bootstrap_values"].clone()
    b["bootstrap_values"][1, -1] = v_end  # the later window's V(s_T) in its last column
    p = PARAMS[name]
    second, carry = run_estimator(name, b, backend=backend, return_carry=True, **p)
    first = run_estimator(name, _cols(f, 0, cut), backend=backend, carry=carry, **p)
    joined = tuple(torch.cat([x, y], -1) for x, y in zip(_t(first), _t(second)))
    assert_matches_reference(name, joined, f, **p)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _fields(f):
    return {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")}


def _mc_fields(f):
    return {k: f[k] for k in ("rewards", "terminated", "truncated", "mask")}


def _live(f):
    m = f["mask"]
    return torch.ones_like(f["rewards"], dtype=torch.bool) if m is None else m.bool()


def _cols(f, start, stop):
    """Columns ``start:stop`` of every per-step field (``x`` keeps its feature dims)."""
    return {k: (None if v is None else v[:, start:stop]) for k, v in f.items()}
