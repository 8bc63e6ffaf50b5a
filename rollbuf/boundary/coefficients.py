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

Each family's coefficient functions live in its folder (``rollbuf/kernels/<family>/coefficients.py``:
``td_lambda``, ``retrace``, ``vtrace``, ``traces``); this module holds what they share, the scan
operators below and the docs table's row type. They are pure arithmetic so that the same source runs
on torch tensors (the ``torch`` backend) and is compiled by ``triton.jit`` into the fused kernels. Their inputs are
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

import types

import attrs


def rebind(fn, **names):
    """A copy of the function ``fn`` (same code) whose globals ``names`` are replaced: how a backend runs a
    coefficient function over its own primitives (Triton's ``tl``, a clip written with the backend's ops)."""
    f = types.FunctionType(fn.__code__, dict(fn.__globals__, **names), fn.__name__, fn.__defaults__, fn.__closure__)
    f.__doc__, f.__module__, f.__qualname__ = fn.__doc__, fn.__module__, fn.__qualname__
    return f


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
# One row of the boundary-model table (docs/semantics.md). The rows themselves are in the registry entries
# (rollbuf/kernels/<family>/estimators.py, gathered by rollbuf.estimators), one per estimator.
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
