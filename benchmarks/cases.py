"""Every case the benchmarks run: the scoreboard's grids (the GPU grid, rl-triton's grid for the
peers, the naive kernel's shapes, the CPU smoke grid), the CPU table's shapes, and the shapes of
the host-time, memory, backward and LLM runs. Nothing else in ``benchmarks/`` spells a shape.
"""

from __future__ import annotations

import attrs

from rollbuf.estimators import REGISTRY
from rollbuf.problem import Family

#: The parameter values every case runs with: γ = 0.99 and λ = 0.95 wherever the estimator has
#: them, except V-trace's λ, which stays 1 (IMPALA's V-trace, as the peers implement it); the other
#: parameters at their defaults. Read from the estimator registry.
BENCH_VALUES = {"gamma": 0.99, "lam": 0.95}
PARAMS = {name: {p.name: BENCH_VALUES[p.name] for p in e.params
                 if p.name in BENCH_VALUES and not (e.family == Family.VTRACE and p.name == "lam")}
          for name, e in REGISTRY.items()}
ESTIMATORS = tuple(n for n, e in REGISTRY.items() if e.docs is not None)  # the scoreboard grids' (not `advantages`)
#: Boundary mixes: (p_terminated, p_truncated, p_masked). ``p_truncated = None``: no truncated
#: tensor at all and ``bootstrap_values`` given as the ``[N]`` window-end column (how trainers with
#: terminations only call it: CleanRL/SB3, rl-triton's ``last_value``).
MIXES = {
    "none": (0.0, 0.0, 0.0), "term": (0.01, 0.0, 0.0), "term+trunc": (0.01, 0.01, 0.0),
    "mask": (0.01, 0.01, 0.3), "term-only": (0.02, None, 0.0),
}


@attrs.frozen
class Case:
    """One scoreboard case: an estimator on ``n`` rows of ``t`` steps of ``dtype`` inputs with the
    boundary ``mix`` (one of :data:`MIXES`)."""

    estimator: str
    n: int
    t: int
    dtype: str = "float32"
    mix: str = "term+trunc"
    layout: str = "env"  # "env": [N, T] contiguous; "time": [T, N] buffers passed as [N, T] views

    @property
    def key(self):
        return (self.estimator, self.n, self.t, self.dtype, self.mix, self.layout)


def row_key(r: dict) -> tuple:
    """The case of a result row (rows of CSVs written before the layout column are env-major)."""
    return (r["estimator"], int(r["n"]), int(r["t"]), r["dtype"], r["mix"], r.get("layout") or "env")


def _grid(estimators, shapes, dtypes=("float32",), mixes=("term+trunc",), layouts=("env",)) -> list[Case]:
    shapes = list(dict.fromkeys(shapes))  # 4096x128 is in both the short and the medium grid
    return [Case(e, n, t, d, m, lay) for e in estimators for (n, t) in shapes for d in dtypes for m in mixes
            for lay in layouts]


SHORT = [(n, t) for t in (8, 16, 32, 64, 128) for n in (4096, 8192, 16384, 32768)]
MEDIUM = [(n, t) for n in (64, 128, 256, 512, 4096, 16384) for t in (128, 512, 1024, 2048, 4096)]
LONG = [(n, t) for n in (1, 8, 64, 256) for t in (16384, 131072, 1048576)]
LLM = [(8, 8192), (64, 32768), (256, 131072)]
#: rl-triton's own benchmark grid (its GAE-vs-PufferLib benchmark: T 128…4096 × N 128…8192 and the
#: short-horizon T 8…128 × N 4096…32768: 40 shapes, 39 distinct as 8192 × 128 is in both halves)
#: and three shapes beyond it: 256 long rows, one row of 2^20 steps, and 16384 × 4096.
PEER_SHAPES = ([(n, t) for t in (128, 512, 1024, 2048, 4096) for n in (128, 512, 2048, 8192)]
               + [(n, t) for t in (8, 16, 32, 64, 128) for n in (4096, 8192, 16384, 32768)]
               + [(256, 131072), (1, 1048576), (16384, 4096)])
PEER_ESTIMATORS = tuple(n for n in REGISTRY if n != "gae")  # rl-triton's GAE writes advantages only
#: GAE against the naive one-block kernel (rows of up to 16384 steps) and rl-triton's compute_gae.
NAIVE_SHAPES = [(4096, 128), (16384, 128), (2048, 512), (512, 1024), (512, 4096), (2048, 2048), (8192, 4096),
                (32768, 8), (256, 131072), (1, 1048576)]
GRIDS: dict[str, list[Case]] = {
    "cpu-smoke": _grid(ESTIMATORS, [(16, 64), (2, 1000)], mixes=("term+trunc", "mask"))
    + _grid(["gae"], [(64, 128)], mixes=("none", "term", "term+trunc"))
    + _grid(["gae", "vtrace"], [(16, 64)], layouts=("time",)),
    "cpu": _grid(ESTIMATORS, [(8, 32768), (1024, 128)], mixes=("term+trunc",)),
    "gpu-quick": _grid(["gae"], [(32768, 8), (4096, 128), (1024, 1024), (256, 131072), (1, 1048576)],
                       dtypes=("float32", "bfloat16")),
    # the kernel grid: every estimator, fp32 and bf16, with and without truncations; GAE also with
    # no boundaries at all and with masks
    "gpu": _grid(ESTIMATORS, SHORT + MEDIUM + LONG, dtypes=("float32", "bfloat16"), mixes=("term", "term+trunc"))
    + _grid(["gae"], SHORT + MEDIUM + LONG, mixes=("none", "mask"))
    # time-major buffers ([T, N] in memory, the layout of a step-by-step collector), read in place
    + _grid(ESTIMATORS, SHORT + MEDIUM, layouts=("time",)),
    "llm": _grid(["gae", "discounted_returns"], LLM, dtypes=("float32", "bfloat16"), mixes=("mask",)),
    # rollbuf against rl-triton and PufferLib's kernel, each pair on the same outputs: every
    # estimator both have, fp32, terminations only with [N] window-end values (as the peers'
    # benchmarks call them); GAE advantages and V-trace also with truncations
    "peers": _grid(PEER_ESTIMATORS, PEER_SHAPES, mixes=("term-only",))
    + _grid(["advantages", "vtrace"], PEER_SHAPES, mixes=("term+trunc",)),
    # GAE's two outputs and advantages alone, against the naive kernel writing the same outputs
    "naive": _grid(["gae", "advantages"], NAIVE_SHAPES, mixes=("term-only",)),
}
#: The competitors a grid runs by default (others: every competitor that applies on the machine).
GRID_COMPETITORS = {"peers": ("rollbuf-triton", "rl-triton", "pufferlib"),
                    "naive": ("rollbuf-triton", "naive-triton", "rl-triton")}


def parse_cases(spec: str) -> list[Case]:
    """Cases from ``estimator:NxT[:mix[:dtype[:layout]]],...`` (defaults: term+trunc, float32, env)."""
    out = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) < 2:
            raise ValueError(f"case {item!r}: expected estimator:NxT[:mix[:dtype[:layout]]]")
        name, shape = parts[0], parts[1]
        if name not in PARAMS:
            raise ValueError(f"case {item!r}: unknown estimator {name!r}; known: {sorted(PARAMS)}")
        mix = parts[2] if len(parts) > 2 else "term+trunc"
        if mix not in MIXES:
            raise ValueError(f"case {item!r}: unknown mix {mix!r}; known: {sorted(MIXES)}")
        dtype = parts[3] if len(parts) > 3 else "float32"
        layout = parts[4] if len(parts) > 4 else "env"
        n, t = parse_shape(shape)
        out.append(Case(name, n, t, dtype=dtype, mix=mix, layout=layout))
    return out


def parse_shape(text: str) -> tuple[int, int]:
    """``"NxT"`` -> ``(N, T)``."""
    n, t = (int(x) for x in text.lower().split("x"))
    return n, t


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"NxT,NxT,..."`` -> ``[(N, T), ...]``."""
    return [parse_shape(s) for s in text.split(",") if s]


def part(cases: list[Case], i: int, k: int) -> list[Case]:
    """The ``i``-th of ``k`` parts of a grid (0-based), for runs split across machine calls: whole
    shapes go to one part (their inputs are made once), dealt out greedily by :func:`shape_cost`
    (largest first, to the lightest part) so that the parts take about the same time."""
    counts: dict = {}
    for c in cases:
        counts[(c.n, c.t)] = counts.get((c.n, c.t), 0) + 1
    load = [0.0] * k
    owner = {}
    for s in sorted(counts, key=lambda s: (-shape_cost(*s) * counts[s], s)):
        j = min(range(k), key=lambda j: (load[j], j))
        owner[s] = j
        load[j] += shape_cost(*s) * counts[s]
    return [c for c in cases if owner[(c.n, c.t)] == i]


def shape_cost(n: int, t: int) -> float:
    """Rough time of one case in element-equivalents: the data, plus a fixed cost per case (timing
    calls, graph capture, the gate) worth about 2^23 elements."""
    return n * t + 2**23


# --------------------------------------------------------------------------- the CPU table (cpu.py)

#: GAE on the CPU against the loops users run: N rows × T steps, float32, 2% terminations, the
#: window end bootstrapped from ``V(s_T)`` (one value per row): the ``term-only`` mix.
CPU_N = (1, 4, 8, 64, 256, 1024)
CPU_T = (8, 128, 256, 2048, 32768)
CPU_GRID = [(n, t) for n in CPU_N for t in CPU_T]
CPU_QUICK = [(1, 8), (4, 128), (64, 128), (8, 2048)]
CPU_P_TERMINATED = 0.02
#: the first call in a fresh process: a small rollout, each estimator family once
FIRST_CALL_SHAPE = (4, 128)
FIRST_CALL_ESTIMATORS = ("gae", "lambda_returns", "vtrace", "retrace", "eligibility_traces")

# ------------------------------------------------------------------------ the other measurements

#: host_time.py: the host's cost per call of a small GAE call (every call host-bound on a GPU)
HOST_SHAPE = (4096, 128)
#: memory.py: peak extra device memory of a call, one case per kernel strategy (the strategy each
#: takes is named beside it)
MEMORY_CASES = [
    Case("gae", 32768, 8),  # tiles of short rows
    Case("gae", 4096, 128),
    Case("gae", 16384, 4096),  # rows walked in chunks
    Case("gae", 256, 1 << 20),  # split rows, look-back chain
    Case("gae", 1, 1 << 20),  # one row: three passes
    Case("gae", 1, 1 << 24),
    Case("gae", 256, 1 << 20, mix="mask"),
    Case("vtrace", 1, 1 << 20),
    Case("vtrace", 256, 131072),
    Case("retrace", 1, 1 << 20),
    Case("eligibility_traces", 1, 1 << 20),
    Case("gae", 4096, 128, layout="time"),  # time-major 16 x T tiles
    Case("gae", 512, 4096, layout="time"),  # time-major split tiles, look-back chain
    Case("gae", 1024, 1024, layout="time"),
    Case("vtrace", 512, 4096, layout="time"),
]
#: backward.py: gradients of every floating input, fp32, 1% terminations and truncations
BACKWARD_ESTIMATORS = ("gae", "lambda_returns", "vtrace", "retrace", "eligibility_traces")
BACKWARD_SHAPES = [(4096, 128), (1024, 1024), (16384, 4096), (256, 131072), (1, 1048576)]
#: llm.py: multi-turn token rows (B × T)
LLM_SIZES = LLM
#: the tiny shapes of the dry runs on a CPU (Triton's interpreter): the logic, not a measurement
DRY_SHAPES = [(3, 37), (2, 70)]
