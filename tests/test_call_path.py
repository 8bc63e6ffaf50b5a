"""The warm call is a few frames: key → plan → scalars checked → launch (docs/architecture.md).

Counted with ``sys.setprofile`` on CPU tensors (the numba backend, what ``auto`` picks there): every
Python function of the package a warm call enters (comprehensions aside) and the deepest stack of
them. Timing is not tested here (benchmarks/ measures it); what is tested is that a repeated call
takes its plan, and that the plan still checks what a layout does not fix.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

import rollbuf
import rollbuf.functional as F
from rollbuf import Rollout, cache, plans
from rollbuf.backends import numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="the warm CPU call runs the numba loops")

ROOT = os.path.dirname(rollbuf.__file__)


def _inputs(N=4, T=128):
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(N, T, generator=g), torch.randn(N, T, generator=g)
    k = torch.rand(N, T, generator=g) < 0.05
    return r, v, k, torch.randn(N, generator=g)


def _count(fn):
    """``(calls, depth)``: the package's Python functions one warm call of ``fn`` enters."""
    for _ in range(3):
        fn()
    n = [0, 0]

    def prof(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(ROOT) and not code.co_name.startswith("<"):
            n[0] += 1
            d, f = 0, frame
            while f is not None:
                d += f.f_code.co_filename.startswith(ROOT)
                f = f.f_back
            n[1] = max(n[1], d)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return tuple(n)


def test_the_warm_calls_are_a_few_frames():
    r, v, k, last = _inputs()
    ro = Rollout.empty(4, 128)
    ro.rewards.copy_(r)
    ro.values.copy_(v)
    ro.terminated.copy_(k)
    ro.bootstrap(last)
    calls, depth = _count(lambda: F.advantages(0.99, 0.95, rewards=r, values=v, terminated=k, bootstrap_values=last))
    assert calls <= 12 and depth <= 5, (calls, depth)
    calls, depth = _count(lambda: ro.gae(0.99, 0.95))
    assert calls <= 15 and depth <= 6, (calls, depth)


def test_a_repeated_call_takes_its_plan_and_checks_its_scalars():
    r, v, k, last = _inputs(3, 17)
    cache.clear()
    kw = dict(rewards=r, values=v, terminated=k, bootstrap_values=last)
    first = F.gae(0.9, 0.8, **kw)
    planned = [p for p in cache.PLANS.values() if isinstance(p, plans.Plan)]
    assert len(planned) == 1
    seen = []
    real = rollbuf.validation.prepare
    try:
        rollbuf.validation.prepare = lambda *a, **k: seen.append(1) or real(*a, **k)
        again = F.gae(0.9, 0.8, **kw)
        assert not seen, "a warm call went through the checked path"
        for bad, err in ((1.5, ValueError), (float("nan"), ValueError), (True, TypeError),
                         (torch.tensor(0.9), TypeError)):
            with pytest.raises(err, match="gamma"):
                F.gae(bad, 0.8, **kw)
        with pytest.raises(TypeError, match="unexpected"):
            F.advantages(0.9, 0.8, **kw, gama=0.9)
        with pytest.raises(TypeError, match="return_carry"):
            F.gae(0.9, 0.8, **kw, return_carry=1)
    finally:
        rollbuf.validation.prepare = real
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)


def test_a_new_layout_is_checked_again():
    """Another shape, dtype, stride or device is another key: the checked path names what is wrong."""
    r, v, k, last = _inputs(3, 17)
    F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, bootstrap_values=last)
    with pytest.raises(ValueError, match="values"):
        F.gae(0.9, 0.8, rewards=r, values=v[:, :-1], terminated=k, bootstrap_values=last)
    with pytest.raises(TypeError, match="terminated"):
        F.gae(0.9, 0.8, rewards=r, values=v, terminated=k.long(), bootstrap_values=last)
    with pytest.raises(ValueError, match="bootstrap_values"):
        F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, bootstrap_values=last[:2])
    t = F.gae(0.9, 0.8, rewards=r.T.contiguous().T, values=v, terminated=k, bootstrap_values=last)
    ref = F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, bootstrap_values=last, backend="reference")
    for a, b in zip(t, ref, strict=True):
        torch.testing.assert_close(a, b.float(), rtol=1e-5, atol=1e-5)


def test_the_cache_holds_no_tensor_of_a_call():
    import gc
    import weakref

    r, v, k, last = _inputs(5, 9)
    refs = [weakref.ref(x) for x in (r, v, k, last)]
    F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, bootstrap_values=last)
    F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, bootstrap_values=last)
    del r, v, k, last
    gc.collect()
    assert all(x() is None for x in refs), "a plan keeps a caller's tensor alive"


def test_a_full_cache_starts_over(monkeypatch):
    cache.clear()
    monkeypatch.setattr(cache, "MAX", 3)
    for T in range(2, 7):
        r, v, k, last = _inputs(2, T)
        F.advantages(0.9, 0.8, rewards=r, values=v, terminated=k, bootstrap_values=last)
        assert len(cache.PLANS) <= 3
    assert math.isfinite(float(F.advantages(0.9, 0.8, rewards=r, values=v, terminated=k,
                                            bootstrap_values=last).sum()))
