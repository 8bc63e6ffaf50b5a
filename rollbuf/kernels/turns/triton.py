"""Turn-level discounted returns, backward in time: a turn is a maximal run of model tokens
(``model``, per token, nonzero on a model token); its last token ``e`` (a model token whose next
token in the row is not one, or the row's last token) holds the map ``y → r_e + γ·y``, every other
token the identity. The scan's inclusive state at a model token is then its turn's return ``R_k =
r_k + γ·R_{k+1}`` (the row's last turn: its own reward); the other tokens get 0. Bytes per token:
the reward and the model flag read once (the flag of the next token hits the cache), the returns
written once."""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core

Fields = namedtuple("Fields", "p_r p_on")  # rewards, model-token flags: [N, T] each
Outputs = namedtuple("Outputs", "p_ret")  # returns [N, T]
Scalars = namedtuple("Scalars", "gamma")
Steps = namedtuple("Steps", "r on end ok")  # a token's reward, whether a model token, a turn's end


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the tokens ``o``."""
    f = fam.fields
    off = core.offsets(geo, o)
    on = tl.load(f.p_on + off, mask=ok, other=0) != 0
    on_next = tl.load(f.p_on + core.offsets(geo, o + 1), mask=ok & (o + 1 < geo.T), other=0) != 0
    r = tl.load(f.p_r + off, mask=ok, other=0).to(ACC)
    return Steps(r, on, on & ~on_next, ok)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    return core.identity_where((x.r, fam.scalars.gamma), x.end, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    """The returns from the inclusive state ``z.u`` (the turn's return at each model token)."""
    p_ret = fam.outputs.p_ret
    tl.store(p_ret + core.out_offsets(geo, o), core.out_value(tl.where(x.on, z.u, 0.0), p_ret), mask=ok)
    return z.u, z.u


@triton.jit
def turn_kernel(
    fields,  # (rewards, model-token flags): [N, T] at (s_n, s_t)
    outputs,  # (returns,): [N, T] at (s_on, s_ot)
    carries, sizes,  # core.Carries (carry in / out [N]), core.Sizes
    gamma: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """Turn-level discounted returns, backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    scal = Scalars(tl.full((), gamma, CFG.ACC))
    core.drive(core.Fam(Fields(*fields), Outputs(*outputs), scal), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=True, REVERSE=True), CFG)
