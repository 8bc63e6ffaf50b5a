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
    """``y_t = α_t + β_t·y_{t±1}`` along the last dim with ``y`` outside the row = ``initial``.

    Differentiable with an analytic backward (the adjoint is the same scan run the other way,
    :mod:`rollbuf.autograd`), so autograd does not record the blocked scan's inner steps."""
    from rollbuf import autograd

    alpha, beta = torch.broadcast_tensors(alpha, beta)
    return autograd.affine_scan(alpha, beta, reverse, initial)


def affine_scan_torch(alpha, beta, reverse, initial):
    """The blocked scan itself (no autograd Function): see :func:`affine_scan`."""
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
    return f if f.dtype == torch.bool else f != 0


_PAIR_IDENTITY = (1.0, 0.0, 1.0, 0.0, 0.0)  # (p, q, s, a, w) of the identity map on (u, V)


def _steps(p: Problem):
    """The per-step maps of ``p``'s scan (masked steps the identity) and the fields the epilogue reads.

    Returns ``(elems, compose, identity, reverse, env)``: ``elems`` a tuple of ``[N, T]`` tensors
    (the trace family: ``α`` ``[N, *F, T]`` and ``β`` ``[N, 1.., T]``, broadcastable), ``env`` a dict
    of the loaded fields (``r, k, tr, boot, v, ...``). Shared by :func:`run` and :func:`window_map`.
    """
    dt = p.compute_dtype
    m = _flag(p, "mask")

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

    env = {"m": m}
    if p.family == "trace":
        x = load("x").movedim(1, -1)  # [N, T, *F] -> [N, *F, T]
        lift = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)  # flags [N, T] -> [N, 1.., T]
        k, tr = flag("terminated", x), flag("truncated", x)
        k, tr = (f if f.dim() == 0 else f.reshape(lift) for f in (k, tr))
        alpha, beta = C.trace_step(x, k, tr, p.decay)
        beta = torch.as_tensor(beta, dtype=dt, device=x.device).expand(lift)  # flags only: no *F
        if m is not None:
            alpha = torch.where(m.reshape(lift), alpha, 0)
            beta = torch.where(m.reshape(lift), beta, 1)
        env.update(x=x, lift=lift)
        return (alpha, beta), C.compose, (0.0, 1.0), False, env

    r = load("rewards")
    k = flag("terminated", r)
    tr = flag("truncated", r)
    boot = _read_bootstrap(p, dt, m)
    env.update(r=r, k=k, tr=tr, boot=boot)
    if p.family == "lambda":
        v = load("values") if p.fields.get("values") is not None else torch.zeros_like(r)
        env.update(v=v)
        elems = C.lambda_step(r, v, k, tr, boot, p.gamma, p.lam)
    else:
        v = load("values")
        ratio = torch.exp(load("target_log_probs") - load("log_probs"))
        c = p.lam * torch.clamp(ratio, max=p.c_bar)
        env.update(v=v, c=c)
        if p.family == "retrace":
            elems = C.retrace_step(r, v, k, tr, boot, load("q_values"), c, p.gamma)
        else:
            assert p.family == "vtrace"
            rho = torch.clamp(ratio, max=p.rho_bar)
            env.update(rho=rho, rho_pg=torch.clamp(ratio, max=p.pg_rho_bar))
            elems = C.vtrace_step(r, v, k, tr, boot, rho, c, p.gamma)
            elems = [torch.as_tensor(e, dtype=dt, device=r.device) for e in elems]
            elems = torch.broadcast_tensors(*elems)
            if m is not None:
                elems = tuple(torch.where(m, e, i) for e, i in zip(elems, _PAIR_IDENTITY))
            return tuple(elems), C.compose_pair, _PAIR_IDENTITY, True, env
    alpha, beta = torch.broadcast_tensors(*elems)
    if m is not None:
        alpha = torch.where(m, alpha, 0)
        beta = torch.where(m, beta, 1)
    return (alpha, beta), C.compose, (0.0, 1.0), True, env


def compose_all(elems, compose, identity, reverse):
    """The composition of all the maps along the last dim: the inclusive scan at the row's first
    element in scan order (``reverse=True``: step 0, the map from ``Z_T`` to ``Z_0``; forward: step
    ``T−1``, the map from ``F_{−1}`` to ``F_{T−1}``), without the scan's per-step outputs.

    A pairwise tree reduction (``ceil(log2 T)`` halvings, ``O(N·T)`` work); elements may have
    broadcastable leading shapes. ``T = 0`` gives the identity.
    """
    while elems[0].shape[-1] > 1:
        if elems[0].shape[-1] % 2:  # identity past the row's end: applied innermost / outermost
            elems = tuple(torch.cat([e, e.new_full((*e.shape[:-1], 1), i)], dim=-1)
                          for e, i in zip(elems, identity))
        even = [e[..., 0::2] for e in elems]
        odd = [e[..., 1::2] for e in elems]
        # backward: step t is applied after step t+1 (t outer); forward: t+1 outer
        elems = compose(*even, *odd) if reverse else compose(*odd, *even)
    if elems[0].shape[-1] == 0:
        return tuple(e.new_full(e.shape[:-1], i) for e, i in zip(elems, identity))
    return tuple(e[..., 0] for e in elems)


def window_map(p: Problem):
    """The affine map of a whole window ``p`` (its carry ignored), for chaining windows without
    running them: what :func:`run` would compose, as :func:`compose_all` of the same step maps.

    * ``lambda`` / ``retrace``: ``(a, b)``, each ``[N]``: ``Z_0 = a + b·Z_T``;
    * ``vtrace``: ``(p, q, s, a, w)``, each ``[N]``: ``(u_0, V_0) = (a + p·u_T + q·V_T, w + s·V_T)``;
    * ``trace``: ``(a, b)``, ``a`` ``[N, *F]``, ``b`` ``[N]``: ``final = F_{T−1} = a + b·initial``.

    Used by :mod:`rollbuf.distributed` (on any device: it is plain torch).
    """
    elems, compose, identity, reverse, _ = _steps(p)
    out = compose_all(elems, compose, identity, reverse)
    if p.family == "trace":
        a, b = out
        return a, b.reshape(b.shape[0])
    return out


def run(p: Problem):
    """Run one prepared problem. Returns ``(outputs, carry)``, outputs at masked steps are 0."""
    if p.family == "affine":  # the public primitive: α and β given as data
        dt = p.compute_dtype
        init = p.carry.to(dt)
        y = affine_scan(p.fields["x"].to(dt), p.fields["values"].to(dt), p.reverse, init)
        final = (y[..., 0] if p.reverse else y[..., -1]) if y.shape[-1] else init
        return (y, final), None
    dt = p.compute_dtype
    elems, _, _, _, env = _steps(p)
    m = env["m"]

    if p.family == "trace":
        alpha, beta = elems
        x, lift = env["x"], env["lift"]
        init = torch.zeros(x.shape[:-1], dtype=dt, device=x.device) if p.carry is None else p.carry.to(dt)
        incl = affine_scan(alpha, beta, reverse=False, initial=init)
        out = C.trace_out(x, p.decay, _exclusive(incl, init, reverse=False))
        if m is not None:
            out = torch.where(m.reshape(lift), out, 0)
        final = incl[..., -1] if incl.shape[-1] else init
        return (out.movedim(-1, 1), final), None

    r, k, tr, boot, v = (env[n] for n in ("r", "k", "tr", "boot", "v"))
    carry = _window_end_carry(p, dt, m)

    if p.family == "lambda":
        z_next, z0 = _scalar_scan(*elems, carry)
        g = C.lambda_out(r, k, tr, boot, p.gamma, z_next)
        outs = (g - v, g) if p.outputs == ("advantages", "returns") else (g,)
        return _masked(outs, m), z0

    if p.family == "retrace":
        z_next, z0 = _scalar_scan(*elems, carry)
        return _masked((C.lambda_out(r, k, tr, boot, p.gamma, z_next),), m), z0

    assert p.family == "vtrace"
    # The pair maps (u, V) -> (a + p·u + q·V, w + s·V) are upper triangular: V never reads u. So
    # the pair scan is two scalar scans, V first (V_t = w_t + s_t·V_{t+1}), then u with the V state
    # folded into its α (u_t = a_t + q_t·V_{t+1} + p_t·u_{t+1}); each has the analytic adjoint.
    P, Q, S, A, W = elems
    cu, cv = carry[..., 0], carry[..., 1]
    v_incl = affine_scan(W, S, reverse=True, initial=cv)
    v_next = _exclusive(v_incl, cv, reverse=True)
    u_incl = affine_scan(A + Q * v_next, P, reverse=True, initial=cu)
    u_next = _exclusive(u_incl, cu, reverse=True)
    vs, pg = C.vtrace_out(r, v, k, tr, boot, env["rho"], env["c"], env["rho_pg"], p.gamma, u_next,
                          v_next)
    carry_out = torch.stack([u_incl[..., 0], v_incl[..., 0]], -1) if r.shape[-1] else carry
    return _masked((vs, pg), m), carry_out


def _scalar_scan(alpha, beta, carry):
    """Backward scan of already masked ``(α, β)``: ``(Z_{t+1} for every t, Z_0)``."""
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
