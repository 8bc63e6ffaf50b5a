"""The ``reference`` backend: the float64 loops of :mod:`rollbuf.reference`, reached through each
estimator's registry entry (``Estimator.reference``). Whole windows only: no ``carry=`` (except a
forward estimator's ``initial``) and no ``return_carry=True``."""

from __future__ import annotations

from rollbuf import reference as loops
from rollbuf.problem import Family, Problem

__all__ = ["run"]


def run(p: Problem):
    """``(outputs, None)`` in float64 (the caller casts to the output dtype)."""
    if (p.carry is not None and p.family not in (Family.FORWARD, Family.AFFINE)) or p.want_carry:
        raise ValueError(
            "the reference backend computes whole windows: carry= and return_carry=True are "
            "for the torch and triton backends (chain the windows, or run the whole row)"
        )
    if p.family == Family.AFFINE:
        f, init = p.fields, p.carry
        assert init is not None  # an affine problem always carries y outside the row (0 by default)
        y = loops.affine_scan(f["alpha"], f["beta"], p.reverse, init)
        final = (y[..., 0] if p.reverse else y[..., -1]) if y.shape[-1] else init.to(y.dtype)
        return (y, final), None
    outs = p.estimator.reference(p.fields, p)
    return (tuple(outs) if isinstance(outs, tuple) else (outs,)), None
