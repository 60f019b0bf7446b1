"""Seeds of the random streams, derived from one run seed: the same numbers on every process and after a resume.

Every random draw of training and evaluation comes from a generator seeded by :func:`derive_seed` from the run's
seed and the position of the draw (epoch, iteration), never from a generator carried across iterations, so a run
killed at any moment and resumed continues exactly, on any number of processes.

The streams (``seed`` is the run's):

- data order of an epoch: ``derive_seed(seed, epoch)``;
- augmentation and CoCLR's own-key drop of an iteration: ``derive_seed(seed, epoch, step)``;
- the shuffle-BN permutation of an iteration (several processes): ``derive_seed(seed, epoch, step, SHUFFLE)``;
- the random initial keys of the momentum queue: ``seed + 1`` (:func:`queue_seed`);
- finetuning: dropout ``derive_seed(seed, epoch)``, batch order ``derive_seed(seed, epoch, ORDER)``, augmentation
  ``derive_seed(seed, epoch, AUGMENT)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MULTIPLIER = 1_000_003
"""A prime larger than any epoch or iteration count: distinct positions give distinct seeds."""
SEEDS = range(2 ** 32)
"""The run seeds taken (NumPy's and torch's generators take these; a negative one failed hours into a run)."""


def check_seed(seed: int, key: str = "seed") -> None:
    """Refuse, as ``ConfigError("key: ...")``, a seed outside :data:`SEEDS`, before any work."""
    from coclr.errors import ConfigError  # noqa: PLC0415

    if seed not in SEEDS:
        raise ConfigError(f"{key}: must be from 0 to 2**32 - 1, got {seed}")


SHUFFLE, ORDER, AUGMENT = -1, -2, -3
"""Keys of streams drawn at the same position as another (negative: never an epoch or an iteration)."""


def derive_seed(seed: int, *keys: int) -> int:
    """The seed of the stream at ``keys`` (``seed``, then ``s * MULTIPLIER + key`` for each key)."""
    for key in keys:
        seed = seed * MULTIPLIER + key
    return seed


def generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU generator seeded with ``derive_seed(seed, *keys)``."""
    import torch  # noqa: PLC0415 (heavy: the seeds' range is read by the command lines before torch)

    return torch.Generator().manual_seed(derive_seed(seed, *keys))


def queue_seed(seed: int) -> int:
    """The seed of a queue's random initial keys (the model's initialisation draws from ``seed`` itself)."""
    return seed + 1
