"""The benchmark suite: ``python -m rollbuf.bench --grid <name> --out <dir>``.

A registry of cases (estimator × shape × dtype × boundary mix), competitors run on the same inputs
in the same run (:mod:`rollbuf.bench.competitors`: the loops users write, rl-triton and PufferLib's
kernel when their sources are in ``.peers/``, rollbuf's backends), a correctness gate against the
independent float64 oracles of :mod:`rollbuf.oracles` before any timing, full-call and device
times, and a scoreboard (pass rate, and per clock the share of cases faster and the geometric-mean
speedup, % of the copy bandwidth) written as CSV with provenance, markdown and plots. The
``cpu-smoke`` grid runs on any machine in seconds (CI runs it). Named experiments:
:mod:`rollbuf.bench.experiments` (``python -m rollbuf.bench --experiment NAME``).
"""

from rollbuf.bench.suite import GRIDS, Case, compare, run_cases, scoreboard

__all__ = ["GRIDS", "Case", "run_cases", "scoreboard", "compare"]
