"""V-trace (Espeholt et al., 2018): the targets ``vs_t = V_t + u_t`` and the policy-gradient
advantages, from the maps of :func:`rollbuf.boundary.coefficients.vtrace_step`
(``(u, V) → (a + p·u + q·V, w + s·V)``: ``u_t = a_t + p_t·u_{t+1} + q_t·V_{t+1}``) and the outputs of
:func:`~rollbuf.boundary.coefficients.vtrace_out`. Clipped ratios ``ρ = min(ρ̄, π/μ)``,
``c = λ·min(c̄, π/μ)``, ``ρ_pg = min(ρ̄_pg, π/μ)``: :func:`~rollbuf.kernels.vtrace.coefficients.truncated_weights`
over :func:`clip`.

With a mask, the pair state ``(u_t, V_t)`` is scanned (``V_{t+1}`` is the next *unmasked* step's,
carried by the scan). Without one, ``V_{t+1}`` is read from the next step in memory (the window-end
``V_T`` past the last step) and only ``u`` is scanned: the scalar maps ``(a + q·V_{t+1}, p)``; unless
rows are walked chunk by chunk or the chunk is held in quads, the scan is then ``u_t`` itself (no
shift), and ``pg_t`` reads ``vs_{t+1}`` back from the chunk's stored targets
(:func:`~rollbuf.boundary.coefficients.vtrace_pg`); in quads the scan gives the exclusive ``u_{t+1}``.
"""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core
from rollbuf.kernels.vtrace import coefficients as C


@triton.jit
def clip(ratio, bar):
    """``min(bar, ratio)`` propagating a NaN ratio (the GPU's min would drop it), as on every backend;
    every bar given (a Triton function cannot return ``None`` on Triton 3.6: a kernel that needs one weight
    passes its bar for the others, and the compiler drops what is not used)."""
    return tl.minimum(ratio, bar, propagate_nan=tl.PropagateNan.ALL)


truncated_weights = core.jit_boundary(C.truncated_weights, clip=clip)
vtrace_step = core.jit_boundary(C.vtrace_step)
vtrace_out = core.jit_boundary(C.vtrace_out)
vtrace_pg = core.jit_boundary(C.vtrace_pg)

# rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs: [N, T] each
Fields = namedtuple("Fields", "p_r p_v p_k p_tr p_bv p_m p_lp p_tlp")
Outputs = namedtuple("Outputs", "p_vs p_pg")  # targets, policy-gradient advantages [N, T]
Scalars = namedtuple("Scalars", "gamma lam rho_bar c_bar pg_rho_bar")
# core.Fam and READBACK: pg_t reads vs_{t+1} back from the stored targets (a constexpr; vtrace_kernel)
Fam = namedtuple("Fam", "fields outputs scalars READBACK")
# a step's values (LOAD): the clipped ratios ρ, c, ρ_pg; v_next (V_{t+1}, the window end's past the
# last step) only without a mask
Steps = namedtuple("Steps", "r v k tr boot live rho c rho_pg v_next")


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the steps ``o`` (``v_next``: ``v`` itself with a mask, unused)."""
    fields, scal = fam.fields, fam.scalars
    HAS_M: tl.constexpr = fields.p_m is not None
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    r = core.load(fields.p_r, off, ok, live, HAS_M, ACC)
    v = core.load(fields.p_v, off, ok, live, HAS_M, ACC)
    tlp = core.load(fields.p_tlp, off, ok, live, HAS_M, ACC)
    ratio = tl.exp(tlp - core.load(fields.p_lp, off, ok, live, HAS_M, ACC))
    v_next = v if HAS_M else core.next_value(fields.p_v, geo, o, ok, end.v, ACC)
    rho, c, rho_pg = truncated_weights(ratio, scal.lam, scal.rho_bar, scal.c_bar, scal.pg_rho_bar)
    return Steps(r, v, k, tr, boot, live, rho, c, rho_pg, v_next)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    boot = x.boot
    if fam.fields.p_tr is None or fam.fields.p_bv is None:  # no step reads one (core.boundary)
        boot = None
    p, q, s, a, w = vtrace_step(x.r, x.v, x.k, x.tr, boot, x.rho, x.c, fam.scalars.gamma)
    if fam.fields.p_m is None:  # the scalar maps of u
        return core.identity_where((a + q * x.v_next, p), x.live, False)
    else:
        return core.identity_where((p, q, s, a, w), x.live, True)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    """Reading back (no mask, rows not walked): ``vs_t = V_t + u_t`` from the inclusive ``u_t``,
    stored, then read back one step further for ``pg_t`` (``vs_{t+1}``: the chunk's own output after
    a barrier; past the chunk's last step, ``V_{t+1} + u_{t+1}`` from the state carried into it).
    Otherwise both from the exclusive state (``u_{t+1}``; ``V_{t+1}`` read from memory, or carried by
    the pair scan with a mask). Returns the inclusive pair ``(u_t, V_t)``."""
    gamma = fam.scalars.gamma
    p_vs, p_pg, p_m = fam.outputs.p_vs, fam.outputs.p_pg, fam.fields.p_m
    boot = x.boot
    if fam.fields.p_tr is None or fam.fields.p_bv is None:  # no step reads one (core.boundary)
        boot = None
    o_out = core.out_offsets(geo, o)
    if fam.READBACK:  # the scan is u itself (no mask, rows not walked)
        u = z.u
        tl.store(p_vs + o_out, core.out_value(x.v + u, p_vs), mask=ok)
        tl.debug_barrier()  # the chunk's targets, visible to every thread of the program
        BT: tl.constexpr = o.shape[1]  # chunks start at multiples of BT, in either lane order
        here = ((o + 1) % BT != 0) & (o + 1 < geo.T)  # the next step is in this chunk
        vs_next = tl.load(p_vs + core.out_offsets(geo, o + 1), mask=ok & here, other=0).to(ACC)
        vs_next = tl.where(here, vs_next, x.v_next + z.c)
        pg = vtrace_pg(x.r, x.v, x.k, x.tr, boot, x.rho_pg, gamma, vs_next)
        tl.store(p_pg + o_out, core.out_value(pg, p_pg), mask=ok)
        return u, x.v
    else:
        zu, zv = z.u, z.v
        if p_m is None:
            zv = x.v_next
        vs, pg = vtrace_out(x.r, x.v, x.k, x.tr, boot, x.rho, x.c, x.rho_pg, gamma, zu, zv)
        tl.store(p_vs + o_out, core.out_value(core.masked(vs, x.live, p_m), p_vs), mask=ok)
        tl.store(p_pg + o_out, core.out_value(core.masked(pg, x.live, p_m), p_pg), mask=ok)
        p0, q0, s0, a0, w0 = vtrace_step(x.r, x.v, x.k, x.tr, boot, x.rho, x.c, gamma)
        return tl.where(x.live, a0 + p0 * zu + q0 * zv, zu), tl.where(x.live, w0 + s0 * zv, zv)


@triton.jit
def vtrace_kernel(
    fields,  # (rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs):
             # [N, T] at (s_n, s_t); None = absent
    outputs,  # (targets, policy-gradient advantages): [N, T] at (s_on, s_ot)
    carries, sizes,  # core.Carries (carry in / out [N, 2]), core.Sizes
    gamma: "fp64", lam: "fp64", rho_bar: "fp64", c_bar: "fp64", pg_rho_bar: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """V-trace targets and policy-gradient advantages, backward in time."""
    ACC: tl.constexpr = CFG.ACC
    f = Fields(*fields)
    scal = Scalars(tl.full((), gamma, ACC), tl.full((), lam, ACC), tl.full((), rho_bar, ACC), tl.full((), c_bar, ACC),
                   tl.full((), pg_rho_bar, ACC))
    # Without a mask the scan is u_t itself and pg_t reads vs_{t+1} back from the stored targets,
    # except when rows are walked chunk by chunk (then the exclusive u_{t+1}: the neighbour's maps
    # re-loaded or a lane shift) or a chunk is held in quads (whose scan gives u_{t+1}); only where
    # the targets are stored in the accumulation dtype (a
    # bf16/fp16 vs_{t+1} read back would carry the output's rounding of vs, of V's size, into pg,
    # and an fp16 overflow to inf would make 0·inf = NaN at a terminated step); only for chunks
    # longer than 128 steps (docs/kernel-choices.md, "V-trace's targets read back (vtrace/triton.py)").
    out = Outputs(*outputs)
    READBACK: tl.constexpr = (f.p_m is None and CFG.PASS != core.WALK and out.p_vs.dtype.element_ty == ACC
                              and CFG.BLOCK_T > 128 and not CFG.QUADS)
    core.drive(Fam(f, out, scal, READBACK), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=f.p_m is not None, CARRY2=True, INCLUSIVE=READBACK, REVERSE=True),
               CFG)
