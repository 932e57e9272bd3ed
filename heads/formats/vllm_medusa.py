"""vLLM's Medusa draft model (vLLM <= 0.32, the last with Medusa), both directions.

config.json: model_type "medusa", num_heads, num_hidden_layers, hidden_size, vocab_size, truncated_vocab_size,
medusa_fc_bias, original_lm_head; model.safetensors: `blocks.{i}.layers.{j}.weight/bias` and `lm_heads.{i}.weight`
(with original_lm_head, lm_heads.0 is the base's own lm_head). vLLM cannot load a draft vocabulary: its model never
reports `token_map` as loaded, so its loader refuses such a folder; exports always carry the full vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..files import WEIGHTS_NAME, read_json_config, write_folder
from ..medusa import MedusaConfig, MedusaHeads
from ..weights import read_safetensors, refuse_pickles
from .common import checked_lm_head, full_vocabulary_only, int_field, load_renamed, own_copies, prepare_out_dir, \
    shared_lm_head

NAME = "vllm-medusa"
KIND = "medusa"


def detect(raw: dict) -> bool:
    return raw.get("model_type") == "medusa"


def tensor_names(config: MedusaConfig) -> dict[str, str]:
    """specheads tensor name -> vLLM Medusa tensor name (blocks, and the heads' own lm_heads)."""
    names = {}
    for i in range(config.num_heads):
        for j in range(config.num_layers):
            for kind in ("weight", "bias"):
                names[f"blocks.{i}.{j}.linear.{kind}"] = f"blocks.{i}.layers.{j}.{kind}"
        if config.own_lm_head:
            names[f"lm_heads.{i}.weight"] = f"lm_heads.{i}.weight"
    return names


def to_config(config: MedusaConfig) -> dict:
    """vLLM's config.json for these heads: shared-lm_head heads ship the base lm_head as lm_heads.0."""
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


def to_tensors(heads: MedusaHeads, base_lm_head: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The tensors of vLLM's Medusa draft model; `base_lm_head` [V, H] is needed for shared-lm_head heads."""
    full_vocabulary_only(heads, "vLLM's Medusa (no token_map)")
    own = heads.state_dict()
    tensors = {theirs: own[ours] for ours, theirs in tensor_names(heads.config).items()}
    if not heads.config.own_lm_head:
        tensors["lm_heads.0.weight"] = checked_lm_head(heads, base_lm_head, "lm_heads.0.weight")
    return own_copies(tensors)


def export(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
           lm_head_weight: torch.Tensor | None = None, overwrite: bool = False) -> Path:
    """Heads folder -> a vLLM Medusa draft folder (`--speculative-config '{"model": out_dir, ...}'`)."""
    heads = MedusaHeads.from_pretrained(heads_dir)
    tensors = to_tensors(heads, shared_lm_head(heads, heads_dir, model, lm_head_weight))
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    return write_folder(out_dir, to_config(heads.config), tensors)


def load(directory: str | Path, base_model=None) -> MedusaHeads:
    """A vLLM Medusa draft folder -> MedusaHeads. With original_lm_head, lm_heads.0 is the base's own
    lm_head, so the heads come back as shared-lm_head heads (pass the base lm_head when calling them)."""
    directory = Path(directory)
    config_path, raw = read_json_config(directory)
    fields = {key: int_field(raw, key, config_path)
              for key in ("num_heads", "num_hidden_layers", "hidden_size", "vocab_size")}
    truncated = int_field(raw, "truncated_vocab_size", config_path) if "truncated_vocab_size" in raw else None
    draft_vocab_size = truncated if truncated not in (None, fields["vocab_size"]) else 0  # token_map rows
    original_lm_head = bool(raw.get("original_lm_head", False))
    try:
        config = MedusaConfig(num_heads=fields["num_heads"], num_layers=fields["num_hidden_layers"],
                              hidden_size=fields["hidden_size"], vocab_size=fields["vocab_size"],
                              own_lm_head=not original_lm_head, draft_vocab_size=draft_vocab_size,
                              base_model_name_or_path=raw.get("base_model_name_or_path") or "")
    except ValueError as err:
        raise ValueError(f"{config_path}: {err}") from err
    weights_path = directory / WEIGHTS_NAME
    if not weights_path.is_file():
        refuse_pickles(directory, WEIGHTS_NAME)
    state = {name.removeprefix("medusa_heads."): tensor for name, tensor in read_safetensors(weights_path).items()}
    if original_lm_head:
        state.pop("lm_heads.0.weight", None)  # the base lm_head: the base model brings its own
    names = tensor_names(config)
    unexpected = sorted(set(state) - set(names.values()) - {"token_map"})
    if unexpected:
        raise ValueError(f"{weights_path}: unexpected tensors {', '.join(unexpected[:8])}")
    renamed = {}
    for ours, theirs in names.items():
        if theirs in state:
            renamed[ours] = (theirs, state[theirs])
        elif theirs.endswith(".bias") and not raw.get("medusa_fc_bias", False):  # blocks without bias
            renamed[ours] = (theirs, torch.zeros(config.hidden_size))
    if draft_vocab_size:
        if "token_map" not in state:
            raise ValueError(f"{weights_path}: truncated_vocab_size {truncated} < vocab_size needs a token_map tensor")
        renamed["draft_ids"] = ("token_map", state["token_map"].long())
    return load_renamed(config, renamed, weights_path, {"imported_from": NAME})
