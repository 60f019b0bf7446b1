"""Seeing and cleaning a folder of footage from its embeddings (``coclr curate``): near-duplicate groups (whole
videos, and the stretches where only part of one repeats), outliers, and a map of every video on one page."""
