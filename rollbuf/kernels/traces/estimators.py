"""The forward family's registry entries (:mod:`rollbuf.estimators`): eligibility traces (decay γλ) and
episodic sums (decay 1), with their rows of the docs table."""

from rollbuf import spec as S
from rollbuf.boundary.coefficients import EstimatorSpec
from rollbuf.kernels.traces.reference import eligibility_traces, episodic_sums
from rollbuf.problem import Family

_X = (S.Field("x", "features"), *S.FLAGS)
_CARRY = "F_{T−1} = final → next window's initial"

ESTIMATORS = (
    S.Estimator(
        "eligibility_traces", Family.FORWARD, "forward", _X, (S.GAMMA, S.LAM), ("traces", "final"), S.TracesResult,
        lambda f, p: eligibility_traces(f["x"], f.get("terminated"), f.get("truncated"), f.get("mask"), p.gamma, p.lam,
                                        p.carry),
        EstimatorSpec("eligibility_traces", "forward", "F_t = nd_t·e_t", "nd_t·x_t", "γλ·nd_t",
                      "e_t = x_t + γλ·F_{t−1}", "none (forward)", _CARRY, ("traces", "final")),
        problem_params=lambda params: dict(params, decay=params["gamma"] * params["lam"]),
    ),
    S.Estimator(
        "episodic_sums", Family.FORWARD, "forward", _X, (), ("sums", "final"), S.SumsResult,
        lambda f, p: episodic_sums(f["x"], f.get("terminated"), f.get("truncated"), f.get("mask"), p.carry),
        EstimatorSpec("episodic_sums", "forward", "F_t = nd_t·S_t", "nd_t·x_t", "nd_t", "S_t = x_t + F_{t−1}",
                      "none (forward)", _CARRY, ("sums", "final")),
        problem_params=lambda params: dict(params, decay=1.0),
    ),
)
