"""FasterDecoding/Medusa v0.1, the layout TGI loads, both directions.

config.json: `medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`; tensors `{head}.{layer}.linear.weight/
bias` and each head's own projection `{head}.{L}.weight` (L = medusa_num_layers), in `medusa_lm_head.safetensors`,
or in `medusa_lm_head.pt` (the one pickle specheads reads, with torch.load(weights_only=True)). Published configs
can disagree with their tensors; FasterDecoding builds its heads from the tensors, and so does `load` (with a warning).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from ..files import read_json_config, write_folder
from ..medusa import MedusaConfig, MedusaHeads
from ..weights import read_pickle_weights_only, read_safetensors, refuse_pickles
from .common import checked_lm_head, full_vocabulary_only, hub_base_model, int_field, load_renamed, own_copies, \
    prepare_out_dir, shared_lm_head

NAME = "faster-decoding"
KIND = "medusa"
WEIGHTS_NAME = "medusa_lm_head.safetensors"
PICKLE_NAME = "medusa_lm_head.pt"
TENSOR = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")


def detect(raw: dict) -> bool:
    return "medusa_num_heads" in raw


def to_tensors(heads: MedusaHeads, base_lm_head: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
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
    return own_copies(tensors)


def export(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
           lm_head_weight: torch.Tensor | None = None, overwrite: bool = False) -> Path:
    """Heads folder -> a FasterDecoding/Medusa v0.1 folder (config.json + medusa_lm_head.safetensors)."""
    heads = MedusaHeads.from_pretrained(heads_dir)
    config = heads.config
    tensors = to_tensors(heads, shared_lm_head(heads, heads_dir, model, lm_head_weight))
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    base = model or config.base_model_name_or_path
    return write_folder(out_dir, {
        "medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
        "base_model_name_or_path": hub_base_model(base) or base, "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size}, tensors, weights_name=WEIGHTS_NAME)


def _weights(directory: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """medusa_lm_head.safetensors, else medusa_lm_head.pt read weights-only; no other pickle."""
    safetensors_path, pickle_path = directory / WEIGHTS_NAME, directory / PICKLE_NAME
    if safetensors_path.is_file():
        return safetensors_path, read_safetensors(safetensors_path)
    if pickle_path.is_file():
        return pickle_path, read_pickle_weights_only(pickle_path)
    refuse_pickles(directory, WEIGHTS_NAME)
    raise FileNotFoundError(f"{directory}: neither {WEIGHTS_NAME} nor {PICKLE_NAME} found")


def _vocab_size(raw: dict, base_model, config_path: Path) -> int:
    """Shared-lm_head heads hold no vocabulary-sized tensor: take V from the base model or its config."""
    if base_model is not None:
        return base_model.config.vocab_size
    if "vocab_size" in raw:
        return int_field(raw, "vocab_size", config_path)
    name = raw.get("base_model_name_or_path")
    try:
        from transformers import AutoConfig

        from specheads.data.models import resolve_model

        return AutoConfig.from_pretrained(resolve_model(name)).vocab_size
    except Exception as err:
        raise ValueError(f"{config_path}: these heads share the base lm_head, so the vocabulary size comes from "
                         f"the base model {name!r}, whose config could not be read ({err}); pass base_model"
                         ) from err


def _trust_the_tensors(state: dict, num_heads: int, num_layers: int, config_path: Path,
                       weights_path: Path) -> tuple[int, int]:
    """Heads and blocks as the weights file holds them (medusa-vicuna-7b-v1.3: medusa_num_heads 2, five stored)."""
    matches = [m for m in map(TENSOR.fullmatch, state) if m]
    heads = 1 + max((int(m[1]) for m in matches), default=num_heads - 1)
    layers = 1 + max((int(m[2]) for m in matches if m[3].startswith("linear.")), default=num_layers - 1)
    for key, stated, found in (("medusa_num_heads", num_heads, heads), ("medusa_num_layers", num_layers, layers)):
        if stated != found:
            warnings.warn(f"{config_path}: {key} is {stated}, but {weights_path.name} holds {found}; "
                          f"using the tensors, as FasterDecoding's loader does", stacklevel=3)
    return heads, layers


def load(directory: str | Path, base_model=None) -> MedusaHeads:
    """A FasterDecoding/Medusa v0.1 heads folder -> MedusaHeads (own or shared lm_head layout)."""
    directory = Path(directory)
    config_path, raw = read_json_config(directory)
    num_heads = int_field(raw, "medusa_num_heads", config_path)
    num_layers = int_field(raw, "medusa_num_layers", config_path, default=1)
    weights_path, state = _weights(directory)
    state = {name.removeprefix("medusa_head."): tensor for name, tensor in state.items()}
    num_heads, num_layers = _trust_the_tensors(state, num_heads, num_layers, config_path, weights_path)
    renamed, own_lm_head = {}, False
    for name, tensor in state.items():
        match = TENSOR.fullmatch(name)
        head, layer, kind = (int(match[1]), int(match[2]), match[3]) if match else (-1, -1, "")
        block_ok = kind.startswith("linear.") and layer < num_layers
        lm_head_ok = kind == "weight" and layer == num_layers
        if not 0 <= head < num_heads or not (block_ok or lm_head_ok):
            raise ValueError(f"{weights_path}: unexpected tensor {name!r} for {num_heads} heads x {num_layers} "
                             f"layers (expected '{{head}}.{{layer}}.linear.weight/bias' and '{{head}}.{num_layers}"
                             f".weight')")
        if kind == "weight":
            own_lm_head = True
            renamed[f"lm_heads.{head}.weight"] = (name, tensor)
        else:
            renamed[f"blocks.{head}.{layer}.{kind}"] = (name, tensor)

    if own_lm_head:
        vocab_size, hidden_size = renamed["lm_heads.0.weight"][1].shape if "lm_heads.0.weight" in renamed else (0, 0)
    else:
        vocab_size = _vocab_size(raw, base_model, config_path)
        hidden_size = renamed["blocks.0.0.linear.weight"][1].shape[1] if "blocks.0.0.linear.weight" in renamed else 0
    if not hidden_size and base_model is not None:
        hidden_size = base_model.config.hidden_size
    try:
        config = MedusaConfig(num_heads=num_heads, num_layers=num_layers, hidden_size=int(hidden_size),
                              vocab_size=int(vocab_size), own_lm_head=own_lm_head,
                              base_model_name_or_path=raw.get("base_model_name_or_path") or "")
    except ValueError as err:
        raise ValueError(f"{weights_path}: cannot infer the head sizes ({err}); head 0's tensors are missing?") from err
    return load_renamed(config, renamed, weights_path, {"imported_from": NAME})
