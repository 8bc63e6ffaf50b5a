"""Device time of the same calls on several trees of rollbuf, interleaved, with one harness.

    python benchmarks/device_ab.py TREE_DIR...   (each TREE_DIR holds a ``rollbuf/``, e.g. from
    ``git archive COMMIT rollbuf | tar -x -C DIR``; OUT: the results folder)

Each tree runs in its own process (its own Triton cache), three rounds interleaved. Per case: the best
replay of a CUDA graph of 20 calls (µs per call) and the kernels' device time from the profiler (µs
per call, and kernels per call); last, each tree's compiled kernels (name, warps, shared memory, a
hash and the line count of the PTX without its debug lines)."""
import glob
import hashlib
import json
import os
import re
import subprocess
import sys

TREES = [os.path.abspath(t) for t in sys.argv[1:]]
CASES = [("advantages", 4096, 128, "term-only"), ("eligibility_traces", 4096, 128, "term-only"),
         ("vtrace", 512, 512, "term-only"), ("advantages", 32768, 8, "term-only"),
         ("advantages", 2048, 2048, "term+trunc"), ("advantages", 256, 4096, "term-only")]


def child(tree):
    import torch

    import rollbuf.functional as F
    torch.manual_seed(0)
    dev = "cuda"
    res = []
    for est, n, t, mix in CASES:
        g = torch.Generator(device=dev).manual_seed(1)
        r = torch.randn(n, t, device=dev, generator=g)
        v = torch.randn(n, t, device=dev, generator=g)
        term = torch.rand(n, t, device=dev, generator=g) < 0.02
        kw = dict(rewards=r, values=v, terminated=term)
        if mix == "term+trunc":
            kw["truncated"] = (torch.rand(n, t, device=dev, generator=g) < 0.01) & ~term
            kw["bootstrap_values"] = torch.randn(n, t, device=dev, generator=g)
        else:
            kw["bootstrap_values"] = torch.randn(n, device=dev, generator=g)
        if est == "advantages":
            def fn():
                return F.advantages(0.99, 0.95, **kw)
        elif est == "vtrace":
            lp = torch.randn(n, t, device=dev, generator=g) * 0.1
            tl = torch.randn(n, t, device=dev, generator=g) * 0.1
            def fn():
                return F.vtrace(tl, 0.99, rewards=r, values=v, terminated=term, log_probs=lp,
                                              bootstrap_values=kw["bootstrap_values"])
        else:
            def fn():
                return F.eligibility_traces(r, 0.99, 0.95, terminated=term)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        # profiler: kernels per call and their device time
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
        kern = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                d = kern.setdefault(e.name, [0, 0.0])
                d[0] += 1
                d[1] += e.device_time if hasattr(e, "device_time") else e.cuda_time
        # graph of 20 calls, replayed
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            for _ in range(20):
                fn()
        for _ in range(10):
            gr.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        best = 1e9
        for _ in range(5):
            a.record()
            for _ in range(50):
                gr.replay()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) * 1000 / (50 * 20))
        res.append(dict(tree=tree, case=f"{est} {n}x{t} {mix}", graph_us=best,
                        kernels={k: (c / 200, tt / c) for k, (c, tt) in kern.items()}))
    print("RESULT " + json.dumps(res))


def kernels_in_cache(cache):
    out = []
    for js in glob.glob(f"{cache}/**/*.json", recursive=True):
        if "__grp__" in os.path.basename(js):
            continue
        try:
            with open(js) as fh:
                m = json.load(fh)
        except Exception:
            continue
        if "name" not in m:
            continue
        ptx = js[:-5] + ".ptx"
        h, nl = "-", 0
        if os.path.exists(ptx):
            with open(ptx) as fh:
                src = [ln for ln in fh.read().splitlines() if not re.match(r"\s*(\.loc|\.file|//)", ln)]
            src = [ln for ln in src if "debug" not in ln]
            h, nl = hashlib.sha1("\n".join(src).encode()).hexdigest()[:10], len(src)
        out.append((m["name"], m.get("num_warps"), m.get("shared"), h, nl))
    return sorted(out)


def main():
    out = os.environ.get("OUT", "/tmp/out")
    rows = []
    for rnd in range(3):
        for tree in TREES:
            env = dict(os.environ, PYTHONPATH=f"/tmp/site:{tree}", TRITON_CACHE_DIR=f"/tmp/tc_{os.path.basename(tree)}")
            p = subprocess.run([sys.executable, __file__, "child", tree], env=env, capture_output=True, text=True,
                               cwd="/tmp")
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(tree, "FAILED", p.stderr[-3000:])
                continue
            for r in json.loads(line[0][7:]):
                r["round"] = rnd
                rows.append(r)
    with open(f"{out}/devtime.json", "w") as fh:
        json.dump(rows, fh)
    for tree in TREES:
        ks = kernels_in_cache(f"/tmp/tc_{os.path.basename(tree)}")
        print("==", tree, len(ks), "compiled kernels")
        for k in ks:
            print("  ", k)
    cases = sorted({r["case"] for r in rows}, key=[r["case"] for r in rows].index)
    print("\nbest graph-replay µs per call (20 calls per graph) / kernel device µs (profiler, mean) / kernels per call")
    print(f"{'case':36s}" + "".join(f"{os.path.basename(t):>26s}" for t in TREES))
    for c in cases:
        line = f"{c:36s}"
        for t in TREES:
            rs = [r for r in rows if r["case"] == c and r["tree"] == t]
            if not rs:
                line += f"{'-':>26s}"
                continue
            g = min(r["graph_us"] for r in rs)
            kd = min(sum(n * d for n, d in r["kernels"].values()) for r in rs)
            nk = sum(n for n, _ in rs[0]["kernels"].values())
            line += f"{g:9.2f}{kd:9.2f}{nk:8.1f}"
        print(line)
    for c in cases:
        for t in TREES:
            rs = [r for r in rows if r["case"] == c and r["tree"] == t]
            if rs:
                print(c, t, {k[:40]: (round(n, 2), round(d, 2)) for k, (n, d) in rs[-1]["kernels"].items()})


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":  # (TREES is unused in the child)
        child(sys.argv[2])
    else:
        main()
