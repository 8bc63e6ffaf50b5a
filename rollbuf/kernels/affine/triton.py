"""The generic affine scan ``y_t = α_t + β_t·y_{t±1}`` (:func:`rollbuf.functional.affine_scan`,
and the scans inside the analytic backward passes): ``α``, ``β`` given as data, no flags."""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core

# α, β: [N, T] each (no flags, no mask: the driver reads no field of this family's by name, its carry
# in being STATE or ZERO)
Fields = namedtuple("Fields", "p_a p_b")
Outputs = namedtuple("Outputs", "p_out")  # y [N, T]
Steps = namedtuple("Steps", "a b ok")  # a step's values (LOAD)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the steps ``o``."""
    off = core.offsets(geo, o)
    a = tl.load(fam.fields.p_a + off, mask=ok, other=0).to(ACC)
    b = tl.load(fam.fields.p_b + off, mask=ok, other=1).to(ACC)
    return Steps(a, b, ok)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    return core.identity_where((x.a, x.b), x.ok, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    p_out = fam.outputs.p_out
    y = x.a + x.b * z.u
    tl.store(p_out + core.out_offsets(geo, o), core.out_value(y, p_out), mask=ok)
    return tl.where(ok, y, z.u), z.u


@triton.jit
def affine_kernel(
    fields,  # (alpha, beta): [N, T] at (s_n, s_t)
    outputs,  # (y [N, T],)
    carries, sizes,  # core.Carries (initial / final [N]), core.Sizes
    CFG: tl.constexpr,  # core.Config (REVERSE: backward in time)
):
    """``y`` of the affine scan, backward (``CFG.REVERSE``) or forward in time."""
    core.drive(core.Fam(Fields(*fields), Outputs(*outputs), ()), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=False, REVERSE=CFG.REVERSE), CFG)
