"""Write trained heads in the formats serving tools load (shared/REFERENCE.md §6).

FORMATS maps a format name to its converter `convert(heads_dir, out_dir, *, model=None, overwrite=False)`;
`scripts/export.py` is its command line. The readers for these formats (back to MedusaHeads) are in
`medusa_import.py`, which takes its tensor names from here so that both directions agree. The EAGLE
formats' names and configs, both directions, are in `eagle_export.py` (back to EagleDraft).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from .eagle_export import EAGLE_FORMATS, detect_format, export_eagle, load_draft, load_eagle_export
from .joint import export_merged
from .medusa import MODEL_TYPE as MEDUSA_MODEL_TYPE
from .medusa import MedusaConfig, MedusaHeads

VLLM_MEDUSA_WEIGHTS = "model.safetensors"


def prepare_out_dir(out_dir: str | Path, source_dir: str | Path, overwrite: bool = False) -> Path:
    """Create `out_dir`; never write into the source folder, nor over a non-empty folder unasked."""
    out_dir, source_dir = Path(out_dir), Path(source_dir)
    if out_dir.resolve() == source_dir.resolve():
        raise ValueError(f"{out_dir}: the output folder is the heads folder itself; choose another")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} is not empty; pass overwrite=True (--overwrite) to write into it")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


# ---- vLLM Medusa ------------------------------------------------------------------------------

def vllm_medusa_names(config: MedusaConfig) -> dict[str, str]:
    """specheads tensor name -> vLLM Medusa tensor name (blocks, and the heads' own lm_heads)."""
    names = {}
    for i in range(config.num_heads):
        for j in range(config.num_layers):
            for kind in ("weight", "bias"):
                names[f"blocks.{i}.{j}.linear.{kind}"] = f"blocks.{i}.layers.{j}.{kind}"
        if config.own_lm_head:
            names[f"lm_heads.{i}.weight"] = f"lm_heads.{i}.weight"
    return names


def vllm_medusa_config(config: MedusaConfig) -> dict:
    """vLLM's config.json for these heads: shared-lm_head heads ship the base lm_head as lm_heads.0.

    Always the full vocabulary: vLLM (<= 0.32, the last with Medusa) refuses a folder that carries its
    `token_map` ("weights were not initialized from checkpoint: {'token_map'}"), see vllm_medusa_tensors."""
    return {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "truncated_vocab_size": config.vocab_size,
        "medusa_fc_bias": True,
        "original_lm_head": not config.own_lm_head,
        "base_model_name_or_path": config.base_model_name_or_path,
    }


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


def _own_copies(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # save_file refuses tensors that share memory (a tied lm_head) or are views: give each its own copy.
    return {name: tensor.detach().cpu().contiguous().clone() for name, tensor in tensors.items()}


def vllm_medusa_tensors(heads: MedusaHeads, base_lm_head: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The tensors of vLLM's Medusa draft model; `base_lm_head` [V, H] is needed for shared-lm_head heads.

    vLLM cannot load a draft vocabulary: its Medusa model never reports `token_map` as loaded, so the loader
    refuses the folder (see full_vocabulary_only)."""
    full_vocabulary_only(heads, "vLLM's Medusa (no token_map)")
    own = heads.state_dict()
    tensors = {theirs: own[ours] for ours, theirs in vllm_medusa_names(heads.config).items()}
    if not heads.config.own_lm_head:
        tensors["lm_heads.0.weight"] = checked_lm_head(heads, base_lm_head, "lm_heads.0.weight")
    return _own_copies(tensors)


# ---- FasterDecoding/Medusa v0.1 (what TGI loads) ------------------------------------------------

FASTER_DECODING_SAFETENSORS = "medusa_lm_head.safetensors"


def faster_decoding_tensors(heads: MedusaHeads, base_lm_head: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """FasterDecoding's state dict of ModuleList[Sequential(ResBlock x L, Linear(H, V))]: `{i}.{j}.linear.*` and
    every head's own projection `{i}.{L}.weight` (the base lm_head, copied per head, for shared-lm_head heads)."""
    full_vocabulary_only(heads, "FasterDecoding's Medusa (and TGI)")
    config, own = heads.config, heads.state_dict()
    shared = None if config.own_lm_head else checked_lm_head(heads, base_lm_head,
                                                              f"{{head}}.{config.num_layers}.weight")
    tensors = {}
    for i in range(config.num_heads):
        for j in range(config.num_layers):
            for kind in ("weight", "bias"):
                tensors[f"{i}.{j}.linear.{kind}"] = own[f"blocks.{i}.{j}.linear.{kind}"]
        tensors[f"{i}.{config.num_layers}.weight"] = own[f"lm_heads.{i}.weight"] if config.own_lm_head else shared
    return _own_copies(tensors)


def export_faster_decoding(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
                           lm_head_weight: torch.Tensor | None = None, overwrite: bool = False) -> Path:
    """Heads folder -> a FasterDecoding/Medusa v0.1 folder (config.json + medusa_lm_head.safetensors)."""
    heads = MedusaHeads.from_pretrained(heads_dir)
    config = heads.config
    if not config.own_lm_head and lm_head_weight is None:
        lm_head_weight = base_lm_head_weight(_base_model_of(heads, heads_dir, model))
    tensors = faster_decoding_tensors(heads, lm_head_weight)
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    from .model_card import hub_base_model

    base = model or config.base_model_name_or_path
    save_file(tensors, str(out_dir / FASTER_DECODING_SAFETENSORS), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps({
        "medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
        "base_model_name_or_path": hub_base_model(base) or base, "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size}, indent=2) + "\n")
    return out_dir


def _base_model_of(heads: MedusaHeads, heads_dir, model: str | None) -> str:
    model = model or heads.config.base_model_name_or_path
    if not model:
        raise ValueError(f"{heads_dir}: the heads share the base lm_head and name no base model; pass --model")
    return model


def base_lm_head_weight(model: str) -> torch.Tensor:
    """The output projection [V, H] of a base model (Hub id, folder or built-in name), in float32."""
    from specheads.data.models import load_base_model

    base = load_base_model(model, dtype="float32")
    return base.get_output_embeddings().weight.detach()


def export_vllm_medusa(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
                       lm_head_weight: torch.Tensor | None = None, overwrite: bool = False) -> Path:
    """Heads folder -> a vLLM Medusa draft folder (`--speculative-config '{"model": out_dir, ...}'`)."""
    heads = MedusaHeads.from_pretrained(heads_dir)
    if not heads.config.own_lm_head and lm_head_weight is None:
        lm_head_weight = base_lm_head_weight(_base_model_of(heads, heads_dir, model))
    tensors = vllm_medusa_tensors(heads, lm_head_weight)
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    save_file(tensors, str(out_dir / VLLM_MEDUSA_WEIGHTS), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(vllm_medusa_config(heads.config), indent=2) + "\n")
    return out_dir


# ---- specheads' own format (from any folder MedusaHeads reads) --------------------------------

def export_specheads(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
                     overwrite: bool = False) -> Path:
    """FasterDecoding / vLLM Medusa folder, or an exported EAGLE draft -> specheads heads."""
    if _is_eagle_export(heads_dir):
        draft = load_eagle_export(heads_dir)
        out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
        draft.save_pretrained(out_dir, extra=draft.extra_config)
        return out_dir
    base = None
    if model:
        from specheads.data.models import load_base_model

        base = load_base_model(model, dtype="float32")
    heads = MedusaHeads.from_pretrained(heads_dir, base_model=base)
    if model and not heads.config.base_model_name_or_path:
        heads.config.base_model_name_or_path = model
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    heads.save_pretrained(out_dir, extra=getattr(heads, "extra_config", None))
    return out_dir


# ---- EAGLE formats (vLLM, SGLang, speculators) ----------------------------------------------

def _eagle_converter(name: str) -> Callable[..., Path]:
    def convert(heads_dir, out_dir, *, model: str | None = None, overwrite: bool = False) -> Path:
        """EagleDraft folder -> a `name` draft folder (config.json + model.safetensors); `model` names the
        base (verifier) where the format records one, default the draft's own base."""
        try:
            draft = load_draft(heads_dir)
        except ValueError as err:
            hint = " (Medusa heads export as 'vllm-medusa')" if _model_type(heads_dir) == MEDUSA_MODEL_TYPE else ""
            raise ValueError(f"format {name!r} exports EAGLE heads: {err}{hint}") from err
        config, tensors = export_eagle(name, draft, model=model, source=heads_dir)
        out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
        save_file(tensors, str(out_dir / VLLM_MEDUSA_WEIGHTS), metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return out_dir
    convert.__name__ = f"export_{name.replace('-', '_')}"
    return convert


def _read_config(directory: str | Path) -> dict:
    try:
        raw = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _model_type(directory: str | Path):
    return _read_config(directory).get("model_type")


def _is_eagle_export(directory: str | Path) -> bool:
    return detect_format(_read_config(directory)) is not None


FORMATS: dict[str, Callable[..., Path]] = {
    "vllm-medusa": export_vllm_medusa,
    "faster-decoding": export_faster_decoding,  # FasterDecoding/Medusa v0.1, the layout TGI loads
    "merged": export_merged,  # Medusa-2: the base with its LoRA folded in (out/model) + plain heads (out/heads)
    "specheads": export_specheads,
    **{name: _eagle_converter(name) for name in EAGLE_FORMATS},
}


def export(format: str, heads_dir: str | Path, out_dir: str | Path, **options) -> Path:
    """Convert `heads_dir` into `format` at `out_dir`."""
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[format](heads_dir, out_dir, **options)
