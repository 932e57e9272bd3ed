"""Write heads in another format: `export(format, heads_dir, out_dir)`, the library behind scripts/export.py.

EXPORTS maps a format name to its converter `convert(heads_dir, out_dir, *, model=None, overwrite=False)`:
every external format of heads.formats, and `specheads`, which goes the other way (any folder load_heads reads,
e.g. FasterDecoding/Medusa v0.1, vLLM Medusa or an engine's EAGLE folder, into specheads' own format).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .formats import FORMATS
from .formats.common import prepare_out_dir
from .loading import load_heads
from .medusa import MedusaHeads


def export_specheads(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
                     overwrite: bool = False) -> Path:
    """Any folder load_heads reads -> specheads' own format (checked against `model` where given)."""
    base = None
    if model:
        from specheads.data.models import load_base_model

        base = load_base_model(model, dtype="float32")
    heads = load_heads(heads_dir, base_model=base)
    if isinstance(heads, MedusaHeads) and model and not heads.config.base_model_name_or_path:
        heads.config.base_model_name_or_path = model
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    heads.save_pretrained(out_dir, extra=getattr(heads, "extra_config", None))
    return out_dir


EXPORTS: dict[str, Callable[..., Path]] = {
    **{name: fmt.export for name, fmt in FORMATS.items()}, "specheads": export_specheads}


def export(format: str, heads_dir: str | Path, out_dir: str | Path, **options) -> Path:
    """Convert `heads_dir` into `format` at `out_dir`."""
    if format not in EXPORTS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(EXPORTS)}")
    return EXPORTS[format](heads_dir, out_dir, **options)
