"""The backend seam: one validated :class:`~rollbuf.problem.Problem` in, ``(outputs, carry)`` out.

==============  ==============================================  =================================
backend         module                                          runs on
==============  ==============================================  =================================
``reference``   :mod:`rollbuf.backends.reference`               the float64 loops (the oracle)
``torch``       :mod:`rollbuf.backends.torch_backend`           any device: a vectorised scan
``triton``      :mod:`rollbuf.backends.triton_backend`          CUDA (CPU under TRITON_INTERPRET=1)
==============  ==============================================  =================================

``auto`` is ``triton`` for CUDA tensors (when Triton is importable) and ``torch`` otherwise.
Gradients: the torch backend is differentiable as it stands; the triton backend wraps its kernel
in an autograd node with an analytic backward (:mod:`rollbuf.backends.autograd`). Outputs come
back flat (``[N, T]``, ``[N, T, *F]``), in the accumulation dtype or the output dtype; the caller
(:mod:`rollbuf.validation`) restores the batch shape and the output dtype.
"""

from __future__ import annotations

import importlib.util
import os

from rollbuf.backends import reference, torch_backend
from rollbuf.problem import Problem

__all__ = ["BACKENDS", "resolve", "run", "triton_available"]

BACKENDS = ("auto", "triton", "torch", "reference")


_TRITON = importlib.util.find_spec("triton") is not None  # found once, without importing it


def triton_available() -> bool:
    """Whether the triton package is installed (the ``triton`` backend's requirement)."""
    return _TRITON


def resolve(backend: str, device) -> str:
    """The concrete backend for ``backend`` on ``device`` (errors name the argument)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package, which is not importable")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"backend='triton' runs on CUDA tensors (got {device}); on the CPU set "
                "TRITON_INTERPRET=1 before importing rollbuf, or use backend='torch'"
            )
    return backend


def run(p: Problem, backend: str):
    """Run ``p`` on the concrete ``backend`` (from :func:`resolve`): ``(outputs, carry)``."""
    if backend == "torch":
        return torch_backend.run(p)
    if backend == "triton":
        from rollbuf.backends import triton_backend  # imports triton: only when asked for

        return triton_backend.run(p)
    if backend == "reference":
        return reference.run(p)
    raise ValueError(f"no backend {backend!r}; resolve() it first")
