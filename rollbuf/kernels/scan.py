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
lambda_adjoint_step = _jit(C.lambda_adjoint_step)
lambda_adjoint_out = _jit(C.lambda_adjoint_out)
compose = _jit(C.compose)
compose_pair = _jit(C.compose_pair)

FAMILIES = {"lambda": 0, "retrace": 1, "vtrace": 2, "trace": 3, "affine": 4, "lambda_adjoint": 5}


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
def _ld_live(ptr, off, ok, live, HAS_M: tl.constexpr, ACC: tl.constexpr):
    """A field at the steps ``off`` (``ok``: inside the row), 0 where not ``live``. With a mask, the
    load itself is under ``ok`` alone (a mask that depends on loaded data keeps the compiler from
    vectorising the load); the masked steps' values are then dropped by a select, so garbage
    (NaN, Inf) there never reaches the arithmetic. Measured on the H200 (benchmarks/ab.py,
    results/ab_masked_loads_3b98468.csv): masked GAE 1.2–2.3× faster than loads under the mask
    (256 × 2^20: 9.38 → 4.12 ms; 4096 × 128: 10.5 → 8.3 µs), V-trace 1.35–1.39×."""
    if HAS_M:
        return tl.where(live, tl.load(ptr + off, mask=ok, other=0).to(ACC), 0.0)
    else:
        return tl.load(ptr + off, mask=live, other=0).to(ACC)


@triton.jit
def _ld_flag_live(ptr, off, ok, live, HAS_M: tl.constexpr, ACC: tl.constexpr):
    if HAS_M:
        return (live & (tl.load(ptr + off, mask=ok, other=0) != 0)).to(ACC)
    else:
        return (tl.load(ptr + off, mask=live, other=0) != 0).to(ACC)


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
        r = _ld_live(p_x, n * s_x_n + f * s_x_f + o_t * s_x_t, ok, live, HAS_M, ACC)
    else:
        r = _ld_live(p_r, n * s_r_n + o_t * s_r_t, ok, live, HAS_M, ACC)
    if HAS_V:
        v = _ld_live(p_v, n * s_v_n + o_t * s_v_t, ok, live, HAS_M, ACC)
    else:
        v = tl.zeros_like(r)
    if HAS_K:
        k = _ld_flag_live(p_k, n * s_k_n + o_t * s_k_t, ok, live, HAS_M, ACC)
    else:
        k = tl.zeros_like(r)
    if HAS_TR:
        tr = _ld_flag_live(p_tr, n * s_tr_n + o_t * s_tr_t, ok, live, HAS_M, ACC)
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
def _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_t, ok, live, HAS_M: tl.constexpr,
           ACC: tl.constexpr):
    lp = _ld_live(p_lp, n * s_lp_n + o_t * s_lp_t, ok, live, HAS_M, ACC)
    tlp = _ld_live(p_tlp, n * s_tlp_n + o_t * s_tlp_t, ok, live, HAS_M, ACC)
    return tl.exp(tlp - lp)


@triton.jit
def _scan_chunk(
    start, n, f, row_ok, lanes,
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
    p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
    T, gamma, lam, rho_bar, c_bar, decay,
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, ACC: tl.constexpr, REVERSE: tl.constexpr,
    D: tl.constexpr,
):
    """Inclusive scan, over one chunk, of the coefficients of steps ``t + D`` (``D = 0``: the
    steps' own; ``D = ±1``: the neighbours', whose scan is the exclusive state directly): five map
    components ``(e0..e4)`` per lane (scalar families use e0 = α, e1 = β); identity past the row and
    where masked."""
    IS_TRACE: tl.constexpr = (FAMILY == 3) or (FAMILY == 4)
    o_s = start + lanes + D
    ok_s = row_ok & (o_s >= 0) & (o_s < T)
    r_s, v_s, k_s, tr_s, boot_s, live_s = _step_fields(
        o_s, ok_s, n, f, p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t,
        p_tr, s_tr_n, s_tr_t, p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
        p_x, s_x_n, s_x_t, s_x_f, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, IS_TRACE, ACC)
    if FAMILY == 2:
        ratio_s = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_s, ok_s, live_s, HAS_M, ACC)
        rho_s = tl.minimum(ratio_s, rho_bar)
        c_s = lam * tl.minimum(ratio_s, c_bar)
        ep, eq, es, ea, ew = vtrace_step(r_s, v_s, k_s, tr_s, boot_s, rho_s, c_s, gamma)
        ep = tl.where(live_s, ep, 1.0)
        eq = tl.where(live_s, eq, 0.0)
        es = tl.where(live_s, es + tl.zeros_like(r_s), 1.0)
        ea = tl.where(live_s, ea, 0.0)
        ew = tl.where(live_s, ew, 0.0)
        return tl.associative_scan((ep, eq, es, ea, ew), 1, _combine_pair, reverse=REVERSE)
    else:
        if FAMILY == 0:
            ea, eb = lambda_step(r_s, v_s, k_s, tr_s, boot_s, gamma, lam)
        elif FAMILY == 1:
            ratio_s = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_s, ok_s, live_s, HAS_M, ACC)
            q_s = _ld_live(p_q, n * s_q_n + o_s * s_q_t, ok_s, live_s, HAS_M, ACC)
            ea, eb = retrace_step(r_s, v_s, k_s, tr_s, boot_s, q_s, lam * tl.minimum(ratio_s, c_bar), gamma)
        elif FAMILY == 3:
            ea, eb = trace_step(r_s, k_s, tr_s, decay)
        elif FAMILY == 5:  # the TD(λ) adjoint: rewards = ḡ_G (or ḡ), values = ḡ_A
            ea, eb = lambda_adjoint_step(r_s + v_s, k_s, tr_s, gamma, lam)
        else:
            ea, eb = r_s, v_s
        ea = tl.where(live_s, ea, 0.0)
        eb = tl.where(live_s, eb + tl.zeros_like(r_s), 1.0)
        sa, sb = tl.associative_scan((ea, eb), 1, _combine, reverse=REVERSE)
        return sa, sb, sa, sa, sa


@triton.jit
def _own_fields(
    start, n, f, row_ok, lanes,
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t,
    p_x, s_x_n, s_x_t, s_x_f, T,
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, ACC: tl.constexpr,
):
    """The fields a chunk's outputs read at its own steps: ``(r, v, k, tr, boot, live, ratio)``
    (``ratio`` for V-trace only, else ``r`` in its place)."""
    IS_TRACE: tl.constexpr = (FAMILY == 3) or (FAMILY == 4)
    o_t = start + lanes
    ok_t = row_ok & (o_t < T)
    r, v, k, tr, boot, live = _step_fields(
        o_t, ok_t, n, f, p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t,
        p_tr, s_tr_n, s_tr_t, p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
        p_x, s_x_n, s_x_t, s_x_f, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, IS_TRACE, ACC)
    if FAMILY == 2:
        ratio = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_t, ok_t, live, HAS_M, ACC)
    else:
        ratio = r
    return r, v, k, tr, boot, live, ratio


@triton.jit
def _early_fields(
    start, n, f, row_ok, lanes,
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t,
    p_x, s_x_n, s_x_t, s_x_f, T,
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, ACC: tl.constexpr, EARLY: tl.constexpr,
):
    """:func:`_own_fields` when ``EARLY``, else a placeholder (the emit loads them itself)."""
    if EARLY:
        return _own_fields(
            start, n, f, row_ok, lanes,
            p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
            p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t,
            p_x, s_x_n, s_x_t, s_x_f, T, FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC)
    else:
        return start, start, start, start, start, start, start


@triton.jit
def _emit_chunk(
    start, n, f, rows, row_ok, lanes, zu, zv, iu, iv, own,
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
    p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
    p_o1, p_o2, s_o_n, s_o_t, s_o_f, p_co,
    T, gamma, lam, rho_bar, c_bar, pg_rho_bar, decay,
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, ACC: tl.constexpr, REVERSE: tl.constexpr,
    WRITE_CARRY: tl.constexpr, TWO_OUT: tl.constexpr, ADV_OUT: tl.constexpr, OWN_INCL: tl.constexpr,
    EARLY: tl.constexpr,
):
    """Outputs of one chunk from the steps' own fields and the exclusive state ``(zu, zv)``
    (``Z_{t+1}`` backward, ``F_{t−1}`` forward); writes them once, 0 at masked steps. With
    ``WRITE_CARRY`` the row's carry out (the inclusive state ``(iu, iv)`` at t = 0, or ``final`` at
    t = T−1) is stored by the chunk that holds that step. ``EARLY``: the own fields were loaded
    before the scan (``own``, from :func:`_own_fields`); otherwise they are loaded here."""
    o_t = start + lanes
    ok_t = row_ok & (o_t < T)
    if EARLY:
        r, v, k, tr, boot, live, ratio = own
    else:
        r, v, k, tr, boot, live, ratio = _own_fields(
            start, n, f, row_ok, lanes,
            p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
            p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t,
            p_x, s_x_n, s_x_t, s_x_f, T, FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC)
    if REVERSE:
        edge = o_t == 0
    else:
        edge = o_t == T - 1
    if WRITE_CARRY:
        has = (tl.max(edge.to(tl.int32), axis=1) > 0) & (tl.max(row_ok.to(tl.int32), axis=1) > 0)
    if FAMILY == 2:
        rho = tl.minimum(ratio, rho_bar)
        c = lam * tl.minimum(ratio, c_bar)
        out1, out2 = vtrace_out(r, v, k, tr, boot, rho, c, tl.minimum(ratio, pg_rho_bar), gamma, zu, zv)
        if WRITE_CARRY:
            if not OWN_INCL:  # the inclusive state from the step's own map and the exclusive one
                p0, q0, s0, a0, w0 = vtrace_step(r, v, k, tr, boot, rho, c, gamma)
                iu = tl.where(live, a0 + p0 * zu + q0 * zv, zu)
                iv = tl.where(live, w0 + s0 * zv, zv)
            tl.store(p_co + rows * 2, tl.sum(tl.where(edge, iu, 0.0), axis=1).to(p_co.dtype.element_ty), mask=has)
            tl.store(p_co + rows * 2 + 1, tl.sum(tl.where(edge, iv, 0.0), axis=1).to(p_co.dtype.element_ty), mask=has)
    else:
        if FAMILY == 3:
            out1 = trace_out(r, decay, zu)
            out2 = out1 - v
        elif FAMILY == 4:
            out1 = r + v * zu
            out2 = out1 - v
        elif FAMILY == 5:
            out1, out2 = lambda_adjoint_out(r + v, v, lam, zu)
        else:
            out1 = lambda_out(r, k, tr, boot, gamma, zu)
            out2 = out1 - v
        if WRITE_CARRY:
            if not OWN_INCL:
                if FAMILY == 0:
                    a0, b0 = lambda_step(r, v, k, tr, boot, gamma, lam)
                elif FAMILY == 1:
                    ratio0 = _ratio(p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, n, o_t, ok_t, live, HAS_M, ACC)
                    q0 = _ld_live(p_q, n * s_q_n + o_t * s_q_t, ok_t, live, HAS_M, ACC)
                    a0, b0 = retrace_step(r, v, k, tr, boot, q0, lam * tl.minimum(ratio0, c_bar), gamma)
                elif FAMILY == 3:
                    a0, b0 = trace_step(r, k, tr, decay)
                elif FAMILY == 5:
                    a0, b0 = lambda_adjoint_step(r + v, k, tr, gamma, lam)
                else:
                    a0, b0 = r, v
                iu = tl.where(live, a0 + b0 * zu, zu)
            tl.store(p_co + rows, tl.sum(tl.where(edge, iu, 0.0), axis=1).to(p_co.dtype.element_ty), mask=has)
    o_off = n * s_o_n + f * s_o_f + o_t * s_o_t
    if ADV_OUT:  # GAE: advantages = G − V first, returns = G second
        tl.store(p_o1 + o_off, tl.where(live, out2, 0.0).to(p_o1.dtype.element_ty), mask=ok_t)
        tl.store(p_o2 + o_off, tl.where(live, out1, 0.0).to(p_o2.dtype.element_ty), mask=ok_t)
    else:
        tl.store(p_o1 + o_off, tl.where(live, out1, 0.0).to(p_o1.dtype.element_ty), mask=ok_t)
        if TWO_OUT:
            tl.store(p_o2 + o_off, tl.where(live, out2, 0.0).to(p_o2.dtype.element_ty), mask=ok_t)


@triton.jit
def _apply(e0, e1, e2, e3, e4, cu, cv, PAIR: tl.constexpr):
    """The state after the map ``e`` applied to the carry ``(cu, cv)`` (broadcast over lanes)."""
    if PAIR:
        return e3 + e0 * cu + e1 * cv, e4 + e2 * cv
    else:
        return e0 + e1 * cu, cv + tl.zeros_like(e0)


@triton.jit
def _compose_maps(o0, o1, o2, o3, o4, i0, i1, i2, i3, i4, PAIR: tl.constexpr):
    """outer ∘ inner for maps stored as five components."""
    if PAIR:
        return compose_pair(o0, o1, o2, o3, o4, i0, i1, i2, i3, i4)
    else:
        a, b = compose(o0, o1, i0, i1)
        return a, b, a, a, a


@triton.jit
def _shift(x, c, lanes, REVERSE: tl.constexpr, BLOCK_T: tl.constexpr):
    """The state one step further along the scan: lane t takes lane t+1 (backward) or t−1
    (forward) of ``x``; the lane at the chunk's far edge takes the carry ``c`` ([BLOCK_N, 1])."""
    if REVERSE:
        idx = tl.minimum(lanes + 1, BLOCK_T - 1)
        far = lanes == BLOCK_T - 1
    else:
        idx = tl.maximum(lanes - 1, 0)
        far = lanes == 0
    idx = idx + tl.zeros_like(x).to(tl.int32)
    return tl.where(far, c, tl.gather(x, idx, 1))


@triton.jit
def _edge(x, lanes, EDGE: tl.constexpr):
    return tl.sum(tl.where(lanes == EDGE, x, 0.0), axis=1)


@triton.jit
def _carry_and_emit(
    e0, e1, e2, e3, e4, cu, cv, own, start, n, f, rows, row_ok, lanes,
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
    p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
    p_o1, p_o2, s_o_n, s_o_t, s_o_f, p_co,
    T, gamma, lam, rho_bar, c_bar, pg_rho_bar, decay,
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, ACC: tl.constexpr, REVERSE: tl.constexpr,
    WRITE_CARRY: tl.constexpr, TWO_OUT: tl.constexpr, ADV_OUT: tl.constexpr,
    SHIFT_LOAD: tl.constexpr, BLOCK_T: tl.constexpr, EARLY: tl.constexpr,
):
    """A chunk's scan ``e`` applied to the carry into it ``(cu, cv)``: the inclusive state at every
    lane, the exclusive one (the scan of the neighbours' maps itself with ``SHIFT_LOAD``, else the
    inclusive one shifted by a lane in registers), and the chunk's outputs written. Returns the
    inclusive state."""
    PAIR: tl.constexpr = FAMILY == 2
    iu, iv = _apply(e0, e1, e2, e3, e4, cu[:, None], cv[:, None], PAIR)
    if SHIFT_LOAD:
        zu, zv = iu, iv
    else:
        zu = _shift(iu, cu[:, None], lanes, REVERSE, BLOCK_T)
        if PAIR:
            zv = _shift(iv, cv[:, None], lanes, REVERSE, BLOCK_T)
        else:
            zv = zu
    _emit_chunk(
        start, n, f, rows, row_ok, lanes, zu, zv, iu, iv, own,
        p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
        p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
        p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
        p_o1, p_o2, s_o_n, s_o_t, s_o_f, p_co,
        T, gamma, lam, rho_bar, c_bar, pg_rho_bar, decay,
        FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, REVERSE, WRITE_CARRY, TWO_OUT, ADV_OUT,
        not SHIFT_LOAD, EARLY)
    return iu, iv


@triton.jit
def scan_kernel(
    p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
    p_bv, s_bv_n, s_bv_t, p_m, s_m_n, s_m_t,
    p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t,
    p_x, s_x_n, s_x_t, s_x_f,
    p_o1, p_o2, s_o_n, s_o_t, s_o_f,
    p_ci, p_co, p_ws, p_flag, p_cnt,
    R, T, F, NUM_SEG,
    gamma: "fp64", lam: "fp64", rho_bar: "fp64", c_bar: "fp64", pg_rho_bar: "fp64", decay: "fp64",
    FAMILY: tl.constexpr, HAS_V: tl.constexpr, HAS_K: tl.constexpr, HAS_TR: tl.constexpr,
    BOOT: tl.constexpr, HAS_M: tl.constexpr, CARRY_IN: tl.constexpr, WRITE_CARRY: tl.constexpr,
    TWO_OUT: tl.constexpr, ADV_OUT: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr, SPLIT: tl.constexpr,
    SHIFT_LOAD: tl.constexpr, SINGLE: tl.constexpr, UNIT: tl.constexpr, PHASE: tl.constexpr,
    EARLY: tl.constexpr,
):
    """One program = a tile of ``BLOCK_N`` rows (``R = N·F`` rows in all) and either the whole row,
    walked in ``BLOCK_T`` chunks with the carry in registers (``SPLIT`` off), or one chunk of it
    (``SPLIT``: ``NUM_SEG`` programs share a row and pass the carry by a decoupled look-back).

    CARRY_IN: 0 = zero (terminal window end, forward default), 1 = V(s_T) read at the last column
    (0 if that step terminated), 2 = explicit carry / initial from ``p_ci``, 3 = V(s_T) read at the
    last unmasked step of each row (0 if that step terminated).

    PHASE (split rows only): 0 = one pass, chunks chained by the decoupled look-back; 1 = the first
    of three passes: every chunk stores its aggregate map (the first chunk in scan order: its
    inclusive state, from the row's carry in) and writes nothing else; :func:`resolve_kernel`
    then turns the aggregates into every chunk's inclusive state; 2 = the last pass: every chunk
    reads its predecessor's inclusive state and writes its outputs. No atomics, no waiting.

    EARLY: the fields a chunk's outputs read at its own steps are loaded before its scan, so that
    their memory latency overlaps the scan (more registers held across it), instead of after it.

    UNIT: 1 = every field read along time and every output has time stride 1 (env-major), 2 = row
    stride 1 (time-major); both with one feature. That stride (and F) becomes the constant 1, so the compiler knows
    the offsets are contiguous along it and vectorises the loads and stores (a runtime stride,
    even one equal to 1, makes every access a scalar one with a multiply); 0 = general strides.
    """
    if UNIT == 1:
        F = 1
        s_o_f = 1
        s_x_f = 1
        s_r_t = 1
        s_v_t = 1
        s_k_t = 1
        s_tr_t = 1
        s_bv_t = 1
        s_m_t = 1
        s_lp_t = 1
        s_tlp_t = 1
        s_q_t = 1
        s_x_t = 1
        s_o_t = 1
    elif UNIT == 2:
        F = 1
        s_o_f = 1
        s_x_f = 1
        s_r_n = 1
        s_v_n = 1
        s_k_n = 1
        s_tr_n = 1
        s_bv_n = 1
        s_m_n = 1
        s_lp_n = 1
        s_tlp_n = 1
        s_q_n = 1
        s_x_n = 1
        s_o_n = 1
    PAIR: tl.constexpr = FAMILY == 2
    # scalars arrive in float64 (exact for float64 rollouts) and are rounded once to ACC
    gamma = tl.full((), gamma, ACC)
    lam = tl.full((), lam, ACC)
    rho_bar = tl.full((), rho_bar, ACC)
    c_bar = tl.full((), c_bar, ACC)
    pg_rho_bar = tl.full((), pg_rho_bar, ACC)
    decay = tl.full((), decay, ACC)
    if REVERSE:
        EDGE: tl.constexpr = 0
    else:
        EDGE: tl.constexpr = BLOCK_T - 1
    # SHIFT_LOAD: scan the neighbours' coefficients (reloaded one step over: the scan *is* the
    # exclusive state); otherwise scan the own coefficients and shift the state in registers.
    if SHIFT_LOAD:
        if REVERSE:
            D: tl.constexpr = 1
        else:
            D: tl.constexpr = -1
    else:
        D: tl.constexpr = 0

    if SPLIT:
        # programs take tickets in the order they start: a program only ever waits for programs
        # that started before it, so the look-back cannot deadlock
        # consecutive tickets go to different row tiles at the same rank, so that the programs in
        # flight advance many rows' chains at once instead of queueing along one row
        if PHASE == 0:
            vid = tl.atomic_add(p_cnt, 1).to(tl.int64)
        else:  # the passes never wait on each other inside a launch
            vid = tl.program_id(0).to(tl.int64)
        tiles = tl.cdiv(R, BLOCK_N)
        tile = vid % tiles
        rank = vid // tiles  # 0 = first in scan order
    else:
        tile = tl.program_id(0).to(tl.int64)
        rank = tile * 0
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [BLOCK_N]
    row_ok = rows < R
    n = (rows // F)[:, None]
    f = (rows % F)[:, None]
    row_ok2 = row_ok[:, None]
    lanes = tl.arange(0, BLOCK_T)[None, :]

    b_bv_row = tl.zeros([BLOCK_N, 1], dtype=ACC)
    if BOOT == 1:
        b_bv_row = tl.load(p_bv + n * s_bv_n, mask=row_ok2, other=0).to(ACC)

    # ---- the carry past the row, in scan order ---------------------------------------------
    cu = tl.zeros([BLOCK_N], dtype=ACC)
    cv = tl.zeros([BLOCK_N], dtype=ACC)
    if CARRY_IN == 2:
        if PAIR:
            cu = tl.load(p_ci + rows * 2, mask=row_ok, other=0).to(ACC)
            cv = tl.load(p_ci + rows * 2 + 1, mask=row_ok, other=0).to(ACC)
        else:
            cu = tl.load(p_ci + rows, mask=row_ok, other=0).to(ACC)
    if CARRY_IN == 1 or CARRY_IN == 3:
        # V(s_T) at the window end, never read if that step terminated. CARRY_IN = 1: the last
        # column; 3: the last unmasked step of each row, found by reading the mask backward from
        # the row's end, one chunk at a time (1 byte per step, usually one chunk); a row with no
        # unmasked step passes V(s_T) of its last column through
        nn = rows // F
        j_end = tl.zeros([BLOCK_N], dtype=tl.int64) + (T - 1)
        live_end = row_ok
        if CARRY_IN == 3:
            last = tl.full([BLOCK_N], -1, tl.int64)
            # (a tensor even when T = 1, which Triton specialises to a compile-time 1)
            c = (tl.zeros([], dtype=tl.int64) + T - 1) // BLOCK_T
            if SPLIT:  # only the first program in scan order (the row's last chunk) needs it
                c = tl.where(rank == 0, c, -1)
            todo = tl.sum(row_ok.to(tl.int32), axis=0)
            while (c >= 0) & (todo > 0):
                o_c = c * BLOCK_T + lanes
                ok_c = row_ok2 & (o_c < T)
                live_c = tl.load(p_m + nn[:, None] * s_m_n + o_c * s_m_t, mask=ok_c, other=0) != 0
                here = tl.max(tl.where(live_c, o_c, -1), axis=1).to(tl.int64)
                last = tl.where(last < 0, here, last)
                todo = tl.sum(((last < 0) & row_ok).to(tl.int32), axis=0)
                c -= 1
            live_end = row_ok & (last >= 0)
            j_end = tl.where(live_end, last, j_end)
        k_end = tl.zeros([BLOCK_N], dtype=tl.int1)
        if HAS_K:
            k_end = (tl.load(p_k + nn * s_k_n + j_end * s_k_t, mask=row_ok, other=0) != 0) & live_end
        if BOOT == 2:
            b_end = tl.load(p_bv + nn * s_bv_n + j_end * s_bv_t, mask=row_ok & ~k_end, other=0).to(ACC)
        else:
            b_end = tl.where(k_end, 0.0, tl.sum(b_bv_row, axis=1))
        if PAIR:
            cv = b_end
        else:
            cu = b_end

    if SPLIT:
        if REVERSE:
            seg = NUM_SEG - 1 - rank
        else:
            seg = rank
        start = seg * BLOCK_T
        own = _early_fields(
            start, n, f, row_ok2, lanes,
            p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
            p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t,
            p_x, s_x_n, s_x_t, s_x_f, T, FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, EARLY and PHASE != 1)
        e0, e1, e2, e3, e4 = _scan_chunk(
            start, n, f, row_ok2, lanes,
            p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
            p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
            p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
            T, gamma, lam, rho_bar, c_bar, decay,
            FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, REVERSE, D)
        # this chunk's aggregate map (its edge lane)
        g0 = _edge(e0, lanes, EDGE)
        g1 = _edge(e1, lanes, EDGE)
        g2 = _edge(e2, lanes, EDGE)
        g3 = _edge(e3, lanes, EDGE)
        g4 = _edge(e4, lanes, EDGE)
        o_b = tl.arange(0, BLOCK_N)
        slot = tile * NUM_SEG + rank
        p_slot = p_ws + slot * (7 * BLOCK_N) + o_b
        if PHASE == 2:  # the predecessor's inclusive state, resolved by the earlier passes
            if rank > 0:
                p_pr = p_ws + (slot - 1) * (7 * BLOCK_N) + o_b
                cu = tl.load(p_pr + 5 * BLOCK_N)
                cv = tl.load(p_pr + 6 * BLOCK_N)
        elif PHASE == 1:
            if rank > 0:
                tl.store(p_slot, g0)
                tl.store(p_slot + BLOCK_N, g1)
                tl.store(p_slot + 2 * BLOCK_N, g2)
                tl.store(p_slot + 3 * BLOCK_N, g3)
                tl.store(p_slot + 4 * BLOCK_N, g4)
            else:
                iu0, iv0 = _apply(g0, g1, g2, g3, g4, cu, cv, PAIR)
                tl.store(p_slot + 5 * BLOCK_N, iu0)
                tl.store(p_slot + 6 * BLOCK_N, iv0)
        elif rank > 0:
            # publish the aggregate (flag 1), then look back for the carry
            tl.store(p_slot, g0)
            tl.store(p_slot + BLOCK_N, g1)
            tl.store(p_slot + 2 * BLOCK_N, g2)
            tl.store(p_slot + 3 * BLOCK_N, g3)
            tl.store(p_slot + 4 * BLOCK_N, g4)
            tl.debug_barrier()
            tl.atomic_xchg(p_flag + slot, 1, sem="release")
            # M = composition of the aggregates between the found inclusive state and this chunk
            m0 = tl.full([BLOCK_N], 1.0, ACC) if PAIR else tl.zeros([BLOCK_N], dtype=ACC)
            m1 = tl.zeros([BLOCK_N], dtype=ACC) if PAIR else tl.full([BLOCK_N], 1.0, ACC)
            m2 = tl.full([BLOCK_N], 1.0, ACC)
            m3 = tl.zeros([BLOCK_N], dtype=ACC)
            m4 = tl.zeros([BLOCK_N], dtype=ACC)
            pr = rank - 1
            while pr >= 0:
                p_fl = p_flag + tile * NUM_SEG + pr
                fl = tl.atomic_add(p_fl, 0, sem="acquire")
                while fl == 0:
                    fl = tl.atomic_add(p_fl, 0, sem="acquire")
                p_pr = p_ws + (tile * NUM_SEG + pr) * (7 * BLOCK_N) + o_b
                if fl == 2:
                    su = tl.load(p_pr + 5 * BLOCK_N, volatile=True)
                    sv = tl.load(p_pr + 6 * BLOCK_N, volatile=True)
                    cu, cv = _apply(m0, m1, m2, m3, m4, su, sv, PAIR)
                    pr = pr * 0 - 1  # found: stop
                else:
                    a0 = tl.load(p_pr, volatile=True)
                    a1 = tl.load(p_pr + BLOCK_N, volatile=True)
                    a2 = tl.load(p_pr + 2 * BLOCK_N, volatile=True)
                    a3 = tl.load(p_pr + 3 * BLOCK_N, volatile=True)
                    a4 = tl.load(p_pr + 4 * BLOCK_N, volatile=True)
                    m0, m1, m2, m3, m4 = _compose_maps(m0, m1, m2, m3, m4, a0, a1, a2, a3, a4, PAIR)
                    pr -= 1
        if PHASE == 0:
            # publish the inclusive state (flag 2)
            iu, iv = _apply(g0, g1, g2, g3, g4, cu, cv, PAIR)
            tl.store(p_slot + 5 * BLOCK_N, iu)
            tl.store(p_slot + 6 * BLOCK_N, iv)
            tl.debug_barrier()
            tl.atomic_xchg(p_flag + slot, 2, sem="release")
        if PHASE != 1:
            _carry_and_emit(
                e0, e1, e2, e3, e4, cu, cv, own, start, n, f, rows, row_ok2, lanes,
                p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
                p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
                p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
                p_o1, p_o2, s_o_n, s_o_t, s_o_f, p_co,
                T, gamma, lam, rho_bar, c_bar, pg_rho_bar, decay,
                FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, REVERSE, WRITE_CARRY, TWO_OUT, ADV_OUT,
                SHIFT_LOAD, BLOCK_T, EARLY)
        if PHASE == 0:
            # the last program to finish leaves the workspace clean for the next launch
            tl.debug_barrier()
            total = tl.cdiv(R, BLOCK_N) * NUM_SEG
            done = tl.atomic_add(p_cnt + 1, 1, sem="acq_rel")
            if done == total - 1:
                for i in range(0, total, 1024):
                    o_i = i + tl.arange(0, 1024)
                    tl.store(p_flag + o_i, 0, mask=o_i < total)
                tl.store(p_cnt, 0)
                tl.store(p_cnt + 1, 0)
    else:
        num_chunks = (T + BLOCK_T - 1) // BLOCK_T
        for i in range(0, num_chunks):
            if REVERSE:
                start = (num_chunks - 1 - i) * BLOCK_T
            else:
                start = i * BLOCK_T
            own = _early_fields(
                start, n, f, row_ok2, lanes,
                p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
                p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t, p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t,
                p_x, s_x_n, s_x_t, s_x_f, T, FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, EARLY)
            e0, e1, e2, e3, e4 = _scan_chunk(
                start, n, f, row_ok2, lanes,
                p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
                p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
                p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
                T, gamma, lam, rho_bar, c_bar, decay,
                FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, REVERSE, D)
            iu, iv = _carry_and_emit(
                e0, e1, e2, e3, e4, cu, cv, own, start, n, f, rows, row_ok2, lanes,
                p_r, s_r_n, s_r_t, p_v, s_v_n, s_v_t, p_k, s_k_n, s_k_t, p_tr, s_tr_n, s_tr_t,
                p_bv, s_bv_n, s_bv_t, b_bv_row, p_m, s_m_n, s_m_t,
                p_lp, s_lp_n, s_lp_t, p_tlp, s_tlp_n, s_tlp_t, p_q, s_q_n, s_q_t, p_x, s_x_n, s_x_t, s_x_f,
                p_o1, p_o2, s_o_n, s_o_t, s_o_f, p_co,
                T, gamma, lam, rho_bar, c_bar, pg_rho_bar, decay,
                FAMILY, HAS_V, HAS_K, HAS_TR, BOOT, HAS_M, ACC, REVERSE, WRITE_CARRY, TWO_OUT, ADV_OUT,
                SHIFT_LOAD, BLOCK_T, EARLY)
            if not SINGLE:  # the state at the chunk's edge carries into the next chunk
                cu = _edge(iu, lanes, EDGE)
                if PAIR:
                    cv = _edge(iv, lanes, EDGE)


@triton.jit
def resolve_kernel(p_ws, NUM_SEG, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, PAIR: tl.constexpr):
    """The middle pass of a three-pass split (``PHASE``): in each row tile, every chunk's inclusive
    state, from the first chunk's (stored by pass 1 with the row's carry in) and the later chunks'
    aggregate maps — a scan over the chunks in scan order, ``BLOCK_R`` of them at a time, the state
    carried between blocks. Workspace slot ``tile · NUM_SEG + rank`` holds 7 × BLOCK_N values: the
    map's five components, then the inclusive state (u, v)."""
    tile = tl.program_id(0).to(tl.int64)
    o_b = tl.arange(0, BLOCK_N)[None, :]
    base = p_ws + tile * NUM_SEG * (7 * BLOCK_N)
    cu = tl.load(base + 5 * BLOCK_N + o_b)  # [1, BLOCK_N]
    cv = tl.load(base + 6 * BLOCK_N + o_b)
    ranks = tl.arange(0, BLOCK_R)[:, None]
    last = ranks == BLOCK_R - 1
    for r0 in range(1, NUM_SEG, BLOCK_R):
        rr = r0 + ranks
        ok = (rr < NUM_SEG) & (o_b >= 0)
        p = base + rr * (7 * BLOCK_N) + o_b
        if PAIR:  # identity past the last chunk: (1, 0, 1, 0, 0)
            a0 = tl.load(p, mask=ok, other=1.0)
            a1 = tl.load(p + BLOCK_N, mask=ok, other=0.0)
            a2 = tl.load(p + 2 * BLOCK_N, mask=ok, other=1.0)
            a3 = tl.load(p + 3 * BLOCK_N, mask=ok, other=0.0)
            a4 = tl.load(p + 4 * BLOCK_N, mask=ok, other=0.0)
            m0, m1, m2, m3, m4 = tl.associative_scan((a0, a1, a2, a3, a4), 0, _combine_pair)
        else:  # identity: (0, 1)
            a0 = tl.load(p, mask=ok, other=0.0)
            a1 = tl.load(p + BLOCK_N, mask=ok, other=1.0)
            m0, m1 = tl.associative_scan((a0, a1), 0, _combine)
            m2 = m0
            m3 = m0
            m4 = m0
        su, sv = _apply(m0, m1, m2, m3, m4, cu, cv, PAIR)
        tl.store(p + 5 * BLOCK_N, su, mask=ok)
        tl.store(p + 6 * BLOCK_N, sv, mask=ok)
        # padded chunks are the identity: the state at the block's last lane is the carry
        cu = tl.sum(tl.where(last, su, 0.0), axis=0)[None, :]
        cv = tl.sum(tl.where(last, sv, 0.0), axis=0)[None, :]
