"""V-trace's arithmetic: the own-step map of its pair state and its outputs.

Pure arithmetic on clean per-step fields (:mod:`rollbuf.boundary.coefficients` says what clean means and
why the state is chosen so): the torch backend runs these functions on tensors, the Triton kernel
compiles them (:func:`rollbuf.kernels.core.jit_boundary`) and the CPU loop inlines them, from this one
source. ``boot = None``: no step reads a bootstrap value, so ``local = r``.
"""

# ----------------------------------------------------------------------------------------------
# V-trace: u_t = vs_t − V_t = ρ_t(local_t − V_t) + γ·nd_t·(ρ_t·V_{t+1} + c_t·u_{t+1})
#          pg_t = ρpg_t·(local_t + γ·nd_t·(V_{t+1} + u_{t+1}) − V_t)     (q_t = vs_{t+1} if ¬d_t)
# State (u_t, V_t); the map of step t: (u, V) -> (ρ(local − V_t) + γ·nd·c·u + γ·nd·ρ·V, V_t).
# Window end: (u_T, V_T) = (0, V(s_T)).
# ----------------------------------------------------------------------------------------------


def clip(ratio, bar):
    """``min(bar, ratio)``: the primitive :func:`truncated_weights` is written over, here on Python floats. A NaN
    ratio gives NaN (``min`` would give ``bar``: every comparison with NaN is false), an infinite one ``bar``; a
    ``None`` bar gives ``None`` (a weight not asked for). Each backend binds its own, written with its ops
    (:func:`rollbuf.boundary.coefficients.rebind`; numba's is an overload of this one, ``cpu.py``)."""
    if bar is None:
        return None
    return bar if ratio > bar else ratio


def truncated_weights(ratio, lam, rho_bar, c_bar, pg_rho_bar):
    """The truncated importance weights ``(ρ, c, ρ_pg) = (min(ρ̄, r), λ·min(c̄, r), min(ρ̄_pg, r))`` of
    ``r = π/μ``, written once for every backend: V-trace's three and Retrace's trace ``c`` (``ρ̄``, ``ρ̄_pg``
    given as ``None``: those weights ``None``, not computed). ``ratio`` is ``r`` as the backend's :func:`clip`
    takes it: ``r`` itself (Triton, numba, the adjoints) or ``log r`` (the torch path, the float64 loop: their
    clip takes ``exp`` itself, so that a clipped weight's gradient is 0 and never ``0·inf``)."""
    return clip(ratio, rho_bar), lam * clip(ratio, c_bar), clip(ratio, pg_rho_bar)


def vtrace_step(r, v, k, tr, boot, rho, c, gamma):
    """Own-step map ``(p, q, s, a, w)`` of V-trace's pair state (u, V)."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    g = gamma * nd
    return g * c, g * rho, 0.0 * v, rho * (local - v), v


def vtrace_out(r, v, k, tr, boot, rho, c, rho_pg, gamma, u_next, v_next):
    """``(vs_t, pg_t)`` from the step's own fields and the pair state at ``t+1``."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    g = gamma * nd
    u = rho * (local - v) + g * (rho * v_next + c * u_next)
    pg = rho_pg * (local + g * (v_next + u_next) - v)
    return v + u, pg


def vtrace_pg(r, v, k, tr, boot, rho_pg, gamma, vs_next):
    """``pg_t = ρpg_t·(local_t + γ·nd_t·vs_{t+1} − V_t)`` from the next step's target (``vtrace_out``'s
    second output with ``vs_{t+1} = V_{t+1} + u_{t+1}``)."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    return rho_pg * (local + gamma * nd * vs_next - v)
