"""A DFlash-style block drafter: one forward proposes a whole block of tokens from the base's fused features.

The context: at every position p the base's hidden states leaving layers `target_layer_ids` (DFlash's
indexing: id i is the output of layer i, i.e. transformers' hidden_states[i + 1]) are concatenated and fused,
c_p = hidden_norm(fc(concat)). Each draft layer projects c_p with its own k_proj / v_proj (+ k_norm, RoPE at p)
into keys and values: the context is never run through the layers, it is only attended to.

The block: the last verified token x_{P+1} (the anchor) followed by `block_size - 1` copies of the mask token, at
positions P+1 .. P+block_size, embedded with the base's (frozen, shared) embeddings. It runs through the draft
layers (Qwen3-style decoder layers: per-head q/k RMSNorm), attending to every context entry and to the whole
block (non-causal; `causal` limits it to earlier block positions), then the final norm and the base's lm_head.
The output at block position j >= 1 is the draft for the token at position P+1+j, so one forward drafts
`block_size - 1` tokens.

This is vLLM's `dflash` draft (model_executor/models/qwen3_dflash.py, DFlashQwen3ForCausalLM) computed the same
way; the tensors carry its names (fc.weight, hidden_norm.weight, norm.weight, layers.N.self_attn.{q,k,v,o}_proj,
layers.N.self_attn.{q,k}_norm, layers.N.mlp.*, layers.N.{input,post_attention}_layernorm), no embeddings and no
lm_head (the engine shares the target's), so the export is a copy and a config rewrite
(heads/formats/vllm_dflash.py). The layers are transformers' own Qwen3 decoder-layer modules; only the
attention pattern (context keys first) is composed here.
On disk: config.json (model_type "specheads-dflash") + model.safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .files import DFLASH_MODEL_TYPE, size_mismatches
from .module import DraftModule

MODEL_TYPE = DFLASH_MODEL_TYPE
# What the draft layers take from the base config (the rest: Qwen3's defaults, no attention bias).
QWEN3_LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
                    "rope_theta", "bos_token_id", "eos_token_id", "pad_token_id")
# Entries of a transformers to_dict() that say nothing about the layers (and do not survive JSON unchanged).
NOISE_KEYS = ("transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
              "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
              "problem_type", "output_attentions", "_name_or_path")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The published DFlash rule (REFERENCE §4b; z-lab's build_target_layer_ids, which vLLM and SGLang mirror): one
    target layer per draft layer, the middle one (L // 2) for a one-layer drafter, else spread evenly over layers
    1 .. L - 3 (SmolLM2's 30 layers and 5 draft layers -> [1, 8, 14, 20, 27]). DFlash indexing: the output of
    layer i. Each layer once: vLLM collects an aux layer once, so a repeated id would leave fc short of inputs."""
    if num_draft_layers == 1:
        ids = [num_target_layers // 2]
    else:
        span = num_target_layers - 4
        ids = [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]
    # a base of a few layers (a test model): within the outputs before the last layer, which the drafter may read
    return sorted({min(max(i, 0), max(num_target_layers - 2, 0)) for i in ids})


def qwen3_layer_config(base_config, num_layers: int) -> dict:
    """A Qwen3 config (as a dict) with the base's sizes, rope and norm: the layers vLLM's DFlash builds."""
    from transformers import Qwen3Config

    values = base_config.to_dict()
    kept = {key: values[key] for key in QWEN3_LAYER_KEYS if values.get(key) is not None}
    kept.setdefault("head_dim", base_config.hidden_size // base_config.num_attention_heads)
    rope = values.get("rope_parameters") or {"rope_type": "default", "rope_theta": values.get("rope_theta", 10000.0)}
    kept["rope_parameters"] = rope
    config = Qwen3Config(**kept, attention_bias=False, num_hidden_layers=num_layers, tie_word_embeddings=False,
                         use_sliding_window=False, layer_types=["full_attention"] * num_layers)
    return {k: v for k, v in config.to_dict().items() if k not in NOISE_KEYS}


@dataclass
class DFlashConfig:
    hidden_size: int = 0
    vocab_size: int = 0
    block_size: int = 8  # positions of one forward: the anchor + block_size - 1 drafted tokens
    mask_token_id: int = 0  # a token of the base's vocabulary whose (frozen) embedding marks a masked slot
    target_layer_ids: list[int] = field(default_factory=list)  # DFlash indexing: outputs of these base layers
    num_layers: int = 1
    causal: bool = False  # attention inside the block: False = the whole block (DFlash), True = earlier positions
    base_model_name_or_path: str = ""
    layer_config: dict = field(default_factory=dict)  # the Qwen3 config (as a dict) the layers are built from

    def __post_init__(self):
        for name in ("hidden_size", "vocab_size", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DFlashConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 2:
            raise ValueError(f"DFlashConfig.block_size must be an integer >= 2 (the anchor and at least one "
                             f"drafted token), got {self.block_size!r}")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"DFlashConfig.mask_token_id must be a token id in 0..{self.vocab_size - 1}, "
                             f"got {self.mask_token_id!r}")
        if not self.target_layer_ids or any(not isinstance(i, int) or isinstance(i, bool) or i < 0
                                            for i in self.target_layer_ids):
            raise ValueError(f"DFlashConfig.target_layer_ids must be a non-empty list of base layer indices, "
                             f"got {self.target_layer_ids!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"DFlashConfig.causal must be true or false, got {self.causal!r}")
        if self.layer_config.get("model_type") != "qwen3":
            raise ValueError("DFlashConfig.layer_config must be a Qwen3 config dict (model_type 'qwen3')")

    @classmethod
    def for_base(cls, base_config, name_or_path: str, block_size: int = 8, num_layers: int = 1,
                 target_layer_ids: list[int] | None = None, mask_token_id: int | None = None,
                 causal: bool = False) -> "DFlashConfig":
        """A new drafter's config for this base; mask_token_id defaults to the last id of the vocabulary."""
        ids = list(target_layer_ids) if target_layer_ids else default_target_layer_ids(base_config.num_hidden_layers, num_layers)
        config = cls(hidden_size=base_config.hidden_size, vocab_size=base_config.vocab_size, block_size=block_size,
                   mask_token_id=base_config.vocab_size - 1 if mask_token_id is None else mask_token_id,
                   target_layer_ids=ids, num_layers=num_layers, causal=causal,
                   base_model_name_or_path=name_or_path, layer_config=qwen3_layer_config(base_config, num_layers))
        check_compatible(config, base_config, source="the DFlash drafter's settings")
        return config

    @property
    def feature_layers(self) -> list[int]:
        """Which entries of the base's `output_hidden_states` the drafter reads (hidden_states[i + 1] for id i)."""
        return [i + 1 for i in self.target_layer_ids]

    @property
    def num_draft_tokens(self) -> int:
        """Tokens one forward drafts (vLLM's num_speculative_tokens)."""
        return self.block_size - 1

    def transformers_config(self):
        from transformers import AutoConfig

        values = dict(self.layer_config)
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        config._attn_implementation = "sdpa"
        return config


def _layer_parts(config):
    """Qwen3's decoder-layer and rotary-embedding classes, and its apply_rotary_pos_emb."""
    from transformers.models.qwen3 import modeling_qwen3

    return modeling_qwen3.Qwen3DecoderLayer, modeling_qwen3.Qwen3RotaryEmbedding, modeling_qwen3.apply_rotary_pos_emb


class DFlashDraft(DraftModule):
    """The block drafter. Embeddings and the lm_head are the base's, passed in."""

    MODEL_TYPE, CONFIG_CLASS, WHAT, NOT_SAVED = DFLASH_MODEL_TYPE, DFlashConfig, "DFlash drafter", ("rotary_emb.",)

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        layer_config = config.transformers_config()
        layer_class, rotary_class, self._apply_rope = _layer_parts(layer_config)
        self.fc = nn.Linear(len(config.target_layer_ids) * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([layer_class(layer_config, layer_idx=i) for i in range(config.num_layers)])
        norm_class = type(self.layers[0].input_layernorm)
        self.hidden_norm = norm_class(hidden, eps=layer_config.rms_norm_eps)
        self.norm = norm_class(hidden, eps=layer_config.rms_norm_eps)
        self.rotary_emb = rotary_class(config=layer_config)
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.num_heads = layer_config.num_attention_heads
        self.num_kv_heads = layer_config.num_key_value_heads

    # ---- forward ---------------------------------------------------------------------------

    def fuse(self, selected_states) -> torch.Tensor:
        """The base's hidden states at `config.feature_layers` (a list of [.., H]) -> context states [.., H]."""
        return self.hidden_norm(self.fc(torch.cat(list(selected_states), dim=-1)))

    def _rope(self, like: torch.Tensor, positions: torch.Tensor):
        return self.rotary_emb(like, positions)

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fused context states [B, T, H] at `positions` [B, T] -> per layer (keys, values), each
        [B, kv_heads, T, head_dim], keys normed and rotated: what vLLM writes into the draft's KV cache."""
        b, t, _ = context.shape
        cos, sin = self._rope(context, positions)
        out = []
        for layer in self.layers:
            attention = layer.self_attn
            k = attention.k_norm(attention.k_proj(context).view(b, t, -1, self.head_dim)).transpose(1, 2)
            v = attention.v_proj(context).view(b, t, -1, self.head_dim).transpose(1, 2)
            k, _ = self._apply_rope(k, k, cos, sin)
            out.append((k, v))
        return out

    def forward(self, block_embeddings: torch.Tensor, positions: torch.Tensor,
                context: list[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor) -> torch.Tensor:
        """Block embeddings [B, Q, H] at `positions` [B, Q], the context's keys and values (`context_kv`) and a
        mask [B or 1, 1, Q, T + Q] (bool: may attend; keys = the context's T entries, then the Q block entries)
        -> the drafter's normed outputs [B, Q, H] (the base lm_head turns them into logits)."""
        b, q, _ = block_embeddings.shape
        cos, sin = self._rope(block_embeddings, positions)
        hidden = block_embeddings
        for layer, (context_k, context_v) in zip(self.layers, context):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            query = attention.q_norm(attention.q_proj(x).view(b, q, -1, self.head_dim)).transpose(1, 2)
            key = attention.k_norm(attention.k_proj(x).view(b, q, -1, self.head_dim)).transpose(1, 2)
            value = attention.v_proj(x).view(b, q, -1, self.head_dim).transpose(1, 2)
            query, key = self._apply_rope(query, key, cos, sin)
            key = torch.cat([context_k.expand(b, -1, -1, -1), key], dim=2)
            value = torch.cat([context_v.expand(b, -1, -1, -1), value], dim=2)
            attended = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                      scale=self.head_dim ** -0.5,
                                                      enable_gqa=self.num_heads != self.num_kv_heads)
            hidden = hidden + attention.o_proj(attended.transpose(1, 2).reshape(b, q, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.norm(hidden)

    def block_mask(self, context_visible: torch.Tensor, size: int | None = None) -> torch.Tensor:
        """bool [B, T] (which context entries the block sees) -> the bool mask [B, 1, Q, T + Q] of one block of
        Q = size (default block_size) positions: each sees those context entries and the whole block (causal:
        earlier positions)."""
        q = size or self.config.block_size
        inside = torch.ones(q, q, dtype=torch.bool, device=context_visible.device)
        if self.config.causal:
            inside = inside.tril()
        b, t = context_visible.shape
        return torch.cat([context_visible[:, None, None, :].expand(b, 1, q, t), inside.expand(b, 1, q, q)], dim=-1)

    # ---- on-disk format (heads.module.DraftModule) ------------------------------------------

    @classmethod
    def check_base(cls, config, base_config, source: str) -> None:
        check_compatible(config, base_config, source=source)

    def load_tensors(self, state: dict[str, torch.Tensor], source) -> None:
        if "fc.weight" in state:
            self.to(state["fc.weight"].dtype)  # keep the file's precision
        super().load_tensors(state, source)


def check_compatible(config: DFlashConfig, base_config, source: str = "drafter") -> None:
    """A drafter trained for one base is meaningless on another: refuse a size, vocabulary or layer mismatch."""
    problems = size_mismatches(config, base_config, "drafter")
    last = base_config.num_hidden_layers - 2
    if max(config.target_layer_ids) > last:
        # id i reads the stream entering layer i + 1; after the last layer vLLM reads it before the final norm,
        # transformers' hidden_states (what training reads) after it, so the last layer's output is refused
        problems.append(f"target_layer_ids {config.target_layer_ids} must lie in 0..{last} (the outputs of the "
                        f"base's layers before its last; it has {base_config.num_hidden_layers})")
    if len(set(config.target_layer_ids)) != len(config.target_layer_ids):
        problems.append(f"target_layer_ids {config.target_layer_ids} name a layer twice (vLLM collects each once)")
    if problems:
        raise ValueError(f"{source} does not fit this base model: " + "; ".join(problems))
