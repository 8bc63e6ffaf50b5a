"""The ``triton`` backend: the fused kernels of :mod:`rollbuf.kernels`.

* eager, no gradients: :func:`rollbuf.kernels.run`, the launch cached under the call's signature
  (Triton's JIT call by keyword);
* eager, inputs that require grad: the kernel as one autograd node whose backward is the family's
  analytic adjoint (:mod:`rollbuf.backends.autograd`);
* under ``torch.compile``: the custom op ``rollbuf::scan`` (:mod:`rollbuf.kernels.op`), one opaque
  node for Dynamo; with gradients, the torch backend, traced and differentiated by AOTAutograd (the
  fused kernel has no traceable backward);
* ``Family.GENERIC`` estimators: their coefficients in torch, the scan on the fused kernel.
"""

from __future__ import annotations

import torch

from rollbuf import kernels
from rollbuf.backends import autograd, torch_backend
from rollbuf.kernels import op
from rollbuf.problem import Family, Problem

__all__ = ["run", "plain_run"]


def plain_run(p: Problem):
    """The forward computation, no autograd: ``(outputs, carry)``."""
    if p.family == Family.GENERIC:
        return torch_backend.run(p, fused=True)
    shape = p.main.shape
    if not (shape[0] and shape[1]):  # nothing to launch: empty outputs, the carry passed through
        return torch_backend.run(p)
    outs, carry = kernels.run(p)
    if p.family in (Family.FORWARD, Family.AFFINE):  # (y, final): final is an output here
        return tuple(outs), None
    return tuple(outs), carry


def run(p: Problem):
    if torch.compiler.is_compiling():
        if autograd.needs_grad(p) or p.family == Family.GENERIC:
            return torch_backend.run(p)
        return op.run(p)
    if autograd.needs_grad(p):
        return autograd.run(p, plain_run)
    return plain_run(p)

