"""`lmdata export --to hf`: transformers loads the directory as Llama; logits and greedy text equal ours."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lmdata.cli import main
from lmdata.errors import LmdataError
from lmdata.model.transformer import TransformerLM
from lmdata.train.checkpoint import read_checkpoint
from lmdata.train.export import export, interleaved_to_halves
from lmdata.train.sample import generate

from test_loop import cfg

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def trained(sample_store, tmp_path_factory):
    """A few steps of a 2-layer model with 4 heads of d_k 16 (so the q/k permutation matters)."""
    from lmdata.train.loop import train

    out = tmp_path_factory.mktemp("export") / "run"
    train(cfg(sample_store, out, steps=6, d_model=64, layers=2, heads=4, d_ff=96, eval_every=0, ckpt_every=0))
    return out


def _ours(run):
    payload = read_checkpoint(run / "checkpoints" / "ckpt-00000006.pt")
    model = TransformerLM(**payload["meta"]["model_config"])
    model.load_state_dict(payload["model"])
    return model.eval(), payload["meta"]


def test_permutation_turns_pairs_into_halves():
    w = torch.arange(8.0)[:, None].repeat(1, 3)  # 2 heads of d_k 4: rows 0..7
    assert interleaved_to_halves(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_hf_round_trip_logits_and_greedy_text(trained, tmp_path):
    out = tmp_path / "hf"
    main(["export", str(trained), "--to", "hf", "--out", str(out)])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ours, meta = _ours(trained)
    ids = torch.randint(0, meta["model_config"]["vocab_size"], (3, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
    print(f"max abs logit difference HF vs ours: {diff:.2e}")
    assert diff <= 1e-4, diff

    tok = transformers.AutoTokenizer.from_pretrained(out)
    from lmdata.store import open_store

    ours_tok = open_store(meta["store"]).tokenizer()
    text = "Once upon a time, there was a little girl.<|endoftext|> The end."
    assert tok(text)["input_ids"] == ours_tok.encode(text)
    prompt = ours_tok.encode("Once upon a time")
    mine = generate(ours, prompt, 12, eot_id=None, temperature=0)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                             pad_token_id=meta["eot_id"])[0, len(prompt):].tolist()
    assert theirs == mine
    assert tok.decode(theirs) == ours_tok.decode(mine)
    export(trained, out)  # rewriting its own export is fine


def test_export_refuses_a_foreign_non_empty_directory(trained, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="1"):
        main(["export", str(trained), "--to", "hf", "--out", str(out)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and "not empty" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_export_without_a_loadable_tokenizer_is_one_line(trained, sample_store, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    ckpt = run / "checkpoints" / "ckpt-00000006.pt"
    payload = torch.load(ckpt, weights_only=True)
    payload["meta"]["store"] = str(store)
    torch.save(payload, ckpt)
    shutil.rmtree(store / "tokenizer")
    shutil.rmtree(run / "checkpoints" / "tokenizer")
    with pytest.raises(LmdataError, match="no tokenizer Hugging Face can load"):
        export(run, tmp_path / "hf")
    with pytest.raises(SystemExit, match="1"):
        main(["export", str(run), "--to", "hf", "--out", str(tmp_path / "hf")])
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "hf").exists()


def test_reexport_replaces_only_the_export_files(trained, tmp_path):
    out = tmp_path / "hf"
    export(trained, out)
    (out / "README.md").write_text("my notes")
    (out / "adapter").mkdir()
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"lora")
    (out / "vocab.json").write_text("{}")  # what an export of an earlier lmdata wrote: stale now
    (out / "lmdata-export.json").write_text('{"to": "hf"}')  # ... and its marker, which listed no files
    export(trained, out)
    assert (out / "README.md").read_text() == "my notes"
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == b"lora"
    assert not (out / "vocab.json").exists()
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()


def test_export_files_are_readable_by_others(trained, tmp_path):
    out = export(trained, tmp_path / "hf")
    for p in [out, *out.iterdir()]:
        assert p.stat().st_mode & 0o004, p  # world-readable under the usual umask, like any file a tool writes


def test_export_refuses_a_tokenizer_copy_that_is_not_the_checkpoints(trained, tmp_path, capsys):
    from lmdata.tokenizer import Tokenizer, train_bpe

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    ckpt = run / "checkpoints" / "ckpt-00000006.pt"
    payload = torch.load(ckpt, weights_only=True)
    payload["meta"]["store"] = str(tmp_path / "gone")  # the store moved: the copy is all there is
    torch.save(payload, ckpt)
    vocab, merges = train_bpe(str(Path(__file__).parents[2] / "data" / "sample.txt"), 300, ["<|endoftext|>"])
    shutil.rmtree(run / "checkpoints" / "tokenizer")
    Tokenizer(vocab, merges, ["<|endoftext|>"]).save(run / "checkpoints" / "tokenizer")  # another tokenizer
    with pytest.raises(SystemExit, match="1"):
        main(["export", str(run), "--to", "hf", "--out", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not the one checkpoint" in err
    assert not (tmp_path / "hf").exists()
    from lmdata.train.sample import sample

    with pytest.raises(LmdataError, match="is not the one checkpoint"):
        sample(run, "Once", max_tokens=2)


def test_llama3_style_imported_tokenizer_exports_and_auto_tokenizer_gives_our_ids(tmp_path):
    """A tokenizer.json as `tokenizers` writes Llama 3's shape -> import -> ingest -> train -> export."""
    from hf_shapes import build
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec
    from lmdata.tokenizer import Tokenizer
    from lmdata.train.loop import train

    ours_tok = Tokenizer.from_hf(build("llama3", tmp_path))
    ours_tok.save(tmp_path / "tok")
    store = tmp_path / "store"
    sample_txt = str(Path(__file__).parents[2] / "data" / "sample.txt")
    ingest({"train": SourceSpec((sample_txt,))}, tmp_path / "tok", store, formats=("memmap",), workers=1,
           holdout=("train", "validation", 4), progress=False, log=None)
    run = tmp_path / "run"
    train(cfg(store, run, steps=2, d_model=32, layers=1, heads=2, d_ff=64, eval_every=0, ckpt_every=0))
    out = tmp_path / "hf"
    main(["export", str(run), "--to", "hf", "--out", str(out), "--eos-token", "<|end_of_text|>"])
    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert auto.eos_token == "<|end_of_text|>"
    assert transformers.AutoConfig.from_pretrained(out).eos_token_id == ours_tok.special_ids["<|end_of_text|>"]
    for text in ["Once upon a time, they'LL say 123456 things.\n\n  x", "日本語のテキスト and Привет мир 😀👍🏽",
                 "<|begin_of_text|>a<|endoftext|>b<|end_of_text|>", "\t\t \n \r\n!!!??  DON'T", ""]:
        assert auto(text)["input_ids"] == ours_tok.encode(text), text
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert hf.config.vocab_size >= ours_tok.vocab_size


def test_eos_token_must_be_a_special_token(trained, tmp_path, capsys):
    with pytest.raises(SystemExit, match="1"):
        main(["export", str(trained), "--to", "hf", "--out", str(tmp_path / "hf"), "--eos-token", "</s>"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--eos-token '</s>'" in err and "<|endoftext|>" in err


def test_a_rank_file_with_non_merge_tokens_trains_and_exports_with_tiktokens_ids(tmp_path):
    """A Llama-3-like ranks file (tokens that are not merges, imported ranked) -> ingest -> train -> export:
    AutoTokenizer's ids equal tiktoken's."""
    import base64

    tiktoken = pytest.importorskip("tiktoken")
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec
    from lmdata.tokenizer import Tokenizer, train_bpe
    from lmdata.train.loop import train

    sample_txt = Path(__file__).parents[2] / "data" / "sample.txt"
    (tmp_path / "in.txt").write_text(sample_txt.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    vocab, _ = train_bpe(tmp_path / "in.txt", 500, [], workers=1, pattern="cl100k")
    tokens = [vocab[i] for i in sorted(vocab)]
    for at, odd in ((300, b".:.:"), (350, b"aaaa"), (420, b"ing the")):
        tokens.insert(at, odd)
    ranks = {t: i for i, t in enumerate(tokens)}
    (tmp_path / "r.tiktoken").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for t, i in ranks.items()))
    specials = {"<|end_of_text|>": len(ranks), "<|begin_of_text|>": len(ranks) + 1, "<|endoftext|>": len(ranks) + 2}
    tok = Tokenizer.from_tiktoken(tmp_path / "r.tiktoken", "cl100k", specials)
    assert tok.ranked
    tok.save(tmp_path / "tok")
    store, run, out = tmp_path / "store", tmp_path / "run", tmp_path / "hf"
    ingest({"train": SourceSpec((str(sample_txt),))}, tmp_path / "tok", store, formats=("memmap",), workers=1,
           holdout=("train", "validation", 4), progress=False, log=None)
    train(cfg(store, run, steps=2, d_model=32, layers=1, heads=2, d_ff=64, eval_every=0, ckpt_every=0))
    main(["export", str(run), "--to", "hf", "--out", str(out), "--eos-token", "<|end_of_text|>"])
    auto = transformers.AutoTokenizer.from_pretrained(out)
    tt = tiktoken.Encoding("r", pat_str=tok.pattern, mergeable_ranks=ranks, special_tokens=specials)
    for text in [".:.: aaaa ing the thing", "Once upon a time, they'LL say 123456 things.\n\n  x", "日本語 Привет 😀",
                 "<|begin_of_text|>a.:.:b<|end_of_text|>", ""]:
        assert auto(text)["input_ids"] == tok.encode(text) == tt.encode(text, allowed_special="all"), text


def test_export_without_safetensors_names_the_hf_extra(tmp_path, monkeypatch):
    """Issue 30.3: the hint was pip install 'lmdata[dev]' (pytest, build, auditwheel, moto)."""
    import sys

    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # import fails as if not installed
    with pytest.raises(LmdataError, match=r"^export --to hf needs safetensors: pip install 'lmdata\[hf\]'"):
        export(tmp_path / "no-run", tmp_path / "hf")
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {r.split(">")[0] for r in extras["hf"]} == {"safetensors", "transformers"}
