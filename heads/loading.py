"""Load any draft heads folder: the one place that reads a folder's config.json to say what it holds.

`load_heads` gives MedusaHeads, an EagleDraft or a DFlashDraft for specheads' own folders and for every readable
external format (heads.formats): FasterDecoding/Medusa v0.1, vLLM Medusa, the vLLM / SGLang / speculators EAGLE
folders and vLLM's DFlash folder.
"""

from __future__ import annotations

from pathlib import Path

from .dflash import DFlashDraft
from .eagle import EagleDraft
from .files import DFLASH_MODEL_TYPE, EAGLE_MODEL_TYPE, MEDUSA_MODEL_TYPE, read_json_config
from .formats import FORMATS, detect
from .kinds import MODULE_BY_MODEL_TYPE, kind_of
from .medusa import MedusaHeads
from .remote import resolve_heads

OWN = MODULE_BY_MODEL_TYPE  # specheads' own folders: model_type -> the class that loads them (heads.kinds)


def folder_kind(directory: str | Path) -> str:
    """What a heads folder holds: "specheads-medusa", "specheads-eagle", "specheads-dflash", or the external format whose config.json
    it has (a key of heads.formats.FORMATS). An unreadable or unknown config is an error naming the file.
    `directory` may be a Hub id (heads.remote.resolve_heads: `org/name[@revision][/subfolder]`)."""
    path, raw = read_json_config(resolve_heads(directory), what="draft heads")
    if raw.get("model_type") in OWN:
        return raw["model_type"]
    kind = detect(raw)
    if kind is None:
        raise ValueError(f"{path}: not a heads folder specheads knows: model_type is {raw.get('model_type')!r}; "
                         f"expected {MEDUSA_MODEL_TYPE!r}, {EAGLE_MODEL_TYPE!r}, {DFLASH_MODEL_TYPE!r}, or an export of "
                         f"{', '.join(n for n, f in FORMATS.items() if getattr(f, 'load', None))}")
    return kind


def load_heads(directory: str | Path, base_model=None, revision: str | None = None
               ) -> MedusaHeads | EagleDraft | DFlashDraft:
    """Medusa heads, an EAGLE draft or a DFlash drafter from any folder specheads reads, or from a Hub id
    (`org/name[@revision][/subfolder]`, or `revision=`; heads.remote.resolve_heads); with `base_model`, checked
    to fit it."""
    directory = resolve_heads(directory, revision)
    kind = folder_kind(directory)
    if kind in OWN:
        return OWN[kind].from_pretrained(directory, base_model=base_model)
    reader = FORMATS[kind].load
    if reader is None:
        raise ValueError(f"{directory}: a {kind!r} folder cannot be read back as heads")
    heads = reader(directory, base_model=base_model)
    if base_model is not None:
        kind_of(heads).check(heads.config, base_model.config, source=str(directory))
    return heads


def load_medusa_heads(directory: str | Path, base_model=None) -> MedusaHeads:
    """Medusa heads from any folder that holds them (specheads, FasterDecoding, vLLM Medusa), or a Hub id."""
    directory = resolve_heads(directory)
    heads = load_heads(directory, base_model=base_model)
    kind = kind_of(heads)
    if kind.name != "medusa":
        raise ValueError(f"{directory}: holds {kind.title}, not Medusa heads")
    return heads
