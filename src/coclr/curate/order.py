"""An order of rows that follows their values, not where they lie in a folder.

A curation draws from its rows (the videos whose altered copies calibrate the thresholds, the seeded start of the
map's colour groups); drawn along the folder's row order, the same videos renamed or listed in another order gave
another threshold and other groups. Drawn along :func:`value_order`, they give the same.
"""

from __future__ import annotations

import hashlib

import numpy as np


def value_order(rows: np.ndarray) -> np.ndarray:
    """The indices of the 2-D ``rows`` sorted by a hash of each row's bytes (equal rows by position, where the order
    among them changes nothing): the same rows in any order give the same sequence of rows."""
    rows = np.ascontiguousarray(rows)
    keys = [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in rows]
    return np.array(sorted(range(len(keys)), key=lambda index: (keys[index], index)), dtype=np.int64)
