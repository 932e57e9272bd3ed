"""The kinds of draft, in one place: what each one is, which module holds it, how it is checked, decoded and served.

Every question "which kind of draft is this?" is asked here: `kind_of(draft)` for a module in memory,
`KIND_BY_MODEL_TYPE` for a specheads folder's config.json. A kind names its module class (and the EAGLE variant),
the compatibility check against a base, the decoding method inference/methods.py registers for it, how the engine
tests draft a chain with it, the vLLM format it exports as and how many tokens vLLM drafts with it, and the words a
model card uses. Adding a kind is adding one entry; tests/test_kinds.py checks that each has a method, a chain, an
engine format and a card description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .dflash import DFlashDraft
from .dflash import check_compatible as dflash_fits
from .eagle import EagleDraft
from .eagle import check_compatible as eagle_fits
from .files import DFLASH_MODEL_TYPE, EAGLE_MODEL_TYPE, MEDUSA_MODEL_TYPE
from .medusa import MedusaHeads
from .medusa import check_compatible as medusa_fits

VLLM_EAGLE_CHAIN = 5  # tokens a model card's `vllm serve` command drafts with an EAGLE draft (vLLM drafts chains)


@dataclass(frozen=True)
class DraftKind:
    name: str  # "medusa", "eagle1", "eagle3", "dflash": what a method's `draft=` names
    title: str  # "Medusa heads", "an EAGLE-3 draft", ...: for messages and model cards
    model_type: str  # specheads' config.json model_type
    module: type  # the nn.Module class (save_pretrained / from_pretrained / read_config)
    check: Callable  # check(config, base_config, source): raises ValueError naming what does not fit
    method: str  # the decoding method chat.py and the bench use for it (inference/methods.py)
    chain: str  # how it drafts an engine's k-token chain: "static" (a tree [[0], [0, 0], ...]) or "dynamic"
    vllm_format: str  # heads/export.py's format vLLM serves it in
    tag: str  # the model card's tag
    trained_with: str  # the model card's account of its trainer
    variant: str | None = None  # EagleConfig.variant for the EAGLE kinds
    chain_limit: Callable | None = None  # draft -> the most tokens one step can draft (None: no limit)
    engine_tokens: Callable = lambda draft: VLLM_EAGLE_CHAIN  # draft -> num_speculative_tokens on its card

    def fits(self, draft) -> bool:
        return isinstance(draft, self.module) and (self.variant is None or draft.config.variant == self.variant)


EAGLE_TRAINED = ("`train/eagle.py` (frozen base; the draft unrolled over several steps, soft cross-entropy against "
                 "the base's next-token distribution, weights 0.8^i)")

KINDS: dict[str, DraftKind] = {kind.name: kind for kind in (
    DraftKind("medusa", "Medusa heads", MEDUSA_MODEL_TYPE, MedusaHeads, medusa_fits, method="medusa", chain="static",
              vllm_format="vllm-medusa", tag="medusa",
              trained_with="`train/medusa.py` (Medusa-1: frozen base, loss Σ_k 0.8^k · CE over assistant tokens)",
              chain_limit=lambda draft: draft.config.num_heads, engine_tokens=lambda draft: draft.config.num_heads),
    DraftKind("eagle1", "an EAGLE-1 draft", EAGLE_MODEL_TYPE, EagleDraft, eagle_fits, method="eagle2",
              chain="dynamic", vllm_format="vllm-eagle", tag="eagle", trained_with=EAGLE_TRAINED, variant="eagle1"),
    DraftKind("eagle3", "an EAGLE-3 draft", EAGLE_MODEL_TYPE, EagleDraft, eagle_fits, method="eagle3",
              chain="dynamic", vllm_format="vllm-eagle3", tag="eagle", trained_with=EAGLE_TRAINED, variant="eagle3"),
    DraftKind("dflash", "a DFlash drafter", DFLASH_MODEL_TYPE, DFlashDraft, dflash_fits, method="dflash",
              chain="static", vllm_format="vllm-dflash", tag="dflash",
              trained_with="`train/dflash.py` (frozen base; random anchors, each block's masked positions predicted "
                           "in one forward, cross-entropy against the base's answer tokens)",
              chain_limit=lambda draft: draft.config.num_draft_tokens,
              engine_tokens=lambda draft: draft.config.num_draft_tokens),
)}

# A specheads folder's model_type -> the module class that loads it (the EAGLE variants share one).
MODULE_BY_MODEL_TYPE: dict[str, type] = {kind.model_type: kind.module for kind in KINDS.values()}
DRAFT_MODULES: tuple[type, ...] = tuple(dict.fromkeys(kind.module for kind in KINDS.values()))


def kind_of(draft) -> DraftKind:
    """The kind of a loaded draft; TypeError for anything that is not one."""
    for kind in KINDS.values():
        if kind.fits(draft):
            return kind
    raise TypeError(f"not a draft: {type(draft).__name__}")


def is_draft(value) -> bool:
    return isinstance(value, DRAFT_MODULES)


def kind_of_config(model_type: str, config) -> DraftKind:
    """The kind a specheads folder holds, from its model_type and its read config (the variant of an EAGLE one)."""
    for kind in KINDS.values():
        if kind.model_type == model_type and (kind.variant is None or config.variant == kind.variant):
            return kind
    raise ValueError(f"no draft kind for model_type {model_type!r}")
