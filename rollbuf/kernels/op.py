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
_SCALARS = ("gamma", "lam", "rho_bar", "c_bar", "pg_rho_bar", "decay")
_FLAGS = ("no_bootstrap", "want_carry", "reverse")


@torch.library.custom_op("rollbuf::scan", mutates_args=())
def scan(fields: list[torch.Tensor | None], carry: torch.Tensor | None, family: str, outputs: str,
         scalars: list[float], flags: list[bool], window_end: str, compute_dtype: torch.dtype,
         out_dtype: torch.dtype, feature_shape: list[int]) -> list[torch.Tensor]:
    """``fields`` in :data:`_FIELDS` order (``None``: absent), ``scalars`` in :data:`_SCALARS` order,
    ``flags`` in :data:`_FLAGS` order: the :class:`~rollbuf.problem.Problem` they describe, run."""
    from rollbuf import kernels

    named: dict = dict(zip(_SCALARS, scalars, strict=True))
    named.update(zip(_FLAGS, flags, strict=True))
    p = Problem(family=Family(family), outputs=tuple(outputs.split(",")),
                fields=dict(zip(_FIELDS, fields, strict=True)), window_end=window_end, carry=carry,
                compute_dtype=compute_dtype, out_dtype=out_dtype, feature_shape=tuple(feature_shape), **named)
    outs, c = kernels.run(p)
    return list(outs) + ([c] if c is not None else [])


@scan.register_fake
def _(fields, carry, family, outputs, scalars, flags, window_end, compute_dtype, out_dtype, feature_shape):
    fam = Family(family)
    f = dict(zip(_FIELDS, fields, strict=True))
    main = f["x"] if fam in _FINAL_OUT else f["rewards"]
    N = main.shape[0]
    F = tuple(feature_shape)
    from rollbuf.kernels import output_buffers

    res = output_buffers(main, F, out_dtype, len([o for o in outputs.split(",") if o != "final"]))
    if fam in _FINAL_OUT:
        res.append(main.new_empty((N, *F), dtype=compute_dtype))
    elif dict(zip(_FLAGS, flags, strict=True))["want_carry"]:
        res.append(main.new_empty((N, 2) if fam is Family.VTRACE else (N,), dtype=compute_dtype))
    return res


def run(p: Problem):
    """:func:`rollbuf.kernels.run` through the custom op (same return convention)."""
    f = p.fields
    res = scan([f.get(name) for name in _FIELDS], p.carry, str(p.family), ",".join(p.outputs),
               [float(getattr(p, s)) for s in _SCALARS], [bool(getattr(p, s)) for s in _FLAGS], p.window_end,
               p.compute_dtype, p.out_dtype, list(p.feature_shape))
    if p.family in _FINAL_OUT:
        return tuple(res), None
    n_out = len(p.outputs)
    return tuple(res[:n_out]), (res[n_out] if p.want_carry else None)
