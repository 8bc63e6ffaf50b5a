"""The turn family, backward in time, and the forward fill of a turn's first token.

A turn is a maximal run of model tokens (``model``, per token, nonzero on a model token); its last
token ``e`` (a model token whose next token in the row is not one, or the row's last token) holds the
map ``E: y → r_e + γ·y``, its first token ``s`` (a model token whose previous token is not one, or the
row's first) ``S: y → (1 − λ)·V_s + λ·y`` (with values; the identity without), applied after ``E`` on a
turn of one token; every other token the identity. Scanned backward, the state is the TD(λ) state
over turns, ``Z_k = (1 − λ)·V_k + λ·G_k`` with ``G_k = r_k + γ·Z_{k+1}``, and at a model token of turn
``k`` the state past it with ``E`` applied is the turn's return ``G_k`` (without values, ``λ = 1``:
ROLL's ``R_k = r_k + γ·R_{k+1}``). ``turn_kernel`` writes ``G_k`` at every model token (0 elsewhere)
and, with values, the advantage ``G_k − V_k`` at each turn's first token only; ``fill_kernel`` carries
that forward over the turn's tokens (0 elsewhere), the map ``y → a_s`` at a turn's first token and the
identity elsewhere. Bytes per token: the flags read once (a neighbour's hits the cache), the rewards
and values read only at a turn's end and first token, each output written once.
"""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core

Fields = namedtuple("Fields", "p_r p_on p_v")  # rewards, model-token flags, values (None: turn returns): [N, T]
Outputs = namedtuple("Outputs", "p_ret p_adv")  # returns [N, T]; advantages at each turn's first token
Scalars = namedtuple("Scalars", "gamma lam")
Steps = namedtuple("Steps", "r v on start end")  # a token's reward (at an end), value (at a start), its flags
FillFields = namedtuple("FillFields", "p_a p_on")  # a value at each turn's first token, model-token flags
FillOutputs = namedtuple("FillOutputs", "p_out")
FillSteps = namedtuple("FillSteps", "a on start")


@triton.jit
def _flags(p_on, geo, o, ok):
    """Whether each token of ``o`` is a model token, a turn's first and a turn's last."""
    on = tl.load(p_on + core.offsets(geo, o), mask=ok, other=0) != 0
    prev = tl.load(p_on + core.offsets(geo, o - 1), mask=ok & (o >= 1), other=0) != 0
    nxt = tl.load(p_on + core.offsets(geo, o + 1), mask=ok & (o + 1 < geo.T), other=0) != 0
    return on, on & ~prev, on & ~nxt


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the tokens ``o``: the reward read at a turn's last token only, the value at its first."""
    f = fam.fields
    on, first, last = _flags(f.p_on, geo, o, ok)
    off = core.offsets(geo, o)
    r = tl.load(f.p_r + off, mask=ok & last, other=0).to(ACC)
    v = r  # without values: unused
    if f.p_v is not None:
        v = tl.load(f.p_v + off, mask=ok & first, other=0).to(ACC)
    return Steps(r, v, on, first, last)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    gamma, lam = fam.scalars.gamma, fam.scalars.lam
    a = tl.where(x.end, x.r, 0.0)
    b = tl.where(x.end, gamma, 1.0)
    if fam.fields.p_v is not None:  # S after E at a turn's first token
        a = tl.where(x.start, (1.0 - lam) * x.v + lam * a, a)
        b = tl.where(x.start, lam * b, b)
    return core.Map(a, b)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    """``G_k`` from the state past each token (inclusive without values: ``S`` is the identity there)."""
    gamma, lam = fam.scalars.gamma, fam.scalars.lam
    p_ret, p_adv = fam.outputs.p_ret, fam.outputs.p_adv
    o_out = core.out_offsets(geo, o)
    if fam.fields.p_v is None:
        g = z.u
        z_t = z.u
    else:
        g = tl.where(x.end, x.r + gamma * z.u, z.u)
        z_t = tl.where(x.start, (1.0 - lam) * x.v + lam * g, g)
    if p_ret is not None:
        tl.store(p_ret + o_out, core.out_value(tl.where(x.on, g, 0.0), p_ret), mask=ok)
    if p_adv is not None:
        tl.store(p_adv + o_out, core.out_value(g - x.v, p_adv), mask=ok & x.start)
    return z_t, z_t


@triton.jit
def turn_kernel(
    fields,  # (rewards, model-token flags, values or None): [N, T] at (s_n, s_t)
    outputs,  # (returns, advantages at each turn's first token): [N, T] at (s_on, s_ot); None = not asked for
    carries, sizes,  # core.Carries (the state past the row's end [N], or None: 0), core.Sizes
    gamma: "fp64", lam: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """Turn-level returns (and advantages), backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    f = Fields(*fields)
    scal = Scalars(tl.full((), gamma, CFG.ACC), tl.full((), lam, CFG.ACC))
    core.drive(core.Fam(f, Outputs(*outputs), scal), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=f.p_v is None, REVERSE=True), CFG)


@triton.jit
def _fill_load(fam, geo, o, ok, end, ACC: tl.constexpr):
    on, first, _ = _flags(fam.fields.p_on, geo, o, ok)
    a = tl.load(fam.fields.p_a + core.offsets(geo, o), mask=ok & first, other=0).to(ACC)
    return FillSteps(a, on, first)


@triton.jit
def _fill_step(fam, x, ACC: tl.constexpr):
    return core.identity_where((x.a, 0.0), x.start, False)


@triton.jit
def _fill_emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    p_out = fam.outputs.p_out
    tl.store(p_out + core.out_offsets(geo, o), core.out_value(tl.where(x.on, z.u, 0.0), p_out), mask=ok)
    return z.u, z.u


@triton.jit
def fill_kernel(
    fields,  # (a value at each turn's first token, model-token flags): [N, T] at (s_n, s_t)
    outputs,  # (the values carried over each turn,): [N, T] at (s_on, s_ot)
    carries, sizes,  # core.Carries (carry out [N]), core.Sizes
    CFG: tl.constexpr,  # core.Config
):
    """Each turn's first-token value over the turn's model tokens, forward in time."""
    core.drive(core.Fam(FillFields(*fields), FillOutputs(*outputs), ()), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_fill_load, _fill_step, _fill_emit, PAIR=False, CARRY2=False, INCLUSIVE=True, REVERSE=False),
               CFG)
