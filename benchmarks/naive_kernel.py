"""GAE as the simplest Triton kernel (the ``naive-triton`` competitor of
:mod:`benchmarks.competitors`, a baseline for rollbuf's kernel): one program per row (or a few
short rows), the whole row in one block, ``tl.associative_scan`` over it; flags read as 0/1, the
``[N]`` window-end values. Imported when the competitor is first used (it needs Triton)."""

import triton
import triton.language as tl


@triton.jit
def _combine(a1, b1, a2, b2):
    return a2 + b2 * a1, b1 * b2


@triton.jit
def naive_gae(p_r, p_v, p_d, p_last, p_adv, p_ret, N, T, gamma, lam,
              BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, WRITE_RET: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
    t = tl.arange(0, BLOCK_T)[None, :]
    ok = (rows < N) & (t < T)
    off = rows.to(tl.int64) * T + t
    r = tl.load(p_r + off, mask=ok, other=0.0)
    v = tl.load(p_v + off, mask=ok, other=0.0)
    nd = 1.0 - tl.load(p_d + off, mask=ok, other=0).to(tl.float32)
    v_next = tl.load(p_v + off + 1, mask=ok & (t + 1 < T), other=0.0)
    last = tl.load(p_last + rows, mask=rows < N, other=0.0)
    v_next = tl.where(t == T - 1, last, v_next)
    delta = tl.where(ok, r + gamma * nd * v_next - v, 0.0)
    coef = tl.where(ok, gamma * lam * nd, 1.0)
    adv, _ = tl.associative_scan((delta, coef), 1, _combine, reverse=True)
    tl.store(p_adv + off, adv, mask=ok)
    if WRITE_RET:
        tl.store(p_ret + off, adv + v, mask=ok)
