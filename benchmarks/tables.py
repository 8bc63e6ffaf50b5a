"""``python -m benchmarks tables [--check]``: the docs' measured tables, from the committed results.

Each table is a function of result files under ``benchmarks/results/`` (:data:`SOURCES`), written
between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` in docs/benchmarks.md (or the page
:data:`PAGE` names), its first line
the provenance read from those files (device, versions, commit, date, the files). ``--check``
writes nothing and exits 1 if the page differs from what the results give (tests/test_docs.py runs
it). A new measurement replaces its files in :data:`SOURCES` and is committed with the page.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from pathlib import Path

from benchmarks.cases import LONG, PEER_SHAPES
from benchmarks.suite import read_csv, scoreboard, speedups

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
#: the page a table lives on, where it is not docs/benchmarks.md
PAGE = {"llm-groups": ROOT / "docs" / "llm.md"}


def _scoreboard_csvs():
    """The GPU grid's rows, in the order of the machine calls that wrote them (suffix _a … _l): a
    case measured again replaces its earlier rows."""
    return sorted(RESULTS.glob("bench_gpu_*.csv"), key=lambda p: p.stem.rsplit("_", 1)[-1])


#: table -> the result files it is made from (relative to benchmarks/results/)
SOURCES = {
    "peers": ["peers_p0_00a2400.csv", "peers_p1_00a2400.csv"],
    "beyond": ["peers_p0_00a2400.csv", "peers_p1_00a2400.csv"],
    "pufferlib": ["peers_p0_00a2400.csv", "peers_p1_00a2400.csv", "peers_puff16_4fa49f4.csv"],
    "naive": ["kernels_h200_7bce722.csv"],
    "host": ["host_path_gpu_591eca5.csv"],
    "wall": ["wall_gpu_c2bc1b5.csv"],
    "scoreboard": None,  # _scoreboard_csvs()
    "long": None,
    "llm": ["llm_gpu_1f929cf.csv"],
    "llm-groups": ["llm_groups_gpu_ee36fa8.csv"],
    "backward": ["backward_gpu_29d23ce.csv"],
    "memory": ["memory_c5d166c.csv"],
    "cpu": ["cpu_810f2c5.csv"],
    "first-call": ["cpu_810f2c5.csv"],
    "gpu-tests": ["gpu_tests_befa8b8.log", "gpu_tests_276840a.log"],
}


def sources(name) -> list[Path]:
    files = SOURCES[name]
    return _scoreboard_csvs() if files is None else [RESULTS / f for f in files]


def read_rows(paths) -> list[dict]:
    """Every row of the CSV files ``paths`` as read (strings)."""
    rows = []
    for p in paths:
        with open(p, newline="") as fh:
            rows += list(csv.DictReader(fh))
    return rows


# ------------------------------------------------------------------------------------- formatting


def _num(x, digits=3) -> str:
    """``x`` with ``digits`` significant figures, no exponent (µs and ms)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    x = float(x)
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def _ratio(x) -> str:
    if x is None or math.isnan(x):
        return "–"
    return f"{x:.2f}×" if x < 10 else f"{x:.0f}×"


def _span(xs, fmt=_num) -> str:
    """``a–b``, or ``a`` where the two are the same."""
    a, b = fmt(min(xs)), fmt(max(xs))
    return a if a == b else f"{a}–{b}"


def _geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def _files(paths) -> str:
    return ", ".join(f"`{Path(p).relative_to(RESULTS)}`" for p in paths)


def _joined(rows, key) -> str:
    return ", ".join(dict.fromkeys(str(r.get(key)) for r in rows if r.get(key) not in (None, "")))


def _gpu_provenance(rows, paths, device_key="device", copy_key=None) -> str:
    """``*NVIDIA H200, torch …, Triton …, commit …, date[, copy … GB/s]; files.*``"""
    parts = [_joined(rows, device_key), f"torch {_joined(rows, 'torch')}", f"Triton {_joined(rows, 'triton')}",
             f"commit {_joined(rows, 'commit')}", _joined(rows, "date")]
    copies = [float(r[copy_key]) for r in rows if copy_key and r.get(copy_key) not in (None, "")]
    if copies:
        parts.append(f"copy {_span(copies, lambda x: f'{x:.0f}')} GB/s")
    return f"*{', '.join(parts)}; {_files(paths)}.*"


def _table(header, rows) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(map(str, r)) + " |" for r in rows]


# ------------------------------------------------------------------------------- the peers' grid


def _pairs(rows, ours, impl, cases=None):
    """``{case: (our row, their row)}`` of the cases both passed (``ok``, or ``unchecked`` for a
    competitor timed only), optionally restricted to ``cases`` (row keys without the dtype/layout)."""
    mine = {_key(r): r for r in rows if r["impl"] == ours and r.get("status") == "ok"}
    out = {}
    for r in rows:
        k = _key(r)
        if r["impl"] == impl and r.get("status") in ("ok", "unchecked") and k in mine and (cases is None or cases(k)):
            out[k] = (mine[k], r)
    return out


def _key(r):
    return (r["estimator"], r["mix"], int(r["n"]), int(r["t"]))


def _ok(x):
    return x is not None and x == x and x > 0


RL_TRITON_GRID = set(PEER_SHAPES[:40])


def peers() -> str:
    paths = sources("peers")
    rows = read_csv(paths)
    pairs = _pairs(rows, "rollbuf-triton", "rl-triton", lambda k: (k[2], k[3]) in RL_TRITON_GRID)
    groups: dict = {}
    for k, (m, r) in pairs.items():
        groups.setdefault((k[0], k[1]), []).append((m, r))
    out, tot = [], {"cases": 0, "device_us": 0, "call_us": 0}
    for (est, mix), prs in sorted(groups.items()):
        cells = [est, mix, len(prs)]
        tot["cases"] += len(prs)
        for clock in ("device_us", "call_us"):
            sp = [r[clock] / m[clock] for m, r in prs if _ok(m[clock]) and _ok(r[clock])]
            won = sum(s >= 1 for s in sp)
            tot[clock] += won
            cells += [won, f"{_geomean(sp):.2f}× ({min(sp):.2f}×)" if sp else "–"]
        out.append(cells)
    n = tot["cases"]
    out.append(["**all**", "", f"**{n}**", f"**{tot['device_us']} ({tot['device_us'] / n:.1%})**", "",
                f"**{tot['call_us']} ({tot['call_us'] / n:.1%})**", ""])
    return "\n".join([_gpu_provenance(rows, paths, copy_key="copy_GBps"), ""] + _table(
        ["estimator", "mix", "cases", "device: rollbuf ≤ rl-triton", "device: geomean speedup (min)",
         "full call: rollbuf ≤ rl-triton", "full call: geomean speedup (min)"], out))


BEYOND_SHAPES = {(1, 1048576)}  # of the shapes the peers grid adds to rl-triton's, on the page


def beyond() -> str:
    paths = sources("beyond")
    rows = read_csv(paths)
    pairs = _pairs(rows, "rollbuf-triton", "rl-triton", lambda k: (k[2], k[3]) in BEYOND_SHAPES)
    out = []
    for k, (m, r) in sorted(pairs.items(), key=lambda kv: (kv[0][2] * kv[0][3], kv[0][2], kv[0][0], kv[0][1])):
        out.append([k[0], k[1], f"{k[2]} × {k[3]}", _num(m["device_us"]), _num(r["device_us"]),
                    _ratio(r["device_us"] / m["device_us"]), _num(m["call_us"]), _num(r["call_us"]),
                    _ratio(r["call_us"] / m["call_us"])])
    return "\n".join([_gpu_provenance(rows, paths, copy_key="copy_GBps"), ""] + _table(
        ["estimator", "mix", "N × T", "rollbuf device µs", "rl-triton device µs", "speedup (device)",
         "rollbuf full call µs", "rl-triton full call µs", "speedup (full call)"], out))


def pufferlib() -> str:
    """Full call only (PufferLib's op is not captured by a CUDA graph); per commit and row length."""
    paths = sources("pufferlib")
    every = [r for p in paths for r in read_csv([p])]  # each run on its own: a later one replaces nothing
    out = []
    for commit in dict.fromkeys(r["commit"] for r in every):
        rows = [r for r in every if r["commit"] == commit]
        pairs = _pairs(rows, "rollbuf-triton", "pufferlib")
        by_t: dict = {}
        for k, (m, r) in pairs.items():
            by_t.setdefault(k[3], []).append((k[2], m, r))
        for t, prs in sorted(by_t.items()):
            won = sum(r["call_us"] >= m["call_us"] for _, m, r in prs)
            rb = [m["call_us"] for _, m, _ in prs]
            pl = [r["call_us"] for _, _, r in prs]
            dev = [m["device_us"] for _, m, _ in prs if _ok(m["device_us"])]
            out.append([commit, t, ", ".join(str(n) for n, _, _ in sorted(prs, key=lambda x: x[0])),
                        f"{won} of {len(prs)}", _span(rb), _span(pl), _span(dev) if dev else "–"])
    rows = every
    return "\n".join([_gpu_provenance(rows, paths, copy_key="copy_GBps"), ""] + _table(
        ["commit", "T", "N", "rollbuf's full call ≤ PufferLib's", "rollbuf full call µs", "PufferLib full call µs",
         "rollbuf device µs"], out))


# ----------------------------------------------------------------------------- the naive kernel

#: the labels of the kernel script that preceded the ``naive`` grid (its CSVs ``kernels_h200_<commit>.csv``,
#: the naive table's source) -> (estimator, impl)
_KERNELS_LABELS = {"rollbuf plan (adv+ret)": ("gae", "rollbuf-triton"),
                   "rollbuf plan (adv)": ("advantages", "rollbuf-triton"),
                   "naive (adv+ret)": ("gae", "naive-triton"), "naive (adv)": ("advantages", "naive-triton"),
                   "rl-triton compute_gae (adv)": ("advantages", "rl-triton")}


def _device_rows(paths) -> list[dict]:
    """Device times as scoreboard rows (``estimator, n, t, impl, device_us, …``), from scoreboard
    CSVs or from the kernel script's CSVs (``part,competitor,clock,us``) that preceded the ``naive``
    grid."""
    out = []
    for r in read_rows(paths):
        if "part" not in r:
            if r.get("status") == "ok" and r.get("device_us"):
                out.append(dict(r, n=int(r["n"]), t=int(r["t"]), device_us=float(r["device_us"])))
        elif r.get("part") == "time" and r.get("clock") == "device" and r["competitor"] in _KERNELS_LABELS:
            est, impl = _KERNELS_LABELS[r["competitor"]]
            out.append(dict(r, estimator=est, impl=impl, n=int(r["n"]), t=int(r["t"]), device=r["gpu"],
                            device_us=float(r["us"])))
    return out


def naive() -> str:
    paths = sources("naive")
    rows = _device_rows(paths)
    dev = {(r["estimator"], r["impl"], r["n"], r["t"]): r["device_us"] for r in rows}
    shapes = list(dict.fromkeys((r["n"], r["t"]) for r in rows))
    out = []
    for n, t in shapes:
        cells = [f"{n} × {t}"]
        for est in ("gae", "advantages"):
            a, b = dev.get((est, "rollbuf-triton", n, t)), dev.get((est, "naive-triton", n, t))
            cells += [_num(a), _num(b), _ratio(a / b) if a and b else "–"]
        cells.append(_num(dev.get(("advantages", "rl-triton", n, t))))
        out.append(cells)
    return "\n".join([_gpu_provenance(rows, paths, copy_key="copy_gbs"), ""] + _table(
        ["N × T", "rollbuf `gae`", "naive, both outputs", "rollbuf ÷ naive", "rollbuf `advantages`",
         "naive, advantages", "rollbuf ÷ naive", "rl-triton `compute_gae` (advantages)"], out))


# ------------------------------------------------------------------------------------ host time

_HOST_NAMES = {"F.gae": "`rollbuf.functional.gae`", "F.advantages": "`rollbuf.functional.advantages`",
               "Rollout.gae (adv+ret)": "`Rollout.gae`", "Rollout.advantages (adv)": "`Rollout.advantages`",
               "rl-triton compute_gae (adv)": "rl-triton's `compute_gae` (advantages)",
               "naive kernel (adv), Triton's launcher": "the naive kernel through Triton's launcher (advantages)"}


def host() -> str:
    """``python -m benchmarks host-path``: the eager calls' wall time per call on rl-triton's grid
    (min–median–max over its shapes, and the shapes where the call is within 1.25× of rl-triton's),
    then the CUDA-graph rows."""
    paths = sources("host")
    rows = read_rows(paths)
    eager = [r for r in rows if r["part"] == "eager"]
    peer = {(r["n"], r["t"]): float(r["wall_us"]) for r in eager if r["call"] == "rl_triton.compute_gae"}
    out = []
    for call in dict.fromkeys(r["call"] for r in eager):
        mine = {(r["n"], r["t"]): float(r["wall_us"]) for r in eager if r["call"] == call}
        v = sorted(mine.values())
        ratio = [mine[k] / peer[k] for k in mine if k in peer]
        within = sum(x <= 1.25 for x in ratio)
        out.append([f"`{call}`", len(v), _num(v[0]), _num(statistics.median(v)), _num(v[-1]),
                    f"{min(ratio):.2f}–{max(ratio):.2f}× ({within} of {len(ratio)} ≤ 1.25×)"])
    graph, each = [], []  # the calls' own device times on one row, each as "name time"
    for r in rows:
        if r["part"] not in ("graph", "replay"):
            continue
        if r["call"].startswith("device time of "):
            each.append(f"{r['call'].removeprefix('device time of ')} {_num(float(r['wall_us']))}")
            if len(each) == 1:
                graph.append([f"device time of each call ({r['n']} × {r['t']})", None])
        else:
            graph.append([f"{r['call']} ({r['n']} × {r['t']})", _num(float(r["wall_us"]))])
    graph = [[c, ", ".join(each) if v is None else v] for c, v in graph]
    lines = [_gpu_provenance(rows, paths), ""] + _table(
        ["eager call (rl-triton's grid, fp32)", "shapes", "min µs", "median µs", "max µs",
         "÷ rl-triton's eager call"], out) + [""] + _table(["CUDA graph / replay", "µs per call"], graph)
    split = [r for r in rows if r["part"] == "split"]
    if split:  # where the eager call's host time goes (host_path.py's split part)
        loop = next((float(r["wall_us"]) for r in split if r["n"] == "0"), None)
        shapes = list(dict.fromkeys((r["n"], r["t"]) for r in split if r["n"] != "0"))
        calls = list(dict.fromkeys(r["call"].strip() for r in split if r["n"] != "0"))
        by = {(r["n"], r["t"], r["call"].strip()): _num(float(r["wall_us"])) for r in split}
        lines += ["", f"Where the host time goes (µs per call, back to back; this host runs a 1000-iteration "
                      f"Python loop in {_num(loop)} µs):", ""]
        lines += _table(["N × T", *calls], [[f"{n} × {t}", *(by.get((n, t, c), "–") for c in calls)]
                                            for n, t in shapes])
    return "\n".join(lines)


def wall() -> str:
    """``python -m benchmarks wall`` (``wall_gpu_*.csv``): each estimator's % of copy bandwidth in device
    time at 2^24 elements, every aspect ratio, the default strategy (rows without a forced choice)."""
    paths = sources("wall")
    rows = [r for r in read_rows(paths) if not r.get("force")]
    shapes = sorted(dict.fromkeys((int(r["n"]), int(r["t"])) for r in rows))
    cases = list(dict.fromkeys((r["estimator"], r["mix"], r["dtype"]) for r in rows))
    by = {(r["estimator"], r["mix"], r["dtype"], int(r["n"]), int(r["t"])): float(r["pct_copy"]) for r in rows}
    out = []
    for e, m, d in cases:
        cells = [by.get((e, m, d, n, t)) for n, t in shapes]
        got = [c for c in cells if c is not None]
        name = f"`{e}` {m}{'' if d == 'float32' else ', ' + d}"
        met = f"{sum(c >= 85 for c in got)} of {len(got)}"
        out.append([name, *("–" if c is None else f"{c:.0f}" for c in cells), met])
    return "\n".join([_gpu_provenance(rows, paths, copy_key="copy_GBps"), ""] + _table(
        ["% of copy (device time)", *(f"{n}×{t}" for n, t in shapes), "≥ 85%"], out))


# ------------------------------------------------------------------------------ the GPU scoreboard


def _merged_scoreboard():
    paths = sources("scoreboard")
    return read_csv(paths), paths


def scoreboard_table() -> str:
    from benchmarks.scoreboard import board_table

    rows, paths = _merged_scoreboard()
    board = scoreboard(rows, "rollbuf-triton")
    loop = speedups(rows, "rollbuf-triton", "loop", "call_us")
    comp = speedups(rows, "rollbuf-triton", "doubling-compiled", "device_us")
    lines = [_gpu_provenance(rows, [Path(p) for p in paths], copy_key="copy_GBps"), ""] + board_table(
        board, "rollbuf-triton")
    lines += ["", f"Against the eager loop (full call ÷ full call, {len(loop)} cases): "
                  f"{min(loop):.1f}–{max(loop):.0f}×, geomean {_geomean(loop):.1f}×. "
                  "Against the `torch.compile`d doubling scan (device ÷ device, "
                  f"{len(comp)} cases): {min(comp):.1f}–{max(comp):.1f}×, geomean {_geomean(comp):.1f}×."]
    return "\n".join(lines)


def _pct(rows, sel):
    v = [r["pct_copy"] for r in rows if sel(r) and r.get("pct_copy") is not None]
    return [len(v), f"{min(v):.0f}", f"{statistics.median(v):.0f}", f"{max(v):.0f}"] if v else [0, "–", "–", "–"]


def long_rows() -> str:
    rows, paths = _merged_scoreboard()
    ours = {(r["estimator"], r["n"], r["t"], r["dtype"], r["mix"], r.get("layout") or "env"): r for r in rows
            if r["impl"] == "rollbuf-triton" and r.get("status") == "ok"}
    out = []
    for n, t in sorted(LONG, key=lambda s: (s[1], s[0])):
        cells = [f"{n} × {t}"]
        for est, mix in (("gae", "term+trunc"), ("gae", "mask"), ("vtrace", "term+trunc")):
            r = ours.get((est, n, t, "float32", mix, "env"))
            cells += [f"{_num(r['device_us'])} ({r['pct_copy']:.0f}%)" if r else "–"]
        cells.append(", ".join(dict.fromkeys(ours[k]["commit"] for k in ours if k[1:3] == (n, t) and k[3] == "float32"
                                             and k[0] in ("gae", "vtrace"))))
        out.append(cells)
    return "\n".join([_gpu_provenance(rows, [Path(p) for p in paths], copy_key="copy_GBps"), ""] + _table(
        ["N × T", "GAE µs (% of copy)", "GAE, masked spans, µs (% of copy)", "V-trace µs (% of copy)", "commit"], out))


def llm() -> str:
    paths = sources("llm")
    rows = read_rows(paths)
    out = []
    for r in rows:
        f = {k: float(v) for k, v in r.items() if k not in ("gpu", "torch", "triton", "commit", "date") and v}
        out.append([f"{r['B']} × {r['T']}", f"{f['loop_gpu_s']:.2f} s", f"{f['loop_cpu_s']:.2f} s",
                    _num(f["call_us"]), _num(f["device_us"]), f"{f['speedup_vs_gpu_loop']:.0f}×",
                    _num(f["bf16_device_us"]), _num(f["whiten_call_us"]), _num(f["packed_call_us"]),
                    f"{f['max_abs_err']:.1e}"])
    return "\n".join([_gpu_provenance(rows, paths, device_key="gpu"), ""] + _table(
        ["B × T", "verl loop, GPU", "verl loop, host CPU", "rollbuf full call µs", "device µs",
         "GPU loop ÷ rollbuf (full call)", "bf16 device µs", "+ whiten µs", "packed in 1 row µs", "max abs err"], out))


def llm_groups() -> str:
    """verl's vectorised GRPO/RLOO against rollbuf.integrations.verl's (``python -m benchmarks llm-groups``)."""
    paths = sources("llm-groups")
    rows = read_rows(paths)
    out = []
    for r in rows:
        f = {k: float(r[k]) for k in r if k.endswith("_us") or k == "max_abs_err"}
        out.append([r["estimator"].upper(), f"{r['B']} × {r['L']}", _num(f["verl_call_us"]),
                    f"{_num(f['rollbuf_call_us'])} ({f['verl_call_us'] / f['rollbuf_call_us']:.2f}×)",
                    f"{_num(f['rollbuf_tensor_call_us'])} ({f['verl_call_us'] / f['rollbuf_tensor_call_us']:.2f}×)",
                    _num(f["verl_device_us"]),
                    f"{_num(f['rollbuf_device_us'])} ({f['verl_device_us'] / f['rollbuf_device_us']:.2f}×)",
                    f"{_num(f['rollbuf_tensor_device_us'])} "
                    f"({f['verl_device_us'] / f['rollbuf_tensor_device_us']:.2f}×)",
                    _num(f["rollbuf_graph_us"]), f"{f['max_abs_err']:.1e}"])
    return "\n".join([_gpu_provenance(rows, paths), ""] + _table(
        ["", "B × L", "verl full call µs", "rollbuf full call µs, uid array (verl ÷ rollbuf)",
         "rollbuf full call µs, tensor index (verl ÷ rollbuf)", "verl device µs",
         "rollbuf device µs, uid array (verl ÷ rollbuf)", "rollbuf device µs, tensor index (verl ÷ rollbuf)",
         "rollbuf graph replay µs, tensor index", "max abs diff"], out))


BACKWARD_TABLE_SHAPES = ("4096 × 128", "16384 × 4096", "1 × 1048576")  # of the run's five


def backward() -> str:
    paths = sources("backward")
    rows = [r for r in read_rows(paths) if f"{r['N']} × {r['T']}" in BACKWARD_TABLE_SHAPES]
    out = []
    for r in rows:
        if r["status"] != "ok":
            out.append([r["estimator"], f"{r['N']} × {r['T']}", "wrong", "", "", "", "", r["grad_rel_err"]])
            continue
        out.append([r["estimator"], f"{r['N']} × {r['T']}", _num(r["forward_us"]), _num(r["fwd_bwd_us"]),
                    _num(r["backward_us"]), f"{float(r['backward_pct_copy']):.0f}", _num(r["torch_fwd_bwd_us"]),
                    f"{float(r['grad_rel_err']):.1e}"])
    return "\n".join([_gpu_provenance(rows, paths, device_key="gpu"), ""] + _table(
        ["estimator", "N × T", "forward µs", "fwd+bwd µs", "backward µs", "backward % of copy",
         "torch backend fwd+bwd µs", "gradient rel. error"], out))


def memory() -> str:
    paths = sources("memory")
    rows = read_rows(paths)
    mib = 2**20
    out = [[r["estimator"], f"{r['n']} × {r['t']}", r["mix"], r["layout"], f"{int(r['output_bytes']) / mib:.2f}",
            f"{int(r['extra_call1']) / mib:.2f}", f"{int(r['extra_call2']) / mib:.2f}",
            "yes" if r["met"] == "True" else "no"] for r in rows]
    return "\n".join([_gpu_provenance(rows, paths), ""] + _table(
        ["estimator", "N × T", "mix", "layout", "outputs MiB", "extra, 1st call MiB", "extra, 2nd call MiB",
         "2nd call = outputs"], out))


# ------------------------------------------------------------------------------------------ CPU

_CPU_COLUMNS = ("rollbuf-numba", "rollbuf-numba-tm", "rollbuf-torch", "plain-numba", "sb3", "cleanrl", "torchrl-vec")
_TRAINERS = ("sb3", "cleanrl", "torchrl-vec")


def _cpu_provenance(rows, paths) -> str:
    p = rows[0]
    loads = [float(r["load_1min"]) for r in rows if r.get("load_1min")]
    load = f", 1-minute load {_span(loads, lambda x: f'{x:.1f}')}" if loads else ""
    files = f"; {_files(paths)}" if paths else ""
    return (f"*{p['cpu']}, {p['cores']} cores, {p['threads']} torch threads{load}; Python {p['python']}, torch "
            f"{p['torch']}, numba {p['numba']}, numpy {p['numpy']}, stable-baselines3 {p['sb3'] or '–'}, torchrl "
            f"{p['torchrl'] or '–'}; commit {_joined(rows, 'commit')}, {_joined(rows, 'date')}{files}.*")


CPU_TABLE_T = (8, 128, 2048, 32768)  # of the grid's row lengths, on the page


#: the layout each trainer's buffer has, and so the rollbuf column that runs on it: SB3's and CleanRL's
#: ``[T, N]`` buffers (their drop-ins hand rollbuf ``[N, T]`` views of them), TorchRL's ``[N, T]``
_LAYOUT = {"sb3": "rollbuf-numba-tm", "cleanrl": "rollbuf-numba-tm", "torchrl-vec": "rollbuf-numba"}


def cpu_grid(rows=None, paths=None, shapes=None) -> str:
    """Median ms of one full call per implementation and shape (``shapes``: all of them), and
    rollbuf's ratios: against the fastest trainer with rollbuf env-major, against each trainer with
    rollbuf in that trainer's layout, and against a plain numba loop."""
    if rows is None:
        paths = sources("cpu")
        rows = read_rows(paths)
        shapes = {(int(r["n"]), int(r["t"])) for r in rows if int(r["t"]) in CPU_TABLE_T}
    steady = [r for r in rows if r["kind"] == "steady"]
    by = {(int(r["n"]), int(r["t"]), r["impl"]): float(r["call_us"]) for r in steady if r["status"] == "ok"}
    impls = [i for i in _CPU_COLUMNS if any(r["impl"] == i for r in steady)]

    def matched(s):  # each trainer's time over rollbuf's in that trainer's layout
        return [by[s + (i,)] / by[s + (ours,)] for i, ours in _LAYOUT.items() if s + (i,) in by and s + (ours,) in by]

    out = []
    for n, t in sorted({(int(r["n"]), int(r["t"])) for r in steady}):
        if shapes is not None and (n, t) not in shapes:
            continue
        cells = [f"{n} × {t}"] + [_num(by[(n, t, i)] / 1e3) if (n, t, i) in by else "–" for i in impls]
        ours = by.get((n, t, "rollbuf-numba"))
        trainers = [by[(n, t, i)] for i in _TRAINERS if (n, t, i) in by]
        plain = by.get((n, t, "plain-numba"))
        m = matched((n, t))
        cells += [_ratio(min(trainers) / ours) if ours and trainers else "–", _ratio(min(m)) if m else "–",
                  _ratio(ours / plain) if ours and plain else "–"]
        out.append(cells)
    every = sorted({(int(r["n"]), int(r["t"])) for r in steady})
    faster = [s for s in every if (s + ("rollbuf-numba",)) in by and all(
        by[s + ("rollbuf-numba",)] < by[s + (i,)] for i in _TRAINERS if s + (i,) in by)]
    in_layout = [s for s in every if matched(s) and min(matched(s)) > 1]
    shown = "" if shapes is None else f" (this table shows {len(out)} of them; the CSV has the others)"
    lines = [_cpu_provenance(steady, paths), ""] + _table(
        ["N × T"] + impls + ["fastest of SB3, CleanRL, TorchRL ÷ rollbuf-numba",
                             "each ÷ rollbuf in its layout (slowest ratio)", "rollbuf-numba ÷ plain numba"], out)
    lines += ["", f"rollbuf-numba is faster than each of SB3, CleanRL and TorchRL that ran at {len(faster)} of the "
                  f"run's {len(every)} shapes{shown}; in each one's own layout (SB3 and CleanRL against "
                  f"rollbuf-numba-tm, TorchRL against rollbuf-numba) at {len(in_layout)} of {len(every)}."]
    return "\n".join(lines)


def first_call(rows=None, paths=None) -> str:
    if rows is None:
        paths = sources("first-call")
        rows = read_rows(paths)
    first = [r for r in rows if r["kind"].startswith("first_call")]
    names = list(dict.fromkeys(r["estimator"] for r in first))
    out = []
    for label, what in (("cold", "empty numba cache (compiles)"), ("cached", "the cache of the run before")):
        sel = {r["estimator"]: float(r["call_us"]) / 1e6 for r in first if r["kind"] == f"first_call_{label}"}
        out.append([what] + [f"{sel[n]:.3f}" if n in sel else "–" for n in names])
    return "\n".join([_cpu_provenance(first, paths), ""] + _table(["fresh process, seconds"] + names, out))


# ------------------------------------------------------------------------------------ GPU tests


def gpu_tests() -> str:
    """The test runs on the GPU: pytest's summary line and the test files of each log."""
    paths = sources("gpu-tests")
    out, platform_ = [], []
    for p in paths:
        text = p.read_text(encoding="utf-8", errors="replace")
        files = sorted(set(re.findall(r"tests/(test_\w+\.py)", text)))
        summary = (re.findall(r"^=+ (.*? in [\d.]+s.*?) =+$", text, flags=re.M)
                   or re.findall(r"^(\d+ (?:passed|failed).*? in [\d.]+s.*)$", text, flags=re.M))  # -q
        platform_ += [" ".join(m) for m in re.findall(r"^platform \S+ -- (Python [\d.]+), (pytest-[\d.]+)", text,
                                                          flags=re.M)]
        commit = p.stem.split("_")[2]
        out.append([f"`{p.name}`", commit, summary[-1] if summary else "(no summary: cut)",
                    ", ".join(f.removeprefix("test_").removesuffix(".py") for f in files)])
    return "\n".join([f"*{', '.join(dict.fromkeys(platform_))}; {_files(paths)}.*", ""] + _table(
        ["log", "commit", "pytest's summary", "test files (tests/test_*.py)"], out))


# ------------------------------------------------------------------------------------ the page

TABLES = {"peers": peers, "beyond": beyond, "pufferlib": pufferlib, "naive": naive, "host": host,
          "scoreboard": scoreboard_table, "long": long_rows, "llm": llm, "llm-groups": llm_groups,
          "backward": backward, "memory": memory, "cpu": cpu_grid, "first-call": first_call, "wall": wall,
          "gpu-tests": gpu_tests}


def render(text: str) -> str:
    """``text`` with every ``<!-- table:NAME -->`` … ``<!-- /table:NAME -->`` block regenerated."""
    def fill(m):
        name = m.group(1)
        if name not in TABLES:
            raise SystemExit(f"a page names an unknown table {name!r}; known: {', '.join(TABLES)}")
        return f"<!-- table:{name} -->\n{TABLES[name]()}\n<!-- /table:{name} -->"

    return re.sub(r"<!-- table:([\w-]+) -->\n.*?<!-- /table:\1 -->", fill, text, flags=re.S)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks tables", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    ap.add_argument("--doc", action="append", help="the page to fill (default: docs/benchmarks.md and the "
                    "pages of PAGE); a page's tables are those PAGE puts on a page of its file name")
    args = ap.parse_args(argv)
    stale = 0
    for doc in map(Path, args.doc or [DOC, *dict.fromkeys(PAGE.values())]):
        text = doc.read_text(encoding="utf-8")
        own = [n for n in TABLES if PAGE.get(n, DOC).name == doc.name]
        missing = [n for n in own if f"<!-- table:{n} -->" not in text]
        new = render(text)
        if args.check:
            if new != text or missing:
                print(f"{doc} is out of date with benchmarks/results/ (missing tables: {missing or 'none'}): "
                      "python -m benchmarks tables", file=sys.stderr)
                stale = 1
            continue
        doc.write_text(new, encoding="utf-8")
        print(f"wrote {len(own) - len(missing)} tables into {doc}"
              + (f"; not on the page: {missing}" if missing else ""))
    return stale
