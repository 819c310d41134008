"""``lmdata tokenizer train|encode|decode``: a thin shell over ``train_bpe_stats`` and ``Tokenizer``."""

from __future__ import annotations

import codecs
import io
import sys
from pathlib import Path

import click

from lmdata.errors import LmdataError

_READ = 1 << 20  # stdin is processed in pieces of this many characters / bytes


@click.group()
def tokenizer() -> None:
    """Train a byte-level BPE tokenizer; encode and decode between stdin and stdout."""


@tokenizer.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--vocab-size", type=int, required=True, help="Total ids: 256 bytes + merges + special tokens.")
@click.option("--special-token", "special_tokens", multiple=True, default=("<|endoftext|>",), show_default=True,
              help="A special token (repeatable); given ones replace the default.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Tokenizer directory to write.")
@click.option("--workers", type=int, default=None, help="Processes counting pre-tokens [default: all cores].")
@click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True,
              help="Invalid UTF-8: stop with its byte offset, or replace it with U+FFFD and count it.")
@click.option("--progress/--no-progress", default=True, help="Show progress bars on stderr.")
def train(inputs: tuple[Path, ...], vocab_size: int, special_tokens: tuple[str, ...], out: Path,
          workers: int | None, errors: str, progress: bool) -> None:
    """Train on INPUT files and write vocab.json, merges.txt, tokenizer.json to --out."""
    from lmdata.tokenizer.encoder import Tokenizer
    from lmdata.tokenizer.train import train_bpe_stats

    vocab, merges, stats = train_bpe_stats(list(inputs), vocab_size, list(special_tokens), workers=workers,
                                           errors=errors, progress=progress)
    tok = Tokenizer(vocab, merges, list(special_tokens))
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
    """Decode whitespace-separated ids from stdin to UTF-8 text on stdout."""
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
