"""Text from a checkpoint: temperature and nucleus (top-p) sampling, stopping at end-of-text.

The tokenizer comes from the store recorded in the checkpoint when it is still there and
has the same hash, else from the copy ``lmdata train`` keeps beside the checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmdata.errors import LmdataError
from lmdata.model.transformer import TransformerLM
from lmdata.train.checkpoint import latest_checkpoint, read_checkpoint
from lmdata.train.device import resolve_device


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or the newest one in a run folder (``--out``) or its checkpoints/."""
    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
        if found is None:
            raise LmdataError(f"{path}: no checkpoints (ckpt-*.pt) here or in {path / 'checkpoints'}")
        return found
    return path


def checked_model_config(payload: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    """The checkpoint's model config once it is known to fit its weights (built on the meta device,
    no memory; the layer count first, so a config asking for a million layers builds nothing)."""
    mcfg, state = payload["meta"].get("model_config"), payload["model"]
    fix = "the checkpoint's meta.model_config was edited or belongs to other weights; use an unedited checkpoint"
    layers = {k.split(".")[1] for k in state if k.startswith("layers.")}
    if not isinstance(mcfg, dict) or mcfg.get("num_layers") != len(layers):
        got = mcfg.get("num_layers") if isinstance(mcfg, dict) else mcfg
        raise LmdataError(f"checkpoint {ckpt}: model config num_layers {got!r}, its weights have {len(layers)}; {fix}")
    try:
        shapes = {k: tuple(v.shape) for k, v in TransformerLM(**mcfg, device="meta").state_dict().items()}
    except (TypeError, ValueError, RuntimeError, AssertionError) as exc:
        raise LmdataError(f"checkpoint {ckpt}: model config {mcfg} cannot build a model ({exc}); {fix}") from None
    theirs = {k: tuple(v.shape) for k, v in state.items()}
    for key in sorted(shapes.keys() | theirs.keys()):
        if shapes.get(key) != theirs.get(key):
            raise LmdataError(f"checkpoint {ckpt}: {key} is {theirs.get(key)} in the weights, {shapes.get(key)} by "
                              f"the model config; {fix}")
    return mcfg


def load_tokenizer(ckpt: Path, meta: dict[str, Any]) -> Any:
    """The store's tokenizer if the store still matches, else the copy beside the checkpoint,
    refused unless its hash is the checkpoint's (another tokenizer would decode other text)."""
    from lmdata.store import open_store
    from lmdata.tokenizer import Tokenizer

    try:
        return open_store(meta["store"], tokenizer_hash=meta["tokenizer_hash"]).tokenizer()
    except (LmdataError, KeyError, OSError):
        copy = ckpt.parent / "tokenizer"
        if not copy.is_dir():
            raise LmdataError(
                f"checkpoint {ckpt}: its store {meta.get('store')} is gone or changed and there is no "
                f"tokenizer copy in {copy}; restore the store or copy its tokenizer/ directory there"
            ) from None
        tok = Tokenizer.load(copy)
    want = meta.get("tokenizer_hash")
    if want is not None and tok.hash != want:
        raise LmdataError(f"{copy}: tokenizer {tok.hash[:19]} is not the one checkpoint {ckpt} was trained with "
                          f"({str(want)[:19]}); put that tokenizer's directory back there")
    return tok


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the most likely token is always kept
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return filtered / filtered.sum()


@torch.no_grad()
def generate(
    model: TransformerLM, prompt: list[int], max_tokens: int, *, eot_id: int | None,
    temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None,
) -> list[int]:
    """Continue ``prompt`` by up to ``max_tokens`` ids (temperature 0 = greedy); stops after eot."""
    device = next(model.parameters()).device
    ids = torch.tensor(prompt, dtype=torch.long, device=device)
    out: list[int] = []
    for _ in range(max_tokens):
        logits = model(ids[-model.context_length:][None])[0, -1].float()  # [V]
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            probs = top_p_filter(torch.softmax(logits / temperature, dim=-1), top_p)
            nxt = int(torch.multinomial(probs.cpu(), 1, generator=generator))
        out.append(nxt)
        if nxt == eot_id:
            break
        ids = torch.cat([ids, torch.tensor([nxt], device=device)])
    return out


def sample(
    checkpoint: str | Path, prompt: str, *, max_tokens: int = 200, temperature: float = 1.0,
    top_p: float = 1.0, seed: int = 0, device: str = "cpu",
) -> str:
    """The prompt's continuation as text (the end-of-text token itself is not decoded)."""
    for bad, flag, value, rule in ((max_tokens < 1, "max-tokens", max_tokens, ">= 1"),
                                   (not 0 <= temperature < float("inf"), "temperature", temperature,
                                    ">= 0 and finite (0: greedy)"),
                                   (not 0 < top_p <= 1, "top-p", top_p, "in (0, 1]")):
        if bad:
            raise LmdataError(f"--{flag} {value}: must be {rule}")
    device = str(resolve_device(device))  # one line for a device this torch cannot use (was torch's traceback)
    ckpt = find_checkpoint(checkpoint)
    payload = read_checkpoint(ckpt)
    meta = payload["meta"]
    model = TransformerLM(**checked_model_config(payload, ckpt))
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    tok = load_tokenizer(ckpt, meta)
    ids = tok.encode(prompt)
    if not ids:
        ids = [meta["eot_id"]]  # an empty prompt starts a new document
    gen = torch.Generator().manual_seed(seed)
    new = generate(model, ids, max_tokens, eot_id=meta["eot_id"], temperature=temperature, top_p=top_p, generator=gen)
    if new and new[-1] == meta["eot_id"]:
        new = new[:-1]
    return tok.decode(new)
