"""specheads.heads: draft heads, their on-disk format, the formats engines load, and publishing.

Layers (each imports only the ones above it; tests/test_heads_layout.py checks it):
  files, weights          a heads folder on disk: config.json, safe reads, writes that never tear
  medusa, eagle, dflash, joint  the trainable modules (Medusa-1/2 heads, EAGLE-1/3 drafts, DFlash block drafter)
                          and their own format
  formats/                one module per external format, export and import (vLLM, SGLang, speculators, TGI)
  loading, export         any folder -> heads (`load_heads`); heads -> any format (`export`)
  serving, hub, model_card  how engines serve an export; Hub upload with a model card
See heads/DESIGN.md.
"""

from .dflash import DFlashConfig, DFlashDraft
from .eagle import EagleConfig, EagleDraft
from .loading import load_heads
from .medusa import MedusaConfig, MedusaHeads, ResidualBlock, check_compatible

__all__ = ["DFlashConfig", "DFlashDraft", "EagleConfig", "EagleDraft", "MedusaConfig", "MedusaHeads", "ResidualBlock", "check_compatible",
           "load_heads"]
