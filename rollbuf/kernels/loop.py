"""The compiled CPU loop every family's step runs in (numba), as :mod:`rollbuf.kernels.core` is the
scan every Triton kernel runs in; the call itself (layouts, outputs, threads) is
:mod:`rollbuf.backends.compiled_cpu`.

**One driver**, :func:`_drive`, specialised per family and direction by :func:`specialise`, owns
the rules the families share: a masked step is the identity (it writes 0 and hands the state on
unchanged); flags are read as 0/1 floats; ``bootstrap_values[t]`` is read only where step ``t`` is
truncated and not terminated, through a branch, so a NaN in any other slot never reaches the
arithmetic; backward, the state past the window end is the ``carry`` when given, else ``V(s_T)``
(``bootstrap_values`` at the row's last unmasked step; 0 if that step terminated, or when the window
end is terminal); forward, ``initial``, else 0; the state at the row's other end is the carry out.

A family is one function (its package's ``cpu.step``), ``step(data, at, k, tr, boot, prm, z0, z1)``:
it loads the step's own fields (:func:`ld`), calls the coefficient functions of
:mod:`rollbuf.boundary.coefficients` (compiled by numba, :data:`inline`; ``boot=None``, no step reads
a bootstrap value, is a type, so its branch is compiled out) and returns the state one step further
along the scan and the step's outputs. A done step stops the state by multiplying it by 0, so a NaN
or inf in the state goes on as ``0·NaN = NaN`` as on the other backends (docs/semantics.md); a
clipped ratio (V-trace's ``truncated_weights``) keeps a NaN ratio NaN and clips an overflowed one (``inf``). The state
is two numbers ``(z0, z1)``: V-trace's pair ``(u, V)``, which starts at ``(0, V(s_T))``; the other
families leave ``z1`` at 0 (``NS = 1``: neither stored nor carried). The driver is specialised by
binding the step as a global of a copy of its code (numba caches a function that takes compiled
functions as arguments under a new key in every process, so ``cache=True`` would never hit); the
copies' names hold a hash of the sources compiled into them (``boundary/coefficients.py`` and every
family's ``coefficients.py`` and ``cpu.py``), so that editing one recompiles them (numba checks only
the source file of the function it caches).

**Two loop orders.** Rows one after the other, the state in registers (``lanes`` None), or time
outermost and the rows innermost, each row's state in a small array (the lanes order, vectorised;
bit for bit the same numbers). An address is ``(g, j, t)``: a row is ``g`` or ``j``. In the lanes
order the step index reaches the loop over the lanes through an empty assembly block
(:func:`_opaque`): LLVM otherwise hoists the vectoriser's overlap checks out of the loop over time
and, the time step being negative in a backward scan, gives up on vectorising.

**Arguments.** A field or carry in is ``(address, stride_g, stride_j, stride_t)`` (``None`` when
absent: its loads are compiled out; a stride ``None`` is a 0 the compiler knows: flags shared by the
features); outputs ``(arrays, strides)``, the carry out ``(array, stride_g, stride_j, stride_k)``
(``None`` when the call returns no carry).
The driver takes ``rows`` ``(g0, g1, j0, j1, T)``, ``fields`` ``((terminated, truncated, mask,
bootstrap_values), data)``, the outputs, the carry in and out, ``prm`` ``(zero, end_boot, family
parameters)`` and ``lanes``; no compiled function takes more than eight arguments.
"""

import pathlib
import types as pytypes
import zlib

import numpy as np
from llvmlite import ir as llvmir
from numba import njit, types
from numba.extending import intrinsic

from rollbuf.boundary import coefficients as C

JIT = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy", boundscheck=False)
INLINE = dict(JIT, inline="always")  # compiled into the caller (numba IR), not on their own


inline = njit(inline="always", error_model="numpy")  # a boundary coefficient function, compiled into its callers


# ---------------------------------------------------------------------------------------------
# loads and stores at (g, j, t); a field is (address, stride_g, stride_j, stride_t) or None
# ---------------------------------------------------------------------------------------------


@intrinsic
def _load(typingctx, addr, index, like):
    """The element ``index`` of the array of ``like``'s type at address ``addr``."""

    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], context.get_value_type(sig.return_type).as_pointer())
        return builder.load(builder.gep(ptr, [args[1]]))

    return like(addr, index, like), codegen


@intrinsic
def _store(typingctx, addr, index, value, like):
    """Write ``value``, converted to ``like``'s type, as element ``index`` of the array at ``addr``."""

    def codegen(context, builder, sig, args):
        ty = sig.args[3]
        ptr = builder.inttoptr(args[0], context.get_value_type(ty).as_pointer())
        builder.store(context.cast(builder, args[2], sig.args[2], ty), builder.gep(ptr, [args[1]]))
        return context.get_dummy_value()

    return types.none(addr, index, value, like), codegen


@intrinsic
def _opaque(typingctx, x):
    """``x`` itself, through an empty assembly block the optimiser cannot see into (see the lanes
    loop of :func:`_drive`)."""

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(sig.return_type)
        return builder.asm(llvmir.FunctionType(ty, [ty]), "", "=r,0", [args[0]], False)

    return types.intp(x), codegen


@njit(**INLINE)
def _index(f, at):
    """The element of field ``f`` at ``at`` ``(g, j, t)``; a stride ``None`` is 0 known to the compiler
    (a field shared by the lanes: the loop over them stays vectorisable)."""
    return at[0] * f[1] + _times(at[1], f[2]) + at[2] * f[3]


@njit(**JIT)
def _times(j, stride):
    if stride is None:
        return 0
    return j * stride


@njit(**JIT)
def ld(f, at, zero):
    """Field ``f`` at ``at`` in ``zero``'s type; 0 for an absent field."""
    if f is None:
        return zero
    return _load(f[0], _index(f, at), zero)


@njit(**JIT)
def _flag(f, at):
    """A flag as 0.0 or 1.0 (any nonzero byte is set); 0 for an absent flag."""
    if f is None:
        return 0.0
    return 1.0 if _load(f[0], _index(f, at), np.uint8(0)) != 0 else 0.0


@njit(**JIT)
def _live(m, at):
    if m is None:
        return True
    return _load(m[0], _index(m, at), np.uint8(0)) != 0


@njit(**JIT)
def _bootstrap(b, tr, at, k, trv, zero):
    """``bootstrap_values`` at a truncated step that did not terminate (read through a branch), 0
    at other steps; ``None`` where no step reads one (then ``local = r``, compiled out)."""
    if b is None:
        return None
    if tr is None:
        return None
    if trv != 0.0 and k == 0.0:
        return _load(b[0], _index(b, at), zero)
    return zero


@njit(**JIT)
def _window_end(b, k, m, row, T, zero):
    """``V(s_T)`` of a row: ``bootstrap_values`` at its last unmasked step (at the last step when no
    step is unmasked), 0 where that step terminated."""
    if b is None:
        return 0.0
    g, j = row
    end = T - 1
    while end >= 0 and not _live(m, (g, j, end)):
        end -= 1
    z = _load(b[0], _index(b, (g, j, end if end >= 0 else T - 1)), zero)
    if end >= 0 and _flag(k, (g, j, end)) != 0.0:
        return 0.0
    return z


@njit(**INLINE)
def _write(outs, at, vals, zero):
    """The step's outputs into ``outs`` ``(addresses, (stride_g, stride_j, stride_t))``, in ``zero``'s
    type; an output at address 0 is not written (not asked for)."""
    addrs, s = outs
    i = at[0] * s[0] + at[1] * s[1] + at[2] * s[2]
    for o in range(len(addrs)):
        if addrs[o]:
            _store(addrs[o], i, vals[o], zero)


@njit(**INLINE)
def _write0(outs, at, zero):
    addrs, s = outs
    i = at[0] * s[0] + at[1] * s[1] + at[2] * s[2]
    for o in range(len(addrs)):
        if addrs[o]:
            _store(addrs[o], i, zero, zero)


# ---------------------------------------------------------------------------------------------
# the driver: one row-loop for every family, specialised per family and direction (below); the
# family's STEP and NS (its state size), and REVERSE, are globals of each specialised copy
# ---------------------------------------------------------------------------------------------


def _visit(fields, outs, prm, at, z0, z1):
    """One step of one row: masked, the identity writing 0; else the family's step."""
    k, tr, m, b = fields[0]
    zero = prm[0]
    if not _live(m, at):
        _write0(outs, at, zero)
        return z0, z1
    kv = _flag(k, at)
    trv = _flag(tr, at)
    z, vals = STEP(fields[1], at, kv, trv, _bootstrap(b, tr, at, kv, trv, zero), prm, z0, z1)
    _write(outs, at, vals, zero)
    return np.float64(z[0]), np.float64(z[1])


def _enter(cin, bounds, prm, g, j, T):
    """The state past the row's far end: the carry in; else 0, or backward ``V(s_T)`` (the pair
    state of V-trace: ``(u, V) = (0, V(s_T))``)."""
    if cin is not None:
        z0 = np.float64(ld(cin, (g, j, 0), prm[0]))
        return z0, (np.float64(ld(cin, (g, j, 1), prm[0])) if NS == 2 else 0.0)
    z = 0.0
    if REVERSE and prm[1]:
        z = np.float64(_window_end(bounds[3], bounds[0], bounds[2], (g, j), T, prm[0]))
    return (0.0, z) if NS == 2 else (z, 0.0)


def _leave(cout, g, j, z0, z1, zero):
    """The state at the row's near end into the carry out ``(address, stride_g, stride_j, stride_k)``
    (``None``: the call returns no carry, and nothing is stored)."""
    if cout is None:
        return
    i = g * cout[1] + j * cout[2]
    _store(cout[0], i, z0, zero)
    if NS == 2:
        _store(cout[0], i + cout[3], z1, zero)


def _drive(rows, fields, outs, cin, cout, prm, lanes):
    """Rows ``g0 ≤ g < g1`` × ``j0 ≤ j < j1`` over ``T`` steps: one row at a time (``lanes`` None),
    or every step of all of them before the next (``lanes`` True), one state per row in ``S``."""
    g0, g1, j0, j1, T = rows
    if lanes is None:
        for g in range(g0, g1):
            for j in range(j0, j1):
                z0, z1 = _enter(cin, fields[0], prm, g, j, T)
                for i in range(T):
                    z0, z1 = _visit(fields, outs, prm, (g, j, T - 1 - i if REVERSE else i), z0, z1)
                _leave(cout, g, j, z0, z1, prm[0])
    else:
        S = np.empty((2, j1 - j0), np.float64)
        for g in range(g0, g1):
            for j in range(j0, j1):
                S[0, j - j0], S[1, j - j0] = _enter(cin, fields[0], prm, g, j, T)
            for i in range(T):
                t = _opaque(T - 1 - i if REVERSE else i)  # keeps the lanes loop vectorised
                for j in range(j0, j1):
                    z0, z1 = _visit(fields, outs, prm, (g, j, t), S[0, j - j0], S[1, j - j0])
                    S[0, j - j0] = z0
                    if NS == 2:
                        S[1, j - j0] = z1
            for j in range(j0, j1):
                _leave(cout, g, j, S[0, j - j0], S[1, j - j0], prm[0])


# the compiled copies are named after a hash of the sources compiled into them: the shared operators
# (rollbuf/boundary/coefficients.py) and each family's arithmetic and CPU step (see the module docstring)
_KERNELS = pathlib.Path(C.__file__).parents[1] / "kernels"
_SOURCES = sorted([*_KERNELS.glob("*/coefficients.py"), *_KERNELS.glob("*/cpu.py")])
_TAG = format(zlib.crc32(b"".join(p.read_bytes() for p in [pathlib.Path(C.__file__), *_SOURCES])), "08x")


def specialise(name, reverse, step, ns):
    """``_drive`` (and the functions it calls) compiled for one family and direction: ``step``, its
    state size ``ns`` (1 or 2) and ``reverse`` bound as the copies' globals ``STEP``, ``NS``, ``REVERSE``."""
    ns_ = dict(globals(), STEP=step, NS=ns, REVERSE=reverse)
    tag = f"{name}_{'backward' if reverse else 'forward'}_{_TAG}"
    for fname in ("_visit", "_enter", "_leave", "_drive"):
        fn = globals()[fname]
        copy = pytypes.FunctionType(fn.__code__, ns_, fname)
        copy.__qualname__ = f"{fname}_{tag}"
        copy.__module__, copy.__doc__ = fn.__module__, fn.__doc__
        ns_[fname] = njit(**(INLINE if fname != "_drive" else JIT))(copy)
    return ns_["_drive"]
