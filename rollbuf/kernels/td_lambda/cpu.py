"""The TD(λ) family's steps of the compiled CPU loop (:mod:`rollbuf.kernels.loop`)."""

from numba import njit

from rollbuf.kernels.loop import JIT, inline, ld
from rollbuf.kernels.td_lambda import coefficients as C

_lambda_step, _lambda_out, _adjoint_step, _adjoint_out = (inline(fn) for fn in (
    C.lambda_step, C.lambda_out, C.lambda_adjoint_step, C.lambda_adjoint_out))


@njit(**JIT)
def step(data, at, k, tr, boot, prm, z0, z1):
    """TD(λ), GAE, discounted returns (λ = 1), Monte Carlo (boot ≡ 0, V ≡ 0): data (rewards,
    values), outputs (G, A = G − V), state Z = (1−λ)V + λG."""
    r, v = ld(data[0], at, prm[0]), ld(data[1], at, prm[0])
    gamma, lam = prm[2]
    a, b = _lambda_step(r, v, k, tr, boot, gamma, lam)
    g = _lambda_out(r, k, tr, boot, gamma, z0)
    return (a + b * z0, 0.0), (g, g - v)


@njit(**JIT)
def adjoint_step(data, at, k, tr, boot, prm, w, z1):
    """The TD(λ) adjoint, forward: data (∂L/∂G, ∂L/∂A), outputs (r̄, V̄), state W."""
    ga = ld(data[1], at, prm[0])
    g = ld(data[0], at, prm[0]) + ga
    gamma, lam = prm[2]
    a, b = _adjoint_step(g, k, tr, gamma, lam)
    return (a + b * w, 0.0), _adjoint_out(g, ga, lam, w)
