"""The clip store: decoded frames and flow of a dataset's videos on disk (layout, entries, jobs, repair)."""
