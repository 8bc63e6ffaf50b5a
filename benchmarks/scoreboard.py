"""``python -m benchmarks scoreboard``: check, time and score rollbuf against what users run today
and its peers, case by case.

    python -m benchmarks scoreboard --grid cpu-smoke --out bench-out      # any machine, seconds
    python -m benchmarks scoreboard --grid gpu --out $OUT                 # the GPU grid
    python -m benchmarks scoreboard --grid gpu --out $OUT --compare old.csv   # regression check
    python -m benchmarks scoreboard --grid gpu --part 0/2 --budget-s 500 --out $OUT  # half the grid
    python -m benchmarks scoreboard --grid gpu --redo a/results.csv --out $OUT  # the failed cases again
    python -m benchmarks scoreboard --from-csv a/results.csv b/results.csv --out DIR  # parts merged
    python -m benchmarks scoreboard --cases gae:4096x128:mask,vtrace:1x1048576 --out DIR  # chosen cases
    python -m benchmarks scoreboard --grid peers --out DIR                # against rl-triton, PufferLib (GPU)
    python -m benchmarks scoreboard --grid naive --out DIR                # against the naive kernel (GPU)

Every case is first checked against the float64 oracles of ``benchmarks.oracles`` on the same inputs;
a competitor that fails is reported ``wrong`` and not timed. Writes ``results.csv`` (one row per
case and competitor, with provenance), ``scoreboard.md`` and, when matplotlib is installed,
``speedup.png`` (and ``bandwidth.png`` on a GPU) under ``--out``. Every speedup divides one clock
by the same clock: device time (CUDA-graph replay) by device time, full call by full call.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys

import torch

from benchmarks.cases import GRID_COMPETITORS, GRIDS, MIXES, parse_cases, parse_shapes, part, row_key
from benchmarks.competitors import COMPETITORS, peers_dir
from benchmarks.suite import CLOCKS, COLUMNS, compare, copy_bandwidth, read_csv, run_cases, scoreboard, speedups

_CLOCK_NAME = {"device_us": "device time", "call_us": "full call"}


def _fmt(x, spec="{:.2f}"):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


_PROV_LABELS = (("device", "device {}"), ("torch", "torch {}"), ("triton", "Triton {}"), ("commit", "commit {}"),
                ("date", "{}"), ("copy_GBps", "copy {} GB/s"))


def _provenance_text(prov: dict) -> str:
    """``prov`` as one readable line: ``device x86_64, torch 2.13.0+cpu, Triton 3.6.0, commit ...``."""
    return ", ".join(label.format(prov[k]) for k, label in _PROV_LABELS if prov.get(k) not in (None, ""))


def board_table(board, ours) -> list[str]:
    """The scoreboard as markdown lines: per implementation, the pass rate and, per clock, the cases
    compared, the share where ``ours`` is faster and the geomean speedup of ``ours``."""
    lines = ["| implementation | cases | passed | pass rate | device ÷ device: cases, ours faster, geomean speedup "
             "| full call ÷ full call: cases, ours faster, geomean speedup | median % of copy |",
             "|---|---|---|---|---|---|---|"]
    for b in board:
        per = []
        for tag in ("device", "call"):
            n = b[f"{tag}_compared"]
            per.append("–" if not n else f"{n}, {_fmt(b[f'{tag}_ours_faster_share'], '{:.0%}')}, "
                       f"{_fmt(b[f'{tag}_geomean_speedup'], '{:.1f}×')}")
        passed = f"{b['passed']}" + (f" (+{b['unchecked']} timed, not gated)" if b.get("unchecked") else "")
        lines.append(f"| {b['impl']} | {b['cases']} | {passed} | {_fmt(b['pass_rate'], '{:.0%}')} | "
                     f"{per[0]} | {per[1]} | {_fmt(b['median_pct_copy'], '{:.0f}')} |")
    return lines


def _markdown(board, rows, ours, prov):
    lines = [f"Scoreboard ({_provenance_text(prov)}). Speedup = the competitor's time ÷ the time of `{ours}` "
             "on the cases both passed, on one clock: device time ÷ device time (CUDA-graph replay), "
             "full call ÷ full call.", ""]
    lines += board_table(board, ours)
    bad = [r for r in rows if r.get("status") in ("wrong", "error")]
    if bad:
        lines += ["", "Wrong or failing (not timed):", ""]
        lines += [f"* {r['impl']} on {r['estimator']} {r['n']}×{r['t']} {r['dtype']} {r['mix']} "
                  f"{r.get('layout') or 'env'}-major: {r.get('note')}"
                  for r in bad]
    peers = sorted({r["impl"] for r in rows if getattr(COMPETITORS.get(r["impl"]), "peer", None)})
    for impl in peers:
        lines += ["", _pairs_markdown(rows, ours, impl)]
    return "\n".join(lines) + "\n"


def _pairs_markdown(rows, ours, impl) -> str:
    """One line per case both ran: device time and full call of each side, and each ratio on its clock."""
    label = getattr(COMPETITORS.get(impl), "peer", impl)
    mine = {row_key(r): r for r in rows if r["impl"] == ours and r.get("status") == "ok"}
    theirs = [r for r in rows if r["impl"] == impl and r.get("status") in ("ok", "unchecked")]
    out = [f"### {ours} and {label} (`{impl}`), case by case", ""]
    if not theirs:
        reasons = sorted({str(r.get("note")) for r in rows if r["impl"] == impl})
        return "\n".join(out + [f"No case ran: {'; '.join(reasons) or 'no rows'}."])
    share = []
    for clock in CLOCKS:
        sp = speedups(rows, ours, impl, clock)
        if sp:
            share.append(f"{_CLOCK_NAME[clock]}: {ours} at or below {label} in {sum(s >= 1 for s in sp)} of "
                         f"{len(sp)} cases, geomean speedup {math.exp(sum(map(math.log, sp)) / len(sp)):.2f}×")
    if any(r.get("status") == "unchecked" for r in theirs):
        share.append(f"{label} is timed only (its own convention; not gated)")
    out += ["; ".join(share) + ".", "",
            f"| estimator | mix | N × T | {ours} device µs | {label} device µs | speedup (device ÷ device) "
            f"| {ours} full call µs | {label} full call µs | speedup (full call ÷ full call) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(theirs, key=lambda r: (r["estimator"], r["mix"], r["t"], r["n"])):
        m = mine.get(row_key(r))
        if m is None:
            continue
        cells = []
        for clock in CLOCKS:
            a, b = r.get(clock), m.get(clock)
            ok = a is not None and b is not None and a == a and b == b and b > 0
            cells.append((_fmt(b, "{:.1f}"), _fmt(a, "{:.1f}"), f"{a / b:.2f}×" if ok else "–"))
        out.append(f"| {r['estimator']} | {r['mix']} | {r['n']} × {r['t']} | {cells[0][0]} | {cells[0][1]} | "
                   f"{cells[0][2]} | {cells[1][0]} | {cells[1][1]} | {cells[1][2]} |")
    return "\n".join(out)


def _speedup_points(rows, ours, impl, clock):
    """(T, N, layout, speedup) of ``ours`` over ``impl`` on one clock, on the cases both passed."""
    mine = {row_key(r): r for r in rows if r["impl"] == ours and r.get("status") == "ok"}
    pts = []
    for r in rows:
        if r["impl"] != impl or r.get("status") not in ("ok", "unchecked") or (m := mine.get(row_key(r))) is None:
            continue
        a, b = r.get(clock), m.get(clock)
        if a is not None and b is not None and a == a and b == b and b > 0:
            pts.append((r["t"], r["n"], r.get("layout") or "env", a / b))
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
    panels = []  # one clock per panel: device time where the competitor has it, else the full call
    for impl in sorted({r["impl"] for r in rows} - {ours}):
        for clock in CLOCKS:
            pts = _speedup_points(rows, ours, impl, clock)
            if pts:
                panels.append((impl, pts, clock))
                break
    if panels:
        cols = min(2, len(panels))
        rows_ = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols + 1, 3.6 * rows_), squeeze=False,
                                 layout="constrained")
        ns = [p[1] for _, pts, _ in panels for p in pts]
        norm = LogNorm(vmin=min(ns), vmax=max(*ns, min(ns) + 1))
        sc = None
        for ax, (impl, pts, clock) in zip(axes.ravel(), panels):
            for layout, marker in (("env", "o"), ("time", "x")):
                sel = [p for p in pts if p[2] == layout]
                if sel:
                    sc = ax.scatter([p[0] for p in sel], [p[3] for p in sel], c=[p[1] for p in sel], norm=norm,
                                    cmap="viridis", marker=marker, s=16, label=f"{layout}-major")
            what = "device ÷ device" if clock == "device_us" else "full call ÷ full call"
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
            pts = [(k[1] * k[2], r["pct_copy"]) for k, r in mine.items()
                   if k[0] == est and r.get("pct_copy") is not None]
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


def _epilog() -> str:
    lines = ["grids: " + ", ".join(f"{g} ({len(c)} cases)" for g, c in GRIDS.items()),
             "mixes: " + ", ".join(MIXES) + " (term-only: no truncated tensor, [N] window-end bootstrap values)",
             "competitors: " + ", ".join(COMPETITORS), "",
             f"peers are imported from {peers_dir()} (git-ignored), filled by python -m benchmarks fetch-peers DIR"]
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help (none shown where there is none to show), and the
    description and epilog as written."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _preferred(gpu: bool) -> str:
    """The rollbuf backend a user's ``backend="auto"`` call runs on this machine's bench device."""
    from rollbuf import backends

    if gpu:
        return "rollbuf-triton"
    return "rollbuf-numba" if backends.numba_available() else "rollbuf-torch"


def _ours(names, gpu: bool) -> str:
    """The row the scoreboard divides by: what ``backend="auto"`` runs here when it is in ``names``,
    else the first rollbuf backend in ``names``."""
    preferred = _preferred(gpu)
    if preferred in names:
        return preferred
    return next((n for n in names if n.startswith("rollbuf-")), preferred)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks scoreboard", description=__doc__.splitlines()[0]
                                 .replace("``", "") + " " + __doc__.splitlines()[1], epilog=_epilog(),
                                 formatter_class=_HelpFormatter)
    ap.add_argument("--grid", default="cpu-smoke", choices=sorted(GRIDS),
                    help="the grid of cases to run (their counts are listed below)")
    ap.add_argument("--cases", default=None, help="instead of a grid: estimator:NxT[:mix[:dtype[:layout]]],...")
    ap.add_argument("--competitors", default=None,
                    help="comma-separated (default: the grid's own list, else all that apply on this machine; "
                         "the scoreboard divides by what backend='auto' runs here: rollbuf-triton on a GPU, "
                         "rollbuf-numba on a CPU)")
    ap.add_argument("--out", default="bench-out",
                    help="directory for results.csv, scoreboard.md and the plots (created if missing)")
    ap.add_argument("--compare", default=None, help="baseline results.csv from the same GPU")
    ap.add_argument("--estimators", default=None, help="comma-separated subset")
    ap.add_argument("--mixes", default=None, help="comma-separated subset of " + ",".join(MIXES))
    ap.add_argument("--layouts", default=None, help="comma-separated subset of env,time")
    ap.add_argument("--skip-shapes", default=None, metavar="NxT,...",
                    help="leave these shapes out of the grid (e.g. to run them in another call)")
    ap.add_argument("--only-shapes", default=None, metavar="NxT,...", help="run only these shapes of the grid")
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
        rows = read_csv(args.from_csv)
        gpu = any(r.get("device_us") is not None for r in rows)
        present = {r["impl"] for r in rows}
        ours = next((n for n in ("rollbuf-triton", "rollbuf-numba", "rollbuf-torch") if n in present), "rollbuf-torch")
        bw = None
    else:
        device = "cuda" if gpu else "cpu"

        def applies(n):  # on this machine's bench device
            c = COMPETITORS[n]
            return not getattr(c, "cuda_only", False) if not gpu else not getattr(c, "cpu_only", False)

        if args.competitors:
            names = args.competitors.split(",")
            unknown = [n for n in names if n not in COMPETITORS]
            if unknown:
                raise SystemExit(f"unknown competitor(s) {unknown}; known: {', '.join(COMPETITORS)}")
        elif args.cases is None and args.grid in GRID_COMPETITORS:
            names = [n for n in GRID_COMPETITORS[args.grid] if applies(n)]
            if _preferred(gpu) not in names:
                names.insert(0, _preferred(gpu))
        else:
            names = [n for n in COMPETITORS if applies(n)]
        ours = _ours(names, gpu)
        cases = parse_cases(args.cases) if args.cases else GRIDS[args.grid]
        if args.part:  # before every filter: a part run again with fewer cases stays within that part
            i, k = (int(x) for x in args.part.split("/"))
            cases = part(cases, i, k)
        if args.mixes:
            keep = set(args.mixes.split(","))
            cases = [c for c in cases if c.mix in keep]
        if args.layouts:
            keep = set(args.layouts.split(","))
            cases = [c for c in cases if c.layout in keep]
        if args.estimators:
            keep = set(args.estimators.split(","))
            cases = [c for c in cases if c.estimator in keep]
        for opt, keep in ((args.skip_shapes, False), (args.only_shapes, True)):
            if opt:
                shapes = set(parse_shapes(opt))
                cases = [c for c in cases if ((c.n, c.t) in shapes) == keep]
        if args.redo:
            again = {row_key(r) for r in read_csv(args.redo) if r.get("status") in ("wrong", "error")}
            cases = [c for c in cases if c.key in again]
        if args.skip_done:
            done = {row_key(r) for r in read_csv(args.skip_done)
                    if r["impl"] == ours and r.get("status") == "ok"}
            cases = [c for c in cases if c.key not in done]
        bw = copy_bandwidth() if gpu else None
        try:
            from tqdm import tqdm

            progress = tqdm(total=len(cases), desc=f"benchmarks {'cases' if args.cases else args.grid}",
                            file=sys.stderr, mininterval=5)
        except ImportError:
            progress = None
        with open(os.path.join(args.out, "results.csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()

            def on_row(row):  # written as it is finished: a run stopped early keeps what it measured
                w.writerow(dict(row, copy_GBps=round(bw / 1e9) if bw else ""))
                fh.flush()

            rows = run_cases(cases, names, device, copy_bw=bw, progress=progress, on_row=on_row,
                             budget_s=args.budget_s)
        if progress is not None:
            progress.close()
    board = scoreboard(rows, ours)
    # a scoreboard merged from several runs names every commit and date it holds
    prov = {k: ",".join(dict.fromkeys(str(r.get(k)) for r in rows))
            for k in ("device", "torch", "triton", "commit", "date")} if rows else {}
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
        slower = compare(rows, read_csv([args.compare]), ours)
        print(f"{len(slower)} case(s) of {ours} slower than {args.compare} beyond the measured spread")
        for s in slower:
            print(f"  {s['case']}: {s['old_us']:.1f} -> {s['new_us']:.1f} µs ({s['ratio']:.2f}x on the {s['clock']}, "
                  f"spread {s['spread']:.0%})")
    return 0
