"""Medusa-2: heads trained jointly with a LoRA adapter on the base, and their two on-disk forms.

Joint training changes the base a little (LoRA), so the heads are only worth their τ on the adapted base.
A Medusa-2 heads folder is a normal heads folder plus the adapter inside it:

    heads/config.json            Medusa config, with "adapter": "adapter"
    heads/model.safetensors      the heads
    heads/adapter/               peft's adapter_config.json + adapter_model.safetensors

`load_adapted_base` folds that adapter into the base (merge_and_unload: no LoRA cost per step);
heads/formats/merged.py writes the other form: a full merged base model folder beside a plain heads folder.
Decoding stays lossless with respect to the adapted model it verifies with.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .files import read_json_config
from .remote import resolve_heads
from .medusa import MedusaHeads

ADAPTER_DIR = "adapter"


def lora_config(r: int, alpha: int, dropout: float, target_modules: list[str]):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                      bias="none", task_type="CAUSAL_LM")


class MedusaWithLoRA(nn.Module):
    """The trainable part of Medusa-2: a peft-wrapped base (only LoRA weights train) and the heads.

    forward runs everything the joint loss needs inside one call, so DDP and DeepSpeed see every
    trainable parameter used in the module's own forward."""

    def __init__(self, peft_base, heads: MedusaHeads):
        super().__init__()
        self.base = peft_base
        self.heads = heads

    def hidden_states(self, input_ids, attention_mask, adapter: bool = True) -> torch.Tensor:
        """Last hidden state (lm_head input) of the base, with or without the LoRA adapter."""
        decoder = self.base.get_decoder()
        if adapter:
            return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        with self.base.disable_adapter(), torch.no_grad():
            return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def forward(self, input_ids, attention_mask, lm_positions, head_positions, teacher: bool = False) -> dict:
        """Logits at the positions that carry a loss: lm [N, V], heads [K, M, V], teacher lm [N, V] (optional)."""
        lm_head = self.base.get_output_embeddings()
        hidden = self.hidden_states(input_ids, attention_mask)
        out = {"lm_logits": lm_head(hidden[lm_positions]), "head_logits": self.heads(hidden[head_positions], lm_head)}
        if teacher:
            with torch.no_grad():
                out["teacher_logits"] = lm_head(self.hidden_states(input_ids, attention_mask, adapter=False)[lm_positions])
        return out

    def trainable_parameters(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(LoRA parameters, heads parameters), in a fixed order (optimizer state is saved by position)."""
        lora = [p for name, p in self.base.named_parameters() if p.requires_grad]
        return lora, [p for p in self.heads.parameters() if p.requires_grad]

    def save_pretrained(self, directory: str | Path, extra: dict | None = None, state_dict: dict | None = None) -> None:
        """Heads into `directory`, the LoRA adapter into `directory/adapter` (both safetensors).

        state_dict: this module's full state gathered across ranks (DeepSpeed ZeRO-3); default its own."""
        directory = Path(directory)
        heads_state = adapter_state = None
        if state_dict is not None:
            heads_state = {k[len("heads."):]: v for k, v in state_dict.items() if k.startswith("heads.")}
            from peft import get_peft_model_state_dict

            base_state = {k[len("base."):]: v for k, v in state_dict.items() if k.startswith("base.")}
            adapter_state = get_peft_model_state_dict(self.base, state_dict=base_state)
        self.heads.save_pretrained(directory, extra={**(extra or {}), "adapter": ADAPTER_DIR}, state_dict=heads_state)
        self.base.save_pretrained(directory / ADAPTER_DIR, state_dict=adapter_state, safe_serialization=True)

    def load_trained(self, directory: str | Path) -> None:
        """Load heads and adapter weights saved by save_pretrained into this module (resume)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        directory = Path(directory)
        self.heads.load_state_dict(MedusaHeads.from_pretrained(directory).state_dict())
        adapter_file = directory / ADAPTER_DIR / "adapter_model.safetensors"
        if not adapter_file.is_file():
            raise ValueError(f"{directory}: Medusa-2 heads without their adapter ({adapter_file} is missing)")
        try:
            weights = load_file(str(adapter_file))
        except Exception as err:
            raise ValueError(f"{adapter_file}: not a readable safetensors file: {err}") from err
        result = set_peft_model_state_dict(self.base, weights)
        if result.unexpected_keys:
            raise ValueError(f"{adapter_file}: tensors this adapter does not have: {result.unexpected_keys[:5]}")


def adapter_of(heads_dir: str | Path) -> Path | None:
    """The adapter folder a Medusa-2 heads folder (or Hub id) names in its config.json, or None for plain heads."""
    heads_dir = resolve_heads(heads_dir)
    _, config = read_json_config(heads_dir)
    name = config.get("adapter")
    if not name:
        return None
    adapter = Path(heads_dir) / name
    if not (adapter / "adapter_config.json").is_file():
        raise ValueError(f"{heads_dir}/config.json names adapter {name!r}, but {adapter}/adapter_config.json is missing")
    return adapter


def load_adapted_base(base_model, heads_dir: str | Path):
    """The base these heads were trained with: the adapter folded in (merged) when the folder has one.

    Returns the base unchanged for plain heads."""
    adapter = adapter_of(heads_dir)
    if adapter is None:
        return base_model
    from peft import PeftModel

    try:
        adapted = PeftModel.from_pretrained(base_model, str(adapter))
    except Exception as err:
        raise ValueError(f"cannot apply the LoRA adapter {adapter} to {base_model.name_or_path}: {err}") from err
    return adapted.merge_and_unload().eval()

