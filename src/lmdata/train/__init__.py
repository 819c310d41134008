"""Training: optimizer, schedule, loss, batches, checkpoints, the loop and its CLI.

Kept light (no torch at import); import the submodules, e.g.
``from lmdata.train.optim import AdamW`` or ``from lmdata.train.loop import train``.
"""
