"""A/B of kernel variants on chosen benchmark cases, on a CUDA GPU.

    python -m rollbuf.bench --experiment ab --out DIR \\
        --variants "new=,old=ROLLBUF_LIVE_LOADS=1" --cases gae:4096x128:mask,gae:256x1048576:mask

Each variant is a set of environment variables (``NAME=VALUE`` joined by ``+``; empty = the
defaults), so every variant runs in its own process: variables read by the kernels at import, and
``ROLLBUF_K_<CHOICE>=<literal>``, which forces the kernels' choice ``<choice>`` for the whole run
(``rollbuf.kernels.forced``, e.g. ``ROLLBUF_K_SPLIT=True``, ``ROLLBUF_K_BLOCK_T=64``). Each case goes
through the benchmark suite exactly as in the scoreboard (``rollbuf.bench``: float64 gate first,
then full-call time and CUDA-graph device time over input sets rotated past the L2, % of the
measured copy bandwidth). Rows go to ``DIR/ab.csv`` (with a ``variant`` column); the table printed
last has one line per case, device time per variant and the ratio to the first variant.

``--device cpu`` gates every case on tiny shapes under the interpreter (a dry run of the logic).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys


def parse_cases(spec: str):
    from rollbuf.bench.suite import parse_cases as parse

    return parse(spec)


def parse_variants(spec: str):
    out = []
    for item in spec.split(","):
        name, _, env = item.partition("=")
        pairs = [kv.split("=", 1) for kv in env.split("+") if kv]
        out.append((name, dict(pairs)))
    return out


def child(args):
    """Run the cases in this process (the variant's environment is already set)."""
    import ast

    import rollbuf.kernels as K

    choices = {key[len("ROLLBUF_K_"):].lower(): ast.literal_eval(val) for key, val in os.environ.items()
               if key.startswith("ROLLBUF_K_")}  # ROLLBUF_K_SPLIT=True → kernels.forced(split=True)
    force = K.forced(**choices)  # held for the whole run: one left unreferenced is closed at once, its choices reset
    try:
        force.__enter__()
    except TypeError as e:
        raise SystemExit(str(e))
    try:
        rows = _run(args)
    finally:
        force.__exit__(None, None, None)
    from rollbuf.kernels import host

    for line in launched(host.LAUNCHES) + compiled_kernels(host.LAUNCHES):  # what ran (registers: GPU only)
        print(line, file=sys.stderr)
    print(json.dumps(rows))


def _run(args):
    from rollbuf.bench.suite import run_cases

    cases = parse_cases(args.cases)
    if args.device == "cpu":  # tiny, interpreted: the gate only
        from rollbuf.bench.suite import Case

        cases = [Case(c.estimator, 3, 37, dtype=c.dtype, mix=c.mix, layout=c.layout) for c in cases]
    copy_bw = None
    if args.device == "cuda":
        from rollbuf.bench.experiments._common import copy_bandwidth

        copy_bw = copy_bandwidth()
    return run_cases(cases, ["rollbuf-triton"], args.device, copy_bw=copy_bw)


def launched(cache: dict) -> list[str]:
    """One line per cached launch: family, rows x steps and the strategy it ran with (the check
    that a variant's forced choices reached the kernels)."""
    return sorted({f"launch {launch.family} {launch.R}x{launch.T} {launch.strategy}" for launch in cache.values()
                   if getattr(launch, "strategy", None) is not None})


def compiled_kernels(cache: dict) -> list[str]:
    """One line per compiled kernel of the cached launches: family, strategy, pass, its registers and
    spills per thread (kernels launched on a GPU only)."""
    out = []
    for launch in cache.values():
        st = getattr(launch, "strategy", None)
        for i, k in enumerate(getattr(launch, "passes", ())):
            compiled = k.binary  # what Triton's launch of this pass returned (None: not launched on a GPU)
            if compiled is None:
                continue
            what = (f"{launch.family} BLOCK_N={st.block_n} BLOCK_T={st.block_t} SPLIT={st.split} "
                    f"PRESOLVE={st.presolve} SHIFT_LOAD={st.shift_load} FLIP={st.flip} pass={i}")
            out.append(f"kernel {what} warps={k.warps}: {compiled.n_regs} registers, {compiled.n_spills} spills")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment ab", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, help="estimator:NxT[:mix[:dtype[:layout]]],...")
    ap.add_argument("--variants", default="default=", help="name=ENV=VAL+ENV=VAL,...")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    rows = []
    os.makedirs(args.out, exist_ok=True)
    for name, env in parse_variants(args.variants):
        cmd = [sys.executable, "-m", "rollbuf.bench.experiments.ab", "--child", "--cases", args.cases,
               "--device", args.device]
        if args.device == "cpu":  # CPU tensors through backend="triton": the interpreter, set before import
            env = dict(env, TRITON_INTERPRET="1")
        res = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-3000:])
            raise SystemExit(f"variant {name} failed")
        for r in json.loads(res.stdout.strip().splitlines()[-1]):
            rows.append(dict(variant=name, **r))
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with open(os.path.join(args.out, "ab.csv"), "w", newline="") as fh:  # after every variant
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        print(f"variant {name}: {len(rows)} rows", flush=True)
        for line in sorted(set(x for x in res.stderr.splitlines() if x.startswith(("kernel ", "launch ")))):
            print(f"  {name} {line}")
    names = list(dict.fromkeys(r["variant"] for r in rows))
    bad = [r for r in rows if r.get("status") != "ok"]
    key = "device_us" if args.device == "cuda" else "rel_err"
    print("| case | " + " | ".join(f"{n} {'µs' if key == 'device_us' else 'rel. err'}" for n in names)
          + (" | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) if key == "device_us" else "") + " |")
    print("|---" * (1 + len(names) + (len(names) - 1 if key == "device_us" else 0)) + "|")
    by = {}
    for r in rows:
        case = (r["estimator"], r["n"], r["t"], r["mix"], r["dtype"], r.get("layout", "env"))
        by.setdefault(case, {})[r["variant"]] = r
    for c, vs in by.items():
        vals = [vs.get(n, {}).get(key) for n in names]
        cells = [f"{v:.1f}" if key == "device_us" and v is not None else f"{v:.1e}" if v is not None else "–"
                 for v in vals]
        ratios = []
        if key == "device_us":
            ratios = [f"{v / vals[0]:.2f}" if v and vals[0] else "–" for v in vals[1:]]
        pct = vs.get(names[-1], {}).get("pct_copy")
        label = (f"{c[0]} {c[1]}×{c[2]} {c[3]} {c[4]}" + (" time-major" if c[5] == "time" else "")
                 + (f" ({pct:.0f}% of copy)" if pct else ""))
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    print(f"{len(bad)} rows not ok" + (": " + "; ".join(f"{r['variant']} {r['estimator']} {r['n']}x{r['t']} "
                                                     f"{r.get('status')} {r.get('note')}" for r in bad) if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
