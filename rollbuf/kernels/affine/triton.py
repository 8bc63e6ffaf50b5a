"""The generic affine scan ``y_t = α_t + β_t·y_{t±1}`` (:func:`rollbuf.functional.affine_scan`,
and the scans inside the analytic backward passes): ``α``, ``β`` given as data, no flags."""

import triton
import triton.language as tl

from rollbuf.kernels import core


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """``(α, β, ok)`` at the steps ``o``."""
    p_a, p_b = fam[0][0], fam[0][1]
    off = core.offsets(geo, o)
    a = tl.load(p_a + off, mask=ok, other=0).to(ACC)
    b = tl.load(p_b + off, mask=ok, other=1).to(ACC)
    return a, b, ok


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    a, b, ok = x
    return core.identity_where((a, b), ok, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    p_out = fam[1][0]
    a, b, _ = x
    y = a + b * z[0]
    tl.store(p_out + core.out_offsets(geo, o), core.out_value(y, p_out), mask=ok)
    return tl.where(ok, y, z[0]), z[0]


@triton.jit
def affine_kernel(
    fields,  # (alpha, beta): [N, T] at (s_n, s_t)
    p_out, p_ci, p_co, p_ws,  # y [N, T]; initial / final [N]; look-back scratch
    R, T, s_n, s_t, s_on, s_ot,
    REVERSE: tl.constexpr, CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr, PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr, FLIP: tl.constexpr,
):
    """``y`` of the affine scan, backward (``REVERSE``) or forward in time."""
    fam = ((fields[0], fields[1], None, None, None, None), (p_out,), ())
    core.drive(fam, R, T, 1, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _load, _step, _emit, (False, False, False), REVERSE,
               CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD,
               FLIP)
