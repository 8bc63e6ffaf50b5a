"""rollbuf's benchmarks (not part of the installed package): ``python -m benchmarks COMMAND`` from
the repository root (:mod:`benchmarks.__main__` lists the commands).

* :mod:`benchmarks.cases`: every grid and shape;
* :mod:`benchmarks.competitors`: every competitor (rollbuf's backends, the loops users write,
  TorchRL, SB3, CleanRL, a plain numba loop, rl-triton, PufferLib, a naive Triton kernel:
  :mod:`benchmarks.naive_kernel`);
* :mod:`benchmarks.suite`: inputs, the float64 gate (:mod:`benchmarks.oracles`), the clocks, the
  scoreboard; :mod:`benchmarks.scoreboard` its command;
* :mod:`benchmarks.cpu`, :mod:`benchmarks.host_time`, :mod:`benchmarks.backward`,
  :mod:`benchmarks.memory`, :mod:`benchmarks.llm`, :mod:`benchmarks.llm_groups`,
  :mod:`benchmarks.distributed`: the other
  measurements;
* :mod:`benchmarks.tables`: docs/benchmarks.md's and docs/llm.md's tables, generated from
  ``benchmarks/results/``.
"""
