"""Covering slices of a parametrised test matrix (used by conftest.py and test_aot.py).

:func:`covering` picks, from a set of cases each described by its parameter values, a subset in
which every value of every parameter appears (``strength=1``) or, with ``strength=2``, every pair
of values of two parameters that appears together in some case. The choice is greedy and
deterministic: each step takes the case covering the most combinations not yet covered, ties going
to the lowest CRC-32 of the case's id, so a slice depends on the cases alone (not on their order,
the session or the machine) and changes only where the matrix does.
"""

from __future__ import annotations

import itertools
import zlib


def covering(cases: dict, strength: int = 2) -> list:
    """The ids of a covering subset of ``cases`` (``{id: [(parameter, value), ...]}``), in the order
    chosen. A case of one parameter counts its value alone, whatever ``strength``."""
    if strength not in (1, 2):
        raise ValueError(f"strength must be 1 or 2, not {strength!r}")

    def combos(values):
        values = sorted(values)
        if strength == 1 or len(values) == 1:
            return frozenset((v,) for v in values)
        return frozenset(itertools.combinations(values, 2))

    cover = {k: combos(v) for k, v in cases.items()}
    need = set().union(*cover.values())
    left = sorted(cases, key=lambda k: (zlib.crc32(str(k).encode()), str(k)))
    chosen = []
    while need:
        best = max(left, key=lambda k: len(cover[k] & need))  # max keeps the first of equals
        chosen.append(best)
        need -= cover[best]
        left.remove(best)
    return chosen
