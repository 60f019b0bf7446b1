"""Embeddings of your own videos: ``coclr embed`` (files, folders, lists -> arrays on disk), ``coclr search``
(nearest videos or windows) and :class:`Embedder` (the same from Python).

Modules: ``settings`` (the clip settings, from the checkpoint or the paper), ``inputs`` (what INPUT names),
``embedder`` (decoding workers + batched inference -> per-window and per-video vectors), ``output`` (the
resumable, atomic output folder), ``run`` (the two together: ``embed_videos``), ``search`` (exact chunked
cosine search, optional FAISS, the HTML page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coclr.embed.embedder import Embedder, EmbedFailure, VideoEmbedding

__all__ = ["Embedder", "VideoEmbedding", "EmbedFailure"]


def __getattr__(name: str) -> Any:
    """The embedder's names on first use (lazy: it imports torch, which ``coclr search`` of stored rows, reading
    ``output`` and ``search`` only, does not need)."""
    if name in __all__:
        from coclr.embed import embedder  # noqa: PLC0415 (lazy attribute)

        return getattr(embedder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
