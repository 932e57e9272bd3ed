"""SGLang's EAGLE drafts (LlamaForCausalLMEagle and LlamaForCausalLMEagle3), both directions.

- `sglang-eagle` (EAGLE-1): a Llama-style config.json with num_hidden_layers=1 and architectures
  LlamaForCausalLMEagle, where "bias" says whether fc has one; tensors as vLLM's EAGLE-1 (fc.bias kept).
- `sglang-eagle3` (EAGLE-3): architectures LlamaForCausalLMEagle3, draft_vocab_size and
  eagle_config.eagle_aux_hidden_state_layer_ids; the layer is `midlayer.*` (hidden_norm inside it), beside fc.weight,
  norm.weight, lm_head.weight [draft_vocab, H], d2t (int64 offsets) and t2d (bool).

SGLang adds 1 to explicit aux layer ids and captures the stream *before* that layer, so its id k reads what enters
layer k + 1; vLLM (and specheads' aux_layer_ids, indices into HF hidden_states) read what enters layer k. The ids
are written one lower (SGLANG_AUX_SHIFT) so that SGLang reads the layers the draft was trained on.
"""

from __future__ import annotations

from pathlib import Path

from ..eagle import EagleConfig, EagleDraft
from .eagle_layer import EagleLayout, aux_layers, check_target_hidden_size, eagle_config, int_list, llama_base, \
    llama_config, llama_model_type

SGLANG_AUX_SHIFT = 1


def sglang_aux_ids(aux_layer_ids: list[int]) -> list[int]:
    """The ids to write for SGLang so that it reads the layers the draft was trained on."""
    if min(aux_layer_ids) < SGLANG_AUX_SHIFT:
        raise ValueError(f"aux_layer_ids {list(aux_layer_ids)}: SGLang cannot read the embeddings (hidden state 0) "
                         f"as an aux layer; its ids start at the output of layer 0")
    return [i - SGLANG_AUX_SHIFT for i in aux_layer_ids]


class _SglangLlama(EagleLayout):
    ARCHITECTURES: list[str] = []

    def detect(self, raw: dict) -> bool:
        return raw.get("architectures") == self.ARCHITECTURES and raw.get("num_hidden_layers") == 1


class SglangEagle(_SglangLlama):
    NAME = "sglang-eagle"
    KIND = "eagle1"
    ARCHITECTURES = ["LlamaForCausalLMEagle"]

    def to_config(self, draft: EagleDraft, model: str | None) -> dict:
        return {**llama_config(draft, self.ARCHITECTURES, model), "bias": draft.fc.bias is not None}

    def fc_bias(self, raw: dict, state: dict) -> bool:
        return raw.get("bias", "fc.bias" in state)

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        return eagle_config(self.KIND, raw, llama_model_type(raw), None, llama_base(raw), 0, path, fc_bias)


class SglangEagle3(_SglangLlama):
    NAME = "sglang-eagle3"
    KIND = "eagle3"
    ARCHITECTURES = ["LlamaForCausalLMEagle3"]

    def exported_name(self, name: str) -> str:
        layer_name = "layers.0." + name if name == "hidden_norm.weight" else name
        return "midlayer." + layer_name.removeprefix("layers.0.") if layer_name.startswith("layers.0.") else layer_name

    def check(self, draft: EagleDraft, source) -> None:
        if draft.config.norm_before_residual:
            raise ValueError(f"{source}: the draft's residual is hidden_norm(feature) (norm_before_residual, from a "
                             f"speculators folder); specheads does not write that for SGLang: export it as vllm-eagle3")

    def to_config(self, draft: EagleDraft, model: str | None) -> dict:
        config = llama_config(draft, self.ARCHITECTURES, model)
        config["draft_vocab_size"] = draft.config.draft_vocab_size
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sglang_aux_ids(draft.config.aux_layer_ids)}
        return config

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        """SpecForge's folders (this architecture, keys as the EAGLE authors') often name no aux layers: SGLang then
        captures the stream entering layers 2, L//2, L-3, specheads' default, read from the base."""
        check_target_hidden_size(raw, path)
        sglang = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux = [i + SGLANG_AUX_SHIFT for i in int_list(sglang, "eagle_aux_hidden_state_layer_ids", path)] if sglang \
            else aux_layers((raw.get("specheads") or {}).get("aux_layer_ids"), path, base_config,
                            "eagle_config.eagle_aux_hidden_state_layer_ids")
        return eagle_config(self.KIND, raw, llama_model_type(raw), aux, llama_base(raw),
                            raw.get("draft_vocab_size", 0), path, fc_bias)


FORMATS = (SglangEagle(), SglangEagle3())
