"""Medusa-2 heads as a merged base model beside plain heads: `out/model` is the base with the heads' LoRA adapter
folded in (safetensors, with its tokenizer), `out/heads` plain heads whose base_model_name_or_path is that folder.
Anything that loads an HF model serves `out/model`; specheads decodes with `--model out/model --heads out/heads`.
There is no reverse: the heads folder with its adapter/ inside is already specheads' own form.
"""

from __future__ import annotations

from pathlib import Path

from ..files import read_json_config
from ..joint import adapter_of, load_adapted_base
from ..medusa import MedusaHeads
from .common import prepare_out_dir

NAME = "merged"
KIND = "medusa"


def detect(raw: dict) -> bool:
    return False  # out/heads is a specheads folder, out/model an HF model


def export(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None, overwrite: bool = False,
           dtype: str = "auto") -> Path:
    """Write out/model (the base with the adapter folded in, safetensors, with its tokenizer) and out/heads
    (plain heads whose base_model_name_or_path is that folder). model: the base (default: the heads' own)."""
    from specheads.data.models import load_base_model, load_tokenizer

    if adapter_of(heads_dir) is None:
        raise ValueError(f"{heads_dir} holds plain heads (no LoRA adapter): nothing to merge")
    heads = MedusaHeads.from_pretrained(heads_dir)
    base_name = model or heads.config.base_model_name_or_path
    out = prepare_out_dir(out_dir, heads_dir, overwrite, inputs=[("base model", base_name)])
    merged = load_adapted_base(load_base_model(base_name, dtype), heads_dir)
    model_dir, heads_out = out / "model", out / "heads"
    merged.save_pretrained(model_dir, safe_serialization=True)
    load_tokenizer(base_name).save_pretrained(model_dir)
    _, config = read_json_config(heads_dir)
    extra = {k: v for k, v in config.items() if k not in ("adapter", "model_type") and k not in vars(heads.config)}
    heads.config.base_model_name_or_path = str(model_dir.resolve())
    heads.save_pretrained(heads_out, extra=extra)
    return out
