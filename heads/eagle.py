"""EAGLE draft heads: predict the base model's next *feature* with one decoder layer of its own kind.

EAGLE-1 (variant "eagle1"): at position t the draft reads the base's last hidden state f_t and the
embedding of the next token x_{t+1}, fuses them with fc: 2H -> H and runs one decoder layer (the base
architecture's attention and MLP, no input norm) to predict f_{t+1}; the frozen base lm_head turns
that into token logits. Drafting several tokens feeds the predicted feature back in.

EAGLE-3 (variant "eagle3"): the input feature fuses the base's hidden states entering three layers
(fc: 3H -> H, no bias); the layer's attention reads concat(norm(embedding), norm(feature)) (2H wide);
the output goes through its own norm and lm_head over a reduced draft vocabulary. `d2t` maps a draft
id to a target id (target = draft + d2t[draft]) and `t2d` marks target ids in the draft vocabulary;
both are saved inside model.safetensors, never in a side file.

The layer is built from the base config through transformers (its own decoder-layer class), so
every architecture transformers knows works; nothing is copied from modeling files.
On disk: config.json (model_type "specheads-eagle") + model.safetensors.
"""

from __future__ import annotations

import copy
import inspect
import re
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from .files import EAGLE_MODEL_TYPE, size_mismatches
from .module import DraftModule

MODEL_TYPE = EAGLE_MODEL_TYPE
VARIANTS = ("eagle1", "eagle3")


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low / middle / high features: hidden states entering layers 2, L//2 and L-3."""
    return [min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)]


@dataclass
class EagleConfig:
    variant: str = "eagle1"
    hidden_size: int = 0
    vocab_size: int = 0
    draft_vocab_size: int = 0  # eagle3: size of the reduced vocabulary (0 = the full vocabulary)
    aux_layer_ids: list[int] = field(default_factory=list)  # eagle3: indices into the base's hidden_states
    base_model_name_or_path: str = ""
    layer_config: dict = field(default_factory=dict)  # the config (as a dict) the draft layer is built from
    # eagle1: EAGLE's original fc has a bias, vLLM's has none (it drops a shipped fc.bias). New drafts are built
    # without (for_base); drafts saved before this field existed keep theirs.
    fc_bias: bool = True
    # eagle3: the layer's residual is hidden_norm(feature) instead of the feature itself (the speculators library's
    # option, its training default; vLLM reads it). specheads trains without; imported drafts may have it.
    norm_before_residual: bool = False
    # eagle3: decoder layers in the draft. The first reads [norm(embedding), norm(feature)] (2H wide); each further
    # one is a plain decoder layer of the same kind over the previous one's output. Engines' formats hold one.
    num_layers: int = 1

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"EagleConfig.variant must be one of {VARIANTS}, got {self.variant!r}")
        for name in ("hidden_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EagleConfig.{name} must be a positive integer, got {value!r}")
        if self.variant == "eagle3":
            if not 0 < self.draft_vocab_size <= self.vocab_size:
                raise ValueError(f"EagleConfig.draft_vocab_size must be in 1..vocab_size ({self.vocab_size}), "
                                 f"got {self.draft_vocab_size}")
            if len(self.aux_layer_ids) != 3:
                raise ValueError(f"EagleConfig.aux_layer_ids must name 3 base layers, got {self.aux_layer_ids}")
        if "model_type" not in self.layer_config:
            raise ValueError("EagleConfig.layer_config must be a transformers config dict with a model_type")
        if not isinstance(self.num_layers, int) or isinstance(self.num_layers, bool) or self.num_layers < 1 or (
                self.num_layers > 1 and self.variant != "eagle3"):
            raise ValueError(f"EagleConfig.num_layers must be a positive integer, above 1 only for eagle3 drafts; "
                             f"got {self.num_layers!r} for {self.variant}")
        if not isinstance(self.norm_before_residual, bool) or (self.norm_before_residual and self.variant != "eagle3"):
            raise ValueError(f"EagleConfig.norm_before_residual must be true or false, and true only for eagle3 drafts; "
                             f"got {self.norm_before_residual!r} for {self.variant}")

    @classmethod
    def for_base(cls, base_config, name_or_path: str, variant: str = "eagle1", draft_vocab_size: int = 0,
                 aux_layer_ids: list[int] | None = None, layer: str | None = None,
                 fc_bias: bool = False) -> "EagleConfig":
        """A new draft's config for this base. layer: "llama" (a Llama decoder layer of the base's sizes, no
        attention bias: the layer every engine's EAGLE-3 loads, whatever the base; EAGLE-3's default) or "base"
        (the base architecture's own layer, e.g. Qwen2's with q/k/v biases; EAGLE-1's default)."""
        layer = layer or ("llama" if variant == "eagle3" else "base")
        if layer not in LAYER_STYLES:
            raise ValueError(f"the draft layer must be one of {LAYER_STYLES}, got {layer!r}")
        layer_config = llama_layer_config(base_config) if layer == "llama" else base_config.to_dict()
        layer_config["num_hidden_layers"] = 1
        if layer_config.get("layer_types"):  # per-layer attention kinds (Qwen2, Gemma...): keep the first
            layer_config["layer_types"] = layer_config["layer_types"][:1]
        for key in ("quantization_config", "auto_map", "_name_or_path"):
            layer_config.pop(key, None)
        if variant == "eagle3":
            aux_layer_ids = aux_layer_ids or default_aux_layers(base_config.num_hidden_layers)
            draft_vocab_size = draft_vocab_size or base_config.vocab_size
        return cls(variant=variant, hidden_size=base_config.hidden_size, vocab_size=base_config.vocab_size,
                   draft_vocab_size=draft_vocab_size if variant == "eagle3" else 0,
                   aux_layer_ids=list(aux_layer_ids or []) if variant == "eagle3" else [],
                   base_model_name_or_path=name_or_path, layer_config=layer_config,
                   fc_bias=fc_bias if variant == "eagle1" else False)

    @property
    def feature_layers(self) -> list[int]:
        """Which entries of the base's `output_hidden_states` the draft reads (the last one for EAGLE-1)."""
        return list(self.aux_layer_ids) if self.variant == "eagle3" else [-1]

    def transformers_config(self):
        values = dict(self.layer_config)
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        config.num_hidden_layers = self.num_layers
        if getattr(config, "layer_types", None):  # one kind per draft layer: the kind the first one has
            config.layer_types = config.layer_types[:1] * self.num_layers
        # Eager attention takes an additive float mask of any dtype (the tree and unrolled-step masks).
        config._attn_implementation = "eager"
        return config


LAYER_STYLES = ("llama", "base")
# What a Llama layer takes from any base config (the rest: Llama's defaults, no attention or MLP bias).
LLAMA_LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
                    "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id", "dtype",
                    "torch_dtype")


def llama_layer_config(base_config) -> dict:
    """A Llama config (as a dict) with the base's sizes, rope and norm: the draft layer vLLM's and SGLang's
    EAGLE-3 load for any target. A Qwen2 base's q/k/v biases are not carried over. `architectures` keeps the
    base's (the verifier an export names)."""
    from transformers import LlamaConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    values = base_config.to_dict()
    kept = {key: values[key] for key in LLAMA_LAYER_KEYS if values.get(key) is not None}
    kept.setdefault("head_dim", base_config.hidden_size // base_config.num_attention_heads)
    architectures = values.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(values["model_type"])]
    return LlamaConfig(**kept, attention_bias=False, mlp_bias=False, num_hidden_layers=1, tie_word_embeddings=False,
                       architectures=[a for a in architectures if a]).to_dict()


def _layer_parts(config):
    """The base architecture's decoder-layer and rotary-embedding classes, found without allocating weights."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    inner = skeleton.base_model
    layer = inner.layers[0]
    return type(layer), type(inner.rotary_emb)


class EagleDraft(DraftModule):
    """One-layer feature-level draft. Embeddings and (for EAGLE-1) the lm_head are the base's, passed in."""

    MODEL_TYPE, CONFIG_CLASS, WHAT, NOT_SAVED = EAGLE_MODEL_TYPE, EagleConfig, "EAGLE draft", ("rotary_emb.",)

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        layer_config = config.transformers_config()
        layer_class, rotary_class = _layer_parts(layer_config)
        layer = layer_class(layer_config, layer_idx=0)
        self.rotary_emb = rotary_class(config=layer_config)
        self._attn_cache_argument = (
            "cache" if "cache" in inspect.signature(layer.self_attn.forward).parameters else "past_key_values")
        if config.variant == "eagle1":
            self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias)
            layer.input_layernorm = nn.Identity()  # EAGLE-1: the fused input is not normalised again
        else:
            self.fc = nn.Linear(3 * hidden, hidden, bias=False)
            self.hidden_norm = copy.deepcopy(layer.input_layernorm)
            self.norm = copy.deepcopy(layer.input_layernorm)
            attention = layer.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):  # attention reads [norm(embedding), norm(feature)]
                old = getattr(attention, name)
                setattr(attention, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
            self.set_vocab_mapping(torch.arange(config.draft_vocab_size))
        self.layers = nn.ModuleList([layer] + [layer_class(layer_config, layer_idx=i) for i in range(1, config.num_layers)])

    # ---- vocabulary (EAGLE-3) --------------------------------------------------------------

    @torch.no_grad()
    def set_vocab_mapping(self, target_ids: torch.Tensor) -> None:
        """Draft id i stands for target id target_ids[i] (sorted ascending, e.g. the most frequent tokens)."""
        target_ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if target_ids.numel() != self.config.draft_vocab_size or target_ids.unique().numel() != target_ids.numel():
            raise ValueError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct target ids, "
                             f"got {target_ids.numel()} ({target_ids.unique().numel()} distinct)")
        if int(target_ids.min()) < 0 or int(target_ids.max()) >= self.config.vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in 0..{self.config.vocab_size - 1}")
        self.d2t.copy_(target_ids - torch.arange(target_ids.numel()))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    @torch.no_grad()
    def head_from_base(self, base) -> None:
        """EAGLE-3: start the lm_head as the base's lm_head rows of the draft vocabulary, so training begins from
        the base's own token directions instead of random ones. The output norm stays at ones: the base's final
        norm weights (Qwen2.5-1.5B's average 4.6) would turn a new draft's random hidden states into confident
        wrong logits (a loss twice a random head's, still there after 25 updates)."""
        if self.config.variant != "eagle3":
            raise ValueError("head_from_base is for EAGLE-3 drafts (EAGLE-1 already reads the base lm_head)")
        check_compatible(self.config, base.config, source="head_from_base: this draft")
        weight = base.get_output_embeddings().weight
        rows = self.draft_to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))
        self.lm_head.weight.copy_(weight[rows.to(weight.device)].to(self.lm_head.weight))

    def with_llama_layer(self) -> tuple["EagleDraft", dict[str, float]]:
        """A copy of this draft whose layer is Llama-style (what every engine's EAGLE-3 builds), and what it lost:
        {tensor name: largest |value|} of the attention biases a Llama layer has no place for (a Qwen2 layer's
        q/k/v biases, from drafts trained before eagle.layer defaulted to llama). Every other tensor is kept; with
        all those biases zero the copy computes exactly what this draft does, otherwise its guesses change and
        its acceptance must be measured again."""
        config = replace(self.config, layer_config=llama_layer_config(self.config.transformers_config()))
        dtype = self.fc.weight.dtype
        converted = EagleDraft(config).to(dtype)
        state = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary_emb.")}
        wanted = {k for k in converted.state_dict() if not k.startswith("rotary_emb.")}
        dropped = {k: float(v.abs().max()) for k, v in state.items() if k not in wanted}
        unknown = [k for k in dropped if not re.fullmatch(r"layers\.\d+\.self_attn\.[qkvo]_proj\.bias", k)]
        if unknown:
            raise ValueError(f"the draft layer holds {unknown}, which a Llama layer has no place for")
        converted.load_state_dict({k: v for k, v in state.items() if k in wanted}, strict=False)
        converted.metadata = dict(self.metadata)
        return converted, dropped

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if self.config.variant == "eagle1":
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def set_attention(self, implementation: str) -> None:
        """Pick the layer's attention kernel by its transformers name ("eager", "sdpa", ...).

        Built "eager", which adds a float mask of any dtype (training's fp32 unrolled-step masks under mixed
        precision). Decoding switches to "sdpa" (inference/eagle.py): on a 2-core CPU, bf16 SmolLM2, the
        eager path's two bmm over the draft's cache took ~0.9 ms of a 2.6 ms draft step, SDPA's fused kernel
        brought the step to ~1.05 ms."""
        for layer in self.layers:
            layer.self_attn.config._attn_implementation = implementation

    # ---- forward ---------------------------------------------------------------------------

    def fuse(self, selected_states) -> torch.Tensor:
        """The base's hidden states at `config.feature_layers` (a list) -> the draft's input feature [.., H]."""
        if self.config.variant == "eagle1":
            return selected_states[0]
        return self.fc(torch.cat(list(selected_states), dim=-1))

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """features [B, N, H] (fused base features or the draft's own outputs), embeddings of the next
        tokens [B, N, H] -> the draft's output features [B, N, H] (fed back for the next draft step)."""
        layer = self.layers[0]
        if self.config.variant == "eagle1":
            residual = self.fc(torch.cat([token_embeddings, features], dim=-1))
            attention_input = residual
        else:
            normed = self.hidden_norm(features)
            residual = normed if self.config.norm_before_residual else features
            attention_input = torch.cat([layer.input_layernorm(token_embeddings), normed], -1)
        position_embeddings = self.rotary_emb(residual, position_ids)
        attended, _ = layer.self_attn(hidden_states=attention_input, position_embeddings=position_embeddings,
                                      attention_mask=attention_mask, **{self._attn_cache_argument: cache})
        hidden = residual + attended
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        for later in self.layers[1:]:  # eagle3 with num_layers > 1: plain decoder layers, each its own cache slot
            hidden = later(hidden, attention_mask=attention_mask, position_embeddings=position_embeddings,
                           **{self._attn_cache_argument: cache})
        return hidden

    def logits(self, draft_hidden: torch.Tensor, base_lm_head: nn.Module | None = None) -> torch.Tensor:
        """Token logits of the draft's output: over the full vocabulary (EAGLE-1, base lm_head) or the
        draft vocabulary (EAGLE-3; map ids with draft_to_target)."""
        if self.config.variant == "eagle3":
            return self.lm_head(self.norm(draft_hidden))
        if base_lm_head is None:
            raise ValueError("EAGLE-1 drafts use the base lm_head: pass base_lm_head=model.get_output_embeddings()")
        return base_lm_head(draft_hidden)

    # ---- on-disk format (heads.module.DraftModule) ------------------------------------------

    @classmethod
    def check_base(cls, config, base_config, source: str) -> None:
        check_compatible(config, base_config, source=source)


def check_compatible(config: EagleConfig, base_config, source: str = "draft") -> None:
    """A draft trained for one base is meaningless on another: refuse a size or vocabulary mismatch."""
    problems = size_mismatches(config, base_config, "draft")
    if config.variant == "eagle3" and max(config.aux_layer_ids) > base_config.num_hidden_layers:
        problems.append(f"aux_layer_ids {config.aux_layer_ids} exceed the base's {base_config.num_hidden_layers} layers")
    if problems:
        raise ValueError(f"{source} does not fit this base model: " + "; ".join(problems))
