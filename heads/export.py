"""Write heads in another format: `export(format, heads_dir, out_dir)`, the library behind scripts/export.py.

EXPORTS maps a format name to its converter `convert(heads_dir, out_dir, *, model=None, overwrite=False)`:
every external format of heads.formats that writes (not the read-only ones, such as the EAGLE authors' folders), and
`specheads`, which goes the other way (any folder load_heads reads, e.g. FasterDecoding/Medusa v0.1, vLLM Medusa,
a published EAGLE or DFlash draft or an engine's EAGLE folder, into specheads' own format). `export` takes any
folder load_heads reads: one in another format is read first (so a published draft exports straight to an engine's).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from .formats import FORMATS
from .formats.common import prepare_out_dir
from .loading import OWN, folder_kind, load_heads


def export_specheads(heads_dir: str | Path, out_dir: str | Path, *, model: str | None = None,
                     overwrite: bool = False) -> Path:
    """Any folder load_heads reads -> specheads' own format (checked against `model` where given)."""
    base = None
    if model:
        from specheads.data.models import load_base_model

        base = load_base_model(model, dtype="float32", device="cpu")  # file work, not decoding
    heads = load_heads(heads_dir, base_model=base)
    if model and not heads.config.base_model_name_or_path:
        heads.config.base_model_name_or_path = model
    out_dir = prepare_out_dir(out_dir, heads_dir, overwrite)
    heads.save_pretrained(out_dir)  # with its metadata (tree, template, ...)
    return out_dir


EXPORTS: dict[str, Callable[..., Path]] = {
    **{name: fmt.export for name, fmt in FORMATS.items() if getattr(fmt, "WRITES", True)},
    "specheads": export_specheads}


def export(format: str, heads_dir: str | Path, out_dir: str | Path, **options) -> Path:
    """Convert `heads_dir` into `format` at `out_dir`."""
    if format not in EXPORTS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(EXPORTS)}")
    if format != "specheads" and folder_kind(heads_dir) not in OWN:
        # another format's folder (a published draft, an engine's export): read it into our own, then write that
        if Path(out_dir).resolve() == Path(heads_dir).resolve():
            raise ValueError(f"{out_dir}: the output folder is the heads folder itself; choose another")
        with tempfile.TemporaryDirectory(prefix="specheads-import-") as own:
            export_specheads(heads_dir, own, model=options.get("model"), overwrite=True)
            return EXPORTS[format](own, out_dir, **options)
    return EXPORTS[format](heads_dir, out_dir, **options)
