"""The data tests use the root conftest's ``tokens`` and ``reader`` (the toy reader lives in
tests/toyformat.py, importable by spawned workers)."""
