"""How a ``coclr embed`` job runs (not what it computes: :class:`coclr.embed.settings.EmbedSettings`) and what a
``coclr search`` asks: each option declared once, with its documentation; :class:`~coclr.embed.embedder.Embedder`,
:func:`~coclr.embed.run.embed_videos`, :func:`~coclr.embed.search.search` and the commands' flags take their
defaults from here. Light to import: the command line reads it first."""

from __future__ import annotations

import dataclasses

from coclr.config import option, require
from coclr.threads import check_workers


@dataclasses.dataclass
class EmbedJob:
    """The run's options; each is a flag of ``coclr embed``."""

    batch_size: int = option(16, "windows per forward pass")
    workers: int | None = option(None, "decoding processes (0: decode in this process)",
                                 cli={"shown": "up to 8, leaving a core"})
    device: str | None = option(None, "torch device", cli={"shown": "cuda when available, else cpu"})
    retry_failed: bool = option(False, "try again the videos that failed before")
    flush_every: int = option(256, "videos between writes of finished results to OUT/chunks (a kill loses at most "
                                   "these)")
    progress: bool = option(True, "no progress bar", cli={"flag": "--quiet", "negate": True})

    def validate(self) -> None:
        require(self.batch_size >= 1, "--batch-size", f"must be at least 1, got {self.batch_size}")
        check_workers(self.workers, "--workers")
        require(self.flush_every >= 1, "--flush-every", f"must be at least 1, got {self.flush_every}")


SEARCH_BACKENDS = ("exact", "faiss")
"""How :func:`coclr.embed.search.search` finds the nearest rows."""


@dataclasses.dataclass
class SearchOptions:
    """What a search asks for; each is a flag of ``coclr search``."""

    k: int = option(10, "neighbours to list", cli={"flag": "-k", "metavar": "K"})
    windows: bool = option(False, "search the windows (where in which video) instead of whole videos")
    center: bool = option(False, "subtract the folder's mean vector first (the paper's retrieval protocol); "
                                 "otherwise plain cosine similarity of the stored vectors")
    backend: str = option("exact", "exact: chunked exact search (bounded memory), equal scores by row; faiss: FAISS "
                                   "IndexFlatIP (float32 scores, equal ones in FAISS's order; needs faiss-cpu and "
                                   "the whole array in memory)",
                          cli={"choices": SEARCH_BACKENDS})
