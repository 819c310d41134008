"""``lmdata train`` and ``lmdata sample``: flags -> TrainConfig -> ``train``; ``sample``.

Every ``[train]`` key of a pipeline file is also a flag (``batch_size`` -> ``--batch-size``,
booleans as ``--doc-mask/--no-doc-mask``), with the same help text; flags override the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from lmdata.cli.options import LocalOut, config_options, echo_unless, given, progress_options
from lmdata.config import TrainConfig, load_train_config


@click.command("train")
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@config_options(TrainConfig)
@progress_options(progress=False)
@click.pass_context
def train(ctx: click.Context, pipeline: str | None, quiet: bool, **flags) -> None:
    """Train a Transformer LM on a store: lmdata train [PIPELINE.toml] [--flags].

    Writes checkpoints/, metrics.jsonl and loss.png into --out. Works under
    `torchrun --nproc_per_node N` (DDP; each rank reads its share).
    """
    from lmdata.train.loop import train as run_train

    cfg = load_train_config(pipeline) if pipeline else TrainConfig()
    cfg = dataclasses.replace(cfg, **given(ctx, TrainConfig, flags))
    if quiet:
        cfg.progress = False
    from lmdata.cli import resume_hint_only_if
    from lmdata.train.checkpoint import latest_checkpoint

    with resume_hint_only_if(lambda: latest_checkpoint(Path(cfg.out) / "checkpoints") is not None):
        result = run_train(cfg, log=echo_unless(quiet))
    if quiet:
        click.echo(result.summary())
    elif result.checkpoint is not None:
        click.echo(f"checkpoint: {result.checkpoint}")


@click.command("sample")
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--prompt", default="", help="Text to continue (empty: start a new document).")
@click.option("--max-tokens", default=200, show_default=True, help="Most new tokens (stops earlier at end-of-text).")
@click.option("--temperature", default=1.0, show_default=True, help="Softmax temperature; 0 = greedy.")
@click.option("--top-p", default=0.95, show_default=True, help="Nucleus sampling: smallest set of tokens with this mass.")
@click.option("--seed", default=0, show_default=True, help="Sampling seed.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or mps.")
def sample(checkpoint: str, prompt: str, max_tokens: int, temperature: float, top_p: float, seed: int, device: str) -> None:
    """Generate text from CHECKPOINT (a ckpt-*.pt file or a training --out folder)."""
    from lmdata.train.sample import sample as run_sample

    text = run_sample(checkpoint, prompt, max_tokens=max_tokens, temperature=temperature,
                      top_p=top_p, seed=seed, device=device)
    click.echo(prompt + text)


@click.command("export")
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--to", "to", default="hf", show_default=True, help="Target format: hf (a Hugging Face Llama directory).")
@click.option("--out", required=True, type=LocalOut("an export"), help="Directory to write (new, empty, or an earlier export).")
@click.option("--eos-token", default=None, metavar="NAME",
              help="Special token HF ends generation with (default: the store's end-of-text token).")
def export(checkpoint: str, to: str, out: str, eos_token: str | None) -> None:
    """Export CHECKPOINT (a ckpt-*.pt file or a run folder) for other tools: --to hf -> AutoModelForCausalLM."""
    from lmdata.train.export import export as run_export

    click.echo(f"exported: {run_export(checkpoint, out, to, eos_token)}")


@click.command("batch")
@click.argument("run", metavar="RUN_OR_CHECKPOINT", type=click.Path(exists=True))
@click.option("--step", type=int, required=True, help="Optimizer step (metrics.jsonl's step, from 1).")
@click.option("--rank", type=int, default=0, show_default=True, help="Rank of a torchrun run whose batch to show.")
@click.option("--chars", type=click.IntRange(min=0), default=60, show_default=True, help="Characters of each window's text to print.")
def batch(run: str, step: int, rank: int, chars: int) -> None:
    """The documents behind step N's batch: doc id, source file and offset, text; recomputed from the checkpoints."""
    from lmdata.train.batch_docs import format_step_batch, step_batch

    click.echo(format_step_batch(step_batch(run, step, rank, chars)))
