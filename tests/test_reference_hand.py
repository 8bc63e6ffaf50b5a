"""Hand-computed checks of the float64 oracle ``rollbuf.reference`` (SPEC §1-2).

Every expected number below was worked out by hand in the comments; nothing is produced by calling
the functions under test (identity tests compare two outputs, but against hand numbers too).

Shared rollout for the T = 4 cases (γ = 0.5 everywhere, λ = 0.5 unless said otherwise):

    t       0   1   2   3
    r       1   2   3   4
    V       2   4   6   8
    q       3   5   7   9        Q(s_t, a_t), Retrace only
    ratio   2  .5   1  .25       exp(target - behaviour); behaviour log-probs are 0

With ρ̄ = c̄ = 1, λ = 1 (V-trace, Retrace cases): ρ = c = min(1, ratio) = [1, .5, 1, .25].
Unread bootstrap slots are NaN in every case, so any leak would show.
"""

import math
from dataclasses import dataclass, field

import pytest
import torch
from torch.testing import assert_close

from rollbuf import reference as ref

NAN = float("nan")
G = 0.5  # gamma
TOL = dict(rtol=1e-12, atol=1e-12)


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def _flags(*rows):  # "0100" -> [[False, True, False, False]]
    return torch.tensor([[c == "1" for c in s] for s in rows])


def _log(*rows):
    return _rows(*[[math.log(x) if x == x else NAN for x in row] for row in rows])


@dataclass
class Case:
    rewards: torch.Tensor
    values: torch.Tensor
    q_values: torch.Tensor
    ratio: torch.Tensor  # log-probs are behaviour 0, target log(ratio)
    terminated: torch.Tensor = None
    truncated: torch.Tensor = None
    bootstrap_values: torch.Tensor = None
    mask: torch.Tensor = None
    window_end: str = "bootstrap"
    exp: dict = field(default_factory=dict)

    def common(self):
        return dict(rewards=self.rewards, values=self.values, terminated=self.terminated,
                    truncated=self.truncated, bootstrap_values=self.bootstrap_values, mask=self.mask,
                    window_end=self.window_end)

    def log_probs(self):
        lp = torch.zeros_like(self.rewards)
        lp[self.ratio.isnan()] = NAN  # garbage exactly where the ratio is garbage (masked)
        return lp, _log(*self.ratio.tolist())


R4, V4, Q4, RATIO4 = _rows([1, 2, 3, 4]), _rows([2, 4, 6, 8]), _rows([3, 5, 7, 9]), _rows([2, .5, 1, .25])

# ---- terminated at t=1; window end t=3 bootstraps from 16.
# V' = [V_1=4, 0 (terminal), V_3=8, 16]; k = [0,1,0,0]; d = [0,1,0,1]
# δ = [1+2-2, 2-4, 3+4-6, 4+8-8] = [1, -2, 1, 4]
# GAE (γλ=.25): A3 = 4; A2 = 1+.25*4 = 2; A1 = -2; A0 = 1+.25*(-2) = .5
# TD(λ): G3 = 4+.5*16 = 12; G2 = 3+.5(.5*8+.5*12) = 8; G1 = 2; G0 = 1+.5(.5*4+.5*2) = 2.5
# TD(1): G3 = 12; G2 = 3+.5*12 = 9; G1 = 2; G0 = 1+.5*2 = 2
# MC:    G3 = 4;  G2 = 3+.5*4 = 5;   G1 = 2; G0 = 2
# V-trace: u3 = .25*4 = 1; u2 = 1+.5*1*1 = 1.5; u1 = .5*(-2) = -1; u0 = 1+.5*1*(-1) = .5
#   vs = V+u = [2.5, 3, 7.5, 9]
#   pg0 = 1*(1+.5*vs1-2) = .5; pg1 = .5*(2-4) = -1; pg2 = 3+.5*9-6 = 1.5; pg3 = .25*(4+8-8) = 1
# Retrace (c = [1,.5,1,.25]): Q3 = 4+.5*16 = 12; Q2 = 3+.5(8+c3(12-9)) = 3+.5*8.75 = 7.375;
#   Q1 = 2 (terminal); Q0 = 1+.5(4+c1(2-5)) = 1+.5*2.5 = 2.25
TERMINATED = Case(R4, V4, Q4, RATIO4, terminated=_flags("0100"), bootstrap_values=_rows([NAN, NAN, NAN, 16]),
                  exp=dict(delta=[1, -2, 1, 4], adv=[.5, -2, 2, 4], tdl=[2.5, 2, 8, 12], td1=[2, 2, 9, 12],
                           mc=[2, 2, 5, 4], vs=[2.5, 3, 7.5, 9], pg=[.5, -1, 1.5, 1],
                           retrace=[2.25, 2, 7.375, 12]))

# ---- truncated at t=1 with V(s'_1) = 10; window end bootstraps from 16.
# V' = [4, 10, 8, 16]; d = [0,1,0,1]; δ = [1, 2+5-4, 1, 4] = [1, 3, 1, 4]
# GAE: A3 = 4; A2 = 2; A1 = 3; A0 = 1+.25*3 = 1.75
# TD(λ): G3 = 12; G2 = 8; G1 = 2+.5*10 = 7; G0 = 1+.5(.5*4+.5*7) = 3.75
# TD(1): G1 = 7; G0 = 1+.5*7 = 4.5 -> [4.5, 7, 9, 12];  MC (truncation cuts): [2, 2, 5, 4]
# V-trace: u3 = 1; u2 = 1.5; u1 = .5*3 = 1.5; u0 = 1+.5*1.5 = 1.75 -> vs = [3.75, 5.5, 7.5, 9]
#   pg0 = 1+.5*5.5-2 = 1.75; pg1 = .5*(2+.5*10-4) = 1.5; pg2 = 1.5; pg3 = 1
# Retrace: Q3 = 12; Q2 = 7.375; Q1 = 2+.5*10 = 7; Q0 = 1+.5(4+.5(7-5)) = 3.5
TRUNCATED = Case(R4, V4, Q4, RATIO4, truncated=_flags("0100"), bootstrap_values=_rows([NAN, 10, NAN, 16]),
                 exp=dict(delta=[1, 3, 1, 4], adv=[1.75, 3, 2, 4], tdl=[3.75, 7, 8, 12], td1=[4.5, 7, 9, 12],
                          mc=[2, 2, 5, 4], vs=[3.75, 5.5, 7.5, 9], pg=[1.75, 1.5, 1.5, 1],
                          retrace=[3.5, 7, 7.375, 12]))

# ---- terminated and truncated at t=1: terminated wins, the NaN bootstrap at t=1 is not read -> as TERMINATED.
BOTH = Case(R4, V4, Q4, RATIO4, terminated=_flags("0100"), truncated=_flags("0100"),
            bootstrap_values=_rows([NAN, NAN, NAN, 16]), exp=TERMINATED.exp)

# ---- no flags, the window end bootstraps from 16.
# V' = [4, 6, 8, 16]; d = [0,0,0,1]; δ = [1+2-2, 2+3-4, 3+4-6, 4+8-8] = [1, 1, 1, 4]
# GAE: A3 = 4; A2 = 1+1 = 2; A1 = 1+.5 = 1.5; A0 = 1+.375 = 1.375
# TD(λ): G3 = 12; G2 = 8; G1 = 2+.5(.5*6+.5*8) = 5.5; G0 = 1+.5(.5*4+.5*5.5) = 3.375
# TD(1): G3 = 12; G2 = 9; G1 = 2+4.5 = 6.5; G0 = 1+3.25 = 4.25
# MC:    G3 = 4;  G2 = 5; G1 = 2+2.5 = 4.5; G0 = 1+2.25 = 3.25
# V-trace: u3 = 1; u2 = 1+.5*1 = 1.5; u1 = .5*1+.5*.5*1.5 = .875; u0 = 1+.5*.875 = 1.4375
#   vs = [3.4375, 4.875, 7.5, 9]
#   pg0 = 1+.5*4.875-2 = 1.4375; pg1 = .5(2+.5*7.5-4) = .875; pg2 = 3+4.5-6 = 1.5; pg3 = .25*4 = 1
# Retrace: Q3 = 12; Q2 = 7.375; Q1 = 2+.5(6+1*(7.375-7)) = 5.1875; Q0 = 1+.5(4+.5(5.1875-5)) = 3.046875
_END_EXP = dict(delta=[1, 1, 1, 4], adv=[1.375, 1.5, 2, 4], tdl=[3.375, 5.5, 8, 12], td1=[4.25, 6.5, 9, 12],
                mc=[3.25, 4.5, 5, 4], vs=[3.4375, 4.875, 7.5, 9], pg=[1.4375, .875, 1.5, 1],
                retrace=[3.046875, 5.1875, 7.375, 12])
WINDOW_END = Case(R4, V4, Q4, RATIO4, bootstrap_values=_rows([NAN, NAN, NAN, 16]), exp=_END_EXP)
# Same with [N] bootstrap values (the window-end column only).
WINDOW_END_N = Case(R4, V4, Q4, RATIO4, bootstrap_values=torch.tensor([16.0], dtype=torch.float64), exp=_END_EXP)

# ---- window_end="terminal": the last step is terminal, no bootstrap values at all.
# V' = [4, 6, 8, 0]; k3 = 1; δ = [1, 1, 1, 4-8] = [1, 1, 1, -4]
# GAE: A3 = -4; A2 = 1-1 = 0; A1 = 1; A0 = 1+.25 = 1.25
# TD(λ): G3 = 4; G2 = 3+.5(.5*8+.5*4) = 6; G1 = 2+.5(.5*6+.5*6) = 5; G0 = 1+.5(.5*4+.5*5) = 3.25
# TD(1) = MC: G3 = 4; G2 = 5; G1 = 4.5; G0 = 3.25
# V-trace: u3 = .25*(-4) = -1; u2 = 1+.5*(-1) = .5; u1 = .5+.5*.5*.5 = .625; u0 = 1+.5*.625 = 1.3125
#   vs = [3.3125, 4.625, 6.5, 7]
#   pg0 = 1+.5*4.625-2 = 1.3125; pg1 = .5(2+.5*6.5-4) = .625; pg2 = 3+.5*7-6 = .5; pg3 = .25(4-8) = -1
# Retrace: Q3 = 4; Q2 = 3+.5(8+.25(4-9)) = 6.375; Q1 = 2+.5(6+(6.375-7)) = 4.6875;
#   Q0 = 1+.5(4+.5(4.6875-5)) = 2.921875
_TERMINAL_EXP = dict(delta=[1, 1, 1, -4], adv=[1.25, 1, 0, -4], tdl=[3.25, 5, 6, 4], td1=[3.25, 4.5, 5, 4],
                     mc=[3.25, 4.5, 5, 4], vs=[3.3125, 4.625, 6.5, 7], pg=[1.3125, .625, .5, -1],
                     retrace=[2.921875, 4.6875, 6.375, 4])
TERMINAL = Case(R4, V4, Q4, RATIO4, window_end="terminal", exp=_TERMINAL_EXP)
# window_end="terminal" decides only an unflagged window end: a last step the caller flagged truncated
# still bootstraps from its own bootstrap value (16) -> the numbers of WINDOW_END (MC cuts either way).
TERMINAL_TRUNC = Case(R4, V4, Q4, RATIO4, truncated=_flags("0001"), bootstrap_values=_rows([NAN, NAN, NAN, 16]),
                      window_end="terminal", exp=_END_EXP)
# A NaN window-end bootstrap value is not read when the window end is terminal.
TERMINAL_NAN = Case(R4, V4, Q4, RATIO4, bootstrap_values=_rows([NAN, NAN, NAN, NAN]), window_end="terminal",
                    exp=_TERMINAL_EXP)

# ---- mask [1,0,1,1,0]: masked step in the middle (t=1) and at the end (t=4); NaN garbage and set flags
# there. Row 2 is fully masked (all NaN) -> all zeros. Window end = t=3, bootstraps from 12.
# Compacted row (t = 0, 2, 3): r = [1,2,3], V = [2,4,6], q = [3,5,7], ratio = [2,.5,1] -> c = [1,.5,1]
# V' = [4, 6, 12]; d = [0,0,1]; δ = [1+2-2, 2+3-4, 3+6-6] = [1, 1, 3]
# GAE: A2 = 3; A1 = 1+.75 = 1.75; A0 = 1+.25*1.75 = 1.4375
# TD(λ): G2 = 3+6 = 9; G1 = 2+.5(.5*6+.5*9) = 5.75; G0 = 1+.5(.5*4+.5*5.75) = 3.4375
# TD(1): G2 = 9; G1 = 2+4.5 = 6.5; G0 = 1+3.25 = 4.25;  MC: G2 = 3; G1 = 3.5; G0 = 2.75
# V-trace: u2 = 3; u1 = .5*1+.5*.5*3 = 1.25; u0 = 1+.5*1.25 = 1.625 -> vs = [3.625, 5.25, 9]
#   pg0 = 1+.5*5.25-2 = 1.625; pg1 = .5(2+.5*9-4) = 1.25; pg2 = 3+6-6 = 3
# Retrace (c_{t+1} is the next UNMASKED step's trace): Q2 = 3+.5*12 = 9; Q1 = 2+.5(6+1*(9-7)) = 6;
#   Q0 = 1+.5(4+.5(6-5)) = 3.25
_MASK = dict(
    rewards=_rows([1, NAN, 2, 3, NAN], [NAN] * 5), values=_rows([2, NAN, 4, 6, NAN], [NAN] * 5),
    q_values=_rows([3, NAN, 5, 7, NAN], [NAN] * 5), ratio=_rows([2, NAN, .5, 1, NAN], [NAN] * 5),
    terminated=_flags("01000", "11111"), truncated=_flags("01001", "00000"), mask=_flags("10110", "00000"),
    exp=dict(delta=[[1, 0, 1, 3, 0], [0] * 5], adv=[[1.4375, 0, 1.75, 3, 0], [0] * 5],
             tdl=[[3.4375, 0, 5.75, 9, 0], [0] * 5], td1=[[4.25, 0, 6.5, 9, 0], [0] * 5],
             mc=[[2.75, 0, 3.5, 3, 0], [0] * 5], vs=[[3.625, 0, 5.25, 9, 0], [0] * 5],
             pg=[[1.625, 0, 1.25, 3, 0], [0] * 5], retrace=[[3.25, 0, 6, 9, 0], [0] * 5]))
MASKED = Case(bootstrap_values=_rows([NAN, NAN, NAN, 12, NAN], [NAN] * 5), **_MASK)
MASKED_N = Case(bootstrap_values=torch.tensor([12.0, NAN], dtype=torch.float64), **_MASK)


def _stack(a: Case, b: Case) -> Case:
    """Two independent rows (N = 2), both with [N, T] bootstrap values and the same window_end."""
    def cat(x, y, T=4):
        return torch.cat([torch.zeros(1, T, dtype=torch.bool) if x is None else x,
                          torch.zeros(1, T, dtype=torch.bool) if y is None else y])

    return Case(torch.cat([a.rewards, b.rewards]), torch.cat([a.values, b.values]),
                torch.cat([a.q_values, b.q_values]), torch.cat([a.ratio, b.ratio]),
                terminated=cat(a.terminated, b.terminated), truncated=cat(a.truncated, b.truncated),
                bootstrap_values=torch.cat([a.bootstrap_values, b.bootstrap_values]),
                exp={k: [a.exp[k], b.exp[k]] for k in a.exp})


CASES = {
    "terminated": TERMINATED,
    "truncated-bootstrap": TRUNCATED,
    "terminated-wins-over-truncated": BOTH,
    "window-end-bootstrap": WINDOW_END,
    "window-end-bootstrap-[N]": WINDOW_END_N,
    "window-end-terminal": TERMINAL,
    "window-end-terminal-truncated": TERMINAL_TRUNC,
    "window-end-terminal-nan-bootstrap": TERMINAL_NAN,
    "mask-middle-and-end": MASKED,
    "mask-middle-and-end-[N]-bootstrap": MASKED_N,
    "two-rows-terminated|truncated": _stack(TERMINATED, TRUNCATED),
}
cases = pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))


def _expect(case, key):
    e = torch.tensor(case.exp[key], dtype=torch.float64)
    return e.reshape(case.rewards.shape)


# ------------------------------------------------------------------------------ backward estimators


@cases
def test_gae(case):
    adv, ret = ref.gae(**case.common(), gamma=G, lam=.5)
    assert adv.dtype == ret.dtype == torch.float64
    assert_close(adv, _expect(case, "adv"), **TOL)
    # returns = A + V, and 0 at masked steps; by hand these are the TD(λ) numbers
    assert_close(ret, _expect(case, "tdl"), **TOL)


@cases
def test_gae_lambda0_is_td_error(case):
    adv, _ = ref.gae(**case.common(), gamma=G, lam=0.0)
    assert_close(adv, _expect(case, "delta"), **TOL)


@cases
def test_lambda_returns(case):
    assert_close(ref.lambda_returns(**case.common(), gamma=G, lam=.5), _expect(case, "tdl"), **TOL)


@cases
def test_discounted_returns_bootstrapped(case):
    out = ref.discounted_returns(**case.common(), gamma=G, bootstrap=True)
    assert_close(out, _expect(case, "td1"), **TOL)
    # identity: TD(1) = λ-returns with λ = 1
    assert_close(ref.lambda_returns(**case.common(), gamma=G, lam=1.0), _expect(case, "td1"), **TOL)


@cases
def test_discounted_returns_monte_carlo(case):
    kw = case.common() | dict(values=None, bootstrap_values=None)  # unused by Monte Carlo
    assert_close(ref.discounted_returns(**kw, gamma=G, bootstrap=False), _expect(case, "mc"), **TOL)


@cases
def test_vtrace(case):
    lp, tlp = case.log_probs()
    vs, pg = ref.vtrace(**case.common(), policies=(lp, tlp), gamma=G, bars=(1.0, 1.0, None), lam=1.0)
    assert_close(vs, _expect(case, "vs"), **TOL)
    assert_close(pg, _expect(case, "pg"), **TOL)


def test_vtrace_pg_rho_bar():
    # TERMINATED with ρ̄_pg = 2: only pg0 changes, min(2, ratio0 = 2) * .5 = 1 (vs unchanged)
    lp, tlp = TERMINATED.log_probs()
    vs, pg = ref.vtrace(**TERMINATED.common(), policies=(lp, tlp), gamma=G, bars=(1.0, 1.0, 2.0), lam=1.0)
    assert_close(vs, _rows([2.5, 3, 7.5, 9]), **TOL)
    assert_close(pg, _rows([1, -1, 1.5, 1]), **TOL)


def test_vtrace_lambda_scales_c_only():
    # TERMINATED with λ = .5: c = .5*[1,.5,1,.25]; ρ unchanged.
    # u3 = 1; u2 = 1+.5*.5*1 = 1.25; u1 = -1; u0 = 1+.5*.5*(-1) = .75 -> vs = [2.75, 3, 7.25, 9]
    # pg reads vs1 = 3 and vs3 = 9 (unchanged) -> pg = [.5, -1, 1.5, 1]
    lp, tlp = TERMINATED.log_probs()
    vs, pg = ref.vtrace(**TERMINATED.common(), policies=(lp, tlp), gamma=G, bars=(1.0, 1.0, None), lam=.5)
    assert_close(vs, _rows([2.75, 3, 7.25, 9]), **TOL)
    assert_close(pg, _rows([.5, -1, 1.5, 1]), **TOL)


@cases
def test_vtrace_on_policy_is_lambda_returns(case):
    # target == behaviour, ρ̄ = c̄ = 1: ρ = 1, c = λ, so u = GAE advantages and vs = TD(λ) returns
    lp, _ = case.log_probs()
    vs, _ = ref.vtrace(**case.common(), policies=(lp, lp.clone()), gamma=G, bars=(1.0, 1.0, None), lam=.5)
    assert_close(vs, _expect(case, "tdl"), **TOL)
    assert_close(vs, ref.lambda_returns(**case.common(), gamma=G, lam=.5), **TOL)


def test_vtrace_on_policy_pg():
    # WINDOW_END on-policy, λ = .5: vs = [3.375, 5.5, 8, 12]; pg_t = r_t + γ q_t - V_t:
    # pg0 = 1+.5*5.5-2 = 1.75; pg1 = 2+.5*8-4 = 2; pg2 = 3+.5*12-6 = 3; pg3 = 4+.5*16-8 = 4
    lp = torch.zeros(1, 4, dtype=torch.float64)
    _, pg = ref.vtrace(**WINDOW_END.common(), policies=(lp, lp), gamma=G, bars=(1.0, 1.0, None), lam=.5)
    assert_close(pg, _rows([1.75, 2, 3, 4]), **TOL)


@cases
def test_retrace(case):
    lp, tlp = case.log_probs()
    out = ref.retrace(**case.common(), policies=(lp, tlp), q_values=case.q_values, gamma=G,
                      lam=1.0, c_bar=1.0)
    assert_close(out, _expect(case, "retrace"), **TOL)


@cases
def test_retrace_on_policy_huge_c_bar_is_lambda_returns(case):
    # ratio = 1, c̄ huge: c = λ; with q = V the bracket is V'_t + λ(Q_{t+1} - V_{t+1})
    # = (1-λ)V_{t+1} + λ Q_{t+1} for interior steps: TD(λ)
    lp, _ = case.log_probs()
    out = ref.retrace(**case.common(), policies=(lp, lp.clone()), q_values=case.values,
                      gamma=G, lam=.5, c_bar=1e9)
    assert_close(out, _expect(case, "tdl"), **TOL)


@pytest.mark.parametrize(("c_bar", "expected"), [
    # WINDOW_END, λ = 1, ratio = [.5, 2, 4, .5], q = [3,5,7,9], V' = [4, 6, 8, 16]
    # c̄ huge: c = [.5, 2, 4, .5]; Q3 = 12; Q2 = 3+.5(8+.5(12-9)) = 7.75; Q1 = 2+.5(6+4(7.75-7)) = 6.5;
    #   Q0 = 1+.5(4+2(6.5-5)) = 4.5
    (1e9, [4.5, 6.5, 7.75, 12]),
    # c̄ = 1: c = [.5, 1, 1, .5]; Q3 = 12; Q2 = 7.75; Q1 = 2+.5(6+.75) = 5.375; Q0 = 1+.5(4+.375) = 3.1875
    (1.0, [3.1875, 5.375, 7.75, 12]),
], ids=["c_bar-huge", "c_bar-1"])
def test_retrace_c_bar(c_bar, expected):
    lp = torch.zeros(1, 4, dtype=torch.float64)
    out = ref.retrace(**WINDOW_END.common(), policies=(lp, _log([.5, 2, 4, .5])), q_values=Q4,
                      gamma=G, lam=1.0, c_bar=c_bar)
    assert_close(out, _rows(expected), **TOL)


def test_float32_inputs_give_float64():
    c = WINDOW_END
    kw = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in c.common().items()}
    adv, ret = ref.gae(**kw, gamma=G, lam=.5)
    assert adv.dtype == torch.float64 and ret.dtype == torch.float64
    assert_close(adv, _expect(c, "adv"), **TOL)


# ------------------------------------------------------------------------------- forward estimators
# x = [1, 2, 3, 4]; eligibility traces with γλ = .5*.5 = .25; d = terminated or truncated only
# (the window end is not a done for forward recursions).

X4 = _rows([1, 2, 3, 4])

FORWARD = {
    # e0 = 1; e1 = 2+.25 = 2.25; d1 = 1 -> e2 = 3; e3 = 4+.75 = 4.75; final = e3 = 4.75
    # S = [1, 3, 3, 7]; final 7
    "terminated": (dict(terminated=_flags("0100")), [1, 2.25, 3, 4.75], 4.75, [1, 3, 3, 7], 7),
    "truncated": (dict(truncated=_flags("0100")), [1, 2.25, 3, 4.75], 4.75, [1, 3, 3, 7], 7),
    # e = [1, 2.25, 3+.5625 = 3.5625, 4+.890625 = 4.890625]; final = e3 (window end is not done)
    # S = [1, 3, 6, 10]
    "no-done": (dict(), [1, 2.25, 3.5625, 4.890625], 4.890625, [1, 3, 6, 10], 10),
    # done at the last step: final = (1 - 1) e3 = 0
    "done-at-last-step": (dict(terminated=_flags("0001")), [1, 2.25, 3.5625, 4.890625], 0, [1, 3, 6, 10], 0),
    "truncated-at-last-step": (dict(truncated=_flags("0001")), [1, 2.25, 3.5625, 4.890625], 0, [1, 3, 6, 10], 0),
    # initial = 8: e0 = 1+.25*8 = 3; e1 = 2+.75 = 2.75; e2 = 3+.6875 = 3.6875; e3 = 4+.921875 = 4.921875
    # S = [9, 11, 14, 18]
    "initial": (dict(initial=_rows([8])[0]), [3, 2.75, 3.6875, 4.921875], 4.921875, [9, 11, 14, 18], 18),
    # initial = 8 and done at t=0: e0 = 3, then reset: e1 = 2; e2 = 3.5; e3 = 4.875 ; S = [9, 2, 5, 9]
    "initial-then-done": (dict(initial=_rows([8])[0], terminated=_flags("1000")), [3, 2, 3.5, 4.875], 4.875,
                          [9, 2, 5, 9], 9),
}


@pytest.mark.parametrize(("kw", "traces", "tfinal", "sums", "sfinal"), list(FORWARD.values()), ids=list(FORWARD))
def test_forward(kw, traces, tfinal, sums, sfinal):
    kw = dict(terminated=None, truncated=None, mask=None, initial=None) | kw
    e, ef = ref.eligibility_traces(X4, gamma=G, lam=.5, **kw)
    assert_close(e, _rows(traces), **TOL)
    assert_close(ef, torch.tensor([tfinal], dtype=torch.float64), **TOL)
    s, sf = ref.episodic_sums(X4, **kw)
    assert_close(s, _rows(sums), **TOL)
    assert_close(sf, torch.tensor([sfinal], dtype=torch.float64), **TOL)


def test_forward_mask_and_garbage():
    # Row 0: mask [1,0,1,1,0], NaN x and set flags at the masked steps. Compacted x = [1, 2, 3]:
    #   e = [1, 2.25, 3.5625] -> [1, 0, 2.25, 3.5625, 0], final 3.5625; S = [1, 0, 3, 6, 0], final 6
    # Row 1: mask [1,1,0,1,1], terminated at t=1, masked t=2 (NaN): compacted x = [1, 2, 3, 4] with done
    #   after the 2nd kept step: e = [1, 2.25, 3, 4.75]; S = [1, 3, 3, 7]
    # Row 2: fully masked -> zeros, final = initial (here initial = 0 except row 2 = 5)
    x = _rows([1, NAN, 2, 3, NAN], [1, 2, NAN, 3, 4], [NAN] * 5)
    term = _flags("01001", "01100", "11111")
    trunc = _flags("01001", "00000", "11111")
    mask = _flags("10110", "11011", "00000")
    init = _rows(0, 0, 5)
    e, ef = ref.eligibility_traces(x, term, trunc, mask, gamma=G, lam=.5, initial=init)
    assert_close(e, _rows([1, 0, 2.25, 3.5625, 0], [1, 2.25, 0, 3, 4.75], [0] * 5), **TOL)
    assert_close(ef, _rows(3.5625, 4.75, 5), **TOL)
    s, sf = ref.episodic_sums(x, term, trunc, mask, initial=init)
    assert_close(s, _rows([1, 0, 3, 6, 0], [1, 3, 0, 3, 7], [0] * 5), **TOL)
    assert_close(sf, _rows(6, 7, 5), **TOL)


def test_forward_features():
    # x [1, 4, 2]: feature 0 = [1,2,3,4], feature 1 = [10,20,30,40]; terminated at t=1; initial [1, 2]
    # feature 1 = 10 * feature 0, initial 0: e = [10, 22.5, 30, 47.5], final 47.5; S = [10, 30, 30, 70]
    # feature 0 with initial 4: e0 = 1+.25*4 = 2; e1 = 2+.5 = 2.5; e2 = 3; e3 = 4.75
    #   S0 = 1+4 = 5; S1 = 7; S2 = 3; S3 = 7
    x = torch.stack([X4, 10 * X4], dim=-1)
    init = torch.tensor([[4.0, 0.0]], dtype=torch.float64)
    e, ef = ref.eligibility_traces(x, _flags("0100"), None, None, gamma=G, lam=.5, initial=init)
    assert e.shape == (1, 4, 2) and ef.shape == (1, 2)
    assert_close(e, torch.tensor([[[2, 10], [2.5, 22.5], [3, 30], [4.75, 47.5]]], dtype=torch.float64), **TOL)
    assert_close(ef, torch.tensor([[4.75, 47.5]], dtype=torch.float64), **TOL)
    s, sf = ref.episodic_sums(x, _flags("0100"), None, None, initial=init)
    assert_close(s, torch.tensor([[[5, 10], [7, 30], [3, 30], [7, 70]]], dtype=torch.float64), **TOL)
    assert_close(sf, torch.tensor([[7, 70]], dtype=torch.float64), **TOL)


def test_forward_final_chains_windows():
    # final is the next window's initial: splitting x = [1,2,3,4] (terminated at 1) into [1,2] | [3,4]
    # window 1: e = [1, 2.25], final = (1-1)*2.25 = 0; window 2 from 0: e = [3, 4.75] (hand: as "terminated")
    e1, f1 = ref.eligibility_traces(_rows([1, 2]), _flags("01"), None, None, gamma=G, lam=.5, initial=None)
    assert_close(f1, _rows(0), **TOL)
    e2, f2 = ref.eligibility_traces(_rows([3, 4]), _flags("00"), None, None, gamma=G, lam=.5, initial=f1)
    assert_close(torch.cat([e1, e2], dim=1), _rows([1, 2.25, 3, 4.75]), **TOL)
    assert_close(f2, _rows(4.75), **TOL)
