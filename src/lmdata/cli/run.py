"""``lmdata run PIPELINE.toml``: a thin click shell over ``lmdata.pipeline.run_pipeline``."""

from __future__ import annotations

import click

from lmdata.cli.options import echo_unless, progress_options


@click.command("run")
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--steps", type=int, default=None, help="Train for N steps instead of [train] steps (e.g. a quick try).")
@click.option("--skip-bench", is_flag=True, help="Stop after sampling; do not run the bench.")
@click.option("--fresh", is_flag=True, help="Redo every step: delete this pipeline's tokenizer (if it trains one), "
              "checkpoints, metrics, sample and bench report, and re-ingest with --overwrite.")
@click.option("--resume", is_flag=True, help="Continue an interrupted ingest or training run (what `run` does "
              "anyway: accepted so the commands' --resume works here too).")
@progress_options
def run_command(pipeline: str, steps: int | None, skip_bench: bool, fresh: bool, resume: bool, progress: bool,
                quiet: bool) -> None:
    """Run PIPELINE.toml end to end: tokenizer, ingest, verify, train, sample, bench.

    Each step is skipped when its output is already there (rerunning reuses what is
    done; an interrupted ingest or training run resumes), so a rerun is quick.
    """
    from lmdata.errors import LmdataError
    from lmdata.pipeline import run_pipeline

    if resume and fresh:
        raise LmdataError("lmdata run: --resume and --fresh contradict each other; pass one of them")

    result = run_pipeline(pipeline, steps=steps, skip_bench=skip_bench, fresh=fresh, progress=progress and not quiet,
                          log=echo_unless(quiet))
    click.echo(result.summary())
