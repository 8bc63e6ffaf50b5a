"""``python -m rollbuf.bench``: check, time and score rollbuf against what users run today.

    python -m rollbuf.bench --grid cpu-smoke --out bench-out          # any machine, seconds
    python -m rollbuf.bench --grid gpu --out $OUT                      # the H200 scoreboard
    python -m rollbuf.bench --grid gpu --out $OUT --compare old.csv   # regression check
    python -m rollbuf.bench --grid gpu --part 0/2 --budget-s 500 --out $OUT  # half the grid
    python -m rollbuf.bench --grid gpu --redo a/results.csv --out $OUT # the cases that failed there, again
    python -m rollbuf.bench --from-csv a/results.csv b/results.csv --out DIR  # scoreboard of parts

Writes ``results.csv`` (one row per case and competitor, with provenance), ``scoreboard.md`` and,
when matplotlib is installed, ``speedup.png`` (and ``bandwidth.png`` on a GPU) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys

import torch

from rollbuf.bench.competitors import COMPETITORS
from rollbuf.bench.suite import GRIDS, compare, part, row_key, run_cases, scoreboard

_COLUMNS = ["estimator", "n", "t", "dtype", "mix", "layout", "impl", "status", "rel_err", "call_us", "device_us", "spread",
            "bytes", "pct_copy", "first_call_s", "note", "device", "torch", "triton", "commit", "date", "threads"]


def _copy_bandwidth():
    from triton.testing import do_bench

    a = torch.empty(2**28, device="cuda").uniform_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def _fmt(x, spec="{:.2f}"):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def _markdown(board, rows, ours, prov):
    lines = [f"Scoreboard ({prov}); speedups are of `{ours}` over each competitor on the cases both passed.", "",
             "| implementation | cases | passed | pass rate | ours faster | geomean speedup of ours | median % of copy |",
             "|---|---|---|---|---|---|---|"]
    for b in board:
        lines.append(f"| {b['impl']} | {b['cases']} | {b['passed']} | {_fmt(b['pass_rate'], '{:.0%}')} | "
                     f"{_fmt(b['ours_faster_share'], '{:.0%}')} | {_fmt(b['geomean_speedup'], '{:.1f}×')} | "
                     f"{_fmt(b['median_pct_copy'], '{:.0f}')} |")
    bad = [r for r in rows if r.get("status") in ("wrong", "error")]
    if bad:
        lines += ["", "Wrong or failing (not timed):", ""]
        lines += [f"* {r['impl']} on {r['estimator']} {r['n']}×{r['t']} {r['dtype']} {r['mix']} "
                  f"{r.get('layout') or 'env'}-major: {r.get('note')}"
                  for r in bad]
    return "\n".join(lines) + "\n"


def _speedup_points(rows, mine, impl):
    """(T, N, layout, speedup, measure) of ``ours`` over ``impl``: device time where both have one
    (the CUDA-graph replay), else full call (launch-bound competitors such as the eager loop)."""
    pts = []
    for r in rows:
        if r["impl"] != impl or r.get("status") != "ok" or (m := mine.get(row_key(r))) is None:
            continue
        for key in ("device_us", "call_us"):
            a, b = r.get(key), m.get(key)
            if a is not None and b is not None and a == a and b == b and b > 0:
                pts.append((r["t"], r["n"], r.get("layout") or "env", a / b, key))
                break
    return pts


def _plots(rows, ours, out, gpu):
    """``speedup.png``: one panel per competitor, speedup of ``ours`` against T, coloured by N,
    env-major dots and time-major crosses; ``bandwidth.png`` (GPU): % of copy bandwidth per case
    against N·T, one colour per estimator."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
    except ImportError:
        return []
    files = []
    mine = {row_key(r): r for r in rows if r["impl"] == ours and r.get("status") == "ok"}
    panels = [(impl, pts) for impl in sorted({r["impl"] for r in rows} - {ours})
              if (pts := _speedup_points(rows, mine, impl))]
    if panels:
        cols = min(2, len(panels))
        rows_ = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols + 1, 3.6 * rows_), squeeze=False,
                                 layout="constrained")
        ns = [p[1] for _, pts in panels for p in pts]
        norm = LogNorm(vmin=min(ns), vmax=max(max(ns), min(ns) + 1))
        sc = None
        for ax, (impl, pts) in zip(axes.ravel(), panels):
            for layout, marker in (("env", "o"), ("time", "x")):
                sel = [p for p in pts if p[2] == layout]
                if sel:
                    sc = ax.scatter([p[0] for p in sel], [p[3] for p in sel], c=[p[1] for p in sel], norm=norm,
                                    cmap="viridis", marker=marker, s=16, label=f"{layout}-major")
            what = "device time" if all(p[4] == "device_us" for p in pts) else "full call"
            ax.set_title(f"vs {impl} ({what}, {len(pts)} cases)", fontsize=9)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xlabel("T (steps per row)")
            ax.set_ylabel(f"speedup of {ours}")
            leg = ax.legend(fontsize=7)
            for h in leg.legend_handles:  # the markers, not one case's colour
                h.set_facecolor("grey")
                h.set_edgecolor("grey")
        for ax in axes.ravel()[len(panels):]:
            ax.set_visible(False)
        fig.colorbar(sc, ax=axes.ravel().tolist(), label="N (rows)")
        files.append(os.path.join(out, "speedup.png"))
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    if gpu:
        fig, ax = plt.subplots(figsize=(7, 4))
        for est in sorted({k[0] for k in mine}):
            pts = [(k[1] * k[2], r["pct_copy"]) for k, r in mine.items() if k[0] == est and r.get("pct_copy") is not None]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, label=est)
        ax.axhline(85, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements (N·T)")
        ax.set_ylabel("% of copy bandwidth")
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        files.append(os.path.join(out, "bandwidth.png"))
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    return files


def _read_csv(paths):
    """The rows of ``paths``, one per (case, implementation): a row of a later file replaces one of an
    earlier file (a case run again), except that a ``skipped`` row (budget) never replaces a result."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as fh:
            for r in csv.DictReader(fh):
                for k in ("n", "t"):
                    r[k] = int(r[k])
                for k in ("rel_err", "call_us", "device_us", "spread", "pct_copy", "bytes", "first_call_s"):
                    r[k] = float(r[k]) if r.get(k) not in (None, "") else None
                key = row_key(r) + (r["impl"],)
                if r.get("status") == "skipped" and key in rows:
                    continue
                rows[key] = r
    return list(rows.values())


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="cpu-smoke", choices=sorted(GRIDS))
    ap.add_argument("--competitors", default=None, help="comma-separated (default: all that apply here)")
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--compare", default=None, help="baseline results.csv from the same GPU")
    ap.add_argument("--estimators", default=None, help="comma-separated subset")
    ap.add_argument("--mixes", default=None, help="comma-separated subset of none,term,term+trunc,mask")
    ap.add_argument("--layouts", default=None, help="comma-separated subset of env,time")
    ap.add_argument("--part", default=None, help="i/k: run the i-th (0-based) of k parts of the grid")
    ap.add_argument("--budget-s", type=float, default=None, help="start no case after this many seconds")
    ap.add_argument("--skip-done", nargs="+", default=None,
                    help="results.csv files: cases our implementation already passed there are not run again")
    ap.add_argument("--redo", nargs="+", default=None,
                    help="results.csv files: run only the cases where some implementation was wrong or failed there")
    ap.add_argument("--from-csv", nargs="+", default=None,
                    help="no run: scoreboard and plots from results.csv files (e.g. the parts of one run)")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    os.makedirs(args.out, exist_ok=True)
    if args.from_csv:
        rows = _read_csv(args.from_csv)
        gpu = any(r.get("device_us") is not None for r in rows)
        ours = "rollbuf-triton" if any(r["impl"] == "rollbuf-triton" for r in rows) else "rollbuf-torch"
        bw = None
    else:
        device = "cuda" if gpu else "cpu"
        ours = "rollbuf-triton" if gpu else "rollbuf-torch"
        names = args.competitors.split(",") if args.competitors else [
            n for n in COMPETITORS if gpu or n != "rollbuf-triton"]
        cases = GRIDS[args.grid]
        if args.mixes:
            keep = set(args.mixes.split(","))
            cases = [c for c in cases if c.mix in keep]
        if args.layouts:
            keep = set(args.layouts.split(","))
            cases = [c for c in cases if c.layout in keep]
        if args.estimators:
            keep = set(args.estimators.split(","))
            cases = [c for c in cases if c.estimator in keep]
        if args.part:
            i, k = (int(x) for x in args.part.split("/"))
            cases = part(cases, i, k)
        if args.redo:
            again = {row_key(r) for r in _read_csv(args.redo) if r.get("status") in ("wrong", "error")}
            cases = [c for c in cases if c.key in again]
        if args.skip_done:
            done = {row_key(r) for r in _read_csv(args.skip_done)
                    if r["impl"] == ours and r.get("status") == "ok"}
            cases = [c for c in cases if c.key not in done]
        bw = _copy_bandwidth() if gpu else None
        try:
            from tqdm import tqdm

            progress = tqdm(total=len(cases), desc=f"rollbuf.bench {args.grid}", file=sys.stderr, mininterval=5)
        except ImportError:
            progress = None
        fh = open(os.path.join(args.out, "results.csv"), "w", newline="")
        w = csv.DictWriter(fh, fieldnames=_COLUMNS + ["copy_GBps"], extrasaction="ignore")
        w.writeheader()

        def on_row(row):  # written as it is finished: a run stopped early keeps what it measured
            w.writerow(dict(row, copy_GBps=round(bw / 1e9) if bw else ""))
            fh.flush()

        rows = run_cases(cases, names, device, copy_bw=bw, progress=progress, on_row=on_row,
                         budget_s=args.budget_s)
        fh.close()
        if progress is not None:
            progress.close()
    board = scoreboard(rows, ours)
    # a scoreboard merged from several runs names every commit and date it holds
    prov = {k: ",".join(dict.fromkeys(str(r.get(k)) for r in rows)) for k in ("device", "torch", "triton", "commit", "date")} \
        if rows else {}
    if bw:
        prov["copy_GBps"] = round(bw / 1e9)
    elif rows and rows[0].get("copy_GBps"):
        prov["copy_GBps"] = rows[0]["copy_GBps"]
    md = _markdown(board, rows, ours, prov)
    with open(os.path.join(args.out, "scoreboard.md"), "w") as fh:
        fh.write(md)
    print(md)
    for f in _plots(rows, ours, args.out, gpu):
        print("wrote", f)
    if args.compare:
        slower = compare(rows, _read_csv([args.compare]), ours)
        print(f"{len(slower)} case(s) of {ours} slower than {args.compare} beyond the measured spread")
        for s in slower:
            print(f"  {s['case']}: {s['old_us']:.1f} -> {s['new_us']:.1f} µs ({s['ratio']:.2f}x, spread {s['spread']:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
