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
