"""rollbuf.context_parallel: token estimators on context-parallel shards equal the one-process result.

One set of gloo processes per world size (2, 3 and 4; forked on Linux) runs every case; each rank
saves its outputs and the collectives it issued, and the tests here compare each rank's outputs
with its slice of :mod:`rollbuf.integrations.llm` on the whole sequences (float32, 1e-6 relative to
the output's scale). The layouts are random: uneven chunks with empty ones, rows / sequences with
no model token, with their model tokens in one chunk only (on one rank), chunks masked in every row
(all-masked shards), masked tokens holding NaN and ±inf, truncated sequences; padded ``[B, L]``
batches and packed streams (contiguous stream shards whose sequences cross rank boundaries, and the
per-sequence zigzag of context-parallel packed trainers). The outcome (group) estimators run on the
same layouts, rows paired into groups (packed: an odd count leaves a group of one), compared with
:mod:`rollbuf.integrations.verl` (padded) and :mod:`rollbuf.groups` (packed) on the whole batch; their
rewards are multiples of 1/16 (0.25 at masked tokens, which verl's score sums too), so each score is
exact in any summation order and GRPO's division by a small group std cannot magnify the order's rounding.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import sys

import numpy as np
import pytest
import torch

from rollbuf import context_parallel as CP
from rollbuf import groups
from rollbuf.backends import numba_available
from rollbuf.integrations import llm
from rollbuf.integrations import verl as RV

GAMMA, LAM = 0.97, 0.9
WORLDS = (2, 3, 4)
KINDS = ("padded", "packed")
OUTCOME = groups.OUTCOME_ESTIMATORS
ESTIMATORS = ("gae", "gae-whiten", "returns", "reinforce++", "sums", *OUTCOME)
SEEDS = range(5)
# the local call's backend, by seed: the torch scan, the compiled CPU loops, the kernels (interpreted:
# the ranks hold CPU tensors, so the kernels run here only under TRITON_INTERPRET=1, which conftest.py
# sets on a machine without CUDA; on a CUDA machine tests/test_no_sync.py runs them compiled under NCCL)
_BACKENDS = (["torch"] + (["numba"] if numba_available() else [])
             + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else []))


def _backend(seed):
    return _BACKENDS[seed % len(_BACKENDS)]


def _lengths(total, n, g, even=False):
    """``n`` chunk lengths summing to ``total``: equal (``even``), or random, uneven, some empty."""
    if even:
        return [total // n] * n
    pts = sorted(torch.randint(0, total + 1, (n - 1,), generator=g).tolist())
    return [b - a for a, b in zip([0, *pts], [*pts, total])]


def _garbage(x, m, g):
    junk = torch.tensor([math.nan, math.inf, -math.inf, 1e30])
    return torch.where(m, x, junk[torch.randint(0, 4, x.shape, generator=g)])


def _rank_chunks(layout, rank, world):
    return [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]


def _padded_case(world, layout, seed):
    """Global ``[B, L]`` fields and, per rank, the global columns it holds and its ``split``."""
    g = torch.Generator().manual_seed(1000 * world + seed)
    n_chunks = world * (1 if layout == "contiguous" else 2)
    even = seed == 0
    B, L = 6, (n_chunks * 4 if even else int(torch.randint(1, 41, (1,), generator=g)))
    lens = _lengths(L, n_chunks, g, even)
    starts = [sum(lens[:i]) for i in range(n_chunks + 1)]
    m = torch.rand(B, L, generator=g) < 0.7
    m[1] = False  # no model token
    nonempty = [i for i in range(n_chunks) if lens[i]]
    k = nonempty[int(torch.randint(0, len(nonempty), (1,), generator=g))]
    m[2] = False
    m[2, starts[k]:starts[k + 1]] = torch.rand(lens[k], generator=g) < 0.8  # on one rank only
    m[3, starts[-2]:] = False  # the last chunk masked: the row ends on an earlier rank
    j = int(torch.randint(0, n_chunks, (1,), generator=g))
    m[:, starts[j]:starts[j + 1]] = False  # a chunk masked in every row
    tr = torch.rand(B, generator=g) < 0.5
    f = dict(r=_garbage(torch.randn(B, L, generator=g), m, g), v=_garbage(torch.randn(B, L, generator=g), m, g),
             m=m, truncated=tr, bootstrap_values=torch.where(tr, torch.randn(B, generator=g), math.nan))
    ranks = []
    for rank in range(world):
        cs = _rank_chunks(layout, rank, world)
        idx = torch.cat([torch.arange(starts[c], starts[c + 1]) for c in cs])
        split = None if layout == "contiguous" or even else lens[cs[0]]
        ranks.append(dict(idx=idx, split=split))
    return f, ranks


def _packed_case(world, layout, seed):
    """A global packed stream with global ``cu_seqlens`` and, per rank, the stream positions it holds,
    its local ``cu_seqlens`` and ``split``: contiguous stream shards (sequences cross their edges) or
    each sequence cut in ``2·world`` chunks (rank ``i``: chunks ``i`` and ``2·world−1−i`` of each)."""
    g = torch.Generator().manual_seed(2000 * world + seed)
    even = seed == 0
    S = int(torch.randint(1, 7, (1,), generator=g))
    if even:
        seq = [2 * world * int(torch.randint(0, 4, (1,), generator=g)) for _ in range(S)]
    else:
        seq = torch.randint(0, 15, (S,), generator=g).tolist()
    tail = int(torch.randint(0, 4, (1,), generator=g))  # tokens of no sequence
    cu = torch.tensor([0, *torch.tensor(seq).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1]) + tail
    m = torch.rand(total, generator=g) < 0.7
    if S > 1:
        m[int(cu[1]):int(cu[2])] = False  # a sequence with no model token
    tr = torch.rand(S, generator=g) < 0.5
    f = dict(r=_garbage(torch.randn(total, generator=g), m, g), v=_garbage(torch.randn(total, generator=g), m, g),
             m=m, cu_seqlens=cu, truncated=tr, bootstrap_values=torch.where(tr, torch.randn(S, generator=g), math.nan))
    ranks = []
    if layout == "contiguous":
        lens = _lengths(total, world, g)
        o = [sum(lens[:i]) for i in range(world + 1)]
        for rank in range(world):
            local = (cu.long() - o[rank]).clamp(0, lens[rank]).to(torch.int32)
            ranks.append(dict(idx=torch.arange(o[rank], o[rank + 1]), cu_seqlens=local, split=None))
        return f, ranks
    cuts = [_lengths(n, 2 * world, g, even) for n in seq]  # per sequence, its 2·world chunks
    for rank in range(world):
        idx, local, split = [], [0], []
        for s in range(S):
            c = cuts[s]
            st = [int(cu[s]) + sum(c[:i]) for i in range(2 * world + 1)]
            mine = _rank_chunks(layout, rank, world)
            idx += [torch.arange(st[i], st[i + 1]) for i in mine]
            local.append(local[-1] + sum(c[i] for i in mine))
            split.append(c[mine[0]])
        if rank == 0:
            idx.append(torch.arange(int(cu[-1]), total))
        ranks.append(dict(idx=torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long),
                          cu_seqlens=torch.tensor(local, dtype=torch.int32),
                          split=None if even else torch.tensor(split, dtype=torch.int64)))
    return f, ranks


def _case(kind, world, layout, seed):
    return (_padded_case if kind == "padded" else _packed_case)(world, layout, seed)


def _local(kind, f, mine):
    """This rank's slices of the per-token fields."""
    if kind == "padded":
        return {k: f[k][:, mine["idx"]] for k in ("r", "v", "m")}
    return {k: f[k][mine["idx"]] for k in ("r", "v", "m")}


def _outcome_inputs(kind, r, m, f):
    """The outcome estimators' rewards (exact sums: multiples of 1/16, 0.25 at masked tokens) and labels
    (the rows / sequences paired at random)."""
    lines = f["r"].shape[0] if kind == "padded" else f["cu_seqlens"].numel() - 1
    return torch.where(m, (r * 16).round() / 16, 0.25), np.random.default_rng(lines).permutation(np.arange(lines) // 2)


def _call(kind, estimator, layout, loc, f, mine, backend, group=None):
    """The estimator on one rank's shard (``rollbuf.context_parallel``)."""
    rows = dict(truncated=f["truncated"], bootstrap_values=f["bootstrap_values"])
    lay = dict(layout=layout, split=mine["split"], group=group, backend=backend)
    r, v, m = loc["r"], loc["v"], loc["m"]
    cu = None if kind == "padded" else mine["cu_seqlens"]
    if estimator == "sums":
        return (CP.sequence_sums(r, m, cu_seqlens=cu, group=group),)
    if estimator in OUTCOME:
        rewards, index = _outcome_inputs(kind, r, m, f)
        return (CP.outcome_advantages(rewards, m, index, estimator, cu_seqlens=cu, group=group),)
    if estimator.startswith("gae"):
        whiten = estimator == "gae-whiten"
        if kind == "padded":
            return tuple(CP.compute_gae_advantage_return(r, v, m, GAMMA, LAM, whiten=whiten, **rows, **lay))
        return tuple(CP.packed_gae(r, v, m, mine["cu_seqlens"], GAMMA, LAM, whiten=whiten, **rows, **lay))
    if kind == "padded":
        ret = CP.discounted_returns(r, m, GAMMA, **rows, **lay)
    else:
        ret = CP.packed_discounted_returns(r, m, mine["cu_seqlens"], GAMMA, **rows, **lay)
    if estimator == "reinforce++":
        return (CP.masked_whiten(ret, m, group=group) * m,)
    return (ret,)


def _expected(kind, estimator, f):
    """The one-process result on the whole sequences (rollbuf.integrations.llm)."""
    r, v, m = f["r"], f["v"], f["m"]
    rows = dict(truncated=f["truncated"], bootstrap_values=f["bootstrap_values"])
    if estimator == "sums":
        x = torch.where(m, r, 0)
        if kind == "padded":
            return (x.sum(-1),)
        cu = f["cu_seqlens"].long()
        return (torch.stack([x[int(a):int(b)].sum() for a, b in itertools.pairwise(cu)]),)
    if estimator in OUTCOME:
        return (_expected_outcome(kind, estimator, f),)
    if estimator.startswith("gae"):
        whiten = estimator == "gae-whiten"
        if kind == "padded":
            return tuple(llm.compute_gae_advantage_return(r, v, m, GAMMA, LAM, whiten=whiten, backend="torch", **rows))
        return tuple(llm.packed_gae(r, v, m, f["cu_seqlens"], GAMMA, LAM, whiten=whiten, backend="torch", **rows))
    if kind == "padded":
        ret = llm.discounted_returns(r, m, GAMMA, backend="torch", **rows)
    else:
        ret = llm.packed_discounted_returns(r, m, f["cu_seqlens"], GAMMA, backend="torch", **rows)
    return (llm.masked_whiten(ret, m) * m,) if estimator == "reinforce++" else (ret,)


def _expected_outcome(kind, estimator, f):
    """verl's estimator on the whole batch (rollbuf.integrations.verl; packed: rollbuf.groups)."""
    r, index = _outcome_inputs(kind, f["r"], f["m"], f)
    m = f["m"]
    if kind == "padded":
        fn = {"grpo": RV.compute_grpo_outcome_advantage, "gdpo": RV.compute_gdpo_outcome_advantage,
              "dr_grpo": lambda *a, **kw: RV.compute_grpo_outcome_advantage(*a, norm_adv_by_std_in_grpo=False)}
        return fn.get(estimator, RV.ESTIMATORS.get(estimator))(r, m, index, config={})[0]
    cu = f["cu_seqlens"]
    lengths = torch.stack([m[int(a):int(b)].sum(dtype=torch.float32) for a, b in itertools.pairwise(cu)])
    a = groups.outcome_advantages(groups.sequence_scores(r, cu), index, lengths, estimator)
    return groups.to_tokens(a, m, cu)


# ---------------------------------------------------------------------------------------------
# the worker: one process per rank, every case
# ---------------------------------------------------------------------------------------------


def _worker(rank, world, init_file, out_prefix):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    issued = []  # (collective, numel) of every collective, to count them and their size
    real = {name: getattr(dist, name) for name in ("all_gather", "all_reduce")}

    def counting(name):
        def call(*args, **kw):
            t = args[1] if name == "all_gather" else args[0]
            issued.append((name, t.numel()))
            return real[name](*args, **kw)
        return call

    for name in real:
        setattr(dist, name, counting(name))
    results = {}
    try:
        for kind in KINDS:
            for layout in CP.LAYOUTS:
                for seed in SEEDS:
                    f, ranks = _case(kind, world, layout, seed)
                    loc = _local(kind, f, ranks[rank])
                    for est in ESTIMATORS:
                        del issued[:]
                        try:
                            out = _call(kind, est, layout, loc, f, ranks[rank], _backend(seed))
                            results[(kind, layout, seed, est)] = ("ok", out, list(issued))
                        except Exception as e:  # reported to the test, not raised: the others go on
                            results[(kind, layout, seed, est)] = ("error", f"{type(e).__name__}: {e}", [])
        # a malformed cu_seqlens on rank 0 only: every output of every rank is NaN
        f, ranks = _packed_case(world, "contiguous", 1)
        mine = dict(ranks[rank])
        if rank == 0:
            mine["cu_seqlens"] = mine["cu_seqlens"] + 1  # does not start at 0
        results["bad-cu"] = sum((_call("packed", est, "contiguous", _local("packed", f, mine), f, mine, "torch")
                                 for est in ("gae", "grpo")), ())
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
        torch.save(results, f"{out_prefix}.{rank}")
        dist.barrier()
        dist.destroy_process_group()


_RESULTS: dict = {}


def _run_world(world, tmp_path_factory):
    if world not in _RESULTS:
        import torch.multiprocessing as mp

        d = tmp_path_factory.mktemp(f"cp{world}")
        method = "fork" if sys.platform == "linux" else "spawn"
        mp.start_processes(_worker, args=(world, str(d / "init"), str(d / "out")), nprocs=world, join=True,
                           start_method=method)
        _RESULTS[world] = [torch.load(d / f"out.{r}", weights_only=False) for r in range(world)]
    return _RESULTS[world]


# ---------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------


def _collectives(kind, est, layout, f, B):
    """The collectives a call issues: one all_gather of (lines + 1)·P·4 numbers per scan (the pieces'
    maps), one of 3 per whitening (count, mean, M2), one all_reduce of a sum per sequence."""
    lines = (B if kind == "padded" else f["cu_seqlens"].numel() - 1)
    if est in ("sums", *OUTCOME):  # a sum per sequence (the outcome estimators: its reward and its length)
        return [("all_reduce", lines * (1 if est == "sums" else 2))]
    out = [("all_gather", (lines + 1) * (1 if layout == "contiguous" else 2) * 4)]
    return out + ([("all_gather", 3)] if est in ("gae-whiten", "reinforce++") else [])


@pytest.mark.covering(2)  # the default run: every pair of values; -m exhaustive: the rest
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("layout", CP.LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", WORLDS)
def test_sharded_equals_one_process(world, kind, layout, estimator, seed, tmp_path_factory):
    per_rank = _run_world(world, tmp_path_factory)
    f, ranks = _case(kind, world, layout, seed)
    try:
        expected = _expected(kind, estimator, f)
    except ValueError as e:  # pass@k with a group of one: every rank raises the same error
        assert all(res[(kind, layout, seed, estimator)][1] == f"ValueError: {e}" for res in per_rank)
        return
    for rank, res in enumerate(per_rank):
        status, got, issued = res[(kind, layout, seed, estimator)]
        assert status == "ok", f"rank {rank}: {got}"
        assert issued == _collectives(kind, estimator, layout, f, f["r"].shape[0]), f"rank {rank}: {issued}"
        for i, (a, whole) in enumerate(zip(got, expected)):
            e = whole if estimator == "sums" else whole[..., ranks[rank]["idx"]]  # per token: this rank's slice
            scale = max(float(e.abs().amax()) if e.numel() else 0.0, 1.0)
            assert a.dtype == e.dtype and a.shape == e.shape, (rank, i, a.dtype, e.dtype, a.shape, e.shape)
            assert torch.isfinite(a).all(), f"rank {rank}, output {i}: a masked token's garbage leaked"
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6 * scale, msg=lambda m: f"rank {rank}, out {i}: {m}")


@pytest.mark.parametrize("world", WORLDS)
def test_malformed_cu_seqlens_on_one_rank_poisons_every_rank(world, tmp_path_factory):
    for rank, res in enumerate(_run_world(world, tmp_path_factory)):
        for out in res["bad-cu"]:
            assert out.isnan().all(), rank


def test_needs_a_process_group():
    r = torch.randn(2, 5)
    with pytest.raises(RuntimeError, match="init_process_group"):
        CP.compute_gae_advantage_return(r, r, r > 0, 0.9, 0.9)


def test_errors_name_the_argument():
    r, m = torch.randn(2, 6), torch.ones(2, 6, dtype=torch.bool)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    cases = [
        (lambda: CP.compute_gae_advantage_return(r, r[:, :5], m, 0.9, 0.9), ValueError, "values must have shape"),
        (lambda: CP.compute_gae_advantage_return(r, r, m[:1], 0.9, 0.9), ValueError, "response_mask must have shape"),
        (lambda: CP.compute_gae_advantage_return(r, r, m, 0.9, 0.9, layout="ring"), ValueError, "layout must be"),
        (lambda: CP.compute_gae_advantage_return(r, r, m, 0.9, 0.9, layout="zigzag", split=7), ValueError, "split"),
        (lambda: CP.discounted_returns(r, m, 0.9, split=3), ValueError, "split is for layout='zigzag'"),
        (lambda: CP.discounted_returns(r, m, 1.5), ValueError, "gamma"),
        (lambda: CP.discounted_returns(r, m, 0.9, truncated=m[:, 0]), ValueError, "bootstrap_values"),
        (lambda: CP.discounted_returns(r, m, 0.9, truncated=m[:, 0], bootstrap_values=r[0]), ValueError,
         "bootstrap_values must be a \\[2\\]"),
        (lambda: CP.packed_gae(r[:1], r[:1], m[:1], cu.float(), 0.9, 0.9), ValueError, "cu_seqlens"),
        (lambda: CP.packed_gae(r, r, m, cu, 0.9, 0.9), ValueError, "token_level_rewards must be"),
        (lambda: CP.packed_discounted_returns(r[0], m[0], cu, 0.9, layout="zigzag", split=torch.tensor([1])),
         ValueError, "split must be an int \\[2\\]"),
        (lambda: CP.masked_whiten(r, m[:, :3]), ValueError, "mask must have shape"),
        (lambda: CP.outcome_advantages(r[None], m[None], [0, 0], "grpo"), ValueError, "token_level_rewards must be"),
        (lambda: CP.outcome_advantages(r, m[:, :3], [0, 0], "grpo"), ValueError, "response_mask must have shape"),
        (lambda: CP.outcome_advantages(r, m, [0, 0], cu_seqlens=cu), ValueError, "token_level_rewards must be"),
    ]
    for fn, err, match in cases:
        with pytest.raises(err, match=match):
            fn()
