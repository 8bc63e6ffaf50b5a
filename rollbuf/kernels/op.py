"""The fused kernel as a PyTorch custom op, for ``torch.compile`` and CUDA graphs.

The eager path launches the kernel directly, not through the op (docs/kernel-choices.md, "The
custom op, under torch.compile only"); under ``torch.compile`` the call goes through
``rollbuf::scan``, which Dynamo treats as one opaque node with a fake (meta) implementation for
shapes, so a training step that calls ``rollout.gae()`` compiles with ``fullgraph=True`` and no
graph break.
"""

from __future__ import annotations

import torch

from rollbuf.problem import Family, Problem

_FINAL_OUT = (Family.FORWARD, Family.AFFINE)  # the families whose carry out is their last output, ``final``
_FIELDS = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask", "log_probs",
           "target_log_probs", "q_values", "x")


@torch.library.custom_op("rollbuf::scan", mutates_args=())
def scan(
    rewards: torch.Tensor | None, values: torch.Tensor | None,
    terminated: torch.Tensor | None, truncated: torch.Tensor | None,
    bootstrap_values: torch.Tensor | None, mask: torch.Tensor | None,
    log_probs: torch.Tensor | None, target_log_probs: torch.Tensor | None,
    q_values: torch.Tensor | None, x: torch.Tensor | None, carry: torch.Tensor | None,
    family: str, outputs: str, gamma: float, lam: float, rho_bar: float, c_bar: float,
    pg_rho_bar: float, decay: float, window_end: str, no_bootstrap: bool, want_carry: bool,
    compute_dtype: torch.dtype, out_dtype: torch.dtype, feature_shape: list[int], reverse: bool,
) -> list[torch.Tensor]:
    from rollbuf import kernels

    fields = dict(zip(_FIELDS, (rewards, values, terminated, truncated, bootstrap_values, mask,
                                log_probs, target_log_probs, q_values, x), strict=True))
    p = Problem(family=Family(family), outputs=tuple(outputs.split(",")), fields=fields, gamma=gamma, lam=lam,
                rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, decay=decay,
                window_end=window_end, no_bootstrap=no_bootstrap, carry=carry,
                compute_dtype=compute_dtype, out_dtype=out_dtype, feature_shape=tuple(feature_shape),
                reverse=reverse, want_carry=want_carry)
    outs, c = kernels.run(p)
    return list(outs) + ([c] if c is not None else [])


@scan.register_fake
def _(rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs,
      q_values, x, carry, family, outputs, gamma, lam, rho_bar, c_bar, pg_rho_bar, decay, window_end,
      no_bootstrap, want_carry, compute_dtype, out_dtype, feature_shape, reverse):
    fam = Family(family)
    main = x if fam in _FINAL_OUT else rewards
    N = main.shape[0]
    F = tuple(feature_shape)
    from rollbuf.kernels import output_buffers

    res = output_buffers(main, F, out_dtype, len([o for o in outputs.split(",") if o != "final"]))
    if fam in _FINAL_OUT:
        res.append(main.new_empty((N, *F), dtype=compute_dtype))
    elif want_carry:
        res.append(main.new_empty((N, 2) if fam is Family.VTRACE else (N,), dtype=compute_dtype))
    return res


def run(p: Problem):
    """:func:`rollbuf.kernels.run` through the custom op (same return convention)."""
    f = p.fields
    res = scan(*(f.get(name) for name in _FIELDS), p.carry, str(p.family), ",".join(p.outputs), p.gamma, p.lam,
               p.rho_bar, p.c_bar, p.pg_rho_bar, p.decay, p.window_end, p.no_bootstrap, p.want_carry,
               p.compute_dtype, p.out_dtype, list(p.feature_shape), p.reverse)
    if p.family in _FINAL_OUT:
        return tuple(res), None
    n_out = len(p.outputs)
    return tuple(res[:n_out]), (res[n_out] if p.want_carry else None)
