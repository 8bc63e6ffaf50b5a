"""The float64 oracle's shared row handling: what every reference loop (``rollbuf/kernels/<family>/
reference.py``, gathered in :mod:`rollbuf.reference`) does to a row before its recursion: compact the
unmasked steps, work out each step's ``k``, ``d`` and successor value ``V'`` (docs/semantics.md), read
the entries as Python floats (or 0-d float64 tensors when an input requires grad), and put the results
back into a tensor. It imports nothing of rollbuf, and the loops share no arithmetic with the backends
but the truncated importance weights (V-trace's ``truncated_weights`` over :func:`clip`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Row(NamedTuple):
    """One row with the masked steps deleted; list index ``j`` is the ``j``-th unmasked step."""

    idx: list  # original column t of compacted step j
    r: list  # r_j
    v: list  # V_j (None when values are not needed)
    k: list  # k_j: 1 if terminated (or a terminal window end), else 0
    d: list  # d_j: 1 if done, and 1 at the window end (backward convention)
    vn: list  # successor value V'_j, 0.0 where k_j = 1 (never read there)
    extra: list  # further per-step fields, compacted, in the order given


def kept(mask, n: int, T: int) -> list:
    """The columns of row ``n`` with ``mask = True``, in order: the compacted row."""
    return list(range(T)) if mask is None else [t for t, m in enumerate(mask[n].tolist()) if m]


def exp(x):
    if isinstance(x, torch.Tensor):
        return torch.exp(x)
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def clip(log_ratio, bar: float | None):
    """``min(bar, exp(log_ratio))``, the float64 loops' clip (V-trace's ``truncated_weights`` is written
    over it): NaN for a NaN ratio (Python's ``min`` would return ``bar``), so a NaN log-probability gives
    NaN as on every other backend; an overflowed ``exp`` (inf) gives ``bar``; a ``None`` bar ``None``. On
    0-d tensors (``torch.clamp``'s gradient): where the clip is active the value is ``bar`` plus a zero
    that still depends on ``log_ratio`` (its gradient is 0, not missing, and no ``exp`` that may have
    overflowed is in its graph); elsewhere the ratio itself."""
    if bar is None:
        return None
    ratio = exp(log_ratio)
    if ratio != ratio:  # NaN
        return ratio
    if not ratio > bar:
        return ratio
    if isinstance(log_ratio, torch.Tensor):
        return bar + 0.0 * torch.clamp(log_ratio, max=math.log(bar))
    return bar


def differentiable(*xs) -> bool:
    """Whether the loops must run on tensors (some input requires grad, grad mode on)."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def elems(x: torch.Tensor, diff: bool) -> list:
    """The entries of a 1-D tensor in float64: Python floats, or 0-d tensors that keep the graph."""
    x = x.to(torch.float64)
    return list(x.unbind(0)) if diff else x.tolist()


def num(x: torch.Tensor, diff: bool):
    return x.to(torch.float64) if diff else float(x.to(torch.float64))


def compact(n, fields: tuple, window_end, extra=()):
    """Compact row ``n`` and work out ``k``, ``d`` and the successor value ``V'`` (docs/semantics.md).
    ``fields``: ``(rewards, values, terminated, truncated, bootstrap_values, mask)``."""
    rewards, values, terminated, truncated, bootstrap_values, mask = fields
    assert window_end in ("bootstrap", "terminal"), window_end
    idx = kept(mask, n, rewards.shape[1])
    m = len(idx)
    diff = differentiable(rewards, values, bootstrap_values, *extra)

    def take(x, default=None):  # the compacted row n of a per-step field (floats or 0-d tensors)
        if x is None:
            return [default] * m
        full = elems(x[n], diff and x.is_floating_point())
        return [full[t] for t in idx]

    r, v = take(rewards), take(values)
    term, trunc = take(terminated, 0.0), take(truncated, 0.0)
    k, d, vn = [], [], []
    for j, t in enumerate(idx):
        end = j == m - 1
        # terminated wins over truncated; window_end="terminal" only decides an *unflagged* window
        # end: a last step the caller flagged truncated still bootstraps from its own value
        k_j = bool(term[j]) or (end and window_end == "terminal" and not trunc[j])
        k.append(1 if k_j else 0)
        d.append(1 if (k_j or trunc[j] or end) else 0)
        if k_j or (bootstrap_values is None and values is None):  # nothing to bootstrap from
            vn.append(0.0)
        elif trunc[j] or end:  # the only place bootstrap_values is read
            assert bootstrap_values is not None, "bootstrap_values needed at a truncation / window end"
            if bootstrap_values.dim() == 1:
                assert end, "[N] bootstrap_values can only serve a truncation at the window end"
                vn.append(num(bootstrap_values[n], diff))
            else:
                vn.append(num(bootstrap_values[n, t], diff))
        else:
            vn.append(0.0 if values is None else v[j + 1])  # unused by estimators without values
    return Row(idx, r, v, k, d, vn, [take(e) for e in extra])


def zeros(N: int, T: int) -> list:
    return [[0.0] * T for _ in range(N)]


def stacked(rows, device) -> torch.Tensor:
    """Nested lists of floats and/or 0-d tensors as one float64 tensor (stacked, so autograd sees it)."""
    if isinstance(rows, torch.Tensor):
        return rows.to(torch.float64)
    if isinstance(rows, list) and not any(isinstance(e, (list, torch.Tensor)) for e in rows):
        return torch.tensor(rows, dtype=torch.float64, device=device)
    if not rows:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.stack([stacked(e, device) if isinstance(e, (list, torch.Tensor))
                        else torch.tensor(e, dtype=torch.float64, device=device) for e in rows])


def as_output(rows: list, like: torch.Tensor) -> torch.Tensor:
    if not any(isinstance(e, torch.Tensor) for row in rows for e in row):  # the fast common case
        return torch.tensor(rows, dtype=torch.float64, device=like.device).reshape(like.shape[:2])
    return stacked(rows, like.device).reshape(like.shape[:2])
