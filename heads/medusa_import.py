"""Read Medusa heads trained or converted elsewhere into MedusaHeads.

- FasterDecoding/Medusa v0.1: config.json with `medusa_num_heads`, `medusa_num_layers`,
  `base_model_name_or_path`; tensors `{head}.{layer}.linear.weight/bias` and, when each head has its
  own projection, `{head}.{L}.weight` (L = medusa_num_layers), in `medusa_lm_head.safetensors` or
  `medusa_lm_head.pt` (the one pickle specheads reads, with torch.load(weights_only=True)).
- vLLM Medusa drafts (what `export.py` writes): `blocks.{i}.layers.{j}.*` and `lm_heads.{i}.weight`.

`MedusaHeads.from_pretrained` sends any folder that is not specheads' own format here.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from .export import FASTER_DECODING_SAFETENSORS, VLLM_MEDUSA_WEIGHTS, vllm_medusa_names
from .medusa import MODEL_TYPE, MedusaConfig, MedusaHeads, check_compatible, read_json_config
from .weights import read_pickle_weights_only, read_safetensors, refuse_pickles

FASTER_DECODING_PICKLE = "medusa_lm_head.pt"


def _int_field(raw: dict, key: str, path: Path, default=None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{path}: field {key!r} must be a non-negative integer, got {value!r}")
    return value


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
    heads.extra_config = extra
    return heads


# ---- FasterDecoding/Medusa v0.1 ----------------------------------------------------------------

def faster_decoding_weights(directory: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """medusa_lm_head.safetensors, else medusa_lm_head.pt read weights-only; no other pickle."""
    safetensors_path, pickle_path = directory / FASTER_DECODING_SAFETENSORS, directory / FASTER_DECODING_PICKLE
    if safetensors_path.is_file():
        return safetensors_path, read_safetensors(safetensors_path)
    if pickle_path.is_file():
        return pickle_path, read_pickle_weights_only(pickle_path)
    refuse_pickles(directory, FASTER_DECODING_SAFETENSORS)
    raise FileNotFoundError(f"{directory}: neither {FASTER_DECODING_SAFETENSORS} nor {FASTER_DECODING_PICKLE} found")


def _vocab_size(raw: dict, base_model, config_path: Path) -> int:
    """Shared-lm_head heads hold no vocabulary-sized tensor: take V from the base model or its config."""
    if base_model is not None:
        return base_model.config.vocab_size
    if "vocab_size" in raw:
        return _int_field(raw, "vocab_size", config_path)
    name = raw.get("base_model_name_or_path")
    try:
        from transformers import AutoConfig

        from specheads.data.models import resolve_model

        return AutoConfig.from_pretrained(resolve_model(name)).vocab_size
    except Exception as err:
        raise ValueError(f"{config_path}: these heads share the base lm_head, so the vocabulary size comes from "
                         f"the base model {name!r}, whose config could not be read ({err}); pass base_model"
                         ) from err


def _trust_the_tensors(state: dict, pattern, num_heads: int, num_layers: int, config_path: Path,
                       weights_path: Path) -> tuple[int, int]:
    """Heads and blocks as the weights file holds them. Published configs can disagree with their tensors
    (medusa-vicuna-7b-v1.3: medusa_num_heads 2, five heads stored); FasterDecoding builds from the tensors it
    loads, so do we, and say so."""
    matches = [m for m in map(pattern.fullmatch, state) if m]
    heads = 1 + max((int(m[1]) for m in matches), default=num_heads - 1)
    layers = 1 + max((int(m[2]) for m in matches if m[3].startswith("linear.")), default=num_layers - 1)
    for key, stated, found in (("medusa_num_heads", num_heads, heads), ("medusa_num_layers", num_layers, layers)):
        if stated != found:
            warnings.warn(f"{config_path}: {key} is {stated}, but {weights_path.name} holds {found}; "
                          f"using the tensors, as FasterDecoding's loader does", stacklevel=3)
    return heads, layers


def import_faster_decoding(directory: str | Path, base_model=None) -> MedusaHeads:
    """A FasterDecoding/Medusa v0.1 heads folder -> MedusaHeads (own or shared lm_head layout)."""
    directory = Path(directory)
    config_path, raw = read_json_config(directory)
    num_heads = _int_field(raw, "medusa_num_heads", config_path)
    num_layers = _int_field(raw, "medusa_num_layers", config_path, default=1)
    weights_path, state = faster_decoding_weights(directory)
    state = {name.removeprefix("medusa_head."): tensor for name, tensor in state.items()}

    pattern = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")
    num_heads, num_layers = _trust_the_tensors(state, pattern, num_heads, num_layers, config_path, weights_path)
    renamed, own_lm_head = {}, False
    for name, tensor in state.items():
        match = pattern.fullmatch(name)
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
    return load_renamed(config, renamed, weights_path, {"imported_from": "faster-decoding"})


# ---- vLLM Medusa ------------------------------------------------------------------------------

def import_vllm_medusa(directory: str | Path) -> MedusaHeads:
    """A vLLM Medusa draft folder -> MedusaHeads. With original_lm_head, lm_heads.0 is the base's own
    lm_head, so the heads come back as shared-lm_head heads (pass the base lm_head when calling them)."""
    directory = Path(directory)
    config_path, raw = read_json_config(directory)
    fields = {key: _int_field(raw, key, config_path)
              for key in ("num_heads", "num_hidden_layers", "hidden_size", "vocab_size")}
    truncated = _int_field(raw, "truncated_vocab_size", config_path) if "truncated_vocab_size" in raw else None
    draft_vocab_size = truncated if truncated not in (None, fields["vocab_size"]) else 0  # token_map rows
    original_lm_head = bool(raw.get("original_lm_head", False))
    try:
        config = MedusaConfig(num_heads=fields["num_heads"], num_layers=fields["num_hidden_layers"],
                              hidden_size=fields["hidden_size"], vocab_size=fields["vocab_size"],
                              own_lm_head=not original_lm_head, draft_vocab_size=draft_vocab_size,
                              base_model_name_or_path=raw.get("base_model_name_or_path") or "")
    except ValueError as err:
        raise ValueError(f"{config_path}: {err}") from err
    weights_path = directory / VLLM_MEDUSA_WEIGHTS
    if not weights_path.is_file():
        refuse_pickles(directory, VLLM_MEDUSA_WEIGHTS)
    state = {name.removeprefix("medusa_heads."): tensor for name, tensor in read_safetensors(weights_path).items()}
    if original_lm_head:
        state.pop("lm_heads.0.weight", None)  # the base lm_head: the base model brings its own
    names = vllm_medusa_names(config)
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
    return load_renamed(config, renamed, weights_path, {"imported_from": "vllm-medusa"})


# ---- dispatch ---------------------------------------------------------------------------------

def import_foreign(directory: str | Path, base_model=None) -> MedusaHeads:
    """Any non-specheads Medusa folder -> MedusaHeads, checked against `base_model` when given."""
    config_path, raw = read_json_config(directory)
    if raw.get("model_type") == "medusa":
        heads = import_vllm_medusa(directory)
    elif "medusa_num_heads" in raw:
        heads = import_faster_decoding(directory, base_model=base_model)
    else:
        raise ValueError(f"{config_path}: model_type is {raw.get('model_type')!r}; expected {MODEL_TYPE!r} "
                         f"(specheads), 'medusa' (vLLM) or a FasterDecoding Medusa config (medusa_num_heads)")
    if base_model is not None:
        check_compatible(heads.config, base_model.config, source=str(directory))
    return heads
