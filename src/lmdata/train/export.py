"""``lmdata export CHECKPOINT --to hf --out DIR``: a checkpoint as a Hugging Face Llama directory.

Our TransformerLM is Llama-shaped (pre-norm RMSNorm, SwiGLU, RoPE, no biases, untied
head), so the export is a renaming plus one permutation. Ours rotates adjacent pairs
``(x[2i], x[2i+1])`` (DESIGN.md); HF Llama's ``rotate_half`` rotates ``(x[i], x[i + d_k/2])``
with the same frequency ``theta^(-2i/d_k)``. Reordering each head's q and k rows to
``[0, 2, 4, ..., 1, 3, 5, ...]`` turns one into the other; q.k is unchanged because q and k
are permuted alike, and v is not touched. The written directory::

    DIR/config.json              LlamaConfig (model_type llama, tie_word_embeddings false)
    DIR/model.safetensors        fp32 weights under HF's names (model.layers.N.self_attn.q_proj.weight, ...)
    DIR/vocab.json, merges.txt   the store's tokenizer in GPT-2's files (byte-level BPE, GPT-2 regex)
    DIR/tokenizer_config.json    GPT2Tokenizer, <|endoftext|> as bos/eos/unk
    DIR/special_tokens_map.json
    DIR/lmdata-export.json       what wrote it (checkpoint, step, tokenizer hash): marks DIR as ours

tests/train/test_export.py loads it with ``AutoModelForCausalLM`` and checks logits against
ours (max abs difference <= 1e-4 in fp32) and the greedy continuation.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from lmdata.errors import LmdataError
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


def hf_loadable_tokenizer(ckpt: Path, meta: dict[str, Any]) -> Any:
    """The checkpoint's tokenizer if Hugging Face can load it as GPT-2-style byte-level BPE, else LmdataError."""
    from lmdata.tokenizer.pretokenize import GPT2_PATTERN
    from lmdata.train.sample import load_tokenizer

    try:
        tok = load_tokenizer(ckpt, meta)
    except LmdataError as exc:
        raise LmdataError(f"export --to hf: no tokenizer Hugging Face can load: {exc}") from None
    pattern = getattr(tok, "pattern", GPT2_PATTERN)
    if pattern != GPT2_PATTERN:
        raise LmdataError(f"export --to hf: the tokenizer of checkpoint {ckpt} pre-tokenizes with another regex "
                          "than GPT-2's, which GPT2Tokenizer files cannot express; export it with tokenizer.json")
    if "<|endoftext|>" not in tok.special_tokens:
        raise LmdataError(f"export --to hf: the tokenizer of checkpoint {ckpt} has no <|endoftext|> token")
    return tok


def write_hf_tokenizer(tok: Any, out: Path, context_length: int) -> None:
    """vocab.json + merges.txt (GPT-2 form) + tokenizer_config.json that AutoTokenizer loads.

    When lmdata.tokenizer gains its Hugging Face tokenizer.json export, call it here instead
    (it also carries a non-GPT-2 pattern, which these files cannot).
    """
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(tmp)  # our saved form: vocab.json and merges.txt are already GPT-2's files
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(Path(tmp) / name, out / name)
    eot = "<|endoftext|>"
    specials = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": int(context_length),
              "add_prefix_space": False, "clean_up_tokenization_spaces": False, **specials}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def _check_out(out: Path) -> None:
    """Refuse a non-empty directory that is not an earlier export (its marker names what wrote it)."""
    if out.exists() and not out.is_dir():
        raise LmdataError(f"--out {out}: is a file; choose a directory path")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise LmdataError(f"--out {out}: not empty and not an lmdata export (no {MARKER}); "
                          "choose a new or empty directory")


def export(checkpoint: str | Path, out: str | Path, to: str = "hf") -> Path:
    """Write the export of ``checkpoint`` (a ckpt-*.pt file or a run folder) to ``out``; returns ``out``."""
    from lmdata.train.sample import find_checkpoint

    if to not in TARGETS:
        raise LmdataError(f"--to {to!r}: unknown target; choose one of {', '.join(TARGETS)}")
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise LmdataError("export --to hf needs safetensors: pip install 'lmdata[dev]' (or safetensors)") from None
    out = Path(out)
    _check_out(out)
    ckpt = find_checkpoint(checkpoint)
    payload = read_checkpoint(ckpt)
    meta, mcfg = payload["meta"], payload["meta"]["model_config"]
    config = llama_config(mcfg, int(meta["eot_id"]))
    tok = hf_loadable_tokenizer(ckpt, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_file(hf_state_dict(payload["model"], mcfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_hf_tokenizer(tok, tmp, int(mcfg["context_length"]))
        (tmp / MARKER).write_text(json.dumps({"checkpoint": str(ckpt.resolve()), "step": int(payload["step"]),
                                              "tokenizer_hash": meta.get("tokenizer_hash"), "to": to}, indent=2) + "\n")
        old = None
        if out.exists():  # an earlier export (checked above): swap it out, then delete it
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
