"""The ``triton`` backend: launches :func:`rollbuf.kernels.scan.scan_kernel` for a :class:`Problem`.

Inputs are passed with their own strides and dtypes (no copies, no casts: a time-major ``[T, N]``
buffer passed as its transposed view is read in place); flags may be bool, uint8 or float. The only
allocations are the outputs (and the ``[N]`` carry when asked for).
"""

from __future__ import annotations

import torch

from rollbuf.problem import Problem

_DUMMY: dict[torch.device, torch.Tensor] = {}

# Test hooks: fill outputs with NaN before the launch (an unwritten element then fails a
# comparison), and force the chunk length (to exercise the chunk loop at small T).
POISON_OUTPUTS = False
BLOCK_T_OVERRIDE: int | None = None


def _dummy(device):
    d = _DUMMY.get(device)
    if d is None:
        d = _DUMMY[device] = torch.zeros(2, device=device)
    return d


def _ptr(x, device):
    """(tensor, row stride, time stride); bool tensors are read as uint8 (same bytes, a view)."""
    if x is None:
        return _dummy(device), 0, 0
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    if x.dim() == 1:
        return x, x.stride(0), 0
    return x, x.stride(0), x.stride(1)


def _block_t(T: int) -> int:
    import triton

    return max(16, min(1024, triton.next_power_of_2(max(T, 1))))


def run(p: Problem, *, block_t: int | None = None):
    from rollbuf.kernels.scan import FAMILIES, scan_kernel
    from triton.language import float32, float64

    f = p.fields
    main = p.main
    dev = main.device
    N, T = main.shape[0], main.shape[1]
    feat = p.feature_shape
    Fn = 1
    for d in feat:
        Fn *= d
    acc = float64 if p.compute_dtype == torch.float64 else float32
    n_out = len([o for o in p.outputs if o != "final"])
    outs = [torch.empty((N, T, *feat), dtype=p.out_dtype, device=dev) for _ in range(n_out)]
    if POISON_OUTPUTS:
        for o in outs:
            o.fill_(float("nan"))
    pair = p.pair
    is_trace = p.family in ("trace", "affine")
    write_carry = True
    if is_trace:
        carry_out = torch.empty((N, *feat), dtype=p.compute_dtype, device=dev)
    else:
        carry_out = torch.empty((N, 2) if pair else (N,), dtype=p.compute_dtype, device=dev)
    if N == 0 or T == 0 or Fn == 0:
        init = p.carry if p.carry is not None else torch.zeros_like(carry_out)
        if is_trace:
            return tuple(outs) + (init.to(p.compute_dtype),), None
        return tuple(outs), init.to(p.compute_dtype)

    boot = f.get("bootstrap_values")
    if is_trace:
        carry_in_mode = 0 if p.carry is None else 2
    elif p.carry is not None:
        carry_in_mode = 2
    elif p.window_end == "terminal" or p.no_bootstrap:
        carry_in_mode = 0
    else:
        carry_in_mode = 1
    ci = p.carry.contiguous() if p.carry is not None else _dummy(dev)

    r, s_r_n, s_r_t = _ptr(f.get("rewards"), dev)
    v, s_v_n, s_v_t = _ptr(f.get("values"), dev)
    k, s_k_n, s_k_t = _ptr(f.get("terminated"), dev)
    tr, s_tr_n, s_tr_t = _ptr(f.get("truncated"), dev)
    bv, s_bv_n, s_bv_t = _ptr(boot, dev)
    m, s_m_n, s_m_t = _ptr(f.get("mask"), dev)
    lp, s_lp_n, s_lp_t = _ptr(f.get("log_probs"), dev)
    tlp, s_tlp_n, s_tlp_t = _ptr(f.get("target_log_probs"), dev)
    q, s_q_n, s_q_t = _ptr(f.get("q_values"), dev)
    if is_trace:
        x = f["x"].reshape(N, T, Fn) if feat else f["x"].unsqueeze(-1)
        s_x_n, s_x_t, s_x_f = x.stride(0), x.stride(1), x.stride(2)
    else:
        x, s_x_n, s_x_t, s_x_f = _dummy(dev), 0, 0, 0
    o1 = outs[0]
    o2 = outs[1] if n_out > 1 else outs[0]
    s_o_n, s_o_t, s_o_f = T * Fn, Fn, 1
    boot_mode = 0 if boot is None or p.no_bootstrap else (1 if boot.dim() == 1 else 2)
    adv_out = p.outputs == ("advantages", "returns")
    BLOCK_T = block_t or BLOCK_T_OVERRIDE or _block_t(T)

    scan_kernel[(N * Fn,)](
        r, s_r_n, s_r_t, v, s_v_n, s_v_t, k, s_k_n, s_k_t, tr, s_tr_n, s_tr_t,
        bv, s_bv_n, s_bv_t, m, s_m_n, s_m_t,
        lp, s_lp_n, s_lp_t, tlp, s_tlp_n, s_tlp_t, q, s_q_n, s_q_t,
        x, s_x_n, s_x_t, s_x_f,
        o1, o2, s_o_n, s_o_t, s_o_f,
        ci, carry_out,
        T, Fn, p.gamma, p.lam, p.rho_bar, p.c_bar, p.pg_rho_bar, p.decay,
        FAMILY=FAMILIES[p.family], HAS_V=f.get("values") is not None,
        HAS_K=f.get("terminated") is not None, HAS_TR=f.get("truncated") is not None,
        BOOT=boot_mode, HAS_M=f.get("mask") is not None, CARRY_IN=carry_in_mode,
        WRITE_CARRY=write_carry, TWO_OUT=n_out > 1, ADV_OUT=adv_out, ACC=acc, BLOCK_T=BLOCK_T,
        REVERSE=p.family != "trace" and not (p.family == "affine" and not p.reverse),
    )
    if is_trace:
        return tuple(outs) + (carry_out,), None
    return tuple(outs), carry_out


def affine_scan(alpha, beta, reverse, initial, compute_dtype):
    """The public primitive ``y_t = α_t + β_t·y_{t∓1}`` on the kernel (α and β read as data)."""
    p = Problem(family="affine", outputs=("y", "final"), fields={"x": alpha, "values": beta},
                carry=initial, compute_dtype=compute_dtype, out_dtype=compute_dtype, reverse=reverse)
    outs, _ = run(p)
    return outs[0].squeeze(-1)
