"""Builds the optional C accelerators; the metadata lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds, ``lmdata.tokenizer`` uses
its pure-Python encoder and trainer, ``lmdata.io.descriptors`` reads windows with one
``os.preadv`` each and ``lmdata.data.permutation`` permutes in NumPy (same results, slower).
``_fastbpe_train.c`` (the trainer) and ``_fastbpe_regex.c`` (the matcher of a custom pattern) are
#included by ``_fastbpe.c``: one translation unit.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "lmdata.tokenizer._fastbpe",
    ["src/lmdata/tokenizer/_fastbpe.c"],
    depends=["src/lmdata/tokenizer/_fastbpe_train.c", "src/lmdata/tokenizer/_fastbpe_regex.c"],
    extra_compile_args=["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
    optional=True,
), Extension(
    "lmdata.io._preads",
    ["src/lmdata/io/_preads.c"],
    depends=["src/lmdata/io/_open_shards.c", "src/lmdata/io/_read_batch.c", "src/lmdata/io/_mapped.c",
             "src/lmdata/io/_check_ahead.c"],
    libraries=["z", "pthread"],  # zlib's crc32 (the block checksums' polynomial); the check-ahead thread
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
    optional=True,
), Extension(
    "lmdata.data._permute",  # the shuffle's keyed bijection, for a mixture's many small calls
    ["src/lmdata/data/_permute.c"],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
    optional=True,
)])
