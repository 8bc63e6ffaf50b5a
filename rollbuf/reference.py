"""The ``reference`` backend: the float64 oracle that every other backend is tested against.

Each estimator is a plain sequential loop over time, one row at a time, on Python floats (float64),
written to read like the recursions of docs/semantics.md. It is deliberately slow and uses no scan, no
vectorisation and no shared algebraic rewrite with the other backends (the truncated importance weights aside:
V-trace's ``truncated_weights``, over the loops' own clip).

Assumptions (the caller has validated the inputs):

* every per-step tensor is ``[N, T]`` (batch already flattened); ``x`` of the forward estimators may be
  ``[N, T, *F]``; flags are bool tensors or ``None`` (= all False); ``mask`` is a bool ``[N, T]`` tensor
  or ``None`` (= all True);
* ``bootstrap_values`` is ``[N, T]``, ``[N]`` (the window-end value of each row only) or ``None``;
* ``gamma``, ``lam``, ``rho_bar``, ``c_bar``, ``pg_rho_bar`` are Python numbers.

Gradients: when a floating input requires grad (and grad mode is on), the same loops run on 0-d
float64 tensors instead of Python floats, so autograd records them step by step (slow, exact: this
is what ``gradcheck`` of the ``reference`` backend checks). A clipped ratio ``min(c̄, ratio)`` is
differentiated as ``torch.clamp`` is, like on the other backends: where the clip is active (``ratio >
c̄``) its value is ``c̄`` and its gradient 0 — a zero that reaches the log-probabilities, so they get a
gradient tensor even when every step is clipped, and never ``0·inf`` from an overflowed ``exp`` —; at
the threshold and below, the ratio's own gradient passes.

Boundaries follow docs/semantics.md literally:

* **mask**: the unmasked steps of a row are compacted, the recursion runs on the compacted row, the
  results are scattered back; masked steps give 0 and nothing at a masked step is ever read;
* **terminated wins** over truncated: a terminated step never reads a successor value;
* **window end** (last unmasked step): with ``window_end="bootstrap"`` it bootstraps from
  ``bootstrap_values`` unless terminated; with ``window_end="terminal"`` it is treated as terminated
  and ``bootstrap_values`` is not read there, unless the caller flagged that step truncated: an
  explicit flag wins over the window-end default, so it bootstraps from ``bootstrap_values[n, t]``;
* ``bootstrap_values`` is read only at a truncated step or at a bootstrapped window end, so a NaN in any
  other slot cannot leak;
* backward recursions treat the window end as done (``d := 1``); the forward ones (eligibility traces,
  episodic sums) do not: there ``d`` is terminated or truncated only, and ``final = (1 - d_last) e_last``
  with "last" the last unmasked step (``final = initial`` for a row with no unmasked step).
"""

from rollbuf.kernels.affine.reference import affine_scan
from rollbuf.kernels.retrace.reference import retrace
from rollbuf.kernels.td_lambda.reference import discounted_returns, gae, lambda_returns
from rollbuf.kernels.traces.reference import eligibility_traces, episodic_sums
from rollbuf.kernels.vtrace.reference import vtrace

__all__ = [
    "gae",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_sums",
    "affine_scan",
]
