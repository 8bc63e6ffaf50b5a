"""rollbuf.distributed: rows sharded in time across gloo processes equal the unsharded rows.

The processes are started once per world size (2 and 4; forked on Linux, so they inherit the imported
modules and start in milliseconds) and run every case; each rank saves its outputs, and the tests
here join the shards along time and compare them with the float64 reference on the whole rows
(``backend="reference"``), or, for the chained cases (``carry=`` / ``return_carry=True``, which the
reference does not take), with ``rollbuf.functional`` on the whole rows. Every layout has uneven
shards and an empty one; the flags are placed at the shard edges: terminations and truncations at the
last and first step of shards, a shard that is fully masked in a row, rows whose last unmasked step
(their window end) is on an earlier rank, a row with no unmasked step at all. Masked steps hold
garbage (NaN, ±inf) and unread ``bootstrap_values`` are NaN, so a leak shows up as a NaN.

With two CUDA devices the same cases also run over NCCL on the GPUs (the ``auto`` backend there is
the Triton kernel); elsewhere those tests are deselected (conftest.py).
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import sys

import pytest
import torch

from rollbuf import functional as F
from rollbuf.backends import numba_available
from rollbuf.testing import assert_close_to_reference, assert_matches_reference, make_rollout

NAN = float("nan")
N = 8  # rows; row roles are set in _rollout

# layout name -> shard boundaries (rank r holds steps cuts[r]:cuts[r+1]); uneven, with empty shards
LAYOUTS = {
    2: {"11|12": [0, 11, 23], "23|0": [0, 23, 23]},
    4: {"6|0|9|8": [0, 6, 6, 15, 23], "0|8|15|0": [0, 0, 8, 23, 23]},
}

# case name -> (estimator in rollbuf.distributed, keyword parameters, fields it takes)
_BW = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")
CASES = {
    "gae": ("gae", dict(gamma=0.9, lam=0.8), _BW),
    "gae-terminal": ("gae", dict(gamma=0.9, lam=0.8, window_end="terminal"), _BW),
    "advantages": ("advantages", dict(gamma=0.97, lam=0.5), _BW),
    "lambda_returns": ("lambda_returns", dict(gamma=0.95, lam=0.7), _BW),
    "discounted_returns": ("discounted_returns", dict(gamma=0.9), _BW),
    "monte_carlo_returns": ("discounted_returns", dict(gamma=0.9, bootstrap=False),
                            ("rewards", "terminated", "truncated", "mask")),
    "vtrace": ("vtrace", dict(gamma=0.9, lam=0.9, rho_bar=1.2, c_bar=0.9, pg_rho_bar=0.8),
               _BW + ("log_probs", "target_log_probs")),
    "retrace": ("retrace", dict(gamma=0.9, lam=0.9, c_bar=1.0),
                _BW + ("log_probs", "target_log_probs", "q_values")),
    "eligibility_traces": ("eligibility_traces", dict(gamma=0.9, lam=0.8),
                           ("x", "terminated", "truncated", "mask")),
    "episodic_sums": ("episodic_sums", dict(), ("rewards", "terminated", "truncated", "mask")),
    # window-level arguments: initial / carry in, the whole window's carry out, [N] bootstrap values
    "eligibility_traces-initial": ("eligibility_traces", dict(gamma=0.9, lam=0.8, initial="x0"),
                                   ("x", "terminated", "truncated", "mask")),
    "episodic_sums-initial": ("episodic_sums", dict(initial="s0"),
                              ("rewards", "terminated", "truncated", "mask")),
    "gae-carry": ("gae", dict(gamma=0.9, lam=0.8, carry="z", return_carry=True), _BW),
    "gae-return_carry": ("gae", dict(gamma=0.9, lam=0.8, return_carry=True), _BW),
    "vtrace-carry": ("vtrace", dict(gamma=0.9, lam=0.9, carry="uv", return_carry=True),
                     _BW + ("log_probs", "target_log_probs")),
    "retrace-return_carry": ("retrace", dict(gamma=0.9, return_carry=True),
                             _BW + ("log_probs", "target_log_probs", "q_values")),
    # read from the last rank / rank 0 only: the others pass None (and their bootstrap values)
    "gae-carry-on-last-rank": ("gae", dict(gamma=0.9, lam=0.8, carry="z@last", return_carry=True), _BW),
    "episodic_sums-initial-on-rank-0": ("episodic_sums", dict(initial="s0@first"),
                                        ("rewards", "terminated", "truncated", "mask")),
    "gae-[N]bootstrap": ("gae", dict(gamma=0.9, lam=0.8, bootstrap_values="v_end"),
                         ("rewards", "values", "terminated", "mask")),
    "gae-batch2x4": ("gae", dict(gamma=0.9, lam=0.8, batch=(2, 4)), _BW),
    # float64 inputs accumulate (and are exchanged) in float64: checked at float64 tolerance
    "vtrace-float64": ("vtrace", dict(gamma=0.9, lam=0.9, dtype=torch.float64),
                       _BW + ("log_probs", "target_log_probs")),
}
_WINDOW = {"x0": lambda g: torch.stack([g["v_end"], -2 * g["v_end"]], -1), "s0": lambda g: g["v_end"].abs(),
           "z": lambda g: g["v_end"], "uv": lambda g: torch.stack([g["v_end"] / 2, g["v_end"]], -1),
           "v_end": lambda g: g["v_end"]}
# carry/return_carry cases are checked against rollbuf.functional (torch) on the whole rows
CHAINED = {k for k, (_, p, _) in CASES.items() if "carry" in p or "return_carry" in p}


def _triton_runs(device):
    """The kernels run on CUDA, or on the CPU under Triton's interpreter (set by conftest.py)."""
    if device.type == "cuda":
        return True
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET") == "1"


# on the CPU (gloo): the torch backend, the compiled CPU loops (the ``auto`` backend there) and the kernels
BACKENDS = (["torch"] + (["numba"] if numba_available() else [])
            + (["triton"] if _triton_runs(torch.device("cpu")) else []))


# ---------------------------------------------------------------------------------------------
# the rollout: flags at the shard edges of a layout
# ---------------------------------------------------------------------------------------------


def _rollout(cuts, seed=0):
    """Global fields ``[N, T]`` (float32, bool flags) with boundaries placed at ``cuts``' edges."""
    T = cuts[-1]
    f = make_rollout(N, T, seed=seed, p_terminated=0.0, p_truncated=0.0, features=(2,))
    g = torch.Generator().manual_seed(seed + 1)
    term = torch.zeros(N, T, dtype=torch.bool)
    trunc = torch.zeros(N, T, dtype=torch.bool)
    mask = torch.ones(N, T, dtype=torch.bool)
    edges = sorted({c for c in cuts if 0 < c < T})
    shards = [(a, b) for a, b in itertools.pairwise(cuts) if b > a]  # non-empty shards
    for e in edges:
        term[0, e - 1] = True  # terminated at the last step of a shard
        trunc[1, e - 1] = True  # truncated at the last step of a shard (reads bootstrap_values)
        term[2, e] = True  # terminated / truncated at the first step of a shard
        if e + 1 < T:
            trunc[2, e + 1] = True
        term[3, e - 1] = trunc[3, e - 1] = True  # both: terminated wins
    if len(shards) > 1:
        a, b = shards[1]
        mask[3, a:b] = False  # a shard fully masked in the row
        trunc[3, a - 1] = False
    a, b = shards[-1]
    mask[4, a:] = False  # the row's window end is the last step of an earlier shard (bootstraps)
    mask[5, a:] = False  # ... and terminated there
    if a > 0:
        term[5, a - 1] = True
        mask[4, :2] = False
    mask[6] = False  # no unmasked step at all
    term[6, 3] = trunc[6, 5] = True  # ignored
    term[7] = torch.rand(T, generator=g) < 0.15  # random flags and mask spans
    trunc[7] = torch.rand(T, generator=g) < 0.15
    mask[7] = torch.rand(T, generator=g) < 0.7
    if edges:
        mask[7, edges[0]] = False  # a masked first step of a shard
        mask[7, edges[-1] - 1] = False  # a masked last step of a shard
    trunc[4] |= torch.rand(T, generator=g) < 0.1
    term[4] |= torch.rand(T, generator=g) < 0.05
    # garbage at masked steps, NaN at every bootstrap slot that is not read
    junk = torch.tensor([NAN, math.inf, -math.inf, 1e30])
    for k in ("rewards", "values", "log_probs", "target_log_probs", "q_values"):
        f[k] = torch.where(mask, f[k], junk[torch.randint(0, 4, (N, T), generator=g)])
    f["x"] = torch.where(mask.unsqueeze(-1), f["x"], NAN)
    live_end = torch.where(mask, torch.arange(T), -1).amax(-1)
    at_end = (torch.arange(T) == live_end.unsqueeze(-1)) & mask & ~term
    read = (trunc & ~term & mask) | at_end
    f["bootstrap_values"] = torch.where(read, torch.randn(N, T, generator=g), NAN)
    f.update(terminated=term, truncated=trunc, mask=mask)
    f["v_end"] = torch.randn(N, generator=g)  # V(s_T) for the [N] form and the carries
    return f


def _call_kwargs(case, fields, lo, hi, device, rank=None, world=None, backend=None):
    """Keyword arguments of the case's estimator on steps ``lo:hi`` of ``fields`` (global ones whole;
    ``"name@last"`` / ``"name@first"`` only on the last rank / rank 0, ``None`` elsewhere)."""
    fn, params, take = CASES[case]
    batch = params.get("batch")
    dtype = params.get("dtype")
    kw = {}
    for name in take:
        v = fields[name][:, lo:hi].to(device)
        v = v.to(dtype) if dtype is not None and v.is_floating_point() else v
        kw[name] = v if batch is None else v.reshape(*batch, *v.shape[1:])
    for k, given in params.items():
        if k in ("batch", "dtype"):
            continue
        v = given
        if isinstance(v, str) and v.partition("@")[0] in _WINDOW:
            name, _, where = v.partition("@")
            mine = rank is None or where == "" or (where == "last" and rank == world - 1) or \
                (where == "first" and rank == 0)
            v = _WINDOW[name](fields).to(device) if mine else None
        kw[k] = v
    if backend is not None:
        kw["backend"] = backend
    if fn == "eligibility_traces":
        kw = {"x": kw.pop("x"), **kw}
    return fn, kw


def _as_tuple(out):
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple) and len(out) == 2 and not hasattr(out, "_fields") and \
            isinstance(out[1], torch.Tensor) and not isinstance(out[0], torch.Tensor):
        return _as_tuple(out[0]) + (out[1],)  # (result, carry)
    if isinstance(out, tuple) and len(out) == 2 and not hasattr(out, "_fields") and \
            isinstance(out[0], torch.Tensor) and isinstance(out[1], torch.Tensor):
        return out  # (tensor result, carry)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# the worker: one process per rank, every case
# ---------------------------------------------------------------------------------------------


def _worker(rank, world, init_file, out_prefix, dist_backend):
    import torch.distributed as dist

    from rollbuf import distributed as D

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if dist_backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(dist_backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    gathered = []  # numel of every all_gather payload, to count collectives and their size
    real = dist.all_gather

    def counting(out, t, group=None, **kw):
        gathered.append(t.numel())
        return real(out, t, group=group, **kw)

    dist.all_gather = counting
    results = {}
    try:
        for layout, cuts in LAYOUTS[world].items():
            fields = _rollout(cuts)
            lo, hi = cuts[rank], cuts[rank + 1]
            for case in CASES:
                # "auto": the kernels on CUDA; on the CPU both backends run
                for backend in ["auto"] if device.type == "cuda" else BACKENDS:
                    fn, kw = _call_kwargs(case, fields, lo, hi, device, rank, world, backend)
                    del gathered[:]
                    key = (layout, case, backend)
                    try:
                        out = _as_tuple(getattr(D, fn)(**kw))
                        results[key] = ("ok", tuple(o.cpu() for o in out), list(gathered))
                    except Exception as e:  # reported to the test, not raised: the others go on
                        results[key] = ("error", f"{type(e).__name__}: {e}", list(gathered))
        if world == 4:  # two subgroups of two ranks, each sharding the same rows in two
            groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            fields = _rollout([0, 9, 23])
            sub = rank % 2
            cuts = [0, 9, 23]
            fn, kw = _call_kwargs("vtrace", fields, cuts[sub], cuts[sub + 1], device)
            out = getattr(D, fn)(**kw, group=groups[rank // 2])
            results[("subgroups", "vtrace")] = ("ok", tuple(o.cpu() for o in out), [])
        # a [N] bootstrap value with a truncation at rank 0's last step before the window end: an
        # interior truncation, which reads NaN: row 1 is NaN on rank 0 up to that step, the later
        # ranks' steps are exact
        fields = _rollout(LAYOUTS[world][next(iter(LAYOUTS[world]))])
        cuts = LAYOUTS[world][next(iter(LAYOUTS[world]))]
        _, kw = _call_kwargs("gae", fields, cuts[rank], cuts[rank + 1], device)
        kw["bootstrap_values"] = fields["v_end"].to(device)
        kw["mask"] = None
        trunc = torch.zeros(N, cuts[-1], dtype=torch.bool)
        trunc[1, cuts[1] - 1] = True  # the last step of rank 0's shard; later ranks hold steps
        kw["truncated"] = trunc[:, cuts[rank]:cuts[rank + 1]].to(device)
        _, whole = _call_kwargs("gae", fields, 0, cuts[-1], device)  # the unsharded call
        whole.update(bootstrap_values=kw["bootstrap_values"], mask=None, truncated=trunc.to(device))
        (w_adv, w_ret), w_carry = F.gae(**whole, return_carry=True)
        lo, hi = cuts[rank], cuts[rank + 1]
        try:
            (adv, ret), carry = D.gae(**kw, return_carry=True)
            results["interior-truncation"] = ("ok", (adv.cpu(), ret.cpu(), carry.cpu()), [])
        except ValueError as e:
            results["interior-truncation"] = ("error", str(e), [])
        results["interior-truncation-unsharded"] = ("ok", (w_adv[:, lo:hi].cpu(), w_ret[:, lo:hi].cpu(),
                                                           w_carry.cpu()), [])
    finally:
        dist.all_gather = real
        torch.save(results, f"{out_prefix}.{rank}")
        dist.barrier()
        dist.destroy_process_group()


_RESULTS: dict = {}


def _run_world(world, dist_backend, tmp_path_factory):
    key = (world, dist_backend)
    if key not in _RESULTS:
        import torch.multiprocessing as mp

        d = tmp_path_factory.mktemp(f"dist{world}{dist_backend}")
        method = "fork" if sys.platform == "linux" and dist_backend == "gloo" else "spawn"
        mp.start_processes(_worker, args=(world, str(d / "init"), str(d / "out"), dist_backend),
                           nprocs=world, join=True, start_method=method)
        _RESULTS[key] = [torch.load(d / f"out.{r}", weights_only=False) for r in range(world)]
    return _RESULTS[key]


# ---------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------

PARAMS = [(w, layout, case, b) for w in (2, 4) for layout in LAYOUTS[w] for case in CASES
          for b in BACKENDS]
NCCL = torch.cuda.device_count() >= 2
nccl_only = pytest.mark.multigpu  # deselected (conftest) on machines with fewer than two GPUs


def _check(per_rank, world, layout, case, backend):
    cuts = LAYOUTS[world][layout]
    fields = _rollout(cuts)
    fn, params, take = CASES[case]
    outs = []
    for r, res in enumerate(per_rank):
        status, out, gathered = res[(layout, case, backend)]
        assert status == "ok", f"rank {r}: {out}"
        # one collective per call, O(N) numbers: per row 2 map coefficients + candidate + whether the
        # shard's last live step reads a [*B] column + priority (V-trace: 5 + 2 + 1 + 1), forward:
        # the features' α + β
        k = {"vtrace": 9, "eligibility_traces": 3, "episodic_sums": 2}.get(fn, 5)
        assert gathered == [N * k], f"rank {r}: all_gather payloads {gathered}, expected one of {N * k}"
        outs.append(out)
    # the whole window's final / carry is the same on every rank
    n_step = {"gae": 2, "advantages": 1, "vtrace": 2, "eligibility_traces": 1, "episodic_sums": 1}.get(fn, 1)
    for r in range(1, world):
        for a, b in zip(outs[0][n_step:], outs[r][n_step:]):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    tdim = len(params.get("batch", (N,)))
    joined = tuple(torch.cat([o[i] for o in outs], tdim) for i in range(n_step)) + outs[0][n_step:]
    batch = params.get("batch")
    if batch is not None:
        joined = tuple(j.reshape(N, *j.shape[len(batch):]) for j in joined)
    _, kw = _call_kwargs(case, fields, 0, cuts[-1], torch.device("cpu"))
    kw.pop("backend", None)
    if batch is not None:
        kw = {k: (v.reshape(N, *v.shape[len(batch):]) if isinstance(v, torch.Tensor) else v)
              for k, v in kw.items()}
    if case in CHAINED:  # the reference takes no carry: the functional call on the whole rows
        expected = _as_tuple(getattr(F, fn)(**kw, backend="torch"))
        for i, (a, e) in enumerate(zip(joined, expected)):
            per_step = tuple(a.shape) == (N, cuts[-1])
            assert_close_to_reference(a, e, fields if per_step else None, name=f"{case}[{i}]",
                                      equal_nan=not per_step, direction="backward")
        return
    name = "monte_carlo_returns" if case == "monte_carlo_returns" else fn
    params = {k: v for k, v in kw.items() if k not in take and k not in ("x",) and k != "bootstrap"}
    ref_fields = dict(fields)
    if isinstance(kw.get("bootstrap_values"), torch.Tensor) and kw["bootstrap_values"].dim() == 1:
        ref_fields["bootstrap_values"] = kw.pop("bootstrap_values")
        params.pop("bootstrap_values", None)
    ref_fields = {k: v for k, v in ref_fields.items() if k in take or k in ("x", "bootstrap_values")}
    if fn == "episodic_sums":
        ref_fields["x"] = fields["rewards"]
    if "dtype" in CASES[case][1]:  # the reference returns its inputs' dtype
        ref_fields = {k: v.to(CASES[case][1]["dtype"]) if v.is_floating_point() else v
                      for k, v in ref_fields.items()}
    assert_matches_reference(name, joined, ref_fields, **params)


@pytest.mark.parametrize("world,layout,case,backend", PARAMS,
                         ids=[f"w{w}-{lay}-{c}-{b}" for w, lay, c, b in PARAMS])
def test_sharded_equals_unsharded(world, layout, case, backend, tmp_path_factory):
    per_rank = _run_world(world, "gloo", tmp_path_factory)
    _check(per_rank, world, layout, case, backend)


def test_subgroups(tmp_path_factory):
    """Two process groups of two ranks in a world of four: ranks are numbered within ``group``."""
    per_rank = _run_world(4, "gloo", tmp_path_factory)
    fields = _rollout([0, 9, 23])
    _, kw = _call_kwargs("vtrace", fields, 0, 23, torch.device("cpu"))
    expected = F.vtrace(**kw, backend="reference")
    for pair in ((0, 1), (2, 3)):
        joined = tuple(torch.cat([per_rank[r][("subgroups", "vtrace")][1][i] for r in pair], -1)
                       for i in range(2))
        for a, e in zip(joined, expected):
            assert_close_to_reference(a, e, fields, direction="backward")


@pytest.mark.parametrize("world", [2, 4])
def test_interior_truncation_with_window_end_bootstrap_reads_nan(world, tmp_path_factory):
    """A ``[*B]`` bootstrap value and a truncation at the last step of a shard that is not the row's
    window end: the truncation reads NaN, as in the unsharded functional call, whose slice each rank
    returns, NaN included (found with the exchange, no device sync): the row is NaN from that step
    back on rank 0, and so is its whole window's carry on every rank."""
    per_rank = _run_world(world, "gloo", tmp_path_factory)
    for r, res in enumerate(per_rank):
        status, got, _ = res["interior-truncation"]
        assert status == "ok", (r, got)
        want = res["interior-truncation-unsharded"][1]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert got[2][1].isnan()  # row 1's whole-window carry
    assert per_rank[0]["interior-truncation"][1][0][1].isnan().all()  # row 1 on rank 0: up to the truncation


@nccl_only
@pytest.mark.parametrize("layout", list(LAYOUTS[2]))
def test_nccl(layout, tmp_path_factory):
    per_rank = _run_world(2, "nccl", tmp_path_factory)
    for case in CASES:
        _check(per_rank, 2, layout, case, "auto")


def test_needs_a_process_group():
    from rollbuf import distributed as D

    f = _rollout([0, 23])
    with pytest.raises(RuntimeError, match="init_process_group"):
        D.gae(0.9, 0.8, rewards=f["rewards"], values=f["values"], bootstrap_values=f["v_end"])


def test_signatures_add_group():
    import inspect

    from rollbuf import distributed as D

    for name in D.__all__:
        sig = inspect.signature(getattr(D, name))
        assert "group" in sig.parameters, name
        assert sig.parameters["group"].kind is inspect.Parameter.KEYWORD_ONLY
