"""The ``torch`` backend: every estimator as one vectorised affine scan, no Python loop over time.

The scan is a doubling (Hillis–Steele) scan in linear space: ``ceil(log2 T)`` passes, each one
composition of every element with the one ``2^j`` steps further along. No cumulative products of
discounts or logarithms are formed, so nothing underflows at long ``T`` or as ``γλ → 1``; each
output is a composition of ``O(log T)`` rounded maps.

The coefficients and outputs come from :mod:`rollbuf.boundary.coefficients`, the same functions the
Triton kernels compile. This module only loads the fields (zeroing whatever must not be read),
applies the mask identity, scans, and applies the epilogue.
"""

from __future__ import annotations

import torch

from rollbuf.boundary import coefficients as C
from rollbuf.problem import Problem


def _shift_compose(elems, compose, off, reverse):
    """One doubling pass: element t becomes elem_t ∘ elem_{t±off} (the farther one applied first)."""
    if reverse:  # backward: y_t = α_t + β_t·y_{t+1}; t composes with t+off (inner)
        head = compose(*[e[..., :-off] for e in elems], *[e[..., off:] for e in elems])
        return tuple(torch.cat([h, e[..., -off:]], dim=-1) for h, e in zip(head, elems))
    head = compose(*[e[..., off:] for e in elems], *[e[..., :-off] for e in elems])
    return tuple(torch.cat([e[..., :off], h], dim=-1) for h, e in zip(head, elems))


def doubling_scan(elems, compose, reverse):
    """Inclusive scan of maps along the last dim; ``elems`` is a tuple of same-shape tensors."""
    T = elems[0].shape[-1]
    off = 1
    while off < T:
        elems = _shift_compose(elems, compose, off, reverse)
        off *= 2
    return elems


BLOCK = 32  # steps per block of the blocked scan (products of at most 32 discounts per block)


def blocked_scan(elems, compose, identity, reverse):
    """Inclusive scan of maps along the last dim, as a two-level blocked scan.

    1. inside blocks of ``BLOCK`` steps: a loop over the block's steps, vectorised over every block
       of every row at once (``BLOCK`` iterations, each a few ops on ``N·T/BLOCK`` elements);
    2. across blocks: a doubling scan of the block aggregates (``log2(T/BLOCK)`` passes on
       ``N·T/BLOCK`` elements), shifted to the map of everything past each block;
    3. every step's map composed with its block's carry map (one pass over ``N·T``).
    Work ``O(N·T)``, ``BLOCK + log2(T/BLOCK)`` small Python steps, all in linear space.
    """
    T = elems[0].shape[-1]
    if T <= BLOCK:
        return doubling_scan(elems, compose, reverse)
    C = -(-T // BLOCK)
    pad = C * BLOCK - T
    lead = elems[0].shape[:-1]
    blocks = []
    for e, i in zip(elems, identity):
        if pad:
            e = torch.cat([e, e.new_full((*lead, pad), i)], dim=-1)  # identity past the row
        blocks.append(e.reshape(*lead, C, BLOCK).movedim(-1, 0).contiguous())  # [BLOCK, *lead, C]
    # 1. within blocks, in scan order
    order = range(BLOCK - 1, -1, -1) if reverse else range(BLOCK)
    state = None
    local = [torch.empty_like(b) for b in blocks]
    for j in order:
        step = tuple(b[j] for b in blocks)
        state = step if state is None else compose(*step, *state)
        for out, s_ in zip(local, state):
            out[j] = s_
    # 2. across blocks: aggregate of each block = its local map at the block's first step in scan order
    edge = 0 if reverse else BLOCK - 1
    agg = doubling_scan(tuple(x[edge] for x in local), compose, reverse)  # [*lead, C]
    ident = [torch.full_like(a[..., :1], i) for a, i in zip(agg, identity)]
    if reverse:  # carry map of block c: everything after it
        carry = tuple(torch.cat([a[..., 1:], i_], dim=-1) for a, i_ in zip(agg, ident))
    else:
        carry = tuple(torch.cat([i_, a[..., :-1]], dim=-1) for a, i_ in zip(agg, ident))
    # 3. every step composed with its block's carry map
    full = compose(*local, *[c.unsqueeze(0) for c in carry])
    return tuple(f.movedim(0, -1).reshape(*lead, C * BLOCK)[..., :T] for f in full)


def affine_scan(alpha, beta, reverse, initial):
    """``y_t = α_t + β_t·y_{t±1}`` along the last dim with ``y`` outside the row = ``initial``."""
    alpha, beta = torch.broadcast_tensors(alpha, beta)
    a, b = blocked_scan((alpha, beta), C.compose, (0.0, 1.0), reverse)
    return a + b * initial.unsqueeze(-1)


def _exclusive(incl, carry, reverse):
    """State one step further along the scan: ``Z_{t+1}`` (backward) or ``F_{t−1}`` (forward)."""
    c = carry.unsqueeze(-1).to(incl.dtype)
    if reverse:
        return torch.cat([incl[..., 1:], c], dim=-1)
    return torch.cat([c, incl[..., :-1]], dim=-1)


def _flag(p: Problem, name):
    f = p.fields.get(name)
    if f is None:
        return None
    return f != 0


def run(p: Problem):
    """Run one prepared problem. Returns ``(outputs, carry)``, outputs at masked steps are 0."""
    dt = p.compute_dtype
    m = _flag(p, "mask")
    mf = None if m is None else m.to(dt)

    def load(name):
        x = p.fields.get(name)
        if x is None:
            return None
        x = x.to(dt)
        return x if m is None else torch.where(m.reshape(m.shape + (1,) * (x.dim() - 2)), x, 0)

    def flag(name, like):
        f = _flag(p, name)
        if f is None:
            return torch.zeros((), dtype=dt, device=like.device)
        f = f if m is None else f & m
        return f.to(dt)

    if p.family == "trace":
        x = load("x").movedim(1, -1)  # [N, T, *F] -> [N, *F, T]
        lift = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)  # flags [N, T] -> [N, 1.., T]
        k, tr = flag("terminated", x), flag("truncated", x)
        k, tr = (f if f.dim() == 0 else f.reshape(lift) for f in (k, tr))
        alpha, beta = torch.broadcast_tensors(*C.trace_step(x, k, tr, p.decay))
        if m is not None:
            alpha = torch.where(m.reshape(lift), alpha, 0)
            beta = torch.where(m.reshape(lift), beta, 1)
        init = torch.zeros(x.shape[:-1], dtype=dt, device=x.device) if p.carry is None else p.carry.to(dt)
        incl = affine_scan(alpha, beta, reverse=False, initial=init)
        out = C.trace_out(x, p.decay, _exclusive(incl, init, reverse=False))
        if m is not None:
            out = torch.where(m.reshape(lift), out, 0)
        final = incl[..., -1] if incl.shape[-1] else init
        return (out.movedim(-1, 1), final), None

    r = load("rewards")
    k = flag("terminated", r)
    tr = flag("truncated", r)
    boot = _read_bootstrap(p, dt, m)
    carry = _window_end_carry(p, dt, m)

    if p.family == "lambda":
        v = load("values") if p.fields.get("values") is not None else torch.zeros_like(r)
        alpha, beta = C.lambda_step(r, v, k, tr, boot, p.gamma, p.lam)
        z_next, z0 = _scalar_scan(alpha, beta, mf, carry)
        g = C.lambda_out(r, k, tr, boot, p.gamma, z_next)
        outs = (g - v, g) if p.outputs == ("advantages", "returns") else (g,)
        return _masked(outs, m), z0

    v = load("values")
    ratio = torch.exp(load("target_log_probs") - load("log_probs"))
    c = p.lam * torch.clamp(ratio, max=p.c_bar)
    if p.family == "retrace":
        q = load("q_values")
        alpha, beta = C.retrace_step(r, v, k, tr, boot, q, c, p.gamma)
        z_next, z0 = _scalar_scan(alpha, beta, mf, carry)
        return _masked((C.lambda_out(r, k, tr, boot, p.gamma, z_next),), m), z0

    assert p.family == "vtrace"
    rho = torch.clamp(ratio, max=p.rho_bar)
    rho_pg = torch.clamp(ratio, max=p.pg_rho_bar)
    elems = C.vtrace_step(r, v, k, tr, boot, rho, c, p.gamma)
    elems = torch.broadcast_tensors(*[torch.as_tensor(e, dtype=dt, device=r.device) for e in elems])
    if mf is not None:
        ident = (1.0, 0.0, 1.0, 0.0, 0.0)
        elems = tuple(torch.where(m, e, i) for e, i in zip(elems, ident))
    P, Q, S, A, W = blocked_scan(elems, C.compose_pair, (1.0, 0.0, 1.0, 0.0, 0.0), reverse=True)
    cu, cv = carry[..., 0], carry[..., 1]
    u_incl = A + P * cu.unsqueeze(-1) + Q * cv.unsqueeze(-1)
    v_incl = W + S * cv.unsqueeze(-1)
    u_next = _exclusive(u_incl, cu, reverse=True)
    v_next = _exclusive(v_incl, cv, reverse=True)
    vs, pg = C.vtrace_out(r, v, k, tr, boot, rho, c, rho_pg, p.gamma, u_next, v_next)
    carry_out = torch.stack([u_incl[..., 0], v_incl[..., 0]], -1) if r.shape[-1] else carry
    return _masked((vs, pg), m), carry_out


def _scalar_scan(alpha, beta, mf, carry):
    alpha, beta = torch.broadcast_tensors(alpha, beta)
    if mf is not None:
        alpha = torch.where(mf != 0, alpha, 0)
        beta = torch.where(mf != 0, beta, 1)
    incl = affine_scan(alpha, beta, reverse=True, initial=carry)
    z0 = incl[..., 0] if incl.shape[-1] else carry
    return _exclusive(incl, carry, reverse=True), z0


def _masked(outs, m):
    if m is None:
        return outs
    return tuple(torch.where(m, o, 0) for o in outs)


def _read_bootstrap(p: Problem, dt, m):
    """``B_t``: bootstrap values where a truncated (unmasked) step reads them, 0 elsewhere."""
    bv = p.fields.get("bootstrap_values")
    tr = _flag(p, "truncated")
    r = p.fields["rewards"]
    if bv is None or tr is None or p.family == "lambda" and p.no_bootstrap:
        return torch.zeros((), dtype=dt, device=r.device)
    read = tr
    k = _flag(p, "terminated")
    if k is not None:
        read = read & ~k  # terminated wins: V(s'_t) of a terminal step is never read
    if m is not None:
        read = read & m
    bv = bv.to(dt)
    if bv.dim() == r.dim() - 1:  # [N]: only the window-end column (validated: no interior trunc)
        bv = bv.unsqueeze(-1)
    return torch.where(read, bv, 0)


def last_unmasked_index(m):
    """Index of the last ``True`` of each row (-1 if none), without a device sync."""
    T = m.shape[-1]
    idx = torch.arange(T, device=m.device)
    return torch.where(m, idx, -1).amax(dim=-1) if T else torch.full(m.shape[:-1], -1, device=m.device)


def _window_end_carry(p: Problem, dt, m):
    """The scan state past the window: explicit ``carry``, ``V(s_T)`` or 0 (terminal)."""
    r = p.fields["rewards"]
    N = r.shape[0]
    pair = p.family == "vtrace"
    if p.carry is not None:
        return p.carry.to(dt)
    zero = torch.zeros((N, 2) if pair else (N,), dtype=dt, device=r.device)
    if p.window_end == "terminal" or p.no_bootstrap:
        return zero
    bv = p.fields["bootstrap_values"].to(dt)
    k = _flag(p, "terminated")
    T = r.shape[-1]
    if bv.dim() == 2 or k is not None or m is not None:
        # the window end: the last unmasked step; a row with none passes V(s_T) of its last
        # column straight through (its carry is what the window before it bootstraps from)
        j = torch.full((N,), T - 1, device=r.device, dtype=torch.long)
        live_end = torch.ones(N, dtype=torch.bool, device=r.device)
        if m is not None:
            last = last_unmasked_index(m)
            live_end = last >= 0
            j = torch.where(live_end, last, j).clamp(min=0)
        if bv.dim() == 2:
            bv = bv.gather(-1, j.unsqueeze(-1)).squeeze(-1) if T else zero[..., 0] if pair else zero
        if k is not None and T:
            k_end = k.gather(-1, j.unsqueeze(-1)).squeeze(-1) & live_end  # masked flags are ignored
            bv = torch.where(k_end, 0, bv)  # a terminated window end never reads V(s_T)
    if pair:
        return torch.stack([torch.zeros_like(bv), bv], -1)
    return bv
