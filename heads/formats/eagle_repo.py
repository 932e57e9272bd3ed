"""The EAGLE authors' own draft folders (github.com/SafeAILab/EAGLE, Hub yuhuili/EAGLE-* and yuhuili/EAGLE3-*):
read only. Serve them through the engines' formats (`export("vllm-eagle3", folder, out)` converts on the way).

Both are a Llama config.json (architectures LlamaForCausalLM, num_hidden_layers 1) and `pytorch_model.bin`, a pickle
that is read with torch.load(weights_only=True) and nothing else (`model.safetensors` first where there is one);
shared/PUBLISHED-LAYOUTS.md §2-3 has the layouts and their sources.

- `eagle-repo` (EAGLE-1, e.g. yuhuili/EAGLE-Vicuna-7B-v1.3): fc.weight [H, 2H] (embedding, then feature) and fc.bias
  unless the config says `"bias": false` (EAGLE's Model builds fc with bias=config.bias, default true), layers.0.*
  without input_layernorm, and a copy of the base's embed_tokens.weight, which is not used (a warning names it).
- `eagle3-repo` (EAGLE-3, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): the config adds draft_vocab_size and names no aux
  layers (the code taps the hidden states entering the target's layers 2, L//2, L-3: the base gives L); the layer is
  midlayer.* (hidden_norm inside it), beside fc.weight [H, 3H], norm.weight, lm_head.weight [draft_vocab, H] and d2t /
  t2d (left out when the draft vocabulary is the target's).
Our own exports carry a `specheads` entry and are the engines' formats (vllm-eagle and the others), never these.
"""

from __future__ import annotations

from pathlib import Path

from ..eagle import EagleConfig
from .eagle_layer import EagleLayout, aux_layers, check_target_hidden_size, eagle_config, llama_base, \
    llama_model_type

ARCHITECTURES = ["LlamaForCausalLM"]
PICKLE_NAME = "pytorch_model.bin"


def _eagle_repo_config(raw: dict) -> bool:
    return (raw.get("architectures") == ARCHITECTURES and raw.get("num_hidden_layers") == 1
            and "specheads" not in raw and "speculators_model_type" not in raw)


class _EagleRepo(EagleLayout):
    PICKLE_NAME = PICKLE_NAME
    WRITES = False  # read only: heads.export.EXPORTS leaves it out

    def export(self, heads_dir, out_dir, **options):
        raise ValueError(f"format {self.NAME!r} is read, not written: export the draft as "
                         f"{'sglang-eagle or vllm-eagle' if self.KIND == 'eagle1' else 'vllm-eagle3 or sglang-eagle3'}")


class EagleRepo(_EagleRepo):
    NAME = "eagle-repo"
    KIND = "eagle1"

    def detect(self, raw: dict) -> bool:
        return _eagle_repo_config(raw) and "draft_vocab_size" not in raw

    def fc_bias(self, raw: dict, state: dict) -> bool:
        return bool(raw.get("bias", True))  # then fc.bias must be there: a missing one is named by load

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        return eagle_config(self.KIND, raw, llama_model_type(raw), None, llama_base(raw), 0, path, fc_bias)


class EagleRepo3(_EagleRepo):
    NAME = "eagle3-repo"
    KIND = "eagle3"

    def detect(self, raw: dict) -> bool:
        return _eagle_repo_config(raw) and "draft_vocab_size" in raw

    def fc_bias(self, raw: dict, state: dict) -> bool:
        return False  # EAGLE-3's fc has none; a shipped fc.bias is named as unexpected

    def exported_name(self, name: str) -> str:
        layer_name = "layers.0." + name if name == "hidden_norm.weight" else name
        return "midlayer." + layer_name.removeprefix("layers.0.") if layer_name.startswith("layers.0.") else layer_name

    def config_back(self, raw: dict, path: Path, fc_bias: bool, base_config=None) -> EagleConfig:
        check_target_hidden_size(raw, path)
        aux = aux_layers(None, path, base_config, "the EAGLE authors' configs never do")
        return eagle_config(self.KIND, raw, llama_model_type(raw), aux, llama_base(raw),
                            raw.get("draft_vocab_size", 0), path, fc_bias)


FORMATS = (EagleRepo(), EagleRepo3())
