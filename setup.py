"""Builds the optional C accelerator of the tokenizer; the metadata lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and
``lmdata.tokenizer`` uses its pure-Python encoder (same ids, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("lmdata.tokenizer._fastbpe", ["src/lmdata/tokenizer/_fastbpe.c"], optional=True)])
