"""What every export and import shares: the output folder, the base model's lm_head, strict tensor renaming."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from ..files import check_no_overlap, check_writable
from ..medusa import MedusaConfig, MedusaHeads


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_base_model(name: str) -> str | None:
    """The Hub id of a base model (built-in names map to their upstream id); None for a local folder."""
    from specheads.data.models import BUILTIN_MODELS

    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name].upstream_id
    if HUB_ID.fullmatch(name or "") and not Path(name).exists():
        return name
    return None


def prepare_out_dir(out_dir: str | Path, source_dir: str | Path, overwrite: bool = False, inputs=()) -> Path:
    """Create `out_dir`; never write into, above or inside the source folder (nor the other `inputs`), nor over a
    non-empty folder unasked; OutputPathError (a ValueError) for an overlap or a folder that cannot be written."""
    out_dir = Path(out_dir)
    check_no_overlap(out_dir, [("heads folder", source_dir), *inputs])
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} is not empty; pass overwrite=True (--overwrite) to write into it")
    check_writable(out_dir)
    return out_dir


def own_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies: save_file refuses tensors that share memory (a tied lm_head) or are views."""
    return {name: tensor.detach().cpu().contiguous().clone() for name, tensor in tensors.items()}


def int_field(raw: dict, key: str, path: Path, default=None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{path}: field {key!r} must be a non-negative integer, got {value!r}")
    return value


# ---- Medusa heads in the engines' layouts -----------------------------------------------------------

def base_model_of(heads: MedusaHeads, heads_dir, model: str | None) -> str:
    model = model or heads.config.base_model_name_or_path
    if not model:
        raise ValueError(f"{heads_dir}: the heads share the base lm_head and name no base model; pass --model")
    return model


def base_lm_head_weight(model: str) -> torch.Tensor:
    """The output projection [V, H] of a base model (Hub id, folder or built-in name), in float32."""
    from specheads.data.models import load_base_model

    base = load_base_model(model, dtype="float32", device="cpu")  # file work: a 7B fp32 base may not fit a GPU
    return base.get_output_embeddings().weight.detach()


def shared_lm_head(heads: MedusaHeads, heads_dir, model: str | None, lm_head_weight: torch.Tensor | None):
    """The base lm_head that shared-lm_head heads must ship (None for heads with their own)."""
    if heads.config.own_lm_head or lm_head_weight is not None:
        return lm_head_weight
    return base_lm_head_weight(base_model_of(heads, heads_dir, model))


def full_vocabulary_only(heads: MedusaHeads, engine: str) -> None:
    """Engines' Medusa formats have no draft vocabulary. Heads that share the base lm_head go out ranking the whole
    vocabulary (same blocks; a warning says so: the engine may propose tokens the heads never ranked); heads with
    their own lm_heads over a draft vocabulary hold no rows for the other tokens and are refused."""
    config = heads.config
    if not config.draft_vocab_size:
        return
    if config.own_lm_head:
        raise ValueError(f"these heads have their own lm_heads over a draft vocabulary of {config.draft_vocab_size} "
                         f"tokens; {engine} cannot load a draft vocabulary and needs rows for all "
                         f"{config.vocab_size} tokens: train them without heads.draft_vocab_size to serve them there")
    warnings.warn(f"{engine} cannot load a draft vocabulary: the export ranks all {config.vocab_size} tokens, "
                  f"not the heads' {config.draft_vocab_size}; compare acceptance with scripts/serve_vllm.py",
                  stacklevel=3)


def checked_lm_head(heads: MedusaHeads, base_lm_head: torch.Tensor | None, needed_as: str) -> torch.Tensor:
    """The base lm_head [V, H] that shared-lm_head heads ship, in the heads' dtype (checked against them)."""
    expected = (heads.config.vocab_size, heads.config.hidden_size)
    if base_lm_head is None:
        raise ValueError(f"these heads share the base lm_head, which the format needs as {needed_as}: "
                         f"pass the base model (--model) or its lm_head weight")
    if tuple(base_lm_head.shape) != expected:
        raise ValueError(f"base lm_head weight has shape {tuple(base_lm_head.shape)}, the heads need "
                         f"{expected} (vocab_size, hidden_size): wrong base model?")
    return base_lm_head.to(next((p.dtype for p in heads.parameters()), base_lm_head.dtype))  # not draft_ids'


def load_renamed(config: MedusaConfig, renamed: dict[str, tuple[str, torch.Tensor]], source: Path,
                 extra: dict) -> MedusaHeads:
    """Build heads from {specheads name: (name in the file, tensor)}; every tensor must be there, in shape."""
    heads = MedusaHeads(config)
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(renamed))
    if missing:
        raise ValueError(f"{source}: missing tensors for {', '.join(missing[:8])}"
                         f"{' ...' if len(missing) > 8 else ''} ({len(missing)} in all)")
    for name, (their_name, tensor) in renamed.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{source}: tensor {their_name!r} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(expected[name].shape)}")
    heads.load_state_dict({name: tensor for name, (_, tensor) in renamed.items()})
    heads.metadata = extra
    return heads
