"""Learning from one's own unlabelled videos in one command (``coclr learn``): the budget, the recipe, the run, the
scores on optional labels and the report page."""

from coclr.learn.run import LearnOptions, LearnSummary, learn

__all__ = ["LearnOptions", "LearnSummary", "learn"]
