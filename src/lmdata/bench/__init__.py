"""Stall time and throughput: does the loader keep the accelerator busy, per storage format?

``lmdata.bench.run.run_bench`` measures (``stall.py`` is the loop, ``cache.py`` makes the
page cache cold), ``lmdata.model.flops`` says what rate a model on an accelerator needs, and
``report.py`` writes the table, JSON and plots. Nothing heavy is imported here.
"""
