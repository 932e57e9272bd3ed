"""What the engines' EAGLE formats share: one Llama-style decoder layer, named and configured their way.

vLLM, SGLang and the speculators library build an EAGLE draft's layer as a Llama decoder layer from a Llama-style
config (shared/REFERENCE.md §6). `EagleLayout` maps an EagleDraft to {config.json, tensors} and back; each format
module (vllm_eagle, speculators, sglang) subclasses it with its names, its config and its refusals.

Attention biases are spelled out in every Llama-style config: `attention_bias` (q/k/v/o, as Llama) and `qkv_bias`
(q/k/v only, as Qwen2). Every export also carries a `specheads` entry (variant, base model, the layer's own
model_type) so that `load` rebuilds the same EagleDraft.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..eagle import EagleConfig, EagleDraft
from ..files import WEIGHTS_NAME, read_json_config, write_folder
from ..weights import read_folder_safetensors
from .common import hub_base_model, prepare_out_dir

SPECULATIVE_TOKENS = 5
# Entries of a transformers to_dict() that say nothing about the layer.
NOISE_KEYS = ("transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
              "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
              "problem_type", "output_attentions", "_name_or_path")
# What a Llama-style draft layer may hold (the rest of the draft is fc, norms, lm_head, d2t/t2d).
LAYER_TENSOR = re.compile(r"(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.(weight|bias)"
                          r"|(input_layernorm|post_attention_layernorm)\.weight")
# Keys of an exported Llama-style config that are not the layer's own.
EXPORT_ONLY_KEYS = {"bias", "draft_vocab_size", "eagle_config", "specheads", "base_model_name_or_path",
                    "architectures", "torch_dtype", "attention_bias", "qkv_bias", "mlp_bias"}


def load_draft(directory: str | Path) -> EagleDraft:
    """EagleDraft.from_pretrained in the dtype its file stores (it builds float32 modules), so that an
    export neither rounds float64 weights nor doubles the size of bfloat16 ones."""
    draft = EagleDraft.from_pretrained(directory)
    state = read_folder_safetensors(directory, WEIGHTS_NAME)
    draft.to(state["fc.weight"].dtype)
    draft.load_state_dict(state, strict=False)
    return draft


def bias_flags(draft: EagleDraft) -> dict:
    attention = draft.layers[0].self_attn
    mlp = draft.layers[0].mlp
    return {"attention_bias": attention.o_proj.bias is not None, "qkv_bias": attention.q_proj.bias is not None,
            "mlp_bias": getattr(mlp.gate_proj, "bias", None) is not None}


def dtype_name(draft: EagleDraft) -> str:
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
    layer.update(num_hidden_layers=1, tie_word_embeddings=False, torch_dtype=dtype_name(draft), **bias_flags(draft))
    layer.setdefault("head_dim", draft.layers[0].self_attn.head_dim)
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        layer.setdefault("rope_theta", rope["rope_theta"])
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        layer.setdefault("rope_scaling", scaling if scaling.get("rope_type", "default") != "default" else None)
    return layer


def specheads_entry(draft: EagleDraft) -> dict:
    config = draft.config
    return {"variant": config.variant, "base_model_name_or_path": config.base_model_name_or_path,
            "layer_model_type": config.layer_config.get("model_type"), "aux_layer_ids": config.aux_layer_ids}


def verifier(draft: EagleDraft, model: str | None = None) -> dict:
    """speculators' verifier: the base as a Hub id where one is known (built-in names map to theirs)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = model or draft.config.base_model_name_or_path
    layer = draft.config.layer_config
    architectures = layer.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(layer["model_type"])]
    return {"name_or_path": hub_base_model(name) or name, "architectures": [a for a in architectures if a]}


def layer_config_back(layer: dict, model_type: str) -> dict:
    """An exported layer dict -> EagleConfig.layer_config (model_type restored, export-only keys dropped)."""
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type).to_dict()
    result = {k: v for k, v in layer.items() if k not in EXPORT_ONLY_KEYS or k in defaults and k != "architectures"}
    if "rope_parameters" in result:  # flat rope keys were written for older readers only
        result.pop("rope_theta", None)
        result.pop("rope_scaling", None)
    result["model_type"] = model_type
    result["num_hidden_layers"] = 1
    return result


def int_list(value, what: str, path: Path) -> list[int]:
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{path}: {what} must list the 3 base layers the draft reads, got {value!r}")
    return value


def llama_config(draft: EagleDraft, architectures: list[str], model: str | None) -> dict:
    """A Llama-style config.json (vLLM's and SGLang's EAGLE-1, SGLang's EAGLE-3): the layer, plus where the
    draft comes from."""
    return {**layer_dict(draft), "model_type": "llama", "architectures": architectures,
            "base_model_name_or_path": model or draft.config.base_model_name_or_path,
            "specheads": specheads_entry(draft)}


class EagleLayout:
    """One engine's EAGLE folder (config.json + model.safetensors). Subclasses set NAME and KIND (the draft
    variant it carries) and give `detect`, `to_config` and `config_back`; they may rename tensors and refuse
    what their engine would load wrongly without a word."""

    NAME = ""
    KIND = ""  # "eagle1" or "eagle3"

    def detect(self, raw: dict) -> bool:
        raise NotImplementedError

    def to_config(self, draft: EagleDraft, model: str | None) -> dict:
        raise NotImplementedError

    def config_back(self, raw: dict, path: Path, fc_bias: bool) -> EagleConfig:
        """The EagleConfig an exported config.json describes."""
        raise NotImplementedError

    def exported_name(self, name: str) -> str:
        """EagleDraft tensor name -> its name in this format."""
        return name

    def check(self, draft: EagleDraft, source) -> None:
        """Refuse what the engine would load wrongly without a word (REFERENCE §6)."""

    def adapt(self, draft: EagleDraft, source, **options) -> EagleDraft:
        """The draft as this format will carry it (format-specific options, e.g. speculators' llama_layer)."""
        if options:
            raise ValueError(f"format {self.NAME!r} takes no option {', '.join(options)}")
        return draft

    def keeps(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether a draft tensor is written (rotary caches never are)."""
        return not name.startswith("rotary_emb.")

    def fc_bias(self, raw: dict, state: dict) -> bool:
        return "fc.bias" in state

    # ---- both directions, the same for every layout ---------------------------------------------------

    def to_tensors(self, draft: EagleDraft) -> dict[str, torch.Tensor]:
        """The draft's tensors under the exported names, each a contiguous CPU copy."""
        tensors = {}
        for name, tensor in draft.state_dict().items():
            if not self.keeps(name, tensor):
                continue
            if name.startswith("layers.0.") and not LAYER_TENSOR.fullmatch(name.removeprefix("layers.0.")):
                raise ValueError(f"the draft layer (model_type {draft.config.layer_config.get('model_type')!r}) "
                                 f"holds {name}, which a Llama-style EAGLE layer lacks; vLLM/SGLang cannot load it")
            tensors[self.exported_name(name)] = tensor.detach().cpu().contiguous().clone()
        return tensors

    def convert(self, draft: EagleDraft, model: str | None = None, source="draft") -> tuple[dict, dict]:
        """EagleDraft -> (config.json dict, tensors) of this format."""
        if draft.config.variant != self.KIND:
            raise ValueError(f"{source}: format {self.NAME!r} needs an {self.KIND} draft, but this draft's variant is "
                             f"{draft.config.variant!r}; export it in a format for {draft.config.variant} drafts "
                             f"(scripts/export.py --help lists them)")
        self.check(draft, source)
        tensors = self.to_tensors(draft)  # first: it refuses layers that are not Llama-style
        return self.to_config(draft, model), tensors

    def export(self, heads_dir, out_dir, *, model: str | None = None, overwrite: bool = False, **options) -> Path:
        """EagleDraft folder -> a folder of this format; `model` names the base (verifier) where the format
        records one, default the draft's own base; `options` go to `adapt`."""
        try:
            draft = load_draft(heads_dir)
        except ValueError as err:
            _, raw = read_json_config(heads_dir, what="EAGLE draft")
            hint = " (Medusa heads export as 'vllm-medusa')" if "medusa" in str(raw.get("model_type")) else ""
            raise ValueError(f"format {self.NAME!r} exports EAGLE heads: {err}{hint}") from err
        draft = self.adapt(draft, heads_dir, **options)
        config, tensors = self.convert(draft, model=model, source=heads_dir)
        out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
        return write_folder(out_dir, config, tensors)

    def load(self, directory, base_model=None) -> EagleDraft:
        """A folder written in this format -> the EagleDraft it holds."""
        directory = Path(directory)
        path, raw = read_json_config(directory, what="exported EAGLE draft")
        state = read_folder_safetensors(directory, WEIGHTS_NAME)
        draft = EagleDraft(self.config_back(raw, path, fc_bias=bool(self.fc_bias(raw, state))))
        if "fc.weight" in state:
            draft.to(state["fc.weight"].dtype)  # keep the file's precision (float buffers d2t/t2d are not float)
        expected = {self.exported_name(name): (name, tensor)
                    for name, tensor in draft.state_dict().items() if not name.startswith("rotary_emb.")}
        missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
        if missing or unexpected:
            raise ValueError(f"{directory / WEIGHTS_NAME}: missing tensors {missing}, unexpected tensors {unexpected}")
        ours = {}
        for theirs, (name, tensor) in expected.items():
            if state[theirs].shape != tensor.shape:
                raise ValueError(f"{directory / WEIGHTS_NAME}: tensor {theirs} has shape "
                                 f"{tuple(state[theirs].shape)}, expected {tuple(tensor.shape)}")
            ours[name] = state[theirs]
        draft.load_state_dict(ours, strict=False)
        draft.extra_config = {"imported_from": self.NAME}
        return draft


def eagle_config(variant: str, layer: dict, model_type: str, aux, base: str, draft_vocab_size: int, path: Path,
                 fc_bias: bool) -> EagleConfig:
    """EagleConfig from what an export holds; a bad value is an error naming the file."""
    try:
        return EagleConfig(
            variant=variant, hidden_size=layer.get("hidden_size"), vocab_size=layer.get("vocab_size"),
            draft_vocab_size=draft_vocab_size if variant == "eagle3" else 0,
            aux_layer_ids=int_list(aux, "eagle_aux_hidden_state_layer_ids", path) if variant == "eagle3" else [],
            base_model_name_or_path=base, layer_config=layer_config_back(layer, model_type), fc_bias=fc_bias)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from err


def llama_model_type(raw: dict) -> str:
    """The draft layer's own model_type: as the export recorded it, else Qwen2 where only q/k/v have biases."""
    ours = raw.get("specheads") or {}
    return ours.get("layer_model_type") or ("qwen2" if raw.get("qkv_bias") and not raw.get("attention_bias")
                                            else "llama")


def llama_base(raw: dict) -> str:
    ours = raw.get("specheads") or {}
    return ours.get("base_model_name_or_path") or raw.get("base_model_name_or_path") or ""
