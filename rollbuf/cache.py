"""The one cache of the package: plans, by the layout they were built for.

A *plan* is everything about a call that stays the same while its tensors' dtypes, shapes, strides and
devices (and its options) stay the same: validated once, when the layout is first seen, and then reused.
Two kinds of key share it:

* a public estimator call (:class:`rollbuf.plans.Call`): the key is taken where the call starts, from
  its keyword arguments, and the plan holds the backend, the launch and the output layout;
* a kernel launch made inside the package (the backward passes' adjoint kernels and scans, the custom
  op under ``torch.compile``): :func:`rollbuf.kernels.launch_for` keys the launch on the problem's
  layout.

Exact shapes are in the keys: a program whose shapes keep changing (LLM batches) must not grow it
without bound, so it is emptied when it reaches :data:`MAX` entries. Triton's and numba's own caches of
compiled code are theirs, not this one.
"""

from __future__ import annotations

__all__ = ["PLANS", "MAX", "remember", "clear"]

#: key -> plan (see the module docstring).
PLANS: dict = {}
MAX = 4096


def remember(key, plan):
    """Store ``plan`` under ``key`` (the cache emptied first when it is full); returns ``plan``."""
    if len(PLANS) >= MAX:
        PLANS.clear()
    PLANS[key] = plan
    return plan


def clear() -> None:
    """Forget every plan (a test, or a changed registry entry)."""
    PLANS.clear()
