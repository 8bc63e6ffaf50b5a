"""The window rules, in one place: where ``bootstrap_values`` is read and where each row's window ends.

Tensors in, tensors out (``[N, T]`` flags, ``[N]`` per row), no device sync. Every backend, the
distributed path, ``Rollout.bootstrap`` and the testing kit use these functions; the fused kernels
compute the same rules in registers, and a test checks them against this module
(``tests/test_windows.py``).

The rules (docs/semantics.md, "Boundaries"):

* **done** = terminated or truncated; **terminated wins**: a step flagged both never bootstraps;
* a **truncated** step (unmasked, not terminated) reads ``bootstrap_values[t] = V(s'_t)`` in its own
  local term and stops the trace;
* the **window end** of a row is its last step, or its last unmasked step when there is a mask; a
  row with no unmasked step passes the state past the window through, and its window-end value is
  taken from its last column;
* the **window-end carry** (the scan state past the window) is, in this order: the caller's
  ``carry`` (a chained window: the window end is no boundary at all); 0 for
  ``window_end="terminal"`` and for Monte-Carlo returns; else ``V(s_T)``, i.e. ``bootstrap_values``
  at the window-end step (the ``[N]`` column itself when given as ``[N]``), 0 where that step is
  terminated. It enters the scan carry, never a local term, so it is counted once;
* a ``[*B]`` ``bootstrap_values`` is the **window-end column** only: it serves the window-end step
  (a truncation there, and the window-end carry). With truncations it is read as ``[*B, T]``
  bootstrap values holding it at each row's window-end step and NaN at every other step
  (:func:`window_end_column`), so a truncation before the window end reads NaN: the result is NaN
  from that step back, never a silently wrong number, and nothing reads the flags on the host.
"""

from __future__ import annotations

from typing import overload

import torch

__all__ = [
    "last_unmasked_index",
    "window_end_index",
    "bootstrap_read",
    "interior_truncation",
    "window_end_column",
    "window_end_value",
    "window_end_carry",
]


@overload
def _bool(flag: torch.Tensor) -> torch.Tensor: ...
@overload
def _bool(flag: None) -> None: ...
@overload
def _bool(flag: torch.Tensor | None) -> torch.Tensor | None: ...
def _bool(flag: torch.Tensor | None) -> torch.Tensor | None:
    if flag is None:
        return None
    return flag if flag.dtype == torch.bool else flag != 0


def last_unmasked_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last ``True`` of each row of ``mask`` ``[*B, T]`` (``-1`` if none), no sync."""
    m = _bool(mask)
    T = m.shape[-1]
    if T == 0:
        return torch.full(m.shape[:-1], -1, dtype=torch.long, device=m.device)
    idx = torch.arange(T, device=m.device)
    return torch.where(m, idx, -1).amax(dim=-1)


def window_end_index(mask: torch.Tensor | None, shape, device=None) -> torch.Tensor:
    """The window-end step of each row of a ``[*B, T]`` rollout: the last step, or the last
    unmasked one with a ``mask`` (``-1`` for a row with none, and for ``T = 0``)."""
    if mask is not None:
        return last_unmasked_index(mask)
    shape = tuple(shape)
    return torch.full(shape[:-1], shape[-1] - 1, dtype=torch.long, device=device)


def bootstrap_read(terminated, truncated, mask) -> torch.Tensor | None:
    """Where a step reads ``bootstrap_values`` in its local term: truncated, not terminated,
    unmasked. ``None`` when nothing is truncated (no step reads it there)."""
    read = _bool(truncated)
    if read is None:
        return None
    k = _bool(terminated)
    if k is not None:
        read = read & ~k  # terminated wins
    m = _bool(mask)
    if m is not None:
        read = read & m
    return read


def interior_truncation(terminated, truncated, mask) -> torch.Tensor:
    """``[*B, T]`` bool: truncations (that read ``bootstrap_values``) before the window end, which a
    ``[*B]`` window-end column cannot serve."""
    read = bootstrap_read(terminated, truncated, mask)
    if read is None:
        raise ValueError("interior_truncation: truncated must be a [*B, T] tensor, got None")
    T = read.shape[-1]
    j = window_end_index(mask, read.shape, read.device)
    return read & (torch.arange(T, device=read.device) < j.unsqueeze(-1))


def window_end_column(column: torch.Tensor, mask, shape) -> torch.Tensor:
    """A ``[*B]`` window-end column as ``[*B, T]`` bootstrap values (``shape`` = ``[*B, T]``, T > 0):
    ``column`` at each row's window-end step (its last column for a row with no unmasked step), NaN
    at every other step, so that a truncation before the window end reads NaN. Differentiable in
    ``column``; no device sync."""
    shape = tuple(shape)
    T = shape[-1]
    steps = torch.arange(T, device=column.device)
    if mask is None:
        at_end = steps == T - 1
    else:
        j = window_end_index(mask, shape, column.device)
        at_end = steps == torch.where(j < 0, T - 1, j).unsqueeze(-1)
    return torch.where(at_end, column.unsqueeze(-1), float("nan"))


def window_end_value(bootstrap_values: torch.Tensor, terminated, mask, shape) -> torch.Tensor:
    """``V(s_T)`` of each row of a ``[*B, T]`` rollout (``shape``): ``bootstrap_values``
    (``[*B, T]``, or ``[*B]`` = the window-end column) at the window-end step, 0 where that step is
    terminated; a row with no unmasked step takes its last column. Returns ``[*B]``."""
    bv = bootstrap_values
    shape = tuple(shape)
    B, T = shape[:-1], shape[-1]
    per_step = tuple(bv.shape) == shape
    if T == 0:  # no step: a [*B] column is V(s_T) itself, a [*B, 0] field holds nothing
        return torch.zeros(B, dtype=bv.dtype, device=bv.device) if per_step else bv
    j = torch.full(B, T - 1, dtype=torch.long, device=bv.device)
    live_end = torch.ones(B, dtype=torch.bool, device=bv.device)
    m = _bool(mask)
    if m is not None:
        last = last_unmasked_index(m)
        live_end = last >= 0
        j = torch.where(live_end, last, j)
    v = bv.gather(-1, j.unsqueeze(-1)).squeeze(-1) if per_step else bv
    k = _bool(terminated)
    if k is not None:
        k_end = k.gather(-1, j.unsqueeze(-1)).squeeze(-1) & live_end  # masked flags are ignored
        v = torch.where(k_end, torch.zeros((), dtype=v.dtype, device=v.device), v)
    return v


def window_end_carry(*, carry, window_end: str, no_bootstrap: bool, bootstrap_values, terminated, mask,
                     shape, pair: bool, dtype, device) -> torch.Tensor:
    """The scan state past the window of an ``[N, T]`` rollout (``shape``), ``[N]`` (``[N, 2]`` =
    ``(u, V)`` for V-trace): the caller's ``carry``; 0 for a terminal window end or Monte-Carlo
    returns; else :func:`window_end_value`."""
    if carry is not None:
        return carry.to(dtype)
    N = shape[0]
    if window_end == "terminal" or no_bootstrap or bootstrap_values is None:
        return torch.zeros((N, 2) if pair else (N,), dtype=dtype, device=device)
    v = window_end_value(bootstrap_values, terminated, mask, shape).to(dtype)
    if pair:
        return torch.stack([torch.zeros_like(v), v], -1)
    return v
