"""Test session set-up: hypothesis profiles, Triton's interpreter on CPU machines, and what runs.

``python -m pytest tests`` (the README's command, run by CI) runs, of each test marked ``covering``
(all of test_kernels.py; test_identities.py; test_autograd.py's gradcheck matrix), a covering
slice of its parametrisation: every parameter value at least once with ``covering(1)``, and with
``covering`` (strength 2) also every pair of values of two parameters that occur together
(tests/covering.py; deterministic, it changes only where the parametrisation does). test_aot.py
compiles a covering slice of the kernel variants the same way. The other cases are marked
``exhaustive`` and deselected. The exhaustive matrix runs on CUDA tensors at the GPU sizes when a
GPU is present (the kernel tests then pick ``cuda`` and Triton compiles the kernels; otherwise they
run on CPU tensors under Triton's interpreter, slowly)::

    python -m pytest tests -m exhaustive          # the cases outside the slices only
    RB_EXHAUSTIVE=1 python -m pytest tests        # everything: the default run and the rest

Tests marked ``gpu`` (full-size rows, > 2^31 elements) or ``multigpu`` (NCCL over two GPUs) run
where the devices are, and are deselected elsewhere (not skipped): the CPU tests cover the same
code paths at small sizes (the kernels under Triton's interpreter, the time-sharded estimators
over gloo).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

from covering import covering

# Profiles: "ci" (default, quick) and "thorough" (>= 1000 examples per property, run by hand:
# HYPOTHESIS_PROFILE=thorough python -m pytest tests -k property).
settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The Triton kernels run on CPU tensors under Triton's interpreter; it must be switched on before
# triton.jit wraps the kernels, i.e. before rollbuf.kernels is imported. On a CUDA machine the
# kernel tests run compiled on the GPU instead.
try:
    import torch

    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

EXHAUSTIVE = os.environ.get("RB_EXHAUSTIVE", "") not in ("", "0")


def parameters(item) -> list:
    """``(parameter, value)`` pairs of a parametrised case: the argument names of one
    ``parametrize`` are one parameter (``"name,T"``), a parametrised fixture another; values by
    their repr."""
    params = item.callspec.params
    groups, seen = [], set()
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        names = tuple(n for n in names if n in params and n not in seen)
        if names:
            groups.append(names)
            seen.update(names)
    groups += [(n,) for n in params if n not in seen]
    return [(",".join(g), repr(tuple(params[n] for n in g))) for g in groups]


@pytest.hookimpl(tryfirst=True)  # before -m selects: the exhaustive marks must be there already
def pytest_collection_modifyitems(config, items):
    """Marks the cases of ``covering`` tests outside their slice ``exhaustive`` (tests marked
    ``gpu`` or ``multigpu`` run whole where they run); deselects ``exhaustive`` unless the ``-m``
    expression names it or ``RB_EXHAUSTIVE=1``, ``gpu`` without a GPU and ``multigpu`` without two
    (see the module docstring)."""
    groups = {}
    for item in items:
        mark = item.get_closest_marker("covering")
        whole = item.get_closest_marker("gpu") or item.get_closest_marker("multigpu")  # cheap where they run
        if mark is not None and not whole and getattr(item, "callspec", None) is not None:
            strength = mark.args[0] if mark.args else mark.kwargs.get("strength", 2)
            groups.setdefault((item.parent.nodeid, item.originalname, strength), []).append(item)
    for (_, _, strength), group in groups.items():
        keep = set(covering({item.nodeid: parameters(item) for item in group}, strength))
        for item in group:
            if item.nodeid not in keep:
                item.add_marker(pytest.mark.exhaustive)
    n_gpu = torch.cuda.device_count() if _cuda else 0
    drop = {"gpu"} if n_gpu == 0 else set()
    if n_gpu < 2:
        drop.add("multigpu")
    if not EXHAUSTIVE and "exhaustive" not in (config.option.markexpr or ""):
        drop.add("exhaustive")
    gone = [it for it in items if any(it.get_closest_marker(m) is not None for m in drop)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        ids = {id(it) for it in gone}
        items[:] = [it for it in items if id(it) not in ids]
