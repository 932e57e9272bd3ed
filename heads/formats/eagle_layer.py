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
import warnings
from pathlib import Path

import torch

from ..eagle import EagleConfig, EagleDraft, default_aux_layers
from ..files import WEIGHTS_NAME, read_json_config, write_folder
from ..weights import read_folder_safetensors, read_folder_weights
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
                    "architectures", "torch_dtype", "attention_bias", "qkv_bias", "mlp_bias", "target_hidden_size"}
# Tensors published drafts carry that an EagleDraft does not hold: the base's own embeddings (specheads always
# embeds with the base's, as the engines do when a draft has none) and a rotary cache recomputed from the config.
UNUSED_TENSORS = re.compile(r"(model\.)?embed_tokens\.weight|(layers\.0\.|midlayer\.)self_attn\.rotary_emb\.inv_freq")


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

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        """The EagleConfig an exported config.json describes (base_config: the base's, where the folder leaves
        something to it, such as EAGLE-3's default aux layers)."""
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

    PICKLE_NAME: str | None = None  # the published pickle this layout ships instead of model.safetensors, if any

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
        if draft.config.num_layers != 1:
            raise ValueError(f"{source}: the draft has {draft.config.num_layers} decoder layers (eagle.num_layers); "
                             f"format {self.NAME!r} holds one, so engines cannot load it. Decode it with specheads "
                             f"(chat.py, bench.py), or train a one-layer draft to serve")
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
        """A folder written in this format -> the EagleDraft it holds. Tensors the draft does not hold are named:
        the base's embeddings and rotary caches in a warning (the base's are used), anything else in an error."""
        directory = Path(directory)
        path, raw = read_json_config(directory, what="exported EAGLE draft")
        weights_path, state = read_folder_weights(directory, WEIGHTS_NAME, self.PICKLE_NAME)
        state = drop_unused(state, weights_path, base_model)
        base_config = getattr(base_model, "config", None)
        draft = EagleDraft(self.config_back(raw, path, fc_bias=bool(self.fc_bias(raw, state)), base_config=base_config))
        if "fc.weight" in state:
            draft.to(state["fc.weight"].dtype)  # keep the file's precision (float buffers d2t/t2d are not float)
        if draft.config.variant == "eagle3":
            state = with_vocab_mapping(state, draft, weights_path, self.exported_name)
        expected = {self.exported_name(name): (name, tensor)
                    for name, tensor in draft.state_dict().items() if not name.startswith("rotary_emb.")}
        missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
        if missing or unexpected:
            raise ValueError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
        ours = {}
        for theirs, (name, tensor) in expected.items():
            if state[theirs].shape != tensor.shape:
                raise ValueError(f"{weights_path}: tensor {theirs} has shape "
                                 f"{tuple(state[theirs].shape)}, expected {tuple(tensor.shape)}")
            ours[name] = state[theirs]
        draft.load_state_dict(ours, strict=False)
        draft.metadata = {"imported_from": self.NAME}
        return draft


def drop_unused(state: dict, weights_path: Path, base_model=None) -> dict:
    """The tensors without UNUSED_TENSORS, each one left out named in a warning (an embedding compared with the
    base's where the base is given: the draft decodes with the base's)."""
    kept = {}
    for name, tensor in state.items():
        if not UNUSED_TENSORS.fullmatch(name):
            kept[name] = tensor
            continue
        why = "the rotary frequencies are recomputed from the config"
        if "embed_tokens" in name:
            why = "the draft embeds tokens with the base's embeddings"
            base = base_model.get_input_embeddings().weight if base_model is not None else None
            if base is not None and tuple(base.shape) == tuple(tensor.shape):
                diff = float((base.detach().float() - tensor.float()).abs().max())
                why += (", which it equals" if diff <= 1e-2 * max(float(base.detach().float().abs().max()), 1e-6)
                        else f", which it differs from (max |diff| {diff:.3g}): is this the draft's base?")
        warnings.warn(f"{weights_path}: tensor {name} {tuple(tensor.shape)} is not used ({why})", stacklevel=4)
    return kept


def with_vocab_mapping(state: dict, draft: EagleDraft, weights_path: Path, exported_name) -> dict:
    """EAGLE-3's d2t (draft id -> target offset) and t2d (target ids in the draft vocabulary): published folders
    leave both out when the draft vocabulary is the target's, and some carry one of them; the other follows."""
    config = draft.config
    d2t_name, t2d_name = exported_name("d2t"), exported_name("t2d")
    d2t, t2d = state.get(d2t_name), state.get(t2d_name)
    if d2t is None and t2d is None:
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError(f"{weights_path}: missing tensors {d2t_name!r} and {t2d_name!r}: the draft vocabulary "
                             f"({config.draft_vocab_size} tokens) is smaller than the target's ({config.vocab_size}), "
                             f"so the draft-to-target mapping is needed")
        target_ids = torch.arange(config.vocab_size)
    elif d2t is not None:
        if tuple(d2t.shape) != (config.draft_vocab_size,) or d2t.is_floating_point():
            raise ValueError(f"{weights_path}: tensor {d2t_name} must be integer offsets of shape "
                             f"({config.draft_vocab_size},), got {d2t.dtype} {tuple(d2t.shape)}")
        target_ids = d2t.long() + torch.arange(config.draft_vocab_size)
    else:
        if tuple(t2d.shape) != (config.vocab_size,):
            raise ValueError(f"{weights_path}: tensor {t2d_name} has shape {tuple(t2d.shape)}, expected "
                             f"({config.vocab_size},)")
        target_ids = t2d.bool().nonzero().flatten()
    try:
        draft.set_vocab_mapping(target_ids)
    except ValueError as err:
        raise ValueError(f"{weights_path}: tensors {d2t_name}/{t2d_name}: {err}") from err
    if t2d is not None and not torch.equal(t2d.bool(), draft.t2d):
        raise ValueError(f"{weights_path}: tensors {d2t_name} and {t2d_name} disagree on the draft vocabulary")
    if d2t is not None and not torch.equal(d2t.long(), draft.d2t):
        raise ValueError(f"{weights_path}: tensor {d2t_name} maps draft ids to target ids out of order (EAGLE-3 "
                         f"draft vocabularies are sorted by target id)")
    return {**state, d2t_name: draft.d2t.clone(), t2d_name: draft.t2d.clone()}


def aux_layers(aux, path: Path, base_config, where: str) -> list[int]:
    """The aux layer ids a folder gives, else EAGLE-3's default for the base (hidden states entering layers 2, L//2,
    L-3: what the EAGLE authors' code taps and vLLM/SGLang use when a folder names none)."""
    if aux:
        return int_list(aux, where, path)
    if base_config is None:
        raise ValueError(f"{path}: names no aux layers ({where}); EAGLE-3 then reads the target's layers 2, L//2 and "
                         f"L-3, so the target's layer count is needed: pass base_model (--model)")
    return default_aux_layers(base_config.num_hidden_layers)


def check_target_hidden_size(raw: dict, path: Path) -> None:
    target = raw.get("target_hidden_size")
    if target is not None and target != raw.get("hidden_size", target):
        raise ValueError(f"{path}: target_hidden_size {target} differs from the draft's hidden_size "
                         f"{raw.get('hidden_size')}; specheads' EAGLE drafts read features of their own width")


def eagle_config(variant: str, layer: dict, model_type: str, aux, base: str, draft_vocab_size: int, path: Path,
                 fc_bias: bool, norm_before_residual: bool = False) -> EagleConfig:
    """EagleConfig from what an export holds; a bad value is an error naming the file."""
    try:
        return EagleConfig(
            variant=variant, hidden_size=layer.get("hidden_size"), vocab_size=layer.get("vocab_size"),
            draft_vocab_size=draft_vocab_size if variant == "eagle3" else 0,
            aux_layer_ids=int_list(aux, "eagle_aux_hidden_state_layer_ids", path) if variant == "eagle3" else [],
            base_model_name_or_path=base, layer_config=layer_config_back(layer, model_type), fc_bias=fc_bias,
            norm_before_residual=norm_before_residual)
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
