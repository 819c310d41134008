"""``lmdata export CHECKPOINT --to hf --out DIR``: a checkpoint as a Hugging Face Llama directory.

Our TransformerLM is Llama-shaped (pre-norm RMSNorm, SwiGLU, RoPE, no biases, untied
head), so the export is a renaming plus one permutation. Ours rotates adjacent pairs
``(x[2i], x[2i+1])`` (DESIGN.md); HF Llama's ``rotate_half`` rotates ``(x[i], x[i + d_k/2])``
with the same frequency ``theta^(-2i/d_k)``. Reordering each head's q and k rows to
``[0, 2, 4, ..., 1, 3, 5, ...]`` turns one into the other; q.k is unchanged because q and k
are permuted alike, and v is not touched. The written directory::

    DIR/config.json              LlamaConfig (model_type llama, tie_word_embeddings false)
    DIR/model.safetensors        fp32 weights under HF's names (model.layers.N.self_attn.q_proj.weight, ...)
    DIR/generation_config.json   bos/eos ids
    DIR/tokenizer.json           the checkpoint's tokenizer (``Tokenizer.to_hf_json``: any pattern),
                                 checked against the checkpoint's tokenizer hash first
    DIR/tokenizer_config.json    PreTrainedTokenizerFast; bos/eos: the store's end-of-text token
    DIR/special_tokens_map.json  (or ``--eos-token NAME``)
    DIR/lmdata-export.json       what wrote it (checkpoint, step, tokenizer hash, its files): marks
                                 DIR as ours; a later export replaces only those files

tests/train/test_export.py loads it with ``AutoModelForCausalLM`` and checks logits against
ours (max abs difference <= 1e-4 in fp32) and the greedy continuation.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from lmdata.errors import LmdataError
from lmdata.io import atomic
from lmdata.train.checkpoint import read_checkpoint

MARKER = "lmdata-export.json"
TARGETS = ("hf",)


def interleaved_to_halves(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """q/k projection rows of each head from our pair order (0,1)(2,3).. to HF's halves (0,d/2)(1,d/2+1)..

    ``w``: [num_heads * d_k, d_in] -> same shape, rows of head h reordered 0,2,4,..,1,3,5,..
    """
    out_dim, d_in = w.shape
    d_k = out_dim // num_heads
    return w.view(num_heads, d_k // 2, 2, d_in).transpose(1, 2).reshape(out_dim, d_in)


def hf_state_dict(state: dict[str, torch.Tensor], mcfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Our state dict (DESIGN.md's keys) -> LlamaForCausalLM's."""
    h = int(mcfg["num_heads"])
    out = {"model.embed_tokens.weight": state["token_embeddings.weight"],
           "model.norm.weight": state["ln_final.weight"], "lm_head.weight": state["lm_head.weight"]}
    for i in range(int(mcfg["num_layers"])):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        out[hf + "input_layernorm.weight"] = state[ours + "ln1.weight"]
        out[hf + "post_attention_layernorm.weight"] = state[ours + "ln2.weight"]
        out[hf + "self_attn.q_proj.weight"] = interleaved_to_halves(state[ours + "attn.q_proj.weight"], h)
        out[hf + "self_attn.k_proj.weight"] = interleaved_to_halves(state[ours + "attn.k_proj.weight"], h)
        out[hf + "self_attn.v_proj.weight"] = state[ours + "attn.v_proj.weight"]
        out[hf + "self_attn.o_proj.weight"] = state[ours + "attn.output_proj.weight"]
        out[hf + "mlp.gate_proj.weight"] = state[ours + "ffn.w1.weight"]
        out[hf + "mlp.up_proj.weight"] = state[ours + "ffn.w3.weight"]
        out[hf + "mlp.down_proj.weight"] = state[ours + "ffn.w2.weight"]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def llama_config(mcfg: dict[str, Any], eot_id: int) -> dict[str, Any]:
    """config.json of the equivalent LlamaForCausalLM (both the old and the v5 RoPE keys)."""
    theta = mcfg.get("rope_theta")
    if theta is None:
        raise LmdataError("export --to hf: this model has no RoPE (rope_theta None); HF Llama always applies it")
    d, heads = int(mcfg["d_model"]), int(mcfg["num_heads"])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(mcfg["vocab_size"]), "hidden_size": d, "intermediate_size": int(mcfg["d_ff"]),
        "num_hidden_layers": int(mcfg["num_layers"]), "num_attention_heads": heads, "num_key_value_heads": heads,
        "head_dim": d // heads, "max_position_embeddings": int(mcfg["context_length"]),
        "rms_norm_eps": float(mcfg.get("eps", 1e-5)), "rope_theta": float(theta),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(theta)},
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "bos_token_id": eot_id, "eos_token_id": eot_id,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
    }


def checked_tokenizer(ckpt: Path, meta: dict[str, Any]) -> Any:
    """The checkpoint's tokenizer, whatever its pattern, refused unless its hash is the checkpoint's."""
    from lmdata.train.sample import load_tokenizer

    try:
        return load_tokenizer(ckpt, meta)
    except LmdataError as exc:
        raise LmdataError(f"export --to hf: no tokenizer Hugging Face can load: {exc}") from None


def eos_token(tok: Any, eot_id: int, name: str | None, ckpt: Path) -> str:
    """The special token that ends a document: ``--eos-token`` if given, else the one of the store's eot id."""
    specials = tok.special_ids
    if name is not None:
        if name not in specials:
            listed = ", ".join(specials) or "none"
            raise LmdataError(f"--eos-token {name!r}: not a special token of the tokenizer of {ckpt} "
                              f"(its special tokens: {listed})")
        return name
    by_id = {i: t for t, i in specials.items()}
    if eot_id in by_id:
        return by_id[eot_id]
    raise LmdataError(f"export --to hf: checkpoint {ckpt} ends documents with id {eot_id}, which is not a special "
                      "token of its tokenizer; pass --eos-token NAME")


def write_hf_tokenizer(tok: Any, out: Path, context_length: int, eos: str) -> None:
    """tokenizer.json (``Tokenizer.to_hf_json``: any pattern) + the configs AutoTokenizer reads.

    BOS is the document separator too: every document the model saw started after one.
    """
    from lmdata.tokenizer import hf

    (out / "tokenizer.json").write_text(tok.to_hf_json(), encoding="utf-8")
    specials = {"bos_token": eos, "eos_token": eos}
    config = json.loads(hf.config_json(tok.special_ids)) | specials | {"model_max_length": int(context_length)}
    config.pop("unk_token", None)  # byte-level BPE never needs one
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")


# what an export writes (the marker last); earlier exports also wrote GPT-2's vocab.json/merges.txt
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json")
LEGACY_FILES = ("vocab.json", "merges.txt")


def _check_out(out: Path) -> None:
    """Refuse a non-empty directory that is not an earlier export (its marker names what wrote it)."""
    if out.exists() and not out.is_dir():
        raise LmdataError(f"--out {out}: is a file; choose a directory path")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise LmdataError(f"--out {out}: not empty and not an lmdata export (no {MARKER}); "
                          "choose a new or empty directory")


def _earlier_files(out: Path) -> set[str]:
    """The files the earlier export in ``out`` wrote (its marker lists them; older ones: the fixed names)."""
    try:
        listed = json.loads((out / MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if isinstance(listed, list) and all(isinstance(n, str) and "/" not in n for n in listed):
        return set(listed)
    return set(FILES) | set(LEGACY_FILES)


def _umask() -> int:
    """The process's umask, read without changing it where /proc allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _publish(tmp: Path, out: Path) -> None:
    """Move the export's files from ``tmp`` into ``out`` one rename each, marker last; files of an
    earlier export that this one does not write are removed, anything else in ``out`` is left alone."""
    out.mkdir(parents=True, exist_ok=True)
    stale = _earlier_files(out) - {p.name for p in tmp.iterdir()}
    mode = 0o666 & ~_umask()  # safetensors writes 0600: the model would be readable by its owner alone
    for p in sorted(tmp.iterdir(), key=lambda p: p.name == MARKER):
        os.chmod(p, mode)
        os.replace(p, out / p.name)
    for name in stale - {MARKER}:
        if (out / name).is_file():
            (out / name).unlink()


def export(checkpoint: str | Path, out: str | Path, to: str = "hf", eos_token_name: str | None = None) -> Path:
    """Write the export of ``checkpoint`` (a ckpt-*.pt file or a run folder) to ``out``; returns ``out``.

    Into an earlier export only the files an export writes are replaced (a README or adapter
    the user added there stays).
    """
    from lmdata.train.sample import checked_model_config, find_checkpoint

    if to not in TARGETS:
        raise LmdataError(f"--to {to!r}: unknown target; choose one of {', '.join(TARGETS)}")
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise LmdataError("export --to hf needs safetensors: pip install 'lmdata[hf]' (or safetensors)") from None
    out = Path(out)
    _check_out(out)
    ckpt = find_checkpoint(checkpoint)
    payload = read_checkpoint(ckpt)
    meta, mcfg = payload["meta"], checked_model_config(payload, ckpt)
    tok = checked_tokenizer(ckpt, meta)
    eos = eos_token(tok, int(meta["eot_id"]), eos_token_name, ckpt)
    config = llama_config(mcfg, tok.special_ids[eos])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_dir(out)
    try:
        save_file(hf_state_dict(payload["model"], mcfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        write_hf_tokenizer(tok, tmp, int(mcfg["context_length"]), eos)
        (tmp / MARKER).write_text(json.dumps({"checkpoint": str(ckpt.resolve()), "step": int(payload["step"]),
                                              "tokenizer_hash": meta.get("tokenizer_hash"), "to": to,
                                              "files": [*FILES, MARKER]}, indent=2) + "\n")
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
