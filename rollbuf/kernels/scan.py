"""The fused kernel: one affine-scan core for every estimator.

One program owns one row (``row = n·F + f``; ``F`` > 1 only for the features of the forward
estimators) and walks it in chunks of ``BLOCK_T`` steps (backward in time for the backward
estimators), carrying the scan state between chunks in registers. Per chunk:

1. load the raw fields of the *neighbouring* step ``s = t+1`` (backward) or ``t−1`` (forward) and build
   its coefficients ``(α_s, β_s)`` with the estimator's function from
   :mod:`rollbuf.boundary.coefficients`; padded lanes and masked steps are the identity ``(0, 1)``;
2. ``tl.associative_scan`` over the chunk, combined with the carried state: the exclusive state
   ``Z_{t+1}`` (or ``F_{t−1}``) at every lane;
3. load the step's own fields (a cache hit: the same lines as step 1, one lane over) and write the
   outputs once;
4. the state at the chunk's edge lane becomes the carry of the next chunk.

Bytes per step from HBM: the inputs once, the outputs once; ``bootstrap_values`` only where a
truncated step or the window end reads it. Coefficients never leave registers.
"""

import types

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C



def _jit(fn):
    """Compile a boundary function as a Triton device function (same source, same code object).

    The boundary module does not import Triton (the torch backend must work without it), so the
    function is rebound to globals that also hold ``tl``, as the Triton interpreter requires.
    """
    g = dict(fn.__globals__, tl=tl, triton=triton)
    f = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    f.__doc__, f.__module__, f.__qualname__ = fn.__doc__, fn.__module__, fn.__qualname__
    return triton.jit(f)


# The boundary model, compiled. Same source as the torch backend runs.
lambda_step = _jit(C.lambda_step)
lambda_out = _jit(C.lambda_out)
retrace_step = _jit(C.retrace_step)
vtrace_step = _jit(C.vtrace_step)
vtrace_out = _jit(C.vtrace_out)
trace_step = _jit(C.trace_step)
trace_out = _jit(C.trace_out)
compose = _jit(C.compose)
compose_pair = _jit(C.compose_pair)

FAMILIES = {"lambda": 0, "retrace": 1, "vtrace": 2, "trace": 3, "affine": 4}


@triton.jit
def _combine(a1, b1, a2, b2):
    # the element met later in scan order is the outer map (both directions)
    return compose(a2, b2, a1, b1)


@triton.jit
def _combine_pair(p1, q1, s1, a1, w1, p2, q2, s2, a2, w2):
    return compose_pair(p2, q2, s2, a2, w2, p1, q1, s1, a1, w1)


@triton.jit
def _ld(ptr, off, m_, ACC: tl.constexpr):
    return tl.load(ptr + off, mask=m_, other=0).to(ACC)


@triton.jit
def _ld_flag(ptr, off, m_, ACC: tl.constexpr):
    return (tl.load(ptr + off, mask=m_, other=0) != 0).to(ACC)


@triton.jit
def _step_fields(
    o_t, ok, n, f,
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_x, s_x_n, s_x_t, s_x_f,
    HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr, BOOT: tl.constexpr,
    HAS_M: tl.constexpr, IS_TRACE: tl.constexpr, ACC: tl.constexpr,
):
    """Clean fields of the steps ``o_t`` (``ok``: inside the row): masked steps read nothing.

    Returns ``(r_or_x, v, k, tr, boot, live)`` with ``live`` = inside the row and not masked.
    """
    if HAS_M:
        live = ok & (tl.load(p_m + n * s_m_n + o_t * s_m_t, mask=ok, other=0) != 0)
    else:
        live = ok
    if IS_TRACE:
        r = _ld(p_x, n * s_x_n + f * s_x_f + o_t * s_x_t, live, ACC)
    else:
        r = _ld(p_r, n * s_r_n + o_t * s_r_t, live, ACC)
    if HAS_V:
        v = _ld(p_v, n * s_v_n + o_t * s_v_t, live, ACC)
    else:
        v = tl.zeros_like(r)
    if HAS_K:
        k = _ld_flag(p_k, n * s_k_n + o_t * s_k_t, live, ACC)
    else:
        k = tl.zeros_like(r)
    if HAS_TR:
        tr = _ld_flag(p_tr, n * s_tr_n + o_t * s_tr_t, live, ACC)
    else:
        tr = tl.zeros_like(r)
    # bootstrap values are read only where a live, truncated, non-terminated step needs them
    read = live & (tr != 0) & (k == 0)
    if BOOT == 2:
        boot = _ld(p_bv, n * s_bv_n + o_t * s_bv_t, read, ACC)
    elif BOOT == 1:
        boot = tl.where(read, b_bv_row, 0.0).to(ACC)
    else:
        boot = tl.zeros_like(r)
    return r, v, k, tr, boot, live


@triton.jit
def _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_t, live, ACC: tl.constexpr):
    lp = _ld(p_lp, n * s_lp_n + o_t * s_lp_t, live, ACC)
    tlp = _ld(p_tlp, n * s_tlp_n + o_t * s_tlp_t, live, ACC)
    return tl.exp(tlp - lp)


@triton.jit
def scan_kernel(
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, p_m, s_m_n, s_m_t,
    p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t,
    p_x, s_x_n, s_x_t, s_x_f,
    p_o1, p_o2, s_o_n, s_o_t, s_o_f,
    p_ci, p_co,
    T, F,
    gamma: "fp64", lam: "fp64", rho_bar: "fp64", c_bar: "fp64", pg_rho_bar: "fp64", decay: "fp64",
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, CARRY_IN: tl.constexpr, WRITE_CARRY: tl.constexpr,
    TWO_OUT: tl.constexpr, ADV_OUT: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr,
    REVERSE: tl.constexpr,
):
    # CARRY_IN: 0 = zero (terminal window end / forward default), 1 = V(s_T) from bootstrap values
    # at the window end, 2 = explicit carry / initial from p_ci.
    # FAMILY 4 is the public primitive affine_scan: α read from x, β from values.
    IS_TRACE: tl.constexpr = FAMILY >= 3
    PAIR: tl.constexpr = FAMILY == 2
    # scalars arrive in float64 (exact for float64 rollouts) and are rounded once to ACC
    gamma = tl.full((), gamma, ACC)
    lam = tl.full((), lam, ACC)
    rho_bar = tl.full((), rho_bar, ACC)
    c_bar = tl.full((), c_bar, ACC)
    pg_rho_bar = tl.full((), pg_rho_bar, ACC)
    decay = tl.full((), decay, ACC)
    row = tl.program_id(0).to(tl.int64)
    n = row // F
    f = row % F
    lanes = tl.arange(0, BLOCK_T)
    num_chunks = (T + BLOCK_T - 1) // BLOCK_T
    zero = tl.zeros([BLOCK_T], dtype=ACC)

    b_bv_row = 0.0
    if BOOT == 1:
        b_bv_row = tl.load(p_bv + n * s_bv_n).to(ACC)

    # ---- carry in: the state just past the row in scan order --------------------------------
    c_u = tl.sum(zero, axis=0)  # pair: u-part; scalar: the state
    c_v = tl.sum(zero, axis=0)  # pair: V-part
    pending = False  # the window-end bootstrap waits for the last unmasked step
    if CARRY_IN == 2:
        if PAIR:
            c_u = tl.load(p_ci + row * 2).to(ACC)
            c_v = tl.load(p_ci + row * 2 + 1).to(ACC)
        else:
            c_u = tl.load(p_ci + row).to(ACC)
    if CARRY_IN == 1:
        pending = True
    z0 = tl.sum(zero, axis=0)  # row carry out (state at the first step / final)

    for i in range(0, num_chunks):
        if REVERSE:
            start = (num_chunks - 1 - i) * BLOCK_T
        else:
            start = i * BLOCK_T
        o_t = start + lanes
        ok_t = o_t < T
        if REVERSE:
            o_s = o_t + 1
        else:
            o_s = o_t - 1
        ok_s = (o_s >= 0) & (o_s < T)

        # own step fields (outputs, and the window-end carry)
        r, v, k, tr, boot, live = _step_fields(
            o_t, ok_t, n, f, p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t,
            p_tr, s_tr_n, s_tr_t, p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
            p_x, s_x_n, s_x_t, s_x_f, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, IS_TRACE, ACC)

        if CARRY_IN == 1:
            # the window end: last live step of the row; its V(s_T), or 0 if it terminated
            j = tl.max(tl.where(live, o_t, -1), axis=0)
            hit = pending & (j >= 0)
            if BOOT == 2:
                b_end = tl.load(p_bv + n * s_bv_n + j * s_bv_t, mask=hit, other=0).to(ACC)
            else:
                b_end = b_bv_row
            k_end = tl.sum(tl.where(o_t == j, k, 0.0), axis=0)
            b_end = tl.where(k_end != 0, 0.0, b_end)
            if PAIR:
                c_v = tl.where(hit, b_end, c_v)
            else:
                c_u = tl.where(hit, b_end, c_u)
            pending = pending & (j < 0)

        # neighbouring step's coefficients, identity where outside the row or masked
        r_s, v_s, k_s, tr_s, boot_s, live_s = _step_fields(
            o_s, ok_s, n, f, p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t,
            p_tr, s_tr_n, s_tr_t, p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
            p_x, s_x_n, s_x_t, s_x_f, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, IS_TRACE, ACC)

        if PAIR:
            ratio_s = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_s, live_s, ACC)
            rho_s = tl.minimum(ratio_s, rho_bar)
            c_s = lam * tl.minimum(ratio_s, c_bar)
            ep, eq, es, ea, ew = vtrace_step(r_s, v_s, k_s, tr_s, boot_s, rho_s, c_s, gamma)
            ep = tl.where(live_s, ep, 1.0)
            eq = tl.where(live_s, eq, 0.0)
            es = tl.where(live_s, es + zero, 1.0)
            ea = tl.where(live_s, ea, 0.0)
            ew = tl.where(live_s, ew, 0.0)
            sp, sq, ss, sa, sw = tl.associative_scan((ep, eq, es, ea, ew), 0, _combine_pair, reverse=True)
            u_next = sa + sp * c_u + sq * c_v
            v_next = sw + ss * c_v
            ratio = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_t, live, ACC)
            rho = tl.minimum(ratio, rho_bar)
            c = lam * tl.minimum(ratio, c_bar)
            rho_pg = tl.minimum(ratio, pg_rho_bar)
            out1, out2 = vtrace_out(r, v, k, tr, boot, rho, c, rho_pg, gamma, u_next, v_next)
            if WRITE_CARRY:
                p0, q0, s0, a0, w0 = vtrace_step(r, v, k, tr, boot, rho, c, gamma)
                u_in = tl.where(live, a0 + p0 * u_next + q0 * v_next, u_next)
                v_in = tl.where(live, w0 + s0 * v_next, v_next)
                z0 += tl.sum(tl.where(o_t == 0, u_in, 0.0), axis=0)
            c_u = tl.sum(tl.where(lanes == 0, u_next, 0.0), axis=0)
            c_v = tl.sum(tl.where(lanes == 0, v_next, 0.0), axis=0)
            if WRITE_CARRY:
                # V part of the row carry, kept in c_v's lane-0 slot at the last chunk (t = 0)
                zv = tl.sum(tl.where(o_t == 0, v_in, 0.0), axis=0)
                c_v = tl.where(start == 0, zv, c_v)
        else:
            if FAMILY == 0:
                ea, eb = lambda_step(r_s, v_s, k_s, tr_s, boot_s, gamma, lam)
            elif FAMILY == 1:
                ratio_s = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_s, live_s, ACC)
                q_s = _ld(p_q, n * s_q_n + o_s * s_q_t, live_s, ACC)
                ea, eb = retrace_step(r_s, v_s, k_s, tr_s, boot_s, q_s, lam * tl.minimum(ratio_s, c_bar), gamma)
            elif FAMILY == 3:
                ea, eb = trace_step(r_s, k_s, tr_s, decay)
            else:
                ea, eb = r_s, v_s
            ea = tl.where(live_s, ea, 0.0)
            eb = tl.where(live_s, eb, 1.0)
            sa, sb = tl.associative_scan((ea, eb), 0, _combine, reverse=REVERSE)
            z_next = sa + sb * c_u  # Z_{t+1} (backward) / F_{t-1} (forward)
            if FAMILY == 3:
                out1 = trace_out(r, decay, z_next)
            elif FAMILY == 4:
                out1 = r + v * z_next
            else:
                out1 = lambda_out(r, k, tr, boot, gamma, z_next)
                if ADV_OUT:
                    out2 = out1 - v
            if WRITE_CARRY:
                # state at the row's first step (backward) / last step (forward: final)
                if FAMILY == 0:
                    a0, b0 = lambda_step(r, v, k, tr, boot, gamma, lam)
                elif FAMILY == 1:
                    ratio0 = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_t, live, ACC)
                    q0 = _ld(p_q, n * s_q_n + o_t * s_q_t, live, ACC)
                    a0, b0 = retrace_step(r, v, k, tr, boot, q0, lam * tl.minimum(ratio0, c_bar), gamma)
                elif FAMILY == 3:
                    a0, b0 = trace_step(r, k, tr, decay)
                else:
                    a0, b0 = r, v
                z_in = tl.where(live, a0 + b0 * z_next, z_next)
                if REVERSE:
                    z0 += tl.sum(tl.where(o_t == 0, z_in, 0.0), axis=0)
                else:
                    z0 += tl.sum(tl.where(o_t == T - 1, z_in, 0.0), axis=0)
            if REVERSE:
                c_u = tl.sum(tl.where(lanes == 0, z_next, 0.0), axis=0)
            else:
                c_u = tl.sum(tl.where(lanes == BLOCK_T - 1, z_next, 0.0), axis=0)

        # ---- write the outputs once; 0 at masked steps ----------------------------------------
        o_off = n * s_o_n + f * s_o_f + o_t * s_o_t
        if ADV_OUT:
            tl.store(p_o1 + o_off, tl.where(live, out2, 0.0).to(p_o1.dtype.element_ty), mask=ok_t)
            tl.store(p_o2 + o_off, tl.where(live, out1, 0.0).to(p_o2.dtype.element_ty), mask=ok_t)
        else:
            tl.store(p_o1 + o_off, tl.where(live, out1, 0.0).to(p_o1.dtype.element_ty), mask=ok_t)
            if TWO_OUT:
                tl.store(p_o2 + o_off, tl.where(live, out2, 0.0).to(p_o2.dtype.element_ty), mask=ok_t)

    if WRITE_CARRY:
        if PAIR:
            tl.store(p_co + row * 2, z0.to(p_co.dtype.element_ty))
            tl.store(p_co + row * 2 + 1, c_v.to(p_co.dtype.element_ty))
        else:
            tl.store(p_co + row, z0.to(p_co.dtype.element_ty))
