"""Compile the fused kernel ahead of time for a GPU target, on any machine (no GPU needed).

    python -m rollbuf.kernels.aot [--arch 90] [--jobs 2]

Triton lowers a kernel to PTX and assembles it with the ``ptxas`` shipped in its wheel, without a
driver. This compiles a matrix of the kernel's specialisations (every family — including the TD(λ)
adjoint of the backward pass — in every strategy: tiles walked in chunks, rows split across
programs, the in-register shift and the neighbour reload; fp32 and bf16 inputs; carries in and out)
for an NVIDIA target, so that code the Triton interpreter accepts but the GPU compiler would reject is
caught on a CPU machine (CI runs it through ``tests/test_aot.py``). It checks compilation only:
numerics are tested under the interpreter and on the GPU.

Must run without ``TRITON_INTERPRET`` (the interpreter replaces ``triton.jit`` functions).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from concurrent.futures import ProcessPoolExecutor

_FLAGS = ("p_k", "p_tr", "p_m")
_INT = ("p_flag", "p_cnt")


def variants() -> list[dict]:
    """The specialisations compiled: (name, pointer dtype, constexprs, num_warps)."""
    fams = {  # family -> constexprs that make it one estimator
        "gae": dict(FAMILY=0, HAS_V=True, BOOT=2, TWO_OUT=True, ADV_OUT=True, CARRY_IN=1),
        "mc_returns": dict(FAMILY=0, HAS_V=False, BOOT=0, TWO_OUT=False, ADV_OUT=False, CARRY_IN=0),
        "retrace": dict(FAMILY=1, HAS_V=True, BOOT=2, TWO_OUT=False, ADV_OUT=False, CARRY_IN=2),
        "vtrace": dict(FAMILY=2, HAS_V=True, BOOT=1, TWO_OUT=True, ADV_OUT=False, CARRY_IN=1),
        "traces": dict(FAMILY=3, HAS_V=False, BOOT=0, TWO_OUT=False, ADV_OUT=False, CARRY_IN=2),
        "affine": dict(FAMILY=4, HAS_V=True, BOOT=0, TWO_OUT=False, ADV_OUT=False, CARRY_IN=2),
        "lambda_adjoint": dict(FAMILY=5, HAS_V=True, BOOT=0, TWO_OUT=True, ADV_OUT=False, CARRY_IN=2),
    }
    modes = {  # strategy -> constexprs
        "tile": dict(BLOCK_N=16, BLOCK_T=128, SPLIT=False, SHIFT_LOAD=False, SINGLE=True, _warps=8),
        "walk-gather": dict(BLOCK_N=2, BLOCK_T=512, SPLIT=False, SHIFT_LOAD=False, SINGLE=False, _warps=4),
        "walk-reload": dict(BLOCK_N=1, BLOCK_T=2048, SPLIT=False, SHIFT_LOAD=True, SINGLE=False, _warps=8),
        "split-gather": dict(BLOCK_N=1, BLOCK_T=512, SPLIT=True, SHIFT_LOAD=False, SINGLE=False, _warps=2),
        "split-reload": dict(BLOCK_N=1, BLOCK_T=2048, SPLIT=True, SHIFT_LOAD=True, SINGLE=False, _warps=8),
    }
    out = []
    for fam, fc in fams.items():
        for mode, mc in modes.items():
            reverse = fc["FAMILY"] not in (3, 5)
            c = dict(HAS_K=True, HAS_TR=True, HAS_M=True, WRITE_CARRY=True, REVERSE=reverse, UNIT=1, **fc, **mc)
            out.append(dict(name=f"{fam}/{mode}/fp32", dtype="fp32", cx=c))
    # general strides (UNIT = 0) and time-major unit row stride (UNIT = 2)
    for fam in ("gae", "vtrace", "traces"):
        for mode in ("tile", "split-gather", "walk-reload"):
            for unit in (0, 2):
                reverse = fams[fam]["FAMILY"] not in (3, 5)
                c = dict(HAS_K=True, HAS_TR=True, HAS_M=True, WRITE_CARRY=True, REVERSE=reverse, UNIT=unit,
                         **fams[fam], **modes[mode])
                out.append(dict(name=f"{fam}/{mode}/fp32-unit{unit}", dtype="fp32", cx=c))
    # the window end at the last unmasked step, found in the kernel (masked rows, CARRY_IN = 3)
    for fam in ("gae", "vtrace", "retrace"):
        for mode in ("tile", "walk-reload", "split-gather", "split-reload"):
            c = dict(HAS_K=True, HAS_TR=True, HAS_M=True, WRITE_CARRY=False, REVERSE=True, UNIT=1,
                     **dict(fams[fam], CARRY_IN=3), **modes[mode])
            out.append(dict(name=f"{fam}/{mode}/fp32-mask-window-end", dtype="fp32", cx=c))
    # split rows in three passes (PHASE 1: aggregates, PHASE 2: outputs) and the middle pass
    for fam in ("gae", "vtrace", "retrace", "traces"):
        for mode in ("split-gather", "split-reload"):
            for phase in (1, 2):
                reverse = fams[fam]["FAMILY"] not in (3, 5)
                c = dict(HAS_K=True, HAS_TR=True, HAS_M=True, WRITE_CARRY=True, REVERSE=reverse, UNIT=1,
                         PHASE=phase, EARLY=fam == "gae", **fams[fam], **modes[mode])
                out.append(dict(name=f"{fam}/{mode}/fp32-phase{phase}" + ("-early" if fam == "gae" else ""),
                                dtype="fp32", cx=c))
    # the emit's fields loaded before the scan (EARLY), in every mode
    for fam in ("gae", "vtrace", "retrace"):
        for mode in modes:
            reverse = fams[fam]["FAMILY"] not in (3, 5)
            c = dict(HAS_K=True, HAS_TR=True, HAS_M=True, WRITE_CARRY=True, REVERSE=reverse, UNIT=1,
                     EARLY=True, **fams[fam], **modes[mode])
            out.append(dict(name=f"{fam}/{mode}/fp32-early", dtype="fp32", cx=c))
    # integer arguments equal to 1 become compile-time constants in Triton's specialisation (one step,
    # one row, one chunk): every family's window end, masked and not, in the strategies that see them
    for fam in ("gae", "vtrace", "retrace", "mc_returns", "traces", "affine"):
        for mode in ("tile", "split-gather", "walk-reload"):
            for carry_in in sorted({fams[fam]["CARRY_IN"], 3 if fams[fam]["BOOT"] else 0}):
                reverse = fams[fam]["FAMILY"] not in (3, 5)
                ones = dict(T=1, NUM_SEG=1) if mode != "walk-reload" else dict(R=1)
                c = dict(HAS_K=True, HAS_TR=True, HAS_M=True, WRITE_CARRY=True, REVERSE=reverse, UNIT=1,
                         **dict(fams[fam], CARRY_IN=carry_in), **modes[mode], **ones)
                tag = "-".join(f"{k}1" for k in ones)
                out.append(dict(name=f"{fam}/{mode}/fp32-carry{carry_in}-{tag}", dtype="fp32", cx=c))
    for pair in (False, True):
        for bn, br in ((1, 2048), (32, 64)):
            out.append(dict(name=f"resolve/{'pair' if pair else 'scalar'}/{bn}x{br}", kernel="resolve",
                            cx=dict(BLOCK_N=bn, BLOCK_R=br, PAIR=pair)))
    # bf16 inputs, no flags at all, no mask
    for fam in ("gae", "vtrace", "lambda_adjoint"):
        c = dict(HAS_K=False, HAS_TR=False, HAS_M=False, WRITE_CARRY=False, REVERSE=fam != "lambda_adjoint",
                 UNIT=1, **fams[fam], **modes["split-reload"])
        out.append(dict(name=f"{fam}/split-reload/bf16-noflags", dtype="bf16", cx=c))
    return out


def compile_one(v: dict, arch: int = 90) -> tuple[str, float, str]:
    """Compile one variant; returns (name, seconds, error or '')."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.language import float32

    from rollbuf.kernels.scan import scan_kernel

    if not hasattr(scan_kernel, "fn") or type(scan_kernel).__name__ == "InterpretedFunction":
        return v["name"], 0.0, "TRITON_INTERPRET is set: nothing to compile"
    if v.get("kernel") == "resolve":
        return _compile_resolve(v, arch)
    cx = dict(v["cx"])
    cx.setdefault("PHASE", 0)
    cx.setdefault("EARLY", False)
    warps = cx.pop("_warps")
    cx["ACC"] = float32
    params = list(inspect.signature(scan_kernel.fn).parameters)
    sig = {}
    for name in params:
        ann = scan_kernel.fn.__annotations__.get(name)
        if name in cx:
            sig[name] = "constexpr"
        elif name in _FLAGS:
            sig[name] = "*i1"
        elif name in _INT:
            sig[name] = "*i32"
        elif name in ("p_ci", "p_co", "p_ws"):
            sig[name] = "*fp32"
        elif name.startswith("p_"):
            sig[name] = "*" + v["dtype"]
        elif ann == "fp64":
            sig[name] = "fp64"
        else:  # strides and sizes: 64-bit strides (the > 2^31-element case), 32-bit sizes
            sig[name] = "i64" if name.startswith("s_") else "i32"
    missing = [n for n, t in sig.items() if t == "constexpr" and n not in cx]
    if missing:
        return v["name"], 0.0, f"constexprs not given: {missing}"
    src = ASTSource(scan_kernel, sig, constexprs={(params.index(k),): val for k, val in cx.items()})
    t0 = time.perf_counter()
    try:
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))
        err = "" if k.asm.get("cubin") else "no cubin produced"
    except Exception as e:  # reported per variant
        err = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]
    return v["name"], time.perf_counter() - t0, err


def _compile_resolve(v: dict, arch: int) -> tuple[str, float, str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rollbuf.kernels.scan import resolve_kernel

    if type(resolve_kernel).__name__ == "InterpretedFunction":
        return v["name"], 0.0, "TRITON_INTERPRET is set: nothing to compile"
    cx = v["cx"]
    params = list(inspect.signature(resolve_kernel.fn).parameters)
    sig = {"p_ws": "*fp32", "NUM_SEG": "i32", **{k: "constexpr" for k in cx}}
    src = ASTSource(resolve_kernel, sig, constexprs={(params.index(k),): val for k, val in cx.items()})
    t0 = time.perf_counter()
    try:
        warps = max(1, min(8, cx["BLOCK_R"] * cx["BLOCK_N"] // 256))
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))
        err = "" if k.asm.get("cubin") else "no cubin produced"
    except Exception as e:
        err = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]
    return v["name"], time.perf_counter() - t0, err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollbuf.kernels.aot", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability (90: H100/H200)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="substring of the variant names to compile")
    args = ap.parse_args(argv)
    vs = [v for v in variants() if args.only is None or args.only in v["name"]]
    with ProcessPoolExecutor(args.jobs) as ex:
        results = list(ex.map(compile_one, vs, [args.arch] * len(vs)))
    bad = 0
    for name, secs, err in results:
        print(f"{'FAIL' if err else 'ok  '} sm_{args.arch} {name:40s} {secs:5.1f} s {err}")
        bad += bool(err)
    print(f"{len(results) - bad} of {len(results)} variants compiled for sm_{args.arch}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
