"""rollbuf.groups against float64 loops written here, and its edge rules (docs/semantics.md, "Groups"):
groups of one, zero variance (exact), leave-one-out with equal other members (exact, in bf16 too:
NeMo-RL #4161's case), NaN scores, all-masked rows, packed sequences, a process group (gloo), and no
host read of a value (meta tensors). The Triton kernel against the torch path; its two ways to a
sample's group (the host's layout of NumPy labels, ids sorted on the device) bit for bit, and the
device sorts and host-to-device copies a call makes."""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import sys
from unittest import mock

import numpy as np
import pytest
import torch

from rollbuf import groups as G

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter takes CPU tensors
FIELDS = ("size", "mean", "std", "loo_mean", "loo_std", "top2_gap", "weighted_mean")


def loop_stats(x, labels, w):
    """The float64 loop: per sample, the statistics of its group and of its other members."""
    x, w = [float(v) for v in x], [float(v) for v in w]
    out = {k: [0.0] * len(x) for k in FIELDS}
    for lab in dict.fromkeys(labels):
        rows = [i for i, lb in enumerate(labels) if lb == lab]
        v = [x[i] for i in rows]
        n, mean = len(v), sum(v) / len(v)
        std = math.sqrt(sum((a - mean) ** 2 for a in v) / (n - 1)) if n > 1 else 0.0
        sw = sum(w[i] for i in rows)
        wmean = sum(w[i] * x[i] for i in rows) / sw if sw > 0 else mean
        best = max(v)
        second = sorted(v)[-2] if n > 1 else best
        for i in rows:
            others = [x[j] for j in rows if j != i]
            m = len(others)
            lm = sum(others) / m if m else x[i]
            ls = math.sqrt(sum((a - lm) ** 2 for a in others) / (m - 1)) if m > 1 else 0.0
            gap = x[i] - second if n > 1 and x[i] == best and v.count(best) == 1 else 0.0
            for k, val in zip(FIELDS, (n, mean, std, lm, ls, gap, wmean)):
                out[k][i] = val
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}


def _random_groups(seed, b=40):
    g = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < b:
        sizes.append(int(g.choice([1, 2, 3, 5, 8])))
    labels = np.repeat([f"prompt-{k}" for k in range(len(sizes))], sizes)
    g.shuffle(labels)
    return labels, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_stats_equal_the_float64_loop(seed, dtype):
    labels, g = _random_groups(seed)
    x = torch.tensor(g.normal(size=labels.size) * 3 + 1).to(dtype)
    x[:5] = torch.tensor(g.integers(0, 2, 5), dtype=dtype)  # binary scores too
    w = torch.tensor(g.integers(0, 9, labels.size), dtype=torch.float32)
    ids, n = G.group_ids(labels)
    got = G.group_stats(x, ids, n, w)
    want = loop_stats(x.double(), list(labels), w)  # bf16 inputs: their values, accumulated exactly
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-6)
    for k in FIELDS:
        assert getattr(got, k).dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        torch.testing.assert_close(getattr(got, k).double(), want[k], **tol, msg=k)


def test_groups_of_one():
    x = torch.tensor([2.5, -1.0, 4.0])
    s = G.group_stats(x, *G.group_ids(["a", "b", "b"]))
    assert s.size.tolist() == [1, 2, 2]
    assert s.mean[0] == 2.5 and s.std[0] == 0 and s.loo_mean[0] == 2.5 and s.loo_std[0] == 0
    assert s.top2_gap.tolist() == [0, 0, 5.0] and s.weighted_mean[0] == 2.5
    assert s.loo_mean[1:].tolist() == [4.0, -1.0] and s.loo_std[1:].tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [2, 3, 7, 16])
def test_zero_variance_is_exact(n, dtype):
    """Equal members: mean exactly their value, std exactly 0 (0.1 is not a sum-exact value)."""
    for v in (0.1, 1 / 3, -7.3, 1e4):
        x = torch.full((n,), v, dtype=dtype)
        s = G.group_stats(x, torch.zeros(n, dtype=torch.int64), 1)
        assert (s.mean == x.float()).all() and (s.std == 0).all() and (s.loo_std == 0).all()
        assert (s.loo_mean == x.float()).all() and (x.float() - s.mean == 0).all() and (s.top2_gap == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("odd", [1.0, -3.0, 0.75])
def test_leave_one_out_of_equal_others_is_exact(odd, dtype):
    """NeMo-RL #4161's case: a sample whose other members are all equal gets a leave-one-out std of
    exactly 0 and a leave-one-out mean of exactly their value, whether it is the group's maximum or
    minimum (a naive (sum_sq − x²) in float32 leaves a residue of ~1e-4 here)."""
    for n in (3, 4, 16, 64):
        for rest in (0.0, 0.3, 0.7):
            x = torch.full((n,), rest, dtype=dtype)
            x[n // 2] = odd
            s = G.group_stats(x, torch.zeros(n, dtype=torch.int64), 1)
            i = n // 2
            assert s.loo_std[i] == 0 and s.loo_mean[i] == x[0].float(), (n, rest, s.loo_std[i])
            assert s.loo_std[i - 1] > 0


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.interpret)])
def test_nan_score_poisons_its_group_only(backend):
    """Groups of 3, 1 and 2 with a NaN member: every statistic NaN (the spreads of a group of one
    or two too); the other groups finite."""
    nan = float("nan")
    x = torch.tensor([1.0, nan, 2.0, 3.0, 4.0, 5.0, nan, 6.0, nan]).to(DEV)
    s = G.group_stats(x, torch.tensor([0, 0, 0, 1, 1, 2, 3, 4, 4]).to(DEV), 5, backend=backend)
    poisoned = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    for k in FIELDS[1:]:
        v = getattr(s, k).cpu()
        assert v[poisoned].isnan().all(), k
        assert v[~poisoned].isfinite().all(), k


def test_weighted_mean_of_zero_weight_is_the_mean():
    s = G.group_stats(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), 1, torch.zeros(2))
    assert s.weighted_mean.tolist() == [2.0, 2.0]


def test_group_ids():
    ids, n = G.group_ids(np.array(["b", "a", "b", "c"], dtype=object))  # strings: in order of first appearance
    assert ids.tolist() == [0, 1, 0, 2] and n == 3
    ids, n = G.group_ids(np.array(["b", "a", "b", "c"]))  # a NumPy string array too
    assert ids.tolist() == [0, 1, 0, 2] and n == 3
    ids, n = G.group_ids(np.array([[1], [2], [1]] + [None], dtype=object)[:3])  # unhashable: as strings
    assert ids.tolist() == [0, 1, 0] and n == 2
    ids, n = G.group_ids(np.array([2, 1.0, True, 2.0], dtype=object))  # numbers by value (1.0 == True)
    assert ids.tolist() == [0, 1, 1, 0] and n == 2
    ids, n = G.group_ids(np.array([10**12, 7, 10**12]))
    assert ids.tolist() == [1, 0, 1] and n == 2
    ids, n = G.group_ids(np.array([1, "1", "x"], dtype=object))  # mixed types: compared as strings
    assert ids.tolist() == [0, 0, 1] and n == 2
    ids, n = G.group_ids(torch.tensor([9, -4, 9, 5, -4]))  # on the device: ranks, capacity B
    assert ids.tolist() == [2, 0, 2, 1, 0] and n == 5
    assert G.group_ids(np.array([], dtype=object))[1] == 0
    with pytest.raises(ValueError, match="index"):
        G.group_ids(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="index"):
        G.group_ids(torch.zeros(3))


def test_errors_name_the_argument():
    x = torch.zeros(3)
    with pytest.raises(TypeError, match="scores"):
        G.group_stats(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="ids"):
        G.group_stats(x, torch.zeros(2, dtype=torch.int64), 1)
    with pytest.raises(TypeError, match="weights"):
        G.group_stats(x, torch.zeros(3, dtype=torch.int64), 1, [1, 2, 3])
    with pytest.raises(ValueError, match="weights must have shape"):  # not broadcast
        G.group_stats(x, torch.zeros(3, dtype=torch.int64), 1, torch.ones(1))
    with pytest.raises(ValueError, match="mask"):
        G.masked_whiten(torch.zeros(3, 4), torch.ones(3, 5))
    with pytest.raises(TypeError, match="mask"):
        G.masked_whiten(torch.zeros(3, 4), None)
    with pytest.raises(ValueError, match="mask"):
        G.to_tokens(x, torch.ones(4, 2))
    for args, kw, err, match in [((x, [0, 0, 1], x, "ppo"), {}, ValueError, "estimator must be one of"),
                                 ((x, [0, 1], x), {}, ValueError, "index must hold one label per row"),
                                 ((x, [0, 1]), {}, ValueError, "index must hold one label per row"),
                                 ((x, [0, 0, 1], x[:2]), {}, ValueError, "lengths must hold one entry per row"),
                                 ((x, [0, 0, 1], None, "opo"), {}, ValueError, "lengths must be given"),
                                 ((x, [0, 0, 1], [1, 2, 3]), {}, TypeError, "lengths must be"),
                                 ((x, [0, 0, 1]), {"backend": "numba"}, ValueError, "backend must be one of"),
                                 ((x, [0, 0, 1], x, "grpo_passk"), {}, ValueError, "pass@k")]:
        with pytest.raises(err, match=match):
            G.outcome_advantages(*args, **kw)
    for est in G.READS_LENGTHS:
        with pytest.raises(ValueError, match="lengths"):
            G.outcome_advantages(x, [0, 0, 1], None, est)
        # token counts as integers (response_mask.sum(-1)) are the same lengths as floats
        n = torch.tensor([3, 5, 2])
        torch.testing.assert_close(G.outcome_advantages(x, [0, 0, 1], n, est, backend="torch"),
                                   G.outcome_advantages(x, [0, 0, 1], n.float(), est, backend="torch"))
    with pytest.raises(ValueError, match="backend must be one of"):
        G.group_stats(x, torch.zeros(3, dtype=torch.int64), 1, backend="reference")


def test_ids_and_scalars_out_of_range_are_named():
    """ids outside [0, num_groups), a num_groups that is no count, a negative or NaN epsilon and a zero,
    negative or infinite f_norm raise a ValueError naming the argument (instead of torch's index
    error, or NaN / ±inf advantages)."""
    x = torch.arange(4.0)
    for ids, n in (([0, 1, 2, 1], 2), ([0, -1, 0, 1], 2)):
        with pytest.raises(ValueError, match=r"ids must lie in \[0, num_groups\)"):
            G.group_stats(x, torch.tensor(ids), n, backend="torch")
    for n in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match="num_groups"):
            G.group_stats(x, torch.tensor([0, 0, 1, 1]), n, backend="torch")
    assert G.group_stats(x, torch.tensor([0, 0, 1, 1]), np.int64(3), backend="torch").size.tolist() == [2, 2, 2, 2]
    labels = np.array(["a", "a", "b", "b"])
    for eps in (-1e-6, float("nan"), float("inf"), "1e-6", True):
        with pytest.raises(ValueError, match="epsilon"):
            G.outcome_advantages(x, labels, epsilon=eps)
    for f_norm in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="f_norm"):
            G.outcome_advantages(x, labels, estimator="gpg", f_norm=f_norm)
    # epsilon = 0 is allowed: a group whose scores differ is divided by its std alone
    torch.testing.assert_close(G.outcome_advantages(x, labels, epsilon=0.0),
                               torch.tensor([-0.5, 0.5, -0.5, 0.5]) / math.sqrt(0.5))


def test_passk_gives_the_unique_best_only():
    """pass@k: the unique best of a group gets (r_max − r_second)/(std + ε), every other member exactly
    0, also at ε = 0 in an all-equal group (0/0 there is no member's advantage: no NaN)."""
    x = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 1.0, 3.0, 3.0])
    labels = np.array(["a", "a", "a", "b", "b", "b", "c", "c"])
    got = G.outcome_advantages(x, labels, estimator="grpo_passk", epsilon=0.0)
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    nan = G.outcome_advantages(torch.tensor([1.0, float("nan"), 0.0, 1.0]), np.array(["b", "b", "c", "c"]),
                               estimator="grpo_passk")
    assert nan[:2].isnan().all() and nan[2] == 0
    assert nan[3].item() == pytest.approx(1.0 / (math.sqrt(0.5) + 1e-6), rel=1e-6)


def test_lengths_only_where_read():
    """Estimators outside READS_LENGTHS give the same advantages with lengths None as with any."""
    labels, g = _random_groups(3, 30)
    x = torch.tensor(g.normal(size=labels.size), dtype=torch.float32)
    n = torch.tensor(g.integers(1, 9, labels.size), dtype=torch.float32)
    for est in set(G.OUTCOME_ESTIMATORS) - G.READS_LENGTHS - {"grpo_passk"}:
        assert torch.equal(G.outcome_advantages(x, labels, None, est), G.outcome_advantages(x, labels, n, est)), est


def test_tokens_padded_and_packed():
    v = torch.tensor([1.5, -2.0, 3.0])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 1]])
    assert G.to_tokens(v, mask).tolist() == [[1.5, 1.5, 0], [0, 0, 0], [0, 3.0, 3.0]]
    assert G.to_tokens(v.bfloat16(), mask.bool()).dtype == torch.bfloat16
    inf = G.to_tokens(torch.tensor([math.inf, math.nan, -math.inf]), mask)  # a product: inf·0 and NaN·0 are NaN
    assert inf[0, :2].tolist() == [math.inf] * 2 and inf[0, 2].isnan() and inf[1].isnan().all()
    assert inf[2, 0].isnan() and inf[2, 1:].tolist() == [-math.inf] * 2
    cu = torch.tensor([1, 3, 3, 6], dtype=torch.int32)  # token 0 and 6.. belong to no sequence
    pm = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 1]])
    assert G.to_tokens(v, pm, cu).tolist() == [[0, 1.5, 0, 3.0, 3.0, 3.0, 0, 0]]
    r = torch.arange(8.0).reshape(1, 8)
    assert G.sequence_scores(r, cu).tolist() == [3.0, 0.0, 12.0]
    rb = torch.randn(4, 6).bfloat16()
    assert G.sequence_scores(rb).dtype == torch.float32
    torch.testing.assert_close(G.sequence_scores(rb), rb.double().sum(-1).float())


@pytest.mark.parametrize("cu", [[0, 4, 40], [0, 6, 2, 10], [-3, 4, 10], [0, 4, 11], [2, 1]])
def test_malformed_cu_seqlens_give_nan(cu):
    """cu_seqlens that decrease, go negative or end past total make every output NaN, on the device
    (no host read), in a subprocess: before, a negative length reached repeat_interleave and
    corrupted the heap (the process aborted)."""
    import subprocess

    code = f"""
import torch, rollbuf
from rollbuf import groups as G
cu = torch.tensor({cu})
r = torch.arange(10.).view(1, 10)
for _ in range(50):
    s = G.sequence_scores(r, cu)
    t = G.to_tokens(torch.ones(cu.numel() - 1), torch.ones(1, 10), cu)
assert s.shape == (cu.numel() - 1,) and s.isnan().all(), s
assert t.shape == (1, 10) and t.isnan().all(), t
for f in (lambda: G.sequence_scores(r, cu), lambda: G.to_tokens(torch.ones(cu.numel() - 1), torch.ones(1, 10), cu)):
    with rollbuf.check_finite():
        try:
            f()
        except ValueError as e:
            assert "cu_seqlens" in str(e), e
        else:
            raise AssertionError("no error under check_finite")
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stdout, p.stderr[-2000:])


def test_packed_segments_edges():
    """Tokens before cu_seqlens[0] and after cu_seqlens[-1] belong to no sequence; empty sequences
    and cu_seqlens[-1] == total are fine; cu_seqlens[0] > 0 is allowed (not NaN)."""
    r = torch.arange(1.0, 9.0)
    for cu, want in [([0, 8], [36.0]), ([3, 3, 3], [0.0, 0.0]), ([0], []), ([1, 1, 5, 8], [0.0, 14.0, 21.0]),
                     ([0, 0, 0, 2], [0.0, 0.0, 3.0])]:
        c = torch.tensor(cu, dtype=torch.int32)
        assert G.sequence_scores(r, c).tolist() == want
        assert G.sequence_scores(r.view(1, 8), c.long()).tolist() == want
        v = torch.arange(1.0, len(cu))
        tok = G.to_tokens(v, torch.ones(8), c)
        exp = [next((float(k) for k in range(1, len(cu)) if cu[k - 1] <= t < cu[k]), 0.0) for t in range(8)]
        assert tok.tolist() == exp


def test_packed_argument_errors():
    r, cu = torch.arange(8.0).view(1, 8), torch.tensor([0, 3, 8])
    with pytest.raises(TypeError, match="cu_seqlens"):
        G.sequence_scores(r, cu.float())
    with pytest.raises(TypeError, match="cu_seqlens"):
        G.to_tokens(torch.ones(2), torch.ones(1, 8), cu.float())
    with pytest.raises(ValueError, match="cu_seqlens"):
        G.sequence_scores(r, cu.view(1, 3))
    with pytest.raises(ValueError, match="cu_seqlens"):
        G.sequence_scores(r, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="token_level_rewards"):  # [B, L] with B > 1 is not a packed row
        G.sequence_scores(r.view(2, 4), cu)
    with pytest.raises(ValueError, match="values"):  # one value per sequence: 2 here
        G.to_tokens(torch.ones(3), torch.ones(1, 8), cu)
    with pytest.raises(ValueError, match="mask"):
        G.to_tokens(torch.ones(2), torch.ones(2, 4), cu)


def _loop_whiten(x, m):
    vals = [float(a) for a, k in zip(x.flatten(), m.flatten()) if k]
    n = len(vals)
    mean = sum(vals) / n
    var = sum((a - mean) ** 2 for a in vals) / (n - 1)
    return (x.double() - mean) / math.sqrt(var + 1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_whiten(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 9, generator=g) * 4 + 2).to(dtype)
    m = torch.rand(6, 9, generator=g) > 0.4
    m[2] = False  # an all-masked row
    xn = x.clone()
    xn[~m] = float("nan")  # masked-out entries never enter the statistics
    got = G.masked_whiten(xn, m.long())
    assert got.dtype == dtype
    torch.testing.assert_close(got[m].double(), _loop_whiten(x, m)[m], rtol=1e-2 if dtype != torch.float32 else 1e-5,
                               atol=1e-2 if dtype != torch.float32 else 1e-5)
    rows = torch.randn(6, generator=g).to(dtype)  # a row value counted once per masked-in token of its row
    tok = G.masked_whiten(rows.unsqueeze(-1).expand(6, 9).contiguous(), m)
    torch.testing.assert_close(G.to_tokens(G.masked_whiten(rows, m), m), tok * m)
    assert G.masked_whiten(x, m, shift_mean=False).float().mean() != got[m].float().mean()
    one = torch.zeros(6, 9, dtype=torch.bool)
    one[0, 0] = True
    assert G.masked_whiten(x, one).isnan().all()  # fewer than two masked-in tokens: NaN


def test_no_host_read_of_a_value():
    """Meta tensors have no data: any .item(), bool(), nonzero or data-sized op raises."""
    b, L = 12, 7
    x = torch.empty(b, device="meta")
    ids, n = G.group_ids(torch.empty(b, dtype=torch.int64, device="meta"))
    s = G.group_stats(x, ids, n, torch.empty(b, device="meta"))
    assert all(v.shape == (b,) for v in s)
    mask = torch.empty(b, L, dtype=torch.bool, device="meta")
    assert G.to_tokens(s.mean, mask).shape == (b, L)
    assert G.masked_whiten(torch.empty(b, L, device="meta"), mask).shape == (b, L)
    assert G.masked_whiten(x, mask).shape == (b,)
    assert G.sequence_scores(torch.empty(b, L, device="meta")).shape == (b,)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    assert G.to_tokens(torch.empty(3, device="meta"), torch.empty(1, 20, device="meta"), cu).shape == (1, 20)


# ---------------------------------------------------------------- over a process group (gloo, 2 ranks)


def _worker(rank, world, init_file, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        x, m, labels, w = _sharded_inputs()
        mine = slice(rank * 5, rank * 5 + 5)
        ids, n = G.group_ids(labels)  # the same labels on every rank: the same ids
        got = {"whiten": G.masked_whiten(x[mine], m[mine], group=dist.group.WORLD),
               "stats": G.group_stats(x[mine, 0], ids[mine], n, w[mine], group=dist.group.WORLD)}
        torch.save(got, f"{out}.{rank}")
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _sharded_inputs():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10, 6, generator=g)
    m = torch.rand(10, 6, generator=g) > 0.3
    return x, m, np.array(list("abcabcabdd")), torch.rand(10, generator=g)


def test_over_a_process_group(tmp_path):
    import torch.multiprocessing as mp

    method = "fork" if sys.platform == "linux" else "spawn"
    mp.start_processes(_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "out")), nprocs=2, join=True,
                       start_method=method)
    parts = [torch.load(tmp_path / f"out.{r}", weights_only=False) for r in range(2)]
    x, m, labels, w = _sharded_inputs()
    torch.testing.assert_close(torch.cat([p["whiten"] for p in parts]), G.masked_whiten(x, m))
    whole = G.group_stats(x[:, 0], *G.group_ids(labels), w)
    for k in FIELDS:
        torch.testing.assert_close(torch.cat([getattr(p["stats"], k) for p in parts]), getattr(whole, k), msg=k)


# ---------------------------------------------------------------- the Triton kernel (rollbuf/kernels/group_stats.py)


def _same(got, want, exact=False, tol=1e-12):
    """NaN where ``want`` is NaN, ±inf where it is, else equal (``exact``) or close."""
    got, want = got.cpu().double(), want.cpu().double()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (got, want)
    ok = want.isfinite()
    assert torch.equal(got[~ok].nan_to_num(), want[~ok].nan_to_num()), (got, want)
    if exact:
        assert torch.equal(got[ok], want[ok]), (got, want)
    else:
        torch.testing.assert_close(got[ok], want[ok], rtol=tol, atol=tol)


def _both(x, ids, w=None):
    """The kernel's and the torch path's statistics of the same inputs (on DEV)."""
    x, ids = x.to(DEV), ids.to(DEV)
    w = None if w is None else w.to(DEV)
    n = int(ids.max()) + 1 if ids.numel() else 0
    return G.group_stats(x, ids, n, w, backend="triton"), G.group_stats(x, ids, n, w, backend="torch")


def _gappy_ids(labels):
    """Labels → ids with gaps (group k gets id 3k + 1), in the labels' (shuffled) order."""
    return G.group_ids(labels)[0] * 3 + 1


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("b", [1, 2, 7, 37, 129])
def test_kernel_equals_torch_and_the_loop(b, dtype):
    """Random groups (singletons, pairs, up to 8), binary scores, unsorted ids with gaps, weights
    with zero-sum groups: the kernel against the torch path and the float64 loop."""
    labels, g = _random_groups(b, b)
    labels = labels[:b]
    x = torch.tensor(g.normal(size=b) * 3 + 1).to(dtype)
    x[: b // 3] = torch.tensor(g.integers(0, 2, b // 3), dtype=dtype)
    w = torch.tensor(g.integers(0, 3, b) * g.integers(0, 2, b), dtype=torch.float32)
    ids = _gappy_ids(labels)
    got, ref = _both(x, ids, w)
    want = loop_stats(x.double(), list(labels), w)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for k in FIELDS:
        assert getattr(got, k).dtype == getattr(ref, k).dtype and getattr(got, k).device.type == DEV
        _same(getattr(got, k), getattr(ref, k), tol=tol)
        torch.testing.assert_close(getattr(got, k).cpu().double(), want[k], rtol=tol, atol=tol, msg=k)
    got_nw, ref_nw = _both(x, ids)
    for k in FIELDS:
        _same(getattr(got_nw, k), getattr(ref_nw, k), tol=tol)


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_kernel_zero_spread_is_exact(dtype):
    """Equal members: mean their value, std and loo_std exactly 0; a sample whose others are all
    equal: loo_std exactly 0, loo_mean exactly their value (as the maximum and as the minimum)."""
    parts, ids, odd, at = [], [], [], 0
    for k, (v, n) in enumerate([(0.1, 2), (1 / 3, 3), (-7.3, 7), (1e4, 5)]):
        parts.append(torch.full((n,), v))
        ids, at = ids + [2 * k] * n, at + n
    for k, (o, rest, n) in enumerate([(1.0, 0.3, 4), (-3.0, 0.7, 5), (0.75, 0.0, 3), (2.0, 0.1, 9)]):
        t = torch.full((n,), rest)
        t[n // 2] = o
        parts.append(t)
        ids, odd, at = ids + [2 * k + 9] * n, odd + [at + n // 2], at + n
    x, ids = torch.cat(parts).to(dtype), torch.tensor(ids)
    got, ref = _both(x, ids)
    for k in FIELDS:
        _same(getattr(got, k), getattr(ref, k), tol=1e-12 if dtype == torch.float64 else 2e-6)
    eq, odd = ids < 9, torch.tensor(odd)
    xs = x.to(got.mean.dtype).to(DEV)
    assert (got.std[eq] == 0).all() and (got.loo_std[eq] == 0).all() and (got.mean[eq] == xs[eq]).all()
    assert (got.loo_mean[eq] == xs[eq]).all() and (got.top2_gap[eq] == 0).all()
    assert (got.loo_std[odd] == 0).all() and (got.loo_mean[odd] == xs[odd - 1]).all()
    assert (got.loo_std[odd - 1] > 0).all()


@pytest.mark.interpret
def test_kernel_non_finite_scores():
    """NaN and ±inf scores: every statistic as the torch path's, group by group (size 1, 2, 3)."""
    nan, inf = math.nan, math.inf
    x = torch.tensor([nan, 1.0, nan, 2.0, inf, 1.0, 2.0, -inf, 3.0, inf, inf, 5.0, -inf, -inf, 4.0, nan, nan])
    ids = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 5, 6, 7, 7, 7, 8, 8])
    for w in (None, torch.tensor([0.0, 1, 0, 2, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1])):
        got, ref = _both(x, ids, w)
        for k in FIELDS:
            _same(getattr(got, k), getattr(ref, k), exact=True)


@pytest.mark.interpret
def test_kernel_errors_and_empty():
    x, ids = torch.zeros(3, device=DEV), torch.zeros(3, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="group"):
        G.group_stats(x, ids, 1, group=object(), backend="triton")
    with pytest.raises(ValueError, match="ids"):
        G.group_stats(x, ids[:2], 1, backend="triton")
    with pytest.raises(ValueError, match="weights must have shape"):
        G.group_stats(x, ids, 1, torch.ones(2, device=DEV), backend="triton")
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match="ids must be on the scores' device"):
            G.group_stats(x, ids.to("meta"), 1, backend=backend)
        with pytest.raises(ValueError, match="weights must be on the scores' device"):
            G.group_stats(x, ids, 1, torch.ones(3, device="meta"), backend=backend)
    s = G.group_stats(x[:0], ids[:0], 0, backend="triton")
    assert all(v.shape == (0,) for v in s)


def test_kernel_on_cpu_without_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        G.group_stats(torch.zeros(2), torch.zeros(2, dtype=torch.int64), 1, backend="triton")
    assert G.group_stats(torch.zeros(2), torch.zeros(2, dtype=torch.int64), 1).size.tolist() == [2, 2]  # auto


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_kernel_outcome_advantages(dtype):
    """Every estimator through the kernel (GRPO, Dr. GRPO and vectorized RLOO fused in float32:
    bitwise the torch path's) against the torch path."""
    labels, g = _random_groups(5, 37)
    x = torch.tensor(g.normal(size=labels.size)).to(dtype).to(DEV)
    x[:4] = 1.0
    n = torch.tensor(g.integers(1, 9, labels.size), dtype=torch.float32, device=DEV)
    for est in G.OUTCOME_ESTIMATORS:
        if est == "grpo_passk":
            continue
        for norm in (True, False):
            kw = dict(norm_adv_by_std_in_grpo=norm)
            got = G.outcome_advantages(x, labels, n, est, backend="triton", **kw)
            want = G.outcome_advantages(x, labels, n, est, backend="torch", **kw)
            assert got.dtype == want.dtype, est
            fused = est in ("grpo", "dr_grpo", "rloo_vectorized") and dtype != torch.float64
            _same(got, want, exact=fused, tol=1e-12 if dtype == torch.float64 else 1e-5)


@pytest.mark.gpu
def test_kernel_reads_no_value_back():
    """On CUDA the kernel path (sort, launch; the fused GRPO and RLOO) makes no host sync."""
    x = torch.randn(300, device="cuda")
    idx = torch.randint(0, 40, (300,), device="cuda")
    ids, n = G.group_ids(idx)
    calls = [lambda: G.group_stats(x, ids, n, x.abs(), backend="auto"),
             lambda: G.group_stats(x.double(), ids, n, backend="triton")]
    calls += [lambda e=e: G.outcome_advantages(x, idx, None, e, backend="triton") for e in ("grpo", "rloo_vectorized")]
    for call in calls:
        call()  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode(0)


# ------------------------------------------------ the kernel's group layouts: made on the host, or one device sort


def _layout_batch(seed, b, min_size=1):
    """``b`` samples or a few more in shuffled groups of 1 to 17 members (``min_size`` up; 17 spans
    two of the kernel's member tiles) and the group of each sample; scores (float64) with groups
    that are normal, binary, all equal, all equal but one (above or below), holding a NaN, holding
    ±inf; weights with groups of total weight 0."""
    g = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < b:
        sizes.append(max(min_size, int(g.choice([1, 1, 2, 3, 5, 8, 17]))))
    parts = []
    for k, n in enumerate(sizes):
        v = g.normal(size=n) * 3 + 1
        if k % 7 == 1:
            v = g.integers(0, 2, n).astype(float)
        elif k % 7 == 2:
            v = np.full(n, g.choice([0.1, 1 / 3, -7.3]))
        elif k % 7 == 3:
            v = np.full(n, 0.3)
            v[n // 2] = g.choice([1.0, -3.0])
        elif k % 7 == 4:
            v[n // 2] = math.nan
        elif k % 7 == 5:
            v[n // 2] = g.choice([math.inf, -math.inf])
        parts.append(v)
    perm = g.permutation(sum(sizes))
    group = np.repeat(np.arange(len(sizes)), sizes)[perm]
    w = (g.integers(0, 3, group.size) * (group % 5 != 0)).astype(np.float32)  # every fifth group: total weight 0
    return np.concatenate(parts)[perm], group, w


def _numpy_labels(group, kind):
    """NumPy labels of the groups: strings, ints (negative and beyond 2^31) or mixed types."""
    if kind == "str":
        return np.array([f"uid-{k}" for k in group])
    if kind == "int":
        return group.astype(np.int64) * 3_000_000_007 - 2**40
    return np.array([int(k) if k % 2 else f"p{k}" for k in group], dtype=object)


def _tensor_labels(group):
    """The same groups as tensors of raw labels: int64 (negative and beyond 2^31), int32 (negative), int16."""
    k = torch.as_tensor(group, dtype=torch.int64)
    return {"int64": k * 3_000_000_007 - 2**40, "int32": (k * 7919 % 100_003 - 50_000).int(), "int16": (k - 99).short()}


def _bits(t):
    """A float tensor's bits, to compare bit for bit (NaN payloads and the sign of 0 too)."""
    t = t.cpu()
    return t.view({torch.float64: torch.int64, torch.float32: torch.int32}.get(t.dtype, torch.int16))


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("labels", ["str", "int", "mixed"])
@pytest.mark.parametrize("seed,b", [(0, 29), (1, 53)])
def test_kernel_group_layouts_agree_bit_for_bit(seed, b, labels, dtype):
    """The kernel's statistics with the host's group layout (no sort), with the ranked ids sorted on
    the device, and with raw tensor labels sorted on the device (int64 beyond 2^31 and negative, int32,
    int16): the same bits; the torch backend's values (bit for bit in float32, where the float64
    sums' order does not show; to 1e-12 in float64)."""
    from rollbuf.kernels import group_stats as K

    xs, group, ws = _layout_batch(seed, b)
    x, w, b = torch.tensor(xs).to(dtype).to(DEV), torch.tensor(ws).to(DEV), xs.size
    index = _numpy_labels(group, labels)
    lay = G.group_layout(index, DEV)
    assert lay.shape == (3, b) and lay.dtype == torch.int32 and lay.device.type == DEV
    ids, n = G.group_ids(index, DEV)
    ref = G.group_stats(x, ids, n, w, backend="torch")
    for weights in (w, None):
        want = K.run(x, None, weights, layout=lay)
        assert want.shape == (7, b)
        for name, got in [("ranked ids", K.run(x, ids, weights))] + [
                (dt, K.run(x, t.to(DEV), weights)) for dt, t in _tensor_labels(group).items()]:
            assert torch.equal(_bits(got), _bits(want)), (name, weights is None)
    stats = G.group_stats(x, ids, n, w, backend="triton")  # the device sort of group_stats' ids
    for k, got in zip(FIELDS, K.run(x, None, w, layout=lay)):
        assert torch.equal(_bits(getattr(stats, k)), _bits(got)), k
        _same(got, getattr(ref, k), exact=dtype != torch.float64, tol=1e-12)


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_outcome_advantages_layouts_agree_bit_for_bit(dtype):
    """Every estimator on the kernel with NumPy indexes (string, int, mixed labels: the host's layout)
    and with tensor indexes (int64 and int32 raw labels: one device sort): the same bits; the torch
    backend's values (bit for bit in float32; to 1e-12 in float64). Groups of one and NaN/inf scores
    included (pass@k: groups of two or more)."""
    for est in G.OUTCOME_ESTIMATORS:
        xs, group, ws = _layout_batch(7, 31, min_size=2 if est == "grpo_passk" else 1)
        x, n = torch.tensor(xs).to(dtype).to(DEV), torch.tensor(ws + 1).to(DEV)
        tensors = _tensor_labels(group)
        for norm in (True, False) if est in ("grpo", "grpo_passk", "gdpo") else (True,):
            kw, found = dict(norm_adv_by_std_in_grpo=norm), {}
            with _sorts_and_copies(found):
                want = G.outcome_advantages(x, _numpy_labels(group, "str"), n, est, backend="triton", **kw)
            assert want.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
            assert found["sorts"] == [], (est, found)  # the host's layout, no device sort
            for name, index in [("int", _numpy_labels(group, "int")), ("mixed", _numpy_labels(group, "mixed")),
                                ("int64", tensors["int64"].to(DEV)), ("int32", tensors["int32"].to(DEV))]:
                with _sorts_and_copies(found):
                    got = G.outcome_advantages(x, index, n, est, backend="triton", **kw)
                assert len(found["sorts"]) == (name in tensors), (est, name, found)  # one device sort of a tensor
                assert torch.equal(_bits(got), _bits(want)), (est, norm, name)
            ref = G.outcome_advantages(x, _numpy_labels(group, "str"), n, est, backend="torch", **kw)
            _same(want, ref, exact=dtype != torch.float64, tol=1e-12)


def test_group_layout():
    """The layout against a loop: row 0 the samples group by group (each group's in ascending sample
    order), rows 1 and 2 each sample's group's start in row 0 and its size; the groups of group_ids."""
    for index in (np.array(["b", "a", "b", "c", "a", "b"]), [10**12, 7, 10**12, -3],
                  np.array([1, "1", "x", 2, "x"], dtype=object), np.array(["only"])):
        lay = G.group_layout(index)
        ids = G.group_ids(index)[0].tolist()
        assert lay.dtype == torch.int32 and lay.shape == (3, len(ids))
        perm, start, size = lay.tolist()
        assert perm == sorted(range(len(ids)), key=lambda i: (ids[i], i))
        for i, g in enumerate(ids):
            members = [j for j in range(len(ids)) if ids[j] == g]
            assert perm[start[i]:start[i] + size[i]] == members, (index, i)
    assert G.group_layout(np.array([], dtype=object)).shape == (3, 0)
    g = np.random.default_rng(0)
    for groups in (300, 2**16, 2**16 + 1, 90_000):  # up to 2^16 groups the ranks are sorted as uint16
        labels = g.permutation(np.repeat(np.arange(groups) * 7 - 5, g.integers(1, 4, groups)))
        ids = G.group_ids(labels)[0].numpy()
        assert ids.max() + 1 == groups
        perm, start, size = G.group_layout(labels).numpy()
        assert (perm == np.lexsort((np.arange(ids.size), ids))).all()  # by group, then by sample
        sizes = np.bincount(ids)
        assert (size == sizes[ids]).all() and (start == (np.cumsum(sizes) - sizes)[ids]).all()
    with pytest.raises(TypeError, match="index"):
        G.group_layout(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="index"):
        G.group_layout(np.zeros((2, 2)))


@pytest.mark.interpret
def test_kernel_layout_errors():
    from rollbuf.kernels import group_stats as K

    x = torch.zeros(3, device=DEV)
    lay = G.group_layout(["a", "b", "a"], DEV)
    for bad in (lay[:, :2], lay[:2], lay.float(), lay.to("meta"), lay.tolist()):
        with pytest.raises(ValueError, match="layout"):
            K.run(x, None, layout=bad)
    with pytest.raises(ValueError, match="ids"):
        K.run(x, None)
    with pytest.raises(ValueError, match="ids"):
        K.run(x, torch.zeros(3, device=DEV))
    assert torch.equal(K.run(x, None, layout=lay.long()), K.run(x, None, layout=lay))


_SORTS = {"sort", "argsort", "msort", "_unique", "_unique2", "unique_dim", "unique_consecutive", "topk", "kthvalue"}


@contextlib.contextmanager
def _sorts_and_copies(found: dict):
    """Records, while on: the key dtype of each sort-like aten op (``found["sorts"]``), each copy from
    the host to another device (``found["h2d"]``) and the shape of each tensor that rollbuf's code
    builds from host data (``found["built"]``: ``torch.from_numpy``, ``as_tensor``, ``tensor``,
    ``asarray``; on CUDA each is a host-to-device copy)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import rollbuf

    package = os.path.dirname(rollbuf.__file__) + os.sep
    found.update(sorts=[], h2d=[], built=[])

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in _SORTS:
                found["sorts"].append(args[0].dtype)
            elif name in ("_to_copy", "copy_") and isinstance(out, torch.Tensor) and out.device.type != "cpu" \
                    and any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args):
                found["h2d"].append(tuple(out.shape))
            return out

    def wrap(real):
        def build(*args, **kw):
            out = real(*args, **kw)
            if sys._getframe(1).f_code.co_filename.startswith(package):
                found["built"].append(tuple(out.shape))
            return out
        return build

    with contextlib.ExitStack() as stack:
        for name in ("from_numpy", "as_tensor", "tensor", "asarray"):
            stack.enter_context(mock.patch.object(torch, name, wrap(getattr(torch, name))))
        stack.enter_context(Recorder())
        yield


@pytest.mark.interpret
def test_kernel_path_sorts_once_at_most():
    """On the kernel: a NumPy index makes no device sort and one host-to-device copy, of its [3, B]
    layout; a tensor index one sort (of its raw labels, int32 kept as int32) and no copy; group_stats'
    ids one sort (as before)."""
    labels, g = _random_groups(4, 23)
    x = torch.tensor(g.normal(size=labels.size), dtype=torch.float32, device=DEV)
    n = torch.full_like(x, 3.0)
    b, found = labels.size, {}
    for est, dtype in (("grpo", torch.float32), ("rloo", torch.float32), ("opo", torch.float64)):
        with _sorts_and_copies(found):
            G.outcome_advantages(x.to(dtype), labels, n, est, backend="triton")
        assert found["sorts"] == [] and found["built"] == [(3, b)], (est, found)
        assert found["h2d"] == ([(3, b)] if DEV == "cuda" else []), (est, found)
        tensor = G.group_ids(labels, DEV)[0]
        for t in (tensor, tensor.int() - 5, tensor.short()):
            with _sorts_and_copies(found):
                G.outcome_advantages(x.to(dtype), t, n, est, backend="triton")
            key = torch.int32 if t.dtype != torch.int64 else torch.int64
            assert found["sorts"] == [key] and found["built"] == [] and found["h2d"] == [], (est, t.dtype, found)
    with _sorts_and_copies(found):
        G.group_stats(x, tensor, b, backend="triton")
    assert found["sorts"] == [torch.int64] and found["built"] == [], found


def test_pass_at_k_counts_the_groups_once(monkeypatch):
    """pass@k's check of its groups' sizes reads the groups that the statistics use (one grouping of
    the labels: np.unique of numbers, one hashing pass (np.fromiter) of strings, mixed types compared
    as strings, as group_ids does), with the same error."""
    x = torch.zeros(4)
    calls = []

    def counted(real):
        def fn(*args, **kw):
            calls.append(1)
            return real(*args, **kw)
        return fn

    monkeypatch.setattr(np, "unique", counted(np.unique))
    monkeypatch.setattr(np, "fromiter", counted(np.fromiter))
    for index in (["a", "b", "a", "b"], np.array([1, "1", "x", "x"], dtype=object), np.array([5, 5, 6, 6])):
        calls.clear()
        G.outcome_advantages(x, index, None, "grpo_passk")
        assert len(calls) == 1, index
    for index in (["a", "b", "a", "c"], np.array([1, "1", "x", 2], dtype=object)):
        with pytest.raises(ValueError, match="index: pass@k needs at least 2 samples per group"):
            G.outcome_advantages(x, index, None, "grpo_passk")
