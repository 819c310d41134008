"""``lmdata tokenizer train|encode|decode|import|export``: a thin shell over ``train_bpe_stats`` and ``Tokenizer``."""

from __future__ import annotations

import codecs
import io
import json
import sys
from pathlib import Path

import click

from lmdata._eot import EOT
from lmdata.cli.options import LocalOut, progress_options
from lmdata.errors import LmdataError
from lmdata.sources import KINDS

_READ = 1 << 20  # stdin is processed in pieces of this many characters / bytes


@click.group()
def tokenizer() -> None:
    """Byte-level BPE tokenizers: train one; encode and decode between stdin and stdout; import a Hugging
    Face tokenizer.json or a tiktoken file, and export to them."""


@tokenizer.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--vocab-size", type=int, required=True, help="Total ids: 256 bytes + merges + special tokens.")
@click.option("--special-token", "special_tokens", multiple=True, default=(EOT,), show_default=True,
              help="A special token (repeatable); given ones replace the default.")
@click.option("--out", type=LocalOut("a tokenizer"), required=True, help="Tokenizer directory to write.")
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Threads counting pre-tokens (processes for a custom regex or pure Python); 0 = all cores. The result does not depend on it.")
@click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True,
              help="Invalid UTF-8: stop with its byte offset, or replace it with U+FFFD and count it.")
@click.option("--pattern", default="gpt2", show_default=True, help="Pre-tokenizer: gpt2, cl100k, o200k or a regex.")
@click.option("--kind", type=click.Choice(KINDS), default="auto", show_default=True,
              help="How to read an input, as `lmdata ingest --kind` (auto: by its name; JSONL, Parquet and Arrow "
                   "inputs are read as their documents' text).")
@click.option("--text-field", default="text", show_default=True,
              help="JSONL, Parquet or Arrow: the field or column holding the document text.")
@progress_options
def train(inputs: tuple[str, ...], vocab_size: int, special_tokens: tuple[str, ...], out: Path,
          workers: int, errors: str, progress: bool, quiet: bool, pattern: str, kind: str, text_field: str) -> None:
    """Train on INPUTS and write the tokenizer directory --out (Hugging Face's tokenizer.json included).

    An input is what `lmdata ingest --input` takes: a file, s3://bucket/key, or a glob of
    either ('s3://bucket/raw/*.txt'), plain or .gz/.zst; JSONL, Parquet and Arrow inputs are
    read as their documents' text (--text-field), each ended by the first --special-token.
    """
    from lmdata.tokenizer.encoder import Tokenizer
    from lmdata.tokenizer.train import train_bpe_stats

    vocab, merges, stats = train_bpe_stats(list(inputs), vocab_size, list(special_tokens), workers=workers or None,
                                           errors=errors, progress=progress and not quiet,
                                           pattern=pattern, kind=kind, text_field=text_field)
    tok = Tokenizer(vocab, merges, list(special_tokens), pattern)
    digest = tok.save(out)
    click.echo(f"wrote {out}: {tok.vocab_size:,} ids; {stats.summary()}; {digest}")


@tokenizer.command()
@click.argument("directory", type=click.Path(path_type=Path))
def encode(directory: Path) -> None:
    """Encode UTF-8 text from stdin to space-separated ids on stdout."""
    from lmdata.tokenizer.encoder import Tokenizer

    tok = Tokenizer.load(directory)
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="strict", newline="")
    out = sys.stdout
    pieces = iter(lambda: stdin.read(_READ), "")
    batch: list[str] = []
    first = True
    try:
        for i in tok.encode_iterable(pieces):
            batch.append(str(i))
            if len(batch) >= 65536:
                out.write(("" if first else " ") + " ".join(batch))
                batch, first = [], False
    except UnicodeDecodeError as exc:
        raise LmdataError(f"stdin: invalid UTF-8 ({exc.reason}); encode expects UTF-8 text") from None
    out.write(("" if first or not batch else " ") + " ".join(batch) + "\n")
    out.flush()


@tokenizer.command()
@click.argument("directory", type=click.Path(path_type=Path))
def decode(directory: Path) -> None:
    """Decode ids (whitespace-separated) from stdin to text on stdout."""
    from lmdata.tokenizer.encoder import Tokenizer

    tok = Tokenizer.load(directory)
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = sys.stdout.buffer
    tail = b""
    while True:
        data = sys.stdin.buffer.read(_READ)
        words = (tail + data).split()
        tail = words.pop() if data and words and not data[-1:].isspace() else b""
        try:
            ids = [int(w) for w in words]
        except ValueError:
            bad = next(w for w in words if not w.lstrip(b"-").isdigit())
            raise LmdataError(f"stdin: {bad.decode('utf-8', 'replace')!r} is not a token id; give integers") from None
        out.write(text.decode(tok.decode_bytes(ids), final=not data).encode("utf-8"))
        if not data:
            break
    out.flush()


def _special_ids(values: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for v in values:
        name, _, num = v.rpartition("=")
        if not name or not (num.isascii() and num.isdigit()):  # '²'.isdigit() is True, int('²') a ValueError
            raise LmdataError(f"--special-token {v!r}: give NAME=ID, e.g. --special-token '<|endoftext|>=100257'")
        if out.get(name, int(num)) != int(num):
            raise LmdataError(f"--special-token {name!r} is given two ids ({out[name]} and {num}); give it once")
        other = next((n for n, i in out.items() if i == int(num) and n != name), None)
        if other is not None:
            raise LmdataError(f"--special-token {other!r} and {name!r} both have id {num}; give each its own id")
        out[name] = int(num)
    return out


@tokenizer.command("import")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", type=LocalOut("a tokenizer"), required=True, help="Tokenizer directory to write.")
@click.option("--pattern", default=None, help="A tiktoken file's pattern: gpt2, cl100k, o200k or a regex.")
@click.option("--special-token", "special_tokens", multiple=True, metavar="NAME=ID",
              help="A tiktoken file's special token and its id (repeatable).")
@click.option("--eot-token", default=None, metavar="NAME",
              help="The special token that ends each document in a store (ingest appends it). Default: "
                   f"{EOT}; without one, a directory's tokenizer_config.json eos_token.")
def import_(src: Path, out: Path, pattern: str | None, special_tokens: tuple[str, ...], eot_token: str | None) -> None:
    """Import SRC, a Hugging Face tokenizer.json (byte-level BPE) or a tiktoken ranks file."""
    from lmdata.tokenizer.encoder import Tokenizer

    if src.suffix == ".json" or src.is_dir():
        if pattern or special_tokens:
            raise LmdataError("--pattern and --special-token are for tiktoken files; a tokenizer.json carries its own")
        fallback = hf_eos_token(src / "tokenizer_config.json") if src.is_dir() else None  # e.g. <|end_of_text|>
        tok = Tokenizer.from_hf(src / "tokenizer.json" if src.is_dir() else src, eot_token, fallback)
    else:
        if not pattern:
            from lmdata.tokenizer import tiktoken_ranks

            tiktoken_ranks.read(src)  # not a ranks file at all (a README, a JSONL): that, not --pattern, is the news
            raise LmdataError(f"{src}: a tiktoken file holds no pattern; pass --pattern (e.g. cl100k or o200k)")
        tok = Tokenizer.from_tiktoken(src, pattern, _special_ids(special_tokens), eot_token)
    digest = tok.save(out)
    ranked = "; BPE by ranks as tiktoken (tokens that are not merges)" if tok.ranked else ""
    flags = "".join(f"; {t} {'+'.join(f)}" for t, f in tok.special_flags.items())  # Hugging Face's added-token flags
    eot = f"; documents end with {tok.eot_token}" if tok.eot_id is not None else (
        f"; no {tok.eot_token}, so ingest refuses it: import again with --eot-token NAME")
    click.echo(f"wrote {out}: {tok.vocab_size:,} ids, pattern {tok.pattern_name or 'custom'}{ranked}{flags}{eot}; {digest}")


def hf_eos_token(config: Path) -> str | None:
    """The ``eos_token`` of a Hugging Face ``tokenizer_config.json`` (a string or {"content": ...}), if any."""
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return eos if isinstance(eos, str) else None


@tokenizer.command("export")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--to", "fmt", type=click.Choice(["hf", "tiktoken"]), required=True, help="Format to write.")
@click.option("--out", type=LocalOut("an exported tokenizer"), required=True, help="File to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")
def export(directory: Path, fmt: str, out: Path, overwrite: bool) -> None:
    """Export a tokenizer DIRECTORY as a Hugging Face tokenizer.json or a tiktoken ranks file."""
    from lmdata.io import atomic
    from lmdata.tokenizer.encoder import Tokenizer

    tok = Tokenizer.load(directory)
    _check_export_target(Path(directory), out, overwrite)
    text = tok.to_hf_json() if fmt == "hf" else tok.to_tiktoken()
    atomic.write_text(out, text)
    note = "" if fmt == "hf" else (f"; pattern {tok.pattern_name or tok.pattern!r}, special tokens "
                                   + ", ".join(f"{k}={v}" for k, v in tok.special_ids.items()))
    click.echo(f"wrote {out}{note}")


def _check_export_target(directory: Path, out: Path, overwrite: bool) -> None:
    """An export never replaces the tokenizer's own files, nor any file without ``--overwrite``."""
    if out.is_dir():
        raise LmdataError(f"--out {out}: is a directory; give the file to write (e.g. {out / 'tokenizer.json'})")
    if out.resolve().parent == directory.resolve():
        raise LmdataError(f"--out {out}: is inside the tokenizer directory {directory}, whose files the export "
                          "must not replace; write it elsewhere")
    if out.exists() and not overwrite:
        raise LmdataError(f"--out {out}: already exists; pass --overwrite to replace it, or choose another path")
