"""verl's optimal token baseline (OTB) advantages in one Triton kernel: one program per group.

A program takes one group's rows (``perm[start:start + size]`` of the host's group layout, at most
``BLOCK_M`` of them) and walks their tokens forward in chunks of ``BLOCK_T``: it loads each row's
mask, log-probabilities, ``Σπ²`` and importance weights, forms ``w = (1 − 2·exp(lp) + Σπ²)·ρ̄²·m``
and its running sum ``W`` (the carry from the chunks before in registers), loads the returns ``G``
and writes ``A = (G − B)·m`` with ``B_t = Σ_group G·W·m / (Σ_group W·m + ε)`` (0 for a group of one
row, and for the group's unique longest row from the second longest row's length on with
``ZERO_TAIL``). ``W`` and the group sums are formed in float64 (verl forms them in float32, where a
group's ``Σ W`` can cancel), the baseline rounded once to float32. Every input is read once and the
advantages written once: no ``[B, L]`` intermediate (docs/llm.md, verl's optimal token baseline).
"""

import functools
from collections import namedtuple

import torch
import triton
import triton.language as tl

from rollbuf.kernels import host

__all__ = ["run", "MAX_GROUP"]

MAX_GROUP = 256  # the largest group a program holds (BLOCK_M); larger groups take the torch path
TILE = 4096  # elements per chunk: BLOCK_M rows × BLOCK_T tokens
WARPS = 8

# the kernel's ``fields``: returns, mask, log-probabilities, Σπ², importance weights (None: 1); [B, L] each
Fields = namedtuple("Fields", "p_g p_m p_lp p_spi p_isw")
# the kernel's ``groups``: the rows group by group, each group's start in that order and its size
Groups = namedtuple("Groups", "p_perm p_start p_size")


@triton.jit
def otb_kernel(fields, groups, p_len, p_out, L, eps: "fp64", ZERO_TAIL: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """``p_out`` ``[B, L]`` float32: the advantages of one group's rows (module docstring);
    ``p_len`` ``[B]``: each row's response length (its mask's sum)."""
    f = Fields(*fields)
    gr = Groups(*groups)
    gid = tl.program_id(0)
    start = tl.load(gr.p_start + gid).to(tl.int64)
    n = tl.load(gr.p_size + gid)
    mi = tl.arange(0, BLOCK_M)
    mok = mi < n
    rows = tl.load(gr.p_perm + start + mi, mask=mok, other=0).to(tl.int64)
    length = tl.load(p_len + rows, mask=mok, other=-1)
    longest = tl.max(length, 0)
    top = mok & (length == longest)
    second = tl.max(tl.where(top, -1, length), 0)
    # verl: the unique longest row of a group of two or more, longer than the second longest
    tail = top & (tl.sum(top.to(tl.int32), 0) == 1) & (n > 1)
    grouped = n > 1
    carry = tl.zeros([BLOCK_M], tl.float64)
    lanes = tl.arange(0, BLOCK_T)
    for t0 in range(0, L, BLOCK_T):
        t = t0 + lanes
        ok = mok[:, None] & (t < L)[None, :]
        off = rows[:, None] * L + t[None, :]
        m = tl.load(f.p_m + off, mask=ok, other=0).to(tl.float64)
        lp = tl.load(f.p_lp + off, mask=ok, other=0.0).to(tl.float64)
        w = 1.0 - 2.0 * tl.exp(lp) + tl.load(f.p_spi + off, mask=ok, other=0.0).to(tl.float64)
        if f.p_isw is not None:
            isw = tl.load(f.p_isw + off, mask=ok, other=0.0).to(tl.float64)
            w = w * (isw * isw)
        wm = tl.where(ok, w * m, 0.0)
        W = carry[:, None] + tl.cumsum(wm, 1)
        carry = carry + tl.sum(wm, 1)
        g = tl.load(f.p_g + off, mask=ok, other=0.0)
        Wm = W * m
        b = tl.sum(tl.where(ok, g.to(tl.float64) * Wm, 0.0), 0) / (tl.sum(tl.where(ok, Wm, 0.0), 0) + eps)
        bb = tl.where(grouped, b.to(tl.float32)[None, :] + tl.zeros([BLOCK_M, BLOCK_T], tl.float32), 0.0)
        if ZERO_TAIL:
            bb = tl.where(tail[:, None] & (t[None, :] >= second), 0.0, bb)
        tl.store(p_out + off, (g - bb) * m.to(tl.float32), mask=ok)


@functools.cache
def _kernel(zero_tail: bool, block_m: int, block_t: int) -> host.Kernel:
    const = dict(ZERO_TAIL=zero_tail, BLOCK_M=block_m, BLOCK_T=block_t)
    return host.Kernel(otb_kernel, const, WARPS, ("fields", "groups", "p_len", "p_out", "L", "eps"))


def run(returns: torch.Tensor, mask: torch.Tensor, old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor,
        rollout_is_weights: torch.Tensor | None, layout: tuple, *, epsilon: float, zero_tail: bool) -> torch.Tensor:
    """The ``[B, L]`` float32 OTB advantages on the kernel. ``layout``: ``(perm, start, size, largest)``:
    the rows group by group, each group's start and size (int tensors on the device) and the largest
    group's size (a host number, at most :data:`MAX_GROUP`); the float inputs float32, the mask bool,
    integer or float32, all ``[B, L]``."""
    perm, gstart, gsize, largest = layout
    B, L = returns.shape
    out = torch.empty((B, L), dtype=torch.float32, device=returns.device)
    if B == 0 or L == 0:
        return out
    fields = tuple(None if x is None else x.contiguous() for x in (returns, mask, old_log_probs, sum_pi_squared,
                                                                    rollout_is_weights))
    block_m = max(2, 1 << (int(largest) - 1).bit_length())
    block_t = max(16, min(TILE // block_m, 1 << max(0, L - 1).bit_length()))
    # the lengths as integers, as verl's tail rule reads them (a fractional float mask's sums truncated)
    args = dict(fields=fields, groups=(perm, gstart, gsize), p_len=mask.sum(dim=-1).long(), p_out=out, L=L,
                eps=float(epsilon))
    kernel = _kernel(bool(zero_tail), block_m, block_t)
    if returns.device.type == "cuda":
        with torch.cuda.device(returns.device):
            kernel(gsize.numel(), args, returns.device.index)
    else:
        kernel(gsize.numel(), args, None)
    return out
