"""Markdown tables for docs/benchmarks.md from the CSVs the GPU runs wrote.

    python benchmarks/report.py benchmarks/results/gpu_kernels_23e519c.csv
"""

from __future__ import annotations

import csv
import math
import sys


def load(path):
    return list(csv.DictReader(open(path)))


def f(x, fmt="{:.1f}"):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(v) else fmt.format(v)


def grid_table(rows, estimator="gae", dtype="float32", trunc="True"):
    sel = [r for r in rows if r["impl"] == "rollbuf-triton" and r["estimator"] == estimator
           and r["dtype"] == dtype and r["trunc"] == trunc]
    out = ["| N × T | device µs | full call µs | GB/s | % of copy | rel. error |", "|---|---|---|---|---|---|"]
    for r in sel:
        out.append(f"| {r['N']} × {r['T']} | {f(r['device_us'])} | {f(r['call_us'])} | {f(r['gbps'], '{:.0f}')} | "
                   f"{f(r['pct_copy'], '{:.0f}')} | {f(r['rel_err'], '{:.1e}')} |")
    return "\n".join(out)


def estimators_table(rows):
    sel = [r for r in rows if r["impl"] == "rollbuf-triton" and r["dtype"] == "float32"
           and (r["estimator"] != "gae" or r["trunc"] == "False")]
    out = ["| estimator | N × T | truncations | device µs | full call µs | % of copy | rel. error |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(sel, key=lambda r: (int(r["N"]) * -1, r["estimator"])):
        out.append(f"| {r['estimator']} | {r['N']} × {r['T']} | {r['trunc']} | {f(r['device_us'])} | "
                   f"{f(r['call_us'])} | {f(r['pct_copy'], '{:.0f}')} | {f(r['rel_err'], '{:.1e}')} |")
    return "\n".join(out)


def baselines_table(rows):
    ours = {(r["N"], r["T"]): r for r in rows if r["impl"] == "rollbuf-triton" and r["estimator"] == "gae"
            and r["dtype"] == "float32" and r["trunc"] == "False"}
    out = ["| N × T | implementation | device µs | full call µs | rel. error | rollbuf device speedup |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        if r["impl"] in ("eager-loop", "compiled-doubling"):
            o = ours.get((r["N"], r["T"]))
            t_them = float(r["device_us"]) if r["device_us"] not in ("", "nan") and not math.isnan(float(r["device_us"])) else float(r["call_us"])
            sp = f"{t_them / float(o['device_us']):.1f}×" if o else "–"
            out.append(f"| {r['N']} × {r['T']} | {r['impl']} | {f(r['device_us'])} | {f(r['call_us'])} | "
                       f"{f(r['rel_err'], '{:.1e}')} | {sp} |")
            if o and r["impl"] == "compiled-doubling":
                out.append(f"| {r['N']} × {r['T']} | rollbuf triton | {f(o['device_us'])} | {f(o['call_us'])} | "
                           f"{f(o['rel_err'], '{:.1e}')} | |")
    return "\n".join(out)


def summary(rows):
    ours = [r for r in rows if r["impl"] == "rollbuf-triton"]
    pct = [float(r["pct_copy"]) for r in ours]
    mem = [(int(r["peak_extra_bytes"]), int(r["output_bytes"])) for r in ours if r.get("peak_extra_bytes")]
    over = [m for m in mem if m[0] > m[1]]
    errs = [float(r["rel_err"]) for r in ours if r["rel_err"] not in ("", "nan") and not math.isnan(float(r["rel_err"]))]
    return (f"{len(ours)} rollbuf cases; % of copy bandwidth: min {min(pct):.0f}, median "
            f"{sorted(pct)[len(pct) // 2]:.0f}, max {max(pct):.0f}; cases at ≥ 85%: "
            f"{sum(p >= 85 for p in pct)}; peak extra memory = outputs in {len(mem) - len(over)} of {len(mem)} "
            f"cases (the others: {', '.join(f'+{(a - b) / 2**20:.1f} MiB' for a, b in over)}); worst relative "
            f"error against float64 in fp32/bf16: {max(errs):.1e}")


if __name__ == "__main__":
    rows = load(sys.argv[1])
    print(summary(rows), "\n")
    print("### GAE, fp32, terminations + truncations\n")
    print(grid_table(rows), "\n")
    print("### GAE, bf16 inputs and outputs, terminations + truncations\n")
    print(grid_table(rows, dtype="bfloat16"), "\n")
    print("### Every estimator (fp32)\n")
    print(estimators_table(rows), "\n")
    print("### Against what users run today (GAE, fp32, terminations, bootstrapped window end)\n")
    print(baselines_table(rows))
