"""Medusa heads: K small residual MLPs on the base model's last hidden state.

Head k reads h_t (the lm_head input at position t) and predicts token x_{t+k+1}; the base
lm_head itself already predicts x_{t+1}. Each head is `num_layers` residual blocks
x + SiLU(W x + b), zero-initialised so a fresh head starts as the identity, followed by a
projection to the vocabulary: either the head's own copy of the base lm_head, or the frozen
base lm_head shared by all heads (only the blocks train).

A draft vocabulary (`draft_vocab_size` > 0) projects onto the most frequent answer tokens only, as
EAGLE-3 does: on a 1.5B model with a 152k vocabulary the full projection costs each head ~15% of a
base forward, the 16k rows of a draft vocabulary a tenth of that. Drafts outside it are never
proposed; the verifier decides acceptance, so the output does not change. The target ids of the
draft vocabulary (`draft_ids`) are stored in model.safetensors, never in a side file.

On disk: `config.json` + `model.safetensors` (see `save_pretrained`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from .files import MEDUSA_MODEL_TYPE, size_mismatches
from .module import DraftModule

MODEL_TYPE = MEDUSA_MODEL_TYPE


@dataclass
class MedusaConfig:
    num_heads: int = 4
    num_layers: int = 1
    hidden_size: int = 0
    vocab_size: int = 0
    own_lm_head: bool = False  # False: reuse the frozen base lm_head (small); True: one trained copy per head
    base_model_name_or_path: str = ""
    draft_vocab_size: int = 0  # > 0: project onto these most frequent tokens only (ids in `draft_ids`)

    def __post_init__(self):
        for name in ("num_heads", "num_layers", "hidden_size", "vocab_size", "draft_vocab_size"):
            value = getattr(self, name)
            smallest = 0 if name in ("num_layers", "draft_vocab_size") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < smallest:
                raise ValueError(f"MedusaConfig.{name} must be a positive integer, got {value!r}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"MedusaConfig.draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size "
                             f"({self.vocab_size})")

    @property
    def projected_vocab_size(self) -> int:
        """Rows of each head's projection: the draft vocabulary, or the whole vocabulary."""
        return self.draft_vocab_size or self.vocab_size

    @classmethod
    def for_base(cls, base_config, name_or_path: str, **settings) -> "MedusaConfig":
        return cls(hidden_size=base_config.hidden_size, vocab_size=base_config.vocab_size,
                   base_model_name_or_path=name_or_path, **settings)


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), with W and b zero so the block starts as the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(DraftModule):
    """K heads over the base's final hidden state. Call with the base lm_head when it is shared."""

    MODEL_TYPE, CONFIG_CLASS, WHAT = MEDUSA_MODEL_TYPE, MedusaConfig, "Medusa heads"

    def __init__(self, config: MedusaConfig, base_lm_head: nn.Linear | None = None):
        super().__init__()
        self.config = config
        # A fresh module per block and per head: `[Block(h)] * n` would share one set of weights.
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(config.hidden_size) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        if config.draft_vocab_size:
            self.register_buffer("draft_ids", torch.arange(config.draft_vocab_size))  # draft index -> token id
            self.register_buffer("draft_index", torch.full((config.vocab_size,), -1), persistent=False)
            self.set_draft_vocabulary(self.draft_ids)
            # whoever loads a state dict (from_pretrained, a checkpoint, a wrapping module) gets the index rebuilt
            self.register_load_state_dict_post_hook(lambda module, _: module.set_draft_vocabulary(module.draft_ids.clone()))
        self.lm_heads = None
        if config.own_lm_head:
            self.lm_heads = nn.ModuleList(
                nn.Linear(config.hidden_size, config.projected_vocab_size, bias=False) for _ in range(config.num_heads)
            )
            if base_lm_head is not None:
                if config.draft_vocab_size:
                    raise ValueError("heads with a draft vocabulary: call set_draft_vocabulary, then "
                                     "init_from_base_lm_head (the rows depend on the vocabulary)")
                self.init_from_base_lm_head(base_lm_head)
        self._draft_rows = None  # (lm_head weight, key, its draft-vocabulary rows), see _shared_projection

    @torch.no_grad()
    def set_draft_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Use these token ids (distinct, as many as draft_vocab_size) as the draft vocabulary."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        size, vocab = self.config.draft_vocab_size, self.config.vocab_size
        if (token_ids.shape != (size,) or token_ids.unique().numel() != size
                or int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
            raise ValueError(f"the draft vocabulary needs {size} distinct token ids in 0..{vocab - 1}, "
                             f"got a tensor of shape {tuple(token_ids.shape)}")
        self.draft_ids.copy_(token_ids.to(self.draft_ids.device))
        self.draft_index.fill_(-1)
        self.draft_index[self.draft_ids] = torch.arange(size, device=self.draft_index.device)
        self._draft_rows = None

    def with_draft_vocabulary(self, token_ids: torch.Tensor) -> "MedusaHeads":
        """A copy of these heads that proposes only `token_ids` (same blocks; own lm_heads keep those rows)."""
        if self.config.draft_vocab_size:
            raise ValueError(f"these heads already have a draft vocabulary of {self.config.draft_vocab_size} tokens")
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        dtype = next(self.parameters()).dtype
        heads = MedusaHeads(replace(self.config, draft_vocab_size=len(token_ids))).to(dtype)
        heads.set_draft_vocabulary(token_ids)
        with torch.no_grad():
            heads.blocks.load_state_dict(self.blocks.state_dict())
            for new, old in zip(heads.lm_heads or [], self.lm_heads or []):
                new.weight.copy_(old.weight[token_ids])
        heads.metadata = dict(self.metadata)
        return heads

    def draft_to_token(self, indices: torch.Tensor) -> torch.Tensor:
        """Indices into the heads' logits -> token ids (the identity without a draft vocabulary)."""
        return self.draft_ids[indices] if self.config.draft_vocab_size else indices

    def token_to_draft(self, token_ids: torch.Tensor, missing: int) -> torch.Tensor:
        """Token ids -> indices into the heads' logits; tokens outside the draft vocabulary become `missing`
        (negative ids such as IGNORE_INDEX are kept)."""
        if not self.config.draft_vocab_size:
            return token_ids
        mapped = self.draft_index[token_ids.clamp(min=0)]
        mapped = torch.where(mapped < 0, torch.full_like(mapped, missing), mapped)
        return torch.where(token_ids < 0, token_ids, mapped)

    @torch.no_grad()
    def init_from_base_lm_head(self, base_lm_head: nn.Linear) -> None:
        rows = base_lm_head.weight[self.draft_ids] if self.config.draft_vocab_size else base_lm_head.weight
        for lm_head in self.lm_heads:
            lm_head.weight.copy_(rows.to(lm_head.weight.dtype))

    def forward(self, hidden_states: torch.Tensor, base_lm_head: nn.Module | None = None,
                project: bool = True) -> torch.Tensor:
        """hidden_states [..., H] -> logits [K, ..., V] (project=False: each head's hidden state [K, ..., H],
        for a loss that projects them to the vocabulary a chunk at a time)."""
        transformed = torch.stack([blocks(hidden_states) for blocks in self.blocks])  # [K, ..., H]
        return self.project(transformed, base_lm_head) if project else transformed

    def project(self, transformed: torch.Tensor, base_lm_head: nn.Module | None = None) -> torch.Tensor:
        """Each head's hidden state [K, ..., H] -> its logits [K, ..., V]."""
        if self.lm_heads is not None:
            return torch.stack([lm_head(x) for lm_head, x in zip(self.lm_heads, transformed)])
        if base_lm_head is None:
            raise ValueError("these Medusa heads share the base lm_head: pass base_lm_head=model.get_output_embeddings()")
        if not self.config.draft_vocab_size:
            return base_lm_head(transformed)  # one matmul for all heads, no copy of the logits
        return self._shared_projection(transformed, base_lm_head)

    def _shared_projection(self, transformed: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """The frozen base lm_head restricted to the draft vocabulary. Its rows are gathered once and kept
        while the weight is unchanged, so a decode step does not copy them again."""
        weight, bias = base_lm_head.weight, getattr(base_lm_head, "bias", None)
        key = (weight.data_ptr(), weight._version, weight.device, weight.dtype, torch.is_inference_mode_enabled())
        cached = self._draft_rows
        if cached is None or cached[0] is not weight or cached[1] != key:
            with torch.no_grad():
                rows = (weight[self.draft_ids], None if bias is None else bias[self.draft_ids])
            self._draft_rows = cached = (weight, key, rows)
        weight_rows, bias_rows = cached[2]
        return nn.functional.linear(transformed, weight_rows, bias_rows)

    # ---- on-disk format (heads.module.DraftModule) ------------------------------------------

    @classmethod
    def check_base(cls, config, base_config, source: str) -> None:
        check_compatible(config, base_config, source=source)

    def load_tensors(self, state: dict[str, torch.Tensor], source) -> None:
        """As DraftModule's, naming config.json's sizes when they disagree with the weights."""
        for name, tensor in self.state_dict().items():
            if name in state and name != "draft_ids" and state[name].shape != tensor.shape:
                config = self.config
                raise ValueError(f"{source}: tensor {name} has shape {tuple(state[name].shape)}, but "
                                 f"{Path(source).with_name('config.json')} (hidden_size {config.hidden_size}, "
                                 f"vocab_size {config.vocab_size}, draft_vocab_size {config.draft_vocab_size}) "
                                 f"needs {tuple(tensor.shape)}")
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except ValueError as err:
            raise ValueError(f"{source}: tensor draft_ids: {err}") from err
        if missing or unexpected:
            raise ValueError(f"{source}: missing tensors {missing}, unexpected tensors {unexpected}")


def check_compatible(config: MedusaConfig, base_config, source: str = "heads") -> None:
    """Heads trained for one base are meaningless on another: refuse a size or vocabulary mismatch."""
    problems = size_mismatches(config, base_config, "heads")
    if problems:
        raise ValueError(f"{source} do not fit this base model: " + "; ".join(problems))

