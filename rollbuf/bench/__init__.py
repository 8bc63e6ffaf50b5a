"""The benchmark suite: ``python -m rollbuf.bench --grid <name> --out <dir>``.

A registry of cases (estimator × shape × dtype × boundary mix), competitors run on the same inputs
in the same run (:mod:`rollbuf.bench.competitors`), a correctness gate against float64 before any
timing, full-call and device times, and a scoreboard (pass rate, share of cases faster, geometric-
mean speedup, % of the copy bandwidth) written as CSV with provenance, markdown and plots. The
``cpu-smoke`` grid runs on any machine in seconds (CI runs it).
"""

from rollbuf.bench.suite import GRIDS, Case, compare, run_cases, scoreboard

__all__ = ["GRIDS", "Case", "run_cases", "scoreboard", "compare"]
