"""Per-estimator scan coefficients: the boundary rules of docs/semantics.md, written once.

Every estimator is solved as one affine scan over a *state* ``Z`` whose coefficients use only the
step's own fields. The estimator's outputs at step ``t`` are then a local function of the step's own
fields and of the state one step further along the scan (``Z_{t+1}`` backward, ``F_{t−1}``
forward), i.e. an *exclusive* scan. Choosing the state this way removes every "next step" input
(``V_{t+1}``, ``c_{t+1}``, ``q_{t+1}``) from the coefficients, so that:

* masked steps are the scan identity (``α = 0, β = 1``) and "as if deleted" holds exactly: the state
  of the next *unmasked* step flows through them unchanged;
* the window-end bootstrap of every backward estimator enters the **scan carry** ``Z_T`` and never a
  local ``α`` (a step that is *truncated* reads ``bootstrap_values[t]`` in its local term and
  stops the scan, ``β_t = 0``, so the carry cannot be counted twice). A fused kernel may apply
  the carry to the first map in scan order before the scan rather than to the scanned maps after it
  (:func:`rollbuf.kernels.core._fold`): that map becomes ``α + β·Z_T``, the same composition, the
  carry still weighed once by that step's ``β``;
* chaining two windows is passing one state: the carry out of a window is its state at its first
  step, ``Z_0``, and that is exactly the ``Z_T`` the preceding window needs.

The functions below are pure arithmetic so that the same source runs on torch tensors (the
``torch`` backend) and is compiled by ``triton.jit`` into the fused kernels. Their inputs are
*clean* per-step fields: flags as 0/1 floats, ``boot`` already 0 wherever it is not read (only
truncated steps read it), everything 0 at masked steps. Masked steps are turned into the identity
by the caller (:func:`mask_identity` in the torch backend, the kernel's loader on the GPU).

Notation: ``k`` terminated, ``tr`` truncated (raw flag), ``nd = (1−k)(1−tr)`` "not done",
``(1−k)·tr`` the truncation-bootstrap weight (terminated wins), ``local = r + γ(1−k)·tr·boot``.
``boot = None`` says that no step reads a bootstrap value (no truncations, or no per-step values):
then ``local = r``. A fused kernel passes it for an absent field, so that the term is not computed
as ``γ(1−k)·0·0``, which the compiler may not fold (``x·0`` is not 0 for ``x`` = NaN or Inf).

=================  =====================  ===========================  ===========================
estimator          state ``Z_t``          ``α_t``, ``β_t``              output at ``t``
=================  =====================  ===========================  ===========================
TD(λ) / GAE        ``(1−λ)V_t + λG_t``    ``(1−λ)V + λ·local``,         ``G = local + γ·nd·Z_{t+1}``,
                                          ``γλ·nd``                     ``A = G − V``
discounted, boot.  TD(1): ``G_t``         ``local``, ``γ·nd``            ``G`` as above
discounted, MC     ``G_t``                ``r``, ``γ·nd`` (boot ≡ 0)     ``G = r + γ·nd·Z_{t+1}``
Retrace            ``V_t + c_t(Q_t−q_t)`` ``V + c(local − q)``, ``γ·nd·c``  ``Q = local + γ·nd·Z_{t+1}``
V-trace (pair)     ``(u_t, V_t)``         see :func:`vtrace_step`      see :func:`vtrace_out`
traces / sums      ``F_t = nd·e_t``       ``nd·x``, ``decay·nd``         ``e = x + decay·F_{t−1}``
traces, no mask    ``e_t`` itself         ``x``, ``decay·nd_{t−1}``      ``e``; ``F = nd·e`` carries
=================  =====================  ===========================  ===========================
"""

from __future__ import annotations

import attrs

# ----------------------------------------------------------------------------------------------
# The scan operator. An element (a, b) is the affine map y -> a + b*y. ``compose(outer, inner)``
# is outer∘inner: apply ``inner`` first. Backward scans compose earlier∘later, forward scans
# later∘earlier; both are "the element met later in scan order is the outer one".
# ----------------------------------------------------------------------------------------------


def compose(a_outer, b_outer, a_inner, b_inner):
    """(a_o, b_o) ∘ (a_i, b_i) = (a_o + b_o·a_i, b_o·b_i)."""
    return a_outer + b_outer * a_inner, b_outer * b_inner


def compose_pair(p_o, q_o, s_o, a_o, w_o, p_i, q_i, s_i, a_i, w_i):
    """Composition of maps on the pair state (u, V): ``(u, V) -> (a + p·u + q·V, w + s·V)``.

    Upper-triangular 2×2 affine maps are closed under composition; V-trace needs them because
    its recursion weighs the next value ``V_{t+1}`` (by ``ρ_t``) and the next correction
    ``u_{t+1}`` (by ``c_t``) differently.
    """
    return (
        p_o * p_i,
        p_o * q_i + q_o * s_i,
        s_o * s_i,
        a_o + p_o * a_i + q_o * w_i,
        w_o + s_o * w_i,
    )


# ----------------------------------------------------------------------------------------------
# TD(λ) family: TD(λ) returns, GAE (A = G − V), bootstrapped discounted returns (λ = 1) and
# Monte-Carlo returns (λ = 1 with boot ≡ 0 and V ≡ 0: a truncation then simply cuts).
#   G_t = local_t + γ·nd_t·Z_{t+1},   Z_t = (1−λ)V_t + λG_t
# Interior step: G_t = r_t + γ[(1−λ)V_{t+1} + λG_{t+1}]           (TD(λ), d_t = 0)
# Done step:     G_t = r_t + γ(1−k_t)·boot_t                       (d_t = 1)
# Window end:    Z_T = V(s_T) = bootstrap value (or 0 if terminal), so G_{T−1} = r + γ(1−k)V'.
# ----------------------------------------------------------------------------------------------


def lambda_step(r, v, k, tr, boot, gamma, lam):
    """Own-step coefficients (α_t, β_t) of ``Z_t = (1−λ)V_t + λG_t``."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    return (1.0 - lam) * v + lam * local, gamma * lam * nd


def lambda_out(r, k, tr, boot, gamma, z_next):
    """``G_t = r_t + γ(1−k_t)tr_t·boot_t + γ·nd_t·Z_{t+1}`` (TD(λ) return, Retrace target)."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    return local + gamma * nd * z_next


# ----------------------------------------------------------------------------------------------
# Retrace(λ):  Q_t = local_t + γ·nd_t·[V_{t+1} + c_{t+1}(Q_{t+1} − q_{t+1})]
# State W_t = V_t + c_t(Q_t − q_t) uses only step t's own V, c, q:
#   W_t = V_t + c_t(local_t − q_t) + γ·nd_t·c_t·W_{t+1},   Q_t = local_t + γ·nd_t·W_{t+1}
# Window end: W_T = V(s_T) (there is no step T to take c_T from; so Q_{T−1} = r + γ(1−k)V').
# Chaining: W_0 of the next window = V_0 + c_0(Q_0 − q_0) carries c_0 and q_0 with it.
# ----------------------------------------------------------------------------------------------


def retrace_step(r, v, k, tr, boot, q, c, gamma):
    """Own-step coefficients of ``W_t = V_t + c_t(Q^ret_t − q_t)``; ``c = λ·min(c̄, ratio)``."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    return v + c * (local - q), gamma * nd * c


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


# ----------------------------------------------------------------------------------------------
# Forward estimators: eligibility traces (decay = γλ) and episodic sums (decay = 1).
#   e_t = x_t + decay·(1−d_{t−1})·e_{t−1}.  State F_t = nd_t·e_t (what step t hands on):
#   F_t = nd_t·x_t + decay·nd_t·F_{t−1},   e_t = x_t + decay·F_{t−1},   F_{−1} = initial,
#   final = F_{T−1} = (1−d_{T−1})·e_{T−1}  (already reset, so it chains as the next `initial`).
# ----------------------------------------------------------------------------------------------


def trace_step(x, k, tr, decay):
    nd = (1.0 - k) * (1.0 - tr)
    return nd * x, decay * nd


def trace_out(x, decay, f_prev):
    return x + decay * f_prev


def trace_next_step(x, k_prev, tr_prev, decay):
    """Own-step coefficients of the trace itself, ``e_t = x_t + decay·nd_{t−1}·e_{t−1}``, where the
    step before is the one before in memory (no mask); at a row's first step ``k_prev = tr_prev =
    0``: the carry in is ``F_{−1}``, already reset. ``F_t = nd_t·e_t`` (:func:`trace_state`)."""
    return x, decay * (1.0 - k_prev) * (1.0 - tr_prev)


def trace_state(e, k, tr):
    """``F_t = nd_t·e_t``: what step t hands on (the row's ``final`` at its last step)."""
    return (1.0 - k) * (1.0 - tr) * e


# ----------------------------------------------------------------------------------------------
# The adjoint of the TD(λ) family (its backward pass). The outputs G_t = local_t + c_t·Z_{t+1}
# (c = γ·nd) and the scan Z_t = α_t + λc_t·Z_{t+1} are linear in the inputs and β reads none of
# them, so with Ḡ_t = ∂L/∂G_t (ḡ_A + ḡ_G for GAE) and W_t = ∂L/∂Z_t:
#   U_t = W_{t+1} = c_t·Ḡ_t + λc_t·U_{t−1}     a *forward* scan, U_{−1} = W_0 (carry-out gradient)
#   r̄_t = Ḡ_t + λW_t,  V̄_t = (1−λ)W_t − ḡ_A,t  with W_t = U_{t−1}, the exclusive state;
#   W_T = U_{T−1} is the gradient of the window-end carry; boot̄_t = γ(1−k)tr·r̄_t where read.
# ----------------------------------------------------------------------------------------------


def lambda_adjoint_step(g, k, tr, gamma, lam):
    """Own-step coefficients of the adjoint scan ``U_t = c_t·Ḡ_t + λc_t·U_{t−1}``, ``c = γ·nd``."""
    c = gamma * (1.0 - k) * (1.0 - tr)
    return c * g, lam * c


def lambda_adjoint_out(g, g_adv, lam, w):
    """``(r̄_t, V̄_t)`` from ``Ḡ_t``, ``ḡ_A,t`` and ``W_t = ∂L/∂Z_t``."""
    return g + lam * w, (1.0 - lam) * w - g_adv


# ----------------------------------------------------------------------------------------------
# One row of the boundary-model table (docs/semantics.md). The rows themselves live in the estimator
# registry (rollbuf.estimators), one per estimator.
# ----------------------------------------------------------------------------------------------


@attrs.frozen
class EstimatorSpec:
    name: str
    direction: str  # "backward" | "forward"
    state: str  # the scanned state
    alpha: str
    beta: str
    output: str
    window_end: str  # where the window-end bootstrap goes
    carry: str  # what chains two windows
    outputs: tuple[str, ...]


#: The local term every backward estimator's α and output read (the docs table's footnote).
LOCAL_TERM = "local_t = r_t + γ(1−k_t)·tr_t·B_t"
