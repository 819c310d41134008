"""The README's commands and the shipped pipelines are ones the CLI accepts.

Every ``lmdata ...`` line in a fenced code block of README.md names a command that exists,
and each ``--flag`` it passes appears in that command's ``--help``. Every
``pipelines/*.toml`` parses with the ingest, train and run config loaders, and its input
files exist in the repository (or, for TinyStories, are the ones data/README.md says to
fetch).
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmdata.cli import COMMANDS, cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PIPELINES = sorted((REPO / "pipelines").glob("*.toml"))


def code_blocks(text: str) -> list[str]:
    """The contents of every ``` fenced block."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def lmdata_commands(text: str) -> list[list[str]]:
    """argv (after ``lmdata``) of every command line in the README's code blocks and indented examples."""
    lines = [line for block in code_blocks(text) for line in block.splitlines()]
    lines += [line for line in text.splitlines() if line.startswith("    ")]  # indented blocks
    # inline `lmdata ...` spans in the prose (they may wrap across lines)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M).replace("\n", " ")
    lines += [span for span in prose.split("`")[1::2] if span.startswith("lmdata ") or " -m lmdata " in span]
    found = []
    for line in lines:
        if " -m lmdata " in line:  # `torchrun ... -m lmdata train ...`
            line = line[line.index(" -m lmdata ") + 4:]
        line = line.split(" # ")[0].strip()
        if "|" in line:  # `echo ... | lmdata ...`
            line = line.split("|")[-1].strip()
        if not line.startswith("lmdata "):
            continue
        argv = shlex.split(line)[1:]
        if argv and not argv[0].isupper():  # not a placeholder such as `lmdata COMMAND --help`
            found.append(argv)
    return found


@cache
def help_text(*path: str) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, f"lmdata {' '.join(path)} --help failed: {result.output}"
    return result.output


def command_path(argv: list[str]) -> list[str]:
    """The (sub)command words of ``argv``: ``["tokenizer", "train"]``, ``["ingest"]`` or ``[]`` (``--help``)."""
    if argv[0].startswith("-"):
        return []
    assert argv[0] in COMMANDS, f"README uses unknown command `lmdata {argv[0]}`"
    path = [argv[0]]
    if argv[0] == "tokenizer" and len(argv) > 1 and not argv[1].startswith("-"):
        assert argv[1] in ("train", "encode", "decode", "import", "export"), f"README uses unknown `lmdata tokenizer {argv[1]}`"
        path.append(argv[1])
    return path


def test_readme_opens_with_the_two_commands() -> None:
    first = code_blocks(README.read_text())[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_readme_lmdata_commands_exist_and_take_their_flags() -> None:
    commands = lmdata_commands(README.read_text())
    assert len(commands) >= 15, "the tour and the pipeline examples should be found"
    seen = set()
    for argv in commands:
        path = command_path(argv)
        text = help_text(*path)
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert re.search(rf"(^|[\s/,]){re.escape(flag)}([\s=/,]|$)", text, re.M), \
                f"`lmdata {' '.join(argv)}`: {flag} is not in `lmdata {' '.join(path)} --help`"
        seen.update(path[:1])
    assert {"run", "tokenizer", "ingest", "verify", "inspect", "sql", "show", "train", "sample", "bench", "plan"} <= seen


# flags the README shows for other programs (torchrun, pip, ray start)
FOREIGN_FLAGS = {"--standalone", "--nproc_per_node", "--index-url", "--no-deps", "--head", "--port", "--address"}


def test_every_flag_the_readme_mentions_exists() -> None:
    """Also the flags in prose and in the troubleshooting table, e.g. `--text-field NAME`."""
    every_help = "\n".join(help_text(*p) for p in [[n] for n in COMMANDS if n != "tokenizer"]
                           + [["tokenizer", s] for s in ("train", "encode", "decode", "import", "export")])
    for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", README.read_text())) - FOREIGN_FLAGS):
        assert re.search(rf"(^|[\s/,]){re.escape(flag)}([\s=/,]|$)", every_help, re.M), \
            f"README mentions {flag}, which no lmdata command takes"


def test_readme_links_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links to missing {target}"


def test_every_command_has_help_text() -> None:
    for name in COMMANDS:
        text = help_text(name)
        assert len(text.split("Options:")[0].strip().splitlines()) >= 2, f"`lmdata {name} --help` has no description"
    assert "run" in help_text()


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_pipeline_parses(path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lmdata.config import load_pipeline
    from lmdata.pipeline import load_sections
    from lmdata.sources import expand
    from lmdata.config import load_train_config

    monkeypatch.chdir(tmp_path)  # pipeline paths are relative to the pipeline file, not to where lmdata runs
    pipe = load_pipeline(path)
    assert pipe.tokenizer is not None and pipe.ingest is not None and pipe.ingest.splits
    train = load_train_config(str(path))
    train.check()
    assert train.store == pipe.ingest.out
    _, _, bench, sample = load_sections(path)
    assert bench.out and sample.prompt
    from lmdata.model.transformer import PRESETS

    assert train.model in PRESETS and bench.model in PRESETS
    sources = [*pipe.tokenizer.train_files, *(s for split in pipe.ingest.splits.values() for s in split.sources)]
    if "tinystories" in path.name:  # not shipped: data/README.md says how to fetch it
        readme = (REPO / "data" / "README.md").read_text()
        assert all(Path(s).name in readme for s in sources)
    else:
        assert all(expand([s]) for s in sources)
