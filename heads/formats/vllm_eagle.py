"""vLLM's EAGLE-1 draft (`method: eagle`), both directions.

A Llama-style config.json with num_hidden_layers=1 and architectures LlamaForCausalLM; model.safetensors with
fc.weight, layers.0.self_attn.*, layers.0.mlp.*, layers.0.post_attention_layernorm.weight (no embeddings, no
lm_head). vLLM's fc has no bias: it drops a shipped fc.bias silently and would read a config "bias" as an o_proj
bias, so neither is written, a zero fc.bias is left out and a non-zero one is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..eagle import EagleConfig, EagleDraft
from .eagle_layer import EagleLayout, eagle_config, llama_base, llama_config, llama_model_type


class VllmEagle(EagleLayout):
    NAME = "vllm-eagle"
    KIND = "eagle1"
    ARCHITECTURES = ["LlamaForCausalLM"]

    def detect(self, raw: dict) -> bool:
        # a one-layer Llama config is any small Llama too: only one that says it is a draft counts
        return (raw.get("architectures") == self.ARCHITECTURES and raw.get("num_hidden_layers") == 1
                and ("bias" in raw or "specheads" in raw))

    def check(self, draft: EagleDraft, source) -> None:
        if draft.fc.bias is not None and draft.fc.bias.any():
            raise ValueError(f"{source}: tensor fc.bias is not zero, and vLLM's EAGLE-1 fc has no bias (it drops a "
                             f"shipped fc.bias silently, so the served draft would differ); export it as "
                             f"sglang-eagle, or train an EAGLE-1 draft without it (eagle.fc_bias: false, the default)")

    def keeps(self, name: str, tensor: torch.Tensor) -> bool:
        return super().keeps(name, tensor) and name != "fc.bias"

    def to_config(self, draft: EagleDraft, model: str | None) -> dict:
        return llama_config(draft, self.ARCHITECTURES, model)

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        return eagle_config(self.KIND, raw, llama_model_type(raw), None, llama_base(raw), 0, path, fc_bias)


FORMAT = VllmEagle()
