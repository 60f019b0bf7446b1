"""Learning from one's own unlabelled videos in one command (``coclr learn``): the budget, the recipe, the run, the
scores on optional labels and the report page."""

from __future__ import annotations

from typing import Any

from coclr.learn.options import LearnOptions

__all__ = ["LearnOptions", "LearnSummary", "learn"]


def __getattr__(name: str) -> Any:
    """The run's names, imported when first asked for (the options are light; the run imports torch)."""
    if name in ("LearnSummary", "learn"):
        from coclr.learn import run  # noqa: PLC0415

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
