"""The TD(λ) family's arithmetic: the own-step coefficients of its scan, its outputs, its adjoint's.

Pure arithmetic on clean per-step fields (:mod:`rollbuf.boundary.coefficients` says what clean means and
why the state is chosen so): the torch backend runs these functions on tensors, the Triton kernel
compiles them (:func:`rollbuf.kernels.core.jit_boundary`) and the CPU loop inlines them, from this one
source. ``boot = None``: no step reads a bootstrap value, so ``local = r``.
"""

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
