"""The package's version: the one place it is written (``pyproject.toml`` reads it, ``coclr.__version__`` and the
folders that record the library's versions show it)."""

__version__ = "0.1.0"
