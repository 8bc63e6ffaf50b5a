"""Per shape of the kernel grid: % of copy bandwidth reached, and why it is below 85%.

    python -m rollbuf.bench --experiment why [benchmarks/results/bench_gpu_*.csv ...]

Reads the scoreboard rows (later files replace earlier ones, as ``python -m rollbuf.bench
--from-csv``), and prints one markdown row per shape: GAE device time and % of copy (fp32 and bf16,
terminations + truncations, env-major) and the fp32 full call (host included, as measured then),
the range of % of copy over every estimator, both dtypes and both boundary mixes, the strategy the
kernel takes for the shape, and the reason, by the regime the shape falls in. The reasons are the measured ones of docs/benchmarks.md ("Where the time goes"):

* **chain** (rows split across programs, first): few long rows are split into chunks chained by
  the decoupled look-back, and a chunk waits for its predecessors;
* **passes** (a single split row): three launches (aggregates, their scan, outputs), each a few µs
  of device time however short the row, and the row's inputs read twice;
* **launch**: the shape's bytes take less than 3 µs at the measured copy rate, and a launch plus
  one wave of programs costs 3–5 µs of device time (an empty Triton launch: 2.8 µs);
* **latency**: many rows, each program loads its chunk, scans it through a dependent chain,
  re-loads and stores, with 2–3 programs per SM (80 registers per thread for GAE); 16-byte vector
  loads did not change the time (UNIT, c612211), smaller chunks helped V-trace only.

A second table checks the "no register-spill cliff" requirement: per estimator and row length, the
best % of copy over the shapes of at least 2^22 elements (fp32, terminations + truncations,
env-major); a spill cliff would show as a drop at some T.

docs/benchmarks.md holds the output (tests/test_docs.py checks it is current).
"""

from __future__ import annotations

import os
import statistics
import sys

from rollbuf.bench.experiments._common import RESULTS


def default_csvs():
    """The committed scoreboard rows, in the order of the machine calls that wrote them (_a … _l)."""
    paths = [str(p) for p in RESULTS.glob("bench_gpu_*.csv")]
    return sorted(paths, key=lambda p: os.path.basename(p).rsplit("_", 1)[-1])


def table(paths) -> str:
    from rollbuf.bench.__main__ import read_csv
    from rollbuf.bench.suite import LONG, MEDIUM, SHORT
    from rollbuf.kernels import FAMILY_MAX_CHUNK, strategy

    rows = [r for r in read_csv(paths) if r["impl"] == "rollbuf-triton" and r.get("status") == "ok"
            and (r.get("layout") or "env") == "env" and r["mix"] in ("term", "term+trunc")]
    by = {}
    for r in rows:
        by.setdefault((r["n"], r["t"]), []).append(r)
    copy = statistics.median(float(r["copy_GBps"]) for r in rows if r.get("copy_GBps"))
    out = ["| N × T | GAE fp32 µs (% of copy) | full call µs | GAE bf16 µs (% of copy) "
           "| every estimator, % of copy | strategy | why below 85% |", "|---|---|---|---|---|---|---|"]
    for n, t in dict.fromkeys(SHORT + MEDIUM + LONG):
        rs = by.get((n, t), [])

        def gae(dtype, rs=rs):
            r = [x for x in rs if x["estimator"] == "gae" and x["dtype"] == dtype and x["mix"] == "term+trunc"]
            return f"{r[0]['device_us']:.1f} ({r[0]['pct_copy']:.0f}%)" if r else "–"

        pct = [r["pct_copy"] for r in rs]
        fp32 = [r for r in rs if r["estimator"] == "gae" and r["dtype"] == "float32" and r["mix"] == "term+trunc"]
        at_copy_us = fp32[0]["bytes"] / (copy * 1e9) * 1e6 if fp32 else float("nan")
        st = strategy(n, t)
        sv = strategy(n, t, max_chunk=FAMILY_MAX_CHUNK.get("vtrace"))
        if st.split and st.presolve:
            how = f"split in three passes, {st.num_seg} × {st.block_t}-step chunks"
        elif st.split:
            how = f"split, {st.num_seg} × {st.block_t}-step chunks per row"
        elif st.num_seg == 1 and t <= st.block_t:
            how = f"{st.block_n} row(s) × {st.block_t} steps per program"
        else:
            how = f"walked, {st.block_n} row(s) × {st.block_t}-step chunks"
        if sv != st:
            how += " (V-trace: 1024-step chunks)"
        if st.split and st.presolve:
            why = (f"passes: three launches for {at_copy_us:.1f} µs of traffic at copy speed, the row read twice")
        elif st.split:
            why = f"chain: {n} rows × {st.num_seg} chunks chained by the look-back; chunks wait on predecessors"
        elif at_copy_us < 3.0:
            why = (f"launch: {at_copy_us:.1f} µs of traffic at copy speed against ≥ 3 µs for a launch and one "
                   "wave of programs")
        else:
            why = "latency: load → scan → reload → store per chunk, 2–3 programs per SM"
        rng = f"{min(pct):.0f}–{max(pct):.0f}%" if pct else "–"
        call = f"{fp32[0]['call_us']:.0f}" if fp32 and fp32[0].get("call_us") else "–"
        out.append(f"| {n} × {t} | {gae('float32')} | {call} | {gae('bfloat16')} | {rng} | {how} | {why} |")
    return "\n".join(out) + "\n"


def cliff_table(paths) -> str:
    from rollbuf.bench.__main__ import read_csv

    rows = [r for r in read_csv(paths) if r["impl"] == "rollbuf-triton" and r.get("status") == "ok"
            and (r.get("layout") or "env") == "env" and r["mix"] == "term+trunc" and r["dtype"] == "float32"
            and int(r["n"]) * int(r["t"]) >= 2**22]
    ts = sorted({int(r["t"]) for r in rows})
    best = {}
    for r in rows:
        k = (r["estimator"], int(r["t"]))
        best[k] = max(best.get(k, 0.0), float(r["pct_copy"]))
    out = ["| estimator | " + " | ".join(f"T = {t}" for t in ts) + " |", "|---|" + "---|" * len(ts)]
    for e in sorted({r["estimator"] for r in rows}):
        out.append(f"| {e} | " + " | ".join(f"{best[(e, t)]:.0f}%" if (e, t) in best else "–" for t in ts) + " |")
    return "\n".join(out) + "\n"


def report(paths) -> str:
    return (table(paths) + "\nBest % of copy per estimator and row length, shapes of ≥ 2^22 elements (fp32, "
            "terminations + truncations, env-major):\n\n" + cliff_table(paths))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    sys.stdout.write(report(argv or default_csvs()))
    return 0


if __name__ == "__main__":
    main()
