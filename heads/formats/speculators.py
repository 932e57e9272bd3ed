"""The speculators layout of an EAGLE-3 draft (`vllm-eagle3`): what vLLM reads natively and the speculators
library writes and loads, both directions.

config.json: speculators_model_type "eagle3", draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids,
transformer_layer_config (a Llama layer config) and speculators_config (greedy proposals, the verifier as a Hub id or
path); model.safetensors: layers.0.* (hidden_norm inside the layer), fc.weight, norm.weight, lm_head.weight
[draft_vocab, H], d2t and t2d. Published speculators folders import too: their embed_tokens.weight (the verifier's)
is named in a warning and not used, d2t/t2d may be absent (a full draft vocabulary), norm_before_residual (the
library's training default) is computed, and the options an EagleDraft lacks (norm_before_fc, fc_norm, norm_output)
are refused by name. vLLM builds Llama-style layers only: a draft whose layer is another architecture's (a
Qwen2 layer with q/k/v biases, trained before eagle.layer defaulted to llama) is refused, as is an aux layer named
twice (vLLM collects each layer once).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..eagle import EagleConfig, EagleDraft
from .eagle_layer import SPECULATIVE_TOKENS, EagleLayout, aux_layers, check_target_hidden_size, eagle_config, layer_dict, \
    specheads_entry, verifier


class Speculators(EagleLayout):
    NAME = "vllm-eagle3"
    KIND = "eagle3"

    def detect(self, raw: dict) -> bool:
        return raw.get("speculators_model_type") == "eagle3"

    def exported_name(self, name: str) -> str:
        return "layers.0." + name if name == "hidden_norm.weight" else name

    def check(self, draft: EagleDraft, source) -> None:
        aux = draft.config.aux_layer_ids
        if len(set(aux)) != len(aux):
            raise ValueError(f"{source}: eagle_aux_hidden_state_layer_ids {aux} name a layer twice; vLLM collects "
                             f"each layer once and would feed fc fewer than 3 states (a shape error at the first step)")
        model_type = draft.config.layer_config.get("model_type")
        if model_type != "llama":
            raise ValueError(f"{source}: the draft layer is {model_type!r}-style; vLLM's EAGLE-3 loads Llama-style "
                             f"layers only ('Unsupported model_type {model_type} for Eagle3 speculator'). Train the "
                             f"draft with eagle.layer: llama (the default for EAGLE-3 drafts), whatever the base, or "
                             f"convert this one with --llama-layer (it drops the layer's attention biases)")

    def adapt(self, draft: EagleDraft, source, llama_layer: bool = False) -> EagleDraft:
        """llama_layer: give a draft with another architecture's layer (an old Qwen2-style one) a Llama layer,
        dropping the attention biases Llama has none of; a warning names each with its largest |value|."""
        if not llama_layer or draft.config.layer_config.get("model_type") == "llama":
            return draft
        converted, dropped = draft.with_llama_layer()
        lost = ", ".join(f"{name} (max |value| {value:.3g})" for name, value in dropped.items()) or "nothing"
        warnings.warn(f"{source}: the {draft.config.layer_config.get('model_type')}-style draft layer becomes a Llama "
                      f"layer; dropped {lost}. Where any is non-zero the draft's guesses change: measure its "
                      f"acceptance again (scripts/serve_vllm.py)", stacklevel=2)
        return converted

    def to_config(self, draft: EagleDraft, model: str | None) -> dict:
        config = draft.config
        transformer_layer = layer_dict(draft)
        proposal = {"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS,
                    "verifier_accept_k": 1, "accept_tolerance": 0.0}
        return {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "draft_vocab_size": config.draft_vocab_size,
            "norm_before_residual": config.norm_before_residual,  # vLLM defaults an absent one to true
            "target_hidden_size": config.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
            "transformer_layer_config": transformer_layer,
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [proposal],
                                   "default_proposal_method": "greedy", "verifier": verifier(draft, model)},
            "torch_dtype": transformer_layer["torch_dtype"],
            "specheads": specheads_entry(draft),
        }

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        ours = raw.get("specheads") or {}
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict) or "model_type" not in layer:
            raise ValueError(f"{path}: transformer_layer_config must be a config dict with a model_type")
        # options of the speculators library that change what the draft computes, which an EagleDraft has not
        for key in UNSUPPORTED_OPTIONS:
            if raw.get(key):
                raise ValueError(f"{path}: {key} is {raw[key]!r}; specheads' EAGLE-3 draft "
                                 f"{UNSUPPORTED_OPTIONS[key]}, so it would compute another draft: not imported")
        check_target_hidden_size({**raw, "hidden_size": layer.get("hidden_size")}, path)
        aux = aux_layers(raw.get("eagle_aux_hidden_state_layer_ids") or ours.get("aux_layer_ids"), path, base_config,
                         "eagle_aux_hidden_state_layer_ids")
        base = ours.get("base_model_name_or_path") or raw.get("speculators_config", {}).get(
            "verifier", {}).get("name_or_path", "")
        return eagle_config(self.KIND, layer, layer["model_type"], aux, base, raw.get("draft_vocab_size", 0), path,
                            fc_bias, norm_before_residual=bool(raw.get("norm_before_residual", False)))


# speculators Eagle3SpeculatorConfig fields an EagleDraft does not compute (true: refused by name)
UNSUPPORTED_OPTIONS = {
    "norm_before_fc": "feeds the aux hidden states to fc without a norm",
    "fc_norm": "has no per-layer norm before fc",
    "norm_output": "has no norm on the layer's output before it is fed back",
}


FORMAT = Speculators()
