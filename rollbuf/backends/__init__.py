"""The backend seam: one validated :class:`~rollbuf.problem.Problem` in, ``(outputs, carry)`` out.

==============  ==============================================  =================================
backend         module                                          runs on
==============  ==============================================  =================================
``reference``   :mod:`rollbuf.backends.reference`               the float64 loops (the oracle)
``torch``       :mod:`rollbuf.backends.torch_backend`           any device: a vectorised scan
``triton``      :mod:`rollbuf.backends.triton_backend`          CUDA (CPU under TRITON_INTERPRET=1)
``numba``       :mod:`rollbuf.backends.compiled_cpu`            CPU: compiled loops (numba)
==============  ==============================================  =================================

``auto`` is ``triton`` for CUDA tensors (when Triton is importable), ``numba`` for CPU tensors
(when numba is importable), ``torch`` otherwise. The ``numba`` backend computes values: a call
whose inputs require grad, one under ``torch.compile`` and a registry estimator of
``Family.GENERIC`` run on the ``torch`` backend instead (the same semantics, differentiable).
Gradients: the torch backend is differentiable as it stands; the triton backend wraps its kernel
in an autograd node with an analytic backward (:mod:`rollbuf.backends.autograd`). Outputs come
back flat (``[N, T]``, ``[N, T, *F]``), in the accumulation dtype or the output dtype; the caller
(:mod:`rollbuf.validation`) restores the batch shape and the output dtype.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import torch

from rollbuf.backends import autograd, reference, torch_backend
from rollbuf.problem import Family, Problem

__all__ = ["BACKENDS", "resolve", "run", "triton_available", "numba_available"]

BACKENDS = ("auto", "triton", "torch", "reference", "numba")


_GENERIC = Family.GENERIC  # (an enum member read off its class costs a Python-level lookup on 3.11)
_TRITON = importlib.util.find_spec("triton") is not None  # found once, without importing it
_NUMBA = importlib.util.find_spec("numba") is not None


def triton_available() -> bool:
    """Whether the triton package is installed (the ``triton`` backend's requirement)."""
    return _TRITON


def numba_available() -> bool:
    """Whether the numba package is installed (the ``numba`` backend's requirement)."""
    return _NUMBA


def resolve(backend: str, device) -> str:
    """The concrete backend for ``backend`` on ``device`` (errors name the argument)."""
    if backend == "auto":
        kind = device.type
        if kind == "cuda" and _TRITON:
            return "triton"
        return "numba" if kind == "cpu" and _NUMBA else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "numba":
        if not numba_available():
            raise ValueError("backend='numba' needs the numba package, which is not importable")
        if device.type != "cpu":
            raise ValueError(f"backend='numba' runs on CPU tensors (got {device}); use backend='auto'")
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
        if torch.compiler.is_compiling():  # Dynamo runs an import statement as it traces (not importlib's)
            from rollbuf.backends import triton_backend
            return triton_backend.run(p)
        return _module("triton_backend").run(p)  # imports triton: only when asked for
    if backend == "reference":
        return reference.run(p)
    if backend == "numba":
        if autograd.needs_grad(p) or torch.compiler.is_compiling() or p.family == _GENERIC:
            return torch_backend.run(p)
        return _module("compiled_cpu").run(p)  # numba's import costs ~0.5 s: on the first CPU call
    raise ValueError(f"no backend {backend!r}; resolve() it first")


_MODULES: dict = {}


def _module(name: str):
    """The backend module ``rollbuf.backends.<name>``, imported on its first call (an import
    statement run on every call costs a microsecond)."""
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = importlib.import_module(f"rollbuf.backends.{name}")
    return mod

