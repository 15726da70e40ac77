"""The package's version, on the lowest floor: what a cache key or `--version` reads
without importing the package's top (which names every public part)."""

__version__ = "0.1.0"  # pyproject.toml's [project] version says the same
