"""lmdata: raw text to training-ready token storage, and a loader that keeps the GPU busy.

Heavy dependencies (pyarrow, lance, duckdb, polars, ray, torch) load inside the modules
that need them, so ``import lmdata`` stays fast; a test keeps it that way.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
