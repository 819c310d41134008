"""``lmdata bench`` and ``lmdata plan``: thin click shells over ``run_bench`` and ``plan``."""

from __future__ import annotations

from pathlib import Path

import click

from lmdata.bench.flops import ACCELERATORS
from lmdata.errors import LmdataError

GPUS = ", ".join(ACCELERATORS)


def _int_list(value: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise LmdataError(f"{flag} {value!r}: give comma-separated integers, e.g. 0,1,2") from None


@click.command("bench")
@click.option("--store", "store", required=True, type=str, help="Store directory or s3:// URI (from `lmdata ingest`).")
@click.option("--split", default="train", show_default=True, help="Split to read.")
@click.option("--format", "fmt", default="all", show_default=True, help="A format of the store, a comma-separated list of them, or `all`.")
@click.option("--workers", default="0,1,2", show_default=True, help="Comma-separated loader worker counts.")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--seq-len", default=256, show_default=True, type=int)
@click.option("--steps", default=100, show_default=True, type=int, help="Steps per run (capped at one epoch).")
@click.option("--compute", default="simulated", show_default=True, type=click.Choice(["simulated", "model"]),
              help="simulated: a fixed-duration step that releases the GIL; model: real training steps.")
@click.option("--step-ms", type=float, default=None, help="Simulated step time; default: derived from --model and --gpu.")
@click.option("--model", default="small", show_default=True, help="Model preset (for --compute model and the keep-up rate).")
@click.option("--gpu", default="h100", show_default=True,
              help=f"Accelerator whose token rate the loader must keep up with: {GPUS}.")
@click.option("--mfu", default=0.4, show_default=True, type=float, help="Model FLOP utilization assumed for --gpu.")
@click.option("--cache", default="warm", show_default=True, type=click.Choice(["warm", "cold", "both"]),
              help="Page cache before each run: files read once (warm) or evicted (cold).")
@click.option("--prefetch", default=2, show_default=True, type=int, help="Reads each worker does ahead.")
@click.option("--batches-per-read", default=4, show_default=True, type=int,
              help="Consecutive batches read with one call (one Lance take); 1 = evenly spread waits.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Directory for bench.json, table.txt, PNGs.")
def bench(store: Path, split: str, fmt: str, workers: str, batch_size: int, seq_len: int, steps: int,
          compute: str, step_ms: float | None, model: str, gpu: str | None, mfu: float, cache: str,
          prefetch: int, batches_per_read: int, seed: int, device: str, out: Path | None) -> None:
    """Measure GPU stall time per storage format, worker count and page-cache state."""
    from lmdata.bench import report
    from lmdata.bench.run import BenchConfig, run_bench

    cfg = BenchConfig(
        store=store, split=split, formats=[] if fmt == "all" else [f.strip() for f in fmt.split(",")],
        workers=_int_list(workers, "--workers"), batch_size=batch_size, seq_len=seq_len, steps=steps,
        compute=compute, step_ms=step_ms, model=model, gpu=gpu, mfu=mfu,
        cache=["warm", "cold"] if cache == "both" else [cache], device=device, prefetch=prefetch,
        batches_per_read=batches_per_read, seed=seed,
    )
    if out is not None:
        report.claim_out(out)  # refuse a folder of user files before the bench, not after it
    result = run_bench(cfg, progress=lambda line: click.echo(line, err=True))
    click.echo("\n".join(report.header_lines(result)))
    click.echo(report.table(result))
    if out is not None:
        paths = report.write_all(result, out)
        click.echo("wrote " + ", ".join(str(p) for p in paths.values()))


@click.command("plan")
@click.option("--model", default="small", show_default=True, help="Model preset.")
@click.option("--gpu", default="h100", show_default=True, help=f"Accelerator (peak dense bf16 FLOP/s): {GPUS}.")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--seq-len", default=None, type=int, help="Default: the preset's context_length.")
@click.option("--vocab-size", default=None, type=int, help="Default: the preset's vocab_size.")
@click.option("--mfu", default=0.4, show_default=True, type=float, help="Model FLOP utilization assumed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def plan(model: str, gpu: str, batch_size: int, seq_len: int | None, vocab_size: int | None, mfu: float,
         as_json: bool) -> None:
    """Parameters, FLOPs/token, memory and the tokens/s a model on an accelerator consumes."""
    import json

    from lmdata.bench import flops

    base = flops.preset(model)
    p = flops.plan(model, gpu, batch_size, seq_len or base["context_length"], vocab_size or base["vocab_size"], mfu)
    click.echo(json.dumps(p.to_json(), indent=1) if as_json else flops.format_plan(p))
