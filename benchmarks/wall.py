"""``python -m benchmarks wall``: the memory wall, each estimator's device time at 2^24 elements against a copy.

    python -m benchmarks wall --out DIR                 # a CUDA GPU: the survey (default strategy)
    python -m benchmarks wall --sweep --out DIR         # and GAE under forced strategies (the table's choices)
    python -m benchmarks wall --tilings gae:mask:float32,discounted_returns --out DIR
                                                        # those cases under the whole-row tilings of TILINGS
    python -m benchmarks wall --window --out DIR        # the survey's cases where rows are split, under WINDOWS
    python -m benchmarks wall --one-row --out DIR       # one row of 2^16-2^24 steps: the families' split_row
    python -m benchmarks wall --dry-run --out DIR       # the same plumbing on the CPU, tiny shapes, wall clock

* **survey**: every estimator of the table on docs/benchmarks.md ('At the memory wall'), fp32, 1%
  terminations and truncations (GAE also with 30% masked steps, and bf16 inputs), at 2^24 elements in
  every aspect ratio from one row of 2^24 steps to 2^21 rows of 8 (:data:`SHAPES`); the default strategy.
* **sweep** (``--sweep``): GAE, fp32, at the same shapes under forced choices
  (:func:`rollbuf.kernels.forced`: rows per program, warps, chunk length, look-back or three or two
  passes), each variant's outputs compared with the default's on the same inputs (``diff``: the largest
  difference over the output's largest magnitude, at least 1; exit 1 above 1e-4, above one rounding for
  16-bit outputs: :data:`TOLERANCE`).
* **tilings** (``--tilings est[:mix[:dtype]],...``): those cases (GAE with a mask, bf16 inputs, the
  estimators of fewer bytes a step) at the shapes whose rows are held whole by one program, under the
  tilings of :data:`TILINGS` (the fastest of the GAE sweep at each shape), each with its chunks held
  in reverse (``flip``) and not, and with a mask the exclusive state by re-loading the neighbour and by
  the in-register shift; compared with the default's outputs as the sweep's are. With
  ``--tilings`` the survey is not run.
* **window** (``--window``): every case of the survey at the shapes whose rows are split across programs
  (one row, 64 and 256 rows), under the look-back's choices of :data:`WINDOWS` (its window of one warp's
  32 words or of one word a thread, one chunk at a time, and for one row the three passes in the same
  chunks), compared with the default's outputs as the sweep's are; the survey is not run.
* **one row** (``--one-row``): the survey's cases whose family has a program of its own for one split row
  (its row's ``split_row``: GAE, advantages, Retrace, fp32) at one row of each length of :data:`ONE_ROW`,
  the default against the three passes (``presolve=True``) and against the family's program forced
  (:func:`family_row`, also where the default keeps the three passes) on the same inputs, twice; the
  survey is not run.

Device time: :func:`benchmarks.clocks.graph_time` (a CUDA graph of the call, replayed); % of copy: the
bytes the call must move (:func:`benchmarks.suite.bytes_moved`) over the device time and the copy bandwidth
measured in the same run. Inputs: :func:`benchmarks.suite.make_fields`. CSV ``DIR/wall.csv`` (the rows
of a forced choice have it in ``force``), a short table printed last.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import time

import torch

from benchmarks.cases import PARAMS, Case
from benchmarks.competitors import COMPETITORS, bind
from benchmarks.suite import bytes_moved, copy_bandwidth, make_fields, provenance
from rollbuf import kernels
from rollbuf.kernels import host

E = 1 << 24
#: every aspect ratio at 2^24 elements, one row of 2^24 steps to 2^21 rows of 8
SHAPES = [(1, E), (64, E >> 6), (256, E >> 8), (4096, 4096), (16384, 1024), (65536, 256), (1 << 18, 64), (1 << 21, 8)]
#: (estimator, boundary mix, dtype) of the survey
SURVEY = [("gae", "term+trunc", "float32"), ("advantages", "term+trunc", "float32"), ("gae", "mask", "float32"),
          ("gae", "term+trunc", "bfloat16"), ("lambda_returns", "term+trunc", "float32"),
          ("discounted_returns", "term+trunc", "float32"), ("vtrace", "term+trunc", "float32"),
          ("retrace", "term+trunc", "float32"), ("eligibility_traces", "term+trunc", "float32"),
          ("episodic_sums", "term+trunc", "float32")]


def variants(n: int, t: int, sms: int = host.CPU_SMS):
    """The forced choices swept at ``n`` rows of ``t`` steps: split rows (fewer rows than fill the GPU):
    chunk length, warps, look-back (one chunk at a time, or a window of words read at once: ``poll``) or
    three passes (one row: three or two passes, or the look-back); whole rows: rows per program and warps
    at 2 to 16 elements per thread, chunks of the whole row (or 1024–4096 steps)."""
    if n == 1:
        for bt, w, pre in itertools.product((2048, 4096, 8192), (8, 16), (True, 2)):
            yield dict(split=True, block_t=bt, num_warps=w, presolve=pre, max_chunk=max(bt, 2048))
        for bt, w, poll in itertools.product((1024, 2048), (4, 8), (True, False)):
            yield dict(split=True, block_t=bt, num_warps=w, presolve=False, poll=poll, max_chunk=2048)
    elif n < host.FILL_PER_SM * sms:
        for bt, w, pre in itertools.product((1024, 2048, 4096), (4, 8, 16), (False, True, "poll")):
            yield dict(split=True, block_t=bt, num_warps=w, presolve=pre is True, max_chunk=max(bt, 2048),
                       **({"poll": True} if pre == "poll" else {}))
    else:
        for bt in ((t,) if t <= 2048 else (1024, 2048, 4096)):
            for bn in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
                for e in (2, 4, 8, 16):
                    w = bn * bt // (32 * e)
                    if w in (2, 4, 8, 16) and 256 <= bn * bt <= 16384:
                        yield dict(split=False, block_t=bt, block_n=bn, num_warps=w, max_chunk=max(bt, 2048))


#: the whole-row tilings ``(rows per program, chunk, warps)`` the ``--tilings`` cases are timed under at
#: each shape: the fastest few of the GAE sweep (benchmarks/results/sweep_gpu_da7134b.csv) and their
#: neighbours in elements per thread
TILINGS = {
    (4096, 4096): [(1, 1024, 4), (1, 1024, 8), (1, 2048, 4), (1, 2048, 8), (1, 4096, 16)],
    (16384, 1024): [(1, 1024, 2), (1, 1024, 4), (1, 1024, 8), (2, 1024, 8)],
    (65536, 256): [(1, 256, 2), (2, 256, 2), (2, 256, 4), (4, 256, 8)],
    (1 << 18, 64): [(4, 64, 2), (8, 64, 2), (8, 64, 4), (16, 64, 8)],
    (1 << 21, 8): [(32, 8, 4), (64, 8, 8), (128, 8, 16)],
}


def tilings(n: int, t: int, mask: bool):
    """The forced choices of ``--tilings`` at ``n`` rows of ``t`` steps (none where the table splits
    rows): each of :data:`TILINGS`, flipped and not, and with a mask both ways of the exclusive state."""
    for bn, bt, w in TILINGS.get((n, t), ()):
        for flip in (False, True):
            for sl in ((False, True) if mask else (None,)):
                yield dict(split=False, block_t=bt, block_n=bn, num_warps=w, max_chunk=max(bt, 2048), flip=flip,
                           **({} if sl is None else dict(shift_load=sl)))


#: ``--window``'s choices ``(chunk, warps, poll)``: the look-back with a window of 32 words (one warp's,
#: whatever the warps: its reductions within a warp), of one word a thread (``True``), or one chunk at a
#: time (``False``); ``"three"``: the three passes in the same chunks (one row)
WINDOWS = [(2048, 8, 32), (2048, 4, 32), (1024, 4, 32), (1024, 8, 32), (2048, 8, True), (1024, 4, True),
           (2048, 8, False), (1024, 4, False), (2048, 8, "three"), (1024, 4, "three")]


#: ``--one-row``'s row lengths and cases
ONE_ROW = [1 << k for k in range(16, 25)]
ONE_ROW_CASES = [("gae", "term+trunc", "float32"), ("advantages", "term+trunc", "float32"),
                 ("retrace", "term+trunc", "float32")]


def family_row(estimator: str) -> dict:
    """The forced choices that run ``estimator``'s family program for one split row (its ``split_row``)."""
    from rollbuf.kernels.families import FAMILIES
    from rollbuf.problem import Family

    fam = Family.RETRACE if estimator == "retrace" else Family.TD_LAMBDA
    e = FAMILIES[fam].split_row
    return dict(split=True, block_t=e.chunk, num_warps=e.warps, presolve=False, poll=e.window,
                max_chunk=max(e.chunk, 2048))


def windows(n: int):
    """The forced choices of ``--window`` at ``n`` split rows (the three passes for one row only)."""
    for bt, w, poll in WINDOWS:
        if poll == "three":
            if n == 1:
                yield dict(split=True, block_t=bt, num_warps=w, presolve=True, max_chunk=max(bt, 2048))
        else:
            yield dict(split=True, block_t=bt, num_warps=w, presolve=False, poll=poll, max_chunk=max(bt, 2048))


def parse_cases(text: str) -> list:
    """``est[:mix[:dtype]],...`` as ``(estimator, mix, dtype)`` (mix ``term+trunc``, dtype ``float32`` by default)."""
    out = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        if len(parts) > 3:
            raise ValueError(f"--tilings: {item!r} is not est[:mix[:dtype]]")
        out.append(tuple(parts + ["term+trunc", "float32"][len(parts) - 1:]))
    return out


#: the largest ``diff`` a forced choice may show against the default, by input dtype: fp32 outputs
#: 1e-4; the 16-bit outputs of 16-bit inputs one rounding apart (2^-7 of the largest magnitude)
TOLERANCE = {"float32": 1e-4, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


class _Seen:
    """The :class:`~rollbuf.kernels.host.Launch` each call ran (its strategy goes in the row)."""

    def __enter__(self):
        self.last = None
        self.call, self.run = host.Launch.__call__, host.Launch.run
        seen = self

        def call(launch, p):
            seen.last = launch
            return seen.call(launch, p)

        def run(launch, get, carry, params):
            seen.last = launch
            return seen.run(launch, get, carry, params)

        host.Launch.__call__, host.Launch.run = call, run
        return self

    def __exit__(self, *exc):
        host.Launch.__call__, host.Launch.run = self.call, self.run


def _plan(launch) -> str:
    if launch is None:
        return "-"
    st = launch.strategy
    how = "split" if st.split else "walk"
    order = " quads" if st.quads else " flip" if st.flip else ""
    poll = f" poll{st.poll}" if st.poll else ""
    return f"bn{st.block_n} bt{st.block_t} w{st.num_warps} {how}{int(st.presolve)} g{launch.grid}{order}{poll}"


def _time(call, device):
    """Device seconds per call (graph replay) on a GPU; the best wall time of 3 calls on the CPU."""
    if device == "cuda":
        from benchmarks.clocks import graph_time

        return graph_time([call], reps=5)[0]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(case: Case, f, device, bw, force=None, ref=None) -> tuple[dict, tuple]:
    """One row: ``case`` on the inputs ``f`` under the forced choices ``force``; ``ref``: outputs to compare."""
    with kernels.forced(**(force or {})), _Seen() as seen:
        call = bind(COMPETITORS["rollbuf-triton"], case.estimator, f, PARAMS[case.estimator])
        out = call()
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        diff = None if ref is None else max(
            float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1)) for a, b in zip(outs, ref))
        nb = bytes_moved(case, f, [o for o in outs if o is not None])
        sec = _time(call, device)
    row = dict(estimator=case.estimator, n=case.n, t=case.t, dtype=case.dtype, mix=case.mix,
               force="" if force is None else str(force), plan=_plan(seen.last), bytes=nb,
               device_us=sec * 1e6, pct_copy=100 * nb / sec / bw if bw else None, diff=diff)
    return row, outs


def forced_rows(case: Case, f, device, bw, ref, forces, deadline) -> list:
    """:func:`measure`'s rows of ``case`` under each of ``forces`` in turn, compared with ``ref``,
    none started after ``deadline`` (``time.perf_counter``)."""
    rows = []
    for force in forces:
        if time.perf_counter() > deadline:
            break
        rows.append(measure(case, f, device, bw, force, ref)[0])
    return rows


def default_and_forced(case: Case, device, bw, forces, deadline) -> list:
    """``case``'s row under the default strategy, then :func:`forced_rows` under ``forces`` compared with
    its outputs, on one set of inputs."""
    f = make_fields(case, device)
    row, ref = measure(case, f, device, bw)
    return [row, *forced_rows(case, f, device, bw, ref, forces, deadline)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks wall", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", required=True, help="the results folder")
    ap.add_argument("--sweep", action="store_true", help="also GAE under every forced choice of variants()")
    ap.add_argument("--tilings", default="", help="est[:mix[:dtype]],...: those cases under the tilings of TILINGS")
    ap.add_argument("--window", action="store_true", help="the survey's split-row cases under WINDOWS' choices")
    ap.add_argument("--one-row", action="store_true", help="one row of each ONE_ROW length: default vs three passes")
    ap.add_argument("--budget-s", type=float, default=400.0, help="start no case or variant after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors (Triton's interpreter), tiny shapes")
    args = ap.parse_args(argv)
    if args.dry_run:
        from benchmarks.suite import interpreted

        rc = interpreted("wall", ["--dry-run", "--out", args.out] + (["--sweep"] if args.sweep else [])
                         + (["--tilings", args.tilings] if args.tilings else [])
                         + (["--window"] if args.window else []) + (["--one-row"] if args.one_row else []))
        if rc is not None:
            return rc
    device = "cpu" if args.dry_run else "cuda"
    shapes = [(1, 67), (3, 9)] if args.dry_run else SHAPES
    if args.one_row:
        shapes = [(1, 67)] if args.dry_run else [(1, t) for t in ONE_ROW]
    bw = None if args.dry_run else copy_bandwidth()
    deadline = time.perf_counter() + args.budget_s
    rows = []
    cases = parse_cases(args.tilings)
    for n, t in shapes:
        for est, mix, dt in [] if cases or args.window or args.one_row else SURVEY[:2] if args.dry_run else SURVEY:
            if time.perf_counter() > deadline:
                break
            case = Case(est, n, t, dt, mix)
            rows.append(measure(case, make_fields(case, device), device, bw)[0])
        if args.sweep:
            case = Case("gae", n, t)
            f = make_fields(case, device)
            _, ref = measure(case, f, device, bw)
            sweep = variants(n, t)
            if args.dry_run:  # two choices, in 16-step chunks: the interpreter is slow
                sweep = [dict(v, block_t=16, num_warps=1) for v in list(sweep)[:2]]
            rows += forced_rows(case, f, device, bw, ref, sweep, deadline)
        for est, mix, dt in cases if args.dry_run or (n, t) in TILINGS else ():
            if time.perf_counter() > deadline:
                break
            sweep = list(tilings(n, t, mix == "mask")) if not args.dry_run else [
                dict(split=False, block_t=128, block_n=1, num_warps=1, flip=flip) for flip in (False, True)]
            rows += default_and_forced(Case(est, n, t, dt, mix), device, bw, sweep, deadline)
        split_rows = n == 1 if args.dry_run else n < host.FILL_PER_SM * host.CPU_SMS
        for est, mix, dt in (SURVEY[:1] if args.dry_run else SURVEY) if args.window and split_rows else ():
            if time.perf_counter() > deadline:
                break
            sweep = list(windows(n))
            if args.dry_run:  # the first two, in 16-step chunks of one warp: the interpreter is slow
                sweep = [dict(v, block_t=16, num_warps=1) for v in sweep[:2]]
            rows += default_and_forced(Case(est, n, t, dt, mix), device, bw, sweep, deadline)
        for est, mix, dt in (ONE_ROW_CASES[:1] if args.dry_run else ONE_ROW_CASES) if args.one_row else ():
            if time.perf_counter() > deadline:
                break
            for _ in range(1 if args.dry_run else 2):  # the same inputs twice: default, three passes, own, again
                forces = [dict(presolve=True), dict(family_row(est), **({"block_t": 16} if args.dry_run else {}))]
                rows += default_and_forced(Case(est, n, t, dt, mix), device, bw, forces, deadline)
        if device == "cuda":
            torch.cuda.empty_cache()
    prov = provenance(device)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "wall.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*rows[0], *prov, "copy_GBps"])
        w.writeheader()
        for row in rows:
            w.writerow({**row, **prov, "copy_GBps": round(bw / 1e9) if bw else ""})
    print(", ".join(f"{k}={v}" for k, v in prov.items()) + (f", copy {bw / 1e9:.0f} GB/s" if bw else ""))
    print(f"{'estimator':19} {'mix':10} {'dtype':8} {'N x T':>18} {'plan':30} {'µs':>9} {'% copy':>7}  force")
    for r in rows:
        pct = "" if r["pct_copy"] is None else f"{r['pct_copy']:.1f}"
        print(f"{r['estimator']:19} {r['mix']:10} {r['dtype']:8} {r['n']:>8} x {r['t']:<8} {r['plan']:30} "
              f"{r['device_us']:9.1f} {pct:>7}  {r['force']}")
    return 1 if any(r["diff"] is not None and not r["diff"] <= TOLERANCE.get(r["dtype"], 1e-4) for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
