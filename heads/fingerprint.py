"""Which base model heads were trained on: a fingerprint of its output projection, stored with the heads.

Heads trained for one base load on any base of the same sizes without an error (hidden size and vocabulary are all
check_compatible can see), and then guess badly. The trainers store `base_fingerprint` in the heads' config.json;
loading with a base checks it and warns, naming both, when the base differs. The fingerprint hashes every 64th row
of the lm_head rounded to bf16, so the same base loaded in fp32 or bf16 gives the same one; a Medusa-2 base (LoRA
on attention and MLP) keeps its base's.
"""

from __future__ import annotations

import hashlib
import warnings

import torch

KEY = "base_fingerprint"
PREFIX = "lm_head-bf16-sha256:"


def base_fingerprint(base_model) -> str:
    """A short, dtype-independent fingerprint of a base model's output projection."""
    rows = base_model.get_output_embeddings().weight.detach()[::64]
    data = rows.to(device="cpu", dtype=torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
    return PREFIX + hashlib.sha256(data).hexdigest()[:16]


def check_fingerprint(stored: str | None, base_model, source: str) -> None:
    """Warn when heads that name a base fingerprint are loaded on another base (heads saved without one: silent)."""
    if not stored:
        return
    found = base_fingerprint(base_model)
    if found != stored:
        name = getattr(base_model, "name_or_path", "") or "this base model"
        warnings.warn(f"{source} were trained on another base model than {name}: its {KEY} is {found}, the heads "
                      f"were saved with {stored}; they will guess badly (the output stays the base's own)",
                      stacklevel=3)
