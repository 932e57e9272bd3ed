"""EAGLE drafts in the layouts vLLM and SGLang load (shared/REFERENCE.md §6), and back.

- `vllm-eagle` / `sglang-eagle` (EAGLE-1): a Llama-style config.json with num_hidden_layers=1
  (architectures LlamaForCausalLM / LlamaForCausalLMEagle; SGLang's "bias" says whether fc has one, vLLM's fc
  never has and vLLM would read "bias" as an o_proj bias) and model.safetensors with fc.*, layers.0.self_attn.*,
  layers.0.mlp.*, layers.0.post_attention_layernorm.weight; no embed/lm_head. A non-zero fc.bias is refused
  for vLLM (it would be dropped silently).
- `sglang-eagle3` (EAGLE-3): Llama-style config with architectures LlamaForCausalLMEagle3, draft_vocab_size
  and eagle_config.eagle_aux_hidden_state_layer_ids (each one less than ours: SGLang reads id k one layer
  later than vLLM does, see SGLANG_AUX_SHIFT); weights midlayer.*, fc.weight, norm.weight,
  lm_head.weight [draft_vocab, H], d2t (int64 offsets) and t2d (bool).
- `vllm-eagle3`: the vLLM "speculators" layout: speculators_model_type "eagle3", speculators_config
  (greedy proposals, verifier), transformer_layer_config, and the same tensors as sglang-eagle3 with the layer
  as `layers.0.*` (hidden_norm included), as the speculators library writes and reads them. vLLM builds
  Llama-style layers only: a draft whose layer is another architecture's (a Qwen2 layer with q/k/v biases,
  trained before eagle.layer defaulted to llama) is refused.

Attention biases are spelled out in every Llama-style config: `attention_bias` (q/k/v/o, as Llama) and
`qkv_bias` (q/k/v only, as Qwen2). Every export also carries a `specheads` entry (variant, base model,
the layer's own model_type) so that the reverse (`load_eagle_export`) rebuilds the same EagleDraft.
This module only maps between an EagleDraft and {config, tensors}; heads/export.py writes the files.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .eagle import EagleConfig, EagleDraft
from .medusa import read_json_config
from .weights import read_folder_safetensors

WEIGHTS_NAME = "model.safetensors"
EAGLE_FORMATS = {  # format -> the EagleDraft variant it carries
    "vllm-eagle": "eagle1", "sglang-eagle": "eagle1", "vllm-eagle3": "eagle3", "sglang-eagle3": "eagle3"}
LLAMA_ARCHITECTURES = {
    "vllm-eagle": ["LlamaForCausalLM"], "sglang-eagle": ["LlamaForCausalLMEagle"],
    "sglang-eagle3": ["LlamaForCausalLMEagle3"]}
SPECULATIVE_TOKENS = 5
# Entries of a transformers to_dict() that say nothing about the layer.
NOISE_KEYS = ("transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
              "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
              "problem_type", "output_attentions", "_name_or_path")
# What a Llama-style draft layer may hold (the rest of the draft is fc, norms, lm_head, d2t/t2d).
LAYER_TENSOR = re.compile(r"(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.(weight|bias)"
                          r"|(input_layernorm|post_attention_layernorm)\.weight")


def _require_variant(format: str, draft: EagleDraft, source) -> None:
    wanted = EAGLE_FORMATS[format]
    if draft.config.variant != wanted:
        raise ValueError(f"{source}: format {format!r} needs an {wanted} draft, but this draft's variant is "
                         f"{draft.config.variant!r}; export it as "
                         f"{' or '.join(f for f, v in EAGLE_FORMATS.items() if v == draft.config.variant)}")


def _exported_name(name: str, format: str) -> str:
    """EagleDraft tensor name -> its name in `format`: EAGLE-1 and the speculators layout (vllm-eagle3, what the
    speculators library writes and vLLM reads natively) keep `layers.0.*`, with EAGLE-3's hidden_norm inside
    the layer; SGLang's EAGLE-3 calls the layer `midlayer`."""
    if EAGLE_FORMATS[format] == "eagle1":
        return name
    layer_name = "layers.0." + name if name == "hidden_norm.weight" else name
    if format == "sglang-eagle3" and layer_name.startswith("layers.0."):
        return "midlayer." + layer_name.removeprefix("layers.0.")
    return layer_name


def _check_engine_layer(format: str, draft: EagleDraft, source) -> None:
    """Refuse what an engine would load wrongly without a word (REFERENCE §6)."""
    if format == "vllm-eagle" and draft.fc.bias is not None and draft.fc.bias.any():
        raise ValueError(f"{source}: tensor fc.bias is not zero, and vLLM's EAGLE-1 fc has no bias (it drops a "
                         f"shipped fc.bias silently, so the served draft would differ); export it as sglang-eagle, "
                         f"or train an EAGLE-1 draft without it (eagle.fc_bias: false, the default)")
    aux = draft.config.aux_layer_ids
    if format == "vllm-eagle3" and len(set(aux)) != len(aux):
        raise ValueError(f"{source}: eagle_aux_hidden_state_layer_ids {aux} name a layer twice; vLLM collects each "
                         f"layer once and would feed fc fewer than 3 states (a shape error at the first step)")
    model_type = draft.config.layer_config.get("model_type")
    if format == "vllm-eagle3" and model_type != "llama":
        raise ValueError(f"{source}: the draft layer is {model_type!r}-style; vLLM's EAGLE-3 loads Llama-style layers "
                         f"only ('Unsupported model_type {model_type} for Eagle3 speculator'). Train the draft with "
                         f"eagle.layer: llama (the default for EAGLE-3 drafts), whatever the base")


def export_tensors(draft: EagleDraft, format: str) -> dict[str, torch.Tensor]:
    """The draft's tensors under the exported names, each a contiguous CPU copy (vllm-eagle: a zero fc.bias,
    which vLLM has no place for, is left out)."""
    tensors = {}
    for name, tensor in draft.state_dict().items():
        if name.startswith("rotary_emb.") or (format == "vllm-eagle" and name == "fc.bias"):
            continue
        if name.startswith("layers.0.") and not LAYER_TENSOR.fullmatch(name.removeprefix("layers.0.")):
            raise ValueError(f"the draft layer (model_type {draft.config.layer_config.get('model_type')!r}) holds "
                             f"{name}, which a Llama-style EAGLE layer lacks; vLLM/SGLang cannot load it")
        tensors[_exported_name(name, format)] = tensor.detach().cpu().contiguous().clone()
    return tensors


def _bias_flags(draft: EagleDraft) -> dict:
    attention = draft.layers[0].self_attn
    mlp = draft.layers[0].mlp
    return {"attention_bias": attention.o_proj.bias is not None, "qkv_bias": attention.q_proj.bias is not None,
            "mlp_bias": getattr(mlp.gate_proj, "bias", None) is not None}


def _dtype_name(draft: EagleDraft) -> str:
    """The dtype the exported tensors have (not the one the base was trained in)."""
    return str(draft.fc.weight.dtype).removeprefix("torch.")


def layer_dict(draft: EagleDraft) -> dict:
    """The draft layer's config (the base's, num_hidden_layers=1) without transformers bookkeeping, plus
    explicit bias flags, flat rope settings for readers that predate rope_parameters, and torch_dtype."""
    layer = {k: v for k, v in draft.config.layer_config.items() if k not in NOISE_KEYS}
    if set(layer.get("layer_types") or ()) == {"full_attention"}:
        # The one entry kept for the one layer: vLLM numbers the draft layer after the target's (layer L) and
        # would index layer_types[L] ("out of bounds"); all-full attention is every reader's default anyway.
        del layer["layer_types"]
    layer.update(num_hidden_layers=1, tie_word_embeddings=False, torch_dtype=_dtype_name(draft), **_bias_flags(draft))
    layer.setdefault("head_dim", draft.layers[0].self_attn.head_dim)
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        layer.setdefault("rope_theta", rope["rope_theta"])
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        layer.setdefault("rope_scaling", scaling if scaling.get("rope_type", "default") != "default" else None)
    return layer


# SGLang adds 1 to explicit aux layer ids and captures the stream *before* that layer, so its id k reads what
# enters layer k + 1; vLLM (and specheads' aux_layer_ids, indices into HF hidden_states) read what enters layer k.
SGLANG_AUX_SHIFT = 1


def sglang_aux_ids(aux_layer_ids: list[int]) -> list[int]:
    """The ids to write for SGLang so that it reads the layers the draft was trained on."""
    if min(aux_layer_ids) < SGLANG_AUX_SHIFT:
        raise ValueError(f"aux_layer_ids {list(aux_layer_ids)}: SGLang cannot read the embeddings (hidden state 0) "
                         f"as an aux layer; its ids start at the output of layer 0")
    return [i - SGLANG_AUX_SHIFT for i in aux_layer_ids]


def _specheads_entry(draft: EagleDraft) -> dict:
    config = draft.config
    return {"variant": config.variant, "base_model_name_or_path": config.base_model_name_or_path,
            "layer_model_type": config.layer_config.get("model_type"), "aux_layer_ids": config.aux_layer_ids}


def verifier(draft: EagleDraft, model: str | None = None) -> dict:
    """speculators' verifier: the base as a Hub id where one is known (built-in names map to theirs)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from .model_card import hub_base_model

    name = model or draft.config.base_model_name_or_path
    layer = draft.config.layer_config
    architectures = layer.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(layer["model_type"])]
    return {"name_or_path": hub_base_model(name) or name, "architectures": [a for a in architectures if a]}


def export_config(format: str, draft: EagleDraft, model: str | None = None) -> dict:
    """config.json of `format` for this draft (its variant checked by export_eagle)."""
    config = draft.config
    if format == "vllm-eagle3":
        transformer_layer = layer_dict(draft)
        proposal = {"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS,
                    "verifier_accept_k": 1, "accept_tolerance": 0.0}
        return {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "draft_vocab_size": config.draft_vocab_size,
            "norm_before_residual": False,  # the residual is the un-normalised feature
            "target_hidden_size": config.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
            "transformer_layer_config": transformer_layer,
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [proposal],
                                   "default_proposal_method": "greedy", "verifier": verifier(draft, model)},
            "torch_dtype": transformer_layer["torch_dtype"],
            "specheads": _specheads_entry(draft),
        }
    llama = {**layer_dict(draft), "model_type": "llama", "architectures": LLAMA_ARCHITECTURES[format]}
    if format == "sglang-eagle":
        llama["bias"] = draft.fc.bias is not None  # SGLang's fc: 2H -> H (vLLM reads "bias" as o_proj's: never set)
    elif config.variant == "eagle3":
        llama["draft_vocab_size"] = config.draft_vocab_size
        llama["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sglang_aux_ids(config.aux_layer_ids)}
    llama["base_model_name_or_path"] = model or config.base_model_name_or_path
    llama["specheads"] = _specheads_entry(draft)
    return llama


def load_draft(directory: str | Path) -> EagleDraft:
    """EagleDraft.from_pretrained in the dtype its file stores (it builds float32 modules), so that an
    export neither rounds float64 weights nor doubles the size of bfloat16 ones."""
    draft = EagleDraft.from_pretrained(directory)
    state = read_folder_safetensors(directory, WEIGHTS_NAME)
    draft.to(state["fc.weight"].dtype)
    draft.load_state_dict(state, strict=False)
    return draft


def export_eagle(format: str, draft: EagleDraft, model: str | None = None,
                 source="draft") -> tuple[dict, dict[str, torch.Tensor]]:
    """EagleDraft -> (config.json dict, tensors) of an EAGLE `format`."""
    if format not in EAGLE_FORMATS:
        raise ValueError(f"unknown EAGLE format {format!r}; expected one of {', '.join(EAGLE_FORMATS)}")
    _require_variant(format, draft, source)
    _check_engine_layer(format, draft, source)
    tensors = export_tensors(draft, format)  # first: it refuses layers that are not Llama-style
    return export_config(format, draft, model), tensors


# ---- reverse: an exported folder -> EagleDraft ---------------------------------------------------

def detect_format(raw: dict) -> str | None:
    """Which EAGLE export a config.json describes (None: not one)."""
    if raw.get("speculators_model_type") == "eagle3":
        return "vllm-eagle3"
    for format, architectures in LLAMA_ARCHITECTURES.items():
        if raw.get("architectures") == architectures and raw.get("num_hidden_layers") == 1 and (
                format != "vllm-eagle" or "bias" in raw or "specheads" in raw):
            return format
    return None


def _layer_config_back(layer: dict, model_type: str) -> dict:
    """An exported layer dict -> EagleConfig.layer_config (model_type restored, export-only keys dropped)."""
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type).to_dict()
    exported_only = {"bias", "draft_vocab_size", "eagle_config", "specheads", "base_model_name_or_path",
                     "architectures", "torch_dtype", "attention_bias", "qkv_bias", "mlp_bias"}
    result = {k: v for k, v in layer.items() if k not in exported_only or k in defaults and k != "architectures"}
    if "rope_parameters" in result:  # flat rope keys were written for older readers only
        result.pop("rope_theta", None)
        result.pop("rope_scaling", None)
    result["model_type"] = model_type
    result["num_hidden_layers"] = 1
    return result


def _int_list(value, what: str, path: Path) -> list[int]:
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{path}: {what} must list the 3 base layers the draft reads, got {value!r}")
    return value


def eagle_config_from_export(format: str, raw: dict, path: Path, fc_bias: bool = False) -> EagleConfig:
    ours = raw.get("specheads") or {}
    if format == "vllm-eagle3":
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict) or "model_type" not in layer:
            raise ValueError(f"{path}: transformer_layer_config must be a config dict with a model_type")
        model_type = layer["model_type"]
        aux = raw.get("eagle_aux_hidden_state_layer_ids") or ours.get("aux_layer_ids")
        base = ours.get("base_model_name_or_path") or raw.get("speculators_config", {}).get(
            "verifier", {}).get("name_or_path", "")
    else:
        layer = raw
        model_type = ours.get("layer_model_type") or ("qwen2" if raw.get("qkv_bias") and not raw.get(
            "attention_bias") else "llama")
        sglang = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux = [i + SGLANG_AUX_SHIFT for i in _int_list(sglang, "eagle_aux_hidden_state_layer_ids", path)] if sglang \
            else ours.get("aux_layer_ids")
        base = ours.get("base_model_name_or_path") or raw.get("base_model_name_or_path") or ""
    variant = EAGLE_FORMATS[format]
    try:
        return EagleConfig(
            variant=variant, hidden_size=layer.get("hidden_size"), vocab_size=layer.get("vocab_size"),
            draft_vocab_size=raw.get("draft_vocab_size", 0) if variant == "eagle3" else 0,
            aux_layer_ids=_int_list(aux, "eagle_aux_hidden_state_layer_ids", path) if variant == "eagle3" else [],
            base_model_name_or_path=base, layer_config=_layer_config_back(layer, model_type), fc_bias=fc_bias)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from err


def load_eagle_export(directory: str | Path, format: str | None = None) -> EagleDraft:
    """A folder written as `format` (found from its config.json when None) -> the EagleDraft it holds."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"no exported EAGLE draft at {directory}: config.json is missing")
    path, raw = read_json_config(directory)
    format = format or detect_format(raw)
    if format not in EAGLE_FORMATS:
        raise ValueError(f"{path}: not an EAGLE export ({', '.join(EAGLE_FORMATS)})")
    state = read_folder_safetensors(directory, WEIGHTS_NAME)
    fc_bias = raw.get("bias", "fc.bias" in state) if format == "sglang-eagle" else "fc.bias" in state
    draft = EagleDraft(eagle_config_from_export(format, raw, path, fc_bias=bool(fc_bias)))
    if "fc.weight" in state:
        draft.to(state["fc.weight"].dtype)  # keep the file's precision (float buffers d2t/t2d are not float)
    expected = {_exported_name(name, format): (name, tensor)
                for name, tensor in draft.state_dict().items() if not name.startswith("rotary_emb.")}
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(f"{directory / WEIGHTS_NAME}: missing tensors {missing}, unexpected tensors {unexpected}")
    ours = {}
    for theirs, (name, tensor) in expected.items():
        if state[theirs].shape != tensor.shape:
            raise ValueError(f"{directory / WEIGHTS_NAME}: tensor {theirs} has shape {tuple(state[theirs].shape)}, "
                             f"expected {tuple(tensor.shape)}")
        ours[name] = state[theirs]
    draft.load_state_dict(ours, strict=False)
    draft.extra_config = {"imported_from": format}
    return draft
