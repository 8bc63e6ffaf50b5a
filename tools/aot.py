"""Compile the family kernels ahead of time for a GPU target, on any machine (no GPU needed).

    python -m tools.aot [--arch 90] [--jobs 2] [--only NAME] [--names N1,N2,...] [--counts]

Triton lowers a kernel to PTX and assembles it with the ``ptxas`` shipped in its wheel, without a
driver. This compiles a matrix of the kernels' specialisations (every family — the TD(λ) adjoint of
the backward pass included — in every pass: rows walked in one chunk or several, split rows chained
by the look-back, the three passes and their middle kernel; the in-register shift and the
neighbour reload; every carry in; fields present and absent; env-major, time-major and general
strides; fp32 and bf16 inputs; float64 accumulation with bf16 and fp16 outputs) for an NVIDIA
target, so that code the Triton interpreter accepts but the GPU compiler would reject is caught on a
CPU machine (CI runs it through ``tests/test_aot.py``).
It checks compilation only: numerics are tested under the interpreter and on the GPU.

``--counts`` compiles the selected variants as the JIT specialises a call with aligned tensors
(pointer and integer arguments divisible by 16, which lets it vectorise loads) and prints their PTX
instruction, shuffle, barrier, global load (vector loads) and store counts, and the machine code's
instruction and shuffle counts (``sass``, ``sass_shuffles``; ``ptxas`` drops dead code the PTX
still holds): a static look at a kernel, not a timing.

Must run without ``TRITON_INTERPRET`` (the interpreter replaces ``triton.jit`` functions).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections import namedtuple
from concurrent.futures import ProcessPoolExecutor

from rollbuf.problem import Family

_FLAGS = ("terminated", "truncated", "mask", "model")


# a variant's pass and tiling: the kernel's PASS, SHIFT_LOAD, BLOCK_N, BLOCK_T, its warps, FLIP, QUADS and
# POLL (the look-back's window of words read at once by plain acquire loads: ASM)
Mode = namedtuple("Mode", "pass_ shift_load block_n block_t warps flip quads poll", defaults=(False, False, 0))
MODES = {
    "single": Mode(4, False, 4, 128, 4),
    "single-reload": Mode(4, True, 1, 1024, 8),
    "whole": Mode(4, True, 1, 4096, 16),  # a row of up to 4096 steps held whole (a family's Row.whole_rows)
    "tile": Mode(0, False, 16, 128, 8),
    "walk-gather": Mode(0, False, 2, 512, 4),
    "walk-reload": Mode(0, True, 1, 2048, 8),
    "lookback-gather": Mode(1, False, 1, 512, 2),
    "lookback-reload": Mode(1, True, 1, 2048, 8),
    "aggregates": Mode(2, True, 1, 2048, 8),
    "outputs": Mode(3, True, 1, 2048, 8),
    "time-split": Mode(1, False, 32, 128, 8),
    "single-flip": Mode(4, False, 4, 128, 4, True),  # chunks held in reverse (backward scans in lane order)
    "whole-flip": Mode(4, True, 1, 4096, 16, True),
    "walk-gather-flip": Mode(0, False, 2, 512, 4, True),
    "lookback-gather-flip": Mode(1, False, 1, 512, 2, True),
    "single-quads": Mode(4, False, 4, 128, 4, False, True),  # chunks held in quads, latest first
    "whole-quads": Mode(4, False, 1, 4096, 16, False, True),
    "walk-gather-quads": Mode(0, False, 2, 512, 4, False, True),
    "lookback-gather-quads": Mode(1, False, 1, 512, 2, False, True),
    "aggregates-quads": Mode(2, False, 1, 2048, 8, False, True),  # the three passes' first and last in quads
    "outputs-quads": Mode(3, False, 1, 2048, 8, False, True),
    "lookback-poll": Mode(1, True, 1, 2048, 8, False, False, 256),  # the look-back's window, one word a thread
    "lookback-poll-quads": Mode(1, False, 1, 1024, 4, False, True, 128),
    "lookback-poll-warp": Mode(1, True, 1, 2048, 8, False, False, 32),  # one warp's 32 words, 8 warps
}


def variants() -> list[dict]:
    """The specialisations compiled: name and configuration of each."""
    from rollbuf.kernels.host import END_COLUMN, END_STEP, FAMILIES, STATE, ZERO

    fams = {  # family -> its usual carry in, absent fields
        "gae": (Family.TD_LAMBDA, END_STEP, ()),
        "mc_returns": (Family.TD_LAMBDA, ZERO, ("values", "bootstrap_values")),
        "retrace": (Family.RETRACE, STATE, ()),
        "vtrace": (Family.VTRACE, END_COLUMN, ("bootstrap_values",)),
        "traces": (Family.FORWARD, STATE, ()),
        "affine": (Family.AFFINE, STATE, ()),
        "lambda_adjoint": (Family.TD_LAMBDA_ADJOINT, STATE, ()),
        "turns": (Family.TURN_GAE, ZERO, ()),
        "turn_returns": (Family.TURN, ZERO, ("values",)),
        "turn_fill": (Family.TURN_FILL, ZERO, ()),
    }
    out = []
    backward = {"gae", "mc_returns", "retrace", "vtrace"}  # the families a flipped chunk changes
    for name, (family, ci, absent) in fams.items():
        for mode in MODES:
            if mode.endswith(("-flip", "-quads")) and name not in backward:
                continue
            out.append(dict(name=f"{name}/{mode}/fp32", family=family, carry_in=ci, absent=absent, mode=mode))
    # the affine scan backward (REVERSE), in lane order, flipped and in quads
    for mode in ("single", "single-flip", "single-quads", "walk-gather", "walk-gather-flip", "walk-gather-quads",
                 "lookback-gather", "lookback-gather-flip", "lookback-gather-quads"):
        out.append(dict(name=f"affine/{mode}/fp32-reverse", family=Family.AFFINE, carry_in=STATE, absent=(), mode=mode,
                        reverse=True))
    # turn GAE with a truncated row's V(s') as the state past the row's end
    for mode in ("single", "lookback-gather", "walk-reload", "aggregates", "outputs"):
        out.append(dict(name=f"turns/{mode}/fp32-state", family=Family.TURN_GAE, carry_in=STATE, absent=(), mode=mode))
    # general strides and time-major unit row stride
    for name in ("gae", "vtrace", "traces"):
        family, ci, absent = fams[name]
        for mode in ("single", "tile", "lookback-gather", "walk-reload", "time-split"):
            for unit in ("general", "time"):
                out.append(dict(name=f"{name}/{mode}/fp32-{unit}", family=family, carry_in=ci, absent=absent,
                                mode=mode, unit=unit))
    # the window end at the last unmasked step, found in the kernel, from either source
    for name in ("gae", "vtrace", "retrace"):
        family = fams[name][0]
        for mode in ("single", "tile", "walk-reload", "lookback-gather", "aggregates"):
            for ci in (END_STEP, END_COLUMN):
                absent = ("bootstrap_values",) if ci == END_COLUMN else ()
                out.append(dict(name=f"{name}/{mode}/fp32-end{ci}", family=family, carry_in=ci, absent=absent,
                                mode=mode))
    # the outputs asked for, carries out
    for outs in (("p_adv",), ("p_ret",)):
        for mode in ("tile", "lookback-reload"):
            out.append(dict(name=f"gae/{mode}/fp32-only-{outs[0]}", family=Family.TD_LAMBDA, carry_in=END_STEP,
                            absent=(), mode=mode, outs=outs, carry_out=True))
    out.append(dict(name="lambda_adjoint/tile/fp32-no-gv", family=Family.TD_LAMBDA_ADJOINT, carry_in=ZERO, absent=(),
                    mode="tile", outs=("p_gr",)))
    # integer arguments equal to 1 become compile-time constants (one step, one row)
    for name in ("gae", "vtrace", "retrace", "mc_returns", "traces", "affine"):
        family, ci, absent = fams[name]
        for mode in ("tile", "lookback-gather", "walk-reload"):
            ones = ("T",) if mode != "walk-reload" else ("R",)
            out.append(dict(name=f"{name}/{mode}/fp32-{ones[0]}1", family=family, carry_in=ci, absent=absent,
                            mode=mode, ones=ones))
    # no mask: TD(λ) scans its returns (the inclusive state), V-trace its scalar u, the traces e itself
    for name in ("gae", "vtrace", "traces"):
        family, ci, absent = fams[name]
        for mode in MODES:
            if mode.endswith(("-flip", "-quads")) and name == "traces":
                continue
            out.append(dict(name=f"{name}/{mode}/fp32-nomask", family=family, carry_in=ci, mode=mode,
                            absent=(*absent, "mask"), carry_out=True))
    # rows of one chunk (no loop), every family
    for name, (family, ci, absent) in fams.items():
        for mode in ("single", "single-reload"):
            out.append(dict(name=f"{name}/{mode}/fp32", family=family, carry_in=ci, absent=absent, mode=mode))
    # one row of 512 steps per program, 4 warps, as the table runs GAE advantages at 128-2048 x 512 with
    # `[N]` window-end values (no truncations, no mask), in lane order and flipped (docs/benchmarks.md)
    for flip in (False, True):
        out.append(dict(name=f"gae/row512{'-flip' if flip else ''}/fp32-adv-endcol", family=Family.TD_LAMBDA,
                        carry_in=END_COLUMN, absent=("truncated", "bootstrap_values", "mask"), mode="row512",
                        cfg=Mode(4, False, 1, 512, 4, flip), outs=("p_adv",)))
    # the table's plans at 4096 x 4096, 16384 x 1024 and 65536 x 256 (one chunk of 1024 steps, 1024-step chunks
    # walked, 256-step tiles of two rows), in lane order and in quads (whose exclusive state needs no re-load)
    for quads in (False, True):
        for mode, (pass_, bn, bt, warps) in (("row1024", (4, 1, 1024, 8)), ("walk1024", (0, 1, 1024, 4)),
                                             ("tile256", (4, 2, 256, 2))):
            cfg = Mode(pass_, bt > 512 and not quads, bn, bt, warps, False, quads)
            for name, extra in (("gae", "nomask"), ("gae", "mask"), ("retrace", "nomask"), ("vtrace", "nomask")):
                family, ci, absent = fams[name]
                out.append(dict(name=f"{name}/{mode}{'-quads' if quads else ''}/fp32-{extra}", family=family,
                                carry_in=ci, mode=mode, cfg=cfg,
                                absent=(*absent, "mask") if extra == "nomask" else absent))
    # rows held whole in one chunk with the window end's `[N]` column and no truncations or mask, as the
    # table runs advantages at 4096 steps and V-trace and Retrace at 2048 (docs/benchmarks.md, the fold)
    rows: tuple[tuple[str, Family, int, int, tuple[str, ...] | None], ...]
    rows = (("gae", Family.TD_LAMBDA, 4096, 16, ("p_adv",)),
            ("vtrace", Family.VTRACE, 2048, 16, None), ("retrace", Family.RETRACE, 2048, 8, None))
    for name, family, bt, warps, row_outs in rows:
        v = dict(name=f"{name}/row{bt}/fp32-{'adv-' if row_outs else ''}endcol", family=family, carry_in=END_COLUMN,
                 absent=("truncated", "bootstrap_values", "mask"), mode=f"row{bt}",
                 cfg=Mode(4, True, 1, bt, warps))
        out.append(dict(v, outs=row_outs) if row_outs else v)
    # the families' own split rows (their Row.split_rows / split_row), as the table runs them: fp32 without a
    # mask, the look-back with the family's chunk, warps and window, in quads (the TD(λ) family's, which
    # writes advantages, in lane order with the neighbour re-loaded)
    for name in ("gae", "vtrace", "retrace"):
        family, ci, absent = fams[name]
        lanes = name == "gae"
        for tag in ("split_rows", "split_row"):
            entry = getattr(FAMILIES[family], tag)
            if entry is not None:
                out.append(dict(name=f"{name}/{tag.replace('_', '-')}/fp32-nomask", family=family, carry_in=ci,
                                mode=tag, cfg=Mode(1, lanes, 1, entry.chunk, entry.warps, False, not lanes,
                                                   entry.window),
                                absent=(*absent, "mask")))
    # bf16 inputs, no flags, no mask
    for name in ("gae", "vtrace", "lambda_adjoint"):
        family, ci, absent = fams[name]
        out.append(dict(name=f"{name}/lookback-reload/bf16-noflags", family=family, carry_in=ci, mode="lookback-reload",
                        absent=(*absent, "terminated", "truncated", "mask"), dtype="bf16"))
    # float64 accumulation with 16-bit outputs (the stores cast through fp32), every family
    for name, (family, ci, absent) in fams.items():
        for mode, out_dt in (("single", "bf16"), ("lookback-gather", "bf16"), ("walk-reload", "fp16")):
            out.append(dict(name=f"{name}/{mode}/fp64-{out_dt}out", family=family, carry_in=ci, absent=absent,
                            mode=mode, dtype="fp64", acc="fp64", out_dtype=out_dt))
    # float64 accumulation in quads (the quads' scan elements share the maps' dtype) and in the look-back's window
    for name in ("gae", "vtrace", "retrace"):
        family, ci, absent = fams[name]
        for mode in ("single-quads", "lookback-gather-quads", "lookback-poll", "lookback-poll-quads"):
            out.append(dict(name=f"{name}/{mode}/fp64", family=family, carry_in=ci, absent=absent, mode=mode,
                            dtype="fp64", acc="fp64"))
    for pair in (False, True):
        for bn, br in ((1, 2048), (32, 64)):
            out.append(dict(name=f"resolve/{'pair' if pair else 'scalar'}/{bn}x{br}", kernel="resolve",
                            cx=dict(BLOCK_N=bn, BLOCK_R=br, PAIR=pair)))
    # the group statistics: ids sorted on the device or the host's layout, weights or none, each estimator
    for search in (True, False):
        for weights in (True, False):
            for est in (0, 1, 2):
                out.append(dict(name=f"group_stats/{'search' if search else 'layout'}-{'w' if weights else 'now'}/"
                                     f"est{est}", kernel="group_stats", search=search, weights=weights, est=est))
    # verl's optimal token baseline: weighted or not, zero tail or not, a bool or an int64 mask
    for weights in (True, False):
        for zero_tail in (True, False):
            for mask in ("i1", "i64"):
                name = f"token_baseline/{'w' if weights else 'now'}-{'tail' if zero_tail else 'notail'}/{mask}"
                out.append(dict(name=name, kernel="token_baseline", weights=weights, zero_tail=zero_tail, mask=mask))
    assert all(v.get("kernel") or v["family"] in FAMILIES for v in out)
    return out


def _signature(v: dict):
    """(jit function, signature, constexprs, warps) of variant ``v``."""
    from triton.language import float32, float64

    from rollbuf.kernels.core import Config
    from rollbuf.kernels.host import FAMILIES, STATE, ZERO

    fam = FAMILIES[v["family"]]
    jit = fam.kernel()
    params = list(inspect.signature(jit.fn).parameters)
    mode = v.get("cfg") or MODES[v["mode"]]
    dt = v.get("dtype", "fp32")
    acc = v.get("acc", "fp32")  # the accumulation dtype: carries and scratch are held in it
    out_dt = v.get("out_dtype", "fp32")
    absent = set(v.get("absent", ()))
    sig: dict[str, str | tuple[str, ...]] = {}
    cx: dict[tuple[int, ...], object] = {}
    ftypes = []
    for i, name in enumerate(fam.fields):
        if name is None or name in absent:
            ftypes.append("constexpr")
            cx[(0, i)] = None
        else:
            ftypes.append("*i1" if name in _FLAGS else "*" + dt)
    outs = v.get("outs", fam.out_params)
    unit = v.get("unit", "env")
    ones = set(v.get("ones", ()))
    if fam.family != Family.FORWARD:
        ones.add("F")
    if unit == "env":
        ones |= {"s_t", "s_ot"}
    elif unit == "time":
        ones |= {"s_n", "s_on"}
    ci = v["carry_in"]
    backward = v.get("reverse", fam.backward)
    # the forward estimators and the affine scan return their carry out (final); the turn fill does not
    carry = dict(p_ci=ci != ZERO, p_co=v.get("carry_out", (not fam.backward and fam.family != Family.TURN_FILL)
                                              or ci == STATE),
                 p_ws=mode.pass_ not in (0, 4))  # rows walked or one chunk: no scratch
    for i, name in enumerate(params):
        if name == "fields":
            sig[name] = tuple(ftypes)
        elif name == "outputs":
            slots = tuple(dict.fromkeys(fam.out_params))
            sig[name] = tuple("*" + out_dt if n in outs else "constexpr" for n in slots)
            cx.update({(i, j): None for j, n in enumerate(slots) if n not in outs})
        elif name == "carries":
            sig[name] = tuple("*" + acc if carry[n] else "constexpr" for n in carry)
            cx.update({(i, j): None for j, n in enumerate(carry) if not carry[n]})
        elif name == "sizes":
            sizes = ("R", "T", "F", "s_n", "s_t", "s_on", "s_ot", "p0")
            sig[name] = tuple("constexpr" if n in ones else "i32" for n in sizes)
            cx.update({(i, j): 1 for j, n in enumerate(sizes) if n in ones})
        elif name == "CFG":
            sig[name] = "constexpr"
            cx[(i,)] = Config(PASS=mode.pass_, CARRY_IN=ci, ACC=float64 if acc == "fp64" else float32,
                              BLOCK_N=mode.block_n, BLOCK_T=mode.block_t, SHIFT_LOAD=mode.shift_load, FLIP=mode.flip,
                              REVERSE=fam.family == Family.AFFINE and backward, QUADS=mode.quads,
                              POLL=mode.poll, ASM=mode.poll > 0)
        else:
            assert jit.fn.__annotations__.get(name) == "fp64", name
            sig[name] = "fp64"
    return jit, sig, cx, mode.warps


def _group_stats_signature(v: dict):
    """(jit function, signature, constexprs, warps) of a group statistics variant."""
    from rollbuf.kernels import group_stats as G

    search = v["search"]
    groups = ("*i64", "*i64", "*i64", "constexpr", "constexpr") if search else ("constexpr", "constexpr", "*i64",
                                                                                "*i64", "*i64")
    sig = dict(p_x="*fp32", p_w="*fp32" if v["weights"] else "constexpr", groups=groups, p_out="*fp32", B="i32",
               steps="i32", eps="fp32", EST="constexpr", NORM="constexpr", BLOCK_I="constexpr", BLOCK_K="constexpr")
    cx: dict[tuple[int, ...], object] = {(2, j): None for j, t in enumerate(groups) if t == "constexpr"}
    cx.update({(7,): v["est"], (8,): True, (9,): G.BLOCK_I, (10,): G.BLOCK_K})
    if not v["weights"]:
        cx[(1,)] = None
    return G.group_stats_kernel, sig, cx, G.WARPS


def _token_baseline_signature(v: dict):
    """(jit function, signature, constexprs, warps) of an optimal token baseline variant (groups of 8)."""
    from rollbuf.kernels import token_baseline as K

    fields = ("*fp32", "*" + v["mask"], "*fp32", "*fp32", "*fp32" if v["weights"] else "constexpr")
    sig = dict(fields=fields, groups=("*i32", "*i32", "*i32"), p_len="*i64", p_out="*fp32", L="i32", eps="fp64",
               ZERO_TAIL="constexpr", BLOCK_M="constexpr", BLOCK_T="constexpr")
    cx: dict[tuple[int, ...], object] = {(6,): v["zero_tail"], (7,): 8, (8,): K.TILE // 8}
    if not v["weights"]:
        cx[(0, 4)] = None
    return K.otb_kernel, sig, cx, K.WARPS


def _aligned(sig: dict) -> dict:
    """Divisibility-by-16 attributes for every pointer and integer argument of ``sig`` (what the JIT
    assumes of aligned tensors and sizes)."""
    attrs: dict[tuple[int, ...], list] = {}
    for i, t in enumerate(sig.values()):
        if isinstance(t, tuple):
            attrs.update({(i, j): [["tt.divisibility", 16]] for j, tj in enumerate(t)
                          if tj.startswith("*") or tj == "i32"})
        elif t.startswith("*") or t == "i32":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def ptx_counts(ptx: str) -> dict:
    """Instruction counts of a PTX listing (predicates stripped; labels and directives not counted)."""
    import re

    ins = [re.sub(r"^@!?%p\d+\s+", "", line.strip()) for line in ptx.splitlines()]
    ins = [x for x in ins if x and not x.startswith(("//", ".", "{", "}", "$")) and not x.endswith(":")]

    def n(prefix):
        return sum(1 for x in ins if x.startswith(prefix))

    return dict(instructions=len(ins), shuffles=n("shfl"), barriers=n("bar"), loads=n("ld.global"),
                vector_loads=sum(1 for x in ins if x.startswith("ld.global") and ".v" in x), stores=n("st.global"))


def sass_counts(cubin: bytes) -> dict:
    """Machine instruction and shuffle counts of a cubin's code (its ``.text`` sections, alignment
    ``NOP`` instructions left out), disassembled by the ``nvdisasm`` shipped in Triton's wheel; empty where that
    is missing or fails. ``ptxas`` drops what the PTX computes and nothing reads (the flip-back of a
    reverse scan's dead components, say), so these can differ from the PTX counts."""
    import os
    import re
    import subprocess
    import tempfile

    import triton.backends.nvidia as nv

    tool = os.path.join(os.path.dirname(nv.__file__), "bin", "nvdisasm")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, f.name], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return {}
    ins, text = [], False
    for line in res.stdout.splitlines():
        words = line.split()
        if words[:1] == [".section"]:
            text = words[1].startswith(".text.")
            continue
        m = re.match(r"/\*[0-9a-f]+\*/\s+(.*)", line.strip())
        if text and m and not m.group(1).startswith((".", "NOP")):
            ins.append(m.group(1))
    return dict(sass=len(ins), sass_shuffles=sum("SHFL" in x for x in ins))


def _interpreted() -> bool:
    from rollbuf.kernels.resolve import resolve_kernel

    return type(resolve_kernel).__name__ == "InterpretedFunction"


_INTERPRETED = "TRITON_INTERPRET is set: nothing to compile"


def _error(e: Exception) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg.splitlines()[-1] if msg else ''}"[:300]


def count_one(v: dict, arch: int = 90) -> tuple[str, dict, str]:
    """Compile one family variant with aligned arguments; returns (name, PTX and machine-code counts
    (:func:`ptx_counts`, :func:`sass_counts`), error or '')."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreted():
        return v["name"], {}, _INTERPRETED
    jit, sig, cx, warps = _signature(v)
    try:
        k = triton.compile(ASTSource(jit, sig, constexprs=cx, attrs=_aligned(sig)),
                           target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))
    except Exception as e:  # reported per variant
        return v["name"], {}, _error(e)
    return v["name"], {**ptx_counts(k.asm["ptx"]), **sass_counts(k.asm["cubin"])}, ""


def compile_one(v: dict, arch: int = 90) -> tuple[str, float, str]:
    """Compile one variant; returns (name, seconds, error or '')."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rollbuf.kernels.resolve import resolve_kernel

    if _interpreted():
        return v["name"], 0.0, _INTERPRETED
    if v.get("kernel") == "resolve":
        jit = resolve_kernel
        params = list(inspect.signature(jit.fn).parameters)
        c = v["cx"]
        sig = {"p_ws": "*fp32", "NUM_SEG": "i32", **{k: "constexpr" for k in c}}
        cx = {(params.index(k),): val for k, val in c.items()}
        warps = max(1, min(8, c["BLOCK_R"] * c["BLOCK_N"] // 256))
    elif v.get("kernel") == "group_stats":
        jit, sig, cx, warps = _group_stats_signature(v)
    elif v.get("kernel") == "token_baseline":
        jit, sig, cx, warps = _token_baseline_signature(v)
    else:
        jit, sig, cx, warps = _signature(v)
    t0 = time.perf_counter()
    try:
        k = triton.compile(ASTSource(jit, sig, constexprs=cx), target=GPUTarget("cuda", arch, 32),
                           options=dict(num_warps=warps))
        err = "" if k.asm.get("cubin") else "no cubin produced"
    except Exception as e:  # reported per variant
        err = _error(e)
    return v["name"], time.perf_counter() - t0, err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.aot", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability (90: H100/H200)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="substring of the variant names to compile")
    ap.add_argument("--names", default=None, help="comma-separated variant names to compile (exact names)")
    ap.add_argument("--counts", action="store_true",
                    help="PTX and machine-code counts of the family variants, arguments aligned")
    args = ap.parse_args(argv)
    vs = [v for v in variants() if args.only is None or args.only in v["name"]]
    if args.names is not None:
        names = set(args.names.split(","))
        unknown = names - {v["name"] for v in variants()}
        if unknown:
            ap.error(f"--names: no variant named {sorted(unknown)[0]!r}")
        vs = [v for v in vs if v["name"] in names]
    if args.counts:
        vs = [v for v in vs if not v.get("kernel")]
        with ProcessPoolExecutor(args.jobs) as ex:
            counts = list(ex.map(count_one, vs, [args.arch] * len(vs)))
        for name, c, err in counts:
            print(f"sm_{args.arch} {name:44s} " + (err or " ".join(f"{k}={val}" for k, val in c.items())))
        return 1 if any(err for _, _, err in counts) else 0
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
