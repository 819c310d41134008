"""``lmdata bench`` and ``lmdata plan``: thin click shells over ``run_bench`` and ``plan``.

``lmdata bench [PIPELINE.toml] [--flags]``: every ``[bench]`` key is a flag (``BenchConfig``);
flags override the file, whose ``store`` defaults to ``[ingest].out``.
"""

from __future__ import annotations

import dataclasses

import click

from lmdata.model.flops import ACCELERATORS
from lmdata.model.presets import get_preset
from lmdata.cli.options import config_options, echo_unless, given, progress_options
from lmdata.config import BenchConfig, load_bench_config, load_pipeline
from lmdata.errors import LmdataError
from lmdata.model.presets import PRESETS

GPUS = ", ".join(ACCELERATORS)


@click.command("bench")
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@config_options(BenchConfig)
@progress_options
@click.pass_context
def bench(ctx: click.Context, pipeline: str | None, progress: bool, quiet: bool, **flags) -> None:
    """Measure GPU stall time per storage format, worker count and page-cache state."""
    from lmdata.bench import report
    from lmdata.bench.run import run_bench

    cfg = load_bench_config(load_pipeline(pipeline)) if pipeline else BenchConfig()
    cfg = dataclasses.replace(cfg, **given(ctx, BenchConfig, flags))
    if not cfg.store:
        raise LmdataError("--store: no store given; pass --store DIR or a PIPELINE.toml with [ingest].out")
    if cfg.out:
        report.check_out(cfg.out)  # refuse a folder of user files before the bench; made when written
    result = run_bench(cfg, progress=echo_unless(quiet or not progress, err=True))
    if not quiet:
        click.echo("\n".join(report.header_lines(result)))
    click.echo(report.table(result))
    click.echo("\n".join(report.notes(result)))
    if cfg.out:
        paths = report.write_all(result, cfg.out)
        click.echo("wrote " + ", ".join(str(p) for p in paths.values()))


@click.command("plan")
@click.option("--model", default="small", show_default=True, help=f"Model preset: {', '.join(PRESETS)}.")
@click.option("--gpu", default="h100", show_default=True, help=f"Accelerator (peak dense bf16 FLOP/s): {GPUS}.")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--seq-len", default=None, type=int, help="Default: the preset's context_length.")
@click.option("--vocab-size", default=None, type=int, help="Default: --store's vocabulary, else the preset's.")
@click.option("--store", default=None, help="A store: its tokenizer's vocabulary sizes the model, as train's does.")
@click.option("--d-model", default=0, type=int, help="Model width over the preset's (as train's flag).")
@click.option("--layers", default=0, type=int, help="Transformer blocks over the preset's (as train's flag).")
@click.option("--heads", default=0, type=int, help="Attention heads over the preset's (as train's flag).")
@click.option("--d-ff", default=0, type=int, help="SwiGLU hidden width over the preset's (as train's flag).")
@click.option("--mfu", default=BenchConfig.mfu, show_default=True, type=float, help="Model FLOP utilization assumed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def plan(model: str, gpu: str, batch_size: int, seq_len: int | None, vocab_size: int | None, store: str | None,
         mfu: float, as_json: bool, **sizes: int) -> None:
    """Parameters, FLOPs/token, memory and the tokens/s a model on an accelerator consumes."""
    import json
    import types

    from lmdata.model import flops
    from lmdata.train.defaults import build_model_config

    if store is not None and vocab_size is None:
        from lmdata.store import open_store

        vocab_size = open_store(store).manifest.vocab_size
    base = get_preset(model)
    for flag, value in {**sizes, "vocab_size": vocab_size or 0}.items():
        if value < 0:
            raise LmdataError(f"--{flag.replace('_', '-')} {value}: must be >= 1 (0 = the preset's)")
    vocab_size = vocab_size or base["vocab_size"]
    if seq_len is not None and seq_len > base["context_length"]:  # as train refuses it
        raise LmdataError(f"--seq-len {seq_len} is longer than the context_length of model {model!r}, "
                          f"{base['context_length']}; use --seq-len <= {base['context_length']} or a larger preset")
    mcfg = build_model_config(types.SimpleNamespace(model=model, context=0, **sizes), vocab_size)
    sized = {k: v for k, v in mcfg.items() if k not in ("vocab_size", "context_length") and base.get(k) != v}
    p = flops.plan(model, gpu, batch_size, seq_len or base["context_length"], vocab_size, mfu, sizes=sized)
    if sized:  # named as train's start line names them
        p.preset = f"{model} ({', '.join(f'{k} {v}' for k, v in sized.items())})"
    click.echo(json.dumps(p.to_json(), indent=1) if as_json else flops.format_plan(p))
