"""What ``coclr data store``, ``coclr data verify`` and ``coclr data info`` ask: each option declared once, with its
documentation; the commands' flags are generated from it (:func:`coclr.cli._options.add_option_flags`) and
:func:`~coclr.store.build.build_store` takes its defaults from here. Light to import: the command line reads it."""

from __future__ import annotations

import dataclasses

from coclr.clips import JPEG_QUALITY, SHORT_SIDE, check_fps, check_short_side
from coclr.config import option, require
from coclr.errors import ConfigError
from coclr.threads import check_workers


@dataclasses.dataclass
class StoreOptions:
    """How the videos are decoded into a store; each is a flag of ``coclr data store``."""

    short_side: int = option(SHORT_SIDE, "resize so the shorter side has this many pixels (0: keep the decoded size)")
    quality: int = option(JPEG_QUALITY, "JPEG quality (1-100)")
    fps: float | None = option(None, "resample to this frame rate", cli={"shown": "keep every frame"})
    workers: int | None = option(None, "worker processes (0: none, work in this process, as DataLoader's "
                                       "num_workers)", cli={"shown": "one per core"})

    def __post_init__(self) -> None:  # (refused by the store job too, where the field's name said it, not the flag)
        check_short_side(self.short_side or None, "short_side")
        require(isinstance(self.quality, int) and 1 <= self.quality <= 100, "quality",
                f"must be in 1..100, got {self.quality}")
        check_fps(self.fps, "fps")
        check_workers(self.workers, "workers")


@dataclasses.dataclass
class VerifyOptions:
    """What ``coclr data verify`` checks; each is a flag of it."""

    view: list[str] | None = option(None, "check only this view (repeatable)", cli={"append": True,
                                                                                     "shown": "every view"})
    decode: bool = option(False, "also decode every frame (a decoder's warning of corrupt data counts as damage)")
    add: bool = option(False, "give checksums to the entries written before them (after decoding each of their "
                              "frames cleanly); the others are only checked")

    def __post_init__(self) -> None:
        if self.view:  # a view given twice is checked once
            self.view = list(dict.fromkeys(self.view))


@dataclasses.dataclass
class InfoOptions:
    """What ``coclr data info`` adds to its summary; each is a flag of it."""

    verify: bool = option(False, "also check every entry file (and decode every frame with --decode) and name the "
                                 "missing and damaged ones (exit status 3 if any)")
    decode: bool = option(False, "with --verify: decode every frame")

    def __post_init__(self) -> None:
        if self.decode and not self.verify:  # (it was ignored)
            raise ConfigError("--decode: decodes the frames of --verify's check: give --verify too")
