"""What a ``coclr learn`` run is asked for: each option declared once, with its documentation; the command's flags
are generated from it (:func:`coclr.cli._options.add_option_flags`). Light to import: the command line reads it
before any work."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from coclr.config import option
from coclr.errors import ConfigError
from coclr.seeding import check_seed
from coclr.threads import check_workers


def parse_budget(text: str) -> float:
    """Seconds of a budget written ``90s``, ``15m``, ``1.5h`` (a bare number: minutes)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    text = str(text).strip().lower()
    unit = units.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    try:
        value = float(number) * (unit or 60.0)
    except ValueError:
        raise ConfigError(f"--budget: {text!r} is not a duration (e.g. 90s, 15m, 2h)") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"--budget: must be a positive duration, got {text!r}")
    return value


def budget_text(seconds: float) -> str:
    """A budget as ``--budget`` takes it back (:func:`parse_budget`): ``2h``, ``15m``, else ``90s``."""
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@dataclasses.dataclass
class LearnOptions:
    """What a run is asked for; each option but ``plan`` is a flag of ``coclr learn``."""

    budget: float = option(900.0, "wall-clock time for the whole run, e.g. 90s, 5m, 2h (a bare number: minutes): the "
                                  "network, clip size and epochs are chosen to fit it",
                           cli={"parse": parse_budget, "shown": "15m"})
    labels: str | None = option(None, "a --format csv manifest (path,label[,split[,group]], UTF-8; paths relative to "
                                      "its folder, or absolute) of some of the videos: never used to train, only to "
                                      "score the embeddings (kNN accuracy, R@k)", cli={"metavar": "CSV"})
    init: str | None = option(None, "start the RGB encoder from this checkpoint instead of random weights (any file "
                                    "coclr embed takes: the authors' released ones, torchvision's s3d weights, "
                                    "ours); its network and clip size are kept, the budget sizes the schedule",
                              cli={"metavar": "CHECKPOINT"})
    flow_init: str | None = option(None, "start the flow encoder from this checkpoint (default: from scratch); its "
                                         "flow bound is kept", cli={"metavar": "CHECKPOINT"})
    seed: int = option(0, "seed of the initialisation, data order and augmentation")
    device: str | None = option(None, "torch device (default: cuda when available, else cpu)")
    workers: int | None = option(None, "processes decoding videos and computing flow (default: one per core)")
    restart: bool = option(False, "move an earlier run in OUT aside and start over", cli={"switch": True})
    progress: bool = option(True, "no progress line", cli={"flag": "--quiet", "negate": True})
    plan: Any = option(None, "a plan (coclr.learn.budget.Plan) to follow instead of measuring this machine and "
                             "choosing one (for tests, or a plan chosen before)", cli={"hidden": True})

    def validate(self) -> None:
        """Refuse, in one line naming the option, what no run could use (before any work)."""
        check_seed(self.seed, "--seed")
        check_workers(self.workers, "--workers")
