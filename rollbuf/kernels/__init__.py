"""The ``triton`` backend: launches :func:`rollbuf.kernels.scan.scan_kernel` for a :class:`Problem`.

Inputs are passed with their own strides and dtypes (no copies, no casts: a time-major ``[T, N]``
buffer passed as its transposed view is read in place, and its outputs are written time-major too);
flags may be bool, uint8 or float. When every field has time stride 1 (or every one row stride 1) the
kernel is told so (``UNIT``), and its loads and stores are vectorised. After the first launch of a
specialisation, later calls launch the compiled kernel directly (``LEAN_LAUNCH``), not through
Triton's argument binder. The only allocations are the outputs (and the ``[N]`` carry when
asked for); rows split across programs pass their carries through a small workspace kept per device,
left clean by every launch.

Strategy per shape (:func:`strategy`): short rows are tiled many to a program; rows up to
``MAX_CHUNK`` steps are one chunk; longer rows are walked in chunks by one program when there are
enough rows to fill the GPU, and otherwise split across programs, one chunk each, chained by a
decoupled look-back (a single row: in three passes instead, chunk aggregates, one scan of them,
outputs). Time-major inputs get tiles that span rows (adjacent in memory): 16 × T tiles
up to 128 steps and 32 × 128 split tiles beyond when rows are few, 16-row walking tiles when many.
The measurements behind both tables are in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import math

import attrs
import torch

from rollbuf.problem import Problem

_DUMMY: dict[torch.device, torch.Tensor] = {}
_WORKSPACE: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

# Test hooks: fill outputs with NaN before the launch (an unwritten element then fails a
# comparison), and force the strategy (to exercise the chunk loop and the split at small T).
POISON_OUTPUTS = False
BLOCK_T_OVERRIDE: int | None = None
SPLIT_OVERRIDE: bool | None = None
SHIFT_LOAD_OVERRIDE: bool | None = None
MAX_CHUNK_OVERRIDE: int | None = None
BLOCK_N_OVERRIDE: int | None = None
NUM_WARPS_OVERRIDE: int | None = None
#: Split rows in three passes (chunk aggregates; one scan over them per row tile; outputs) instead
#: of one pass chained by the decoupled look-back: ``None`` = the strategy's choice (three passes for
#: a single split row, see :data:`PRESOLVE_MAX_ROWS`), ``True``/``False`` = always / never.
PRESOLVE: bool | None = None
RESOLVE_BLOCK_R: int | None = None  # chunks per block of the middle pass (tests force it small)
#: Load the fields a chunk's outputs read before its scan instead of after it (overlap their
#: latency with the scan, at the cost of registers held across it). Off: measured slower in 16 of 17
#: cases on the H200 at aab284d (1.05–1.54×, results/ab_presolve_early_aab284d.csv); kept for A/B runs.
EARLY_LOADS: bool = False
#: ``0``: never tell the kernel that a stride is 1 (the general-stride code, for A/B runs).
UNIT_STRIDE_OVERRIDE: int | None = None
#: Output memory layout: ``None`` = the rule below (time-major outputs for time-major inputs),
#: ``"env"`` = always ``[N, T]`` contiguous, ``"input"`` = always the layout of the main input.
OUTPUT_LAYOUT_OVERRIDE: str | None = None

TILE = 2048  # elements per program for tiles of short rows
FILL_PROGRAMS = 132 * 8  # programs below which long rows are split (132 SMs on an H200)


# Measured on the H200 (GAE fp32 with truncations, every grid shape, commit ae1b2ce, four variants
# side by side; docs/benchmarks.md): the in-register shift (tl.gather) wins for chunks up to 512
# steps (e.g. 39.2 vs 45.6 µs at 32768x128, 74.3 vs 81.0 µs at 16384x512), re-loading the neighbour
# wins from 1024 on (143 vs 183 µs at 16384x1024), and 2048-step chunks beat 1024 from T = 2048 on
# (265 vs 299 µs at 16384x2048; 5.33 vs 5.83 ms at 256x1048576).
GATHER_MAX_T = 512
MAX_CHUNK = 2048
# V-trace carries a pair state (five map components per lane): its 2048-step chunks hold too many
# registers per program. Measured on the H200 at c612211 (benchmarks/ab.py,
# results/ab_unit_chunk_c612211.csv): 1024-step chunks 16384x4096 1672 -> 1134 µs; for GAE the
# same change was +5% at 16384x4096 and +15% at 1x2^20, Retrace +18%.
FAMILY_MAX_CHUNK = {"vtrace": 1024}
# Split rows of at most this many rows take the three passes instead of the look-back chain. Measured
# on the H200 at aab284d (benchmarks/ab.py, results/ab_presolve_*_aab284d.csv): one row the three
# passes win everywhere (GAE 1x2^20 37.6 -> 23.5 µs, 1x2^24 397 -> 270, V-trace 1x2^20 56.2 -> 44.1,
# Retrace 38.7 -> 35.7, GAE 1x65536 12.0 -> 10.4); at two rows it is mixed (GAE 2x131072 0.79x,
# 2x2^20 0.93x, V-trace 2x2^20 1.07x), from four rows on it loses (GAE 4x2^20 1.15x, 8x2^20 1.31x,
# 256x2^20 1.75x): the chunks are read twice, and with several rows the look-back chains overlap.
PRESOLVE_MAX_ROWS = 1


@attrs.frozen
class Strategy:
    block_n: int
    block_t: int
    split: bool
    num_seg: int
    num_warps: int
    shift_load: bool
    presolve: bool = False  # split rows: three passes instead of the look-back chain


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.lru_cache(maxsize=4096)
def strategy(R: int, T: int, time_contiguous: bool = True, block_t: int | None = None,
             split: bool | None = None, shift_load: bool | None = None,
             max_chunk: int | None = None, block_n: int | None = None,
             presolve: bool | None = None) -> Strategy:
    """Tile sizes, split and warps for ``R`` rows of ``T`` steps (see docs/benchmarks.md)."""
    mc = max_chunk or MAX_CHUNK
    if not time_contiguous and block_t is None and split is None and block_n is None \
            and R // 16 < FILL_PROGRAMS // 2:
        # time-major, too few rows to fill the GPU with 16-row tiles walking their rows (measured on
        # the H200, benchmarks/time_major.py, results/time_major_2f66f1f.csv): rows up to 128 steps
        # one 16 x T tile each (4096x128: 9.8 vs 18.8 µs); longer rows split across programs in
        # 32-row x 128-step tiles chained by the look-back (1024x1024: 23.7 vs 127 µs; 512x4096:
        # 44.6 vs 256 µs; 4096x4096: 251 vs 538 µs)
        if T <= 128:
            bt = max(_pow2(T), 2)
            return Strategy(16, bt, False, 1, max(1, min(8, 16 * bt // 256)), bt > GATHER_MAX_T)
        return Strategy(32, 128, True, -(-T // 128), 8, False, bool(presolve))
    bt = block_t or (min(_pow2(T), mc) if time_contiguous else min(_pow2(T), 32))
    bt = max(bt, 2)
    chunks = -(-T // bt)
    sl = bt > GATHER_MAX_T if shift_load is None else shift_load
    if split is None:
        split = chunks > 1 and R < FILL_PROGRAMS
    if split:
        bn = block_n or 1
        pre = R <= PRESOLVE_MAX_ROWS if presolve is None else presolve
        return Strategy(bn, bt, True, chunks, max(1, min(8, bn * bt // 256)), sl, pre)
    if block_n:
        return Strategy(block_n, bt, False, 1, max(1, min(8, block_n * bt // 256)), sl)
    bn = max(1, min(TILE // bt, _pow2(R)))
    if not time_contiguous:
        bn = max(bn, min(64, _pow2(R)))
    # keep enough programs in flight for mid-size problems
    while bn > 1 and -(-R // bn) < FILL_PROGRAMS // 2 and bn * bt > 256:
        bn //= 2
    warps = max(1, min(8, bn * bt // 256))
    return Strategy(bn, bt, False, 1, warps, sl)


def _dummy(device):
    d = _DUMMY.get(device)
    if d is None:
        d = _DUMMY[device] = torch.zeros(2, device=device)
    return d


def _workspace(device, dtype, slots: int, block_n: int):
    """(aggregates, flags, counters) for ``slots`` chunk programs; zeroed once, reset by the kernel."""
    key = (device, dtype)
    ws = _WORKSPACE.get(key)
    if ws is None or ws[1].numel() < slots or ws[0].numel() < slots * 7 * block_n:
        n = max(slots, 1024)
        ws = (torch.zeros(n * 7 * block_n, dtype=dtype, device=device),
              torch.zeros(n, dtype=torch.int32, device=device),
              torch.zeros(2, dtype=torch.int32, device=device))
        _WORKSPACE[key] = ws
    return ws


def _ptr(x, absent):
    """(tensor, row stride, time stride); ``absent`` for a field not given. Bool tensors are read
    as bytes (Triton's i1 pointers)."""
    if x is None:
        return absent
    if x.dim() == 1:
        return x, x.stride(0), 0
    return x, x.stride(0), x.stride(1)


def output_buffers(src: torch.Tensor, feat: tuple, dtype: torch.dtype, n: int) -> list[torch.Tensor]:
    """``n`` empty ``[N, T, *feat]`` outputs in the layout of ``src`` (the main input): a time-major
    input (a ``[T, N]`` buffer seen as ``[N, T]``) gets time-major outputs, so that neighbouring rows
    are written where they are read; ``OUTPUT_LAYOUT_OVERRIDE = "env"`` always gives ``[N, T]``.
    Shared with the custom op's fake implementation, so compiled graphs see the real strides."""
    N, T = src.shape[0], src.shape[1]
    if (OUTPUT_LAYOUT_OVERRIDE or "input") == "input" and T > 1 and src.stride(1) != 1 \
            and src.stride(0) < src.stride(1):
        return [torch.empty((T, N, *feat), dtype=dtype, device=src.device).transpose(0, 1) for _ in range(n)]
    return [torch.empty((N, T, *feat), dtype=dtype, device=src.device) for _ in range(n)]


# ---- the launch ------------------------------------------------------------------------------
# Triton's JIT launch binds and specializes all ~70 arguments on every call (measured on the H200
# host, benchmarks/launch_overhead.py: 38–68 µs per call back to back, against 13–21 µs for
# launching the compiled kernel it returns; the whole call went from 106 to 77 µs with this). The lean launch
# keeps the compiled kernel per specialization key and launches it directly. The key is a superset
# of Triton's specialization: every integer argument's value (the strides, R, T, F, NUM_SEG), every
# constexpr, the warps, the dtype and 16-byte alignment of every tensor that can come from the user
# (the outputs and workspaces are fresh allocations of the caching allocator: always aligned, dtype
# in ACC and out_dtype), and the current device. Only a real compiled kernel is kept (not under the
# interpreter, nor when a benchmark has replaced ``scan_kernel``). The three-pass split's middle
# kernel (``resolve_kernel``, two arguments) is launched the same way, under its own keys.

#: Launch cached compiled kernels directly (``False``: always through Triton's JIT launch).
LEAN_LAUNCH = True
_CONST_NAMES = ("FAMILY", "HAS_V", "HAS_K", "HAS_TR", "BOOT", "HAS_M", "CARRY_IN", "WRITE_CARRY", "TWO_OUT",
                "ADV_OUT", "ACC", "BLOCK_N", "BLOCK_T", "REVERSE", "SPLIT", "SHIFT_LOAD", "SINGLE", "UNIT",
                "PHASE", "EARLY")
_COMPILED: dict[tuple, tuple] = {}
_COMPILED_MAX = 4096
_DRIVER: list = []  # (get_current_device, get_current_stream, knobs.runtime) once Triton is loaded


_RESOLVE_CONST_NAMES = ("BLOCK_N", "BLOCK_R", "PAIR")


def _kernel(which: str):
    """The jitted kernel and its constexpr names: ``"scan"`` (scan_kernel) or ``"resolve"``."""
    from rollbuf.kernels import scan

    if which == "scan":
        return scan.scan_kernel, _CONST_NAMES
    return scan.resolve_kernel, _RESOLVE_CONST_NAMES


def _launch(grid: int, args: tuple, const: tuple, num_warps: int, ints: tuple, user: tuple,
            which: str = "scan"):
    """Launch ``which`` on ``grid`` programs: ``args`` the runtime arguments, ``const`` the
    constexprs (in signature order, after them), ``ints`` every integer argument, ``user`` every
    tensor whose dtype or alignment can vary between calls."""
    if not LEAN_LAUNCH or not _DRIVER:
        jit, names = _kernel(which)
        compiled = jit[(grid,)](*args, **dict(zip(names, const)), num_warps=num_warps)
        if LEAN_LAUNCH and hasattr(compiled, "packed_metadata"):  # a real GPU launch: from now on, lean
            _remember(compiled, None, (which, *const), num_warps, ints, user)
        return
    dev, stream, rt = _DRIVER[0]
    device = dev()
    key = _key(device, (which, *const), num_warps, ints, user)
    hit = _COMPILED.get(key)
    if hit is None:
        jit, names = _kernel(which)
        compiled = jit[(grid,)](*args, **dict(zip(names, const)), num_warps=num_warps)
        _remember(compiled, key, (which, *const), num_warps, ints, user)
        return
    compiled, function, meta = hit
    s = stream(device)
    enter = rt.launch_enter_hook
    lm = None if enter is None else compiled.launch_metadata((grid, 1, 1), s, *args, *const)
    compiled.run(grid, 1, 1, s, function, meta, lm, enter, rt.launch_exit_hook, *args, *const)


def _key(device, const, num_warps, ints, user) -> tuple:
    return (device, const, num_warps, ints, tuple((t.dtype, t.data_ptr() % 16 == 0) for t in user))


def _remember(compiled, key, const, num_warps, ints, user):
    """Keep ``compiled`` under ``key`` (``None``: computed here, on the first real launch)."""
    if not hasattr(compiled, "packed_metadata"):
        return
    if not _DRIVER:
        from triton import knobs
        from triton.runtime.driver import driver

        _DRIVER.append((driver.active.get_current_device, driver.active.get_current_stream, knobs.runtime))
    compiled._init_handles()
    if key is None:
        key = _key(_DRIVER[0][0](), const, num_warps, ints, user)
    if len(_COMPILED) >= _COMPILED_MAX:  # exact shapes are in the key: varying shapes (LLM batches
        _COMPILED.clear()  # of varying length) must not grow it without bound; a miss costs one JIT launch
    _COMPILED[key] = (compiled, compiled.function, compiled.packed_metadata)


def _unit_stride(fields, dummy, Fn: int, T: int) -> int:
    """The kernel's ``UNIT`` (one feature only): 1 if every field given (and the outputs) has time
    stride 1, 2 if every one has row stride 1, else 0. A ``[N]`` bootstrap column has no time
    stride; a length-1 time axis any."""
    if UNIT_STRIDE_OVERRIDE is not None:
        return UNIT_STRIDE_OVERRIDE
    if Fn != 1:
        return 0
    given = [(t, sn, st) for t, sn, st in fields if t is not dummy]
    if all(st == 1 or t.dim() == 1 or T == 1 for t, sn, st in given):
        return 1
    if all(sn == 1 for t, sn, st in given):
        return 2
    return 0


def _kernel_fields(p: Problem) -> dict:
    """The problem's fields under the kernel's argument names: the affine primitive's ``alpha``/``beta``
    go in as ``x``/``values``, the TD(λ) adjoint's ``grad_returns``/``grad_advantages`` as
    ``rewards``/``values`` (the slots whose loads and strides they use)."""
    f = p.fields
    if p.family == "affine":
        return {"x": f["alpha"], "values": f["beta"]}
    if p.family == "lambda_adjoint":
        return dict(f, rewards=f["grad_returns"], values=f.get("grad_advantages"))
    return dict(f)


def run(p: Problem):
    from triton.language import float32, float64

    from rollbuf.kernels.scan import FAMILIES

    f = _kernel_fields(p)
    main = f["x"] if p.family in ("trace", "affine") else f["rewards"]
    dev = main.device
    N, T = main.shape[0], main.shape[1]
    feat = p.feature_shape
    Fn = math.prod(feat)
    is_trace = p.family in ("trace", "affine")
    adjoint = p.family == "lambda_adjoint"  # forward in time; its carry out is W_T
    n_out = len(p.outputs) - ("final" in p.outputs)
    src = f["x"] if is_trace else main
    time_contiguous = T == 1 or src.stride(1) == 1
    outs = output_buffers(src, feat, p.out_dtype, n_out)
    if POISON_OUTPUTS:
        for o in outs:
            o.fill_(float("nan"))
    pair = p.pair
    write_carry = is_trace or adjoint or p.want_carry
    if is_trace:
        carry_out = torch.empty((N, *feat), dtype=p.compute_dtype, device=dev)
    elif write_carry:
        carry_out = torch.empty((N, 2) if pair else (N,), dtype=p.compute_dtype, device=dev)
    else:
        carry_out = None
    if N == 0 or T == 0 or Fn == 0:
        init = p.carry
        if init is None:
            init = torch.zeros((N, *feat) if is_trace else (N, 2) if pair else (N,), dtype=p.compute_dtype, device=dev)
        init = init.to(p.compute_dtype)
        if is_trace:
            return tuple(outs) + (init,), None
        return tuple(outs), init

    boot = f.get("bootstrap_values")
    carry = p.carry
    if is_trace or adjoint:
        carry_in_mode = 0 if carry is None else 2
    elif carry is not None:
        carry_in_mode = 2
    elif p.window_end == "terminal" or p.no_bootstrap:
        carry_in_mode = 0
    elif f.get("mask") is not None:
        carry_in_mode = 3  # the window end is the last unmasked step: found by the kernel
    else:
        carry_in_mode = 1
    dummy = _dummy(dev)
    absent = (dummy, 0, 0)
    ci = carry.contiguous() if carry is not None else dummy

    r, s_r_n, s_r_t = _ptr(f.get("rewards"), absent)
    v, s_v_n, s_v_t = _ptr(f.get("values"), absent)
    k, s_k_n, s_k_t = _ptr(f.get("terminated"), absent)
    tr, s_tr_n, s_tr_t = _ptr(f.get("truncated"), absent)
    bv, s_bv_n, s_bv_t = _ptr(boot, absent)
    m, s_m_n, s_m_t = _ptr(f.get("mask"), absent)
    lp, s_lp_n, s_lp_t = _ptr(f.get("log_probs"), absent)
    tlp, s_tlp_n, s_tlp_t = _ptr(f.get("target_log_probs"), absent)
    q, s_q_n, s_q_t = _ptr(f.get("q_values"), absent)
    if is_trace:
        x = f["x"].reshape(N, T, Fn) if feat else f["x"].unsqueeze(-1)
        s_x_n, s_x_t, s_x_f = x.stride(0), x.stride(1), x.stride(2)
    else:
        x, s_x_n, s_x_t, s_x_f = dummy, 0, 0, 0
    o1 = outs[0]
    o2 = outs[1] if n_out > 1 else outs[0]
    s_o_n, s_o_t, s_o_f = o1.stride(0), o1.stride(1), 1  # every output has the same layout
    boot_mode = 0 if boot is None or p.no_bootstrap else (1 if boot.dim() == 1 else 2)
    R = N * Fn
    st = strategy(R, T, time_contiguous, BLOCK_T_OVERRIDE, SPLIT_OVERRIDE, SHIFT_LOAD_OVERRIDE,
                  MAX_CHUNK_OVERRIDE or FAMILY_MAX_CHUNK.get(p.family), BLOCK_N_OVERRIDE, PRESOLVE)
    tiles = -(-R // st.block_n)
    if st.split:
        ws, flags, cnt = _workspace(dev, p.compute_dtype, tiles * st.num_seg, st.block_n)
    else:
        ws = flags = cnt = dummy
    acc = float64 if p.compute_dtype == torch.float64 else float32
    co = carry_out if carry_out is not None else dummy

    unit = _unit_stride(((r, s_r_n, s_r_t), (v, s_v_n, s_v_t), (k, s_k_n, s_k_t), (tr, s_tr_n, s_tr_t),
                         (bv, s_bv_n, s_bv_t), (m, s_m_n, s_m_t), (lp, s_lp_n, s_lp_t), (tlp, s_tlp_n, s_tlp_t),
                         (q, s_q_n, s_q_t), (x, s_x_n, s_x_t), (o1, s_o_n, s_o_t)), dummy, Fn, T)
    ints = (s_r_n, s_r_t, s_v_n, s_v_t, s_k_n, s_k_t, s_tr_n, s_tr_t, s_bv_n, s_bv_t, s_m_n, s_m_t,
            s_lp_n, s_lp_t, s_tlp_n, s_tlp_t, s_q_n, s_q_t, s_x_n, s_x_t, s_x_f, s_o_n, s_o_t, s_o_f,
            R, T, Fn, st.num_seg)
    const = (FAMILIES[p.family], f.get("values") is not None, f.get("terminated") is not None,
             f.get("truncated") is not None, boot_mode, f.get("mask") is not None, carry_in_mode, write_carry,
             n_out > 1, p.outputs == ("advantages", "returns"), acc, st.block_n, st.block_t,
             p.family not in ("trace", "lambda_adjoint") and not (p.family == "affine" and not p.reverse),
             st.split, st.shift_load, not st.split and T <= st.block_t, unit)
    args = (r, s_r_n, s_r_t, v, s_v_n, s_v_t, k, s_k_n, s_k_t, tr, s_tr_n, s_tr_t,
            bv, s_bv_n, s_bv_t, m, s_m_n, s_m_t,
            lp, s_lp_n, s_lp_t, tlp, s_tlp_n, s_tlp_t, q, s_q_n, s_q_t,
            x, s_x_n, s_x_t, s_x_f,
            o1, o2, s_o_n, s_o_t, s_o_f,
            ci, co, ws, flags, cnt,
            R, T, Fn, st.num_seg,
            p.gamma, p.lam, p.rho_bar, p.c_bar, p.pg_rho_bar, p.decay)
    warps = NUM_WARPS_OVERRIDE or st.num_warps
    user = (r, v, k, tr, bv, m, lp, tlp, q, x, ci, o1)
    if st.split and st.presolve:
        pair = p.family == "vtrace"
        br = RESOLVE_BLOCK_R or max(1, min(_pow2(st.num_seg - 1), (2048 if pair else 4096) // st.block_n))
        _launch(tiles * st.num_seg, args, const + (1, EARLY_LOADS), warps, ints, user)
        _launch(tiles, (ws, st.num_seg), (st.block_n, br, pair), max(1, min(8, br * st.block_n // 256)),
                (st.num_seg,), (ws,), "resolve")
        _launch(tiles * st.num_seg, args, const + (2, EARLY_LOADS), warps, ints, user)
    else:
        _launch(tiles * st.num_seg, args, const + (0, EARLY_LOADS), warps, ints, user)
    if is_trace:
        return tuple(outs) + (carry_out,), None
    return tuple(outs), carry_out
